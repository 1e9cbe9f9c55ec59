"""The answer as a table: what heads report.md, report.html and the terminal.

One row per hypothesis, in the user's order (reports/model/causes.py `HYPOTHESES`): the verdict,
the number that decides it, the concurrencies where it holds, and what to do about it (the best
modelled setting that acts on its cause, with its predicted gain, and whether it was run on
SGLang: the report's what-ifs are the model's, so "not run on SGLang" unless the report holds a
measurement of that setting). Then at most three short sentences (`answer_sentences`): the
biggest cause, the recommendation, and what the answer hangs on (how requests arrive). The
report's longer answer (`Report.answer`) follows them, under "In detail".

Everything is read from report.json (`Report`); nothing here computes a number.
"""
from __future__ import annotations

import re

from reports.model.causes import BANDWIDTH, HYPOTHESES, label
from reports.model.report_type import Report, ServerDiagnosis
from reports.model.verdicts import Verdict
from reports.model.observed.diagnose import span
from reports.base.server_flags import flag_of
from reports.model.settings_change import (GRAPH_MAX_BS, LAYER_PARTITION, PACING, REQUEST_RATE,
                                           TP_KNOB, WhatIf)
from reports.model.checks.twin_check import LOSES, verdict_clause
from reports.render.table import Table

# The settings that act on each cause (the what-if knobs of reports/model/scenario/whatifs.py
# and reports/model/observed/whatifs.py, SGLang's flags from the one table,
# reports/base/server_flags.py): a row's "what to do" is the best what-if among them that the
# model computed. A cause no setting moves in the model says so, and what would (`NO_SETTING`):
# never a gain the model did not compute.
_DEPTH = flag_of("pp_async_batch_depth")
FIXES: dict[str, tuple[str, ...]] = {
    "herd": (flag_of("pp_max_micro_batch_size"), flag_of("chunked_prefill_size"),
             flag_of("max_running_requests"), PACING, REQUEST_RATE),
    "slow_stage": (LAYER_PARTITION,),
    "launch_gaps": (GRAPH_MAX_BS,),
    "token_return": (_DEPTH,),
    # more micro-batches in flight: another slot's forward runs while a hop is on the wire
    "hop": (_DEPTH,),
}
# what would help where no server setting does (not estimated unless a what-if says so)
NO_SETTING: dict[str, str] = {
    "hop": "faster links or fewer bytes per hop, or another layout such as TP",
    "host": "a faster or less busy CPU core per rank",
    "relay": "a faster or less busy CPU core on the rank the request list waits for",
    "launch_gaps": "CUDA graphs covering the micro-batch sizes the server runs",
    "herd": "requests that arrive spread out rather than together",
    "slow_stage": "moving layers off the slow rank, or a faster device for it",
    "routing_skew": "expert placement that spreads the hot experts",
    "kernel_efficiency": "faster kernels for the layer (another backend or quantisation)",
    "token_return": "a shorter token return path",
}
# the answer table's name for a named cause no hypothesis settles
ROW_NAMES = {"host": "host work", "relay": "rank chaining"}
NOT_RUN = "not run on SGLang"
DETAIL_TITLE = "In detail"      # the heading of the report's longer answer, under the table
HEADERS = ("hypothesis", "verdict", "deciding number", "holds at", "what to do")
NUMBER_CHARS = 70          # a clause longer than this is not a table cell


def _ordered(verdicts: tuple[Verdict, ...]) -> list[Verdict]:
    order = {h: k for k, h in enumerate(HYPOTHESES)}
    return sorted(verdicts, key=lambda v: order.get(v.hypothesis, len(order)))


def deciding_number(v: Verdict) -> str:
    """The verdict's own first clause when short; else its first short clause on the share of
    the gap; else the first clause up to its colon (the number before the reason); else cut."""
    clauses = [c.strip() for c in v.number.split("; ") if c.strip()] or ["-"]
    if len(clauses[0]) <= NUMBER_CHARS:
        return clauses[0]
    gap = next((c for c in clauses if "of the gap" in c and len(c) <= NUMBER_CHARS), None)
    head = clauses[0].split(": ")[0]      # "slows the observed server by 42%: <why>"
    return gap or (head if len(head) <= NUMBER_CHARS else head[:NUMBER_CHARS - 3] + "...")


def holds_at(v: Verdict) -> str:
    at = [a for a in v.at if a.concurrency]
    held = [a for a in at if a.verdict == "holds"]
    minor = [a for a in at if a.verdict == "minor"]
    if at and len(held) == len(at):
        return "every C"
    parts = []
    if held:
        parts.append("C=" + ", ".join(str(a.concurrency) for a in held))
    if minor:
        parts.append("minor at C=" + ", ".join(str(a.concurrency) for a in minor))
    return "; ".join(parts) or "nowhere"


def best_fix(rep: Report, cause: str | None) -> WhatIf | None:
    """The best what-if (the report's order: best first) that acts on `cause` and gains: a
    server setting within the 2% loss bound first, else any."""
    knobs = FIXES.get(cause or "", ())
    rows = [w for w in rep.what_ifs if w.knob in knobs and w.gain > 0.005]
    return next((w for w in rows if w.eligible), rows[0] if rows else None)


def _gain_at(w: WhatIf, C: int | None) -> str:
    e = next((e for e in w.effects if e.concurrency == C), None) or \
        max(w.effects, key=lambda e: e.gain)
    return f"{e.gain:+.0%} at C={e.concurrency}"


def _strongest_c(v: Verdict) -> int | None:
    at = [a for a in v.at if a.concurrency and a.share is not None]
    return max(at, key=lambda a: (a.share, a.concurrency)).concurrency if at else None


def _no_setting(cause: str | None, tried: str = "", estimate: str = "") -> str:
    """The plain cell where no modelled setting acts on `cause`: what would, said as not
    estimated unless `estimate` gives the model's own figure."""
    c = cause or ""
    what = NO_SETTING.get(c, "other hardware")
    head = (f"no setting tried helps{tried}" if tried.startswith(" (") and "not tried" not in
            tried else f"no setting modelled acts on it{tried}")
    return f"{head}; what would: {what}" + (f" ({estimate})" if estimate else
                                             " (not estimated)")


def _observed_row(rep: Report, v: Verdict):
    """The diagnosis' row behind `v` where the observed server's diagnosis decided it."""
    dg = rep.diagnosed
    if dg is None or v.cause is None or "the observed server" not in v.number:
        return None
    return next((r for r in dg.rows if r.cause == v.cause), None)


def _server_fix(rep: Report, cause: str) -> tuple[WhatIf | None, str]:
    """The best of the settings tried on the observed server's own loop that acts on `cause`
    and gains over the what-ifs' no-change bound, and (when none does) what was tried."""
    sw = rep.server_whatifs
    if sw is None or sw.status != "ok":
        why = sw.reason if sw is not None and sw.reason else "no bench run in the evidence"
        return None, f" (settings not tried on this server: {why})"
    rows = [w for w in sw.rows if w.knob in FIXES.get(cause, ())]
    good = [w for w in rows if w.change_pct > sw.no_change_pct]
    if good:
        return good[0], ""
    tried = ", ".join(f"{w.command} {w.change_pct:+.0f}%" for w in rows)
    return None, f" ({tried}, modelled)" if tried else ""


def _split_cell(dg) -> str:
    """The slow stage's cell on the observed server: the layer split of the diagnosis."""
    f = dg.layer_split
    if f is None:
        return (f"{LAYER_PARTITION}: not estimated (the layers each rank runs are not in the "
                "evidence: give `ppscope sglang` --model, the served model)")
    return (f"{LAYER_PARTITION}={f.value} (now {f.now}): {f.gain_pct:+.0f}%{span(f.gain_ci)} "
            f"at C={dg.concurrency} ({NOT_RUN})")


def observed_what_to_do(rep: Report, cause: str) -> str:
    """What to do about a cause the observed server's diagnosis names: a setting tried on its
    own loop with its modelled gain, else plainly none, and what would."""
    dg = rep.diagnosed
    if cause == "slow_stage":
        return _split_cell(dg)
    w, tried = _server_fix(rep, cause)
    if w is not None:
        how = "client-side" if w.knob == REQUEST_RATE else NOT_RUN
        return f"{w.command}: {w.change_pct:+.0f}% at C={dg.concurrency} ({how})"
    return _no_setting(cause, tried)


def what_to_do(rep: Report, v: Verdict) -> str:
    if v.verdict == "within noise":
        return "decide it: a longer traced window, more bench runs"
    if v.verdict == "not enough evidence":
        missing = next((c.strip() for c in v.number.split(";") if c.strip().startswith("no ")),
                       None)
        return f"measure it: {missing}" if missing else "measure it (Measure your server)"
    hop_slow = v.hypothesis == BANDWIDTH and v.verdict != "holds"
    if v.hypothesis == BANDWIDTH and not hop_slow:
        return "nothing"
    if not hop_slow and v.verdict not in ("holds", "minor"):
        return "nothing"
    if _observed_row(rep, v) is not None:
        return observed_what_to_do(rep, v.cause)
    if hop_slow:
        return _no_setting("hop", estimate=_tp_estimate(rep))
    w = best_fix(rep, v.cause)
    if w is None:
        return _no_setting(v.cause) if v.cause else "-"
    C = _strongest_c(v)
    how = "client-side" if w.knob == PACING else (_twin_at(w.twin, C) or NOT_RUN)
    return f"{w.knob} {w.setting}: {_gain_at(w, C)} ({how})"


def _tp_estimate(rep: Report) -> str:
    """The scenario model's own TP what-if, where it has one: TP estimated."""
    tp = next((w for w in rep.what_ifs if w.knob == TP_KNOB), None)
    if tp is None or rep.scenario_differs:
        return ""
    return f"TP {tp.setting}: {_gain_at(tp, None)} estimated, {NOT_RUN}"


def _twin_at(twin: str | None, C: int | None) -> str | None:
    """What the twin measured at C, from the row's twin text (twin_check.twin_text):
    "twin +100%" (on SGLang's scheduler, said in full in the row); the whole text when C is
    not in it."""
    if not twin:
        return None
    m = re.search(rf"([+-]\d+%) at C={C}\b", twin) if C is not None else None
    return f"twin {m.group(1)}" if m else twin


def _unheld_causes(rep: Report) -> list[tuple[str, ...]]:
    """A row for each cause the observed server's diagnosis names that no hypothesis settles
    (host work, rank chaining): named, so it gets its own "what to do"."""
    dg = rep.diagnosed
    if dg is None:
        return []
    settled = {v.cause for v in rep.verdicts if _observed_row(rep, v) is not None}
    rows = {r.cause: r for r in dg.rows}
    return [(ROW_NAMES.get(c, _short(label(c))), "holds",
             f"slows the observed server by {rows[c].size_pct or 0:.0f}%{span(rows[c].size_ci)}",
             f"C={dg.concurrency}", observed_what_to_do(rep, c))
            for c in dg.named if c not in settled and c in rows]


def answer_table(rep: Report) -> Table:
    rows = tuple((v.hypothesis, v.verdict, deciding_number(v), holds_at(v), what_to_do(rep, v))
                 for v in _ordered(rep.verdicts)) + tuple(_unheld_causes(rep))
    return Table(HEADERS, rows, (False,) * len(HEADERS))


def _short(cause_label: str) -> str:
    return cause_label.split(" (")[0]


def _biggest_cause(rep: Report) -> str | None:
    """The observed server's own answer when it was diagnosed; else the cause with the largest
    share of the gap (ideal -> modelled) at each concurrency, grouped by cause."""
    dg = rep.diagnosis
    if isinstance(dg, ServerDiagnosis):   # its first clause: the cause and how much slower
        first = dg.answer.split("; ")[0].rstrip(".")
        return f"Biggest cause: {first}."
    by: dict[str, list[tuple[int, float]]] = {}
    for a in sorted(rep.attribution, key=lambda a: a.concurrency):
        rows = [r for r in a.rows if r.cause != "unexplained" and r.share is not None]
        if rows:
            r = max(rows, key=lambda r: r.share)
            by.setdefault(_short(r.label), []).append((a.concurrency, r.share))
    if not by:
        return None
    parts = [f"{what} at C={', '.join(str(c) for c, _ in at)} "
             f"({', '.join(f'{s:.0%}' for _, s in at)})" for what, at in by.items()]
    parts[0] = parts[0][:-1] + " of the gap)"    # ideal -> modelled, as in the attribution
    return "Biggest cause: " + "; ".join(parts) + "."


def _recommendation(rep: Report) -> str:
    """The settings tried on the traced server's own loop when there are some; else the
    scenario model's recommended setting (said to be the scenario's when it is not the
    server's)."""
    sw = rep.server_whatifs
    if sw is not None and sw.status == "ok" and sw.rows:
        best = sw.best
        tried = ", ".join(f"{r.command} {r.change_pct:+.0f}%" for r in sw.rows)
        head = (f"Recommended on your server's own loop (C={sw.concurrency}): {best.command}, "
                f"{best.before_tok_per_s:.1f} -> {best.after_tok_per_s:.1f} tok/s" if best else
                f"On your server's own loop (C={sw.concurrency}) no setting tried gains over "
                f"{sw.no_change_pct:.0f}%")
        return f"{head} ({NOT_RUN}; tried: {tried})."
    if rep.scenario_aside is not None:    # the scenario's what-ifs are not this server's
        from reports.answer import server_whatifs_sentence
        return server_whatifs_sentence(sw) or ("No setting was tried on your server's own "
                                               "loop (no loop profile).")
    rec = rep.recommendation
    scen = f"In scenario {rep.scenario} (not your server): " if rep.scenario_differs else ""
    if rec is None:
        return (f"{scen}{'n' if scen else 'N'}o server setting raises the modelled tok/s by "
                "more than 0.5% within 2% loss.")
    e = max(rec.effects, key=lambda e: e.gain)
    cs = ", ".join(str(c) for c in rep.measured_concurrency)
    where = (f"no loss up to C={rec.checked_up_to}" if rec.checked_up_to and rec.loses_at is None
             else "see its range under What-ifs")
    lead = "the model's pick, not recommended" if rec.twin_verdict == LOSES else "recommended"
    lead = lead if scen else lead[0].upper() + lead[1:]
    return (f"{scen}{lead}: {rec.knob} {rec.setting}: C={e.concurrency} "
            f"{e.baseline_tok_per_s:.1f} -> {e.predicted_tok_per_s:.1f} tok/s ({e.gain:+.0%}), "
            f"{rec.gain:+.0%} on the geometric mean over C={cs}, {where} "
            f"({rec.twin or NOT_RUN}{verdict_clause(rec)}).")


def _arrival(rep: Report) -> str | None:
    alt = rep.arrival
    if alt is None or not alt.differs_at or alt.source == "observed":
        return None     # the arrival was read from the server's log: not an assumption
    from reports.report_run import herd_concurrency
    C = herd_concurrency(rep)[0]
    row = next((r for r in alt.by_concurrency if r.concurrency == C), None) or \
        next(r for r in alt.by_concurrency if r.concurrency == max(alt.differs_at))
    other = "trickle" if alt.assumed == "burst" else "burst"
    if alt.assumed not in row.tok_per_s or other not in row.tok_per_s:
        return None
    fits = (f"; the observed {row.observed:.1f} fits {row.observed_fits}"
            if row.observed and row.observed_fits else "")
    return (f"It hangs on how requests arrive: at C={row.concurrency} {alt.assumed} (assumed, "
            f"{alt.source}) gives {row.tok_per_s[alt.assumed]:.1f} tok/s, {other} "
            f"{row.tok_per_s[other]:.1f}{fits}.")


def answer_sentences(rep: Report) -> list[str]:
    """At most three: the biggest cause, the recommendation, what the answer hangs on."""
    out = [_biggest_cause(rep), _recommendation(rep), _arrival(rep)]
    return [s for s in out if s][:3]


def _shorten(text: str, width: int, lines: int = 2) -> str:
    """`text` in at most `lines` lines of `width`, its last two words (the number, as in
    "by 32%") kept: words are dropped before them until it fits."""
    import textwrap

    def fits(t: str) -> bool:
        return len(textwrap.wrap(t, width, break_on_hyphens=False)) <= lines
    if fits(text):
        return text
    words = text.split()
    for k in range(len(words) - 3, 0, -1):
        t = " ".join(words[:k]) + " ... " + " ".join(words[-2:])
        if fits(t):
            return t
    return textwrap.shorten(text, width * lines, placeholder="...")


def _head(text: str, width: int, lines: int = 2) -> str:
    """`text` in at most `lines` lines of `width`, its start kept (the setting and its gain
    come first): words are dropped from the end, "..." in their place."""
    import textwrap
    words = text.split()
    for k in range(len(words), 0, -1):
        t = " ".join(words[:k]) + ("" if k == len(words) else " ...")
        if len(textwrap.wrap(t, width, break_on_hyphens=False)) <= lines:
            return t
    return textwrap.shorten(text, width, placeholder="...")


def terminal_answer(rep: Report, width: int = 100) -> list[str]:
    """The table (cells wrapped to fit `width`) and the sentences, for the terminal."""
    import textwrap

    from tabulate import tabulate
    t = answer_table(rep)
    # column widths that fit 100 columns with tabulate's two-space gaps; a deciding number is
    # cut to two lines here (report.md and report.html have it whole)
    widths = [15, 10, 26, 8, 31] if width >= 100 else [12, 9, 20, 8, 20]
    rows = [[h, v, _shorten(n, widths[2]), w, _head(d, widths[4])] for h, v, n, w, d in t.rows]
    text = tabulate(rows, headers=list(t.headers), tablefmt="simple",
                    disable_numparse=True, maxcolwidths=widths, maxheadercolwidths=widths)
    out = text.splitlines()
    for s in answer_sentences(rep):
        out += textwrap.wrap(s, width, break_on_hyphens=False)
    return out

