"""The Triton MoE expert kernels compile for a Hopper GPU (sm_90) with the shared device
functions of `microbench/kernels/triton_expert.py` inlined: Triton's compiler runs on the CPU
(no GPU, no driver), and it rejects what the CPU interpreter the other kernel tests use lets
through (a non-constexpr branch condition, a type change across a branch). In a subprocess:
the tests import triton with TRITON_INTERPRET=1, which makes every `triton.jit` an interpreter
function."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]

# one variant of each kernel source: every shared device function is called by at least one
SCRIPT = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource
from microbench.kernels import moe_fp8, moe_int4, moe_int4_gemv, moe_triton
from microbench.kernels.triton_expert import compiled

# moe_triton.plan_blocks gives int64 tensors, moe_route.plan (the quantised layers') int32
PLAN64 = {p: "*i64" for p in ("order_ptr", "blk_e_ptr", "blk_start_ptr", "blk_cnt_ptr")}
PLAN = {p: "*i32" for p in PLAN64}


def build(src, types, constexprs):
    fn = compiled(src, False)
    sig = {a: "constexpr" if a in constexprs else types.get(a, "*fp32" if a.endswith("_ptr")
                                                          else "i32")
           for a in fn.arg_names}
    k = triton.compile(ASTSource(fn, sig, constexprs), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=4, num_stages=3))
    assert ".entry " + src.__name__ in k.asm["ptx"], src.__name__


bf = {"x_ptr": "*bf16", "w_ptr": "*bf16", "act_ptr": "*bf16", "a_ptr": "*bf16",
      "a16_ptr": "*bf16", "w16_ptr": "*bf16"}
build(moe_triton._gate_up_src, {**PLAN64, **bf},
      dict(K=256, BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, EVEN_K=True))
build(moe_triton._down_src, {**PLAN, **bf},
      dict(K=256, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, EVEN_K=False))
build(moe_fp8._fp8_src, {**PLAN, **bf, "wq_ptr": "*fp8e4nv", "out_ptr": "*bf16"},
      dict(K=512, NH=2, HAS16=True, EMU=False, BLOCK_M=16, BLOCK_N=64, BLOCK_K16=64))
build(moe_int4._int4_src, {**PLAN, **bf, "wq_ptr": "*i32", "ws_ptr": "*bf16"},
      dict(K=512, NH=1, HAS16=True, ASM=True, BLOCK_M=16, BLOCK_N=32, BLOCK_K=256))
build(moe_int4_gemv._gemv_src, {**PLAN, **bf, "wq_ptr": "*i32", "ws_ptr": "*bf16",
                                "out16_ptr": "*bf16"},
      dict(K=512, NH=2, TOPK=8, BN=16, BG=16, BMS=16, BK16=64, HAS16=True, MAXMP=4))
print("compiled")
"""


def test_expert_kernels_compile_for_sm90():
    try:
        from triton.backends.nvidia import compiler  # noqa: F401
    except ImportError:
        pytest.skip("triton has no CUDA backend here")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0 and "compiled" in r.stdout, r.stderr[-3000:]
