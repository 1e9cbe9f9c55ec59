"""What changed between two diagnosed runs of the same server: "change one setting, measure again".

Input: the `diagnosis` part (reports/model/report_type.py) of this report and of a baseline
report (`ppscope report --baseline OLD/report.json`), each the Shapley split of its own observed
loop (reports/model/diagnose.py).
Output: the slowdown against the baseline (observed decode step when both runs have an observed
tok/s, else the modelled step, said so) and, per cause, its ms per decode step then and now.

How to read it: a cause's growth is `now - then` in ms per decode step; its share of the change
is that growth over the step's change. The causes' growths add up to the change of the *modelled*
step (each side's rows add up to its modelled - reference); the part of the observed change the
model does not reproduce is the change of `unexplained`, shown as its own row. Comparing sizes
("host makes it 22% slower") between runs would mislead when the baseline already had some of
a cause; the growth is what the change did.
"""
from __future__ import annotations

from reports.model.report_type import (ChangeRow, Comparison, NotCompared, NotDiagnosed,
                                       ServerDiagnosis)

SAME_PCT = 3.0   # a step change below this is "no clear change" (run-to-run noise on the probe)


def _step(dg: ServerDiagnosis) -> tuple[float, str]:
    if dg.observed_step_ms:
        return float(dg.observed_step_ms), "observed"
    return float(dg.modelled_step_ms), "modelled"


def compare(now: ServerDiagnosis | NotDiagnosed | None,
            base: ServerDiagnosis | NotDiagnosed | None, label: str
            ) -> Comparison | NotCompared:
    """Both `diagnosis` parts of report.json; `label`: where the baseline came from."""
    for name, dg in (("this run", now), ("the baseline", base)):
        if not isinstance(dg, ServerDiagnosis):
            why = (dg.reason if dg is not None else None) or ("no loop profile (per-rank "
                                                               "traces) in its results")
            return NotCompared("not compared", label, f"{name} has no diagnosis: {why}")
    s_now, k_now = _step(now)
    s_base, k_base = _step(base)
    kind = "observed" if k_now == k_base == "observed" else "modelled"
    if kind == "modelled":
        s_now, s_base = float(now.modelled_step_ms), float(base.modelled_step_ms)
    notes = []
    if now.concurrency != base.concurrency:
        notes.append(f"concurrency differs (baseline C={base.concurrency}, this run "
                     f"C={now.concurrency}): the step compares different loads")
    if kind == "modelled":
        notes.append("no observed tok/s on one side: the change is the modelled step's")
    delta = s_now - s_base
    then = {r.cause: r.ms_per_step for r in base.rows}
    rows = []
    for r in now.rows:
        b = then.get(r.cause, 0.0)
        g = r.ms_per_step - b
        rows.append(ChangeRow(r.cause, r.label, b, r.ms_per_step, g,
                              100 * g / delta if abs(delta) > 1e-9 else None))
    un_now, un_base = now.unexplained_ms, base.unexplained_ms
    if kind == "observed" and un_now is not None and un_base is not None:
        g = un_now - un_base
        rows.append(ChangeRow("unexplained", "not reproduced by the model", un_base, un_now, g,
                              100 * g / delta if abs(delta) > 1e-9 else None))
    rows.sort(key=lambda x: -abs(x.growth_ms))
    change = 100 * delta / s_base
    named = [x for x in rows if x.cause != "unexplained"]
    if abs(change) < SAME_PCT:
        answer = (f"against the baseline: no clear change ({change:+.1f}% on the {kind} decode "
                  f"step, {s_base:.2f} -> {s_now:.2f} ms; below {SAME_PCT:.0f}%)")
    else:
        top = max(named, key=lambda x: x.growth_ms if delta > 0 else -x.growth_ms)
        word = "slower" if delta > 0 else "faster"
        sh = top.share_of_change_pct
        answer = (f"against the baseline: {abs(change):.0f}% {word} ({kind} decode step "
                  f"{s_base:.2f} -> {s_now:.2f} ms); the largest change is {top.label}: "
                  f"{top.growth_ms:+.2f} ms per step"
                  + (f" ({sh:.0f}% of the change)" if sh is not None else ""))
    return Comparison("ok", label, kind, s_base, s_now, change, tuple(rows), answer,
                      tuple(notes))
