"""MLA decode attention over the latent cache with all 64 heads of a token in one CTA (CUDA C++
compiled at run time by cupy/NVRTC; `mla_decode`'s `_attn` is the Triton kernel it replaces
from `MlaConfig.mma_attn_min_b` tokens up).

Why: the Triton kernel gives each program 16 heads, so four programs read every cache block
and each runs a serial load -> QK -> softmax -> PV chain with 4 warps; on an H200 at b = 64
(151 MB of cache) it moved 1.35 TB/s, DRAM 28% busy, issue slots 21% busy (Nsight Compute:
latency-bound; docs/BENCHMARKS.md section 8). Here one CTA of 16 warps owns the 64 heads of
one (token, context split), so a cache block leaves HBM and shared memory once for all heads,
and loads run `STAGES` blocks ahead of the tensor cores (cp.async).

Per block of BC = 32 cache rows [32, 576] (latent 512 + rope 64), in shared memory:
1. scores S[64 heads, 32 rows] = [q_lat | q_rope] . row: warp (m = w % 4, q = w / 4) holds the
   A fragments of heads 16m..16m+15 over dims 144q..144q+143 in registers for the whole
   kernel and writes its partial sums; `mma.sync.m16n8k16`, B fragments by `ldmatrix`.
2. online softmax (one thread per head and 4 rows): the four partials summed, scaled, masked
   past the context, running max / sum per head, P in bf16 and each head's rescale factor.
3. O[64, 512] += P . rows[:, :512]: warp w owns latent dims 32w..32w+31 of all 64 heads
   (64 fp32 accumulators per lane), B fragments by `ldmatrix.trans`.
Writes the unnormalised O and (max, sum) per head and split in the layout `mla_decode`'s merge
kernel reads: o [b, S, h, 512] fp32, ml [b, S, h, 2] fp32 (max in natural-log units).
Fixed shape: kv_lora 512, rope 64, heads a multiple of 64 (DeepSeek-V3, Kimi K2); `fits` says
why not otherwise. 32 heads per CTA (8 warps, two CTAs per SM) also builds (`cta_heads`); it
was slower. What bounds it on an H200 (~1.5 TB/s at b = 64): the `mma.sync` work itself and
the shared-memory traffic and barriers around it, not HBM (docs/BENCHMARKS.md section 8);
reaching the memory floor needs Hopper's `wgmma`. Check: against a float32 softmax
(tests/test_mla_attn_mma.py) and, inside `mla_decode`, the float32 reference of
`layers.build_attention`. Needs cupy, an sm_80+ GPU and `smem_bytes()` (118 KiB) of shared
memory per block; `available()` says why not.
"""
from __future__ import annotations

import functools

from microbench.kernels import cupy_launch as CL

KL, ROPE = 512, 64          # latent and rope dims of a cache row
HEADS = 64                  # heads per CTA
BC = 32                     # cache rows per block
STAGES = 2                  # cache blocks in flight (2 was faster than 3 or 4 on an H200)
ROW = KL + ROPE + 8         # shared-memory row (bf16): 16 bytes of padding, no bank conflicts
SPR = BC + 8                # partial-score row (fp32)
PR = BC + 8                 # P row (bf16)

_SRC = CL.HELPERS + r"""
#define KL 512
#define DK 576              // KL + ROPE
#ifndef HEADS
#define HEADS 64            // heads per CTA: 64 (16 warps, one CTA per SM) or 32 (8 warps, two)
#endif
#define WARPS (HEADS / 4)
#define THREADS (32 * WARPS)
#define MT (HEADS / 16)     // 16-head tiles
#define NW (256 / HEADS)    // 8-dim output tiles per warp (MT * NW = 16)
#define BC 32
#define ROW (DK + 8)
#define SPR (BC + 8)
#define PR (BC + 8)
#ifndef STAGES
#define STAGES 2
#endif
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ u32 smem_addr(const void *p) {
  return (u32)__cvta_generic_to_shared(p);
}

// 16 bytes global -> shared, zero-filled when !ok (nothing is read then)
__device__ __forceinline__ void cp16(void *dst, const void *src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(smem_addr(dst)), "l"(src), "r"(ok ? 16 : 0));
}

__device__ __forceinline__ void ldm4(u32 *r, const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldm4t(u32 *r, const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
  return (u32)to_bf16(lo) | ((u32)to_bf16(hi) << 16);
}

// Cache rows [r0, r1) of token blockIdx.y, split blockIdx.x (r0 = split * rows_per_split),
// heads 64 * blockIdx.z ... + 63. ql [h, b, 512] (rows contiguous), qr: q3 + nope, [b, h, ..]
// (its first 64 entries per head are q_rope), cache [b, ctx, 576]. Strides in elements.
extern "C" __global__ void __launch_bounds__(THREADS, 16 / WARPS)
mla_attn_mma(const u16 *__restrict__ ql, const u16 *__restrict__ qr,
             const u16 *__restrict__ cache, float *__restrict__ o, float *__restrict__ ml,
             int ctx, int rows_per_split, float scale_log2,
             long long s_qlh, long long s_qlb, long long s_qb, long long s_qh,
             long long s_cb, long long s_cc,
             long long s_ob, long long s_os, long long s_oh,
             long long s_mb, long long s_ms, long long s_mh) {
  extern __shared__ uint4 smem[];                                       // 16-byte aligned
  u16 *kt = reinterpret_cast<u16 *>(smem);                               // [STAGES][BC][ROW]
  float *sp = reinterpret_cast<float *>(kt + STAGES * BC * ROW);         // [4][HEADS][SPR]
  u16 *pm = reinterpret_cast<u16 *>(sp + 4 * HEADS * SPR);               // [HEADS][PR]
  float *alpha_s = reinterpret_cast<float *>(pm + HEADS * PR);           // [HEADS]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3;
  const long long bt = blockIdx.y;
  const int h0 = blockIdx.z * HEADS;
  const int r0 = blockIdx.x * rows_per_split;
  const int r1 = min(ctx, r0 + rows_per_split);
  const int nblk = (r1 - r0 + BC - 1) / BC;
  const u16 *crow = cache + bt * s_cb;

  auto load_block = [&](int blk) {
    u16 *dst = kt + (blk % STAGES) * BC * ROW;
    for (int i = tid; i < BC * (DK / 8); i += THREADS) {
      const int r = i / (DK / 8), ch = i % (DK / 8);
      const int row = r0 + blk * BC + r;
      const bool ok = row < r1;
      cp16(dst + r * ROW + ch * 8, crow + (long long)(ok ? row : r0) * s_cc + ch * 8, ok);
    }
  };

  // 1. this warp's query fragments: heads 16 mq .. +15, dims 144 kq .. +143 (9 k-steps)
  const int mq = warp % MT, kq = warp / MT;
  u32 qa[9][4];
#pragma unroll
  for (int ks = 0; ks < 9; ++ks) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int hh = h0 + mq * 16 + g + (j & 1) * 8;
      const int d = kq * 144 + ks * 16 + 2 * c + (j >> 1) * 8;
      const u16 *p = d < KL ? ql + hh * s_qlh + bt * s_qlb + d : qr + bt * s_qb + hh * s_qh + (d - KL);
      qa[ks][j] = *reinterpret_cast<const u32 *>(p);
    }
  }

  float acc[MT][NW][4];      // [head tile][dim tile of 8][fragment], dims 8 NW warp .. +8 NW - 1
#pragma unroll
  for (int a = 0; a < MT; ++a)
#pragma unroll
    for (int b = 0; b < NW; ++b)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[a][b][e] = 0.f;
  const int sh = tid >> 3, sj = tid & 7;   // softmax: head sh, rows 4 sj .. +3
  float m_run = NEG_INF, l_run = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nblk) load_block(s);
    asm volatile("cp.async.commit_group;\n");
  }
  for (int blk = 0; blk < nblk; ++blk) {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(STAGES - 2));
    __syncthreads();
    if (blk + STAGES - 1 < nblk) load_block(blk + STAGES - 1);
    asm volatile("cp.async.commit_group;\n");
    const u16 *kb = kt + (blk % STAGES) * BC * ROW;

    // 1. partial scores over this warp's 144 dims, 4 row tiles of 8
    {
      float s4[4][4];
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s4[n][e] = 0.f;
      const int mj = lane >> 3, mr = lane & 7;
#pragma unroll
      for (int ks = 0; ks < 9; ++ks) {
#pragma unroll
        for (int np = 0; np < 2; ++np) {   // row tiles 2 np, 2 np + 1
          u32 bf[4];
          ldm4(bf, kb + (np * 16 + (mj >> 1) * 8 + mr) * ROW + kq * 144 + ks * 16 + (mj & 1) * 8);
          mma(s4[2 * np], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], bf[0], bf[1]);
          mma(s4[2 * np + 1], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], bf[2], bf[3]);
        }
      }
      float *spw = sp + kq * HEADS * SPR;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        *reinterpret_cast<float2 *>(spw + (mq * 16 + g) * SPR + n * 8 + 2 * c) =
            make_float2(s4[n][0], s4[n][1]);
        *reinterpret_cast<float2 *>(spw + (mq * 16 + g + 8) * SPR + n * 8 + 2 * c) =
            make_float2(s4[n][2], s4[n][3]);
      }
    }
    __syncthreads();

    // 2. online softmax in base 2: head sh, rows 4 sj .. 4 sj + 3 of this block
    {
      float v[4];
      const int rb = r0 + blk * BC + 4 * sj;
      float4 t = *reinterpret_cast<const float4 *>(sp + sh * SPR + 4 * sj);
      v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
#pragma unroll
      for (int q = 1; q < 4; ++q) {
        t = *reinterpret_cast<const float4 *>(sp + (q * HEADS + sh) * SPR + 4 * sj);
        v[0] += t.x; v[1] += t.y; v[2] += t.z; v[3] += t.w;
      }
      float mx = NEG_INF;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        v[i] = rb + i < r1 ? v[i] * scale_log2 : NEG_INF;
        mx = fmaxf(mx, v[i]);
      }
#pragma unroll
      for (int off = 1; off < 8; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_new = fmaxf(m_run, mx);     // finite: every block has a row < r1
      const float alpha = exp2f(m_run - m_new);
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        v[i] = exp2f(v[i] - m_new);
        sum += v[i];
      }
#pragma unroll
      for (int off = 1; off < 8; off <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      l_run = l_run * alpha + sum;
      m_run = m_new;
      *reinterpret_cast<uint2 *>(pm + sh * PR + 4 * sj) =
          make_uint2(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]));
      if (sj == 0) alpha_s[sh] = alpha;
    }
    __syncthreads();

    // 3. O = O * alpha + P . rows[:, 8 NW warp .. +8 NW - 1]
    {
#pragma unroll
      for (int a = 0; a < MT; ++a) {
        const float lo = alpha_s[a * 16 + g], hi = alpha_s[a * 16 + g + 8];
#pragma unroll
        for (int n = 0; n < NW; ++n) {
          acc[a][n][0] *= lo; acc[a][n][1] *= lo; acc[a][n][2] *= hi; acc[a][n][3] *= hi;
        }
      }
      const int mj = lane >> 3, mr = lane & 7;
#pragma unroll
      for (int ks = 0; ks < BC / 16; ++ks) {
        u32 bv[NW / 2][4];   // dim tiles (0, 1), (2, 3), ..: k rows 16 ks .. +15
#pragma unroll
        for (int np = 0; np < NW / 2; ++np)
          ldm4t(bv[np], kb + (ks * 16 + (mj & 1) * 8 + mr) * ROW + warp * 8 * NW + np * 16 + (mj >> 1) * 8);
#pragma unroll
        for (int a = 0; a < MT; ++a) {
          u32 pa[4];
          ldm4(pa, pm + (a * 16 + (mj & 1) * 8 + mr) * PR + ks * 16 + (mj >> 1) * 8);
#pragma unroll
          for (int np = 0; np < NW / 2; ++np) {
            mma(acc[a][2 * np], pa[0], pa[1], pa[2], pa[3], bv[np][0], bv[np][1]);
            mma(acc[a][2 * np + 1], pa[0], pa[1], pa[2], pa[3], bv[np][2], bv[np][3]);
          }
        }
      }
    }
  }
  asm volatile("cp.async.wait_group 0;\n");

  // unnormalised O, and (max in natural-log units, sum) per head
  float *ob = o + bt * s_ob + (long long)blockIdx.x * s_os;
#pragma unroll
  for (int a = 0; a < MT; ++a) {
#pragma unroll
    for (int n = 0; n < NW; ++n) {
      const int d = warp * 8 * NW + n * 8 + 2 * c;
      *reinterpret_cast<float2 *>(ob + (h0 + a * 16 + g) * s_oh + d) =
          make_float2(acc[a][n][0], acc[a][n][1]);
      *reinterpret_cast<float2 *>(ob + (h0 + a * 16 + g + 8) * s_oh + d) =
          make_float2(acc[a][n][2], acc[a][n][3]);
    }
  }
  if (sj == 0) {
    float *mp = ml + bt * s_mb + (long long)blockIdx.x * s_ms + (h0 + sh) * s_mh;
    mp[0] = m_run * 0.69314718055994531f;
    mp[1] = l_run;
  }
}
"""


@functools.lru_cache(maxsize=8)
def _kernel(stages: int = STAGES, heads: int = HEADS):
    if stages < 2 or heads not in (32, 64):
        raise ValueError(f"mla_attn_mma: {stages} stages, {heads} heads per CTA")
    fn = CL.build(_SRC, "mla_attn_mma", STAGES=stages, HEADS=heads)
    fn.max_dynamic_shared_size_bytes = smem_bytes(stages, heads)
    return fn


def smem_bytes(stages: int = STAGES, heads: int = HEADS) -> int:
    """Dynamic shared memory of one CTA: the cache blocks in flight, four partial-score
    blocks, P and the per-head rescale factors."""
    return 2 * stages * BC * ROW + 4 * 4 * heads * SPR + 2 * heads * PR + 4 * heads


def _smem_limit() -> int | None:
    """Dynamic shared memory one block may opt into on the current GPU (None: unknown)."""
    import torch

    dev = torch.cuda.current_device()
    v = getattr(torch.cuda.get_device_properties(dev), "shared_memory_per_block_optin", None)
    if v:
        return int(v)
    try:
        import cupy

        rt = cupy.cuda.runtime
        return int(rt.deviceGetAttribute(
            getattr(rt, "cudaDevAttrMaxSharedMemoryPerBlockOptin", 97), dev))
    except Exception:  # noqa: BLE001 - unknown: the build below still says if it fails
        return None


@functools.lru_cache(maxsize=1)
def available() -> str | None:
    """None when the kernel can run here, else why not (one line). GPUs whose blocks get
    under `smem_bytes()` of shared memory (sm_86 / sm_89 / sm_120 allow 99 KiB) run the
    Triton attention instead."""
    if why := CL.unavailable(lambda: None):
        return why
    lim = _smem_limit()
    if lim is not None and lim < smem_bytes():
        return (f"needs {smem_bytes() // 1024} KiB of shared memory per block, this GPU "
                f"allows {lim // 1024} KiB")
    return CL.unavailable(_kernel)


def fits(heads: int, kv_lora: int, rope: int, cta_heads: int = HEADS) -> str | None:
    """None when the kernel takes this attention shape, else why not."""
    if kv_lora != KL or rope != ROPE:
        return f"latent {kv_lora} + rope {rope} (the kernel is built for {KL} + {ROPE})"
    if heads % cta_heads:
        return f"{heads} heads (a multiple of {cta_heads})"
    return None


def splits_for(b: int, ctx: int, heads: int, sms: int, cta_heads: int = HEADS) -> int:
    """Context splits per token: one wave of CTAs over the launch (64 / cta_heads CTAs per
    SM; b x splits x head groups within it, so no partial second wave), at least one block
    of BC rows per split."""
    per_token = (heads // cta_heads) * max(1, b)
    return max(1, min(sms * (HEADS // cta_heads) // per_token, -(-ctx // BC)))


def attention(q_lat, q3, nope: int, cache, o, ml, ctx: int, sm_scale: float, split: int,
              stages: int = STAGES, cta_heads: int = HEADS) -> None:
    """Fill o [b, S, h, 512] and ml [b, S, h, 2] (fp32) for S = ceil(ctx / split) splits of
    `split` rows (a multiple of BC): q_lat [h, b, 512], q3 [b, h, nope + 64], cache
    [b, >= ctx, 576], all bf16 with contiguous last dimensions."""
    import math

    import numpy as np
    import torch

    h, b = q_lat.shape[0], q_lat.shape[1]
    if why := fits(h, q_lat.shape[2], q3.shape[2] - nope, cta_heads):
        raise ValueError(f"mla_attn_mma: {why}")
    if split % BC:
        raise ValueError(f"mla_attn_mma: split {split} is not a multiple of {BC}")
    for name, t in (("q_lat", q_lat), ("q3", q3), ("cache", cache)):
        if t.dtype != torch.bfloat16 or t.stride(-1) != 1:
            raise ValueError(f"mla_attn_mma: {name} must be bf16 with a contiguous last dim")
    if cache.stride(1) % 8 or cache.data_ptr() % 16 or any(
            s % 2 for s in (*q_lat.stride()[:2], *q3.stride()[:2])) or nope % 2:
        raise ValueError("mla_attn_mma: cache rows 16-byte aligned, query strides even")
    S = -(-ctx // split)
    if (q3.shape[:2] != (b, h) or cache.shape[0] != b or cache.shape[2] != KL + ROPE
            or not 0 < ctx <= cache.shape[1]):
        raise ValueError(f"mla_attn_mma: q3 {tuple(q3.shape)} / cache {tuple(cache.shape)} do "
                         f"not match q_lat {tuple(q_lat.shape)} at ctx {ctx}")
    for name, t, last in (("o", o, KL), ("ml", ml, 2)):
        if (t.dtype != torch.float32 or tuple(t.shape) != (b, S, h, last) or t.stride(-1) != 1
                or t.stride(2) % 2 or t.data_ptr() % 8):
            raise ValueError(f"mla_attn_mma: {name} must be float32 [{b}, {S}, {h}, {last}] "
                             "with a contiguous, 8-byte aligned last dim")
    qr = q3[:, :, nope:]
    args = (np.uint64(q_lat.data_ptr()), np.uint64(qr.data_ptr()), np.uint64(cache.data_ptr()),
            np.uint64(o.data_ptr()), np.uint64(ml.data_ptr()), np.int32(ctx), np.int32(split),
            np.float32(sm_scale * math.log2(math.e)),
            *(np.int64(s) for s in (q_lat.stride(0), q_lat.stride(1), q3.stride(0),
                                    q3.stride(1), cache.stride(0), cache.stride(1),
                                    o.stride(0), o.stride(1), o.stride(2),
                                    ml.stride(0), ml.stride(1), ml.stride(2))))
    CL.run(_kernel(stages, cta_heads), (S, b, h // cta_heads), cta_heads // 4 * 32, args,
           shared_mem=smem_bytes(stages, cta_heads))
