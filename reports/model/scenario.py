"""Scenario + records in results/ -> the pipeline model's inputs, each labelled with its source.

A scenario (`configs/scenarios/<name>.json`) says what is deployed (model, GPU, pp, async depth,
max running requests, graphs, arrival) plus stated estimates for what no probe has measured.
Records in `results/` replace estimates where they exist:

| input | measured from | else (estimated) |
|---|---|---|
| stage cost vs micro-batch | stage_cost.json (measured_us / roofline floor = efficiency) | roofline floor / efficiency curve |
| hidden-state hop | topology.json `hops[].hop_us` by batch | fixed + bytes / PCIe bandwidth |
| host dispatch per slot | dispatch.json `stages[].host_us_p50` | scenario estimate |
| eager (graph fallback) cost | graphs.json `eager_us - graph_us` | scenario estimate |

A record that is not `ok`, has another schema version, or was made for another pp/model is
skipped or used with a warning (`Inputs.warnings`); a corrupt record is a one-line CliError.
Nothing here is fitted to the observed numbers.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reports.base.bench_serving import observed_points
from reports.base.errors import CliError
from reports.base.gpu_specs import GpuSpec, load_gpu, match_gpu
from reports.base.model_config import ModelConfig, load_model
from reports.base.paths import CONFIGS
from reports.base.records import (SCHEMA_VERSION, Record, RecordError, payload_class,
                                  read_record)
from reports.base.slots import default_max_micro_batch

PROBES = ("topology", "stage_cost", "graphs", "dispatch", "sglang", "watch")


@dataclass(frozen=True)
class Param:
    """One model input and where it came from."""
    name: str
    value: Any
    source: str          # measured | estimated | observed
    evidence: str        # record file or config file
    note: str = ""


@dataclass(frozen=True)
class Inputs:
    name: str
    model: ModelConfig
    gpu: GpuSpec
    pp: int
    async_depth: int
    max_micro_batch: int
    layer_partition: str | None
    graphs: bool
    graph_max_bs: int
    arrival: str
    context_len: int
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
    params: tuple[Param, ...] = ()
    warnings: tuple[str, ...] = ()
    records: tuple[str, ...] = ()                     # record files used
    assumptions: tuple[tuple[str, str], ...] = ()

    @property
    def all_estimated(self) -> bool:
        """No measured model input (sglang.json is observed evidence, not a model input)."""
        return not any(r != "sglang.json" for r in self.records)

    def src(self, key: str) -> tuple[str, str]:
        """(measured|estimated, evidence) for a model input key."""
        for p in self.params:
            if p.name == key:
                return p.source, p.evidence
        return "estimated", "scenario"


def scenario_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix == ".json" or p.exists():
        return p
    return CONFIGS / "scenarios" / f"{name_or_path}.json"


def load_scenario(name_or_path: str) -> dict[str, Any]:
    p = scenario_path(name_or_path)
    try:
        with open(p) as f:
            d = json.load(f)
    except FileNotFoundError:
        names = sorted(x.stem for x in (CONFIGS / "scenarios").glob("*.json"))
        raise CliError(f"no scenario {name_or_path!r} (shipped: {', '.join(names)})") from None
    except json.JSONDecodeError as e:
        raise CliError(f"{p}: invalid scenario JSON ({e})") from None
    for key in ("model", "gpu", "pp", "async_depth", "concurrency"):
        if key not in d:
            raise CliError(f"{p}: scenario lacks {key!r}")
    d.setdefault("name", p.stem)
    return d


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
        except RecordError as e:
            raise CliError(str(e)) from None
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


def _gpu_note(rec: Record, gpu: GpuSpec) -> str | None:
    names = {g for g in rec.provenance.gpus}
    specs = {getattr(match_gpu(n), "name", n) for n in names}
    if specs and specs != {gpu.name}:
        return f"measured on {', '.join(sorted(names))}, scenario GPU is {gpu.name}"
    return None


def build_inputs(scenario: dict[str, Any], records: dict[str, Record],
                 warnings: list[str] | None = None, observed: dict[int, float] | None = None,
                 observed_src: str | None = None) -> Inputs:
    """Combine a scenario dict and ok records into model inputs (fallback chain per input)."""
    sc, warn = scenario, list(warnings or [])
    sc_file = f"configs/scenarios/{sc['name']}.json"
    est = dict(sc.get("estimates", {}))
    try:
        model = load_model(sc["model"])
        gpu = load_gpu(sc["gpu"])
    except (ValueError, OSError) as e:
        raise CliError(f"{sc_file}: {str(e).splitlines()[0]}") from None
    pp, depth = int(sc["pp"]), int(sc["async_depth"])
    cap = sc.get("max_micro_batch") or default_max_micro_batch(
        int(sc.get("max_running_requests", 4096)), pp)
    params: list[Param] = [
        Param("pp", pp, "estimated", sc_file, "deployment setting"),
        Param("async_depth", depth, "estimated", sc_file, "deployment setting"),
        Param("max_micro_batch", cap, "estimated", sc_file,
              "pp_max_micro_batch_size = max_running_requests // pp unless set"),
    ]
    used: list[str] = []
    eff_curve = tuple(sorted((int(b), float(v)) for b, v in
                             est.get("efficiency_by_batch", {"1": 1.0}).items()))
    stage_eff: tuple = ()
    eff_src = ("estimated", sc_file)
    sc_rec = records.get("stage_cost")
    if sc_rec is not None:
        d = sc_rec.payload
        per = [tuple(sorted((int(b), v.floor_us / v.measured_us)
                            for b, v in st.by_batch.items() if v.measured_us and v.floor_us))
               for st in d.stages]
        note = _gpu_note(sc_rec, gpu)
        if (d.pp == pp and d.model in (model.name, sc["model"])
                and len(per) == pp and all(per)):
            stage_eff = tuple(per)
            eff_src = ("measured", "stage_cost.json")
            used.append("stage_cost.json")
        else:
            pts = [(int(b), v.floor_us / v.measured_us)
                   for b, v in d.layers.get("moe", {}).items() if v.measured_us and v.floor_us]
            if pts:
                eff_curve = tuple(sorted(pts))
                eff_src = ("measured", "stage_cost.json")
                used.append("stage_cost.json")
                warn.append(f"stage_cost.json: pp={d.pp} model={d.model} differs "
                            f"from the scenario; only its MoE-layer efficiency is used")
            else:
                warn.append("stage_cost.json: no measured stage for this pp/model; skipped")
        if note and eff_src[0] == "measured":
            warn.append(f"stage_cost.json: {note}")
    params.append(Param("kernel_efficiency", [list(x) for x in (stage_eff or (eff_curve,))[0]],
                        *eff_src, "fraction of the roofline floor reached (by batch)"))

    hop_curve = None
    hop_src = ("estimated", sc_file)
    topo = records.get("topology")
    if topo is not None:
        t = topo.payload
        by_b: dict[int, list[float]] = {}
        for h in t.hops:
            if h.hop_us is not None:
                by_b.setdefault(h.batch, []).append(h.hop_us)
        if by_b:
            hop_curve = tuple(sorted((b, sum(v) / len(v)) for b, v in by_b.items()))
            hop_src = ("measured", "topology.json")
            used.append("topology.json")
            n_gpu = len(t.gpus)
            if n_gpu and n_gpu < pp:
                warn.append(f"topology.json: {n_gpu} GPUs measured, scenario has pp={pp}; "
                            "mean hop cost used for every hop")
        else:
            warn.append("topology.json: no `hops` entries; hop cost estimated")
    hop_fixed = float(est.get("hop_fixed_us", 0.0))
    params.append(Param("hop_us", [list(x) for x in hop_curve] if hop_curve else
                        {"fixed_us": hop_fixed, "bytes_per_request": 4 * model.hidden},
                        *hop_src, "hidden states + residual (bf16) per micro-batch hop"))

    host, empty, chain = (float(est.get(k, 0.0)) for k in ("host_us", "empty_us", "chain_us"))
    host_src = ("estimated", sc_file)
    disp = records.get("dispatch")
    if disp is not None:
        vals = sorted(s.host_us_p50 for r in disp.payload.runs for s in r.stages
                      if s.host_us_p50 is not None)
        if vals:
            host = vals[len(vals) // 2]
            host_src = ("measured", "dispatch.json")
            used.append("dispatch.json")
            note = _gpu_note(disp, gpu)
            if note:
                warn.append(f"dispatch.json: host time per slot visit {note}")
    params.append(Param("host_us", host, *host_src, "CPU per non-empty slot visit"))
    params.append(Param("empty_us", empty, "estimated", sc_file, "CPU per empty slot visit"))
    params.append(Param("chain_us", chain, "estimated", sc_file, "request-list relay per rank"))

    eager = ((1, float(est.get("eager_us_per_layer", 0.0))),)
    eager_src = ("estimated", sc_file)
    gr = records.get("graphs")
    max_bs = int(sc.get("graph_max_bs", 256))
    if gr is not None:
        g = gr.payload
        pts = [(r.batch, max(0.0, r.eager_us - r.graph_us)) for r in g.by_batch
               if r.eager_us is not None and r.graph_us is not None]
        if pts:
            eager = tuple(sorted(pts))
            eager_src = ("measured", "graphs.json")
            used.append("graphs.json")
        max_bs = g.max_bs
    params.append(Param("eager_us_per_layer", [list(x) for x in eager], *eager_src,
                        "extra cost per layer when a batch runs eager"))
    params.append(Param("graph_max_bs", max_bs, "measured" if gr else "estimated",
                        "graphs.json" if gr else sc_file))
    zipf = float(est.get("zipf_s", 0.0))
    params.append(Param("zipf_s", zipf, "estimated", sc_file, "expert-routing skew"))
    if "sglang" in records:
        used.append("sglang.json")

    obs = observed if observed is not None else {
        int(k): float(v) for k, v in (sc.get("observed_tok_per_s") or {}).items()}
    if obs:
        params.append(Param("observed_tok_per_s", {str(k): v for k, v in sorted(obs.items())},
                            "observed", observed_src or sc_file))
    conc = sorted(set(int(c) for c in sc["concurrency"]) | set(obs))
    return Inputs(
        name=sc["name"], model=model, gpu=gpu, pp=pp, async_depth=depth,
        max_micro_batch=int(cap), layer_partition=sc.get("layer_partition"),
        graphs=bool(sc.get("cuda_graphs", True)), graph_max_bs=max_bs,
        arrival=str(sc.get("arrival", "burst")), context_len=int(sc.get("context_len", 2048)),
        concurrency=tuple(conc), observed=tuple(sorted(obs.items())),
        eff_curve=eff_curve, stage_eff=stage_eff, eager_curve=eager, hop_curve=hop_curve,
        hop_fixed_us=hop_fixed, host_us=host, empty_us=empty, chain_us=chain, zipf_s=zipf,
        params=tuple(params), warnings=tuple(warn), records=tuple(dict.fromkeys(used)),
        assumptions=tuple((str(k), str(v)) for k, v in (sc.get("assumptions") or {}).items()),
    )


def observed_from_sglang(rec: Record | None) -> tuple[dict[int, float], list[str]]:
    """bench_serving runs recorded in sglang.json -> ({max_concurrency: output tok/s}, notes),
    by the same rule as `--bench` (reports/base/bench_serving.py `observed_points`)."""
    if rec is None:
        return {}, []
    return observed_points(rec.payload.bench, "sglang.json")


def parse_observed(text: str) -> dict[int, float]:
    """`"1:34,8:81.7,32:248.1"` -> {1: 34.0, 8: 81.7, 32: 248.1}."""
    out: dict[int, float] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            c, v = part.split(":")
            out[int(c)] = float(v)
        except ValueError:
            raise CliError(f"--observed {text!r}: expected CONCURRENCY:TOK_PER_S pairs like "
                           "1:34,8:81.7") from None
        if int(c) < 1 or float(v) <= 0:
            raise CliError(f"--observed {text!r}: concurrency and tok/s must be positive")
    return out
