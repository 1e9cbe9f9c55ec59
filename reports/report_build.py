"""Assemble the report (reports/model/report_type.py `Report`; its `to_json()` is report.json,
the truth the Markdown, HTML and terminal table render).

Levels per concurrency: `ideal` (every switch off), `predicted` (the model, every switch on),
`observed` (the user's benchmark). Attribution rows, verdicts, what-ifs, parameters with their
source, warnings about skipped records, (when dispatch.json exists) the model-vs-probe check, the
PP link map when topology.json exists (with its source label: `given` for a pasted `topo -m`,
its unknown links and parse notes), `server` when sglang.json exists (the user's own server:
per-rank observed busy, NCCL receive share, dispatch latency, decode lines, CUDA-graph share and
slot sizes, next to the modelled busy per stage; with DP attention each DP rank's log figures
and the rule that combines them; every figure observed, with its source),
`measured_timeline` when dispatch.trace.json exists (which probe point the plot shows), and
`answer` (reports/answer.py): 3-5 sentences written from those numbers
(biggest cause of the gap per concurrency, verdicts that hold, the recommended server setting
with its effect at each measured concurrency, unexplained gap). `assumptions` adds, for each
server setting the user did not give, what depends on the value assumed; `model_differs` lists
where the model is still simpler than SGLang. This module assembles; the summaries of the
evidence are reports/model/summaries.py, the bisection reports/model/scenario/setting_dependencies.py.
"""
from __future__ import annotations

from dataclasses import replace

from reports.model.scenario import loop_builder as lb
from reports.model.attribution import attribute
from reports.base.records import Record
from reports.model.report_type import (REPORT_SCHEMA, AttributionAt, Level, RecipeNote, Report,
                                       ScenarioDeployment, StageCostAt)
from reports.model.scenario.inputs import Inputs
from reports.model.checks.validate_dispatch import micro_batch_choices, validate
from reports.model.verdicts import verdicts
from reports.model.scenario.whatifs import (OBJECTIVE, best_pair, measured_concurrency, recommendation,
                                  transport_points, what_ifs)
from reports.answer import answer
from reports.model.summaries import (traced_server_whatifs, diagnosis_summary, server_summary,
                                            topology_summary)
from reports.model.scenario.setting_dependencies import setting_dependencies


def build_report(inp: Inputs, records: dict[str, Record],
                 baseline: tuple[str, Report] | None = None) -> Report:
    """`baseline`: (label, report.json of an earlier run) to say what changed since."""
    atts = [attribute(inp, C) for C in inp.concurrency]
    from reports.model.observed.server import differs_from, observed_server
    observed_dep = observed_server(records["sglang"].payload) if "sglang" in records else None
    differs = differs_from(observed_dep, pp=inp.pp, gpu=inp.gpu.name, scenario=inp.name)
    # the observed tok/s is the traced server's: set beside the scenario's model only when the
    # scenario is that deployment (else "observed / modelled" compares two different servers)
    obs = {} if differs else dict(inp.observed)
    conc = []
    for C, a in zip(inp.concurrency, atts):
        sim = lb.run(inp, C)
        conc.append(Level(C, a.ideal_tok_per_s, a.modelled_tok_per_s, obs.get(C), sim.tpot_ms,
                          tuple(sim.busy_frac), tuple(sim.slot_sizes)))
    from reports.model.scenario.arrival import alternatives
    arrival = alternatives(inp, obs, lambda C, a: lb.run(inp, C, arrival=a))
    wis = what_ifs(inp, transport_points(
        records["topology"].payload if "topology" in records else None))
    rec = recommendation(wis)
    if rec is not None:   # the recommended row first (a tie may have put another above it)
        wis = [rec] + [w for w in wis if w is not rec]
    sg = records["sglang"].payload if "sglang" in records else None
    rep = Report(
        schema=REPORT_SCHEMA, scenario=inp.name, all_estimated=inp.all_estimated,
        records_used=tuple(inp.records), warnings=tuple(inp.warnings),
        deployment=ScenarioDeployment(
            inp.model.name, inp.gpu.name, inp.pp, inp.async_depth, inp.max_micro_batch,
            inp.graphs, inp.graph_max_bs, inp.arrival, inp.context_len,
            _memory_kind(inp.gpu.source)),
        arrival=arrival, params=tuple(inp.params),
        assumptions={**dict(inp.assumptions), **setting_dependencies(inp)},
        observed_source=inp.src("observed_tok_per_s")[1] if obs else None,
        concurrency=tuple(conc),
        attribution=tuple(AttributionAt(a.concurrency, a.ideal_tpot_ms, a.modelled_tpot_ms,
                                        tuple(a.rows)) for a in atts),
        what_ifs=tuple(wis), objective=OBJECTIVE,
        measured_concurrency=tuple(measured_concurrency(inp)),
        recommendation=rec, best_pair=best_pair(inp, wis),
        model_differs=MODEL_DIFFERS,
        stage_cost=tuple(StageCostAt(b, lb.stage_cost_us(inp, lb.ALL_ON, b),
                                   lb.stage_cost_us(inp, frozenset({"stage_imbalance"}), b))
                         for b in sorted({max(c.slot_sizes) for c in conc})),
        dispatch_validation=(tuple(validate(records["dispatch"])) if "dispatch" in records
                             else None),
        dispatch_micro_batches=(tuple(micro_batch_choices(records["dispatch"]))
                                if "dispatch" in records else None),
        topology=(topology_summary(records["topology"].payload) if "topology" in records
                  else None),
        observed_deployment=observed_dep, scenario_differs=differs,
        server=(server_summary(sg, conc, inp.pp, mla=inp.model.attention == "mla")
                if sg is not None else None),
        diagnosis=(diagnosis_summary(sg, inp, records.get("stage_cost")) if sg is not None
                   else None),
        server_whatifs=traced_server_whatifs(sg), recipe=recipe_note(sg))
    if "watch" in records:  # GPU watch: observed (NVML) hints, reports/model/observed/watch_summary.py
        from reports.model.observed.watch_summary import watch_section
        rep = replace(rep, watch=watch_section(records["watch"]))
    if baseline is not None:  # what one change did: reports/model/compare.py
        from reports.model.compare import compare_reports
        label, old = baseline
        cmp_, warns = compare_reports(rep, old, label)   # another server: not compared, said
        rep = replace(rep, baseline_comparison=cmp_, warnings=(*rep.warnings, *warns))
    from reports.model.scenario.implied import implied_efficiency
    imp = [implied_efficiency(inp, C, o) for C, o in obs.items() if C in inp.concurrency]
    rep = replace(rep, implied_efficiency=tuple(x for x in imp if x is not None),
                  verdicts=tuple(verdicts(inp, atts, records, rep.diagnosis)))
    from reports.model.next_steps import next_steps
    rep = replace(rep, measure_your_server=tuple(next_steps(
        rep, [C for C, _ in inp.observed] or list(inp.concurrency), inp.pp,
        model=inp.model.name, mla=inp.model.attention == "mla")))
    return replace(rep, answer=tuple(answer(rep)))


def recipe_note(sg) -> RecipeNote | None:
    """ppscope's recipe and its cost as the lab measured it (the record shipped as
    configs/records/recipe-cost.json, read through its checks; not measured where there is
    none), where the report reads the server's log; None where it does not."""
    if sg is None or sg.log is None:
        return None
    from reports.base.recipe_cost import SHIPPED_LABEL, shipped_recipe_cost
    from reports.base.server_flags import RECIPE_ARGS
    return RecipeNote(RECIPE_ARGS, SHIPPED_LABEL, shipped_recipe_cost())


def _memory_kind(source: str) -> str | None:
    """HBM3e, GDDR7, ...: the memory the GPU's datasheet line names."""
    import re
    m = re.search(r"\b(HBM\w*|GDDR\w*)", source or "")
    return m.group(1) if m else None


# Where the model is still simpler than SGLang 0.5.23 (rendered as its own list in the report).
MODEL_DIFFERS = (
    "Decode only: a slot that prefills is not costed (its decode is skipped in SGLang, and the "
    "prefill forward takes its turn); with long outputs this is a small share of the time.",
    "Admission ignores the KV-cache token budget and a slot's sticky `batch_is_full` flag; "
    "pages are one token.",
    "Occupancy drift is followed in loop turns, not time: a finished request's successor is "
    "assumed to arrive two visits later, and the loop is run for a few snapshots of it.",
    "Each NCCL transfer is one latency plus bytes / bandwidth on its own; transfers sharing a "
    "link, NCCL's per-peer buffer limits and the send/recv parity deadlock guard are not timed.",
    "CPU costs are one number per phase (schedule, launch, result processing, empty visit, "
    "gloo message) for every rank and batch size; Python jitter and GC pauses are left out.",
    "MoE weights per micro-batch follow uniform (or Zipf) routing in expectation, not the "
    "tokens actually routed.",
    "No speculative decoding, DP attention, TP inside a stage, or SGLANG_PP_COMM_OVERLAP.",
)
