"""Decode-size bf16 projections y = x @ W^T (x: up to 16 tokens) on tensor cores, streaming the
weight matrix once (CUDA C++ compiled at run time by cupy/NVRTC).

Why: at b = 1..16 a projection is a weight stream; on an H200 cuBLAS reaches ~1.7 TB/s on
Kimi K2's x @ [W_qa; W_kva] (2112 x 7168, docs/BENCHMARKS.md section 8) against 4.2 TB/s of
copy bandwidth. Here each warp owns 16 weight rows and a contiguous part of the inputs; per
64-input chunk a lane loads 16 consecutive inputs of rows g and g + 8 (g = lane / 4) as four
16-byte loads that bypass L1 and issues four `mma.sync.m16n8k16` with the tokens as the
8-wide B operand. The MMA's reduction order is free, so fragment f's k positions 2c, 2c+1,
2c+8, 2c+9 (c = lane % 4) are inputs 16c + 4f + 0..3: the lane's activations for a chunk
are two 16-byte loads of the same 16 inputs (as `moe_int4_mma`'s bf16 shared expert).
Weights are read in their own row-major layout: nothing is repacked.

CTA = `GemvConfig.ksplit` warps on one 16-row tile, splitting its inputs (partial sums reduced
through shared memory); `nt` 8-token groups per launch (b <= 8 nt). `rows = 8` swaps the
operands (the tokens as the 16-row A operand, 8 weight rows as B): twice the tiles, for
matrices with too few 16-row tiles to fill the GPU, and up to 16 tokens in one MMA. A batch dimension z
(blockIdx.y, e.g. the heads of MLA's absorbed W_uk / W_uv) with its own strides for W, x and
y, so per-head inputs and outputs are read and written in place.
Check: a float32 matmul (`reference`). Needs cupy and an sm_80+ GPU; `available()` says why not.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from microbench.kernels import cupy_launch as CL

CHUNK = 64          # inputs per chunk: four 16-input MMA fragments
ROWS = 16           # weight rows per warp tile
MAX_TOKENS = 16     # two 8-token MMA groups
KERNEL = "gemv_mma (CUDA mma.sync m16n8k16, bf16 weights streamed once)"

_SRC = CL.HELPERS + r"""
#ifndef KSPLIT
#define KSPLIT 4      // warps per 16-row tile, splitting its inputs
#endif
#ifndef UNROLL
#define UNROLL 2      // chunks loaded together
#endif
#ifndef NT
#define NT 1          // 8-token MMA groups
#endif
#ifndef RMS
#define RMS 0         // 1: each output row times 1 / rms(x row) (RMSNorm folded in, rows-16 only)
#endif

// Where a thread stands (both kernels; grid (tiles, Z), KSPLIT warps per CTA on one tile):
// its warp and lane, the lane's MMA fragment coordinates g = lane / 4, c = lane % 4, the tile
// t, the batch index z, and the warp's share [c0, c1) of the K / 64 input chunks.
#define TILE_THREAD(K)                                                    \
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;             \
  const int g = lane >> 2, c = lane & 3;                                  \
  const int t = blockIdx.x;                                               \
  const long long z = blockIdx.y;                                         \
  const int nch = (K) / 64;                                               \
  const int c0 = warp * nch / KSPLIT, c1 = (warp + 1) * nch / KSPLIT

// The side job of `gemv(.., side=)`: one CTA per token n writes
// sy[n, :sk] = RMSNorm(sx[n, :sk]) * sw and copies sx[n, sk:sk + stail] to sy[n, sk:].
__device__ void side_rmsnorm(const u16 *sx, long long sx_s, const u16 *sw, u16 *sy,
                             long long sy_s, int sk, int stail, int n, float eps) {
  __shared__ float part[32];
  const u16 *xr = sx + n * sx_s;
  u16 *yr = sy + n * sy_s;
  const int tid = threadIdx.x, nthr = blockDim.x;
  float ss = 0.f;
  for (int i = tid; i < sk; i += nthr) {
    const float v = __uint_as_float((u32)xr[i] << 16);
    ss = fmaf(v, v, ss);
  }
#pragma unroll
  for (int off = 16; off; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if ((tid & 31) == 0) part[tid >> 5] = ss;
  __syncthreads();
  float tot = 0.f;
  for (int w = 0; w < (nthr >> 5); ++w) tot += part[w];
  const float r = rsqrtf(tot / sk + eps);
  for (int i = tid; i < sk; i += nthr)
    yr[i] = to_bf16(__uint_as_float((u32)xr[i] << 16) * r * __uint_as_float((u32)sw[i] << 16));
  for (int i = tid; i < stail; i += nthr) yr[sk + i] = xr[sk + i];
}

__device__ __forceinline__ float sumsq8(uint4 v) {
  const u32 w[4] = {v.x, v.y, v.z, v.w};
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float lo = __uint_as_float(w[i] << 16), hi = __uint_as_float(w[i] & 0xffff0000u);
    s = fmaf(lo, lo, fmaf(hi, hi, s));
  }
  return s;
}

// y[z, n, r] = sum_k x[z, n, k] w[z, r, k] for tokens n < nb; x, w, y bf16, fp32 accumulation.
// With RMS, y[z, n, r] also times 1 / sqrt(mean_k x[z, n, k]^2 + eps): the sums of squares come
// from the activation loads the MMAs use (each input of a token is loaded once per CTA).
// grid (N / 16 + side_nb, Z), KSPLIT warps per CTA; the last side_nb CTAs run `side_rmsnorm`
// (Z = 1). Strides in elements; rows of w and x contiguous.
extern "C" __global__ void __launch_bounds__(32 * KSPLIT)
gemv_bf16_mma(const u16 *__restrict__ w, const u16 *__restrict__ x, u16 *__restrict__ y,
              int K, int nb, long long w_sz, int w_sn, long long x_sz, int x_sn,
              long long y_sz, int y_sn, float eps,
              const u16 *sx, long long sx_s, const u16 *sw, u16 *sy, long long sy_s, int sk,
              int stail, int side_nb) {
  if (side_nb && (int)blockIdx.x >= (int)gridDim.x - side_nb) {
    side_rmsnorm(sx, sx_s, sw, sy, sy_s, sk, stail, blockIdx.x - (gridDim.x - side_nb), eps);
    return;
  }
#if KSPLIT > 1
  __shared__ float red[KSPLIT][NT][4][32];
#endif
#if RMS
  __shared__ float red_ss[KSPLIT][NT][8];
  float ss[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) ss[j] = 0.f;
#endif
  TILE_THREAD(K);
  const u16 *pa = w + z * w_sz + (long long)(t * 16 + g) * w_sn + 16 * c;
  const u16 *pb = pa + 8LL * w_sn;
  const u16 *x0[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j)
    x0[j] = j * 8 + g < nb ? x + z * x_sz + (long long)(j * 8 + g) * x_sn + 16 * c : 0;
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  for (int ch = c0; ch < c1; ch += UNROLL) {
    uint4 va[UNROLL][2], vb[UNROLL][2];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (ch + u < c1) {
        const int k = (ch + u) * 64;
        va[u][0] = ld_stream(pa + k); va[u][1] = ld_stream(pa + k + 8);
        vb[u][0] = ld_stream(pb + k); vb[u][1] = ld_stream(pb + k + 8);
      }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (ch + u < c1) {
        const int k = (ch + u) * 64;
        const u32 a[4][4] = {{va[u][0].x, vb[u][0].x, va[u][0].y, vb[u][0].y},
                             {va[u][0].z, vb[u][0].z, va[u][0].w, vb[u][0].w},
                             {va[u][1].x, vb[u][1].x, va[u][1].y, vb[u][1].y},
                             {va[u][1].z, vb[u][1].z, va[u][1].w, vb[u][1].w}};
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const uint4 xa = ldx(x0[j] ? x0[j] + k : 0), xb = ldx(x0[j] ? x0[j] + k + 8 : 0);
          const u32 bx[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
          for (int f = 0; f < 4; ++f)
            mma(acc[j], a[f][0], a[f][1], a[f][2], a[f][3], bx[2 * f], bx[2 * f + 1]);
#if RMS
          ss[j] += sumsq8(xa) + sumsq8(xb);
#endif
        }
      }
  }
#if RMS   // token 8j + g's sum of squares: the 4 lanes of its row, then the KSPLIT warps
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    float v = ss[j];
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    if (c == 0) red_ss[warp][j][g] = v;
  }
#if KSPLIT == 1
  __syncwarp();
#endif
#endif
#if KSPLIT > 1
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][j][i][lane] = acc[j][i];
  __syncthreads();
  if (warp) return;
#pragma unroll
  for (int s = 1; s < KSPLIT; ++s)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[j][i] += red[s][j][i][lane];
#endif
  // acc[j][0..1]: row g, tokens 8j + 2c, 8j + 2c + 1; acc[j][2..3]: row g + 8
  u16 *yz = y + z * y_sz + t * 16 + g;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int n = j * 8 + 2 * c + i;
      if (n < nb) {
        float r = 1.f;
#if RMS
        float tot = 0.f;
#pragma unroll
        for (int s = 0; s < KSPLIT; ++s) tot += red_ss[s][j][2 * c + i];
        r = rsqrtf(tot / K + eps);
#endif
        yz[(long long)n * y_sn] = to_bf16(acc[j][i] * r);
        yz[(long long)n * y_sn + 8] = to_bf16(acc[j][2 + i] * r);
      }
    }
}

// The same product with the roles swapped: the tokens (up to 16) are the MMA's A operand and
// 8 weight rows its B operand, so a warp owns 8 rows (twice the tiles of the kernel above for
// the same matrix) and 9..16 tokens cost no second MMA. Lane (g, c) loads inputs 16c..16c+15
// of weight row g and of tokens g and g + 8. grid (N / 8, Z).
extern "C" __global__ void __launch_bounds__(32 * KSPLIT)
gemv_bf16_mma_r8(const u16 *__restrict__ w, const u16 *__restrict__ x, u16 *__restrict__ y,
                 int K, int nb, long long w_sz, int w_sn, long long x_sz, int x_sn,
                 long long y_sz, int y_sn, float eps,   // eps, side job: unused here
                 const u16 *sx, long long sx_s, const u16 *sw, u16 *sy, long long sy_s, int sk,
                 int stail, int side_nb) {
#if KSPLIT > 1
  __shared__ float red[KSPLIT][4][32];
#endif
  TILE_THREAD(K);
  const u16 *pw = w + z * w_sz + (long long)(t * 8 + g) * w_sn + 16 * c;
  const u16 *xg = g < nb ? x + z * x_sz + (long long)g * x_sn + 16 * c : 0;
  const u16 *xh = g + 8 < nb ? x + z * x_sz + (long long)(g + 8) * x_sn + 16 * c : 0;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int ch = c0; ch < c1; ch += UNROLL) {
    uint4 wv[UNROLL][2];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (ch + u < c1) {
        const int k = (ch + u) * 64;
        wv[u][0] = ld_stream(pw + k); wv[u][1] = ld_stream(pw + k + 8);
      }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (ch + u < c1) {
        const int k = (ch + u) * 64;
        const uint4 ga = ldx(xg ? xg + k : 0), gb = ldx(xg ? xg + k + 8 : 0);
        const uint4 ha = ldx(xh ? xh + k : 0), hb = ldx(xh ? xh + k + 8 : 0);
        const u32 bw[8] = {wv[u][0].x, wv[u][0].y, wv[u][0].z, wv[u][0].w,
                           wv[u][1].x, wv[u][1].y, wv[u][1].z, wv[u][1].w};
        const u32 ag[8] = {ga.x, ga.y, ga.z, ga.w, gb.x, gb.y, gb.z, gb.w};
        const u32 ah[8] = {ha.x, ha.y, ha.z, ha.w, hb.x, hb.y, hb.z, hb.w};
#pragma unroll
        for (int f = 0; f < 4; ++f)
          mma(acc, ag[2 * f], ah[2 * f], ag[2 * f + 1], ah[2 * f + 1], bw[2 * f], bw[2 * f + 1]);
      }
  }
#if KSPLIT > 1
#pragma unroll
  for (int i = 0; i < 4; ++i) red[warp][i][lane] = acc[i];
  __syncthreads();
  if (warp) return;
#pragma unroll
  for (int s = 1; s < KSPLIT; ++s)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] += red[s][i][lane];
#endif
  // acc[0..1]: token g, rows 8t + 2c, 2c + 1; acc[2..3]: token g + 8
  u16 *yz = y + z * y_sz + t * 8 + 2 * c;
  if (g < nb) {
    yz[(long long)g * y_sn] = to_bf16(acc[0]);
    yz[(long long)g * y_sn + 1] = to_bf16(acc[1]);
  }
  if (g + 8 < nb) {
    yz[(long long)(g + 8) * y_sn] = to_bf16(acc[2]);
    yz[(long long)(g + 8) * y_sn + 1] = to_bf16(acc[3]);
  }
}
"""


@dataclass(frozen=True)
class GemvConfig:
    """Compile-time shape of one launch (each distinct config is its own NVRTC build)."""
    ksplit: int = 4     # warps per 16-row tile (1, 2, 4, 8, 16), splitting its inputs
    unroll: int = 2     # 64-input chunks loaded together
    nt: int = 1         # 8-token MMA groups (b <= 8 nt); rows = 16 only
    rows: int = 16      # weight rows per warp: 16 (weights as the MMA's A operand) or 8 (B)


@functools.lru_cache(maxsize=32)
def _kernel(cfg: GemvConfig, rms: bool = False):
    if (cfg.ksplit not in (1, 2, 4, 8, 16, 32) or cfg.unroll < 1 or cfg.nt not in (1, 2)
            or cfg.rows not in (8, 16) or (rms and cfg.rows != 16)):
        raise ValueError(f"bad gemv config {cfg}" + (" with RMS" if rms else ""))
    name = "gemv_bf16_mma" if cfg.rows == 16 else "gemv_bf16_mma_r8"
    return CL.build(_SRC, name, KSPLIT=cfg.ksplit, UNROLL=cfg.unroll, NT=cfg.nt, RMS=int(rms))


@functools.lru_cache(maxsize=1)
def available() -> str | None:
    """None when the kernel can run here, else why not (one line)."""
    return CL.unavailable(lambda: _kernel(GemvConfig()))


# Launch shape rule, from sweeps on one H200 at Kimi K2's MLA and router shapes (both tile
# heights, 6 split widths x 3 unroll depths, b = 1..16, weights rotated past L2;
# docs/BENCHMARKS.md section 8): a matrix of fewer than SMALL_TILES 16-row tiles (under two
# per SM) takes 8-row tiles; split a tile's inputs over more warps until the launch has
# ~TARGET_WARPS warps, never below 2 chunks per warp; load two chunks at once only with
# 16-row tiles at b = 1 and >= 7 chunks per warp (with more tokens the registers cost more).
TARGET_WARPS = 3072
SMALL_TILES = 264


def config_for(n_rows: int, k: int, z: int, b: int) -> GemvConfig:
    rows = 8 if (n_rows // 16) * z < SMALL_TILES else 16
    tiles = (n_rows // rows) * z
    nch = k // CHUNK
    ks = 1
    while ks < 16 and tiles * ks < TARGET_WARPS and nch // (2 * ks) >= 2:
        ks *= 2
    unroll = 2 if rows == 16 and b == 1 and nch // ks >= 7 else 1
    return GemvConfig(ks, unroll, 1 if b <= 8 or rows == 8 else 2, rows)


def fits(w, b: int) -> str | None:
    """None when `gemv` takes weight w [.., N, K] at b tokens, else why not."""
    n, k = w.shape[-2], w.shape[-1]
    if not 1 <= b <= MAX_TOKENS:
        return f"{b} tokens (the kernel takes 1..{MAX_TOKENS})"
    if n % ROWS or k % CHUNK:
        return f"rows {n} / inputs {k} do not tile into {ROWS} x {CHUNK}"
    if w.stride(-1) != 1 or w.stride(-2) % 8 or w.data_ptr() % 16:
        return "weight rows must be contiguous and 16-byte aligned"
    return None


def gemv(x, w, out=None, cfg: GemvConfig | None = None, rms_eps: float | None = None,
         side=None):
    """out [.., b, N] = x [.., b, K] @ w [.., N, K]^T in bf16, with an optional leading batch
    dimension z shared by x, w and out (any strides whose rows are contiguous and 16-byte
    aligned; `out` may be a strided view, e.g. one head's columns of a wider row).
    rms_eps: each token's row of out also divided by sqrt(mean(x^2) + rms_eps), so that
    gemv(x, w * norm_weight, rms_eps=eps) is RMSNorm(x) @ w^T in one launch (16-row tiles).
    side = (src [b, k + t], norm_w [k], dst [b, k + t], k), with rms_eps and no batch dimension:
    the same launch also writes dst[:, :k] = RMSNorm(src[:, :k]) * norm_w and copies
    src[:, k:] into dst[:, k:] (one extra CTA per token; MLA's kv latent into its cache row)."""
    import numpy as np
    import torch

    batched = w.dim() == 3
    xs, ws = (x, w) if batched else (x[None], w[None])
    Z, N, K = ws.shape
    b = xs.shape[1]
    if why := fits(ws, b):
        raise ValueError(f"gemv_mma: {why}")
    if xs.dtype != torch.bfloat16 or ws.dtype != torch.bfloat16:
        raise ValueError("gemv_mma: bf16 x and w")
    if xs.stride(-1) != 1 or xs.stride(-2) % 8 or xs.data_ptr() % 16 or xs.shape[0] != Z:
        xs = xs.expand(Z, b, K).contiguous()
    if out is None:
        out = torch.empty(*((Z,) if batched else ()), b, N, device=x.device, dtype=x.dtype)
    os_ = out if batched else out[None]
    if os_.stride(-1) != 1:
        raise ValueError("gemv_mma: output rows must be contiguous")
    cfg = cfg or config_for(N, K, Z, b)
    if side is not None:
        sx, sw, sy, sk = side
        if rms_eps is None or batched or sx.shape[0] != b or sy.shape != sx.shape:
            raise ValueError("gemv_mma: side needs rms_eps, no batch dim and src / dst [b, k + t]")
        if sx.stride(-1) != 1 or sy.stride(-1) != 1 or sw.numel() != sk or sk > sx.shape[1]:
            raise ValueError("gemv_mma: side rows must be contiguous, norm weight [k]")
        if any(t.dtype != torch.bfloat16 for t in (sx, sw, sy)) or not sw.is_contiguous():
            raise ValueError("gemv_mma: side tensors bf16, norm weight contiguous")
    if rms_eps is not None and cfg.rows != 16:
        cfg = GemvConfig(cfg.ksplit, 1, 1 if b <= 8 else 2, 16)
    if cfg.rows == 16 and b > 8 * cfg.nt:
        raise ValueError(f"gemv_mma: {b} tokens need nt >= {-(-b // 8)}")
    args = (np.uint64(ws.data_ptr()), np.uint64(xs.data_ptr()), np.uint64(os_.data_ptr()),
            np.int32(K), np.int32(b), np.int64(ws.stride(0)), np.int32(ws.stride(1)),
            np.int64(xs.stride(0)), np.int32(xs.stride(1)), np.int64(os_.stride(0)),
            np.int32(os_.stride(1)), np.float32(rms_eps or 0.0))
    if side is None:
        args += (np.uint64(0), np.int64(0), np.uint64(0), np.uint64(0), np.int64(0), np.int32(0),
                 np.int32(0), np.int32(0))
        nside = 0
    else:
        args += (np.uint64(sx.data_ptr()), np.int64(sx.stride(0)), np.uint64(sw.data_ptr()),
                 np.uint64(sy.data_ptr()), np.int64(sy.stride(0)), np.int32(sk),
                 np.int32(sx.shape[1] - sk), np.int32(b))
        nside = b
    CL.run(_kernel(cfg, rms_eps is not None), (N // cfg.rows + nside, Z), 32 * cfg.ksplit, args)
    return out


def reference(x, w):
    """float32 x @ w^T (batched over a leading dimension when w has one)."""
    return (x.float() @ w.float().transpose(-1, -2))
