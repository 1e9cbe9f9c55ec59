"""`dispatch.json`: the PP-loop probe (`microbench/dispatch/probe.py`) on real GPUs.

One `PolicyRun` per (policy, arrival, concurrency) point, with one `StageRun` per rank. Times in
microseconds unless the name says otherwise; `busy_frac` is the GPU forward's share of the rank's
measured window (NCCL waits are not forward time).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from reports.base.schema import Json, between, ge


@dataclass(frozen=True)
class Quantiles:
    p50: float | None = ge(0, default=None)
    p99: float | None = ge(0, default=None)
    n: int = ge(0, default=0)


@dataclass(frozen=True)
class StageRun:
    rank: int = ge(0)
    busy_frac: float | None = between(0, 1.5, default=None)   # >1 only by timer rounding
    dispatch_latency_us: Quantiles = field(default_factory=Quantiles)
    wait_us_p50: float | None = ge(0, default=None)            # blocked on upstream input
    host_us_p50: float | None = None                           # CPU per slot visit, wait excluded
    host_empty_us_p50: float | None = None                     # empty slot: request-list relay
    host_busy_us_p50: float | None = None
    # CPU per phase of a non-empty visit (SGLang's order): get_next_batch_to_run, run_batch,
    # process_batch_result of the next slot; None from a probe without the phase split
    sched_us_p50: float | None = None
    launch_us_p50: float | None = None
    process_us_p50: float | None = None
    # CPU blocked committing earlier gloo sends (the peer had not posted its receive yet):
    # waiting, kept out of the host figures above; None from a probe that counted it as host
    commit_wait_us_p50: float | None = ge(0, default=None)
    gpu_us_p50: dict[str, float | None] = field(default_factory=dict)  # micro-batch size -> us
    send_us_p50: float | None = ge(0, default=None)
    iterations: int = ge(0, default=0)
    busy_frac_series: tuple[Json, ...] = ()                    # [{t_ms, busy_frac}] for plots

    def gpu_us_at(self, b: int) -> float | None:
        return self.gpu_us_p50.get(str(b))


@dataclass(frozen=True)
class PolicyRun:
    policy: str
    arrival: str
    concurrency: int = ge(1)
    tok_per_s: float | None = ge(0, default=None)
    tpot_ms: float | None = ge(0, default=None)
    slot_sizes: tuple[int, ...] = ge(0, default=())
    admitted: int | None = ge(0, default=None)
    window_s: float = ge(0, default=0.0)
    decode_tokens: int = ge(0, default=0)
    stages: tuple[StageRun, ...] = ()
    injected: tuple[str, ...] = ()          # faults switched on for this point (--inject)


@dataclass(frozen=True)
class PolicyComparison:
    arrival: str
    concurrency: int = ge(1)
    ratio: float = ge(0)
    sglang_tok_per_s: float = ge(0)
    even_tok_per_s: float = ge(0)
    sglang_slot_sizes: tuple[int, ...] = ()
    even_slot_sizes: tuple[int, ...] = ()
    why_not: str | None = None


@dataclass(frozen=True)
class HopStat:
    p50_us: float | None = None
    p10_us: float | None = None
    n: int = ge(0, default=0)


@dataclass(frozen=True)
class HopInLoop(HopStat):
    by_hop: dict[str, HopStat] = field(default_factory=dict)


@dataclass(frozen=True)
class DispatchSettings:
    pp: int = ge(1)
    async_depth: int = ge(0)
    slots: int = ge(1)
    max_micro_batch: int = ge(1)
    micro_batches: int | None = ge(1, default=None)
    work: str = "moe"
    moe_variant: str | None = None
    moe_backend: str | None = None
    layers_per_stage: int = ge(0, default=0)
    model: str = ""
    dtype: str = "bf16"
    graphs: bool = True
    nccl_p2p_disabled: bool = False
    prompt_len: int = ge(0, default=0)
    cost_points_us: tuple[tuple[int, float], ...] = ()
    capture_sizes: tuple[int, ...] = ()
    inject: tuple[str, ...] = ()            # --inject specs, as given
    max_running_requests: int | None = ge(1, default=None)
    chunked_prefill_size: int | None = None  # prefill token budget per visit; None/<=0: off


@dataclass(frozen=True)
class DispatchData:
    SCHEMA_VERSION: ClassVar[int] = 2
    config: DispatchSettings
    runs: tuple[PolicyRun, ...] = ()
    even_vs_sglang: tuple[PolicyComparison, ...] = ()
    hop_us_in_loop: float | None = None
    hop_detail: tuple[HopInLoop, ...] = ()
    ranks: dict[str, Json] = field(default_factory=dict)     # per-rank kernel choice, notes
    devices: dict[str, str | None] = field(default_factory=dict)
    profile_dir: str | None = None          # per-rank Kineto traces + SGLang-format logs
