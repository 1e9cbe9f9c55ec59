"""`stage_cost.json`: each pipeline stage's decode cost against its roofline floor
(`microbench/stage_cost/probe.py`; `--plan` records hold the floors only).

`stages[i].by_batch["8"]` is stage i's cost for a micro-batch of 8; `layers[kind]["8"]` one
layer of that kind (`moe_<backend>` per MoE backend timed, `moe` the fastest that passed its
check); `imbalance["8"]` the max/mean stage cost. Times in microseconds, bandwidth in GB/s
(GB = 1e9 bytes). Efficiency = floor / measured.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from reports.base.schema import between, ge, gt

# floor / measured passes 1 when a kernel beats the copy bandwidth the floor assumes (the
# shipped H200 run reaches 1.03 against its measured copy bandwidth) or by timer rounding; far
# above 1 means a wrong floor or a broken timer, so a record claiming it is rejected.
EFFICIENCY_MAX = 1.5


def eff_range(**kw):
    return between(0, EFFICIENCY_MAX, **kw)


@dataclass(frozen=True)
class StagePoint:
    """One stage at one micro-batch size: measured sum of its layers (None in a plan or where a
    layer failed), the floor, and the floor's parts."""
    floor_us: float = ge(0)
    weight_bytes: int = ge(0)
    kv_bytes: int = ge(0)
    flops: int = ge(0)
    measured_us: float | None = ge(0, default=None)
    efficiency: float | None = eff_range(default=None)
    components: dict[str, float | None] = ge(0, default_factory=dict)   # count x layer time
    floor_components_us: dict[str, float] = ge(0, default_factory=dict)
    floor_measured_bw_us: float | None = ge(0, default=None)   # floor at the copy bandwidth
    efficiency_measured_bw: float | None = eff_range(default=None)


@dataclass(frozen=True)
class StageCost:
    """A stage of `reports.base.partition.pp_partition` and its cost per batch size."""
    index: int = ge(0)
    first_layer: int = ge(0)
    num_layers: int = ge(0)
    embedding: bool = False
    lm_head: bool = False
    by_batch: dict[str, StagePoint] = field(default_factory=dict)


@dataclass(frozen=True)
class LayerPoint:
    """One layer kind at one batch size. A failed build or check leaves `error` and no times."""
    measured_us: float | None = ge(0, default=None)
    p20_us: float | None = ge(0, default=None)
    p80_us: float | None = ge(0, default=None)
    floor_us: float | None = ge(0, default=None)
    efficiency: float | None = eff_range(default=None)
    floor_measured_bw_us: float | None = ge(0, default=None)
    efficiency_measured_bw: float | None = eff_range(default=None)
    check_rel_err: float | None = ge(0, default=None)   # vs the float32 reference (first batch)
    distinct_experts: int | None = ge(0, default=None)  # MoE: routed experts touched
    experts_allocated: int | None = ge(0, default=None)
    backend: str | None = None                           # what ran, e.g. "triton/fast"
    backend_name: str | None = None                      # `moe`: the MOE_BACKENDS name chosen
    kernel: str | None = None                            # the kernel that ran, e.g. "triton/int4"
    timing: str | None = None                            # cuda_graph_replay | eager
    graph_copies: int | None = ge(1, default=None)       # calls per timing graph (per-call us)
    # what the SM clock did while this point was timed (NVML; microbench/kit/clocks.py)
    sm_clock_mhz: float | None = ge(0, default=None)     # median of the samples
    sm_clock_min_mhz: float | None = ge(0, default=None)
    sm_clock_max_mhz: float | None = ge(0, default=None)  # the board's max SM clock
    power_w_max: float | None = ge(0, default=None)
    clock_limits: str | None = None                      # e.g. "sw_power_cap"
    error: str | None = None


@dataclass(frozen=True)
class PrefillPoint:
    measured_us: float | None = ge(0, default=None)
    floor_us: float | None = ge(0, default=None)
    efficiency: float | None = eff_range(default=None)
    backend: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class Prefill:
    """One prefill chunk of `chunk_tokens`, eager, MoE and dense MLP layers only."""
    chunk_tokens: int = ge(1)
    timing: str = "eager"
    layers: dict[str, PrefillPoint] = field(default_factory=dict)
    note: str | None = None


@dataclass(frozen=True)
class Imbalance:
    """max / mean stage cost: measured (None unless every stage measured) and of the floors."""
    floor: float = ge(0)
    measured: float | None = ge(0, default=None)


@dataclass(frozen=True)
class RoutingPoint:
    """Routing skew at one (Zipf s, batch) (`reports.base.roofline.skew_spread`)."""
    distinct_experts: float = ge(0)                # exact formula
    distinct_experts_mc: float = ge(0)             # Monte-Carlo mean
    moe_bytes_per_token: float = ge(0)
    stage_bytes_mean: tuple[float, ...] = ge(0, default=())
    stage_bytes_p10: tuple[float, ...] = ge(0, default=())
    stage_bytes_p90: tuple[float, ...] = ge(0, default=())
    stage_spread_max_over_mean: float = ge(0, default=1.0)
    stage_spread_of_means: float = ge(0, default=1.0)
    # E[max] / max E - 1: >= 0 in exact arithmetic, a rounding below it in floats: no range
    slowest_stage_loss: float = 0.0


@dataclass(frozen=True)
class Routing:
    """`--plan` only: estimated routing skew under PP, by Zipf exponent then batch."""
    source: str
    draws: int = ge(1)
    experts: int = ge(0)
    top_k: int = ge(0)
    seed: int = 0
    by_zipf: dict[str, dict[str, RoutingPoint]] = field(default_factory=dict)


@dataclass(frozen=True)
class StageCostData:
    SCHEMA_VERSION: ClassVar[int] = 1
    model: str
    pp: int = ge(1)
    gpu: str                                       # spec sheet the floors use
    mem_bw_gbps: float = gt(0)                     # bandwidth the floors use
    gpu_source: str | None = None
    mem_bw_from: str = "spec sheet"                # spec sheet | measured (--mem-bw)
    moe_backends: tuple[str, ...] = ()
    dtype: str = "native"
    formats: dict[str, str] = field(default_factory=dict)   # weight format per component
    measured_formats: dict[str, str] | None = None          # what ran (bf16); None in a plan
    timing: str | None = None                      # cuda_graph_replay; None in a plan
    batches: tuple[int, ...] = ge(1, default=())
    context_len: int = ge(0, default=0)
    zipf_s: float = ge(0, default=0.0)
    experts_sample: int | None = ge(1, default=None)
    partition: str | None = None
    stages: tuple[StageCost, ...] = ()
    layers: dict[str, dict[str, LayerPoint]] = field(default_factory=dict)  # kind -> batch ->
    prefill: Prefill | None = None
    imbalance: dict[str, Imbalance] = field(default_factory=dict)           # batch ->
    notes: tuple[str, ...] = ()
    backend: str | None = None                     # MoE backend(s) the stage figures use
    moe_backend_by_batch: dict[str, str] = field(default_factory=dict)
    kernel_by_layer: dict[str, str | None] = field(default_factory=dict)  # layer kind -> kernel
    mem_bw_measured_gbps: float | None = ge(0, default=None)   # device-to-device copy
    routing: Routing | None = None
