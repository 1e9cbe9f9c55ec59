"""What the CUDA C++ kernels compiled at run time by cupy/NVRTC share: the device helpers
(tensor-core MMA, streaming loads, bf16 conversion) and launching on torch's current stream
(so CUDA-graph capture records the launch). Imports cupy and torch only inside functions."""
from __future__ import annotations

# device helpers, prepended to each kernel source
HELPERS = r"""
typedef unsigned int u32;
typedef unsigned short u16;

__device__ __forceinline__ void mma(float *c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// the weight stream: read once, kept out of L1 (which holds the activations)
__device__ __forceinline__ uint4 ld_stream(const void *p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

__device__ __forceinline__ u32 ld_stream32(const void *p) {
  u32 r;
  asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];\n" : "=r"(r) : "l"(p));
  return r;
}

// 16 bytes of activations, zeros for a token past the block
__device__ __forceinline__ uint4 ldx(const u16 *p) {
  return p ? __ldg(reinterpret_cast<const uint4 *>(p)) : make_uint4(0u, 0u, 0u, 0u);
}

__device__ __forceinline__ u16 to_bf16(float v) {
  u16 r;
  asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(r) : "f"(v));
  return r;
}
"""

_STREAMS: dict = {}


def build(src: str, name: str, **defines):
    """Kernel `name` of CUDA C++ source `src` compiled by NVRTC (C++17, each define passed as
    -DNAME=VALUE, in order); cupy caches the build per source and options."""
    import cupy

    opts = ("-std=c++17", *(f"-D{k}={v}" for k, v in defines.items()))
    return cupy.RawModule(code=src, options=opts).get_function(name)


def cupy_stream(ts):
    """cupy's view of torch stream `ts` (cached): `Stream.from_external` (the CUDA stream
    protocol) where cupy and torch have it, else the older `ExternalStream`."""
    import cupy

    key = ts.cuda_stream
    if key not in _STREAMS:
        try:
            _STREAMS[key] = cupy.cuda.Stream.from_external(ts)
        except (AttributeError, TypeError, ValueError):
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                _STREAMS[key] = cupy.cuda.ExternalStream(key)
    return _STREAMS[key]


def run(fn, grid, threads: int, args, shared_mem: int = 0):
    """Launch a cupy kernel on torch's current stream (so CUDA-graph capture records it), with
    `shared_mem` bytes of dynamic shared memory."""
    import torch

    with cupy_stream(torch.cuda.current_stream()):
        fn(grid, (threads,), args, shared_mem=shared_mem)


def unavailable(build) -> str | None:
    """None when cupy kernels can run here (cupy, an sm_80+ CUDA GPU, and `build()` compiling
    one), else why not (one line)."""
    try:
        import cupy  # noqa: F401
        import torch
    except ImportError as e:
        return f"cupy/torch not importable ({e.name})"
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    if torch.cuda.get_device_capability() < (8, 0):
        return "needs an sm_80+ GPU (bf16 mma.sync)"
    try:
        build()
    except Exception as e:  # noqa: BLE001 - e.g. no NVRTC library: the caller falls back
        return f"NVRTC build failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return None
