"""What changed between two diagnosed runs of the same server: "change one setting, measure again".

Input: the `diagnosis` part (reports/model/report_type.py) of this report and of a baseline
report (`ppscope report --baseline OLD/report.json`), each the Shapley split of its own observed
loop (reports/model/observed/diagnose.py).
Output: the slowdown against the baseline (observed decode step when both runs have an observed
tok/s, else the modelled step, said so) and, per cause, its ms per decode step then and now.

How to read it: a cause's growth is `now - then` in ms per decode step; its share of the change
is that growth over the step's change. The causes' growths add up to the change of the *modelled*
step (each side's rows add up to its modelled - reference); the part of the observed change the
model does not reproduce is the change of `unexplained`, shown as its own row. Comparing sizes
("host makes it 22% slower") between runs would mislead when the baseline already had some of
a cause; the growth is what the change did.

How sure (change detection, as pyperf's compare_to and criterion do): with two or more bench
runs on each side, the observed change gets Welch's t interval of the difference of the mean
tok/s (reports/model/observed/resample.py LEVEL), as a change of the decode step; "no
significant change" where it includes no change. Each cause's growth gets the interval of the
joint split over pairs of replicates of the two traced windows (each side's block bootstrap,
drawn independently), widened by the model's own error on a cause's size as the lab measured
it (reports/model/model_error.py: the windows' noise alone held the lab's measured slowdowns in
1 of 23 faults); a cause is said to have grown only where its interval excludes zero. With
one run on a side the run-to-run spread is unknown: the change is judged against SAME_PCT as
before, and the answer says that more runs would decide it.
"""
from __future__ import annotations

import math
from statistics import mean, variance

from reports.model import model_error
from reports.model.observed import resample
from reports.model.observed.deployment import window_differs
from reports.model.change_split import deployment_of, forward_rows, split_change
from reports.model.report_type import (ChangeRow, Comparison, NotCompared, NotDiagnosed,
                                       ServerDiagnosis)

SAME_PCT = 3.0   # a step change below this is "no clear change" (run-to-run noise on the probe)
# a decode step (and a cause's ms per step) ppscope can have written: above 0 and below a
# minute; anything else in a report.json is a damaged or hand-edited file, never divided by
MAX_STEP_MS = 60_000.0


def bad_figure(dg: ServerDiagnosis | NotDiagnosed | None) -> str | None:
    """The first figure of a diagnosis that compare would divide by or subtract and that no
    run can have given (a step of 0, negative, inf or absurd), as `field is value`; None: all
    in bounds. Checked before any arithmetic (a baseline report.json is the user's file)."""
    if not isinstance(dg, ServerDiagnosis):
        return None
    steps = {"diagnosis.modelled_step_ms": dg.modelled_step_ms}
    if dg.observed_step_ms is not None:
        steps["diagnosis.observed_step_ms"] = dg.observed_step_ms
    for k, v in steps.items():
        if not (isinstance(v, (int, float)) and 0 < v < MAX_STEP_MS):
            return f"{k} is {v!r} (a decode step is above 0 and below {MAX_STEP_MS:g} ms)"
    ms = {f"diagnosis.rows[{r.cause}].ms_per_step": r.ms_per_step for r in dg.rows}
    if dg.unexplained_ms is not None:
        ms["diagnosis.unexplained_ms"] = dg.unexplained_ms
    for k, v in ms.items():
        if not (isinstance(v, (int, float)) and math.isfinite(v) and abs(v) < MAX_STEP_MS):
            return f"{k} is {v!r} (ms per decode step: finite, within +-{MAX_STEP_MS:g})"
    return None


def _device_class(v) -> str | None:
    """"cpu", "gpu" (cuda, a GPU's name) or the device as given (npu, xpu, ...)."""
    if v is None:
        return None
    s = str(v).strip().lower()
    return "gpu" if s in ("cuda", "gpu") or s.startswith(("cuda:", "nvidia", "amd ")) else s


def deployment_id(obs: dict | None, dg) -> dict[str, str]:
    """What names a report's server: {model, pp, device} where its evidence says (the observed
    deployment, else the diagnosed loop's pp and device); a key it does not know is absent."""
    v = {k: e.get("value") for k, e in (obs or {}).items() if isinstance(e, dict)}
    out = {}
    if v.get("model") is not None:
        out["model"] = str(v["model"])
    loop = getattr(dg, "deployment", None) if isinstance(dg, ServerDiagnosis) else None
    pp = v.get("pp") if not (obs or {}).get("pp", {}).get("at_least") else None
    if pp is None and loop is not None:
        pp = loop.pp
    if pp is not None:
        out["pp"] = f"PP{pp}"
    dev = _device_class(v.get("device") or (loop.device if loop is not None else None))
    if dev is not None:
        out["device"] = dev
    return out


def _side(d: dict[str, str], keys) -> str:
    return ", ".join(d[k] if k == "pp" else f"{k} {d[k]}" for k in keys)


def mismatch(now: dict[str, str], base: dict[str, str]) -> tuple[list[str], list[str]]:
    """(model/device keys that differ, pp that differs) between two deployment_id()s."""
    differ = [k for k in ("model", "device", "pp") if k in now and k in base and now[k] != base[k]]
    return [k for k in differ if k != "pp"], [k for k in differ if k == "pp"]


def _step(dg: ServerDiagnosis) -> tuple[float, str]:
    if dg.observed_step_ms:
        return float(dg.observed_step_ms), "observed"
    return float(dg.modelled_step_ms), "modelled"


def compare(now: ServerDiagnosis | NotDiagnosed | None,
            base: ServerDiagnosis | NotDiagnosed | None, label: str,
            now_id: dict[str, str] | None = None, base_id: dict[str, str] | None = None
            ) -> Comparison | NotCompared:
    """Both `diagnosis` parts of report.json; `label`: where the baseline came from;
    `now_id`, `base_id`: each side's deployment_id(). Another model or device is another
    server: not compared (the reason names both sides); another PP size is a setting changed,
    compared with a note naming both."""
    for name, dg in (("this run", now), ("the baseline", base)):
        if not isinstance(dg, ServerDiagnosis):
            why = (dg.reason if dg is not None else None) or ("no loop profile (per-rank "
                                                               "traces) in its results")
            return NotCompared("not compared", label, f"{name} has no diagnosis: {why}")
        bad = bad_figure(dg)
        if bad is not None:
            return NotCompared("not compared", label, f"{name}'s {bad}")
    other, pp_changed = mismatch(now_id or {}, base_id or {})
    if other:
        keys = [k for k in ("model", "device", "pp") if k in now_id and k in base_id]
        return NotCompared("not compared", label, (
            f"the baseline is another deployment ({_side(base_id, keys)}; this run "
            f"{_side(now_id, keys)}): a change between two servers is not what one change did"))
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
    if pp_changed:
        notes.append(f"the pipeline size differs (baseline {base_id['pp']}, this run "
                     f"{now_id['pp']}): the change compares two pipelines")
    delta = s_now - s_base
    then = {r.cause: r.ms_per_step for r in base.rows}

    def share(g: float) -> float | None:
        return 100 * g / delta if abs(delta) > 1e-9 else None
    rows = []
    pair = _deployments(now, base)
    parts = _shapley_parts(*pair) if pair is not None else None
    split = "shapley" if parts is not None else "difference"
    err = None
    if parts is not None:
        growth, m_base, m_now = parts
        g_ci = growth_intervals(*pair)
        err = model_error.shipped() if g_ci else None
        for r in now.rows:
            g = growth.get(r.cause, 0.0)
            w_ci = g_ci.get(r.cause)
            ci = (tuple(round(x, 3) for x in model_error.widened(r.cause, w_ci, err)[0])
                  if w_ci else None)
            rows.append(ChangeRow(r.cause, r.label, then.get(r.cause, 0.0), r.ms_per_step, g,
                                  share(g), ci, w_ci))
        if kind == "observed":
            g = delta - (m_now - m_base)
            rows.append(ChangeRow("unexplained", "not reproduced by the model",
                                  s_base - m_base, s_now - m_now, g, share(g)))
    else:
        notes.append("the change is each run's own split subtracted (the baseline report does "
                     "not hold the loop a joint split needs, or the two loops differ in shape)")
        for r in now.rows:
            b = then.get(r.cause, 0.0)
            g = r.ms_per_step - b
            rows.append(ChangeRow(r.cause, r.label, b, r.ms_per_step, g, share(g)))
        un_now, un_base = now.unexplained_ms, base.unexplained_ms
        if kind == "observed" and un_now is not None and un_base is not None:
            g = un_now - un_base
            rows.append(ChangeRow("unexplained", "not reproduced by the model", un_base, un_now,
                                  g, share(g)))
    rows.sort(key=lambda x: -abs(x.growth_ms))
    change = 100 * delta / s_base
    named = [x for x in rows if x.cause != "unexplained"]
    runs = (len(base.observed_runs), len(now.observed_runs))
    c_ci = (change_interval(base.observed_runs, now.observed_runs) if kind == "observed"
            else None)
    sig = None if c_ci is None else not (c_ci[0] <= 0.0 <= c_ci[1])
    if c_ci is not None:
        within = (f"{change:+.1f}% on the observed decode step, {_pct_span(c_ci)} at "
                  f"{100 * resample.LEVEL:.0f}%, {runs[0]} run(s) then, {runs[1]} now")
    if sig is False:
        answer = f"against the baseline: no significant change ({within})"
    elif sig is None and abs(change) < SAME_PCT:
        answer = (f"against the baseline: no clear change ({change:+.1f}% on the {kind} decode "
                  f"step, {s_base:.2f} -> {s_now:.2f} ms; below {SAME_PCT:.0f}%)")
    else:
        sure = [x for x in named if x.growth_ci is None or not (x.growth_ci[0] <= 0.0 <=
                                                                  x.growth_ci[1])]
        word = "slower" if delta > 0 else "faster"
        answer = (f"against the baseline: {abs(change):.0f}% {word} ({kind} decode step "
                  f"{s_base:.2f} -> {s_now:.2f} ms" + (f"; {_pct_span(c_ci)} at "
                                                        f"{100 * resample.LEVEL:.0f}%"
                                                        if c_ci else "") + ")")
        top = max(sure, key=lambda x: x.growth_ms if delta > 0 else -x.growth_ms, default=None)
        if top is None:
            answer += "; no cause's growth is clear of the traced windows' noise"
        else:
            sh = top.share_of_change_pct
            answer += (f"; the largest change is {top.label}: {top.growth_ms:+.2f} ms per step"
                       + (f" ({top.growth_ci[0]:+.2f} to {top.growth_ci[1]:+.2f})"
                          if top.growth_ci else "")
                       + (f" ({sh:.0f}% of the change)" if sh is not None else ""))
        if sig is None and kind == "observed":
            answer += ("; one bench run on a side: its run-to-run spread is unknown, so this "
                       "may be noise (two or more runs per side decide it)")
    for side, dg in (("this run", now), ("the baseline", base)):
        v = dg.deployment
        off = None if v is None else window_differs(v.window_concurrency, dg.concurrency,
                                                     v.forward_us[0] if v.forward_us else ())
        if off is not None:    # said first: the sizes then describe another load
            answer = f"{side}: {off}. {answer[0].upper()}{answer[1:]}"
    return Comparison("ok", label, kind, s_base, s_now, change, tuple(rows), answer,
                      tuple(notes), forward_rows(now.deployment, base.deployment), split,
                      resample.LEVEL if c_ci or any(r.growth_ci for r in rows) else None,
                      c_ci, sig, runs, err.measured_on if err else "")


def _pct_span(ci) -> str:
    return f"{ci[0]:+.1f}% to {ci[1]:+.1f}%"


def change_interval(base_runs, now_runs) -> tuple[float, float] | None:
    """The decode step's change (% of the baseline's), LEVEL interval from the bench runs
    (tok/s per run) on each side: Welch's t interval (Welch-Satterthwaite degrees of freedom)
    of the difference of the mean log tok/s, so the step's ratio C / tok/s is always positive
    and the interval finite however few the runs. None under two runs on a side, or a run
    that is not a throughput."""
    if len(base_runs) < 2 or len(now_runs) < 2 or min(*base_runs, *now_runs) <= 0:
        return None
    lb, ln = [math.log(x) for x in base_runs], [math.log(x) for x in now_runs]
    d = mean(lb) - mean(ln)                   # log of the step's ratio, this run / baseline
    vb, vn = variance(lb) / len(lb), variance(ln) / len(ln)
    se = math.sqrt(vb + vn)
    h = 0.0
    if se > 0:
        df = (vb + vn) ** 2 / (vb ** 2 / (len(lb) - 1) + vn ** 2 / (len(ln) - 1))
        h = resample.t95(max(1, int(df))) * se
    lo, hi = 100 * math.expm1(d - h), 100 * math.expm1(d + h)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    return round(lo, 2), round(hi, 2)


def _deployments(now: ServerDiagnosis, base: ServerDiagnosis):
    """(this run's, the baseline's) Deployment, or None when either report lacks the loop a
    joint split needs or the loops differ in shape (pp, slots)."""
    d_now = deployment_of(now.deployment, now.concurrency)
    d_base = deployment_of(base.deployment, base.concurrency)
    if d_now is None or d_base is None or (d_now.pp, d_now.slots) != (d_base.pp, d_base.slots):
        return None
    return d_now, d_base


def _shapley_parts(d_now, d_base) -> tuple[dict[str, float], float, float] | None:
    """reports/model/change_split.py's joint split of the two loops (None: it cannot
    be modelled)."""
    try:
        return split_change(d_now, d_base)
    except ValueError:
        return None


def growth_intervals(d_now, d_base) -> dict[str, tuple[float, float]]:
    """cause -> LEVEL interval of its growth (ms per step): the joint split of replicate pairs,
    each side's window resampled on its own (independent draws); {} where either window kept
    no blocks."""
    reps_now = resample.replicates(d_now)
    reps_base = resample.replicates(d_base, seed=resample.SEED + 1)
    if not reps_now or not reps_base:
        return {}
    got = [g for g in (_shapley_parts(a, b) for a, b in zip(reps_now, reps_base))
           if g is not None]
    if len(got) < len(reps_now) // 2:
        return {}
    return {c: tuple(round(x, 3) for x in resample.percentile_interval(
        [g[0].get(c, 0.0) for g in got])) for c in got[0][0]}


def compare_reports(rep, old, label: str) -> tuple[Comparison | NotCompared, list[str]]:
    """compare() of two Reports (this run's, the baseline's), with the warnings the report
    carries when the two are not one server's runs (each naming both sides)."""
    now_id = deployment_id(rep.observed_deployment, rep.diagnosis)
    base_id = deployment_id(old.observed_deployment, old.diagnosis)
    c = compare(rep.diagnosis, old.diagnosis, label, now_id, base_id)
    other, pp = mismatch(now_id, base_id)
    warns = []
    if other and isinstance(c, NotCompared):
        warns.append(f"--baseline {label}: not compared: {c.reason}")
    elif pp and isinstance(c, Comparison):
        warns += [f"--baseline {label}: {n}" for n in c.notes if "pipeline size" in n]
    return c, warns
