"""MLA decode with absorbed projections (DeepSeek-V3 / Kimi K2 attention as SGLang runs it at
decode), in 8 launches instead of ~30 small torch ops.

What one decode step does for b tokens with a latent KV cache [b, ctx, kv_lora + rope]:
1. a = x @ [W_qa; W_kva]^T (one GEMV/GEMM over both down-projections).
2. `_norm_cache` (Triton, one program per token): RMSNorm of the q latent, RMSNorm of the kv
   latent written with the rope part into the cache's last slot (this step's entry). Where
   `fused_norms(b)` (step 3 on `gemv_mma`), no launch of its own: step 3's launch applies the
   q norm and writes the cache row from b extra CTAs (7 launches).
3. q = q_a @ W_qb^T, q = [q_nope | q_rope] per head.
4. q_lat = q_nope @ W_uk per head: the absorbed query, [h, b, kv_lora].
5. `_attn` (Triton, flash-decoding): grid (head group, context split, token); each program
   reads its slice of the latent cache once for HB heads, scores = q_lat.c + q_rope.k_rope,
   online softmax, unnormalised output p.c and the running max / sum per head. From
   `MlaConfig.mma_attn_min_b` tokens up, `mla_attn_mma` instead (CUDA, all 64 heads of a token
   in one CTA: each cache block read once; faster on an H200 from b = 16, slower below).
6. `_merge` (Triton, one program per token and head): merges the context splits into the
   normalised latent [h, b, kv_lora]; then W_uv per head, each head writing its columns of the
   [b, h*v_head] row W_o reads. (A fused merge + W_uv kernel, one program per head and 16
   tokens, took 25 us at b = 1 on an H200, most of it re-reading the split partials per input
   block.)
7. out = o @ W_o^T.
The projections (steps 1, 3, 4, 6, 7) run on `gemv_mma` (tensor-core GEMV streaming each weight
once, per-head inputs and outputs read and written in place) up to the micro-batch in
`GEMV_MAX_B` where it was faster than cuBLAS on an H200, and on cuBLAS (torch matmul / bmm)
above it or where `gemv_mma` cannot build; `kernel_name(b)` says which.
RoPE itself is left out, as in `layers.build_attention` (elementwise, negligible).

Floor (reports/base/roofline.py, attention): the bf16 projection weights (W_qa, W_qb, W_kva,
W_kvb = W_uk + W_uv, W_o, norms) + the KV cache of every token, read once.
Checked against `layers.build_attention`'s unabsorbed float32 reference.
"""
from __future__ import annotations

import functools

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = tl = None

from dataclasses import dataclass

EPS = 1e-6          # RMSNorm epsilon of microbench.kernels.common.rmsnorm


@dataclass(frozen=True)
class MlaConfig:
    heads_per_prog: int = 32    # heads sharing one read of a cache block
    ctx_block: int = 64         # cache rows per step
    splits: int = 16            # context splits per token (enough programs at b = 1)
    warps: int = 8
    gemv: bool = True           # projections by `gemv_mma` where GEMV_MAX_B says it wins
    mma_attn_min_b: int = 16    # attention by `mla_attn_mma` from this micro-batch (0: never)
    fuse_norms: bool = True     # no norm launch where q_a @ W_qb runs gemv_mma (`fused_norms`)


CONFIG = MlaConfig(16, 64, 32, 4)  # chosen on one H200 (microbench/stage_cost/tune_moe_quant.py)
# Largest micro-batch at which each projection runs `gemv_mma` instead of cuBLAS: where it was
# faster on one H200 (each alone, weights rotated past L2, and inside the layer;
# docs/BENCHMARKS.md section 8).
GEMV_MAX_B = {"w_a": 16, "w_qb": 8, "w_uk": 16, "w_uv": 8, "w_o": 4}
STAGES = ("x @ [W_qa; W_kva]", "norms + cache write", "q_a @ W_qb", "absorb W_uk (bmm)",
          "attention (splits)", "merge + W_uv", "o @ W_o")


def _norm_cache_src(a_ptr, qn_ptr, kvn_ptr, qa_ptr, c_ptr, stride_a, stride_qa, stride_cb,
                    last_off, eps,
                    QL: tl.constexpr, KL: tl.constexpr, ROPE: tl.constexpr,
                    QLP: tl.constexpr, KLP: tl.constexpr, RP: tl.constexpr):
    # a [b, QL + KL + ROPE] = x @ [W_qa; W_kva]^T; qa [b, QL] out; cache row (b, last) out
    b = tl.program_id(0).to(tl.int64)
    if QL > 0:
        rq = tl.arange(0, QLP)
        mq = rq < QL
        v = tl.load(a_ptr + b * stride_a + rq, mask=mq, other=0.0).to(tl.float32)
        r = 1.0 / tl.sqrt(tl.sum(v * v, 0) / QL + eps)
        w = tl.load(qn_ptr + rq, mask=mq, other=0.0).to(tl.float32)
        tl.store(qa_ptr + b * stride_qa + rq, (v * r * w).to(qa_ptr.dtype.element_ty), mask=mq)
    rk = tl.arange(0, KLP)
    mk = rk < KL
    v = tl.load(a_ptr + b * stride_a + QL + rk, mask=mk, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(v * v, 0) / KL + eps)
    w = tl.load(kvn_ptr + rk, mask=mk, other=0.0).to(tl.float32)
    tl.store(c_ptr + b * stride_cb + last_off + rk, (v * r * w).to(c_ptr.dtype.element_ty),
             mask=mk)
    rr = tl.arange(0, RP)
    mr = rr < ROPE
    v = tl.load(a_ptr + b * stride_a + QL + KL + rr, mask=mr, other=0.0)
    tl.store(c_ptr + b * stride_cb + last_off + KL + rr, v.to(c_ptr.dtype.element_ty), mask=mr)


def _attn_src(ql_ptr, q_ptr, c_ptr, o_ptr, ml_ptr, ctx, sm_scale,
              s_qlh, s_qlb, s_qb, s_qh, s_cb, s_cc, s_ob, s_os, s_oh, s_mb, s_ms, s_mh,
              KL: tl.constexpr, ROPE: tl.constexpr, NOPE: tl.constexpr, HB: tl.constexpr,
              BC: tl.constexpr, SPLIT: tl.constexpr):
    # ql [h, b, KL] absorbed queries; q [b, h, NOPE + ROPE]; cache [b, ctx, KL + ROPE]
    # o [b, S, h, KL] fp32 unnormalised; ml [b, S, h, 2] fp32 (running max, sum)
    # head groups vary fastest in launch order: the groups of one (token, split) run side by
    # side and read that cache slice from HBM once, then from L2
    b = tl.program_id(2).to(tl.int64)
    sp = tl.program_id(1)
    hh = (tl.program_id(0) * HB + tl.arange(0, HB)).to(tl.int64)
    kl = tl.arange(0, KL)
    rr = tl.arange(0, ROPE)
    q_lat = tl.load(ql_ptr + hh[:, None] * s_qlh + b * s_qlb + kl[None, :])          # [HB, KL]
    q_rope = tl.load(q_ptr + b * s_qb + hh[:, None] * s_qh + NOPE + rr[None, :])     # [HB, R]
    m_i = tl.full((HB,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((HB,), dtype=tl.float32)
    acc = tl.zeros((HB, KL), dtype=tl.float32)
    c0 = sp * SPLIT
    for cs in range(0, SPLIT, BC):               # blocks past ctx are fully masked
        cc = c0 + cs + tl.arange(0, BC)
        cm = cc < ctx
        base = c_ptr + b * s_cb + cc[:, None].to(tl.int64) * s_cc
        kv = tl.load(base + kl[None, :], mask=cm[:, None], other=0.0)                 # [BC, KL]
        kr = tl.load(base + KL + rr[None, :], mask=cm[:, None], other=0.0)           # [BC, R]
        s = tl.dot(q_lat, tl.trans(kv)) + tl.dot(q_rope, tl.trans(kr))               # [HB, BC]
        s = tl.where(cm[None, :], s * sm_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kv.dtype), kv)
        m_i = m_new
    tl.store(o_ptr + b * s_ob + sp * s_os + hh[:, None] * s_oh + kl[None, :], acc)
    tl.store(ml_ptr + b * s_mb + sp * s_ms + hh * s_mh, m_i)
    tl.store(ml_ptr + b * s_mb + sp * s_ms + hh * s_mh + 1, l_i)


def _merge_src(o_ptr, ml_ptr, lat_ptr, s_ob, s_os, s_oh, s_mb, s_ms, s_mh, s_lh, s_lb,
               KL: tl.constexpr, S: tl.constexpr, SP: tl.constexpr):
    # one (token, head): merge its S context splits into the normalised latent output
    # lat [h, b, KL] (the layout the batched W_uv GEMM reads)
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    si = tl.arange(0, SP)
    sm = si < S
    mp = ml_ptr + b * s_mb + si * s_ms + h * s_mh
    m = tl.load(mp, mask=sm, other=float("-inf"))                                   # [SP]
    l = tl.load(mp + 1, mask=sm, other=0.0)
    coef = tl.where(sm, tl.exp(m - tl.max(m, 0)), 0.0)
    coef = coef / tl.maximum(tl.sum(coef * l, 0), 1e-30)
    kl = tl.arange(0, KL)
    part = tl.load(o_ptr + b * s_ob + si[:, None] * s_os + h * s_oh + kl[None, :],
                   mask=sm[:, None], other=0.0)                                      # [SP, KL]
    lat = tl.sum(part * coef[:, None], 0)
    tl.store(lat_ptr + h * s_lh + b * s_lb + kl, lat.to(lat_ptr.dtype.element_ty))


@functools.lru_cache(maxsize=2)
def _kernels(interpret: bool):
    if triton is None:
        raise RuntimeError("triton is not installed")
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction as F
    else:
        F = triton.jit
    return F(_norm_cache_src), F(_attn_src), F(_merge_src)


def gemv_projections(b: int, cfg: MlaConfig | None = None) -> list[str]:
    """The projections that run `gemv_mma` at micro-batch b (where it builds), in order."""
    cfg = cfg or CONFIG
    return [k for k, v in GEMV_MAX_B.items() if cfg.gemv and b <= v]


def fused_norms(b: int, q_lora: int, cfg: MlaConfig | None = None) -> bool:
    """Whether micro-batch b skips the norm launch (where gemv_mma builds): the q-latent
    RMSNorm folded into q_a @ W_qb on `gemv_mma` (its weight into W_qb's columns, 1 / rms per
    token from the activations that launch loads anyway) and this step's cache row written by
    b extra CTAs of that launch. Needs a q latent and W_qb on gemv_mma."""
    cfg = cfg or CONFIG
    return cfg.gemv and cfg.fuse_norms and q_lora > 0 and b <= GEMV_MAX_B["w_qb"]


def mma_attention(b: int, cfg: MlaConfig | None = None) -> bool:
    """Whether micro-batch b runs `mla_attn_mma` for the attention (where it builds)."""
    cfg = cfg or CONFIG
    return 0 < cfg.mma_attn_min_b <= b


def kernel_name(b: int, cfg: MlaConfig | None = None, heads: int = 64, kv_lora: int = 512,
                rope: int = 64, q_lora: int = 1536) -> str:
    """What runs at micro-batch b on this machine for this attention shape, for records."""
    from microbench.kernels import gemv_mma, mla_attn_mma

    g = gemv_projections(b, cfg) if gemv_mma.available() is None else []
    proj = (f"gemv_mma for {', '.join(g)}" + (", cuBLAS for the rest" if len(g) < 5 else "")
            if g else "cuBLAS")
    attn = ("mla_attn_mma" if mma_attention(b, cfg) and mla_attn_mma.available() is None
            and mla_attn_mma.fits(heads, kv_lora, rope) is None else "Triton")
    norms = "; norms in W_qb's launch" if g and fused_norms(b, q_lora, cfg) else ""
    return f"mla_decode ({attn} attention; projections: {proj}{norms}; absorbed MLA, bf16)"


def _p2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def make_attention(h: int, kl: int, rope: int, nope: int, device, cfg: MlaConfig | None = None):
    """Steps 5 and 6 of the decode alone: (partials, merge) for h heads over a latent cache
    [b, ctx, kl + rope]. partials(q_lat [h, b, kl], q3 [b, h, nope + rope], cache, ctx) ->
    (o [b, S, h, kl], ml [b, S, h, 2]) fp32 per context split (`mla_attn_mma` where
    `mma_attention(b)` and it builds, else the Triton kernel); merge(o, ml, dtype) -> the
    normalised latent output [h, b, kl]. Softmax scale (nope + rope)^-1/2, as the model's."""
    import torch

    cfg = cfg or CONFIG
    sm = (nope + rope) ** -0.5
    hb = min(cfg.heads_per_prog, h)
    if h % hb or kl & (kl - 1) or rope & (rope - 1):
        raise ValueError("mla_decode needs power-of-two kv_lora / rope dims and "
                         f"heads divisible by {hb}")
    cuda = torch.device(device).type == "cuda"
    _, kern_attn, kern_comb = _kernels(not cuda)
    attn_mma = sms = None
    if cuda and cfg.mma_attn_min_b > 0:
        from microbench.kernels import mla_attn_mma
        if mla_attn_mma.available() is None and mla_attn_mma.fits(h, kl, rope) is None:
            attn_mma = mla_attn_mma
            sms = torch.cuda.get_device_properties(device).multi_processor_count

    def partials(q_lat, q3, cache, ctx: int):
        b, dev = q_lat.shape[1], q_lat.device
        on_mma = attn_mma is not None and mma_attention(b, cfg)
        if on_mma:   # one CTA per SM over the launch, splits of whole 32-row blocks
            blk = attn_mma.BC
            split = triton.cdiv(triton.cdiv(ctx, attn_mma.splits_for(b, ctx, h, sms)), blk) * blk
        else:
            # context splits: enough programs to fill the GPU (~2 per SM) at small b, one
            # split (no partial outputs to merge) once b x head groups does
            want = min(cfg.splits, triton.cdiv(ctx, cfg.ctx_block),
                       max(1, triton.cdiv(264, b * (h // hb))))
            split = triton.cdiv(triton.cdiv(ctx, want), cfg.ctx_block) * cfg.ctx_block
        S = triton.cdiv(ctx, split)
        o = torch.empty(b, S, h, kl, device=dev, dtype=torch.float32)
        ml = torch.empty(b, S, h, 2, device=dev, dtype=torch.float32)
        if on_mma:
            attn_mma.attention(q_lat, q3, nope, cache, o, ml, ctx, sm, split)
        else:
            ex = dict(num_warps=cfg.warps, num_stages=2) if cuda else {}
            kern_attn[(h // hb, S, b)](
                q_lat, q3, cache, o, ml, ctx, sm,
                q_lat.stride(0), q_lat.stride(1), q3.stride(0), q3.stride(1),
                cache.stride(0), cache.stride(1), o.stride(0), o.stride(1), o.stride(2),
                ml.stride(0), ml.stride(1), ml.stride(2),
                KL=kl, ROPE=rope, NOPE=nope, HB=hb, BC=cfg.ctx_block, SPLIT=split, **ex)
        return o, ml

    def merge(o, ml, dtype):
        b, S = o.shape[0], o.shape[1]
        lat = torch.empty(h, b, kl, device=o.device, dtype=dtype)
        ex = dict(num_warps=4) if cuda else {}
        kern_comb[(b, h)](o, ml, lat, o.stride(0), o.stride(1), o.stride(2),
                          ml.stride(0), ml.stride(1), ml.stride(2), lat.stride(0), lat.stride(1),
                          KL=kl, S=S, SP=_p2(max(S, 2)), **ex)
        return lat
    return partials, merge


def make_forward(W: dict, m, cfg: MlaConfig | None = None):
    """forward(x [b, H], cache [b, ctx, kv_lora + rope]) -> [b, H], writing this step's latent
    into cache[:, -1] (as `layers.build_attention`'s torch forward). `W`: that builder's
    weights (wqa, qn, wqb, wkva, kvn, wkvb, wo). cfg: block sizes (default `CONFIG`)."""
    import torch

    cfg = cfg or CONFIG
    h, ql, kl = m.num_heads, (m.q_lora_rank or 0), m.kv_lora_rank
    nope, rope, vd = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
    qk = nope + rope
    w_a = torch.cat([W["wqa"], W["wkva"]], 0) if ql else W["wkva"]     # [ql + kl + rope, H]
    wkvb = W["wkvb"].view(h, nope + vd, kl)
    w_uk = wkvb[:, :nope]                                             # [h, nope, kl]
    w_uv = wkvb[:, nope:]                                             # [h, vd, kl]
    cuda = W["wkva"].device.type == "cuda"
    gemv = None
    if cuda and cfg.gemv:
        from microbench.kernels import gemv_mma
        if gemv_mma.available() is None:
            gemv = gemv_mma.gemv
            w_uk_t = w_uk.transpose(1, 2).contiguous()                # [h, kl, nope] rows
            if ql and cfg.fuse_norms:   # RMSNorm(q_a) @ W_qb^T = rms(q_a)^-1 (q_a @ (W_qb qn)^T)
                wqb_n = (W["wqb"].float() * W["qn"].float()).to(W["wqb"].dtype)
    if vd & (vd - 1):
        raise ValueError("mla_decode needs a power-of-two v_head dim")
    partials, merge = make_attention(h, kl, rope, nope, W["wkva"].device, cfg)
    kern_norm = _kernels(not cuda)[0]
    if not cuda:   # Triton's interpreter has no bf16: float32 copies, cache row copied back
        f32 = {k: (v.float() if v is not None else None) for k, v in W.items()}
        fwd32 = make_forward(f32, m, cfg) if W["wkva"].dtype != torch.float32 else None
        if fwd32 is not None:
            def forward_cpu(x, cache):
                c32 = cache.float()
                y = fwd32(x.float(), c32)
                cache[:, -1] = c32[:, -1].to(cache.dtype)
                return y.to(x.dtype)
            return forward_cpu

    def forward(x, cache, upto: int = len(STAGES)):
        """`upto` < 7 stops after that many stages (for timing each one's marginal cost)."""
        b, ctx = x.shape[0], cache.shape[1]
        dev = x.device
        g = {k: gemv is not None and b <= v for k, v in GEMV_MAX_B.items()}
        a = gemv(x, w_a) if g["w_a"] else x @ w_a.t()                  # [b, ql + kl + rope]
        if upto <= 1:
            return a
        fused = gemv is not None and fused_norms(b, ql, cfg)
        if fused:   # the q norm and this step's cache row in W_qb's launch
            if upto <= 2:
                return a
            q = gemv(a[:, :ql], wqb_n, rms_eps=EPS, side=(a[:, ql:], W["kvn"], cache[:, -1], kl))
        else:
            qa = torch.empty(b, max(ql, 1), device=dev, dtype=x.dtype)
            ex = dict(num_warps=4) if cuda else {}
            kern_norm[(b,)](a, W["qn"] if ql else W["kvn"], W["kvn"], qa, cache, a.stride(0),
                            qa.stride(0), cache.stride(0), (ctx - 1) * cache.stride(1), EPS,
                            QL=ql, KL=kl, ROPE=rope, QLP=_p2(max(ql, 1)), KLP=_p2(kl),
                            RP=_p2(rope), **ex)
            if upto <= 2:
                return qa
            xq = qa if ql else x
            q = gemv(xq, W["wqb"]) if g["w_qb"] else xq @ W["wqb"].t()  # [b, h*qk]
        if upto <= 3:
            return q
        q3 = q.view(b, h, qk)
        if g["w_uk"]:   # per head, q_nope read in place
            q_lat = gemv(q3[:, :, :nope].transpose(0, 1), w_uk_t)      # [h, b, kl]
        else:
            q_lat = torch.bmm(q3[:, :, :nope].transpose(0, 1), w_uk)
        if upto <= 4:
            return q_lat
        o, ml = partials(q_lat, q3, cache, ctx)
        if upto <= 5:
            return o
        lat = merge(o, ml, x.dtype)
        if g["w_uv"]:   # each head writes its columns of the row W_o reads
            out_o = torch.empty(b, h * vd, device=dev, dtype=x.dtype)
            gemv(lat, w_uv, out=out_o.view(b, h, vd).transpose(0, 1))
        else:   # one batched GEMM ([h, b, kl] x [h, kl, vd]), then the [b, h*vd] row layout
            out_o = torch.bmm(lat, w_uv.transpose(1, 2)).transpose(0, 1).reshape(b, h * vd)
        if upto <= 6:
            return out_o
        return gemv(out_o, W["wo"]) if g["w_o"] else out_o @ W["wo"].t()
    return forward
