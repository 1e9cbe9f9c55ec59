"""Fused FP8 block-scaled MoE decode layer in Triton, in DeepSeek-V3's served format.

Format: weights float8 e4m3 [G, N, K] with one fp32 scale per 128 x 128 block
([G, N/128, K/128], the checkpoint's `weight_scale_inv`: w = q * s); activations quantised
per token and per group of 128 inputs to e4m3 with an fp32 scale (amax / 448), as SGLang's
`per_token_group_quant_fp8` does, then multiplied on the tensor cores in fp8 with fp32
accumulation, each 128-input step scaled by (activation scale x weight block scale).

Floor: 1 byte per weight + 4 bytes per 128 x 128 block of the distinct experts touched, plus
the shared expert and the router (`reports.base.model_config.matrix_bytes`, format fp8).

Structure as `moe_int4` (one kernel source, NH = 2 for gate_up with gate and up rows in one
tile, NH = 1 for down; routing and block plan from `moe_route`; a bf16 path for groups >= n_q
when the shared expert is not fp8). Activations are quantised inside the kernel from the bf16
x / act tile (no extra launch): for gate_up, per token; for down, per (token, slot) row of act.
On the CPU (Triton's interpreter has neither fp8 nor bf16) weights come in as float32 values
of the fp8 numbers and activations are rounded to the e4m3 grid arithmetically.

Check: `reference` quantises the activations the same way in torch, dequantises everything and
runs the float32 expert loop.
"""
from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = tl = None

from microbench.kernels.moe_common import MoEWeights, QuantMoEWeights
from microbench.kernels.moe_triton import (KernelConfig, MoeConfig, available,  # noqa: F401
                                           fit_block, pick_config)
from microbench.kernels.triton_expert import (as_float32, bf16_expert, block_rows,
                                              input_rows, launch_quantised, silu_gate_up,
                                              store_weighted, tile_rows)

BLOCK = 128          # weight block (both dims) and activation group
FP8_MAX = 448.0      # largest e4m3 (fn) number
AMAX_FLOOR = 1e-10   # an all-zero group gets this amax (scale > 0)

# Upper micro-batch bound -> block sizes, from the sweep in microbench/stage_cost/tune_moe_quant.py on one
# H200 at Kimi K2 dims; kernel-alone medians (us) gate_up / down: b=1 98 / 44, b=8 420 / 212,
# b=32 1282 / 655, b=128 2423 / 1267 (runners-up within 1-3%).
CONFIGS: tuple[tuple[int, MoeConfig], ...] = (
    (4, MoeConfig(16, KernelConfig(32, 128, 4, 4), KernelConfig(64, 128, 4, 4))),
    (16, MoeConfig(16, KernelConfig(32, 128, 4, 4), KernelConfig(128, 128, 4, 3))),
    (64, MoeConfig(16, KernelConfig(32, 128, 4, 4), KernelConfig(256, 128, 8, 3))),
    (1 << 30, MoeConfig(16, KernelConfig(128, 128, 4, 3), KernelConfig(256, 128, 8, 3))),
)


def config_for(batch: int) -> MoeConfig:
    return pick_config(CONFIGS, batch)


def _fp8_src(a_ptr, wq_ptr, ws_ptr, w16_ptr, out_ptr, order_ptr, tw_ptr,
             blk_e_ptr, blk_start_ptr, blk_cnt_ptr,
             N, kk, n_q, stride_am, stride_qe, stride_qn, stride_se, stride_sn,
             stride_he, stride_hn, stride_om,
             K: tl.constexpr, NH: tl.constexpr, HAS16: tl.constexpr, EMU: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K16: tl.constexpr):
    # NH = 2: a = x [b, K] by token, out = act [T, N] by sorted position (gate_up);
    # NH = 1: a = act [T, K] by sorted position, out = y [T, N] fp32 by pair (down).
    # wq e4m3 [n_q, NH*N, K]; ws fp32 [n_q, NH*N/128, K/128]; w16 bf16 [G - n_q, NH*N, K].
    pid_n = tl.program_id(1)
    cnt = tl.load(blk_cnt_ptr + tl.program_id(0))
    if cnt == 0:
        return
    e, pos, mmask, flat = block_rows(cnt, blk_e_ptr, blk_start_ptr, order_ptr, BLOCK_M, True)
    arow = input_rows(flat, pos, kk, NH)
    rows = tile_rows(pid_n, N, NH, BLOCK_N)                           # [NH*BN] weight rows
    acc = tl.zeros((NH * BLOCK_N, BLOCK_M), dtype=tl.float32)
    use16 = False
    if HAS16:
        use16 = e >= n_q
    if use16:                                                         # bf16 shared expert
        acc = bf16_expert(acc, a_ptr, w16_ptr, arow, mmask, rows, e - n_q, stride_am,
                          stride_he, stride_hn, K, BLOCK_K16)
    else:
        rk = tl.arange(0, 128)
        a_ptrs = a_ptr + arow[None, :] * stride_am + rk[:, None]            # [128, BM]
        q_ptrs = wq_ptr + e * stride_qe + rows[:, None] * stride_qn + rk[None, :]  # [NBN, 128]
        s_ptrs = ws_ptr + e * stride_se + (rows // 128) * stride_sn          # [NBN]
        for k0 in range(0, K, 128):
            xa = tl.load(a_ptrs, mask=mmask[None, :], other=0.0).to(tl.float32)
            amax = tl.maximum(tl.max(tl.abs(xa), axis=0), 1e-10)            # [BM] per row
            sx = amax / 448.0
            xs = xa / sx[None, :]
            if EMU:   # round to the e4m3 grid (3 mantissa bits, exponent >= -6), ties to even
                ex = tl.maximum(tl.floor(tl.log2(tl.abs(xs) + 1e-30)), -6.0)
                step = tl.exp2(ex - 3.0)
                v = xs / step
                rv = tl.floor(v + 0.5)
                rv = tl.where((rv - v == 0.5) & (rv % 2 != 0), rv - 1.0, rv)
                xq = rv * step
                wq = tl.load(q_ptrs)
            else:
                xq = xs.to(tl.float8e4nv)
                wq = tl.load(q_ptrs)
            part = tl.dot(wq, xq)                                            # [NBN, BM] fp32
            sw = tl.load(s_ptrs)                                             # [NBN]
            acc += part * sw[:, None] * sx[None, :]
            a_ptrs += 128
            q_ptrs += 128
            s_ptrs += 1
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if NH == 2:
        act = silu_gate_up(acc, BLOCK_N, BLOCK_M)
        tl.store(out_ptr + pos[None, :] * stride_om + rn[:, None],
                 act.to(out_ptr.dtype.element_ty), mask=mmask[None, :])
    else:
        store_weighted(out_ptr, tw_ptr, flat, mmask, acc, rn, stride_om)


# ------------------------------------------------------------------ format (pure torch)

def quantize_blocks(w):
    """w [..., N, K] (N, K multiples of 128) -> (e4m3 [..., N, K], fp32 scales
    [..., N/128, K/128]), s = amax / 448 per 128 x 128 block, q = w / s rounded."""
    import torch

    *lead, n, k = w.shape
    if n % BLOCK or k % BLOCK:
        raise ValueError(f"weight [{n}, {k}] is not in whole 128 x 128 blocks")
    b = w.float().reshape(*lead, n // BLOCK, BLOCK, k // BLOCK, BLOCK)
    s = b.abs().amax((-3, -1)).clamp_min(AMAX_FLOOR) / FP8_MAX          # [..., N/128, K/128]
    q = (b / s[..., :, None, :, None]).to(torch.float8_e4m3fn)
    return q.reshape(*lead, n, k), s


def dequantize_blocks(q, s):
    """e4m3 [..., N, K] and fp32 block scales -> float32 [..., N, K]."""
    *lead, n, k = q.shape
    b = q.float().reshape(*lead, n // BLOCK, BLOCK, k // BLOCK, BLOCK)
    return (b * s[..., :, None, :, None]).reshape(*lead, n, k)


def quantize_act(x):
    """Per-row, per-128-group activation quantisation (as the kernel does it, in torch):
    x [..., K] -> (e4m3 [..., K], fp32 scales [..., K/128])."""
    import torch

    g = x.float().unflatten(-1, (-1, BLOCK))
    s = g.abs().amax(-1).clamp_min(AMAX_FLOOR) / FP8_MAX
    return (g / s[..., None]).to(torch.float8_e4m3fn).flatten(-2), s


def dequantize_act(q, s):
    return (q.float().unflatten(-1, (-1, BLOCK)) * s[..., None]).flatten(-2)


def quantize_weights(w: MoEWeights, shared_fmt: str = "fp8") -> QuantMoEWeights:
    n, S = w.n_alloc, w.n_shared
    nq = n + S if shared_fmt == "fp8" else n
    gq, gs = quantize_blocks(w.gate_up[:nq])
    dq, ds = quantize_blocks(w.down[:nq])
    return QuantMoEWeights("fp8", w, gq, gs, dq, ds,
                           w.gate_up[n:] if nq == n and S else None,
                           w.down[n:] if nq == n and S else None)


def random_weights(base: MoEWeights, H: int, I: int, gen, device, shared_fmt: str = "fp8",
                   shared=None) -> QuantMoEWeights:
    """Random fp8 weights at real sizes: N(0, 1) values cast to e4m3, block scales about
    (1/sqrt(K)) (1 + 0.1 N(0, 1)); expert by expert (no bf16 copy of all experts)."""
    import torch

    from microbench.kernels.common import randn

    n, S = base.n_alloc, base.n_shared
    nq = n + S if shared_fmt == "fp8" else n
    if H % BLOCK or I % BLOCK:
        raise ValueError(f"hidden {H} / intermediate {I} are not multiples of {BLOCK}")

    def one(N, K):
        q = torch.randn(N, K, generator=gen, device=device).to(torch.float8_e4m3fn)
        s = torch.randn(N // BLOCK, K // BLOCK, generator=gen, device=device)
        return q, (1.0 + 0.1 * s).abs_().add_(0.05).mul_(K ** -0.5)
    gq = torch.empty(nq, 2 * I, H, device=device, dtype=torch.float8_e4m3fn)
    gs = torch.empty(nq, 2 * I // BLOCK, H // BLOCK, device=device)
    dq = torch.empty(nq, H, I, device=device, dtype=torch.float8_e4m3fn)
    ds = torch.empty(nq, H // BLOCK, I // BLOCK, device=device)
    for e in range(nq):
        gq[e], gs[e] = one(2 * I, H)
        dq[e], ds[e] = one(H, I)
    sg = sd = None
    if nq == n and S:
        sg, sd = shared if shared is not None else (
            randn((S, 2 * I, H), H ** -0.5, gen, device), randn((S, H, I), I ** -0.5, gen, device))
    return QuantMoEWeights("fp8", base, gq, gs, dq, ds, sg, sd)


# ------------------------------------------------------------------ host side

def _launch(a, wq, ws, w16, out, plan, tw_flat, N, kk, nh, n_q, kc: KernelConfig,
            block_m: int):
    K = a.shape[1]
    if K % BLOCK or N % BLOCK:
        raise ValueError(f"dimensions {N} x {K} are not multiples of {BLOCK}")
    return launch_quantised(_fp8_src, (a,), wq, ws, w16, out, plan, tw_flat, N, kk, n_q, kc,
                            fit_block(kc.block_n, N), K=K, NH=nh,
                            EMU=a.device.type != "cuda", BLOCK_M=block_m,
                            BLOCK_K16=fit_block(max(16, kc.block_k // 2), K))


def fused_moe(x, qw: QuantMoEWeights, ids, tw, plan, cfg: MoeConfig):
    import torch

    b, kk = ids.shape
    I, H = qw.base.inter, x.shape[1]
    out_dtype = x.dtype
    gq, gs, dq, ds = qw.gate_up_q, qw.gate_up_s, qw.down_q, qw.down_s
    s_gu, s_d = qw.shared_gate_up, qw.shared_down
    if x.device.type != "cuda":  # interpreter: float32 values of the fp8 numbers
        x, gq, dq, s_gu, s_d = as_float32(x, gq, dq, s_gu, s_d)
    T = b * kk
    tw = tw.reshape(-1)
    act = torch.empty(T, I, device=x.device, dtype=x.dtype)
    _launch(x, gq, gs, s_gu, act, plan, tw, I, kk, 2, qw.n_q, cfg.gate_up, cfg.block_m)
    y = torch.empty(T, H, device=x.device, dtype=torch.float32)
    _launch(act, dq, ds, s_d, y, plan, tw, H, kk, 1, qw.n_q, cfg.down, cfg.block_m)
    return y.view(b, kk, H).sum(1).to(out_dtype)


def moe_forward(qw: QuantMoEWeights, x, cfg: MoeConfig | None = None):
    from microbench.kernels import moe_route as R

    if why := available():
        raise RuntimeError(why)
    b = x.shape[0]
    cfg = cfg or config_for(b)
    ids, tw, plan = R.route_and_plan(qw.base, x, cfg.block_m)
    return fused_moe(x, qw, ids, tw, plan, cfg)


def reference(qw: QuantMoEWeights, x, ids, tw):
    """float32, token by token: x quantised per 128-group, gate_up on dequantised weights,
    act rounded to bf16 then quantised per 128-group, down; shared expert(s) weight 1.
    ids/tw [b, top_k] routed only."""
    import torch
    import torch.nn.functional as F

    b = x.shape[0]
    I, nq, n = qw.base.inter, qw.n_q, qw.base.n_alloc
    out = torch.zeros(b, x.shape[1], device=x.device)
    # the kernel stores act in x's dtype on the GPU, float32 in the CPU interpreter
    adt = x.dtype if x.is_cuda else torch.float32

    def expert(e, xt):
        if e < nq:
            xq = dequantize_act(*quantize_act(xt))
            gu = dequantize_blocks(qw.gate_up_q[e], qw.gate_up_s[e]) @ xq
            a = (F.silu(gu[:I]) * gu[I:]).to(adt)
            return dequantize_blocks(qw.down_q[e], qw.down_s[e]) @ dequantize_act(
                *quantize_act(a))
        gu = qw.shared_gate_up[e - nq].float() @ xt.float()
        a = (F.silu(gu[:I]) * gu[I:]).to(adt).float()
        return qw.shared_down[e - nq].float() @ a
    for t in range(b):
        for j in range(ids.shape[1]):
            out[t] += float(tw[t, j]) * expert(int(ids[t, j]), x[t])
        for s in range(qw.base.n_shared):
            out[t] += expert(n + s, x[t])
    return out
