"""Router and block plan of the fused MoE decode kernels in two Triton launches instead of ~30
small torch ops.

Why: under CUDA-graph replay each dependent kernel still costs a few microseconds; the torch
router (`layers.moe_route`) plus `moe_triton.plan_blocks` is about 30 of them, ~95 us per K2
layer at b = 1 on an H200 (docs/BENCHMARKS.md section 2) - more than the INT4 layer's whole
HBM floor (61 us). Here:
1. `x @ router.T` stays one cuBLAS GEMV (5.5 MB of router weights for K2: it needs many SMs).
2. `_route` (one program per BLOCK_T tokens): sigmoid scores, top-k of score + correction bias
   by k rounds of argmax, weights renormalised and scaled (DeepSeek noaux_tc without groups, as
   `layers.moe_route`), expert ids folded modulo the allocated experts, then the shared
   expert(s) appended with weight 1 (`moe_common.append_shared`). Writes ids int32 [b, kk]
   and weights fp32 [b, kk].
3. `_plan` (one program): the same `moe_triton.BlockPlan` as `plan_blocks` - the (token, slot)
   pairs sorted by expert (stable), each expert's run cut into BLOCK_M rows - from one sort of
   packed keys (expert << bits | pair index) and one histogram. Slots past the used blocks get
   count 0, as in `plan_blocks`.
Graph-capturable (fixed sizes, no host sync). On the CPU it runs in Triton's interpreter.
"""
from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - reported by moe_triton.available()
    triton = tl = None

from microbench.kernels.moe_int4_gemv import store_gemv  # noqa: F401 - used by _route_src
from microbench.kernels.moe_triton import BlockPlan, max_blocks
from microbench.kernels.triton_expert import compiled

BLOCK_T = 4     # tokens per routing program
COPY_CHUNK = 1024  # inputs per pair-order copy program


def _route_src(logit_ptr, bias_ptr, ids_ptr, tw_ptr, x_ptr, xp_ptr, xc_ptr, B, E, n_alloc,
               scale, stride_l, H, stride_x,
               TOPK: tl.constexpr, NSHARED: tl.constexpr, KKP: tl.constexpr, EP: tl.constexpr,
               BLOCK_T: tl.constexpr, FOLD: tl.constexpr, CHUNK: tl.constexpr,
               GEMV: tl.constexpr):
    # logits [B, E] (x @ router.T); ids / tw [B, TOPK + NSHARED]
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)             # [BT]
    tm = t < B
    if GEMV:
        if tl.program_id(1) > 0:
            # x [B, H] -> xp fp32 + xc in moe_int4_gemv's layout
            k0 = (tl.program_id(1) - 1) * CHUNK
            k = k0 + tl.arange(0, CHUNK)
            v = tl.load(x_ptr + t[:, None].to(tl.int64) * stride_x + k[None, :],
                        mask=tm[:, None] & (k < H)[None, :], other=0.0).to(tl.float32)
            store_gemv(xp_ptr, xc_ptr, H, H // 16, t.to(tl.int64), tm, k0, v, H, CHUNK)
            return
    elif tl.program_id(1) > 0:
        # copy x [B, H] into xp in pair order (moe_int4): xp[k] = x[8(k//8) + (k%8)//2 + 4(k%2)]
        k = (tl.program_id(1) - 1) * CHUNK + tl.arange(0, CHUNK)
        km = k < H
        src = 8 * (k // 8) + (k % 8) // 2 + 4 * (k % 2)
        v = tl.load(x_ptr + t[:, None].to(tl.int64) * stride_x + src[None, :],
                    mask=tm[:, None] & km[None, :], other=0.0)
        tl.store(xp_ptr + t[:, None].to(tl.int64) * H + k[None, :], v,
                 mask=tm[:, None] & km[None, :])
        return
    c = tl.arange(0, EP)                                               # [EP]
    cm = c < E
    lg = tl.load(logit_ptr + t[:, None].to(tl.int64) * stride_l + c[None, :],
                 mask=tm[:, None] & cm[None, :], other=0.0).to(tl.float32)
    sig = 1.0 / (1.0 + tl.exp(-lg))                                    # sigmoid scores
    sel = tl.where(cm[None, :], sig + tl.load(bias_ptr + c, mask=cm, other=0.0)[None, :],
                   float("-inf"))
    kc = tl.arange(0, KKP)                                             # [KKP] output slots
    ids = tl.zeros((BLOCK_T, KKP), dtype=tl.int32)
    wts = tl.zeros((BLOCK_T, KKP), dtype=tl.float32)
    for k in tl.static_range(TOPK):                                    # k rounds of argmax
        best = tl.argmax(sel, axis=1)                                  # [BT]
        hit = c[None, :] == best[:, None]
        wk = tl.sum(tl.where(hit, sig, 0.0), axis=1)                   # unbiased score
        sel = tl.where(hit, float("-inf"), sel)
        ids = tl.where(kc[None, :] == k, best[:, None].to(tl.int32), ids)
        wts = tl.where(kc[None, :] == k, wk[:, None], wts)
    wts = wts / tl.sum(wts, axis=1)[:, None] * scale
    if FOLD:
        ids = ids % n_alloc
    shared = (kc >= TOPK)[None, :]
    ids = tl.where(shared, n_alloc + kc[None, :] - TOPK, ids)
    wts = tl.where(shared, 1.0, wts)
    out = t[:, None].to(tl.int64) * (TOPK + NSHARED) + kc[None, :]
    om = tm[:, None] & (kc < TOPK + NSHARED)[None, :]
    tl.store(ids_ptr + out, ids, mask=om)
    tl.store(tw_ptr + out, wts, mask=om)


def _plan_src(ids_ptr, order_ptr, blk_e_ptr, blk_start_ptr, blk_cnt_ptr, T, G, NB,
              TP: tl.constexpr, GP: tl.constexpr, NBP: tl.constexpr,
              BLOCK_M: tl.constexpr, FBITS: tl.constexpr, RMAX: tl.constexpr):
    # RMAX 0: loop over blocks up to the longest expert run (compiled); > 0: a fixed bound
    # (Triton's interpreter cannot take a loop bound computed in the kernel)
    # ids [T] int32 in [0, G): expert of each (token, slot) pair, flat index = token*kk + slot
    r = tl.arange(0, TP)
    valid = r < T
    e = tl.load(ids_ptr + r, mask=valid, other=0)
    # sort by (expert, pair index): the same order as a stable sort by expert
    key = tl.sort(tl.where(valid, (e << FBITS) | r, 0x7FFFFFFF))
    tl.store(order_ptr + r, key & ((1 << FBITS) - 1), mask=valid)
    g = tl.arange(0, GP)
    counts = tl.histogram(tl.where(valid, e, GP - 1), GP)              # bin GP-1 >= G: padding
    counts = tl.where(g < G, counts, 0)
    nblk = (counts + BLOCK_M - 1) // BLOCK_M
    first = tl.cumsum(nblk, 0) - nblk                                  # first block of e
    starts = tl.cumsum(counts, 0) - counts                             # first sorted position
    used = tl.sum(nblk, 0)
    j = tl.arange(0, NBP)
    free = (j >= used) & (j < NB)
    tl.store(blk_cnt_ptr + j, tl.zeros((NBP,), dtype=tl.int32), mask=free)
    tl.store(blk_e_ptr + j, tl.zeros((NBP,), dtype=tl.int32) + (G - 1), mask=free)
    tl.store(blk_start_ptr + j, tl.zeros((NBP,), dtype=tl.int32), mask=free)
    if RMAX == 0:
        for rr in range(0, tl.max(nblk, 0)):                           # block rr of each expert
            m = rr < nblk
            tl.store(blk_e_ptr + first + rr, g, mask=m)
            tl.store(blk_start_ptr + first + rr, starts + rr * BLOCK_M, mask=m)
            tl.store(blk_cnt_ptr + first + rr, tl.minimum(counts - rr * BLOCK_M, BLOCK_M),
                     mask=m)
    else:
        for rr in tl.static_range(RMAX):
            m = rr < nblk
            tl.store(blk_e_ptr + first + rr, g, mask=m)
            tl.store(blk_start_ptr + first + rr, starts + rr * BLOCK_M, mask=m)
            tl.store(blk_cnt_ptr + first + rr, tl.minimum(counts - rr * BLOCK_M, BLOCK_M),
                     mask=m)


def _p2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def route(w, x, pair_order: bool = False, gemv_layout: bool = False):
    """`layers.moe_route` + `moe_common.append_shared` in one cuBLAS GEMV and one Triton
    kernel. w: a `moe_common.MoEWeights` (router, bias, n_alloc, top_k, n_shared, scale);
    x [b, H]. Returns ids int32 [b, kk] and weights fp32 [b, kk], kk = top_k + n_shared, and
    with `pair_order` a copy of x with each 8 inputs in the order 0,4,1,5,2,6,3,7 (what the
    INT4 MMA kernel reads), with `gemv_layout` x in `moe_int4_gemv`'s layout as two
    tensors xg fp32 [b, H], c16 fp32 [b, H/16] (ids, tw, xg, c16); either made by extra
    programs of the same launch."""
    import torch

    b = x.shape[0]
    E = w.router.shape[0]
    kk = w.top_k + w.n_shared
    logits = x @ w.router.t()                                          # [b, E]
    cuda = x.device.type == "cuda"
    if not cuda:
        logits = logits.float()                  # the interpreter has no bf16
    ids = torch.empty(b, kk, device=x.device, dtype=torch.int32)
    tw = torch.empty(b, kk, device=x.device, dtype=torch.float32)
    extra = dict(num_warps=4) if cuda else {}
    H = x.shape[1]
    x = x if cuda else x.float()
    gemv = gemv_layout
    xc = x
    if gemv:
        if H % 32 or x.stride(1) != 1:
            raise ValueError("the gemv layout needs a contiguous x with a multiple of 32 inputs")
        xp = torch.empty(b, H, device=x.device, dtype=torch.float32)
        xc = torch.empty(b, H // 16, device=x.device, dtype=torch.float32)
    else:
        xp = torch.empty_like(x) if pair_order else x
    if pair_order and (H % 8 or x.stride(1) != 1):
        raise ValueError("pair order needs a contiguous x with a multiple of 8 inputs")
    copies = triton.cdiv(H, COPY_CHUNK) if pair_order or gemv else 0
    grid = (triton.cdiv(b, BLOCK_T), 1 + copies)
    compiled(_route_src, not cuda)[grid](
        logits, w.bias.float(), ids, tw, x, xp, xc, b, E, w.n_alloc, float(w.scale),
        logits.stride(0), H, x.stride(0),
        TOPK=w.top_k, NSHARED=w.n_shared, KKP=_p2(kk), EP=_p2(E), BLOCK_T=BLOCK_T,
        FOLD=w.n_alloc < E, CHUNK=COPY_CHUNK, GEMV=gemv, **extra)
    if gemv:
        return ids, tw, xp, xc
    return (ids, tw, xp) if pair_order else (ids, tw)


def _bucket(n: int) -> int:
    """Sort width for n keys: 32, 128, 512, 2048, then powers of two (one compiled variant
    per bucket instead of one per batch size)."""
    for w in (32, 128, 512, 2048):
        if n <= w:
            return w
    return _p2(n)


def plan(flat_ids, G: int, block_m: int, max_per_expert: int | None = None) -> BlockPlan:
    """The `moe_triton.plan_blocks` plan (int32 tensors) from one Triton program.
    flat_ids [T] int in [0, G). (`max_per_expert` is accepted for callers that know it; the
    program finds the longest run itself.)"""
    import torch

    T = flat_ids.numel()
    dev = flat_ids.device
    if T >= 1 << 16:
        raise ValueError(f"{T} (token, slot) pairs: the fused plan is for decode sizes")
    NB = max_blocks(T, G, block_m)
    order = torch.empty(T, device=dev, dtype=torch.int32)
    e, s, c = (torch.empty(NB, device=dev, dtype=torch.int32) for _ in range(3))
    TP = _bucket(T)
    cuda = dev.type == "cuda"
    extra = dict(num_warps=4) if cuda else {}
    compiled(_plan_src, not cuda)[(1,)](
        flat_ids.to(torch.int32), order, e, s, c, T, G, NB, TP=TP, GP=_p2(G + 1),
        NBP=_p2(max_blocks(TP, G, block_m)), BLOCK_M=block_m, FBITS=TP.bit_length() - 1,
        RMAX=0 if cuda else triton.cdiv(T, block_m), **extra)
    return BlockPlan(order, e, s, c)


FUSED_PLAN_MAX = 4096   # (token, slot) pairs: above this (prefill) the torch plan is used


def plan_for(ids, G: int, block_m: int, max_per_expert: int | None = None) -> BlockPlan:
    """`plan` for decode sizes, `moe_triton.plan_blocks` (torch ops) above FUSED_PLAN_MAX
    pairs, where one program would have to sort too many keys. ids [b, kk]."""
    from microbench.kernels.moe_triton import plan_blocks

    if ids.numel() > FUSED_PLAN_MAX:
        return plan_blocks(ids.reshape(-1).long(), G, block_m)
    return plan(ids.reshape(-1), G, block_m, max_per_expert)


def route_and_plan(w, x, block_m: int):
    """`route` then `plan_for` with its blocks of `block_m` pairs: (ids, tw, plan). Experts
    not folded (all allocated): at most b pairs per expert, which the fused plan uses."""
    ids, tw = route(w, x)
    folded = w.n_alloc < w.router.shape[0]
    plan = plan_for(ids, w.n_alloc + w.n_shared, block_m, None if folded else x.shape[0])
    return ids, tw, plan
