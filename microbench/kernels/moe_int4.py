"""Fused INT4 W4A16 MoE decode layer in Triton: Kimi K2's routed experts as it serves them
(bf16 activations; weights as compressed-tensors packs them, see `int4_pack`: each row's inputs
in groups of 32 sharing one bf16 scale, each input a 4-bit signed value stored as value + 8,
eight consecutive inputs per int32 word with the first in the lowest 4 bits), dequantised in
registers, with the router, shared expert and fused gate/up of `moe_triton`.

Why: at decode sizes an MoE layer streams weights. INT4 moves a quarter of bf16's bytes (plus
a scale per 32 weights), so its floor is the packed + scale bytes of the distinct experts the
micro-batch touches, plus the shared expert, which Kimi K2 keeps in bf16, plus the router
(`reports.base.model_config.matrix_bytes` counts exactly these).

How (one kernel source for both projections, graph-capturable):
- Routing and the block plan: `moe_route.route` / `moe_route.plan` (two Triton launches; the
  plan is `moe_triton.BlockPlan`, blocks of BLOCK_M (token, slot) pairs of one expert).
- Each program owns one block and BLOCK_N output features (gate_up: BLOCK_N gate rows and the
  matching up rows, read as one 2*BLOCK_N-row tile, so one dot serves both). Weights are the
  left operand (`tl.dot(W, X^T)`): with 64+ weight rows that is one Hopper warpgroup MMA
  whatever the token count, the tokens (padded to BLOCK_M = 16) being its narrow side.
- Dequantisation: each int32 word (8 inputs) is turned into bf16 pairs by bit tricks in
  inline PTX: (word >> 4j) & 0x000F000F | 0x43004300 is two bf16 numbers 128 + nibble (inputs
  j and j+4), minus 136 gives q exactly, times the group's scale gives the weight rounded
  once, as `int4_pack.dequantize` does. The pairs are used as they come out (input order
  0,4,1,5,2,6,3,7 within each word) and the activations are read in the same order, so no
  shuffle is needed. On the CPU (Triton's interpreter: no inline assembly, no bf16) the same
  kernel does the arithmetic in float32.
- The shared expert: quantised with the routed ones (appended groups) when the model stores it
  in int4, else a bf16 tile path in the same kernel (groups >= n_q).
- down writes fp32 [pairs, H] at each pair's (token, slot) index times its routing weight;
  out = sum over slots (each entry written once: no atomics, deterministic).

Check: `reference` = `layers.moe_reference` (float32) on the dequantised weights
(dequantise then the bf16 path). Timing and tuning: `python -m microbench.stage_cost.tune_moe_quant`.
"""
from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - reported by available()
    triton = tl = None

from microbench.kernels import int4_pack as P
from microbench.kernels.moe_common import LazyExperts, MoEWeights, QuantMoEWeights
from microbench.kernels.moe_triton import (KernelConfig, MoeConfig, available,  # noqa: F401
                                           fit_block, pick_config)
from microbench.kernels.triton_expert import (as_float32, bf16_expert, block_rows,
                                              input_rows, launch_quantised, silu_gate_up,
                                              store_weighted, tile_rows)

# Upper micro-batch bound -> block sizes (first row whose bound >= b), from the sweep in
# microbench/stage_cost/tune_moe_quant.py on one H200 at Kimi K2 dims (see docs/BENCHMARKS.md).
# Kernel-alone medians (us), gate_up / down, with the chosen configs: b=1 106 / 52,
# b=8 530 / 276, b=32 1657 / 861, b=128 3148 / 1647 (the smallest tiles won at every size).
CONFIGS: tuple[tuple[int, MoeConfig], ...] = (
    (1 << 30, MoeConfig(16, KernelConfig(32, 256, 4, 3), KernelConfig(64, 128, 4, 4))),
)


def config_for(batch: int) -> MoeConfig:
    return pick_config(CONFIGS, batch)


if tl is not None:
    # bf16 pairs from one int32 word of 8 nibbles ($8) and its group's bf16 scale ($9):
    # outputs $0..$7 = inputs 0,4,1,5,2,6,3,7 of the word, each (nibble - 8) * scale.
    _DEQ_PTX = tl.constexpr("""
{
.reg .b32 t<4>, m, c, one, neg, sc, s;
mov.b32 m, 0x000F000F;
mov.b32 c, 0x43004300;
mov.b32 one, 0x3F803F80;
mov.b32 neg, 0xC308C308;
mov.b32 sc, {$9, $9};
lop3.b32 t0, $8, m, c, 0xEA;
shr.b32 s, $8, 4;
lop3.b32 t1, s, m, c, 0xEA;
shr.b32 s, $8, 8;
lop3.b32 t2, s, m, c, 0xEA;
shr.b32 s, $8, 12;
lop3.b32 t3, s, m, c, 0xEA;
fma.rn.bf16x2 t0, t0, one, neg;
fma.rn.bf16x2 t1, t1, one, neg;
fma.rn.bf16x2 t2, t2, one, neg;
fma.rn.bf16x2 t3, t3, one, neg;
mul.rn.bf16x2 t0, t0, sc;
mul.rn.bf16x2 t1, t1, sc;
mul.rn.bf16x2 t2, t2, sc;
mul.rn.bf16x2 t3, t3, sc;
mov.b32 {$0, $1}, t0;
mov.b32 {$2, $3}, t1;
mov.b32 {$4, $5}, t2;
mov.b32 {$6, $7}, t3;
}
""")


def _int4_src(a_ptr, a16_ptr, wq_ptr, ws_ptr, w16_ptr, out_ptr, order_ptr, tw_ptr,
              blk_e_ptr, blk_start_ptr, blk_cnt_ptr,
              N, kk, n_q, stride_am, stride_qe, stride_qn, stride_se, stride_sn,
              stride_he, stride_hn, stride_om,
              K: tl.constexpr, NH: tl.constexpr, HAS16: tl.constexpr, ASM: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # NH = 2 (gate_up): a = x [b, K] in pair order, a16 = x, read by token; out = act [T, N]
    #   by sorted position, in pair order for int4 experts (what down reads), else plain.
    # NH = 1 (down): a = a16 = act [T, K] by sorted position; out = y [T, N] fp32 by pair.
    # wq int32 [n_q, NH*N, K/8]; ws bf16 [n_q, NH*N, K/32]; w16 bf16 [G - n_q, NH*N, K].
    pid_n = tl.program_id(1)
    cnt = tl.load(blk_cnt_ptr + tl.program_id(0))
    if cnt == 0:
        return
    e, pos, mmask, flat = block_rows(cnt, blk_e_ptr, blk_start_ptr, order_ptr, BLOCK_M, True)
    arow = input_rows(flat, pos, kk, NH)
    rows = tile_rows(pid_n, N, NH, BLOCK_N)                           # [NH*BN]
    acc = tl.zeros((NH * BLOCK_N, BLOCK_M), dtype=tl.float32)
    use16 = False
    if HAS16:
        use16 = e >= n_q
    if use16:                                                         # bf16 shared expert
        # BLOCK_K / 4 inputs per step: the same bytes per pipeline stage as the int4 tiles
        acc = bf16_expert(acc, a16_ptr, w16_ptr, arow, mmask, rows, e - n_q, stride_am,
                          stride_he, stride_hn, K, BLOCK_K // 4)
    else:
        BKW: tl.constexpr = BLOCK_K // 8
        # tile input k holds word k//8's nibble (k%8)//2 + 4*(k%2): `a` is in that order
        a_ptrs = a_ptr + arow[None, :] * stride_am + tl.arange(0, BLOCK_K)[:, None]  # [BK, BM]
        q_ptrs = (wq_ptr + e * stride_qe + rows[None, :] * stride_qn
                  + tl.arange(0, BKW)[:, None])                              # [BKW, NH*BN]
        s_ptrs = (ws_ptr + e * stride_se + rows[None, :] * stride_sn
                  + tl.arange(0, BKW // 4)[:, None])                         # [BKW/4, NH*BN]
        for k0 in range(0, K, BLOCK_K):
            xa = tl.load(a_ptrs, mask=mmask[None, :], other=0.0)
            q = tl.load(q_ptrs)
            s4 = tl.load(s_ptrs)
            # one scale per 4 words: repeat each 4 times along the word axis
            s = tl.reshape(tl.permute(tl.join(tl.join(s4, s4), tl.join(s4, s4)), (0, 2, 3, 1)),
                           (BKW, NH * BLOCK_N))
            if ASM:
                o = tl.inline_asm_elementwise(_DEQ_PTX, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [q, s],
                                              dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
                o0, o1, o2, o3, o4, o5, o6, o7 = o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]
            else:
                sf = s.to(tl.float32)
                dt = a_ptr.dtype.element_ty
                o0 = ((((q >> 0) & 0xF) - 8).to(tl.float32) * sf).to(dt)
                o1 = ((((q >> 16) & 0xF) - 8).to(tl.float32) * sf).to(dt)
                o2 = ((((q >> 4) & 0xF) - 8).to(tl.float32) * sf).to(dt)
                o3 = ((((q >> 20) & 0xF) - 8).to(tl.float32) * sf).to(dt)
                o4 = ((((q >> 8) & 0xF) - 8).to(tl.float32) * sf).to(dt)
                o5 = ((((q >> 24) & 0xF) - 8).to(tl.float32) * sf).to(dt)
                o6 = ((((q >> 12) & 0xF) - 8).to(tl.float32) * sf).to(dt)
                o7 = ((((q >> 28) & 0xF) - 8).to(tl.float32) * sf).to(dt)
            # [BKW, NH*BN, 2, 2, 2] with the 8 outputs in order, then [BK, NH*BN]
            w = tl.join(tl.join(tl.join(o0, o4), tl.join(o2, o6)),
                        tl.join(tl.join(o1, o5), tl.join(o3, o7)))
            w = tl.reshape(tl.permute(w, (0, 2, 3, 4, 1)), (BLOCK_K, NH * BLOCK_N))
            acc = tl.dot(tl.trans(w), xa, acc)
            a_ptrs += BLOCK_K
            q_ptrs += BKW
            s_ptrs += BKW // 4
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if NH == 2:
        act = silu_gate_up(acc, BLOCK_N, BLOCK_M)
        col = 8 * (rn // 8) + 2 * (rn % 4) + (rn % 8) // 4              # pair order
        if HAS16:
            col = tl.where(use16, rn, col)
        tl.store(out_ptr + pos[None, :] * stride_om + col[:, None],
                 act.to(out_ptr.dtype.element_ty), mask=mmask[None, :])
    else:
        store_weighted(out_ptr, tw_ptr, flat, mmask, acc, rn, stride_om)


# ------------------------------------------------------------------ weights

def quantize_weights(w: MoEWeights, shared_fmt: str = "bf16") -> QuantMoEWeights:
    """INT4 copy of a fast-layout `MoEWeights` (routed experts always; the shared expert(s)
    too when `shared_fmt` is "int4", else they stay bf16). For checks at small sizes."""
    n, S = w.n_alloc, w.n_shared
    nq = n + S if shared_fmt == "int4" else n
    gq, gs = P.quantize_pack(w.gate_up[:nq])
    dq, ds = P.quantize_pack(w.down[:nq])
    return QuantMoEWeights("int4", w, gq, gs, dq, ds,
                           w.gate_up[n:] if nq == n and S else None,
                           w.down[n:] if nq == n and S else None)


def random_weights(base: MoEWeights, H: int, I: int, gen, device, shared_fmt: str = "bf16",
                   shared=None) -> QuantMoEWeights:
    """Random INT4 weights at real sizes without a bf16 copy (`int4_pack.random_packed`,
    expert by expert). `base` gives the router etc.; `shared` = (gate_up, down) bf16 shared
    expert weights to keep (else random)."""
    import torch

    from microbench.kernels.common import randn

    n, S = base.n_alloc, base.n_shared
    nq = n + S if shared_fmt == "int4" else n
    gq = torch.empty(nq, 2 * I, H // P.PACK, device=device, dtype=torch.int32)
    gs = torch.empty(nq, 2 * I, H // P.GROUP, device=device, dtype=torch.bfloat16)
    dq = torch.empty(nq, H, I // P.PACK, device=device, dtype=torch.int32)
    ds = torch.empty(nq, H, I // P.GROUP, device=device, dtype=torch.bfloat16)
    for e in range(nq):
        gq[e], gs[e] = P.random_packed((2 * I, H), H ** -0.5, gen, device)
        dq[e], ds[e] = P.random_packed((H, I), I ** -0.5, gen, device)
    sg = sd = None
    if nq == n and S:
        sg, sd = shared if shared is not None else (
            randn((S, 2 * I, H), H ** -0.5, gen, device), randn((S, H, I), I ** -0.5, gen, device))
    return QuantMoEWeights("int4", base, gq, gs, dq, ds, sg, sd)


def dequantised_view(qw: QuantMoEWeights) -> MoEWeights:
    """A `MoEWeights` whose gate_up[e] / down[e] are expert e dequantised on demand (float32),
    for `layers.moe_reference`."""
    import dataclasses

    nq = qw.n_q

    def gu(e):
        return (P.dequantize(qw.gate_up_q[e], qw.gate_up_s[e]) if e < nq
                else qw.shared_gate_up[e - nq]).float()

    def dn(e):
        return (P.dequantize(qw.down_q[e], qw.down_s[e]) if e < nq
                else qw.shared_down[e - nq]).float()
    return dataclasses.replace(qw.base, gate_up=LazyExperts(gu), down=LazyExperts(dn))


# ------------------------------------------------------------------ host side

def _launch(a, a16, wq, ws, w16, out, plan, tw_flat, N, kk, nh, n_q, kc: KernelConfig,
            block_m: int, asm: bool):
    K = a.shape[1]
    bk = fit_block(kc.block_k, K)
    if bk < 64:
        raise ValueError(f"input dimension {K} must be a multiple of 64")
    return launch_quantised(_int4_src, (a, a16), wq, ws, w16, out, plan, tw_flat, N, kk, n_q,
                            kc, fit_block(kc.block_n, N), K=K, NH=nh,
                            ASM=asm and a.device.type == "cuda", BLOCK_M=block_m, BLOCK_K=bk)


def fused_moe(x, xp, qw: QuantMoEWeights, ids, tw, plan, cfg: MoeConfig, asm: bool = True):
    """y [b, H] for routed + shared experts given ids/tw [b, kk] (shared appended) and their
    block plan. x [b, H] bf16 and xp, the same in pair order (`moe_route.route`)."""
    import torch

    b, kk = ids.shape
    I, H = qw.base.inter, x.shape[1]
    out_dtype = x.dtype
    wq_gu, ws_gu, wq_d, ws_d = qw.gate_up_q, qw.gate_up_s, qw.down_q, qw.down_s
    s_gu, s_d = qw.shared_gate_up, qw.shared_down
    if x.device.type != "cuda":      # Triton's interpreter has no bf16: interpret in fp32
        x, xp, ws_gu, ws_d, s_gu, s_d = as_float32(x, xp, ws_gu, ws_d, s_gu, s_d)
    T = b * kk
    act = torch.empty(T, I, device=x.device, dtype=x.dtype)
    tw = tw.reshape(-1)
    _launch(xp, x, wq_gu, ws_gu, s_gu, act, plan, tw, I, kk, 2, qw.n_q, cfg.gate_up,
            cfg.block_m, asm)
    y = torch.empty(T, H, device=x.device, dtype=torch.float32)
    _launch(act, act, wq_d, ws_d, s_d, y, plan, tw, H, kk, 1, qw.n_q, cfg.down, cfg.block_m,
            asm)
    return y.view(b, kk, H).sum(1).to(out_dtype)


# Which expert kernel a call runs, from the mean (token, slot) rows per routed expert of the
# model, b * top_k / experts: the CUDA-core GEMV (`moe_int4_gemv`) up to GEMV_MAX_ROWS, this
# MMA kernel above. Measured on one H200 at Kimi K2 dims (whole layer, graph replay), the MMA
# kernel was faster at every b from 1 (0.02 rows per expert: 178 vs 196 us) to 256 (5.3 rows:
# 5.5 vs 21 ms), so the GEMV is never chosen by default (docs/BENCHMARKS.md section 8).
GEMV_MAX_ROWS = 0.0


def use_gemv(qw: QuantMoEWeights, batch: int) -> bool:
    return batch * qw.base.top_k < GEMV_MAX_ROWS * qw.base.router.shape[0]


def kernel_name(cfg=None, batch: int = 1) -> str:
    """Which expert kernel `moe_forward(qw, x, cfg)` runs here for `batch` tokens."""
    from microbench.kernels import moe_int4_gemv as G
    from microbench.kernels import moe_int4_mma as MM

    if isinstance(cfg, G.GemvMoeConfig):
        return "moe_int4_gemv (Triton, CUDA-core GEMV, INT4 W4A16 group 32)"
    if isinstance(cfg, MM.MmaLayerConfig) or (cfg is None and batch <= MM.MAX_BATCH
                                              and MM.available() is None):
        return MM.KERNEL
    return "moe_int4 (Triton, INT4 W4A16 group 32, in-register dequantisation)"


def moe_forward(qw: QuantMoEWeights, x, cfg=None, asm: bool = True):
    """The whole layer on x [b, H]: router (`moe_route.route`), plan (`moe_route.plan`),
    experts, the slot sum. `cfg` None: `moe_int4_mma` (CUDA, weights dequantised into MMA
    registers) at decode sizes (b <= `moe_int4_mma.MAX_BATCH`) where it builds
    (`moe_int4_mma.available()`: cupy, an sm_80+ GPU), else this module's Triton kernel; a `MoeConfig` runs the Triton kernel, a
    `moe_int4_gemv.GemvMoeConfig` the CUDA-core GEMV one, a `moe_int4_mma.MmaLayerConfig`
    the CUDA one."""
    from microbench.kernels import moe_int4_gemv as G
    from microbench.kernels import moe_int4_mma as MM
    from microbench.kernels import moe_route as R

    if why := available():
        raise RuntimeError(why)
    b = x.shape[0]
    if isinstance(cfg, MM.MmaLayerConfig) or (cfg is None and not use_gemv(qw, b)
                                              and b <= MM.MAX_BATCH
                                              and MM.available() is None):
        return MM.moe_forward(qw, x, cfg)
    if isinstance(cfg, G.GemvMoeConfig) or (cfg is None and use_gemv(qw, b)):
        cfg = cfg or G.config_for(b)
        ids, tw, xg, cg = R.route(qw.base, x, gemv_layout=True)
        plan = R.plan_for(ids, qw.base.n_alloc + qw.base.n_shared, cfg.block_m)
        return G.fused_moe(x, xg, cg, qw, ids, tw, plan, cfg)
    cfg = cfg or config_for(b)
    ids, tw, xp = R.route(qw.base, x, pair_order=True)
    folded = qw.base.n_alloc < qw.base.router.shape[0]
    plan = R.plan_for(ids, qw.base.n_alloc + qw.base.n_shared, cfg.block_m,
                      None if folded else b)
    return fused_moe(x, xp, qw, ids, tw, plan, cfg, asm)


def reference(qw: QuantMoEWeights, x, ids, tw):
    """float32 reference on the dequantised weights; ids/tw [b, top_k] routed only (the shared
    expert is added by `layers.moe_reference`)."""
    from microbench.kernels.moe_common import moe_reference

    return moe_reference(dequantised_view(qw), x, ids, tw)
