"""What the Triton MoE expert kernels share (`moe_triton`, `moe_fp8`, `moe_int4`,
`moe_int4_gemv`): the device code that opens a program on one block of the plan
(`moe_triton.BlockPlan`) and closes it (SiLU(gate) * up for gate_up, the routing weight for
down), the bf16 shared expert's K loop, and the host side of a launch.

Device functions are `triton.jit` objects: a kernel looks them up by name when it is compiled
(under TRITON_INTERPRET=1 `triton.jit` gives the interpreter's) and Triton inlines them, so a
kernel compiles to the code it had when it wrote them out. Shapes: a program owns BLOCK_M
(token, slot) rows of one expert and NH * BLOCK_N weight rows (NH = 2: gate_up, gate and up
rows interleaved in one tile; NH = 1: down).
"""
from __future__ import annotations

import functools

try:  # importing triton touches no GPU; absent on some CPU machines
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - reported by moe_triton.available()
    triton = tl = None


# ------------------------------------------------------------------ device side

def _block_rows_src(cnt, blk_e_ptr, blk_start_ptr, order_ptr, BLOCK_M: tl.constexpr,
                    WIDE: tl.constexpr):
    # the program's block of the plan (block program_id(0), cnt > 0 rows): its expert e, the
    # rows' sorted positions pos [BM], which of them are used (mmask [BM]) and their
    # (token, slot) indices flat [BM] = token * kk + slot. WIDE: pos and flat in int64
    # whatever the plan's integer type; else in the plan's (moe_triton's kernels, which
    # widen where they index)
    pid_b = tl.program_id(0)
    e = tl.load(blk_e_ptr + pid_b).to(tl.int64)
    start = tl.load(blk_start_ptr + pid_b)
    if WIDE:
        start = start.to(tl.int64)
    rm = tl.arange(0, BLOCK_M)
    mmask = rm < cnt
    pos = start + rm                                                  # sorted positions
    flat = tl.load(order_ptr + pos, mask=mmask, other=0)             # (token, slot) index
    if WIDE:
        flat = flat.to(tl.int64)
    return e, pos, mmask, flat


def _input_rows_src(flat, pos, kk, NH: tl.constexpr):
    # the activation row each block row reads: gate_up (NH = 2) reads x by token, down
    # (NH = 1) act by sorted position
    if NH == 2:
        arow = flat // kk
    else:
        arow = pos
    return arow


def _tile_rows_src(pid_n, N, NH: tl.constexpr, BLOCK_N: tl.constexpr):
    # [NH*BN] int64 weight rows of output features pid_n*BN .. +BN: tile row r is feature
    # pid_n*BN + r//NH of half r%NH (gate, up)
    r = tl.arange(0, NH * BLOCK_N)
    return (pid_n * BLOCK_N + r // NH + (r % NH) * N).to(tl.int64)


def _bf16_expert_src(acc, a_ptr, w16_ptr, arow, mmask, rows, e16, stride_am, stride_he,
                     stride_hn, K: tl.constexpr, BK16: tl.constexpr):
    # acc [NH*BN, BM] += w16[e16][rows, :] @ a[arow, :]^T on the tensor cores, BK16 inputs a
    # step: a bf16 shared expert (w16 [n_shared, NH*N, K]) beside quantised routed ones
    rk16 = tl.arange(0, BK16)
    h_ptrs = a_ptr + arow[None, :] * stride_am + rk16[:, None]              # [BK16, BM]
    v_ptrs = w16_ptr + e16 * stride_he + rows[:, None] * stride_hn + rk16[None, :]
    for k0 in range(0, K, BK16):
        xh = tl.load(h_ptrs, mask=mmask[None, :], other=0.0)
        acc = tl.dot(tl.load(v_ptrs), xh, acc)
        h_ptrs += BK16
        v_ptrs += BK16
    return acc


def _silu_gate_up_src(acc, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    # acc [2*BN, BM] with gate and up rows interleaved -> SiLU(gate) * up [BN, BM]
    g, u = tl.split(tl.permute(tl.reshape(acc, (BLOCK_N, 2, BLOCK_M)), (0, 2, 1)))
    return g / (1.0 + tl.exp(-g)) * u


def _store_weighted_src(out_ptr, tw_ptr, flat, mask, acc, rn, stride_om):
    # down's output: y[flat, rn] = acc [BN, BM] times each pair's routing weight (fp32)
    wt = tl.load(tw_ptr + flat, mask=mask, other=0.0)                # routing weight
    tl.store(out_ptr + flat[None, :] * stride_om + rn[:, None], acc * wt[None, :],
             mask=mask[None, :])


if triton is not None:
    block_rows = triton.jit(_block_rows_src)
    input_rows = triton.jit(_input_rows_src)
    tile_rows = triton.jit(_tile_rows_src)
    bf16_expert = triton.jit(_bf16_expert_src)
    silu_gate_up = triton.jit(_silu_gate_up_src)
    store_weighted = triton.jit(_store_weighted_src)
else:  # pragma: no cover
    block_rows = input_rows = tile_rows = bf16_expert = silu_gate_up = store_weighted = None


# ------------------------------------------------------------------ host side

@functools.lru_cache(maxsize=None)
def compiled(src, interpret: bool):
    """Kernel source `src` (a plain function) as Triton runs it: `triton.jit` on the GPU,
    Triton's interpreter on the CPU."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction
        return InterpretedFunction(src)
    return triton.jit(src)


def launch_options(kc, cuda: bool) -> dict:
    """A config's warps and pipeline stages for a GPU launch; the interpreter takes none."""
    return dict(num_warps=kc.num_warps, num_stages=kc.num_stages) if cuda else {}


def launch_quantised(src, acts, wq, ws, w16, out, plan, tw_flat, N: int, kk: int, n_q: int,
                     kc, block_n: int, **constexprs):
    """One launch of a quantised expert kernel (`moe_fp8`, `moe_int4`: the same arguments,
    `acts` = (a,) or (a, a16) first) over grid (plan blocks, N / block_n): quantised weights
    wq / ws for experts < n_q, the bf16 shared-expert weights w16 for the others or None
    (HAS16 False; `a` stands in for the pointer, never read). Returns out."""
    a = acts[0]
    cuda = a.device.type == "cuda"
    has16 = w16 is not None
    w16 = w16 if has16 else a
    compiled(src, not cuda)[(plan.count.numel(), N // block_n)](
        *acts, wq, ws, w16, out, plan.order, tw_flat, plan.expert, plan.start, plan.count,
        N, kk, n_q, a.stride(0), wq.stride(0), wq.stride(1), ws.stride(0), ws.stride(1),
        w16.stride(0), w16.stride(1), out.stride(0),
        HAS16=has16, BLOCK_N=block_n, **constexprs, **launch_options(kc, cuda))
    return out


def as_float32(*tensors):
    """The tensors in float32 (None stays None): Triton's CPU interpreter has neither bf16
    nor fp8, so the kernels are interpreted on float32 values."""
    return tuple(t.float() if t is not None else None for t in tensors)
