"""The one CUDA-graph capture routine of the probe kit (timing's `do_bench_graph`, the graphs
probe, the PP-loop probe's per-size graphs).

Why it looks like this: torch's CUDA-graph docs require the captured callable to have run on a
side stream first (lazy init, allocator warm-up, cuBLAS workspaces and Triton autotuning must
not happen during capture), and the capture stream to wait for that work. Graphs captured for
several batch sizes can share one memory `pool` (`torch.cuda.graph_pool_handle()`), capturing the
largest first, as SGLang does, so the smaller ones reuse its memory.
Imports torch inside the function: nothing here touches CUDA at import time.
"""
from __future__ import annotations

from typing import Any, Callable


def capture_graph(fn: Callable[[], Any], *, warmup: int = 3, pool=None) -> tuple[Any, Any]:
    """Run `fn` `warmup` times on a side stream, then capture one call into a CUDA graph
    (in `pool` if given). Returns (graph, what the captured call returned: its output tensors,
    which each replay overwrites in place). Synchronizes before and after the capture."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    torch.cuda.synchronize()
    return graph, out
