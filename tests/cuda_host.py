"""Checks CUDA C++ kernel sources without a GPU or NVRTC: the host C++ compiler parses them
with the CUDA builtins stubbed (syntax and preprocessor branches; the PTX inside asm() is not
read)."""
import shutil
import subprocess

import pytest

HOST_STUBS = r"""
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)
#define __shared__
struct uint4 { unsigned x, y, z, w; };
struct uint3 { unsigned x, y, z; };
static uint3 threadIdx, blockIdx, blockDim, gridDim;
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
template <class T> inline T __ldg(const T *p) { return *p; }
inline unsigned __byte_perm(unsigned a, unsigned, unsigned) { return a; }
inline float __expf(float x) { return x; }
inline void __syncthreads() {}
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
inline float2 make_float2(float a, float b) { return {a, b}; }
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
inline unsigned long long __cvta_generic_to_shared(const void *p) { return (unsigned long long)p; }
inline float exp2f(float x) { return x; }
inline float fmaxf(float a, float b) { return a > b ? a : b; }
inline float __int_as_float(unsigned x) { float f; __builtin_memcpy(&f, &x, 4); return f; }
inline float __shfl_xor_sync(unsigned, float v, int) { return v; }
inline int min(int a, int b) { return a < b ? a : b; }
inline float __uint_as_float(unsigned x) { float f; __builtin_memcpy(&f, &x, 4); return f; }
inline float fmaf(float a, float b, float c) { return a * b + c; }
inline float rsqrtf(float x) { return x; }
inline void __syncwarp() {}
"""


def check_parses(src: str, defines: dict, tmp_path) -> None:
    cxx = shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        pytest.skip("no host C++ compiler")
    f = tmp_path / "k.cpp"
    f.write_text(HOST_STUBS + src)
    r = subprocess.run([cxx, "-std=c++17", "-fsyntax-only",
                        *(f"-D{k}={v}" for k, v in defines.items()), str(f)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
