"""INT4 W4A16 MoE decode experts without the tensor cores: a grouped GEMV on the CUDA cores.

Why it was tried: in decode each routed expert sees 1-3 (token, slot) rows (Kimi K2: b = 8
touches ~58 experts with 64 pairs, b = 128 ~359 with 1024). The MMA kernel (`moe_int4`) pads
those rows to 16 and spends its time dequantising into bf16 and moving the tile from registers
through shared memory into the MMA layout (docs/BENCHMARKS.md section 8). Here each weight
becomes an fp32 number with one logic op and meets the expert's rows in FMAs: about 1 + M
instructions per weight for M rows, against ~18 weights per clock per SM for the HBM floor.

Measured on one H200 (docs/BENCHMARKS.md section 8): correct (relative error 0.0027-0.0031
against the float32 reference), but slower than the MMA kernel at every micro-batch from 1 to
256 (b = 1: gate_up 115 us vs 106, down 63 vs 52; b = 128: 7.4 + 4.1 ms vs 3.1 + 1.6 ms), at
~1.3 TB/s of weights. Not register- or occupancy-bound (55-80 registers, no spills), and
loading weights two K steps ahead instead of one made it slower: the cause was not found
within the session's device time. `moe_int4.use_gemv` therefore never picks it by default;
it stays as a measured, tested alternative (`moe_int4.moe_forward(..., cfg=GemvMoeConfig())`).

Weights stay in the compressed-tensors layout of `int4_pack` (no re-layout): each thread loads
16 bytes = 4 int32 words = 32 inputs = exactly one scale group of one weight row.

How a nibble becomes a number: for nibble j of a word (inputs 8c + j), take the word (j < 4)
or the word shifted right by 16 (j >= 4) and mask the nibble in place: bits 4(j%4) ..
4(j%4)+3. That bit pattern read as an fp32 is nib * 2^(4(j%4) - 149) exactly (patterns below
2^24 are subnormals or the smallest normals: p * 2^-149). The activations are stored
pre-scaled by 2^(149 - 64 - 4(j%4)), so the FMA gives nib * x * 2^-64 (Triton emits plain
`fma.rn.f32`: no flush to zero). The code's offset (q = nib - 8) is one term per group:
sum_k q_k x_k = sum_k nib_k x_k - 8 sum_k x_k, the last sum precomputed per row and 16 inputs
(`c16`).

Activation layout ("gemv layout", `store_gemv`): per row, fp32, each group of 32 inputs
reordered to [j (8), w (4)]: input 32g + 8w + j at 32g + 4j + w, scaled as above; one 16-byte
load gives the 4 activations that meet nibble j of a thread's 4 words. `moe_route.route` writes
x in it (extra programs of the routing launch); gate_up writes its output act (fp32,
SiLU(gate) * up) in it for down.

Kernel (one source for gate_up, NH = 2, and down, NH = 1): grid (plan blocks + shared-expert
blocks, N / BLOCK_N). A plan block (`moe_route.plan`, at most `block_m` rows of one expert)
streams NH * BLOCK_N weight rows over all of K once and applies each dequantised weight to all
its rows: the row count picks a variant compiled for 1, 2 or 4 rows (3 rows run as 4 with one
padded row). Groups are summed in registers; one cross-thread sum per row at the end. A bf16
shared expert (Kimi K2 serves it in bf16) is not in the plan's blocks: extra programs take it
for BLOCK_MS tokens at a time on the tensor cores (`tl.dot`), writing a plain bf16 act. down
writes fp32 y [pairs, H] times the routing weight, each entry once.

Check: `moe_int4.reference` (float32 on the dequantised weights), as the MMA path.
Timing: `python -m microbench.stage_cost.tune_moe_quant` (column "int4 gemv").
"""
from __future__ import annotations

from dataclasses import dataclass

from microbench.kernels.moe_triton import fit_block, pick_config
from microbench.kernels.triton_expert import (as_float32, compiled, launch_options,
                                              silu_gate_up, store_weighted, tile_rows)

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - reported by moe_triton.available()
    triton = tl = None

BLOCK_M = 4           # rows per plan block (variants for 1, 2 and 4 rows)
PRE_EXP = 64          # products are nib * x * 2^-64 (|x| up to ~2^40 stays finite)
C16_SCALE = -8.0 * 2.0 ** -PRE_EXP   # c16 = -8 * 2^-64 * (sum of 16 activations)


@dataclass(frozen=True)
class GemvConfig:
    block_n: int = 16     # output features per program (gate_up: 2x weight rows)
    block_g: int = 16     # scale groups (32 inputs) per K step
    num_warps: int = 4
    num_stages: int = 3   # software pipelining of the shared-expert (tl.dot) programs only


@dataclass(frozen=True)
class GemvMoeConfig:
    gate_up: GemvConfig = GemvConfig()
    down: GemvConfig = GemvConfig(32, 16, 4, 2)
    block_ms: int = 16    # tokens per shared-expert (bf16, tensor core) program
    block_k16: int = 64   # inputs per step of the shared-expert programs
    block_m: int = BLOCK_M  # rows per plan block: 1, 2 or 4 (a variant for each of 1, 2, 4 up
    #                         to it; fewer variants, fewer registers, more re-reads of weights)


# Upper micro-batch bound -> config (first row whose bound >= b), from sweeps on one H200 at
# Kimi K2 dims; kernel-alone medians (us) gate_up / down with these: b=1 115 / 63,
# b=8 725 / 367, b=32 2341 / 1264, b=128 7356 / 4135 (the MMA kernel: 106 / 52 ... 3148 / 1647).
CONFIGS: tuple[tuple[int, GemvMoeConfig], ...] = (
    (8, GemvMoeConfig(GemvConfig(16, 8, 4, 3), GemvConfig(16, 16, 4, 3), 16, 64, 1)),
    (32, GemvMoeConfig(GemvConfig(16, 8, 4, 3), GemvConfig(16, 16, 4, 3), 32, 64, 2)),
    (1 << 30, GemvMoeConfig(GemvConfig(16, 8, 4, 3), GemvConfig(64, 4, 4, 3), 64, 64, 4)),
)


def config_for(batch: int) -> GemvMoeConfig:
    return pick_config(CONFIGS, batch)


def _store_gemv_src(ptr, cptr, stride, cstride, rows, rmask, k0, v, KD, C: tl.constexpr):
    # v [R, C] fp32: inputs k0 .. k0+C-1 (k0 % 16 == 0) of rows `rows` [R] int64 -> gemv layout
    k = k0 + tl.arange(0, C)
    j = k % 8
    d = k - k % 32 + 4 * j + (k % 32) // 8
    ex = 127 + 149 - _PE - 4 * (j % 4)
    f = (ex << 23).to(tl.float32, bitcast=True)                        # exact power of two
    m = rmask[:, None] & (k < KD)[None, :]
    tl.store(ptr + rows[:, None] * stride + d[None, :], v * f[None, :], mask=m)
    cs = tl.sum(tl.reshape(v, (v.shape[0], C // 16, 16)), 2) * _C16
    ci = k0 // 16 + tl.arange(0, C // 16)
    tl.store(cptr + rows[:, None] * cstride + ci[None, :], cs,
             mask=rmask[:, None] & (ci * 16 < KD)[None, :])


def _part_src(q, qh, x_ptrs, c_ptrs):
    # q, qh [R, BG, 4] int32 (words, words >> 16); x_ptrs [R, BG, 4]: nibble-0 activations of
    # one row, the same for every R (a broadcast: the compiler loads each address once per
    # thread, and the load takes the weights' layout, so no layout conversion); c_ptrs [R, BG]
    # -> sum over each group of q * x times 2^-64, [R, BG]
    for j in tl.static_range(8):
        if j < 4:
            bits = q & (0xF << (4 * (j % 4)))
        else:
            bits = qh & (0xF << (4 * (j % 4)))
        wj = bits.to(tl.float32, bitcast=True)                        # nib * 2^(4(j%4)-149)
        if j == 0:
            p = wj * tl.load(x_ptrs)
        else:
            p += wj * tl.load(x_ptrs + 4 * j)
    part = tl.sum(p, 2)                                               # within each thread
    return part + tl.load(c_ptrs) + tl.load(c_ptrs + 1)               # the -8 sum(x) term


def _row_out_src(acc, m, cnt, start, out_ptr, oc_ptr, tw_ptr, order_ptr, pid_n, N,
                 stride_o, stride_oc, NH: tl.constexpr, BN: tl.constexpr):
    # acc [R, BG] of row m of the block -> act (NH = 2, gemv layout) or y (NH = 1)
    pos = start + m
    out = tl.sum(acc, 1) * _UNSCALE                                   # [R]
    one = tl.zeros((1,), dtype=tl.int64)
    live = (one + m) < cnt
    if NH == 2:
        gt, up = tl.split(tl.reshape(out, (BN, 2)))
        act = gt / (1.0 + tl.exp(-gt)) * up                           # SiLU(gate) * up
        store_gemv(out_ptr, oc_ptr, stride_o, stride_oc, one + pos, live, pid_n * BN,
                   act[None, :], N, BN)
    else:
        flat = tl.load(order_ptr + pos).to(tl.int64)
        rn = pid_n * BN + tl.arange(0, BN)
        wt = tl.load(tw_ptr + flat)                                   # routing weight
        tl.store(out_ptr + flat * stride_o + rn[None, :], (out * wt)[None, :],
                 mask=live[:, None])


def _rows_src(wq_ptr, ws_ptr, xg_ptr, cg_ptr, out_ptr, oc_ptr, tw_ptr, order_ptr,
              e, start, cnt, pid_n, N, kk,
              stride_qe, stride_qn, stride_se, stride_sn, stride_x, stride_c,
              stride_o, stride_oc,
              K: tl.constexpr, NH: tl.constexpr, MP: tl.constexpr, BN: tl.constexpr,
              BG: tl.constexpr):
    # one plan block: cnt <= MP rows of expert e, NH*BN weight rows, all of K; rows past cnt
    # (MP = 4, cnt = 3) repeat row 0 and are not stored
    R: tl.constexpr = NH * BN
    rows = tile_rows(pid_n, N, NH, BN)                                # [R]
    g = tl.arange(0, BG)
    w4 = tl.arange(0, 4)
    q_ptrs = (wq_ptr + e * stride_qe + rows[:, None, None] * stride_qn
              + (4 * g)[None, :, None] + w4[None, None, :])                  # [R, BG, 4]
    # (g * stride) // stride == g, opaque to the compiler's contiguity analysis: the scales
    # are then loaded one per thread in the layout the group sums come out in, instead of
    # 4-wide and converted through shared memory on every step (seen in the TTGIR)
    go = (g * stride_sn) // stride_sn
    s_ptrs = ws_ptr + e * stride_se + rows[:, None] * stride_sn + go[None, :]  # [R, BG]
    xo = tl.broadcast_to(((32 * g)[:, None] + w4[None, :])[None, :, :], (R, BG, 4))
    co = tl.broadcast_to((2 * go)[None, :], (R, BG))
    # activation row of each block row: the token (gate_up) or the sorted position (down)
    xr0 = start
    xr1 = start + tl.where(cnt > 1, 1, 0)
    xr2 = start + tl.where(cnt > 2, 2, 0)
    xr3 = start + tl.where(cnt > 3, 3, 0)
    if NH == 2:
        xr0 = tl.load(order_ptr + xr0).to(tl.int64) // kk
        xr1 = tl.load(order_ptr + xr1).to(tl.int64) // kk
        xr2 = tl.load(order_ptr + xr2).to(tl.int64) // kk
        xr3 = tl.load(order_ptr + xr3).to(tl.int64) // kk
    x0 = xg_ptr + xr0 * stride_x + xo
    x1 = xg_ptr + xr1 * stride_x + xo
    x2 = xg_ptr + xr2 * stride_x + xo
    x3 = xg_ptr + xr3 * stride_x + xo
    c0 = cg_ptr + xr0 * stride_c + co
    c1 = cg_ptr + xr1 * stride_c + co
    c2 = cg_ptr + xr2 * stride_c + co
    c3 = cg_ptr + xr3 * stride_c + co
    a0 = tl.zeros((R, BG), dtype=tl.float32)
    a1 = tl.zeros((R, BG), dtype=tl.float32)
    a2 = tl.zeros((R, BG), dtype=tl.float32)
    a3 = tl.zeros((R, BG), dtype=tl.float32)
    # weights and scales of step k+1 are loaded before step k is computed (the compiler does
    # not pipeline loads that feed no dot; two steps ahead measured slower on one H200)
    q = tl.load(q_ptrs)
    sc = tl.load(s_ptrs)
    for kg in range(0, K // 32, BG):
        more = kg + BG < K // 32
        q_ptrs += 4 * BG
        s_ptrs += BG
        q_nxt = tl.load(q_ptrs, mask=more, other=0)
        sc_nxt = tl.load(s_ptrs, mask=more, other=0.0)
        qh = q >> 16
        scf = sc.to(tl.float32)
        a0 += _part(q, qh, x0, c0) * scf
        if MP > 1:
            a1 += _part(q, qh, x1, c1) * scf
        if MP > 2:
            a2 += _part(q, qh, x2, c2) * scf
            a3 += _part(q, qh, x3, c3) * scf
        q = q_nxt
        sc = sc_nxt
        x0 += 32 * BG
        x1 += 32 * BG
        x2 += 32 * BG
        x3 += 32 * BG
        c0 += 2 * BG
        c1 += 2 * BG
        c2 += 2 * BG
        c3 += 2 * BG
    _row_out(a0, 0, cnt, start, out_ptr, oc_ptr, tw_ptr, order_ptr, pid_n, N, stride_o,
             stride_oc, NH, BN)
    if MP > 1:
        _row_out(a1, 1, cnt, start, out_ptr, oc_ptr, tw_ptr, order_ptr, pid_n, N, stride_o,
                 stride_oc, NH, BN)
    if MP > 2:
        _row_out(a2, 2, cnt, start, out_ptr, oc_ptr, tw_ptr, order_ptr, pid_n, N, stride_o,
                 stride_oc, NH, BN)
        _row_out(a3, 3, cnt, start, out_ptr, oc_ptr, tw_ptr, order_ptr, pid_n, N, stride_o,
                 stride_oc, NH, BN)


def _gemv_src(wq_ptr, ws_ptr, xg_ptr, cg_ptr, out_ptr, oc_ptr,
              a16_ptr, w16_ptr, out16_ptr, tw_ptr, order_ptr,
              blk_e_ptr, blk_start_ptr, blk_cnt_ptr,
              NB, NTB, B, N, kk, n_q,
              stride_qe, stride_qn, stride_se, stride_sn, stride_x, stride_c,
              stride_o, stride_oc, stride_a16, stride_he, stride_hn, stride_o16,
              K: tl.constexpr, NH: tl.constexpr, TOPK: tl.constexpr,
              BN: tl.constexpr, BG: tl.constexpr, BMS: tl.constexpr, BK16: tl.constexpr,
              HAS16: tl.constexpr, MAXMP: tl.constexpr):
    # NH = 2 (gate_up): xg/cg = x in gemv layout by token; out/oc = act (gemv layout) by sorted
    #   position; a16 = x, out16 = bf16 act of the shared expert(s) [n_shared*B, N].
    # NH = 1 (down): xg/cg = act by sorted position; a16 = shared act; out = y [T, N] fp32.
    # wq int32 [n_q, NH*N, K/8]; ws bf16 [n_q, NH*N, K/32]; w16 bf16 [n_shared, NH*N, K].
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_b < NB:                                                    # a plan block
        cnt = tl.load(blk_cnt_ptr + pid_b)
        e = tl.load(blk_e_ptr + pid_b).to(tl.int64)
        start = tl.load(blk_start_ptr + pid_b).to(tl.int64)
        if (cnt > 0) & (e < n_q):
            # the variant for the block's row count (only those up to MAXMP are compiled)
            if (MAXMP == 1) or (cnt == 1):
                _rows(wq_ptr, ws_ptr, xg_ptr, cg_ptr, out_ptr, oc_ptr, tw_ptr, order_ptr,
                      e, start, cnt, pid_n, N, kk, stride_qe, stride_qn, stride_se,
                      stride_sn, stride_x, stride_c, stride_o, stride_oc,
                      K, NH, 1, BN, BG)
            elif (MAXMP == 2) or (cnt == 2):
                _rows(wq_ptr, ws_ptr, xg_ptr, cg_ptr, out_ptr, oc_ptr, tw_ptr, order_ptr,
                      e, start, cnt, pid_n, N, kk, stride_qe, stride_qn, stride_se,
                      stride_sn, stride_x, stride_c, stride_o, stride_oc,
                      K, NH, 2, BN, BG)
            else:
                _rows(wq_ptr, ws_ptr, xg_ptr, cg_ptr, out_ptr, oc_ptr, tw_ptr, order_ptr,
                      e, start, cnt, pid_n, N, kk, stride_qe, stride_qn, stride_se,
                      stride_sn, stride_x, stride_c, stride_o, stride_oc,
                      K, NH, 4, BN, BG)
    elif HAS16:                                                       # bf16 shared expert
        sb = pid_b - NB
        s = sb // NTB
        t = (sb % NTB) * BMS + tl.arange(0, BMS)                      # tokens
        tm = t < B
        t = tl.where(tm, t, 0).to(tl.int64)
        if NH == 2:
            arow = t
        else:
            arow = s * B + t
        rows = tile_rows(pid_n, N, NH, BN)
        rk = tl.arange(0, BK16)
        h_ptrs = a16_ptr + arow[None, :] * stride_a16 + rk[:, None]               # [BK16, BMS]
        v_ptrs = w16_ptr + s * stride_he + rows[:, None] * stride_hn + rk[None, :]  # [R, BK16]
        acc = tl.zeros((NH * BN, BMS), dtype=tl.float32)
        for k0 in range(0, K, BK16):
            acc = tl.dot(tl.load(v_ptrs), tl.load(h_ptrs), acc)
            h_ptrs += BK16
            v_ptrs += BK16
        rn = pid_n * BN + tl.arange(0, BN)
        if NH == 2:
            act = silu_gate_up(acc, BN, BMS)
            tl.store(out16_ptr + (s * B + t)[None, :] * stride_o16 + rn[:, None],
                     act.to(out16_ptr.dtype.element_ty), mask=tm[None, :])
        else:
            flat = t * kk + TOPK + s
            store_weighted(out_ptr, tw_ptr, flat, tm, acc, rn, stride_o)


# device functions and globals are looked up by name when a kernel is compiled: they must be
# jitted objects and constexprs (under TRITON_INTERPRET=1, `triton.jit` gives the interpreter's)
if triton is not None:
    _PE = tl.constexpr(PRE_EXP)
    _C16 = tl.constexpr(C16_SCALE)
    _UNSCALE = tl.constexpr(2.0 ** PRE_EXP)
    store_gemv = triton.jit(_store_gemv_src)
    _part = triton.jit(_part_src)
    _row_out = triton.jit(_row_out_src)
    _rows = triton.jit(_rows_src)
else:  # pragma: no cover
    store_gemv = _part = _row_out = _rows = None


# ------------------------------------------------------------------ host side

def gemv_layout_reference(x):
    """torch version of `store_gemv` for whole rows: x [rows, K] -> (xg fp32 [rows, K],
    c16 fp32 [rows, K/16]) (for tests)."""
    import torch

    rows, K = x.shape
    k = torch.arange(K)
    j = k % 8
    d = k - k % 32 + 4 * j + (k % 32) // 8
    ex = 149 - PRE_EXP - 4 * (j % 4)
    xg = torch.empty(rows, K, dtype=torch.float32)
    xg[:, d] = x.float().cpu() * torch.exp2(ex.double()).float()
    c16 = x.float().cpu().view(rows, K // 16, 16).sum(-1) * C16_SCALE
    return xg.to(x.device), c16.to(x.device)


def _launch(xg, cg, a16, qwq, qws, w16, out, oc, out16, plan, tw_flat, N, kk, top_k, B, nh,
            n_q, kc: GemvConfig, cfg: GemvMoeConfig):
    K = xg.shape[1]
    if K % 32:
        raise ValueError(f"input dimension {K} is not a multiple of 32")
    bg = kc.block_g
    while (K // 32) % bg:          # smaller K steps for small test dims
        bg //= 2
    bn = fit_block(kc.block_n, N)  # power of two >= 16 dividing N
    cuda = xg.device.type == "cuda"
    has16 = w16 is not None
    NB = plan.count.numel()
    ntb = triton.cdiv(B, cfg.block_ms)
    n_sh = w16.shape[0] if has16 else 0
    w16 = w16 if has16 else qws
    a16 = a16 if a16 is not None else xg
    out16 = out16 if out16 is not None else out
    oc = oc if oc is not None else out
    grid = (NB + n_sh * ntb, N // bn)
    compiled(_gemv_src, not cuda)[grid](
        qwq, qws, xg, cg, out, oc, a16, w16, out16, tw_flat, plan.order,
        plan.expert, plan.start, plan.count, NB, ntb, B, N, kk, n_q,
        qwq.stride(0), qwq.stride(1), qws.stride(0), qws.stride(1), xg.stride(0),
        cg.stride(0), out.stride(0), oc.stride(0), a16.stride(0), w16.stride(0),
        w16.stride(1), out16.stride(0),
        K=K, NH=nh, TOPK=top_k, BN=bn, BG=bg, BMS=cfg.block_ms,
        BK16=min(cfg.block_k16, K), HAS16=has16, MAXMP=cfg.block_m, **launch_options(kc, cuda))
    return out


def fused_moe(x, xg, cg, qw, ids, tw, plan, cfg: GemvMoeConfig):
    """y [b, H] for routed + shared experts. x [b, H] bf16; xg/cg: x in the gemv layout
    (`moe_route.route(..., gemv_layout=True)`); ids/tw [b, kk] (shared appended) and their
    block plan (BLOCK_M = 4)."""
    import torch

    b, kk = ids.shape
    I, H = qw.base.inter, x.shape[1]
    out_dtype = x.dtype
    ws_gu, ws_d, s_gu, s_d = qw.gate_up_s, qw.down_s, qw.shared_gate_up, qw.shared_down
    if x.device.type != "cuda":      # Triton's interpreter has no bf16: interpret in fp32
        x, ws_gu, ws_d, s_gu, s_d = as_float32(x, ws_gu, ws_d, s_gu, s_d)
    T = b * kk
    dev = x.device
    act = torch.empty(T, I, device=dev, dtype=torch.float32)
    act_c = torch.empty(T, I // 16, device=dev, dtype=torch.float32)
    act16 = (torch.empty(s_gu.shape[0] * b, I, device=dev, dtype=x.dtype)
             if s_gu is not None else None)
    tw = tw.reshape(-1)
    top_k = qw.base.top_k
    _launch(xg, cg, x, qw.gate_up_q, ws_gu, s_gu, act, act_c, act16, plan, tw, I, kk, top_k,
            b, 2, qw.n_q, cfg.gate_up, cfg)
    y = torch.empty(T, H, device=dev, dtype=torch.float32)
    _launch(act, act_c, act16, qw.down_q, ws_d, s_d, y, None, None, plan, tw, H, kk, top_k,
            b, 1, qw.n_q, cfg.down, cfg)
    return y.view(b, kk, H).sum(1).to(out_dtype)
