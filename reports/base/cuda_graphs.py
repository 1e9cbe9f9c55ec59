"""SGLang's CUDA-graph capture rule for decode, in one place (no torch).

Each PP rank captures decode graphs for the batch sizes below; a batch runs padded to the next
captured size, and a batch over the largest captured size runs eager. Used by the graphs probe
(which flags the user's batch sizes that fall off the graph path), the PP-loop probe and the
pipeline model (padding and fall-back costs).
"""
from __future__ import annotations

from reports.base.sglang_defaults import default_decode_max_bs, gpu_mem_mib


def capture_sizes(max_bs: int, max_running_requests: int | None = None) -> list[int]:
    """Decode sizes SGLang captures. SGLang 0.5.23 arg_groups/cuda_graph_hook.py,
    `generate_decode_cuda_graph_batch_sizes` (no speculative decoding, padding on):
    [1, 2, 4, 8, 12] + range(16, 257, 8) + range(272, 512, 16) + range(512, max_bs+1, 32),
    capped at max_bs, with max_bs itself appended when missing; then
    model_executor/runner/base_cuda_graph_runner.py, `get_batch_sizes_to_capture`: sizes over
    the request pool (`max_running_requests` rows) are dropped and the pool size is added."""
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16),
             *range(512, max_bs + 1, 32)]
    sizes = [s for s in sizes if s <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    if max_running_requests is not None:
        if max(sizes) > max_running_requests:
            sizes.append(int(max_running_requests))
        sizes = [s for s in sizes if s <= max_running_requests]
    return sorted(set(sizes))


def padded(batch: int, max_bs: int, max_running_requests: int | None = None) -> int | None:
    """The captured size a decode batch of `batch` replays at, or None (runs eager)."""
    for s in capture_sizes(max_bs, max_running_requests):
        if s >= batch:
            return s
    return None


def default_max_bs(mem_gb: float | None, tp: int = 1,
                   max_running_requests: int | None = None) -> int:
    """SGLang's default decode `cuda_graph_max_bs` for a GPU with `mem_gb` (binary GB) of
    memory (reports/base/sglang_defaults.py: `default_decode_max_bs`)."""
    return default_decode_max_bs(None if mem_gb is None else gpu_mem_mib(mem_gb), tp,
                                 max_running_requests)
