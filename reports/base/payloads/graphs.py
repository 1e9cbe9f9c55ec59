"""`graphs.json`: CUDA-graph replay vs eager launch per decoder layer, and SGLang's capture rule
(`microbench/graphs/probe.py`; `--plan` records hold the rule alone, every time null).

`by_batch[i]` is one micro-batch size: GPU time per layer eager and from a graph, the kernels
one eager layer launches, host time to enqueue it, and which path SGLang takes for that size
(`sglang_path`, `padded_to`, `padding_waste`). Times in microseconds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from reports.base.schema import between, ge


@dataclass(frozen=True)
class GraphPoint:
    batch: int = ge(1)
    sglang_path: Literal["graph", "eager"] = "graph"
    padded_to: int | None = ge(1, default=None)          # captured size replayed; None: eager
    padding_waste: float = between(0, 1, default=0.0)    # (padded - batch) / padded
    eager_us: float | None = ge(0, default=None)
    graph_us: float | None = ge(0, default=None)
    kernels_per_layer: int | None = ge(0, default=None)
    # (eager - graph) / kernels: negative when a replay is slower than eager, so no range
    launch_overhead_us_per_kernel: float | None = None
    cpu_launch_us: float | None = ge(0, default=None)    # host time to enqueue one eager layer
    cpu_replay_us: float | None = ge(0, default=None)    # host time to launch one replay
    moe_backend: str | None = None
    stage_graph_us: tuple[float, ...] = ge(0, default=())   # layer x count, per stage
    error: str | None = None


@dataclass(frozen=True)
class GraphsData:
    SCHEMA_VERSION: ClassVar[int] = 1
    model: str
    pp: int = ge(1)
    max_bs: int = ge(1)                                   # --cuda-graph-max-bs-decode
    capture_sizes: tuple[int, ...] = ge(1, default=())
    prefill_path: str = ""
    stage_layers: tuple[int, ...] = ge(0, default=())
    representative: str = ""                              # what one timed layer is
    user_batches: tuple[int, ...] = ge(1, default=())
    off_graph_user_batches: tuple[int, ...] = ge(1, default=())
    flags: tuple[str, ...] = ()
    by_batch: tuple[GraphPoint, ...] = ()
    notes: tuple[str, ...] = ()
