"""Scenario + records in results/ -> the pipeline model's inputs, each labelled with its source.

A scenario (`configs/scenarios/<name>.json`, read and checked by reports/model/scenario/file.py)
says what is deployed (model, GPU, pp, async depth, graphs, arrival, and any server setting the
launch command gives: max running requests, pp_max_micro_batch_size, chunked prefill size,
cuda-graph max bs, layer partition) and the workload (prompt and output length) plus stated
estimates for what no probe has measured. Sources: a setting the user gave is `given` (a
scenario key without an `assumptions` entry of the same name); one the scenario assumes (it has
an `assumptions` entry) or that SGLang derives by its own rule from an estimate is `estimated`;
numbers read from the user's server log are `observed`; probe records are `measured`.

Server settings not given take SGLang's defaults (reports/base/sglang_defaults.py): chunked
prefill and graph max bs by GPU memory; `max_running_requests` from the server log's start-up
line (sglang.json, `server_settings`) when it has one, else SGLang's KV-capacity rule on
estimated weights and memory; the per-slot cap `max_running_requests // pp` from that
(reports/base/server_settings.py, which `Inputs.server` is).
Records in `results/` replace estimates where they exist:

| input | measured from | else (estimated) |
|---|---|---|
| stage cost vs micro-batch | stage_cost.json (measured_us / roofline floor = efficiency) | roofline floor / efficiency curve |
| hidden-state hop | topology.json `hops[].hop_us` by batch | fixed + bytes / PCIe bandwidth |
| host dispatch per slot | dispatch.json `stages[].host_us_p50` | scenario estimate |
| eager (graph fallback) cost | graphs.json `eager_us - graph_us` | scenario estimate |

A record that is not `ok`, has another schema version, is another probe's record or holds
data its probe's schema does not have, or was made for another pp/model is skipped or used
with a warning (`Inputs.warnings`); a corrupt record (not JSON) is a one-line CliError.
Nothing here is fitted to the observed numbers.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from reports.base.bench_serving import observed_points
from reports.model.scenario.arrival import arrival_from_log
from reports.base.errors import CliError
from reports.base.gpu_specs import GpuSpec, load_gpu, match_gpu
from reports.base.model_config import ModelConfig, load_model
from reports.base.partition import pp_partition
from reports.base.paths import CONFIGS
from reports.base.probes import NAMES
from reports.base.records import (SCHEMA_VERSION, PayloadError, Record, RecordError,
                                  payload_class, read_record)
from reports.base.sglang_defaults import (MAX_PREFILL_TOKENS, SGLANG_VERSION,
                                          default_chunked_prefill_size, default_decode_max_bs,
                                          estimate_kv, gpu_mem_mib)
from reports.base.server_flags import GRAPH_MAX_BS_FLAG
from reports.base.server_settings import ServerSettings, SettingsNames
from reports.model.scenario.file import (MAX_CONCURRENCY, Scenario, load_scenario,  # noqa: F401
                                         read_scenario)   # load_scenario: the CLI's entry

# Workload defaults when the scenario does not say: sglang.bench_serving's random dataset
# (SGLang 0.5.23 benchmark/serving.py: --random-input-len 1024, --random-output-len 1024).
DEFAULT_PROMPT_LEN = 1024
DEFAULT_OUTPUT_LEN = 1024

PROBES = NAMES   # the records read from results/ (reports/base/probes.py)


@dataclass(frozen=True)
class Param:
    """One model input and where it came from."""
    name: str
    value: Any
    source: str          # measured | estimated | observed | given
    evidence: str        # record file or config file
    note: str = ""


@dataclass(frozen=True)
class Inputs(SettingsNames):
    """The pipeline model's inputs: the server's settings (`server`), the workload, the costs
    per stage, hop and host, each with its source in `params`."""
    name: str
    model: ModelConfig
    gpu: GpuSpec
    server: ServerSettings          # resolved: the cap and max_running_requests are known
    layer_partition: str | None
    arrival: str
    mean_context_tokens: int        # mean tokens in a decoding request's KV cache
    concurrency: tuple[int, ...]
    observed: tuple[tuple[int, float], ...]
    eff_curve: tuple[tuple[int, float], ...]          # (batch, efficiency), all stages
    stage_eff: tuple[tuple[tuple[int, float], ...], ...] = ()  # measured, per stage
    eager_curve: tuple[tuple[int, float], ...] = ((1, 0.0),)   # (batch, us per layer)
    hop_curve: tuple[tuple[int, float], ...] | None = None     # measured (batch, us)
    hop_fixed_us: float = 0.0
    host_us: float = 0.0
    empty_us: float = 0.0
    chain_us: float = 0.0
    zipf_s: float = 0.0
    launch_us: float = 0.0
    process_us: float = 0.0
    prompt_len: int = DEFAULT_PROMPT_LEN
    output_len: int = DEFAULT_OUTPUT_LEN
    range_ratio: float = 1.0
    params: tuple[Param, ...] = ()
    warnings: tuple[str, ...] = ()
    records: tuple[str, ...] = ()                     # record files used
    assumptions: tuple[tuple[str, str], ...] = ()

    # the server's settings under the names the model and the report read (pp, async_depth
    # and graphs from SettingsNames)
    @property
    def slots(self) -> int:
        return self.server.slots

    @property
    def max_micro_batch(self) -> int:
        return int(self.server.max_micro_batch)

    @property
    def max_running_requests(self) -> int | None:
        return self.server.max_running_requests

    @property
    def chunked_prefill_size(self) -> int | None:
        return self.server.chunked_prefill_size

    @property
    def max_prefill_tokens(self) -> int:
        return self.server.max_prefill_tokens

    @property
    def graph_max_bs(self) -> int:
        return int(self.server.cuda_graph_max_bs)

    @property
    def tp(self) -> int:
        return self.server.tp_size

    @property
    def context_len(self) -> int:
        """`mean_context_tokens` under the report's older name."""
        return self.mean_context_tokens

    @property
    def all_estimated(self) -> bool:
        """No measured model input (sglang.json is observed evidence, not a model input)."""
        return not any(r != "sglang.json" and not r.startswith("configs/")
                       for r in self.records)

    def src(self, key: str) -> tuple[str, str]:
        """(measured|transferred|estimated|observed|given, evidence) for a model input key."""
        for p in self.params:
            if p.name == key:
                return p.source, p.evidence
        return "estimated", "scenario"


def load_records(results: Path) -> tuple[dict[str, Record], list[str]]:
    """ok records by probe + warnings for the ones skipped. Corrupt -> CliError (one line)."""
    recs: dict[str, Record] = {}
    warn: list[str] = []
    for probe in PROBES:
        path = Path(results) / f"{probe}.json"
        if not path.exists():
            continue
        try:
            rec = read_record(path)
        except PayloadError as e:   # readable, but not this probe's data: never a wrong number
            warn.append(f"{e}; skipped (not a {probe} record this ppscope reads)")
            continue
        except RecordError as e:
            raise CliError(str(e)) from None
        if rec.probe != probe:
            warn.append(f"{path.name}: a {str(rec.probe)[:40]!r} record, not {probe}; skipped")
            continue
        want = getattr(payload_class(probe), "SCHEMA_VERSION", SCHEMA_VERSION)
        if rec.schema_version != want:
            warn.append(f"{path.name}: schema version {rec.schema_version}, this ppscope reads "
                        f"{want}; skipped (re-run the probe)")
            continue
        if rec.status != "ok":
            warn.append(f"{path.name}: status {rec.status} ({rec.reason}); skipped")
            continue
        recs[probe] = rec
    return recs, warn


def _shipped_record(name: str, sc_file: str) -> tuple[Record | None, str | None]:
    """A measured record shipped in configs/records/ that the scenario transfers from."""
    path = CONFIGS / "records" / name
    try:
        rec = read_record(path)
    except (RecordError, OSError) as e:
        raise CliError(f"{sc_file}: kernel_record {name!r}: {str(e).splitlines()[0]}") from None
    return (rec, f"configs/records/{name}") if rec.status == "ok" else (None, None)


def _gpu_note(rec: Record, gpu: GpuSpec) -> str | None:
    names = {g for g in rec.provenance.gpus}
    specs = {getattr(match_gpu(n), "name", n) for n in names}
    if specs and specs != {gpu.name}:
        return f"measured on {', '.join(sorted(names))}, scenario GPU is {gpu.name}"
    return None


class _Chain:
    """What every input's fallback chain appends to: the params in report order, the
    warnings, the records used; and how a scenario setting is labelled."""

    def __init__(self, sc: Scenario, warnings: list[str] | None):
        self.sc, self.file = sc, f"configs/scenarios/{sc.name}.json"
        self.params: list[Param] = []
        self.warn = list(warnings or [])
        self.used: list[str] = []

    def label(self, key: str) -> str:  # a scenario setting: the user's, unless it assumes it
        return "estimated" if self.sc.assumed(key) else "given"

    def note(self, key: str, default: str) -> str:
        return self.sc.assumption(key, default)

    def add(self, *a) -> None:
        self.params.append(Param(*a))


def build_inputs(scenario: Scenario | Mapping[str, Any], records: dict[str, Record],
                 warnings: list[str] | None = None, observed: dict[int, float] | None = None,
                 observed_src: str | None = None, workload=None) -> Inputs:
    """Combine a scenario dict and ok records into model inputs (fallback chain per input).
    `workload`: the request lengths of the observed bench_serving runs
    (reports/base/bench_serving.py `bench_workload`): they fill what the scenario does not say.
    A mapping is read as a scenario file's form (`read_scenario`). Each input's chain is one
    helper below, called in the order the report lists the inputs."""
    sc = scenario if isinstance(scenario, Scenario) else read_scenario(scenario)
    ch = _Chain(sc, warnings)
    try:
        model = load_model(sc.model)
        gpu = load_gpu(sc.gpu)
    except (ValueError, OSError) as e:   # named by the file the user gave, not its `name`
        raise CliError(f"{sc.source or ch.file}: {str(e).splitlines()[0]}") from None
    _layer_split(ch, model)
    arrival = _deployment_params(ch, records)
    prompt_len, output_len, range_ratio = _lengths(ch, workload, observed_src)
    settings = _server_params(ch, records, model, gpu)
    _memory_fit(ch, records, model, gpu, settings, prompt_len + output_len)
    stage_eff, eff_curve = _kernel_efficiency(ch, records, model, gpu)
    hop_curve = _hop(ch, records, model)
    host, launch, process = _host(ch, records, gpu)
    eager, max_bs = _graphs(ch, records, gpu)
    est = sc.estimates
    ch.add("zipf_s", est.zipf_s, "estimated", ch.file, "expert-routing skew")
    if "sglang" in records:
        ch.used.append("sglang.json")
    obs = _observed(ch, observed, observed_src)
    conc = sorted(set(sc.concurrency) | set(obs))
    server = replace(settings, disable_cuda_graph=not sc.cuda_graphs, cuda_graph_max_bs=max_bs)
    return Inputs(
        name=sc.name, model=model, gpu=gpu, server=server, layer_partition=sc.layer_partition,
        arrival=arrival, mean_context_tokens=sc.mean_context_tokens,
        concurrency=tuple(conc), observed=tuple(sorted(obs.items())),
        eff_curve=eff_curve, stage_eff=stage_eff, eager_curve=eager, hop_curve=hop_curve,
        hop_fixed_us=est.hop_fixed_us, host_us=host, empty_us=est.empty_us,
        chain_us=est.chain_us, zipf_s=est.zipf_s,
        launch_us=launch, process_us=process, prompt_len=prompt_len, output_len=output_len,
        range_ratio=range_ratio,
        params=tuple(ch.params), warnings=tuple(ch.warn), records=tuple(dict.fromkeys(ch.used)),
        assumptions=sc.assumptions,
    )


def _layer_split(ch: _Chain, model: ModelConfig) -> None:
    """Every PP stage holds at least one layer (SGLang's `get_pp_indices`, reports/base/
    partition.py), and a layer partition has one positive entry per stage summing to the
    model's layers: else a one-line CliError naming the field."""
    sc, where = ch.sc, ch.sc.source or ch.file
    if sc.pp > model.num_layers:
        raise CliError(f"{where}: field 'pp' must be an integer from 1 to {model.num_layers} "
                       f"({model.name} has {model.num_layers} layers, each PP stage holds at "
                       f"least one), got {sc.pp}")
    try:
        pp_partition(model.num_layers, sc.pp, sc.layer_partition)
    except ValueError as e:
        raise CliError(f"{where}: field 'layer_partition': {str(e).splitlines()[0]}") from None


def _memory_fit(ch: _Chain, records: dict[str, Record], model: ModelConfig, gpu: GpuSpec,
                settings: ServerSettings, one_request: int) -> None:
    """The deployment must start: on every GPU, the weights of its stage (over tp) and
    SGLang's reserve leave a KV pool of at least one request (prompt + output tokens), by
    SGLang's own sizing (reports/base/sglang_defaults.py `estimate_kv`, the GPU's spec-sheet
    memory). A deployment that cannot start has no loop to model, and no setting to recommend
    for it: a one-line CliError saying so, with the smallest pp that fits. Where the user's
    own server log shows the server running (sglang.json's start-up line), the server is the
    evidence: a warning that the estimate says otherwise."""
    sc, where = ch.sc, ch.sc.source or ch.file

    def kv_at(pp: int, partition):
        return estimate_kv(model, gpu.mem_gb, pp, tp=sc.tp, partition=partition,
                           chunked_prefill_size=settings.chunked_prefill_size,
                           context_len=sc.max_context_length, decode_graphs=sc.cuda_graphs)
    kv = kv_at(sc.pp, sc.layer_partition)
    if kv.token_capacity >= one_request:
        return
    text = (f"{model.name}'s weights do not fit at pp={sc.pp}"
            + (f", tp={sc.tp}" if sc.tp > 1 else "")
            + f" on {gpu.name} ({gpu.mem_gb:g} GB per GPU): {max(kv.weights_gib):.0f} GiB on "
            f"the fullest stage leave a KV pool of {kv.token_capacity} tokens, under one "
            f"request's {one_request}")
    if _server_settings(records).get("max_running_requests") is not None:
        ch.warn.append(f"{text} by ppscope's estimate, yet sglang.json's server log shows the "
                       "server running: the estimate of its weights or memory is off")
        return
    fits = next((p for p in range(sc.pp + 1, model.num_layers + 1)
                 if kv_at(p, None).token_capacity >= one_request), None)
    raise CliError(f"{where}: {text}; a deployment that cannot start is not modelled ("
                   + (f"pp={fits} is the smallest that fits" if fits else
                      f"no pp up to {model.num_layers} fits this GPU") + ")")


def _deployment_params(ch: _Chain, records: dict[str, Record]) -> str:
    """pp, async depth, graphs, arrival (the server log's prefills when it has them), the
    layer partition; returns the arrival."""
    sc, f = ch.sc, ch.file
    arrival = sc.arrival
    arrival_src = (ch.label("arrival"), f, ch.note("arrival", "how the clients start their "
                                                              "streams"))
    seen = arrival_from_log(records["sglang"].payload) if "sglang" in records else None
    if seen is not None:   # the server's own prefills say how its requests arrived
        arrival, arrival_src = seen[0], ("observed", "sglang.json (log)", seen[1])
    ch.add("pp", sc.pp, ch.label("pp"), f, ch.note("pp", "deployment setting"))
    ch.add("async_depth", sc.async_depth, ch.label("async_depth"), f,
           ch.note("async_depth", "--pp-async-batch-depth"))
    ch.add("cuda_graphs", sc.cuda_graphs, ch.label("cuda_graphs"), f,
           ch.note("cuda_graphs", "deployment setting"))
    ch.add("arrival", arrival, *arrival_src)
    if sc.layer_partition:
        ch.add("layer_partition", sc.layer_partition, ch.label("layer_partition"), f,
               "SGLANG_PP_LAYER_PARTITION")
    return arrival


def _lengths(ch: _Chain, workload, observed_src: str | None) -> tuple[int, int, float]:
    """Prompt and output length, range ratio: the scenario's when it states them (given), else
    the observed bench runs', else the scenario's assumption or the default (estimated)."""
    sc, f = ch.sc, ch.file
    wl_src = observed_src or "bench_serving"

    def length(key: str, wl_value, default, cast, what: str) -> Any:
        stated = getattr(sc, key) is not None
        if stated and not sc.assumed(key):
            v = cast(getattr(sc, key))
            ch.add(key, v, ch.label(key), f, ch.note(key, what))
        elif wl_value is not None:
            v = cast(wl_value)
            ch.add(key, v, "observed", wl_src,
                   getattr(workload, "note", None) or f"{what}, bench_serving")
        elif stated:
            v = cast(getattr(sc, key))
            ch.add(key, v, "estimated", f, ch.note(key, what))
        else:
            v = cast(default)
            ch.add(key, v, "estimated", f, ch.note(key, (
                f"not given: sglang.bench_serving's --random-input-len default {default}"
                if key == "prompt_len" else what)))
        return v
    prompt_len = length("prompt_len", getattr(workload, "prompt_len", None),
                        DEFAULT_PROMPT_LEN, int, "tokens per prompt")
    output_len = length("output_len", getattr(workload, "output_len", None),
                        DEFAULT_OUTPUT_LEN, int, "tokens per response")
    range_ratio = length("range_ratio", getattr(workload, "range_ratio", None), 1.0, float,
                         "lengths drawn in [len * ratio, len] (bench_serving "
                         "--random-range-ratio); 1.0 = all the same, so slots keep their "
                         "first split; below 1 occupancy drifts")
    return prompt_len, output_len, range_ratio


def _server_params(ch: _Chain, records: dict[str, Record], model, gpu) -> ServerSettings:
    """Chunked prefill, max prefill tokens, max running requests and the cap: the scenario's,
    else the server log's start-up line, else SGLang's own default rule for this GPU."""
    sc, f = ch.sc, ch.file
    pp, tp = sc.pp, sc.tp
    mem_mib = gpu_mem_mib(gpu.mem_gb)
    rule = f"SGLang {SGLANG_VERSION} default for a {gpu.mem_gb:g} GB GPU"
    log_set = _server_settings(records)
    if sc.chunked_prefill_size is not None:
        chunk = sc.chunked_prefill_size
        chunk_p = (ch.label("chunked_prefill_size"), f, ch.note("chunked_prefill_size",
                                                                "--chunked-prefill-size"))
    elif log_set.get("chunked_prefill_size") is not None:
        chunk = int(log_set["chunked_prefill_size"])
        chunk_p = ("observed", "sglang.json", "server log start-up line")
    else:
        chunk = default_chunked_prefill_size(mem_mib)
        chunk_p = ("estimated", f, rule + " (arg_groups/memory_hook.py)")
    max_prefill = int(sc.max_prefill_tokens or log_set.get("max_prefill_tokens")
                      or MAX_PREFILL_TOKENS)
    ch.add("chunked_prefill_size", chunk, *chunk_p)
    ch.add("max_prefill_tokens", max_prefill,
           ch.label("max_prefill_tokens") if sc.max_prefill_tokens else
           "estimated", f, f"SGLang {SGLANG_VERSION} default "
           f"{MAX_PREFILL_TOKENS} unless given")
    given_mrr = sc.max_running_requests
    if given_mrr is not None:
        mrr = int(given_mrr)
        mrr_p = (ch.label("max_running_requests"), f,
                 ch.note("max_running_requests", "--max-running-requests"))
    elif log_set.get("max_running_requests") is not None:
        mrr = int(log_set["max_running_requests"])
        mrr_p = ("observed", "sglang.json", "server log start-up line")
    else:
        kv = estimate_kv(model, gpu.mem_gb, pp, tp=tp, partition=sc.layer_partition,
                         chunked_prefill_size=chunk, context_len=sc.max_context_length,
                         decode_graphs=sc.cuda_graphs)
        mrr = max(1, kv.max_running_requests)
        mrr_p = ("estimated", f,
                 f"not given: SGLang {SGLANG_VERSION}'s rule (mem_cache/kv_cache_configurator.py"
                 f", resolve_max_num_reqs) on a KV pool of {kv.token_capacity} tokens "
                 f"(mem_fraction_static {kv.mem_fraction_static}, weights "
                 f"{max(kv.weights_gib):.1f} GiB on the fullest rank, context {kv.context_len})")
    ch.add("max_running_requests", mrr, *mrr_p)
    settings = ServerSettings(pp, sc.async_depth, mrr, sc.max_micro_batch, chunk, max_prefill,
                              tp_size=tp)
    if sc.max_micro_batch:
        cap_p = (ch.label("max_micro_batch"), f, "--pp-max-micro-batch-size")
    else:
        cap_p = (mrr_p[0], mrr_p[1], f"pp_max_micro_batch_size default: "
                 f"max_running_requests // pp = {mrr} // {pp}")
    ch.add("max_micro_batch", settings.max_micro_batch, *cap_p)
    return settings


def _kernel_efficiency(ch: _Chain, records: dict[str, Record], model, gpu) -> tuple[tuple, tuple]:
    """The fraction of the roofline floor reached: per stage from stage_cost.json when it is
    this deployment's, else its MoE layer's curve, else the scenario's (shipped record or
    estimate); from another GPU it is a transfer. Returns (stage_eff, eff_curve)."""
    sc, f, pp, warn = ch.sc, ch.file, ch.sc.pp, ch.warn
    eff_curve = sc.estimates.efficiency_by_batch
    stage_eff: tuple = ()
    eff_src = ("estimated", f)
    eff_note = "fraction of the roofline floor reached (by batch)"
    sc_rec, shipped = records.get("stage_cost"), None
    if sc_rec is None and sc.kernel_record:
        sc_rec, shipped = _shipped_record(sc.kernel_record, f)
    if sc_rec is not None:
        d = sc_rec.payload
        per = [tuple(sorted((int(b), v.floor_us / v.measured_us)
                            for b, v in st.by_batch.items() if v.measured_us and v.floor_us))
               for st in d.stages]
        gpu_note = _gpu_note(sc_rec, gpu)
        rec_name = shipped or "stage_cost.json"
        if shipped:   # never the user's machine: a transfer even onto the same GPU kind
            gpu_note = (f"{gpu_note or 'measured on ' + ', '.join(sorted(set(sc_rec.provenance.gpus)))}"
                        f", shipped with ppscope as {shipped}")
        if (d.pp == pp and d.model in (model.name, sc.model)
                and len(per) == pp and all(per)):
            stage_eff = tuple(per)
            eff_src = ("measured", rec_name)
            ch.used.append(rec_name)
        else:
            pts = [(int(b), v.floor_us / v.measured_us)
                   for b, v in d.layers.get("moe", {}).items() if v.measured_us and v.floor_us]
            if pts:
                eff_curve = tuple(sorted(pts))
                eff_src = ("measured", rec_name)
                ch.used.append(rec_name)
                warn.append(f"{rec_name}: pp={d.pp} model={d.model} differs "
                            f"from the scenario; only its MoE-layer efficiency is used")
            else:
                warn.append("stage_cost.json: no measured stage for this pp/model; skipped")
        if gpu_note and eff_src[0] == "measured":
            # another GPU: the fraction of the floor reached at the same micro-batch (the same
            # arithmetic intensity) is carried over, and the floor is the scenario GPU's own
            # (its memory bandwidth): a transfer, never a measurement of this GPU
            eff_src = ("transferred", rec_name)
            if not shipped:
                warn.append(f"stage_cost.json: {gpu_note}; kernel efficiency transferred (same "
                            "fraction of the floor at the same micro-batch size, the scenario "
                            "GPU's floor)")
            eff_note = (f"{gpu_note}: the fraction of the roofline floor reached at each "
                        "micro-batch size there, carried over onto this GPU's own floor (its "
                        "memory bandwidth); nothing fitted to the observed tok/s")
    ch.add("kernel_efficiency", [list(x) for x in (stage_eff or (eff_curve,))[0]],
           *eff_src, eff_note)
    return stage_eff, eff_curve


def _hop(ch: _Chain, records: dict[str, Record], model):
    """The hop cost by batch from topology.json (its own label: never `measured` when
    pasted), else the scenario's fixed cost plus bytes."""
    pp = ch.sc.pp
    hop_curve = None
    hop_src = ("estimated", ch.file)
    topo = records.get("topology")
    if topo is not None:
        t = topo.payload
        by_b: dict[int, list[float]] = {}
        for h in t.hops:
            if h.hop_us is not None:
                by_b.setdefault(h.batch, []).append(h.hop_us)
        if by_b:
            hop_curve = tuple(sorted((b, sum(v) / len(v)) for b, v in by_b.items()))
            hop_src = (t.figure_label, "topology.json")
            ch.used.append("topology.json")
            n_gpu = len(t.gpus)
            if n_gpu and n_gpu < pp:
                ch.warn.append(f"topology.json: {n_gpu} GPUs measured, scenario has pp={pp}; "
                               "mean hop cost used for every hop")
        else:
            ch.warn.append("topology.json: no `hops` entries; hop cost estimated")
    ch.add("hop_us", [list(x) for x in hop_curve] if hop_curve else
           {"fixed_us": ch.sc.estimates.hop_fixed_us, "bytes_per_request": 4 * model.hidden},
           *hop_src, "hidden states + residual (bf16) per micro-batch hop")
    return hop_curve


def _host(ch: _Chain, records: dict[str, Record], gpu) -> tuple[float, float, float]:
    """Host time per slot visit (schedule, launch, result processing) from dispatch.json's
    medians, else the scenario's estimates; empty visits and relay messages are estimates."""
    est, f = ch.sc.estimates, ch.file
    host, launch, process = est.host_us, est.launch_us, est.process_us
    host_src = ("estimated", f)
    disp = records.get("dispatch")
    if disp is not None:
        stages = [s for r in disp.payload.runs for s in r.stages]

        def med(vals):
            vals = sorted(v for v in vals if v is not None)
            return vals[len(vals) // 2] if vals else None
        split = [med(getattr(s, k) for s in stages)
                 for k in ("sched_us_p50", "launch_us_p50", "process_us_p50")]
        total = med(s.host_us_p50 for s in stages)
        if all(v is not None for v in split):
            host, launch, process = split
        elif total is not None:   # a probe without the phase split: all of it as schedule
            host, launch, process = total, 0.0, 0.0
        if total is not None:
            host_src = ("measured", "dispatch.json")
            ch.used.append("dispatch.json")
            gpu_note = _gpu_note(disp, gpu)
            if gpu_note:
                ch.warn.append(f"dispatch.json: host time per slot visit {gpu_note}")
    ch.add("host_us", host, *host_src, "CPU per non-empty slot visit: get_next_batch_to_run")
    ch.add("launch_us", launch, *host_src, "CPU per forward: run_batch")
    ch.add("process_us", process, *host_src, "CPU per processed slot: process_batch_result")
    ch.add("empty_us", est.empty_us, "estimated", f, "CPU per empty slot visit")
    ch.add("chain_us", est.chain_us, "estimated", f,
           "one gloo message (request list, metadata) between ranks")
    return host, launch, process


def _graphs(ch: _Chain, records: dict[str, Record], gpu) -> tuple[tuple, int]:
    """Eager's extra cost per layer and the largest captured batch: graphs.json, else the
    scenario's, else SGLang's default rule. Returns (eager curve, max_bs)."""
    sc, f = ch.sc, ch.file
    eager = ((1, sc.estimates.eager_us_per_layer),)
    eager_src = ("estimated", f)
    gr = records.get("graphs")
    if sc.graph_max_bs:
        max_bs = sc.graph_max_bs
        bs_p = (ch.label("graph_max_bs"), f, ch.note("graph_max_bs", GRAPH_MAX_BS_FLAG.flag))
    else:
        given_mrr = sc.max_running_requests
        max_bs = default_decode_max_bs(gpu_mem_mib(gpu.mem_gb), sc.tp,
                                       int(given_mrr) if given_mrr else None)
        bs_p = ("estimated", f, f"SGLang {SGLANG_VERSION} default for a {gpu.mem_gb:g} GB GPU"
                " (arg_groups/memory_hook.py)")
    if gr is not None:
        g = gr.payload
        pts = [(r.batch, max(0.0, r.eager_us - r.graph_us)) for r in g.by_batch
               if r.eager_us is not None and r.graph_us is not None]
        if pts:
            eager = tuple(sorted(pts))
            eager_src = ("measured", "graphs.json")
            ch.used.append("graphs.json")
        max_bs = g.max_bs
    ch.add("eager_us_per_layer", [list(x) for x in eager], *eager_src,
           "extra cost per layer when a batch runs eager")
    if gr is not None and gr.data.get("max_bs"):
        bs_p = ("measured", "graphs.json", "captured by the graphs probe")
    ch.add("graph_max_bs", max_bs, *bs_p)
    return eager, max_bs


def _observed(ch: _Chain, observed: dict[int, float] | None,
              observed_src: str | None) -> dict[int, float]:
    """The observed tok/s by C (given, or the scenario's), those above the model's range left
    out with a warning."""
    obs = observed if observed is not None else dict(ch.sc.observed_tok_per_s)
    if obs:
        ch.add("observed_tok_per_s", {str(k): v for k, v in sorted(obs.items())},
               "observed", observed_src or ch.file)
    too_big = sorted(c for c in obs if c > MAX_CONCURRENCY)
    if too_big:
        ch.warn.append(f"observed points at C = {', '.join(map(str, too_big))} are above the "
                       f"{MAX_CONCURRENCY} the model runs at; left out")
        obs = {c: v for c, v in obs.items() if c <= MAX_CONCURRENCY}
    return obs


def _server_settings(records: dict[str, Record]) -> dict[str, Any]:
    """The server's own settings from its log's start-up line (sglang.json `log`), if read."""
    sg = records.get("sglang")
    if sg is None:
        return {}
    return dict(((sg.data.get("log") or {}).get("server_settings")) or {})


def observed_from_sglang(rec: Record | None) -> tuple[dict[int, float], list[str]]:
    """bench_serving runs recorded in sglang.json -> ({max_concurrency: output tok/s}, notes),
    by the same rule as `--bench` (reports/base/bench_serving.py `observed_points`)."""
    if rec is None:
        return {}, []
    return observed_points(rec.payload.bench, "sglang.json", repeats=False)


def parse_observed(text: str) -> dict[int, float]:
    """`"1:34,8:81.7,32:248.1"` -> {1: 34.0, 8: 81.7, 32: 248.1}. Errors quote the pair at
    fault (a long argument is never echoed whole); a concurrency given twice is an error."""
    out: dict[int, float] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        shown = repr(part if len(part) <= 40 else part[:37] + "...")
        try:
            c, v = part.split(":")
            c, v = int(c), float(v)
        except ValueError:
            raise CliError(f"--observed: {shown} is not a CONCURRENCY:TOK_PER_S pair (like "
                           "1:34,8:81.7)") from None
        if not (c >= 1 and 0 < v < 1e9):  # also NaN and inf
            raise CliError(f"--observed: {shown}: concurrency and tok/s must be positive")
        if c > MAX_CONCURRENCY:
            raise CliError(f"--observed: {shown}: concurrency {c} is above the "
                           f"{MAX_CONCURRENCY} the model runs at")
        if c in out:
            raise CliError(f"--observed: concurrency {c} given twice ({out[c]:g} and {v:g} "
                           "tok/s); give one value per concurrency")
        out[c] = v
    return out
