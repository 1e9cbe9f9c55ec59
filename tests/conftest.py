"""Two tiers: CPU tests always run; tests marked `gpu` are skipped without an NVIDIA GPU."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


def _gpu_count() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


# Without a GPU, Triton kernels run in Triton's interpreter on the CPU; it must be chosen before
# triton is first imported, so it is set here, ahead of every test module.
if not shutil.which("nvidia-smi"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    n = _gpu_count()
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU")
    skip_multi = pytest.mark.skip(reason="needs two or more NVIDIA GPUs")
    skip_lab = pytest.mark.skip(reason="the live SGLang lab runs with PPSCOPE_LAB=1 "
                                "(make sglang-lab-test)")
    for item in items:
        if "sglang_lab" in item.keywords and os.environ.get("PPSCOPE_LAB") != "1":
            item.add_marker(skip_lab)
        if "gpu" in item.keywords and n < 1:
            item.add_marker(skip_gpu)
        if "multigpu" in item.keywords and n < 2:
            item.add_marker(skip_multi)


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES
