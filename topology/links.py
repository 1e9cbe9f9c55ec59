"""What a link level means for a pipeline hop.

`nvidia-smi topo -m` levels, nearest first (nvidia-smi's legend):
  NV#  a bonded set of # NVLinks                        -> "nvlink"
  PIX  at most one PCIe bridge (same switch)            -> "same-switch"
  PXB  several PCIe bridges, no host bridge             -> "same-switch"
  PHB  through a PCIe host bridge (the CPU)             -> "same-socket"
  NODE between host bridges inside one NUMA node        -> "same-socket"
  SYS  across the SMP interconnect (QPI/UPI/xGMI)       -> "cross-socket"
  (SOC is the old drivers' name for SYS; C2C is a chip-to-chip link, treated like NVLink.)
"""
from __future__ import annotations

import re

HOP_CLASSES = ("nvlink", "same-switch", "same-socket", "cross-socket")

_CLASS = {"PIX": "same-switch", "PXB": "same-switch", "PHB": "same-socket",
          "NODE": "same-socket", "SYS": "cross-socket", "SOC": "cross-socket", "C2C": "nvlink"}

# NVML's nvmlGpuTopologyLevel_t values -> the nvidia-smi names (nvml.h).
NVML_LEVEL_NAMES = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def hop_class(link: str) -> str:
    """Classify one link level; ValueError for anything that is not a GPU-to-GPU level."""
    if re.fullmatch(r"NV\d+", link):
        return "nvlink"
    try:
        return _CLASS[link]
    except KeyError:
        raise ValueError(f"unknown link level {link!r}") from None


def pair_key(i: int, j: int) -> str:
    """The key of an unordered pair in `links`: smaller index first."""
    a, b = sorted((i, j))
    return f"{a}-{b}"


def pipeline_pairs(gpus: list[int] | tuple[int, ...]) -> list[tuple[int, int]]:
    """Directed hops of a pipeline over `gpus` in order: i->i+1, then last->first (tokens)."""
    n = len(gpus)
    if n < 2:
        return []
    return [(gpus[k], gpus[(k + 1) % n]) for k in range(n)]
