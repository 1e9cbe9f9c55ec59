"""Triton for the kernel tests, imported first thing by a test module: without a GPU the
kernels run in Triton's CPU interpreter, which must be chosen before triton is first imported
(conftest.py chooses it ahead of every module where the machine has no nvidia-smi; this also
covers a machine whose GPU torch cannot use). Skips the importing module where torch or triton
is missing."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
ON_GPU = torch.cuda.is_available()
if "triton" not in sys.modules and not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"   # read when triton is imported
triton = pytest.importorskip("triton")
INTERPRETED = bool(triton.knobs.runtime.interpret)

# a test that runs a kernel on the CPU
cpu_ok = pytest.mark.skipif(
    not INTERPRETED,
    reason="triton was imported without TRITON_INTERPRET=1; CPU kernel runs need it")


def skip_module_unless_runnable() -> None:
    """Skip the calling test module where its kernels cannot run: no GPU, and triton was
    imported without the interpreter."""
    if not ON_GPU and not INTERPRETED:
        pytest.skip("no GPU, and triton was imported without TRITON_INTERPRET=1",
                    allow_module_level=True)
