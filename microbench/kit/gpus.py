"""How many GPUs this process can see, without initialising CUDA (so CPU test collection and the
parent of a torchrun launch never touch a device).

NVML first (nvidia-ml-py), then `nvidia-smi -L` when NVML is missing; `CUDA_VISIBLE_DEVICES`
wins over both, since it is what the ranks will see.
"""
from __future__ import annotations

import os
import shutil
import subprocess


def nvml_gpu_count() -> int:
    """GPUs NVML can see (0 when NVML or the driver is missing). Never touches CUDA."""
    try:
        import pynvml as nv
        nv.nvmlInit()
    except Exception:  # noqa: BLE001 - no library, no driver, no GPU: all mean "none seen"
        return 0
    try:
        return int(nv.nvmlDeviceGetCount())
    finally:
        nv.nvmlShutdown()


def first_gpu_mem_mib() -> float | None:
    """Total memory of the first visible GPU in MiB (NVML; None without it). SGLang sizes its
    defaults by this figure (reports/base/sglang_defaults.py). Never touches CUDA."""
    try:
        import pynvml as nv
        nv.nvmlInit()
    except Exception:  # noqa: BLE001 - no library, no driver, no GPU
        return None
    try:
        vis = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        idx = int(vis) if vis.isdigit() else 0
        return nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(idx)).total / (1 << 20)
    except Exception:  # noqa: BLE001 - a UUID in CUDA_VISIBLE_DEVICES, a lost GPU: unknown
        return None
    finally:
        nv.nvmlShutdown()


def visible_gpus() -> int:
    """GPUs the ranks of a launch will see: CUDA_VISIBLE_DEVICES, else NVML, else nvidia-smi."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return len([v for v in vis.split(",") if v.strip() and v.strip() != "-1"])
    n = nvml_gpu_count()
    if n:
        return n
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
            return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.TimeoutExpired):
            return 0
    return 0
