"""`sglang.json`: a real server's own evidence, read by `ppscope sglang` (microbench/sglang/).

Parts, each None/empty when its evidence was not given: `ranks` + `log` (the scheduler log, per
PP rank), `slot_imbalance`, `bench` + `bench_source` (bench_serving runs), `traces` (per-rank
Kineto aggregates, microbench/sglang/trace.py), `loop` (the per-iteration loop profile the
diagnosis models, microbench/sglang/steps.py), `metrics` and `live` (display only: typed as
`Json`, nothing computes on them), `metrics_window` (two /metrics scrapes per PP rank, the
verdicts read it: reports/model/observed/metrics_verdicts.py). Times in microseconds unless the name says otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from reports.base.payloads.dispatch import Quantiles as Latency  # {p50, p99, n}: one shape
from reports.base.schema import Json, between, ge


@dataclass(frozen=True)
class Dist:
    min: float | None = None
    median: float | None = None
    max: float | None = None


@dataclass(frozen=True)
class SlotImbalance:
    window: int = ge(1)
    windows: int = ge(0)
    max_over_mean_median: float | None = ge(0, default=None)
    cv: float | None = ge(0, default=None)
    rank: int | None = None
    dp: int | None = None                          # DP attention: the DP rank of the index


@dataclass(frozen=True)
class PrefillWave:
    """One prefill line of a PP rank, in clock order (microbench/sglang/log.py `_waves`): how
    many waiting requests that prefill admitted, i.e. how a burst of arrivals was split."""
    t_s: float | None = None                   # log clock, seconds since the epoch (as UTC)
    new_seq: int = ge(0, default=0)            # #new-seq: requests admitted
    new_token: int = ge(0, default=0)
    cached_token: int | None = ge(0, default=None)
    running_req: int | None = ge(0, default=None)   # None: not logged (disaggregated prefill)
    queue_req: int = ge(0, default=0)


@dataclass(frozen=True)
class LogRank:
    decode_lines: int = ge(0)
    prefill_lines: int = ge(0, default=0)
    running_req: Dist = field(default_factory=Dist)
    cuda_graph_frac: float | None = between(0, 1, default=None)
    graph_device: str | None = None                # `{device} graph: B`'s label: cuda, cpu
    gen_throughput_tok_s: Dist = field(default_factory=Dist)
    queue_req: Dist = field(default_factory=Dist)
    prefill_new_tokens: int = ge(0, default=0)
    prefill_new_seq_total: int = ge(0, default=0)  # requests admitted by prefills
    prefill_cached_tokens: int = ge(0, default=0)
    prefill_new_seq_hist: dict[str, int] = ge(0, default_factory=dict)  # #new-seq -> prefills
    prefill_waves: tuple[PrefillWave, ...] = ()    # the first PREFILL_WAVES (64) prefill lines
    dp_ranks: tuple[Json, ...] = ()
    span_s: float | None = ge(0, default=None)
    slot_imbalance: SlotImbalance | None = None
    over_time: tuple[Json, ...] = ()              # [{t_s, lines, ...}] for plots
    # DP attention: each DP rank's own figures (the same shape, without dp_ranks / over_time /
    # by_dp); the rank's own figures above pool every DP rank's lines (microbench/sglang/log.py)
    by_dp: dict[str, LogRank] = field(default_factory=dict)


@dataclass(frozen=True)
class LogServerArgs:
    """The `server_args=` start-up line's settings (microbench/sglang/log.py `ServerArgs`);
    None: not in the line (max_running_requests etc.: SGLang chose at start-up)."""
    form: str = "dict"                             # "dict" (0.5.23) | "ServerArgs(...)"
    pp_size: int | None = ge(1, default=None)
    tp_size: int | None = ge(1, default=None)
    device: str | None = None
    attention_backend: str | None = None
    disable_cuda_graph: bool | None = None
    decode_graph_backend: str | None = None        # cuda_graph_config['decode']['backend']
    cuda_graph_max_bs: int | None = ge(0, default=None)
    enable_torch_compile: bool | None = None
    pp_async_batch_depth: int | None = ge(0, default=None)
    pp_max_micro_batch_size: int | None = ge(1, default=None)
    max_running_requests: int | None = ge(1, default=None)
    chunked_prefill_size: int | None = None        # -1 or 0: chunked prefill off
    max_prefill_tokens: int | None = ge(1, default=None)


@dataclass(frozen=True)
class GraphSetting:
    """Decode graphs off BY SETTING (True, with SGLang's reasons), left on (False: a decode
    line off the graph path is a real fallback), or not said (None): log.py `graph_setting`."""
    off_by_setting: bool | None = None
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class ConfigOverride:
    """A setting changed at run time (POST /set_internal_state): log.py `config_overrides`."""
    t_s: float | None = None                       # log clock, seconds since the epoch (as UTC)
    clock: str | None = None                       # as logged
    ranks: tuple[int, ...] = ()                    # PP ranks whose scheduler logged it
    overrides: dict[str, Json] = field(default_factory=dict)
    text: str = ""                                 # the dict as logged


@dataclass(frozen=True)
class LogSummary:
    log_files: tuple[str, ...] = ()
    lines_total: int = ge(0, default=0)
    lines_batch: int = ge(0, default=0)
    lines_other: int = ge(0, default=0)
    lines_unrecognised: int = ge(0, default=0)
    lines_other_tp: int = ge(0, default=0)
    files_without_batch_lines: tuple[str, ...] = ()
    server_settings: dict[str, int | float | str] = field(default_factory=dict)  # start-up line
    moe_kernel: dict[str, str] = field(default_factory=dict)   # start-up lines (log.py)
    attention_backend: dict[str, str] = field(default_factory=dict)   # start-up lines (log.py)
    server_args: LogServerArgs | None = None       # the server_args= start-up line
    graph_setting: GraphSetting = field(default_factory=GraphSetting)
    config_overrides: tuple[ConfigOverride, ...] = ()


@dataclass(frozen=True)
class BenchServerInfo:
    """The server's settings as bench_serving saw them: a summary of the `server_info` it wrote
    beside each run (the server's GET /server_info), not the whole dict. Each is the server
    argument; one left to SGLang (null) is the value the server resolved, where server_info
    carries it, and is named in `resolved` (reports/base/bench_serving.py `_server_info`)."""
    version: str | None = None                    # SGLang's, as the server reports it
    model: str | None = None                      # model_path, base name only
    device: str | None = None
    pp_size: int | None = ge(1, default=None)
    tp_size: int | None = ge(1, default=None)
    dp_size: int | None = ge(1, default=None)
    pp_async_batch_depth: int | None = ge(0, default=None)
    pp_max_micro_batch_size: int | None = ge(1, default=None)
    max_running_requests: int | None = ge(1, default=None)
    chunked_prefill_size: int | None = None       # -1 or 0: chunked prefill off
    max_prefill_tokens: int | None = ge(1, default=None)
    attention_backend: str | None = None
    disable_cuda_graph: bool | None = None
    cuda_graph_max_bs: int | None = ge(0, default=None)
    resolved: tuple[str, ...] = ()


@dataclass(frozen=True)
class BenchRun:
    max_concurrency: int | None = ge(1, default=None)
    completed: int | None = ge(0, default=None)
    duration: float | None = ge(0, default=None)
    output_throughput: float | None = ge(0, default=None)
    total_throughput: float | None = ge(0, default=None)
    request_throughput: float | None = ge(0, default=None)
    mean_ttft_ms: float | None = ge(0, default=None)
    median_ttft_ms: float | None = ge(0, default=None)
    p99_ttft_ms: float | None = ge(0, default=None)
    mean_tpot_ms: float | None = ge(0, default=None)
    median_tpot_ms: float | None = ge(0, default=None)
    p99_tpot_ms: float | None = ge(0, default=None)
    mean_itl_ms: float | None = ge(0, default=None)
    median_itl_ms: float | None = ge(0, default=None)
    p95_itl_ms: float | None = ge(0, default=None)
    p99_itl_ms: float | None = ge(0, default=None)
    max_itl_ms: float | None = ge(0, default=None)
    mean_e2e_latency_ms: float | None = ge(0, default=None)
    median_e2e_latency_ms: float | None = ge(0, default=None)
    request_rate: float | str | None = None       # bench_serving writes "inf" when unpaced
    backend: str | None = None
    total_output_tokens: int | None = ge(0, default=None)
    mean_concurrency: float | None = ge(0, default=None)
    concurrency: float | None = ge(0, default=None)
    concurrency_from: str | None = None           # max_concurrency | measured
    # the most requests in flight in any 1 s bucket (bench_serving's max_concurrent_requests;
    # may exceed max_concurrency: a request is counted in every second it touches)
    peak_concurrency: int | None = ge(0, default=None)
    peak_output_throughput: float | None = ge(0, default=None)   # best 1 s bucket, tok/s
    total_input_tokens: int | None = ge(0, default=None)
    mean_input_len: float | None = ge(0, default=None)     # total_input_tokens / completed
    mean_output_len: float | None = ge(0, default=None)    # total_output_tokens / completed
    dataset_name: str | None = None
    random_input_len: int | None = ge(0, default=None)     # requested (random datasets only)
    random_output_len: int | None = ge(0, default=None)
    random_range_ratio: float | None = ge(0, default=None)
    server_info: BenchServerInfo | None = None


@dataclass(frozen=True)
class BenchSource:
    file: str
    format: str
    lines_unrecognised: int = ge(0, default=0)


@dataclass(frozen=True)
class NcclRecv:
    kernels: int = ge(0, default=0)
    total_us: float = ge(0, default=0.0)
    bytes: int = ge(0, default=0)
    link_gbps: float | None = ge(0, default=None)
    transfer_us: float | None = ge(0, default=None)
    wait_us: float | None = ge(0, default=None)


@dataclass(frozen=True)
class TraceRank:
    """One rank's trace, aggregated (microbench/sglang/trace.py). `busy_us` counts any GPU
    event (an NCCL receive that waits included): read compute / transfer / wait, not busy."""
    events: int = ge(0, default=0)
    events_unrecognised: int = ge(0, default=0)
    gpu_events: int = ge(0, default=0)
    span_us: float = ge(0, default=0.0)
    busy_us: float = ge(0, default=0.0)
    idle_us: float = ge(0, default=0.0)
    busy_frac: float | None = between(0, 1, default=None)
    reason: str | None = None
    gpu_events_last_step_dropped: int = ge(0, default=0)
    compute_us: float | None = ge(0, default=None)
    non_compute_us: float | None = ge(0, default=None)
    comm_us: float | None = ge(0, default=None)
    busy_frac_over_time: tuple[float, ...] = between(0, 1, default=())
    bin_us: float | None = ge(0, default=None)
    idle_split_us: dict[str, float] = field(default_factory=dict)
    idle_split_by_stream: Json = None               # per stream, for display
    idle_split_compute_stream_us: Json = None
    kernel_wait_threshold_us: float | None = ge(0, default=None)
    graph_kernels: int | None = ge(0, default=None)
    graph_kernel_us: float | None = ge(0, default=None)
    eager_kernels: int | None = ge(0, default=None)
    graph_launches: int | None = ge(0, default=None)
    nccl_recv: NcclRecv = field(default_factory=NcclRecv)
    dispatch_latency_us: Latency = field(default_factory=Latency)
    cpu_dispatch_latency_us: Latency = field(default_factory=Latency)
    scheduler_ranges_us: Json = None                # {range: {count, total_us}}, for display
    user_annotations_us: Json = None
    file: str | None = None
    # how the events were read (microbench/sglang/trace.py RULES_*), and what was left out
    rules: dict[str, Json] = field(default_factory=dict)
    sync_events_excluded: int = ge(0, default=0)
    sync_excluded_us: float = ge(0, default=0.0)
    gpu_events_without_launch: int = ge(0, default=0)
    gpu_events_without_launch_dropped: int = ge(0, default=0)
    events_without_dur: int = ge(0, default=0)
    events_bad_time: int = ge(0, default=0)
    events_duplicate: int = ge(0, default=0)        # the same event twice: counted once
    events_malformed: int = ge(0, default=0)        # not objects, stream/correlation not an int
    nccl_recv_size_unknown: int = ge(0, default=0)  # receives kept with 0 bytes
    warnings: tuple[str, ...] = ()
    # which server, rank and time the trace is of (microbench/sglang/evidence.py checks them)
    window_unix_s: tuple[float, ...] = ()           # first event start, last event end
    device: str | None = None                       # deviceProperties' first GPU name
    dist_rank: int | None = None                    # distributedInfo.rank (the global rank)
    world_size: int | None = None
    pp_group: tuple[int, ...] | None = None         # the global ranks of its PP group
    name_tp: int | None = None                      # -TP-{t} of the file name
    clock_offset_us: float | None = None            # this rank's clock against rank 0's


@dataclass(frozen=True)
class Traces:
    dir: str
    ranks: dict[str, TraceRank] = field(default_factory=dict)
    files_skipped: tuple[str, ...] = ()     # other TP ranks, prefill-stage files, merged traces
    clock: Json = None      # clock offsets between ranks, estimated (microbench/sglang/evidence.py)


@dataclass(frozen=True)
class TimeSplit:
    window_us: float = ge(0)
    compute_us: float = ge(0)
    comm_us: float = ge(0)
    other_us: float = ge(0)
    idle_us: float = ge(0)
    comm_transfer_us: float | None = ge(0, default=None)
    comm_wait_us: float | None = ge(0, default=None)


@dataclass(frozen=True)
class LoopRank:
    """One rank of the loop profile (microbench/sglang/steps.py); `*_mean` feed the model."""
    rank: int | None = None
    events_without_dur: int = ge(0, default=0)
    reason: str | None = None
    time_split: TimeSplit | None = None
    forwards: int = ge(0, default=0)
    graph_forwards: int = ge(0, default=0)
    forward_us_by_batch: dict[str, float | None] = field(default_factory=dict)
    forward_busy_us_by_batch: dict[str, float | None] = field(default_factory=dict)
    forward_effective_us_by_batch: dict[str, float | None] = field(default_factory=dict)
    forward_count_by_batch: dict[str, int] = field(default_factory=dict)
    # the decode forwards of the rounds that held the most requests (the server full, the
    # window's ramp and tail left out; CPU view, microbench/sglang/cpu_steps.full_rounds)
    forward_count_full_by_batch: dict[str, int] = field(default_factory=dict)
    forward_us_p50: float | None = ge(0, default=None)
    iterations: int = ge(0, default=0)
    iterations_empty: int = ge(0, default=0)
    range_counts: dict[str, int] = field(default_factory=dict)
    host_us_p50: float | None = ge(0, default=None)
    host_us_mean: float | None = ge(0, default=None)
    host_us_empty_p50: float | None = ge(0, default=None)
    host_us_empty_mean: float | None = ge(0, default=None)
    # the phases SGLang runs on every visit, batch or not (recv_requests,
    # send_reqs_to_next_stage, get_next_batch_to_run; CPU view): on visits with a decode
    # forward, and on empty visits (microbench/sglang/cpu_steps.py EVERY_VISIT)
    host_us_every_visit_mean: float | None = ge(0, default=None)
    host_us_every_visit_empty_mean: float | None = ge(0, default=None)
    relay_wait_us_mean: float | None = ge(0, default=None)
    relay_wait_us_empty_mean: float | None = ge(0, default=None)
    sync_wait_us_mean: float | None = ge(0, default=None)
    send_wait_us_mean: float | None = ge(0, default=None)
    foreign_queue_us_mean: float | None = ge(0, default=None)
    recv_bytes_p50: float | None = ge(0, default=None)
    # SGLang's CPU backend (microbench/sglang/cpu_steps.py): the forward runs on the CPU
    device: str | None = None
    prefill_forwards: int = ge(0, default=0)
    send_us_mean: float | None = ge(0, default=None)          # hidden-state send, sender's CPU
    process_us_mean: float | None = ge(0, default=None)       # process_batch_result (CPU view)
    iteration_us_mean: float | None = ge(0, default=None)     # an iteration with a decode forward
    wait_us_mean: dict[str, float | None] = field(default_factory=dict)   # blocked, by kind
    iterations_idle: int = ge(0, default=0)   # in passes SGLang marked idle (no request at all)
    slots: int | None = ge(1, default=None)   # pp_loop_size, from SGLang's idle-pass markers
    batch_source: str | None = None   # "step spans" (SGLang's step[... bs=N]) or NCCL sizes
    batch_nccl_disagree: int = ge(0, default=0)   # forwards whose receive held fewer rows
    # the input's receives one tensor at a time (sgl-project/sglang#19582) and the CPU
    # metadata messages per iteration (#18715), CPU view (microbench/sglang/cpu_steps.py)
    input_recvs_per_forward: float | None = ge(0, default=None)
    input_wait_per_recv_us_mean: float | None = ge(0, default=None)
    metadata_recvs_per_iteration: float | None = ge(0, default=None)
    metadata_wait_us_per_iteration: float | None = ge(0, default=None)
    # a window profiled with stacks (CPU view): the rank's decoder layers per decode forward
    # and one layer's mean time by micro-batch size (microbench/sglang/cpu_steps.py)
    layers_per_forward: int | None = ge(1, default=None)
    layer_us_by_batch: dict[str, float | None] = field(default_factory=dict)
    # the traced window in blocks of equal wall time (microbench/sglang/window_blocks.py):
    # quantity -> [sum, samples] per block, for the report's block bootstrap; {}: too short
    # or read by an older version
    blocks: dict[str, tuple[tuple[float, int], ...]] = field(default_factory=dict)

    def curve(self, name: str, cmax: int | None) -> dict[int, float]:
        """A by-batch dict as {batch: us}: decode sizes only (a prefill forward has
        prompt-length rows; key 0 = size unknown)."""
        out = {}
        for k, v in getattr(self, name).items():
            b = int(k) if str(k).isdigit() else 0
            if v is not None and b > 0 and (cmax is None or b <= cmax):
                out[b] = float(v)
        return out


@dataclass(frozen=True)
class LoopHop:
    p50_us: float | None = ge(0, default=None)
    mean_us: float | None = ge(0, default=None)
    n: int = ge(0, default=0)
    blocks: tuple[tuple[float, int], ...] = ()   # [sum, samples] per block of the window


@dataclass(frozen=True)
class ArrivalBurst:
    """Prefill lines of rank 0 with no decode line between them (microbench/sglang/
    arrival_bursts.py): how one burst of arrivals was split into micro-batches. `waves`:
    [#new-seq, #running-req of the slot it joined] per prefill, in log order."""
    waves: tuple[tuple[int, int], ...] = ()
    requests: int = ge(0, default=0)


@dataclass(frozen=True)
class LoopForward:
    """One traced forward of one rank (microbench/sglang/forward_window.py): `visit` = the
    rank's loop iteration (SGLang visits its `pp_loop_size` slots round-robin, one per
    iteration), `batch` = requests in it (SGLang's step[MODE bs=N]; None: unknown), `mode`
    DECODE / EXTEND; times from the kept window's first forward, one clock for every rank."""
    rank: int = ge(0)
    visit: int = ge(0)
    batch: int | None = ge(0, default=None)
    mode: str | None = None
    start_us: float = ge(0, default=0.0)
    end_us: float = ge(0, default=0.0)


@dataclass(frozen=True)
class LoopProfile:
    ranks: dict[str, LoopRank] = field(default_factory=dict)
    hops: dict[str, LoopHop] = field(default_factory=dict)
    concurrency: int | None = ge(1, default=None)   # client streams while traced (given)
    model: str | None = None
    link_gbps: float | None = ge(0, default=None)
    device: str | None = None       # "cpu": SGLang's CPU backend traced (no GPU events)
    pathologies: tuple[str, ...] = ()   # PP pathologies of SGLang's issues the traces show
    concurrency_from: str | None = None   # where `concurrency` came from (flag, bench, live)
    # the traced window's visits against the rest of the logged run: how much slower the
    # profiler made the loop it measured (microbench/sglang/profiler_cost.py); None: no log
    profiler_slowdown: float | None = ge(0, default=None)
    # its interval (profiler_cost.SlowdownReader.interval, at the diagnosis' level); None: none
    profiler_slowdown_ci: tuple[float, float] | None = None
    # the log's bursts of admission outside the traced window, in log order: how the
    # benchmark's arrivals were split into micro-batches (the traced window is its own run)
    bursts: tuple[ArrivalBurst, ...] = ()
    # a few rounds of every rank's forwards from the middle of the traced window, to draw the
    # loop as it ran (reports/render/observed_herd.py); capped, so the record stays small
    forwards: tuple[LoopForward, ...] = ()
    # how many blocks of the window each rank's and hop's `blocks` hold (0: none)
    block_count: int = ge(0, default=0)
    # the served model's decoder layers (`ppscope sglang --model`: a preset or its config.json)
    # and the server's SGLANG_PP_LAYER_PARTITION where it was set (`--layer-partition`): with
    # SGLang's own rule they give the layers each rank runs (reports/base/partition.py)
    num_layers: int | None = ge(1, default=None)
    layer_partition: str | None = None


@dataclass(frozen=True)
class MetricsRank:
    """One PP rank over a /metrics window (microbench/sglang/metrics_window.py): the counters'
    increase between the two scrapes, the gauges at the second. Seconds of wall time."""
    stage_s: dict[str, float] = ge(0, default_factory=dict)   # scheduler stage category -> s
    idle_s: float | None = ge(0, default=None)                # scheduler_idle_seconds_total
    decode_passes: float = ge(0, default=0.0)                 # cuda_graph_passes_total decode_*
    decode_graph_passes: float = ge(0, default=0.0)           # ... mode="decode_cuda_graph"
    fwd_occupancy_pct: float | None = between(0, 100, default=None)   # None: absent or NaN
    fwd_occupancy_nan: bool = False                           # the gauge read NaN
    graphs_captured: bool | None = None    # graph_memory_usage_gb{phase="decode"} > 0


@dataclass(frozen=True)
class MetricsWindow:
    """Two /metrics scrapes of one server and their differences, per PP rank; with one scrape
    the window is the server's life so far (`scrapes` 1)."""
    source: str
    scrapes: int = between(1, 2)
    seconds: float | None = ge(0, default=None)    # between the scrapes, when known
    ranks: dict[str, MetricsRank] = field(default_factory=dict)
    graph_capture_s: float | None = ge(0, default=None)   # startup_cuda_graph_time_seconds decode
    # what the reader said of the scrapes: an export's window cut to where every series has
    # samples, NaN samples skipped, idle time beyond the window (metrics_window.py)
    caveats: tuple[str, ...] = ()


@dataclass(frozen=True)
class SglangData:
    SCHEMA_VERSION: ClassVar[int] = 1
    ranks: dict[str, LogRank] = field(default_factory=dict)
    slot_imbalance: SlotImbalance | None = None
    bench: tuple[BenchRun, ...] = ()
    bench_source: BenchSource | None = None
    traces: Traces | None = None
    loop: LoopProfile | None = None
    log: LogSummary | None = None
    metrics: Json = None            # /metrics summary (microbench/sglang/metrics.py), display only
    live: Json = None               # live probe runs (microbench/sglang/live.py), display only
    metrics_window: MetricsWindow | None = None   # the window the report diagnoses from
    # part (log, traces, metrics, bench, live) -> when it was read (UTC): successive `ppscope
    # sglang` runs accumulate, each replacing only the parts of the sources it read
    sources: dict[str, str] = field(default_factory=dict)
