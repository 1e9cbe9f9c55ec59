"""The report's prose: `answer` (3-5 sentences written from the report's numbers: the biggest
cause of the gap per concurrency, the verdicts that hold, the recommended server setting with
its effect at each measured concurrency, the unexplained gap) and the sentences it is built of."""
from __future__ import annotations


from reports.model.report_type import (ModelledBenchRun,
                                       Comparison,
                                       Report, ServerDiagnosis)
from reports.model.verdicts import Verdict, VerdictAt
from reports.model.settings_change import TP_KNOB, WhatIf
from reports.model.checks.twin_check import DIFFERS, LOSES, NO_BETTER, verdict_clause


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _effects_text(w: WhatIf) -> str:
    return ", ".join(f"C={e.concurrency} {e.baseline_tok_per_s:.1f} -> "
                     f"{e.predicted_tok_per_s:.1f} ({e.gain:+.0%})" for e in w.effects)


def range_text(w: WhatIf) -> str:
    """Where a setting holds (no loss over 2%) over the concurrencies checked."""
    top = w.checked_up_to
    if top is None:
        return "its range not checked"
    lost = w.loses_at
    if lost is None:
        return f"it loses nowhere up to C={top}"
    if w.holds_up_to is None:
        return f"it loses already at C={lost.concurrency} ({lost.gain:+.0%})"
    return (f"it holds up to C={w.holds_up_to} and loses beyond "
            f"(C={lost.concurrency}: {lost.gain:+.0%})")


def _where(at: tuple[VerdictAt, ...], verdict: str) -> str:
    return ", ".join(f"C={a.concurrency}" + (f" ({a.share:.0%} of the gap)"
                                              if a.share is not None and
                                              verdict in ("holds", "minor") else "")
                     for a in at if a.verdict == verdict)


def hypotheses_sentence(verdicts: tuple[Verdict, ...]) -> str:
    """The user's hypotheses in their order, each with the concurrencies where it holds."""
    from reports.model.causes import HYPOTHESES
    order = {h: k for k, h in enumerate(HYPOTHESES)}   # the user's order
    parts = []
    for v in sorted(verdicts, key=lambda v: order.get(v.hypothesis, len(order))):
        at = [a for a in v.at if a.concurrency]
        kinds = list(dict.fromkeys(a.verdict for a in at))
        if len(kinds) > 1:
            rank = ("holds", "minor", "within noise", "does not hold", "not enough evidence")
            text = "; ".join(f"{k} at {_where(at, k)}" for k in sorted(kinds, key=rank.index))
        elif at and v.verdict in ("holds", "minor") and len(at) > 1 and \
                v.hypothesis != "bandwidth is not the limit":
            text = f"{v.verdict} at every C ({_where(at, v.verdict)})"
        else:
            text = v.verdict + (f" ({v.number.split(';')[0]})"
                                if v.verdict in ("holds", "minor") else "")
        cause = v.cause or HYPOTHESES.get(v.hypothesis)
        parts.append(f"{v.hypothesis}: {text}" + (f" [row {cause}]" if cause else ""))
    return "Your hypotheses, judged at every concurrency: " + "; ".join(parts) + "."


def bench_run_sentence(br: ModelledBenchRun) -> str:
    """The model of the observed loop over bench_serving's whole run against its tok/s."""
    ci = br.profiler_slowdown_ci
    slow = (f", the traced window's profiler slowdown ({br.profiler_slowdown:.2f}x"
            + (f", {ci[0]:.2f}-{ci[1]:.2f}x" if ci else "") + ") taken off"
            if br.profiler_slowdown else "")
    left = br.unexplained_ci
    return (f"Over bench_serving's whole run ({br.prompts} prompts: waves, the last below C, "
            f"a prefill visit per prompt){slow}, the model of the observed loop gives "
            f"{br.modelled_tok_per_s:.1f} tok/s against the observed "
            f"{br.observed_tok_per_s:.1f}: {br.unexplained_pct:+.0f}%"
            + (f" ({min(left):+.0f} to {max(left):+.0f}%)" if left else "") + " unexplained.")


def server_whatifs_sentence(sw) -> str | None:
    """The traced server's own what-ifs in one sentence (reports/model/observed/whatifs.py)."""
    if sw is None:
        return None
    if sw.status != "ok":
        return f"Settings tried on your server's own loop: not modelled ({sw.reason})."
    if not sw.rows:
        return None
    def one(r):
        return f"{r.command} {r.change_pct:+.0f}%"
    best = sw.best
    rest = "; ".join(one(r) for r in sw.rows if r is not best)
    head = (f"Settings tried on your server's own loop (bench_serving's run of "
            f"{sw.prompts} prompts at C={sw.concurrency}, modelled): ")
    if best is not None:
        return head + (f"best {one(best)} ({best.note}); the others: {rest}." if rest
                       else f"best {one(best)} ({best.note}).")
    return head + (f"none gains more than {sw.no_change_pct:.0f}% ({rest}).")


def answer(rep: Report) -> list[str]:
    """3-5 plain sentences from the report's own numbers (nothing here is typed by hand)."""
    obs_c = [c.concurrency for c in rep.concurrency if c.observed]
    user_c = obs_c or [c.concurrency for c in rep.concurrency]
    atts = {a.concurrency: a for a in rep.attribution}
    by_cause: dict[str, list[tuple[int, float]]] = {}
    dg = rep.diagnosis
    lead = []
    from reports.model.observed.server import headline
    head = headline(rep.observed_deployment)
    differs = rep.scenario_differs
    aside = rep.scenario_aside is not None   # its own section says what the scenario is
    if isinstance(dg, ServerDiagnosis):  # the observed server first: its evidence decides
        un, br = dg.unexplained_pct, dg.bench_run
        tail = "" if un is None else (f" The model of the observed loop leaves {un:+.0f}% of "
                                      "the observed step unexplained.")
        if br is not None and br.unexplained_pct is not None:
            tail = " " + bench_run_sentence(br)
        lead.append(f"Your server ({head or 'C=' + str(dg.concurrency)}, from its own "
                    f"traces and logs): {dg.answer}.{tail}")
    elif head:
        why = (dg.reason if dg is not None else None) or (
            "no loop profile: read its per-rank traces with `ppscope sglang --traces DIR`")
        lead.append(f"Your server ({head}): not diagnosed ({why}).")
    if differs and not aside:
        lead.append(differs[0].upper() + differs[1:] + ".")
    for C in user_c:
        rows = [r for r in atts[C].rows if r.cause != "unexplained"]
        top = max(rows, key=lambda r: r.ms_per_step)
        if top.ms_per_step > 0:
            by_cause.setdefault(top.label, []).append((C, top.share or 0.0))
    cmp_ = rep.baseline_comparison
    if isinstance(cmp_, Comparison):   # the user changed one thing: what it did comes first
        lead.insert(0, cmp_.answer[0].upper() + cmp_.answer[1:] + ".")
    out, n_lead = lead, len(lead)
    if by_cause and not differs:   # the scenario is another deployment: its sections say so
        parts = [f"{lab.split(' (')[0]} at {' and '.join(f'C={C}' for C, _ in cs)} "
                 f"({', '.join(_pct(sh) for _, sh in cs)} of the gap)"
                 for lab, cs in by_cause.items()]
        top_c = max(user_c)
        cm = next(c for c in rep.concurrency if c.concurrency == top_c)
        out.append(("In the scenario model (the deployment the scenario describes, estimates "
                    "where no evidence says): b" if lead else "B") +
                   f"iggest cause of the gap between ideal and modelled throughput: "
                   f"{'; '.join(parts)}. At C={top_c} the model gives "
                   f"{cm.predicted:.1f} tok/s of an ideal {cm.ideal_tok_per_s:.1f}.")
    out.insert(n_lead, hypotheses_sentence(rep.verdicts))
    from reports.model.scenario.arrival import sentence
    arr = sentence(rep.arrival) if rep.arrival and not differs else None
    if arr:
        out.append(arr)
    best = rep.recommendation
    tp = next((w for w in rep.what_ifs if w.knob == TP_KNOB), None)
    if differs:   # the scenario's what-ifs are not advice for the traced server
        best, tp = None, None
        sw = server_whatifs_sentence(rep.server_whatifs)
        if aside:
            out += [sw] if sw else []
        else:
            out.append((sw + " " if sw else "") +
                       "No server setting is recommended from the scenario model: it is not "
                       "the traced server (pass --scenario with your deployment for its "
                       "what-ifs).")
    elif best:
        lost = best.twin_verdict == LOSES
        s = (("The model's best single server setting" if lost else "Best single server setting")
             + " (geometric mean of tok/s over the measured "
             f"concurrencies, none worse by over 2%, the mixed load included): "
             f"{best.knob} = {best.setting}, {best.gain:+.0%} on that mean: "
             f"{_effects_text(best)}; {range_text(best)}"
             + (f" ({best.twin}{verdict_clause(best)})" if best.twin_verdict in (LOSES, DIFFERS)
                else ""))
        pair = rep.best_pair
        if pair and pair.gain > best.gain + 0.005:
            if pair.twin_verdict in (LOSES, NO_BETTER):
                s += (f". The model's best two settings together, {pair.knob} = {pair.setting} "
                      f"({pair.gain:+.0%} on that mean), are not recommended: {pair.twin}"
                      f"{verdict_clause(pair, best)}")
            else:
                s += (f". Best two settings together: {pair.knob} = {pair.setting}, "
                      f"{pair.gain:+.0%} on that mean: {_effects_text(pair)}; "
                      f"{range_text(pair)}"
                      + (f" ({pair.twin}{verdict_clause(pair)})" if pair.twin else ""))
    else:
        s = ("No single server setting raises the geometric mean of modelled tok/s by more "
             "than 0.5% without losing over 2% at a measured concurrency")
    if tp and tp.gain > 0.005:
        # TP is a rough estimate (ring all-reduce + 1/p of the weights), not a measured
        # configuration, and not a server setting: qualify it.
        s += (f"; outside PP, a rough estimate, not a measurement, puts {tp.knob} "
              f"({tp.setting}) at {tp.gain:+.0%} on that mean: measure it before acting "
              "on it")
    if not differs:
        out.append(s + ".")
    un = [(C, r) for C in obs_c for r in atts[C].rows if r.cause == "unexplained"]
    if un:
        parts = []
        for C, r in un:
            o = next(c.observed for c in rep.concurrency if c.concurrency == C)
            word = "slower" if r.ms_per_step > 0 else "faster"
            parts.append(f"C={C} observed {o:.1f} vs modelled {o - r.tok_per_s:.1f} tok/s "
                         f"({abs(r.ms_per_step):.1f} ms/step {word})")
        imp = rep.implied_efficiency
        why = ""
        if imp:  # which input would have to change (an estimate: reports/model/scenario/implied.py)
            worst = max(imp, key=lambda x: abs(x.observed_tok_per_s / x.modelled_tok_per_s - 1))
            C, i1 = worst.concurrency, worst.implied_b1
            why = (f" Estimated: C={C} needs kernels at {i1:.0%} of the floor (b=1), not "
                   f"{worst.efficiency_b1:.0%}"
                   + ("" if worst.possible else " (beyond the floor: not kernels alone)")
                   + "." if i1 is not None else
                   f" Estimated: no kernel efficiency explains the C={C} miss.")
        out.append("Unexplained by the model: " + "; ".join(parts) + "." + why)
    elif not differs:
        out.append("No observed throughput given (--observed or --bench), so the unexplained "
                   "gap is not known.")
    if rep.all_estimated and not aside:
        tr = any(p.source == "transferred" for p in rep.params)
        out.append(f"Every figure except the observed tok/s is estimated"
                   f"{' or transferred from another GPU' if tr else ''}; run the probes on the "
                   "GPUs (make all) to replace the estimates with measurements.")
    return out
