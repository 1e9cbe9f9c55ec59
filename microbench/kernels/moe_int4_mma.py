"""INT4 W4A16 MoE decode layer with the weights dequantised straight into tensor-core operand
registers (CUDA C++ compiled at run time by cupy/NVRTC; `moe_int4` is the Triton kernel).

Why: the Triton kernel (`moe_int4`) dequantises a [rows, inputs] tile and `tl.dot` moves it
through shared memory into the MMA; on an H200 that path, not HBM, bounds it (Nsight
Compute: L1/TEX 88% of peak, DRAM 30%; docs/BENCHMARKS.md section 8). Here each lane of a
warp loads, per 16x16 block of weights, exactly the 8 nibbles its `mma.sync.m16n8k16` A
fragment holds (one int32 word), turns them into four bf16 pairs with bit tricks and issues
the MMA: no shared memory, no layout change; weights stream in 16-byte loads that bypass L1
(which keeps the activations).

Layout (`repack`, once per weight set, as serving engines repack checkpoints for their
kernels at load time): per expert, rows in tiles of 16 (gate_up: 8 gate rows then the
matching 8 up rows, so SiLU(gate) * up is formed in registers; down: 16 consecutive rows),
inputs in chunks of 64. The MMA's reduction order is free, so a chunk's inputs are permuted
for the loads: lane (g = lane / 4, c = lane % 4) owns inputs 16c .. 16c+15 of the chunk, and
fragment f's MMA k positions 2c, 2c+1, 2c+8, 2c+9 are inputs 16c + 4f + 0..3. So the lane's
activations for a chunk are one 32-byte run (two 16-byte loads, the same for gate and up),
and its A-fragment nibbles for fragment f are one int32 word [tile, chunk, lane, f]:
  nibble j = kl*4 + kh*2 + rh  <-  row rh*8 + g, input 16c + 4f + 2kh + kl   (value + 8)
so (word >> 4i) & 0x000F000F, i = 0..3, are the registers a0a1, a2a3, a4a5, a6a7 (rows g /
g+8, k low / high). A lane's 16 inputs sit in one 32-group (group c / 2): scales [tile,
chunk, g, group, row half] bf16, one 4-byte load per chunk.

Dequantisation per register: (pair | 0x43004300) is 128 + nibble in bf16, minus 136 is q
exactly, times the row's group scale is the weight rounded once (= `int4_pack.dequantize`).
The activations (B operand: the block's up to 8 tokens) are read from global memory
(L1-resident: the same rows for every weight tile); fp32 accumulation. The shared expert,
when bf16, runs in the same kernel, its A fragments loaded as 16-byte runs of the row-major
bf16 matrix under the same input permutation.

CTA = 4 warps: `MmaConfig.ksplit` warps per 16-row tile of one block of up to 8 (token,
slot) pairs of one expert (`moe_route.plan`, `BLOCK_M`), splitting its inputs (partial sums
reduced through shared memory); `MmaConfig.minb` caps the registers (`__launch_bounds__`).
gate_up writes act [pairs, I] bf16 by sorted position; down writes y [pairs, H] fp32 times
the routing weight by (token, slot); `slot_sum` adds the slots into out [b, H] bf16.
Measured (1x H200, docs/BENCHMARKS.md section 8): 54% of the INT4 floor at b = 1, 66-69% at
b >= 8 (the Triton kernel: 34-38%).
Check: `moe_int4.reference` (float32 on the dequantised weights). Needs cupy and an sm_80+
GPU; `available()` says why not.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from microbench.kernels import cupy_launch as CL
from microbench.kernels import int4_pack as P

CHUNK = 64          # inputs per chunk: four 16-input MMA fragments
WARPS = 4           # warps per CTA
# (token, slot) pairs per block of the plan: one 8-token MMA per fragment. An expert with more
# pairs has several blocks; their CTAs for one tile are launched next to each other and share
# its weights through L2. (A build with blocks of 16, two MMAs per fragment, needed more
# registers and was slower on an H200 at b = 32 and 128, docs/BENCHMARKS.md section 8.)
BLOCK_M = 8
KERNEL = "moe_int4_mma (CUDA mma.sync m16n8k16, INT4 W4A16 group 32, dequantised in registers)"
# A decode kernel: each block of 8 pairs re-reads its expert's weights (from L2 when the blocks
# of one expert run together), so at prefill sizes (hundreds of pairs per expert) it is far
# from its floor. `moe_int4.moe_forward` picks it up to the largest micro-batch it was measured
# at on an H200 (docs/BENCHMARKS.md section 8), the Triton kernel above.
MAX_BATCH = 128

_SRC = CL.HELPERS + r"""
#ifndef KSPLIT
#define KSPLIT 1      // warps sharing one tile (splitting its inputs)
#endif
#ifndef UNROLL
#define UNROLL 1      // chunks loaded together (MmaConfig.unroll)
#endif
#ifndef MINB
#define MINB 1        // CTAs per SM the register allocation must allow
#endif
#define TPC (4 / KSPLIT)

__device__ __forceinline__ void deq4(u32 w, u32 sg, u32 sh, u32 &r0, u32 &r1, u32 &r2, u32 &r3) {
  // fma with -0 instead of mul.bf16x2 (sm_90 only): the same single rounding, sm_80+
  asm("{\n.reg .b32 s, m, c, one, neg, nz;\n"
      "mov.b32 m, 0x000F000F;\nmov.b32 c, 0x43004300;\n"
      "mov.b32 one, 0x3F803F80;\nmov.b32 neg, 0xC308C308;\nmov.b32 nz, 0x80008000;\n"
      "lop3.b32 %0, %4, m, c, 0xEA;\n"
      "shr.b32 s, %4, 4;\nlop3.b32 %1, s, m, c, 0xEA;\n"
      "shr.b32 s, %4, 8;\nlop3.b32 %2, s, m, c, 0xEA;\n"
      "shr.b32 s, %4, 12;\nlop3.b32 %3, s, m, c, 0xEA;\n"
      "fma.rn.bf16x2 %0, %0, one, neg;\nfma.rn.bf16x2 %1, %1, one, neg;\n"
      "fma.rn.bf16x2 %2, %2, one, neg;\nfma.rn.bf16x2 %3, %3, one, neg;\n"
      "fma.rn.bf16x2 %0, %0, %5, nz;\nfma.rn.bf16x2 %1, %1, %6, nz;\n"
      "fma.rn.bf16x2 %2, %2, %5, nz;\nfma.rn.bf16x2 %3, %3, %6, nz;\n}\n"
      : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(w), "r"(sg), "r"(sh));
}

// four MMAs (one per fragment) of a chunk given its A registers a[f][0..3] and the lane's 16
// activations (two uint4: fragments 0-1, 2-3)
__device__ __forceinline__ void mma4(float *acc, const u32 (&a)[4][4], const uint4 &xa,
                                     const uint4 &xb) {
  mma(acc, a[0][0], a[0][1], a[0][2], a[0][3], xa.x, xa.y);
  mma(acc, a[1][0], a[1][1], a[1][2], a[1][3], xa.z, xa.w);
  mma(acc, a[2][0], a[2][1], a[2][2], a[2][3], xb.x, xb.y);
  mma(acc, a[3][0], a[3][1], a[3][2], a[3][3], xb.z, xb.w);
}

// NH = 2 (gate_up): x [b, K] rows by token; out act [T, N] bf16 by sorted position.
// NH = 1 (down): x = act [T, K] rows by sorted position; out y [T, N] fp32 by pair, x weight.
// CTA = 4 warps = TPC 16-row tiles of one block, KSPLIT warps per tile splitting its
// inputs in contiguous parts; partial sums reduced through shared memory.
extern "C" __global__ void __launch_bounds__(128, MINB)
moe_w4a16_mma(const uint4 *__restrict__ wr, const u32 *__restrict__ sr,
              const u16 *__restrict__ w16, const u16 *__restrict__ x,
              void *out, const int *__restrict__ order, const float *__restrict__ tw,
              const int *__restrict__ blk_e, const int *__restrict__ blk_start,
              const int *__restrict__ blk_cnt, int N, int K, int kk, int n_q, int nh,
              int stride_x, int stride_o, long long wr_se, long long sr_se,
              long long w16_se, int w16_sn) {
#if KSPLIT > 1
  __shared__ float red[4][4][32];
#endif
  const int pb = blockIdx.x;
  const int cnt = blk_cnt[pb];
  if (cnt == 0) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = blockIdx.y * TPC + warp / KSPLIT;              // 16-row tile
  const int ks = warp % KSPLIT;
  const bool active = t < nh * N / 16;
  const int e = blk_e[pb], start = blk_start[pb];
  const int g = lane >> 2, c = lane & 3;
  const int nch = K / 64;
  const int c0 = active ? ks * nch / KSPLIT : 0, c1 = active ? (ks + 1) * nch / KSPLIT : 0;
  const u16 *x0 = 0;                      // B: token g of the block, inputs 16c.. of a chunk
  if (g < cnt) {
    const int f = order[start + g];
    x0 = x + (long long)(nh == 2 ? f / kk : start + g) * stride_x + 16 * c;
  }
  float acc0[4] = {0.f, 0.f, 0.f, 0.f};
  if (e < n_q) {
    const uint4 *wp = wr + e * wr_se + (long long)t * nch * 32 + lane;
    const u32 *sp = sr + e * sr_se + (long long)t * nch * 16 + 2 * g + (c >> 1);
    uint4 wv[UNROLL], xa[UNROLL], xb[UNROLL];
    u32 sv[UNROLL];
    for (int ch = c0; ch < c1; ch += UNROLL) {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (ch + u < c1) {
          wv[u] = ld_stream(wp + (ch + u) * 32);
          sv[u] = ld_stream32(sp + (ch + u) * 16);
          xa[u] = ldx(x0 ? x0 + (ch + u) * 64 : 0);
          xb[u] = ldx(x0 ? x0 + (ch + u) * 64 + 8 : 0);
        }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (ch + u < c1) {
          const u32 sg = __byte_perm(sv[u], 0, 0x1010), sh = __byte_perm(sv[u], 0, 0x3232);
          const u32 ws[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
          const u32 bx[8] = {xa[u].x, xa[u].y, xa[u].z, xa[u].w,
                             xb[u].x, xb[u].y, xb[u].z, xb[u].w};
#pragma unroll
          for (int f = 0; f < 4; ++f) {   // one fragment at a time: 4 live A registers
            u32 a0, a1, a2, a3;
            deq4(ws[f], sg, sh, a0, a1, a2, a3);
            mma(acc0, a0, a1, a2, a3, bx[2 * f], bx[2 * f + 1]);
          }
        }
    }
  } else {
    // bf16 shared expert: a lane's fragments are 16 consecutive inputs of rows g and g + 8
    const int ra = nh == 2 ? t * 8 + g : t * 16 + g;
    const int rb = nh == 2 ? N + t * 8 + g : t * 16 + 8 + g;
    const u16 *pa = w16 + (e - n_q) * w16_se + (long long)ra * w16_sn + 16 * c;
    const u16 *pq = w16 + (e - n_q) * w16_se + (long long)rb * w16_sn + 16 * c;
    for (int ch = c0; ch < c1; ch += UNROLL) {
      uint4 va[UNROLL][2], vb[UNROLL][2], xa[UNROLL], xb[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (ch + u < c1) {
          const int k = (ch + u) * 64;
          va[u][0] = ld_stream(pa + k); va[u][1] = ld_stream(pa + k + 8);
          vb[u][0] = ld_stream(pq + k); vb[u][1] = ld_stream(pq + k + 8);
          xa[u] = ldx(x0 ? x0 + k : 0);
          xb[u] = ldx(x0 ? x0 + k + 8 : 0);
        }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (ch + u < c1) {
          const u32 a[4][4] = {{va[u][0].x, vb[u][0].x, va[u][0].y, vb[u][0].y},
                               {va[u][0].z, vb[u][0].z, va[u][0].w, vb[u][0].w},
                               {va[u][1].x, vb[u][1].x, va[u][1].y, vb[u][1].y},
                               {va[u][1].z, vb[u][1].z, va[u][1].w, vb[u][1].w}};
          mma4(acc0, a, xa[u], xb[u]);
        }
    }
  }
#if KSPLIT > 1
#pragma unroll
  for (int i = 0; i < 4; ++i) red[warp][i][lane] = acc0[i];
  __syncthreads();
  if (ks) return;
#pragma unroll
  for (int j = 1; j < KSPLIT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc0[i] += red[warp + j][i][lane];
#endif
  if (!active) return;
  // epilogue: acc0[0..1] rows g (tokens 2c, 2c+1), acc0[2..3] rows g + 8
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int n = 2 * c + i;
    if (n >= cnt) continue;
    if (nh == 2) {
      const float gt = acc0[i], up = acc0[2 + i];
      const float v = gt / (1.f + __expf(-gt)) * up;
      reinterpret_cast<u16 *>(out)[(long long)(start + n) * stride_o + t * 8 + g] = to_bf16(v);
    } else {
      const int f = order[start + n];
      const float wt = tw[f];
      float *y = reinterpret_cast<float *>(out) + (long long)f * stride_o + t * 16 + g;
      y[0] = acc0[i] * wt;
      y[8] = acc0[2 + i] * wt;
    }
  }
}

// out [b, H] bf16 = sum over the kk slots of y [b * kk, H] fp32 (in slot order)
extern "C" __global__ void slot_sum(const float *__restrict__ y, u16 *__restrict__ out, int kk,
                                   int H, int stride_o) {
  const int b = blockIdx.y, n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= H) return;
  const float *p = y + (long long)b * kk * H + n;
  float s = 0.f;
  for (int k = 0; k < kk; ++k) s += p[(long long)k * H];
  out[(long long)b * stride_o + n] = to_bf16(s);
}
"""


@functools.lru_cache(maxsize=1)
def available() -> str | None:
    """None when the kernel can run here, else why not (one line): cupy, a CUDA GPU of
    compute capability 8.0+, and NVRTC compiling the source."""
    return CL.unavailable(lambda: _kernel(CONFIG))


@dataclass(frozen=True)
class MmaConfig:
    """Compile-time shape of one launch (each distinct config is its own NVRTC build)."""
    ksplit: int = 1     # warps per 16-row tile (1, 2, 4), splitting its inputs
    unroll: int = 1     # 64-input chunks loaded together
    minb: int = 1       # CTAs per SM the registers must allow (__launch_bounds__)


CONFIG = MmaConfig()


@dataclass(frozen=True)
class MmaLayerConfig:
    """One layer's launches: the gate_up and down configs."""
    gate_up: MmaConfig = CONFIG
    down: MmaConfig = CONFIG


# Upper micro-batch bound -> layer config, from the variant sweep on one H200 at Kimi K2 dims
# (`python -m microbench.stage_cost.tune_moe_quant`, `mma_sweep`; docs/BENCHMARKS.md section 8): a
# register cap of 40 (12 CTAs of 128 threads per SM, a few spilled bytes) beat the uncapped
# 90-124 registers at every b; at b <= 8 four warps per gate_up tile won.
CONFIGS = ((8, MmaLayerConfig(MmaConfig(4, 1, 12), MmaConfig(1, 1, 12))),
           (1 << 30, MmaLayerConfig(MmaConfig(1, 1, 12), MmaConfig(1, 1, 12))))


def config_for(batch: int) -> MmaLayerConfig:
    return next(c for bound, c in CONFIGS if batch <= bound)


@functools.lru_cache(maxsize=16)
def _kernel(cfg: MmaConfig = CONFIG):
    if cfg.ksplit not in (1, 2, 4) or cfg.unroll < 1:
        raise ValueError(f"bad kernel config {cfg}")
    return CL.build(_SRC, "moe_w4a16_mma", KSPLIT=cfg.ksplit, UNROLL=cfg.unroll, MINB=cfg.minb)


@functools.lru_cache(maxsize=1)
def _slot_sum():
    return CL.build(_SRC, "slot_sum")


# ------------------------------------------------------------------ layout

def tile_rows(n_rows: int, nh: int):
    """Source row of each (tile, local row): int64 [n_rows // 16, 16]. gate_up (nh = 2,
    n_rows = 2I): local rows 0..7 are gate rows 8t.., 8..15 the up rows I + 8t..; down:
    16t + r."""
    import torch

    T = n_rows // 16
    t = torch.arange(T)[:, None]
    r = torch.arange(16)[None, :]
    if nh == 2:
        half = n_rows // 2
        return torch.where(r < 8, 8 * t + r, half + 8 * t + r - 8)
    return 16 * t + r


def repack(wq, ws, nh: int):
    """compressed-tensors packing (`int4_pack`: wq int32 [E, N, K/8], ws bf16 [E, N, K/32]) ->
    (wr int32 [E, N/16, K/64, 32, 4], sr bf16 [E, N/16, K/64, 8, 2, 2]) in the fragment order
    of the module docstring. Expert by expert (bounded temporary memory)."""
    import torch

    E, N, KW = wq.shape
    K = KW * P.PACK
    if N % 16 or K % CHUNK or (nh == 2 and N % 32):
        raise ValueError(f"rows {N} / inputs {K} do not tile into 16 x {CHUNK}")
    T, nch = N // 16, K // CHUNK
    src = tile_rows(N, nh).to(wq.device).reshape(-1)
    wr = torch.empty(E, T, nch, 32, 4, dtype=torch.int32, device=wq.device)
    sr = torch.empty(E, T, nch, 8, 2, 2, dtype=ws.dtype, device=wq.device)
    shifts = torch.arange(0, 32, 4, device=wq.device, dtype=torch.int64)
    for e in range(E):
        w = wq[e, src].to(torch.int64) & 0xFFFFFFFF                      # [N, K/8]
        nib = (w[..., None] >> shifts) & 0xF                             # [N, K/8, 8]
        # rows (rh, g), inputs (ch, c, f, kh, kl)
        nib = nib.reshape(T, 2, 8, nch, 4, 4, 2, 2)
        nib = nib.permute(0, 3, 2, 4, 5, 7, 6, 1)                        # T ch g c f kl kh rh
        words = (nib.reshape(T, nch, 32, 4, 8) << shifts).sum(-1)
        wr[e] = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
        s = ws[e, src].reshape(T, 2, 8, nch, 2)                          # T rh g ch grp
        sr[e] = s.permute(0, 3, 2, 4, 1)
    return wr, sr


def fragment_weights(wr, sr, K: int):
    """Inverse view for checks: the dequantised [E, T*16 local rows, K] matrix the kernel's
    lanes see (float32), from the repacked words and scales alone."""
    import torch

    E, T, nch = wr.shape[:3]
    shifts = torch.arange(0, 32, 4, device=wr.device, dtype=torch.int64)
    nib = ((wr.to(torch.int64) & 0xFFFFFFFF)[..., None] >> shifts) & 0xF   # E T ch 32 4 8
    q = (nib - 8).float().reshape(E, T, nch, 8, 4, 4, 2, 2, 2)           # g c f kl kh rh
    q = q.permute(0, 1, 8, 3, 2, 4, 5, 7, 6).reshape(E, T, 16, K)         # T rh g ch c f kh kl
    s = sr.float().reshape(E, T, nch, 8, 2, 2).permute(0, 1, 5, 3, 2, 4)  # T rh g ch grp
    s = s.reshape(E, T, 16, nch * 2).repeat_interleave(P.GROUP, -1)
    return q * s


@dataclass
class Repacked:
    gate_up_r: object
    gate_up_rs: object
    down_r: object
    down_rs: object


_PACKED: dict = {}


def repacked(qw) -> Repacked:
    """The kernel layout of a `QuantMoEWeights` (int4), made once per weight set (and kept
    only while that set lives: `common.cached_for`)."""
    from microbench.kernels.common import cached_for

    def make():
        gr, gs = repack(qw.gate_up_q, qw.gate_up_s, 2)
        dr, ds = repack(qw.down_q, qw.down_s, 1)
        return Repacked(gr, gs, dr, ds)
    return cached_for(_PACKED, (qw.gate_up_q, qw.gate_up_s, qw.down_q, qw.down_s), make)


# ------------------------------------------------------------------ host side

def _launch(x, rp_w, rp_s, w16, out, plan, tw_flat, N, K, kk, nh, n_q, cfg: MmaConfig):
    import numpy as np
    import torch

    if x.dtype != torch.bfloat16 or x.stride(1) != 1:
        raise ValueError("activations must be contiguous bf16 rows")
    tpc = WARPS // cfg.ksplit
    grid = (plan.count.numel(), -(-(nh * N // 16) // tpc))
    if x.data_ptr() % 16 or x.stride(0) % 8:      # 16-byte activation loads
        x = x.clone(memory_format=torch.contiguous_format)
    if w16 is not None and (w16.data_ptr() % 16 or w16.stride(1) % 8 or w16.stride(2) != 1):
        raise ValueError("bf16 shared expert rows must be contiguous and 16-byte aligned")
    has16 = w16 is not None
    w16t = w16 if has16 else x
    p = np.uint64
    args = (p(rp_w.data_ptr()), p(rp_s.data_ptr()), p(w16t.data_ptr()), p(x.data_ptr()),
            p(out.data_ptr()), p(plan.order.data_ptr()), p(tw_flat.data_ptr()),
            p(plan.expert.data_ptr()), p(plan.start.data_ptr()), p(plan.count.data_ptr()),
            np.int32(N), np.int32(K), np.int32(kk), np.int32(n_q), np.int32(nh),
            np.int32(x.stride(0)), np.int32(out.stride(0)),
            np.int64(rp_w[0].numel() // 4), np.int64(rp_s[0].numel() // 2),
            np.int64(w16t.stride(0) if has16 else 0), np.int32(w16t.stride(1) if has16 else 0))
    CL.run(_kernel(cfg), grid, 32 * WARPS, args)
    return out


def fused_moe(x, qw, ids, tw, plan, cfg: MmaLayerConfig | None = None):
    """y [b, H] for routed + shared experts given ids/tw [b, kk] (shared appended) and their
    block plan (`moe_route.plan` with blocks of `BLOCK_M` pairs: the kernel reads no more)."""
    import numpy as np
    import torch

    cfg = cfg or MmaLayerConfig()
    b, kk = ids.shape
    I, H = qw.base.inter, x.shape[1]
    rp = repacked(qw)
    plan = type(plan)(*(t if t.dtype == torch.int32 else t.to(torch.int32)
                        for t in (plan.order, plan.expert, plan.start, plan.count)))
    T = b * kk
    act = torch.empty(T, I, device=x.device, dtype=x.dtype)
    tw = tw.reshape(-1).float().contiguous()
    _launch(x, rp.gate_up_r, rp.gate_up_rs, qw.shared_gate_up, act, plan, tw, I, H, kk, 2,
            qw.n_q, cfg.gate_up)
    y = torch.empty(T, H, device=x.device, dtype=torch.float32)
    _launch(act, rp.down_r, rp.down_rs, qw.shared_down, y, plan, tw, H, I, kk, 1, qw.n_q,
            cfg.down)
    out = torch.empty(b, H, device=x.device, dtype=x.dtype)
    CL.run(_slot_sum(), (-(-H // 256), b), 256, (np.uint64(y.data_ptr()), np.uint64(out.data_ptr()),
                                          np.int32(kk), np.int32(H), np.int32(H)))
    return out


def moe_forward(qw, x, cfg: MmaLayerConfig | None = None):
    """The whole layer on x [b, H]: router (`moe_route.route`), plan (`moe_route.plan`),
    the two expert launches, the slot sum (default config: `config_for(b)`)."""
    from microbench.kernels import moe_route as R

    if why := available():
        raise RuntimeError(why)
    b = x.shape[0]
    cfg = cfg or config_for(b)
    ids, tw, plan = R.route_and_plan(qw.base, x, BLOCK_M)
    return fused_moe(x.contiguous(), qw, ids, tw, plan, cfg)
