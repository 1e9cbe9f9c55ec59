"""A fused MoE decode layer in Triton: each program reads one weight tile once and applies it
to the few tokens routed to that expert.

Why: at decode sizes an MoE layer is a weight-streaming problem. The floor is the bytes of the
distinct experts the micro-batch touches (plus the shared expert) over HBM bandwidth; the
`torch._grouped_mm` paths reach 40-67% of it on an H200. This kernel aims at the floor.

How (graph-capturable: fixed-size index tensors, no host syncs, no data-dependent shapes):
1. `plan_blocks`: the b*kk (token, slot) pairs (kk = top_k + shared experts; the shared expert
   is one more expert every token visits) are sorted by expert; each expert's run is cut into
   blocks of BLOCK_M rows. There are at most T//BLOCK_M + min(G, T) blocks (T = b*kk, G =
   experts); unused block slots get count 0 and their programs return at once.
2. `_gate_up` kernel, grid (blocks, I/BLOCK_N): loads the gate rows [n, n+BLOCK_N) and the
   matching up rows of that expert's fused [2I, H] weight once, multiplies the block's tokens
   (gathered from x, padded to BLOCK_M, the dot's minimum M) and writes SiLU(gate)*up, bf16,
   at the pairs' sorted positions: `act` [T, I].
3. `_down` kernel, grid (blocks, H/BLOCK_N): act rows @ down[e] tile, times the routing
   weight, written in fp32 at the pair's (token, slot) index: `y` [T, H].
4. out = y.view(b, kk, H).sum(1) (every entry of y is written exactly once: no zeroing, no
   atomics, deterministic).
Many N-tiles (BLOCK_N 16..64) keep all SMs busy even at b=1 (9 experts), so no split-K.
Block sizes per micro-batch size come from a sweep on an H200 (`CONFIGS`, see `--sweep`).

Weights use the `fast` layout of microbench.kernels.layers: gate_up [G, 2I, H], down [G, H, I]
(row-major, K contiguous). Runs on the GPU; on the CPU through Triton's interpreter
(TRITON_INTERPRET=1 semantics, used by the tests at tiny sizes).

Run on a GPU: `PYTHONPATH=. python3 -m microbench.stage_cost.tune_moe_triton --out DIR` checks the layer
against the float32 reference (small and real Kimi K2 dims), sweeps block sizes, then prints
the per-layer table triton vs plain vs fast under CUDA-graph replay, with each one's share
of the HBM floor (spec sheet and measured copy bandwidth). `--help` lists the knobs.
"""
from __future__ import annotations

from dataclasses import dataclass

try:  # importing triton touches no GPU; absent on some CPU machines
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - reported by available()
    triton = tl = None

from microbench.kernels.moe_common import append_shared
from microbench.kernels.triton_expert import block_rows, compiled, launch_options


@dataclass(frozen=True)
class KernelConfig:
    block_n: int = 64
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 4


@dataclass(frozen=True)
class MoeConfig:
    block_m: int = 16
    gate_up: KernelConfig = KernelConfig()
    down: KernelConfig = KernelConfig()


# Upper micro-batch bound -> block sizes (first row whose bound >= b). Chosen from the sweep
# on one H200 at Kimi K2 dims (bf16); see module docstring.
# Sweep medians (us), gate_up / down kernel alone: b=1 129 / 67, b=8 759 / 384,
# b=32 2418 / 1228, b=128 4625 / 2361; the runners-up were within 1-2%. Above 256 tokens
# (prefill chunks) BLOCK_M 64 is a guess, checked for correctness but not tuned.
CONFIGS: tuple[tuple[int, MoeConfig], ...] = (
    (4, MoeConfig(16, KernelConfig(32, 128, 4, 3), KernelConfig(64, 256, 4, 3))),
    (16, MoeConfig(16, KernelConfig(32, 256, 4, 3), KernelConfig(64, 256, 4, 3))),
    (64, MoeConfig(16, KernelConfig(64, 256, 4, 4), KernelConfig(256, 128, 4, 3))),
    (256, MoeConfig(16, KernelConfig(128, 128, 4, 4), KernelConfig(256, 128, 4, 3))),
    (1 << 30, MoeConfig(64, KernelConfig(128, 64, 4, 3), KernelConfig(128, 64, 4, 3))),
)


def pick_config(table: tuple[tuple[int, MoeConfig], ...], batch: int) -> MoeConfig:
    """The first row of a (batch bound, config) table whose bound is >= batch."""
    for bound, cfg in table:
        if batch <= bound:
            return cfg
    return table[-1][1]


def config_for(batch: int) -> MoeConfig:
    return pick_config(CONFIGS, batch)


def available() -> str | None:
    if triton is None:
        return "triton is not installed"
    return None


# ------------------------------------------------------------------ kernels (plain functions,
# wrapped by triton_expert.compiled: JIT on the GPU, the interpreter on the CPU)

def _gate_up_src(x_ptr, w_ptr, act_ptr, order_ptr, blk_e_ptr, blk_start_ptr, blk_cnt_ptr,
                 N, kk, stride_xm, stride_we, stride_wn, stride_am, K: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 EVEN_K: tl.constexpr):
    # K is constexpr: the loop bound must be a Python int in Triton's interpreter
    # x [b, K]; w [G, 2N, K] (gate rows 0..N-1, up rows N..2N-1); act [T, N] by sorted position
    pid_n = tl.program_id(1)
    cnt = tl.load(blk_cnt_ptr + tl.program_id(0))
    if cnt == 0:                                                      # an unused block slot
        return
    e, pos, mmask, flat = block_rows(cnt, blk_e_ptr, blk_start_ptr, order_ptr, BLOCK_M, False)
    tok = (flat // kk).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + tok[:, None] * stride_xm + rk[None, :]          # [BM, BK]
    wg_ptrs = w_ptr + e * stride_we + rn[None, :] * stride_wn + rk[:, None]  # [BK, BN]
    wu_ptrs = wg_ptrs + N * stride_wn
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            xa = tl.load(x_ptrs, mask=mmask[:, None], other=0.0)
            wg = tl.load(wg_ptrs)
            wu = tl.load(wu_ptrs)
        else:
            km = (k0 + rk) < K
            xa = tl.load(x_ptrs, mask=mmask[:, None] & km[None, :], other=0.0)
            wg = tl.load(wg_ptrs, mask=km[:, None], other=0.0)
            wu = tl.load(wu_ptrs, mask=km[:, None], other=0.0)
        acc_g = tl.dot(xa, wg, acc_g)
        acc_u = tl.dot(xa, wu, acc_u)
        x_ptrs += BLOCK_K
        wg_ptrs += BLOCK_K
        wu_ptrs += BLOCK_K
    act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u                      # SiLU(gate) * up
    a_ptrs = act_ptr + pos[:, None].to(tl.int64) * stride_am + rn[None, :]
    tl.store(a_ptrs, act.to(act_ptr.dtype.element_ty), mask=mmask[:, None])


def _down_src(act_ptr, w_ptr, y_ptr, order_ptr, tw_ptr, blk_e_ptr, blk_start_ptr, blk_cnt_ptr,
              stride_am, stride_we, stride_wn, stride_ym, K: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              EVEN_K: tl.constexpr):
    # act [T, K] by sorted position; w [G, H, K]; y [T, H] fp32 by (token, slot) index
    pid_n = tl.program_id(1)
    cnt = tl.load(blk_cnt_ptr + tl.program_id(0))
    if cnt == 0:
        return
    e, pos, mmask, flat = block_rows(cnt, blk_e_ptr, blk_start_ptr, order_ptr, BLOCK_M, False)
    flat = flat.to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = act_ptr + pos[:, None].to(tl.int64) * stride_am + rk[None, :]
    w_ptrs = w_ptr + e * stride_we + rn[None, :] * stride_wn + rk[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=mmask[:, None], other=0.0)
            w = tl.load(w_ptrs)
        else:
            km = (k0 + rk) < K
            a = tl.load(a_ptrs, mask=mmask[:, None] & km[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=km[:, None], other=0.0)
        acc = tl.dot(a, w, acc)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    wt = tl.load(tw_ptr + flat, mask=mmask, other=0.0)               # routing weight, fp32
    acc = acc * wt[:, None]
    y_ptrs = y_ptr + flat[:, None] * stride_ym + rn[None, :]
    tl.store(y_ptrs, acc, mask=mmask[:, None])


# ------------------------------------------------------------------ host side

@dataclass(frozen=True)
class BlockPlan:
    order: object      # [T] int64: flat (token*kk + slot) index at each sorted position
    expert: object     # [NB] int64: expert of each block (clamped; unused blocks have count 0)
    start: object      # [NB] int64: first sorted position of each block (unused: any)
    count: object      # [NB] int64: rows used in each block, 0..BLOCK_M


def max_blocks(T: int, G: int, block_m: int) -> int:
    """Upper bound on sum_e ceil(c_e / BLOCK_M) when sum_e c_e = T over G experts:
    ceil(c/m) <= floor(c/m) + 1 for c > 0, at most min(G, T) experts are non-empty."""
    return T // block_m + min(G, T)


def plan_blocks(flat_ids, G: int, block_m: int) -> BlockPlan:
    """Sort the (token, slot) pairs by expert and cut each expert's run into BLOCK_M rows.
    flat_ids [T] int64 in [0, G). Fixed output sizes; only device ops (graph-capturable)."""
    import torch

    T = flat_ids.numel()
    dev = flat_ids.device
    _, order = flat_ids.sort(stable=True)                                    # [T]
    counts = torch.zeros(G, dtype=torch.int64, device=dev).scatter_add_(
        0, flat_ids, torch.ones_like(flat_ids))                               # [G]
    nblk = (counts + block_m - 1) // block_m                                  # [G]
    blk_end = nblk.cumsum(0)                                                  # inclusive
    starts = counts.cumsum(0) - counts                                        # [G]
    j = torch.arange(max_blocks(T, G, block_m), device=dev)                   # [NB]
    e = torch.searchsorted(blk_end, j, right=True)                            # G: unused
    ec = e.clamp(max=G - 1)
    r = j - (blk_end[ec] - nblk[ec])                                          # block within e
    cnt = torch.where(e < G, (counts[ec] - r * block_m).clamp(0, block_m), 0)
    # int64 throughout: each dtype conversion would be one more tiny kernel per layer
    return BlockPlan(order, ec, starts[ec] + r * block_m, cnt)


def fit_block(block: int, n: int) -> int:
    """Largest power of two <= block that divides n and is >= 16 (tl.dot minimum)."""
    b = block
    while b > 16 and n % b:
        b //= 2
    if n % b:
        raise ValueError(f"dimension {n} is not a multiple of 16")
    return b


def _tiles(kc: KernelConfig, n: int, K: int, plan: BlockPlan):
    """BLOCK_N, BLOCK_K and the grid (plan blocks, n / BLOCK_N) of a launch over n outputs and
    K inputs."""
    bn, bk = fit_block(kc.block_n, n), min(kc.block_k, max(16, triton.next_power_of_2(K)))
    return bn, bk, (plan.count.numel(), n // bn)


def gate_up(x, w_gate_up, plan: BlockPlan, kc: KernelConfig, block_m: int, kk: int):
    import torch

    G, N2, K = w_gate_up.shape
    N = N2 // 2
    T = plan.order.numel()
    act = torch.empty(T, N, device=x.device, dtype=x.dtype)
    bn, bk, grid = _tiles(kc, N, K, plan)
    cuda = x.device.type == "cuda"
    compiled(_gate_up_src, not cuda)[grid](
        x, w_gate_up, act, plan.order, plan.expert, plan.start, plan.count,
        N, kk, x.stride(0), w_gate_up.stride(0), w_gate_up.stride(1), act.stride(0),
        K=K, BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, EVEN_K=K % bk == 0,
        **launch_options(kc, cuda))
    return act


def down(act, w_down, tw_flat, plan: BlockPlan, kc: KernelConfig, block_m: int):
    import torch

    G, H, K = w_down.shape
    T = plan.order.numel()
    y = torch.empty(T, H, device=act.device, dtype=torch.float32)
    bn, bk, grid = _tiles(kc, H, K, plan)
    cuda = act.device.type == "cuda"
    compiled(_down_src, not cuda)[grid](
        act, w_down, y, plan.order, tw_flat, plan.expert, plan.start, plan.count,
        act.stride(0), w_down.stride(0), w_down.stride(1), y.stride(0),
        K=K, BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, EVEN_K=K % bk == 0,
        **launch_options(kc, cuda))
    return y


def fused_moe(x, w_gate_up, w_down, ids, tw, cfg: MoeConfig | None = None):
    """y [b, H] = sum_j tw[:, j] * expert_{ids[:, j]}(x) with SiLU gating.
    x [b, H] bf16; w_gate_up [G, 2I, H]; w_down [G, H, I]; ids [b, kk] int (the shared
    expert(s) already appended as ordinary ids); tw [b, kk] routing weights."""
    import torch

    if why := available():
        raise RuntimeError(why)
    b, kk = ids.shape
    cfg = cfg or config_for(b)
    G = w_gate_up.shape[0]
    if not (x.is_contiguous() and w_gate_up.is_contiguous() and w_down.is_contiguous()):
        raise ValueError("fused_moe needs contiguous x and weights")
    out_dtype = x.dtype
    if x.device.type != "cuda" and x.dtype == torch.bfloat16:
        # Triton's CPU interpreter mishandles bf16 (numpy has none): interpret in fp32
        x, w_gate_up, w_down = x.float(), w_gate_up.float(), w_down.float()
    plan = plan_blocks(ids.reshape(-1).to(torch.int64), G, cfg.block_m)
    act = gate_up(x, w_gate_up, plan, cfg.gate_up, cfg.block_m, kk)
    y = down(act, w_down, tw.reshape(-1).to(torch.float32).contiguous(), plan, cfg.down,
             cfg.block_m)
    return y.view(b, kk, -1).sum(1).to(out_dtype)


def moe_experts(w, x, ids, tw, cfg: MoeConfig | None = None):
    """The routed + shared experts of a `layers.MoEWeights` (fast layout): the shared
    expert(s) join every token's id list with weight 1 (`layers.append_shared`)."""
    ids, tw = append_shared(w, ids, tw)
    return fused_moe(x, w.gate_up, w.down, ids, tw, cfg)
