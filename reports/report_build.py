"""Assemble report.json (the truth the Markdown, HTML and terminal table render).

Levels per concurrency: `ideal` (every switch off), `predicted` (the model, every switch on),
`observed` (the user's benchmark). Attribution rows, verdicts, what-ifs, parameters with their
source, warnings about skipped records, and (when dispatch.json exists) the model-vs-probe check.
"""
from __future__ import annotations

from typing import Any

from reports import loop_builder as lb
from reports.attribution import attribute
from reports.records import Record, to_jsonable
from reports.scenario import Inputs
from reports.validate_dispatch import micro_batch_choices, validate
from reports.verdicts import verdicts
from reports.whatif import what_ifs

REPORT_SCHEMA = "ppscope-report/1"


def build_report(inp: Inputs, records: dict[str, Record]) -> dict[str, Any]:
    atts = [attribute(inp, C) for C in inp.concurrency]
    obs = dict(inp.observed)
    conc = []
    for C, a in zip(inp.concurrency, atts):
        sim = lb.run(inp, C)
        conc.append({
            "concurrency": C, "ideal_tok_per_s": a.ideal_tok_per_s,
            "predicted": a.modelled_tok_per_s, "observed": obs.get(C),
            "predicted_tpot_ms": sim.tpot_ms, "busy_frac": list(sim.busy_frac),
            "slot_sizes": list(sim.slot_sizes),
        })
    rep: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "scenario": inp.name,
        "all_estimated": inp.all_estimated,
        "records_used": list(inp.records),
        "warnings": list(inp.warnings),
        "deployment": {"model": inp.model.name, "gpu": inp.gpu.name, "pp": inp.pp,
                       "async_depth": inp.async_depth, "max_micro_batch": inp.max_micro_batch,
                       "cuda_graphs": inp.graphs, "graph_max_bs": inp.graph_max_bs,
                       "arrival": inp.arrival, "context_len": inp.context_len},
        "params": to_jsonable(list(inp.params)),
        "assumptions": dict(inp.assumptions),
        "concurrency": conc,
        "attribution": [{"concurrency": a.concurrency, "ideal_tpot_ms": a.ideal_tpot_ms,
                         "modelled_tpot_ms": a.modelled_tpot_ms,
                         "rows": to_jsonable(list(a.rows))} for a in atts],
        "verdicts": to_jsonable(verdicts(inp, atts, records)),
        "what_ifs": to_jsonable(what_ifs(inp)),
        "stage_cost": [{"batch": b, "modelled_us": lb.stage_cost_us(inp, lb.ALL_ON, b),
                        "floor_us": lb.stage_cost_us(inp, frozenset({"stage_imbalance"}), b)}
                       for b in sorted({max(c["slot_sizes"]) for c in conc})],
    }
    if "dispatch" in records:
        rep["dispatch_validation"] = to_jsonable(validate(records["dispatch"]))
        rep["dispatch_micro_batches"] = to_jsonable(micro_batch_choices(records["dispatch"]))
    return rep
