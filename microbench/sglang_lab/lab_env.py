"""The environment of every process the lab and the twin start with the lab's Python.

One place for all of them (the SGLang server, bench_serving, the model maker, the import check,
the probes of `torch.version.cuda` and of SGLang's radix core), so that none of them differs:

- ppscope's own Python settings are dropped (`PYTHONPATH`, `VIRTUAL_ENV`, `PYTHONHOME`): the lab's
  interpreter runs as itself; nothing comes from the hub (`HF_HUB_OFFLINE=1`);
- on a CPU run whose torch is a CUDA build (pip's default torch on Linux, so a lab venv made on a
  GPU host, or made over a GPU host's torch from a bundle, has one), no GPU is visible
  (`CUDA_VISIBLE_DEVICES` empty) and no NCCL library is found. A GPU visible to any of them
  takes SGLang's CUDA import path: bench_serving then imports `quantization/gguf.py`, which
  imports `sgl_kernel.quantization`, absent from the lab's CPU stand-in, and fails at the
  warm-up. On the server, SGLang makes a PyNccl communicator for every group whose NCCL library
  loads (`init_model_parallel_group` in sglang/srt/distributed/parallel_state.py) and, with
  `--device cpu`, stops there ("Expected a cuda device, but got: cpu",
  device_communicators/pynccl.py); SGLang's own `SGLANG_NCCL_SO_PATH`, naming a library that is
  not there, makes it go on without PyNccl, as with a CPU torch (one "Failed to load NCCL library"
  line per group and rank).

A GPU run (`--device cuda`, an SGLang you installed) keeps what it was given.
"""
from __future__ import annotations

import os
import subprocess
from functools import lru_cache
from pathlib import Path

NO_NCCL = "ppscope-lab-cpu-server-has-no-nccl"    # SGLANG_NCCL_SO_PATH on a CPU run: no such library
# what a process needs to see no GPU (the torch query itself included: torch.version.cuda needs none)
NO_GPU = {"CUDA_VISIBLE_DEVICES": "", "SGLANG_NCCL_SO_PATH": NO_NCCL}


def own_env() -> dict[str, str]:
    """This environment without ppscope's Python settings: the lab's interpreter runs as itself."""
    env = dict(os.environ)
    for k in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
        env.pop(k, None)
    return env


@lru_cache(maxsize=8)
def torch_cuda_version(python: Path) -> str | None:
    """The CUDA version the torch of `python` was built for (torch.version.cuda), None for a CPU
    build or where it cannot be read (then its processes start as with a CPU torch)."""
    try:
        out = subprocess.run([str(python), "-c", "import torch; print(torch.version.cuda)"],
                             capture_output=True, text=True, timeout=300,
                             env=own_env() | NO_GPU, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    last = (out.stdout.strip().splitlines() or [""])[-1]
    return last if out.returncode == 0 and last[:1].isdigit() else None


def hides_gpu(python: Path, device: str = "cpu") -> bool:
    """Whether processes of `python` run with no GPU visible: a CPU run on a CUDA torch."""
    return device == "cpu" and torch_cuda_version(Path(python)) is not None


def child_env(python: Path, device: str = "cpu") -> dict[str, str]:
    """The environment of a process the lab starts with `python` (see the module's docstring)."""
    env = own_env()
    env["HF_HUB_OFFLINE"] = "1"
    if hides_gpu(python, device):
        env.update(NO_GPU)
    return env
