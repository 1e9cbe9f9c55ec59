"""SGLang's CUDA-graph capture rule for decode (FACTS.md, "CUDA graphs under PP"), in one place.

Each PP rank captures decode graphs for the batch sizes below; a batch runs padded to the next
captured size, and a batch over `max_bs` runs eager. Used by the graphs probe (which flags the
user's batch sizes that fall off the graph path) and by the pipeline model (padding and
fall-back costs). Plain functions; no torch.
"""
from __future__ import annotations

def capture_sizes(max_bs: int) -> list[int]:
    """[1, 2, 4, 8, 12] + range(16, 257, 8) + range(272, 512, 16) + range(512, max_bs+1, 32),
    capped at max_bs."""
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16),
             *range(512, max_bs + 1, 32)]
    return sorted({s for s in sizes if s <= max_bs})


def padded(batch: int, max_bs: int) -> int | None:
    """The captured size a decode batch of `batch` replays at, or None (runs eager)."""
    for s in capture_sizes(max_bs):
        if s >= batch:
            return s
    return None


def default_max_bs(mem_gb: float | None, tp: int = 1) -> int | None:
    """SGLang's default cuda_graph_max_bs for 90-160 GB GPUs; None where we do not know it."""
    if mem_gb is not None and 90 <= mem_gb <= 160:
        return 256 if tp < 4 else 512
    return None
