"""report.json's one definition: frozen dataclasses for the report and each of its parts.

`reports/report_build.py` builds a `Report`; `Report.to_json()` is the file (keys in field
order, units in the names as everywhere: `_us`, `_ms`, `_pct`, `tok_per_s`); the renderers, the
terminal lines, `next_steps` and `compare` read its attributes, so a renamed field is an
AttributeError in every reader, not a silent `None`. `Report.from_json` reads a file back
(`--baseline`: possibly written by an older ppscope) with the record types' checks
(reports/base/schema.py), leniently: a key this version does not define is skipped, a part the
file lacks is None (or empty). A part that exists only with its evidence (dispatch.json,
topology.json, sglang.json, watch.json, a baseline, dispatch.trace.json) is `if_set`: the file
has its key only then. The parts computed elsewhere keep their own types (`Row`, `WhatIf`,
`Verdict`, `CauseRow`, ...): this module assembles them, it does not copy them.
Open-ended maps stay maps of typed values (`assumptions` by input name, `modelled_busy_pct` by
concurrency); `observed_deployment` (reports/model/observed/server.py: one entry per setting the
evidence names) and `watch` (reports/model/observed/watch_summary.py, rendered by watch_plot, which the
watch's own command shares) stay the JSON their modules write.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from reports.base.payloads.sglang import Dist, SlotImbalance
from reports.base.recipe_cost import RecipeCost
from reports.base.schema import Json, from_json, if_set, to_json
from reports.model.scenario.arrival import Alternatives
from reports.model.attribution import Row
from reports.model.observed.diagnose import DiagnosisFigures
from reports.model.observed.resample import WindowBlocks
from reports.model.scenario.implied import ImpliedEfficiency
from reports.model.scenario.inputs import Param
from reports.model.observed.server_log import DpFigures
from reports.model.observed.whatifs import ServerWhatIfs
from reports.model.checks.validate_dispatch import Check, MicroBatchChoice
from reports.model.verdicts import Verdict
from reports.model.settings_change import WhatIf

REPORT_SCHEMA = "ppscope-report/1"


@dataclass(frozen=True)
class ScenarioDeployment:
    """The deployment the scenario describes (what the model runs)."""
    model: str
    gpu: str
    pp: int
    async_depth: int
    max_micro_batch: int
    cuda_graphs: bool
    graph_max_bs: int
    arrival: str
    context_len: int
    memory: str | None          # HBM3e, GDDR7, ...: named by the GPU's datasheet line


@dataclass(frozen=True)
class Level:
    """Throughput at one concurrency: ideal, predicted (the model), observed (the user's)."""
    concurrency: int
    ideal_tok_per_s: float
    predicted: float
    observed: float | None
    predicted_tpot_ms: float
    busy_frac: tuple[float, ...]       # per stage
    slot_sizes: tuple[int, ...]        # per slot


@dataclass(frozen=True)
class AttributionAt:
    """The ideal -> modelled gap at one concurrency, split by cause (reports/model/attribution)."""
    concurrency: int
    ideal_tpot_ms: float
    modelled_tpot_ms: float
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class StageCostAt:
    """Per-stage forward cost at one micro-batch size: modelled and its balanced floor."""
    batch: int
    modelled_us: tuple[float, ...]
    floor_us: tuple[float, ...]


@dataclass(frozen=True)
class PipelineHop:
    src: int
    dst: int
    link: str | None
    hop_class: str | None


@dataclass(frozen=True)
class Hop:
    src: int
    dst: int
    batch: int
    hop_us: float
    link: str | None
    hop_class: str | None


@dataclass(frozen=True)
class TopologySummary:
    """topology.json as the report shows it (reports/model/observed/summaries.py `topology_summary`)."""
    gpus: tuple[str | None, ...]
    source: str                        # `measured`, or `given` for a pasted `topo -m`
    pasted: bool
    links: dict[str, str]              # "0-1" -> link type
    links_unknown: tuple[str, ...]
    pipeline_hops: tuple[PipelineHop, ...]
    notes: tuple[str, ...]
    hops: tuple[Hop, ...]              # measured, at the smallest batch per (src, dst)


@dataclass(frozen=True)
class ServerSources:
    """The file each group of the server's numbers came from (None: not given)."""
    log: str | None
    traces: str | None
    bench: str | None
    metrics: str | None


@dataclass(frozen=True)
class ServerRank:
    """One PP rank of the user's server: trace figures, log figures, the model's busy beside."""
    rank: int
    kernel_active_pct: float | None    # any kernel running, NCCL waits included: never "busy"
    compute_pct: float | None
    nccl_recv_pct: float | None
    recv_transfer_pct: float | None
    recv_wait_pct: float | None
    idle_pct: float | None
    dispatch_latency_p50_us: float | None
    cpu_dispatch_latency_p50_us: float | None
    graph_kernels: int | None
    eager_kernels: int | None
    trace_span_ms: float | None
    decode_lines: int | None
    prefill_lines: int | None
    cuda_graph_frac: float | None
    running_req: Dist | None
    gen_tok_per_s_median: float | None
    dp: tuple[DpFigures, ...]
    gen_tok_per_s_dp_sum: float | None
    modelled_busy_pct: dict[str, float]     # concurrency -> the model's busy % of this stage


@dataclass(frozen=True)
class ServerSlotImbalance(SlotImbalance):
    """The log's slot-imbalance index; with DP attention the PP rank's, pooled over DP ranks."""
    dp_ranks: int | None = if_set()


@dataclass(frozen=True)
class BenchRow:
    concurrency: int | None
    mean_concurrency: float | None
    output_tok_per_s: float | None
    mean_tpot_ms: float | None
    median_itl_ms: float | None
    mean_ttft_ms: float | None


@dataclass(frozen=True)
class BusyOverTime:
    bin_us: float
    busy_frac: tuple[float, ...]


@dataclass(frozen=True)
class ServerSummary:
    """The user's server as sglang.json saw it (reports/model/observed/summaries.py `server_summary`)."""
    evidence: str
    source: str
    sources: ServerSources
    ranks: tuple[ServerRank, ...]
    dp_ranks: int                       # DP ranks per PP rank in the log (0: none)
    dp_rules: str | None
    slot_imbalance: ServerSlotImbalance | None
    moe_kernel: dict[str, Json]
    moe_kernel_lines: tuple[str, ...]
    attention_backend: dict[str, Json]
    attention_lines: tuple[str, ...]
    bench: tuple[BenchRow, ...]
    busy_over_time: dict[str, BusyOverTime]     # by PP rank
    notes: tuple[str, ...]
    metrics_lines: tuple[str, ...] = ()   # the /metrics window (reports/model/observed/metrics_verdicts.py)


@dataclass(frozen=True)
class RecipeNote:
    """ppscope's recipe on a report that reads the server's log (report_build `recipe_note`):
    the flags the log's readings need, and what the lab measured them to cost the server
    (reports/base/recipe_cost.py, the record shipped as `record`); None: not measured."""
    flags: tuple[str, ...]
    record: str
    measured: RecipeCost | None = None


@dataclass(frozen=True)
class ModelledBenchRun:
    """The observed loop over bench_serving's whole run (report_build `_bench_run`)."""
    run_tok_per_s: float
    mean_in_flight: float
    prompts: int
    profiler_slowdown: float | None
    modelled_tok_per_s: float
    observed_tok_per_s: float | None
    unexplained_pct: float | None
    # from the slowdown's interval (profiler_cost.SlowdownReader.interval); None: none
    profiler_slowdown_ci: tuple[float, float] | None = None
    modelled_ci: tuple[float, float] | None = None
    unexplained_ci: tuple[float, float] | None = None


@dataclass(frozen=True)
class ObservedLoop:
    """The deployment the traces show (reports/model/observed/deployment.py `Deployment`), per rank."""
    pp: int
    slots: int
    sizes: tuple[int, ...]
    device: str
    host_us: tuple[float, ...]
    relay_us: tuple[float, ...]
    sync_wait_us: tuple[float, ...]
    send_wait_us: tuple[float, ...]
    hop_us: tuple[float, ...]
    graph_share: float | None
    empty_us: tuple[float, ...] | float | None   # per rank (a float: rank 0, older reports)
    forward_us: tuple[dict[str, float], ...]    # per rank: micro-batch size -> forward us
    sources: dict[str, str]
    notes: tuple[str, ...]
    shape: str
    # the rest of the deployment, so that a later run can split its change against this one
    # (reports/model/change_split.py); empty in a report written before they were kept
    forward_busy_us: tuple[dict[str, float], ...] = ()
    empty_relay_us: tuple[float, ...] = ()
    send_us: tuple[float, ...] = ()
    process_us: tuple[float, ...] = ()
    window_concurrency: float | None = None      # requests in flight in the traced window
    # the traced window's blocks, so that a later run's change gets its interval from both
    # windows (reports/model/observed/resample.py); None: none kept
    blocks: WindowBlocks | None = None


@dataclass(frozen=True)
class RankTimeSplit:
    """One rank's traced window: compute / transfer / wait / idle, % (diagnose.time_split_rows)."""
    rank: int
    compute_pct: float | None
    transfer_pct: float | None
    wait_pct: float | None
    comm_pct: float | None
    idle_pct: float | None


@dataclass(frozen=True)
class ServerInputs:
    """What the observed server was diagnosed from, at which concurrency (`ServerDiagnosis`'s
    first fields)."""
    status: Literal["ok"]
    concurrency: int
    concurrency_source: str
    bench_run: ModelledBenchRun | None
    observed_source: str | None
    deployment: ObservedLoop
    time_split: tuple[RankTimeSplit, ...]


@dataclass(frozen=True)
class ServerDiagnosis(DiagnosisFigures, ServerInputs):
    """The observed server diagnosed from its own evidence: the inputs it was read from
    (`ServerInputs`, its `concurrency` second), then reports/model/observed/diagnose.py's
    `DiagnosisFigures` (dataclass fields run from the last base to the first). The file has
    them flat, in this order; report_build fills them from the `Diagnosis` by name."""


@dataclass(frozen=True)
class NotDiagnosed:
    status: Literal["not diagnosed"]
    reason: str


@dataclass(frozen=True)
class ChangeRow:
    """One cause's ms per decode step in the baseline and now (reports/model/compare.py)."""
    cause: str
    label: str
    baseline_ms: float
    now_ms: float
    growth_ms: float
    share_of_change_pct: float | None
    growth_ci: tuple[float, ...] | None = None   # (lo, hi) ms at the comparison's level
    # the traced windows' noise alone; growth_ci adds the model's error measured in the lab
    # (reports/model/model_error.py), where there is a record of it
    growth_window_ci: tuple[float, ...] | None = None


@dataclass(frozen=True)
class ForwardRow:
    """One rank's forward at one micro-batch size, in the baseline and now (us)."""
    rank: int
    batch: int
    baseline_us: float
    now_us: float
    change_pct: float


@dataclass(frozen=True)
class Comparison:
    status: Literal["ok"]
    baseline: str
    kind: Literal["observed", "modelled"]
    baseline_step_ms: float
    step_ms: float
    change_pct: float
    rows: tuple[ChangeRow, ...]
    answer: str
    notes: tuple[str, ...]
    # per rank, the forward at the same micro-batch size then and now (contention, clocks or a
    # slower kernel show here as what they are)
    forward_rows: tuple[ForwardRow, ...] = ()
    # "shapley": the change split by one Shapley split over the causes that differ between the
    # two runs' loops; "difference": each side's own split, subtracted
    split: str = "difference"
    # how sure (reports/model/compare.py): the change's interval (% of the baseline step),
    # whether it excludes no change, the bench runs on each side (baseline, this run)
    interval_level: float | None = None
    change_ci: tuple[float, ...] | None = None
    significant: bool | None = None
    runs: tuple[int, ...] = ()
    # where the model's error added to the growths' intervals was measured ("": not added)
    model_error: str = ""


@dataclass(frozen=True)
class NotCompared:
    status: Literal["not compared"]
    baseline: str
    reason: str


@dataclass(frozen=True)
class Step:
    """One "Measure your server" step (reports/model/next_steps.py)."""
    why: str          # what evidence it adds, and which part of the report it decides
    commands: tuple[str, ...]


@dataclass(frozen=True)
class TimelineSummary:
    """Which point of dispatch.trace.json the measured timeline plots
    (reports/render/measured_timeline.py `MeasuredTimeline.summary`)."""
    file: str
    point: str
    concurrency: int | None
    slots: int | None
    rounds: int
    first_it: int | None
    forwards: int
    window_ms: float
    busy_frac_in_window: dict[str, float | None]     # by rank
    points: tuple[str, ...]


@dataclass(frozen=True)
class Report:
    """report.json. Fields in the file's key order; every part after `scenario` has a default
    so that a file written before a part existed still reads."""
    schema: Literal["ppscope-report/1"]
    scenario: str
    all_estimated: bool = False
    records_used: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    deployment: ScenarioDeployment | None = None
    arrival: Alternatives | None = None
    params: tuple[Param, ...] = ()
    assumptions: dict[str, str] = field(default_factory=dict)   # input -> what it assumes
    observed_source: str | None = None
    concurrency: tuple[Level, ...] = ()
    attribution: tuple[AttributionAt, ...] = ()
    verdicts: tuple[Verdict, ...] = ()
    what_ifs: tuple[WhatIf, ...] = ()            # the recommended row first
    objective: str = ""
    measured_concurrency: tuple[int, ...] = ()
    recommendation: WhatIf | None = None
    best_pair: WhatIf | None = None
    model_differs: tuple[str, ...] = ()
    stage_cost: tuple[StageCostAt, ...] = ()
    dispatch_validation: tuple[Check, ...] | None = if_set()
    dispatch_micro_batches: tuple[MicroBatchChoice, ...] | None = if_set()
    topology: TopologySummary | None = if_set()
    observed_deployment: dict[str, Json] | None = if_set()
    scenario_differs: str | None = if_set("observed_deployment")
    # the built-in scenario set aside (no --scenario, and it is not the traced server): why;
    # its sections then follow everything about the server (reports/scenario_aside.py)
    scenario_aside: str | None = if_set()
    server: ServerSummary | None = if_set()
    diagnosis: ServerDiagnosis | NotDiagnosed | None = if_set("server")
    server_whatifs: ServerWhatIfs | None = if_set()   # the settings tried on the traced loop
    watch: Json = if_set()
    baseline_comparison: Comparison | NotCompared | None = if_set()
    implied_efficiency: tuple[ImpliedEfficiency, ...] = ()
    measure_your_server: tuple[Step, ...] = ()
    answer: tuple[str, ...] = ()
    measured_timeline: tuple[TimelineSummary, ...] | None = if_set()
    # where the report reads the server's log: what ppscope's recipe costs (report_build)
    recipe: RecipeNote | None = if_set()

    def to_json(self) -> dict:
        """The report.json dict (tuples as lists, parts without evidence left out)."""
        return to_json(self)

    @staticmethod
    def from_json(d: dict, path: str = "report.json", *, strict: bool = False) -> Report:
        """A report.json read back; `strict`: a key this version does not define is an error
        (for files this version wrote). Raises SchemaError naming the field."""
        return from_json(Report, d, path, lax=not strict)

    @property
    def diagnosed(self) -> ServerDiagnosis | None:
        """The observed server's diagnosis when there is one (status ok)."""
        return self.diagnosis if isinstance(self.diagnosis, ServerDiagnosis) else None
