"""Everything `ppscope report` takes from the pipeline model, computed once per set of inputs.

`model_run(inp, records, baseline)` returns the report (report.json), the modelled loop's
forwards at every concurrency (report.trace.json and the timeline plot), the herd pair: the
loop at the concurrency where the herd's share of the gap is largest, as deployed and under the
recommended setting (reports/render/timeline_plot.py draws it), and, for a traced server, the
model of its own loop with every observed cause on (reports/render/observed_herd.py draws it
beside the traced forwards).

It is the slow part of a report (about 400 runs of the pipeline simulator in Python), so the
result is kept on disk (reports/base/disk_cache.py), keyed by the code version and the repr of
every input the model reads: the Inputs, the records, the baseline and how ppscope and Python
are called here (the pasted commands name them). A hit is the same
report.json, read back (`Report.from_json`, strict); the tests check that a report made from
the cache is byte for byte the one made without it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from reports.model.sim.pipeline_model import Span
from reports.model.report_type import Report

RUN_KIND = "model-run"


@dataclass(frozen=True)
class Lanes:
    """One modelled loop to draw: which setting, its tok/s, its GPU forwards."""
    label: str                   # "as deployed" or the setting, e.g. "--chunked-prefill-size 2048"
    tok_per_s: float
    slot_sizes: tuple[int, ...]
    spans: tuple[Span, ...]


@dataclass(frozen=True)
class HerdPair:
    """The loop at `concurrency` as deployed (`before`) and under the recommended setting
    (`after`, None when no setting is recommended); `share`: the herd row's share of the gap
    there (None when the report has no herd verdict)."""
    concurrency: int
    share: float | None
    before: Lanes
    after: Lanes | None


@dataclass(frozen=True)
class ModelRun:
    report: Report
    spans: dict[int, tuple[Span, ...]]     # concurrency -> the modelled loop's forwards
    herd: HerdPair | None
    observed: Lanes | None = None          # the model of a traced server's own loop


def model_run(inp, records: dict, baseline=None, use_cache: bool = True) -> ModelRun:
    """The model's part of the report, from the disk cache when these inputs were run before."""
    from reports.base.disk_cache import cached
    from reports.base.invocation import ppscope_command, python_command
    # the commands of "Measure your server" name ppscope and Python as they run here
    env = (ppscope_command(), python_command())
    return cached(RUN_KIND, (inp, sorted(records.items()), baseline, env),
                  lambda: json.dumps(_to_json(_compute(inp, records, baseline))).encode(),
                  "json", decode=lambda b: _from_json(json.loads(b)), enabled=use_cache)


def herd_concurrency(rep: Report) -> tuple[int, float | None]:
    """The concurrency where the herd verdict's share of the gap is largest (the largest C on
    a tie, or when the report has no herd verdict)."""
    from reports.model.causes import HERD
    v = next((v for v in rep.verdicts if v.hypothesis == HERD), None)
    at = [a for a in (v.at if v else ()) if a.concurrency and a.share is not None]
    if not at:
        return max(c.concurrency for c in rep.concurrency), None
    a = max(at, key=lambda a: (a.share, a.concurrency))
    return a.concurrency, a.share


def _compute(inp, records: dict, baseline) -> ModelRun:
    from reports.model.scenario import loop_builder as lb
    from reports.report_build import build_report
    rep = build_report(inp, records, baseline)
    spans = {C: lb.run(inp, C, keep_spans=True).spans for C in inp.concurrency}
    return ModelRun(rep, spans, _herd(inp, rep), _observed(inp, records))


def _observed(inp, records: dict) -> Lanes | None:
    """The model of the traced server's loop (the diagnosis' `modelled` run, every observed
    cause on) with its forwards; None without traced forwards or a loop it can model."""
    from reports.model.observed.deployment import OBSERVED_CAUSES, NoLoopEvidence, run
    from reports.model.summaries import observed_deployment
    rec = records.get("sglang")
    sg = rec.payload if rec is not None else None
    if sg is None or sg.loop is None or not sg.loop.forwards:
        return None
    try:
        got = observed_deployment(sg, inp, records.get("stage_cost"))
    except (NoLoopEvidence, ValueError):
        return None
    if got is None:
        return None
    dep, shape = got[:2]
    res = run(dep, frozenset(OBSERVED_CAUSES), shape, keep_spans=True)
    return Lanes("model of the traced loop", res.tok_per_s, tuple(res.slot_sizes), res.spans)


def _herd(inp, rep: Report) -> HerdPair | None:
    from reports.model.scenario import loop_builder as lb
    if not rep.concurrency:
        return None
    C, share = herd_concurrency(rep)
    now = lb.run(inp, C, keep_spans=True)
    before = Lanes("as deployed", now.tok_per_s, tuple(now.slot_sizes), now.spans)
    rec, after = rep.recommendation, None
    st = rec.changes if rec else ()
    if st:
        res = lb.run(inp, C, keep_spans=True, changes=st)
        after = Lanes(f"{rec.knob} {rec.setting}", res.tok_per_s, tuple(res.slot_sizes),
                      res.spans)
    return HerdPair(C, share, before, after)


def _spans_json(spans: tuple[Span, ...]) -> list:
    return [[s.rank, s.slot, s.batch, s.start_us, s.end_us] for s in spans]


def _spans(rows: list) -> tuple[Span, ...]:
    return tuple(Span(int(r), int(k), int(b), float(a), float(z)) for r, k, b, a, z in rows)


def _lanes_json(x: Lanes | None):
    return None if x is None else {"label": x.label, "tok_per_s": x.tok_per_s,
                                   "slot_sizes": list(x.slot_sizes),
                                   "spans": _spans_json(x.spans)}


def _lanes(d) -> Lanes | None:
    return None if d is None else Lanes(d["label"], float(d["tok_per_s"]),
                                        tuple(d["slot_sizes"]), _spans(d["spans"]))


def _to_json(m: ModelRun) -> dict:
    h = m.herd
    return {"report": m.report.to_json(),
            "spans": {str(C): _spans_json(s) for C, s in m.spans.items()},
            "herd": None if h is None else {"concurrency": h.concurrency, "share": h.share,
                                            "before": _lanes_json(h.before),
                                            "after": _lanes_json(h.after)},
            "observed": _lanes_json(m.observed)}


def _from_json(d: dict) -> ModelRun:
    h = d["herd"]
    return ModelRun(Report.from_json(d["report"], "model-run cache", strict=True),
                    {int(C): _spans(s) for C, s in d["spans"].items()},
                    None if h is None else HerdPair(int(h["concurrency"]), h["share"],
                                                    _lanes(h["before"]), _lanes(h["after"])),
                    _lanes(d.get("observed")))
