"""report.json -> Markdown (results/report.md), plus the table builders the HTML page shares.

Order (same in report.md and report.html): title and what is measured vs estimated, The answer
(reports/render/answer_table.py: the table, the herd drawn, three sentences, then the longer
answer "In detail"), what is deployed and the warnings, Your server's diagnosis and What-ifs on
your server (its own traced loop, sglang.json), Throughput, Verdicts, Your server (sglang.json:
observed, each column tagged with its source), Where the time goes (one attribution table per
concurrency), What-ifs (one server setting at every measured concurrency, best first), Model vs
dispatch probe, Micro-batch count, Measured pipeline timeline (dispatch.trace.json; in HTML it
sits with the simulated one), Links between GPUs (topology.json: its source label, `given` for a
pasted `topo -m`, the unknown links and what the parser skipped), Where the model differs from
SGLang, Inputs, Scenario assumptions. With a DP-attention log, Your server adds one row per (PP
rank, DP rank) and says how the PP rank's figures combine the DP ranks'. Each table builder
returns a `Table`: headers with units, rows as display strings, and which columns are numbers
(right-aligned).
"""
from __future__ import annotations

from typing import Any


from reports.base.schema import to_json
from reports.base.server_flags import flag_of
from reports.model.report_type import (AttributionAt, Comparison, Report, ServerDiagnosis,
                                       ServerSummary)
from reports.model.observed.diagnose import span
from reports.model.settings_change import GRAPH_MAX_BS, WhatIf
from reports.model.checks.twin_check import DIFFERS, LOSES, verdict_clause
from reports.render.answer_table import (DETAIL_TITLE, answer_sentences, answer_table)
from reports.render.table import Table, md_grid


def _f(x: Any, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _signed(x: float) -> str:
    return f"{x + 0.0:+.1f}" if abs(x) >= 0.05 else "0.0"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def fmt_value(v: Any, limit: int = 90) -> str:
    """A model input for a table cell: floats to 3-4 significant digits, (batch, value) curves
    as `b: v` pairs, dicts as `k: v`."""
    def num(x):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return str(x)
        return str(x) if isinstance(x, int) else f"{x:.4g}"
    v = to_json(v)   # as report.json holds it: tuples are lists
    if isinstance(v, list) and v and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in v):
        s = ", ".join(f"{num(a)}: {num(b)}" for a, b in v)
    elif isinstance(v, dict):
        s = ", ".join(f"{k}: {num(x)}" for k, x in v.items())
    else:
        s = num(v)
    return s if len(s) <= limit else s[:limit - 3] + "..."


def report_title(rep: Report) -> str:
    """The server the evidence comes from when there is one; else the scenario."""
    from reports.model.observed.server import headline
    head = headline(rep.observed_deployment)
    if head:
        return f"ppscope report: your server ({head})"
    d = rep.deployment
    return (f"ppscope report: {d.model} on {d.pp}x {d.gpu}, PP{d.pp} (scenario "
            f"{rep.scenario})")


def observed_lines(rep: Report) -> list[str]:
    """Each setting of the observed server with where it was read (reports/model/observed/server.py)."""
    obs = rep.observed_deployment or {}
    if not obs:
        return []
    parts = [f"{k} {fmt_value(e['value'])} ({e['source'].removeprefix('observed: ')})"
             for k, e in obs.items() if isinstance(e, dict) and "value" in e]
    out = ["Your server, observed: " + "; ".join(parts) + "."]
    if rep.scenario_differs:
        out.append(f"Scenario {rep.scenario}: {rep.scenario_differs}.")
    return out


def header_lines(rep: Report) -> list[str]:
    """Deployment, then where the numbers come from (plain text, no Markdown)."""
    d = rep.deployment
    dep = (("Scenario model: " if rep.observed_deployment else "") +
           f"{d.model} on {d.pp}x {d.gpu}" + (f" ({d.memory})" if d.memory else "") +
           f": {flag_of('pp_size')} {d.pp}, {flag_of('pp_async_batch_depth')} {d.async_depth}, "
           f"{flag_of('pp_max_micro_batch_size')} {d.max_micro_batch}, CUDA graphs "
           f"{'on' if d.cuda_graphs else 'off'} ({GRAPH_MAX_BS} {d.graph_max_bs}), "
           f"{d.arrival} arrivals, mean context {d.context_len} tokens.")
    by: dict[str, list[str]] = {}
    for p in rep.params:
        by.setdefault(p.source, []).append(p.name)
    src = "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(by.items()))
    out = observed_lines(rep) + [dep, f"Inputs by source -- {src}."]
    if rep.topology and rep.topology.gpus:
        g = rep.topology.gpus
        names = sorted({str(x) for x in g if x})
        out.append(f"Probes ran on {len(g)}x {', '.join(names)}." if names else
                   f"The topology record lists {len(g)} GPUs (no names: a pasted `nvidia-smi "
                   "topo -m` table, so its link levels are labelled given).")
    return out


def banner(rep: Report) -> str:
    obs = " and everything under \"Your server\" (sglang.json)" if rep.server else ""
    if any(w is not None and w.twin and "shipped with ppscope" in w.twin
           for w in (*rep.what_ifs, rep.recommendation, rep.best_pair)):
        obs += (" and the twin's changes (SGLang's own scheduler with the device time emulated, "
                "a run shipped with ppscope)")
    if rep.all_estimated:
        tr = [p for p in rep.params if p.source == "transferred"]
        return ("Every figure below is estimated" + (" or transferred" if tr else "")
                + " (no probe records from this machine: roofline, datasheet and the scenario's "
                "stated assumptions" + "".join(f"; {p.name} transferred from {p.evidence}"
                                                for p in tr)
                + f"), except the observed tok/s{obs}.")
    measured = [r for r in rep.records_used if r != "sglang.json"]
    return (f"Measured inputs from {', '.join(measured)}; the rest is estimated"
            + (f"; observed: the tok/s{obs}." if obs else "."))


def throughput_table(rep: Report) -> Table:
    rows = []
    for c in rep.concurrency:
        ratio = c.observed / c.predicted if c.observed and c.predicted else None
        rows.append((str(c.concurrency), _f(c.ideal_tok_per_s), _f(c.predicted),
                     _f(c.observed), "-" if ratio is None else f"{ratio:.2f}",
                     _f(c.predicted_tpot_ms, 2),
                     " ".join(f"{b:.0%}" for b in c.busy_frac),
                     " ".join(str(s) for s in c.slot_sizes if s)))
    return Table(("C", "ideal tok/s", "modelled tok/s", "observed tok/s", "observed / modelled",
                  "modelled TPOT ms", "GPU busy per stage", "occupied slots (requests)"),
                 tuple(rows), (True, True, True, True, True, True, False, False))


def observed_line(rep: Report) -> str:
    return f"Observed tok/s from {rep.observed_source} (observed; not used by the model)."


def verdict_table(rep: Report) -> Table:
    """One row per hypothesis: its verdict over every concurrency, then at each C (with the
    share of the gap its cause's row has there), the row it comes from and the numbers."""
    cs = sorted({a.concurrency for v in rep.verdicts for a in v.at if a.concurrency})

    def at(v, C: int) -> str:
        a = next((a for a in v.at if a.concurrency == C), None)
        if a is None:
            return "-"
        return a.verdict + ("" if a.share is None else f" ({a.share:.0%})")
    return Table(("hypothesis", "verdict", *(f"at C={C}" for C in cs), "row",
                  "deciding number", "evidence"),
                 tuple((v.hypothesis, v.verdict, *(at(v, C) for C in cs),
                        v.cause or "-", v.number, v.evidence)
                       for v in rep.verdicts), (False,) * (5 + len(cs)))


def attribution_title(a: AttributionAt) -> str:
    return (f"C = {a.concurrency}: ideal {a.ideal_tpot_ms:.2f} ms/step -> "
            f"modelled {a.modelled_tpot_ms:.2f} ms/step")


def attribution_table(a: AttributionAt) -> Table:
    rows = [(r.label, _f(r.ms_per_step, 2), _signed(r.tok_per_s), _pct(r.share),
             r.source, r.evidence) for r in a.rows if r.cause != "unexplained"]
    gap = a.modelled_tpot_ms - a.ideal_tpot_ms
    tot = sum(r.tok_per_s for r in a.rows if r.cause != "unexplained")
    rows.append(("total: ideal -> modelled", _f(gap, 2), _signed(tot), "100%", "", ""))
    rows += [(r.label, _f(r.ms_per_step, 2), _signed(r.tok_per_s), "-", r.source,
              r.evidence) for r in a.rows if r.cause == "unexplained"]
    return Table(("cause", "ms per decode step", "tok/s", "share of gap", "source", "evidence"),
                 tuple(rows), (False, True, True, True, False, False))


def whatif_table(rep: Report, rows: list[WhatIf] | None = None) -> Table:
    """One row per setting: its gain at each measured concurrency, at the mixed load, on the
    objective (geometric mean) and whether it keeps every concurrency within 2%."""
    ws = rep.what_ifs if rows is None else rows
    cs = rep.measured_concurrency or sorted({e.concurrency for w in ws for e in w.effects})
    mixed_c = next((w.mixed.concurrency for w in ws if w.mixed), None)
    rec = rep.recommendation

    def gain_at(w, C):
        e = next((e for e in w.effects if e.concurrency == C), None)
        return "-" if e is None else f"{e.predicted_tok_per_s:.1f} ({e.gain:+.0%})"
    out = []
    for w in ws:
        mark = (" (recommended)" if rec and (w.knob, w.setting) == (rec.knob, rec.setting)
                else "")
        out.append((w.knob + mark, w.setting) + tuple(gain_at(w, C) for C in cs)
                   + ("-" if not w.mixed else
                      f"{w.mixed.predicted_tok_per_s:.1f} ({w.mixed.gain:+.0%})",
                      f"{w.gain:+.1%}", f"{w.worst_gain:+.0%}",
                      "yes" if w.eligible else "no", _holds(w),
                      "; ".join(x for x in (w.note, w.twin) if x)))
    return Table(("knob", "setting") + tuple(f"C={C} tok/s (gain)" for C in cs)
                 + (f"mixed load C={mixed_c} tok/s (gain)" if mixed_c else "mixed load",
                    "objective: geo-mean gain", "worst gain", "server setting, <= 2% loss",
                    "holds (no loss > 2%)", "note"),
                 tuple(out), (False, False) + (True,) * (len(cs) + 3) + (False,) * 3)


def _holds(w: WhatIf) -> str:
    if w.checked_up_to is None:
        return "-"
    if w.loses_at is None:
        return f"every C up to {w.checked_up_to}"
    lost = w.loses_at
    return (f"up to C={w.holds_up_to}; C={lost.concurrency} {lost.gain:+.0%}"
            if w.holds_up_to else f"loses at C={lost.concurrency} {lost.gain:+.0%}")


def whatif_lines(rep: Report) -> list[str]:
    """What is compared, the objective and the recommended setting (plain text)."""
    cs = ", ".join(f"C={C}" for C in rep.measured_concurrency)
    out = [f"Every setting is one server launch flag (or client pacing, or TP) applied to all "
           f"traffic, modelled at each concurrency you measured ({cs}) and at a mixed load (the "
           "largest of them with request lengths drawn as sglang.bench_serving does by default, "
           "--random-range-ratio 0, so slot occupancy drifts). Objective: "
           f"{rep.objective}."]
    rec = rep.recommendation
    if rec:
        eff = ", ".join(f"C={e.concurrency} {e.gain:+.0%}" for e in rec.effects)
        out.append(f"Recommended: {rec.knob} = {rec.setting} ({rec.gain:+.1%} on the "
                   f"objective; {eff}; {_holds(rec)}). Ties (objective within 0.5%) go to the "
                   "setting that holds over the widest range of load (checked at powers of two "
                   "up to 4x the largest measured C: never a setting that caps the server below "
                   "its load), then to the better mixed load.")
        if rec.twin_verdict in (LOSES, DIFFERS):
            out[-1] += f" On the twin: {rec.twin}{verdict_clause(rec)}."
        pair = rep.best_pair
        if pair:
            peff = ", ".join(f"C={e.concurrency} {e.gain:+.0%}" for e in pair.effects)
            out.append(f"Best two settings together: {pair.knob} = {pair.setting} "
                       f"({pair.gain:+.1%} on the objective; {peff}; {_holds(pair)})"
                       + (f"; {pair.twin}{verdict_clause(pair, rec)}." if pair.twin else "."))
    else:
        out.append("No server setting improves the objective by more than 0.5% within the 2% "
                   "bound.")
    return out


def dispatch_table(rep: Report) -> Table:
    return Table(("policy", "arrival", "C", "measured tok/s", "modelled tok/s", "diff",
                  "note"),
                 tuple((c.policy, c.arrival, str(c.concurrency),
                        _f(c.measured_tok_per_s), _f(c.modelled_tok_per_s),
                        f"{c.diff_pct:+.1f}%", c.note or "within 10%")
                       for c in rep.dispatch_validation or ()),
                 (False, False, True, True, True, True, False))


DISPATCH_NOTE = ("Model inputs from dispatch.json only (forward time per rank and size, rank-0 "
                 "dispatch latency per slot size, hop); rank 0's token read is a host sync on "
                 "its compute stream, so its host time sits between its forwards.")


def micro_batch_table(rep: Report) -> Table:
    return Table(("C", "micro-batches", "slot sizes", "modelled tok/s", "measured tok/s",
                  "forward times"),
                 tuple((str(c.concurrency), str(c.micro_batches),
                        " ".join(map(str, c.slot_sizes)), _f(c.modelled_tok_per_s),
                        _f(c.measured_tok_per_s),
                        "interpolated" if c.interpolated else "measured")
                       for c in rep.dispatch_micro_batches or ()),
                 (True, True, False, True, True, False))


def _sizes(rr) -> str:
    """A slot-size distribution (reports/base/payloads/sglang.py `Dist`) as min / median / max."""
    if not rr or rr.median is None:
        return "-"
    return f"{rr.min:g} / {rr.median:g} / {rr.max:g}"


def server_gpu_table(rep: Report) -> Table:
    """Per PP rank: where the GPU's time went in the traces (compute / NCCL transfer / NCCL wait
    / idle: waiting inside a receive is never called busy), next to the model's compute share."""
    srv = rep.server
    cs = [str(c.concurrency) for c in rep.concurrency     # none where the scenario steps aside
          if any(str(c.concurrency) in r.modelled_busy_pct for r in srv.ranks)]
    rows = []
    for r in srv.ranks:
        g, e = r.graph_kernels, r.eager_kernels
        rows.append((str(r.rank), _f(r.compute_pct), _f(r.recv_transfer_pct),
                     _f(r.recv_wait_pct) if r.recv_wait_pct is not None else
                     f"{_f(r.nccl_recv_pct)} (transfer + wait)", _f(r.idle_pct))
                    + tuple(_f(r.modelled_busy_pct.get(c)) for c in cs)
                    + (_f(r.dispatch_latency_p50_us), _f(r.cpu_dispatch_latency_p50_us),
                       "-" if g is None else f"{g} / {e}"))
    return Table(("PP rank", "compute % [traces]", "NCCL transfer % [traces]",
                  "NCCL wait % [traces]", "idle % [traces]")
                 + tuple(f"modelled compute % C={c}" for c in cs)
                 + ("dispatch p50 us, GPU [traces]", "dispatch p50 us, CPU [traces]",
                    "graph / one-by-one kernels [traces]"),
                 tuple(rows), (True, True, True, False, True) + (True,) * (len(cs) + 2) + (False,))


def server_log_table(rep: Report) -> Table:
    """Per PP rank; with DP attention each figure combines every DP rank's lines (DP_RULES) and
    the PP rank's throughput, the sum over its DP ranks, has its own column."""
    dp = bool(rep.server.dp_ranks)
    rows = tuple((str(r.rank),) + ((str(len(r.dp)),) if dp else ())
                 + (_f(r.decode_lines, 0), _f(r.prefill_lines, 0),
                    _sizes(r.running_req), _pct(r.cuda_graph_frac),
                    _f(r.gen_tok_per_s_median))
                 + ((_f(r.gen_tok_per_s_dp_sum),) if dp else ())
                 for r in rep.server.ranks if r.running_req is not None)
    if not dp:
        return Table(("PP rank", "decode lines [log]", "prefill lines [log]",
                      "slot size min / median / max [log]", "decode on CUDA graph [log]",
                      "gen tok/s median [log]"), rows, (True, True, True, False, True, True))
    return Table(("PP rank", "DP ranks [log]", "decode lines, all DP ranks [log]",
                  "prefill lines, all DP ranks [log]",
                  "slot size min / median / max, all DP ranks [log]",
                  "decode on CUDA graph, all DP ranks [log]",
                  "gen tok/s median over all DP ranks' lines (one scheduler's rate) [log]",
                  "gen tok/s, sum of DP ranks' medians [log]"),
                 rows, (True, True, True, True, False, True, True, True))


def server_dp_table(rep: Report) -> Table:
    """DP attention: one row per (PP rank, DP rank), each DP rank's own scheduler log."""
    rows = tuple((str(r.rank), str(d.dp), _f(d.decode_lines, 0),
                  _f(d.prefill_lines, 0), _sizes(d.running_req),
                  _pct(d.cuda_graph_frac), _f(d.gen_tok_per_s_median))
                 for r in rep.server.ranks for d in r.dp)
    return Table(("PP rank", "DP rank", "decode lines [log]", "prefill lines [log]",
                  "slot size min / median / max [log]", "decode on CUDA graph [log]",
                  "gen tok/s median [log]"), rows,
                 (True, True, True, True, False, True, True))


def server_bench_table(rep: Report) -> Table:
    return Table(("max concurrency [bench]", "mean concurrency [bench]", "output tok/s [bench]",
                  "mean TPOT ms [bench]", "median ITL ms [bench]", "mean TTFT ms [bench]"),
                 tuple(("none" if b.concurrency is None else str(b.concurrency),
                        _f(b.mean_concurrency, 2), _f(b.output_tok_per_s),
                        _f(b.mean_tpot_ms), _f(b.median_itl_ms), _f(b.mean_ttft_ms))
                       for b in rep.server.bench), (True,) * 6)


def server_lines(rep: Report) -> list[str]:
    """Sources legend, slot-imbalance index and notes (plain text)."""
    srv: ServerSummary = rep.server
    src = "; ".join(f"[{k}] = {v}" for k, v in to_json(srv.sources).items() if v)
    out = [f"Every number in this section is observed on your server, read into sglang.json by "
           f"`ppscope sglang`: {src}. Modelled columns are the pipeline model "
           f"(scenario inputs), for comparison."]
    imb = srv.slot_imbalance
    if imb:
        mom, cv = imb.max_over_mean_median, imb.cv
        who = (f"PP rank {imb.rank}, all {imb.dp_ranks} DP ranks"
               if imb.dp_ranks else f"PP rank {imb.rank}"
               + (f" DP {imb.dp}" if imb.dp is not None else ""))
        out.append(f"Slot-imbalance index [log, {who}]: max/mean slot size per "
                   f"window of {imb.window} decode lines {_f(mom, 2)} (median over "
                   f"{imb.windows} windows; 1.0 = even), coefficient of variation "
                   f"{_f(cv, 2)}. Under PP `#running-req` is the size of the one slot just "
                   "processed.")
    if srv.dp_rules:
        out.append(f"{srv.dp_ranks} DP ranks per PP rank in the log. {srv.dp_rules}")
    out += srv.moe_kernel_lines
    out += srv.attention_lines
    out += srv.metrics_lines
    if rep.recipe is not None:    # the log's readings need the recipe: what it costs
        from reports.render.recipe_line import recipe_line
        out.append(recipe_line(rep.recipe))
    return out + [f"Note: {n}." for n in srv.notes]


def topology_table(rep: Report) -> Table:
    """The pipeline's hops with their link level as topology.json has it ("unknown" where the
    pasted table left it unreadable) and the label of that figure."""
    t = rep.topology
    return Table(("PP hop", "link level", "link class", "source"),
                 tuple((f"GPU{h.src} -> GPU{h.dst}", h.link or "unknown",
                        h.hop_class or "unknown (no class, no speed taken from it)", t.source)
                       for h in t.pipeline_hops), (False,) * 4)


def topology_lines(rep: Report) -> list[str]:
    """Where the link map comes from, which pairs are unknown and what the parser skipped."""
    t = rep.topology
    out = [("From a pasted `nvidia-smi topo -m` table (`ppscope topology --from-nvidia-smi`): "
            "every link level here is given, nothing on the server was probed."
            if t.pasted else "Probed by `ppscope topology` on this machine (measured).")]
    unk = t.links_unknown
    if unk:
        out.append(f"Unknown links ({len(unk)} GPU pair(s) the pasted table left unreadable; no "
                   "verdict, link class or link speed is taken from them): "
                   + ", ".join("GPU{}\u2013GPU{}".format(*p.split("-")) for p in unk) + ".")
    if t.source != "measured" and not t.hops:
        out.append("No PP hop was timed: hop costs in the model stay estimated.")
    notes = t.notes   # last: the list items close the section
    if notes:
        out.append(("What the parser skipped or could not read in the pasted table:"
                    if t.pasted else "Notes from reading the link map:"))
        out += [f"- {n}" for n in notes]
    elif t.pasted:
        out.append("The parser skipped nothing in the pasted table.")
    return out


def measured_timeline_table(rep: Report) -> Table:
    tls = rep.measured_timeline or ()
    ranks = sorted({r for t in tls for r in t.busy_frac_in_window}, key=int)
    return Table(("probe point", "decode rounds", "slots", "forwards", "window ms")
                 + tuple(f"rank {r} busy % in window" for r in ranks),
                 tuple((t.point, str(t.rounds), str(t.slots), str(t.forwards),
                        _f(t.window_ms))
                       + tuple(_f(None if t.busy_frac_in_window.get(r) is None
                                  else 100 * t.busy_frac_in_window[r]) for r in ranks)
                       for t in tls),
                 (False,) + (True,) * (4 + len(ranks)))


MEASURED_NOTE = ("Measured by the dispatch probe (dispatch.trace.json): GPU forwards per stage "
                 "over a few visits of every slot, starting one round after the last prefill "
                 "(steady decode); the full trace opens in ui.perfetto.dev.")


def diagnosis_table(rep: Report) -> Table:
    """The observed server's causes (reports/model/observed/diagnose.py), largest first, then the
    unexplained row."""
    dg = rep.diagnosed
    rows = [(r.label, _f(r.ms_per_step, 2) + span(r.ms_ci, ".2f", ""),
             _f(r.size_pct, 0) + "%" + span(r.size_ci), r.reference, r.detail) for r in dg.rows]
    if dg.unexplained_ms is not None:
        rows.append(("unexplained (observed - modelled)",
                     _f(dg.unexplained_ms, 2) + span(dg.unexplained_ci, ".2f", ""),
                     _f(dg.unexplained_pct, 0) + "% of the step", "", ""))
    lvl = f" ({100 * dg.interval_level:.0f}% interval)" if dg.interval_level else ""
    return Table(("cause", f"ms per decode step{lvl}", f"slowdown it causes{lvl}",
                  "reference (cause off)", "the numbers"), tuple(rows),
                 (False, True, True, False, False))


def time_split_table(rep: Report) -> Table:
    rows = [(str(t.rank), _f(t.compute_pct, 0), _f(t.transfer_pct, 1),
             _f(t.wait_pct, 0), _f(t.comm_pct, 0) if t.wait_pct is None else "",
             _f(t.idle_pct, 0)) for t in rep.diagnosed.time_split]
    return Table(("rank", "compute %", "comm transfer %", "comm wait %",
                  "comm (no link bw given) %", "idle %"), tuple(rows), (True,) * 6)


def baseline_table(cmp_: Comparison) -> Table:
    rows = [(r.label, _f(r.baseline_ms, 2), _f(r.now_ms, 2), f"{r.growth_ms:+.2f}"
             + (f" ({r.growth_ci[0]:+.2f} to {r.growth_ci[1]:+.2f})" if r.growth_ci else ""),
             "" if r.share_of_change_pct is None else f"{r.share_of_change_pct:.0f}%")
            for r in cmp_.rows]
    lvl = f" ({100 * cmp_.interval_level:.0f}% interval)" if cmp_.interval_level else ""
    return Table(("cause", "baseline ms/step", "this run ms/step", f"change ms{lvl}",
                  "share of the step's change"), tuple(rows), (False, True, True, True, True))


def forward_table(cmp_: Comparison) -> Table:
    rows = [(str(f.rank), str(f.batch), _f(f.baseline_us / 1e3, 2), _f(f.now_us / 1e3, 2),
             f"{f.change_pct:+.0f}%") for f in cmp_.forward_rows]
    return Table(("rank", "micro-batch", "baseline forward ms", "this run forward ms",
                  "change"), tuple(rows), (True,) * 5)


def baseline_lines(rep: Report) -> list[str]:
    """What changed against an earlier run (reports/model/compare.py)."""
    c = rep.baseline_comparison
    if not c:
        return []
    out = ["## Against the baseline", "", f"Baseline: {c.baseline}.", ""]
    if not isinstance(c, Comparison):
        return out + [f"Not compared: {c.reason}", ""]
    how = ("the change is split by one Shapley split over the causes that differ between the "
           "two runs' loops (each cause's inputs taken from this run, the rest from the "
           "baseline)" if c.split == "shapley" else "the change is each run's own Shapley "
           "split subtracted")
    out += [f"**{c.answer}**", "", md_table(baseline_table(c)), "",
            f"Each cause in ms per decode step in both runs (each run's own split); {how}: the "
            "growths add up to the modelled step's change, `unexplained` takes the rest of the "
            "observed change.", ""]
    if c.model_error:
        out += [f"A change's interval holds the traced windows' noise and the model's own error "
                f"on a cause's size as the lab measured it ({c.model_error}; "
                "configs/records/model-error.json): a range for what the benchmark will "
                "measure, not for the windows alone.", ""]
    if c.forward_rows:
        out += ["Forward time per rank at the same micro-batch size (the traces of both runs): "
                "a forward slowed by contention, clocks or a slower kernel shows here.", "",
                md_table(forward_table(c)), ""]
    return out + [f"- {n}" for n in c.notes] + ([""] if c.notes else [])


def observed_loop_line(dg: ServerDiagnosis) -> str:
    """The observed deployment the diagnosis models, in one paragraph."""
    d = dg.deployment
    obs = dg.observed_tok_per_s
    return (f"Observed loop (C = {dg.concurrency}, {dg.concurrency_source}): PP{d.pp}, "
            f"{d.slots} slots, micro-batches {','.join(str(n) for n in d.sizes if n)}, "
            + ("forwards on the CPU (SGLang's CPU backend: no graphs)" if d.device == "cpu"
               else f"CUDA-graph share {_pct(d.graph_share)}") + "; observed "
            f"{_f(obs)} tok/s" + (f" ({dg.observed_source})" if dg.observed_source else "") +
            f", the model of this loop {_f(dg.modelled_tok_per_s)} tok/s, with every cause at "
            f"its reference {_f(dg.reference_tok_per_s)} tok/s. Every input is observed in "
            "the traces (sizes the traces never ran: " + d.shape + ").")


def layer_split_line(dg: ServerDiagnosis) -> str | None:
    """The slow stage's layer split (reports/model/observed/layer_split.py) and how its layers
    and their cost were known."""
    f = dg.layer_split
    if f is None:
        return None
    return (f"Layer split for the slow stage: SGLANG_PP_LAYER_PARTITION={f.value} instead of "
            f"{f.now}, decode step {dg.modelled_step_ms:.2f} -> {f.step_ms:.2f} ms in the model "
            f"of the loop, {f.gain_pct:+.0f}%{span(f.gain_ci)} tok/s; the layers each rank runs: "
            f"{f.layers_from}; a layer's cost: {f.cost_from}."
            + (f" Its interval adds the split's own error as the lab measured it ({f.error_from}; "
               f"the traced window's alone: {span(f.gain_window_ci).strip(' ()')})."
               if f.error_from else ""))


def diagnosis_lines(rep: Report) -> list[str]:
    dg = rep.diagnosis
    if not dg:
        return []
    out = ["", "## Your server: diagnosis from its own evidence", ""]
    if not isinstance(dg, ServerDiagnosis):
        return out + [f"Not diagnosed: {dg.reason}", ""]
    br = bench_run_line(dg)
    out += [f"**{dg.answer}**", "", observed_loop_line(dg), ""] + ([br, ""] if br else []) + [
            md_table(diagnosis_table(rep)), "",
            "Time per rank over the traced window (waiting inside an NCCL receive is "
            "communication wait, never busy):", "", md_table(time_split_table(rep)), ""]
    out += [f"- {n}" for n in dg.deployment.notes]
    out += [f"- Caveat: {c}." for c in dg.caveats]
    split = layer_split_line(dg)
    if split:
        out.append(f"- {split}")
    if dg.interval_note:
        obs = (f"; observed decode step {dg.observed_step_ms:.2f} ms"
               f"{span(dg.observed_step_ci, '.2f', ' ms')} over "
               f"{len(dg.observed_runs)} bench runs" if dg.observed_step_ci else "")
        out += [f"- How sure: {dg.interval_note}; modelled decode step "
                f"{dg.modelled_step_ms:.2f} ms{span(dg.modelled_step_ci, '.2f', ' ms')}{obs}. "
                "A cause is named only where its interval clears the threshold. A cause's "
                "interval holds the traced window's own sampling noise, not the model's error: "
                "on the lab's fault rounds the sizes missed by 20-60 points against intervals "
                "of a few (docs/BENCHMARKS.md section 21), so read it as the window's "
                "precision, not the size's accuracy. Against a baseline (`--baseline`), each "
                "growth's interval adds that error as the lab measured it "
                "(configs/records/model-error.json)."]
    w = rep.watch or {}
    hints = [h for h in (w.get("summary") or {}).get("hints", []) if h.get("holds")]
    if hints:  # corroboration only: NVML utilisation never overrules the traces
        out += ["", f"The GPU watch ({w.get('evidence')}, {w.get('source')}) agrees or not, "
                "for what it can see: " + "; ".join(f"{h['name']}: {h['text']}" for h in hints)
                + ". It never overrules the traces.", ""]
    return out


SERVER_WHATIF_TITLE = "What-ifs on your server (its own loop)"
SERVER_WHATIF_LEAD = ("Each setting tried on the model of the traced server's own loop: "
                      "bench_serving's whole run (its prompts, its C, its arrivals) before and "
                      "after one change, SGLang's admission deciding where each prompt goes "
                      "(reports/model/observed/whatifs.py). Modelled tok/s of the run; a change "
                      "under {no_change:.0f}% is within what the model tells apart.")


def server_whatif_table(rep: Report) -> Table | None:
    sw = rep.server_whatifs
    if sw is None or sw.status != "ok" or not sw.rows:
        return None
    def slots(t):
        return " ".join(str(n) for n in t if n) or "-"
    rows = [(r.command, r.note, f"{_f(r.before_tok_per_s)} -> {_f(r.after_tok_per_s)}",
             f"{r.change_pct:+.1f}%", f"{slots(r.sizes_before)} -> {slots(r.sizes_after)}")
            for r in sw.rows]
    return Table(("setting", "what it changes", "modelled tok/s", "change",
                  "slot sizes held longest"), tuple(rows), (False, False, True, True, False))


def server_whatif_lines(rep: Report) -> list[str]:
    sw = rep.server_whatifs
    if sw is None:
        return []
    out = [f"## {SERVER_WHATIF_TITLE}", ""]
    t = server_whatif_table(rep)
    if t is None:
        return out + [f"Not modelled: {sw.reason or 'no setting to try'}.", ""]
    return out + [SERVER_WHATIF_LEAD.format(no_change=sw.no_change_pct), "",
                  *([server_arrival_line(sw), ""] if sw.arrivals else []), md_table(t), ""]


def server_arrival_line(sw) -> str:
    return f"The first {sw.concurrency} prompts arrive {sw.arrivals}."


def bench_run_line(dg: ServerDiagnosis) -> str | None:
    """The observed loop over bench_serving's whole run against its tok/s, or None."""
    br = dg.bench_run
    if br is None or br.unexplained_pct is None:
        return None
    ci, left = br.profiler_slowdown_ci, br.unexplained_ci
    slow = (f"; the traced window ran {br.profiler_slowdown:.2f}x the benchmark's visit time "
            + (f"({ci[0]:.2f}-{ci[1]:.2f}x) " if ci else "")
            + "(the server's decode lines inside against outside it), taken off"
            if br.profiler_slowdown else "")
    return (f"Over bench_serving's whole run ({br.prompts} prompts, mean in flight "
            f"{_f(br.mean_in_flight)}): the model of this loop {_f(br.run_tok_per_s)} tok/s"
            + (f"{slow}: {_f(br.modelled_tok_per_s)} tok/s" if slow else "")
            + (f" ({_f(min(br.modelled_ci))}-{_f(max(br.modelled_ci))})" if br.modelled_ci else "")
            + f" against the observed {_f(br.observed_tok_per_s)}, "
            f"{br.unexplained_pct:+.0f}%"
            + (f" ({min(left):+.0f} to {max(left):+.0f}%)" if left else "") + " unexplained.")


def measure_lines(rep: Report) -> list[str]:
    """The closing section: the next commands for this deployment (reports/model/next_steps.py)."""
    steps = rep.measure_your_server
    if not steps:
        return []
    out = [f"## {MEASURE_TITLE}", "", MEASURE_LEAD, ""]
    for i, st in enumerate(steps, 1):
        out += [f"{i}. {st.why}", "", "   ```bash"] + [f"   {c}" for c in st.commands] + \
            ["   ```", ""]
    return out


def inputs_table(rep: Report) -> Table:
    return Table(("input", "value", "source", "evidence", "note"),
                 tuple((p.name, fmt_value(p.value), p.source, p.evidence, p.note or "")
                       for p in rep.params), (False,) * 5)


def md_table(t: Table) -> str:
    return md_grid(t.headers, t.rows, t.numeric)


# Section titles and fixed paragraphs, shared with reports/render/render_html.py so that both
# hold the same sections.
ATTRIBUTION_TITLE = ("Where the time goes (ideal -> modelled by Shapley value; modelled -> "
                     "observed is unexplained)")
STAGE_TITLE = "Per-stage cost and the simulated pipeline"
STAGE_NOTE = ("Modelled forward time per stage (us) at each micro-batch size the model runs, "
              "beside its roofline floor; the simulated pipeline timeline is report.trace.json "
              "(open it in ui.perfetto.dev).")
MEASURED_TITLE = "Measured pipeline timeline (dispatch probe)"
IMPLIED_LEAD = ("Kernel efficiency the observed points imply (estimated: the one factor on "
                "every stage's efficiency curve at which the model meets the observation; other "
                "inputs could explain part of the gap):")
MEASURE_TITLE = "Measure your server"
MEASURE_LEAD = ("Can we profile? Yes: these commands, in order, give the report the evidence it "
                "is missing for your deployment. Each runs as pasted here, or stops with one "
                "line naming what is missing (a GPU, a server, SGLang).")
GLOSSARY_TITLE = "How to read this"


def stage_cost_table(rep: Report) -> Table:
    rows = []
    for sc in rep.stage_cost:
        rows.append((str(sc.batch), *(f"{m:.0f} / {f:.0f}" for m, f in
                                      zip(sc.modelled_us, sc.floor_us))))
    n = max((len(sc.modelled_us) for sc in rep.stage_cost), default=0)
    return Table(("micro-batch", *(f"stage {i} us (floor)" for i in range(n))), tuple(rows),
                 (True,) * (n + 1))


def figure_md(f) -> str:
    return f"![the herd drawn: PP rank x time]({f.file})"


def answer_md(rep: Report, figures=()) -> list[str]:
    """The answer: the table (reports/render/answer_table.py), the figures (PNG files beside
    report.md), the sentences, then the report's longer answer under "In detail"."""
    out = ["## The answer", "", md_table(answer_table(rep)), ""]
    for f in figures:
        out += [figure_md(f), "", f"*{f.caption}*", ""]
    out += [" ".join(answer_sentences(rep)), ""]
    return out + [f"### {DETAIL_TITLE}", ""] + [f"- {s}" for s in rep.answer] + [""]


def _throughput_md(rep: Report) -> list[str]:
    out = ["## Throughput (decode tok/s per concurrency C)", "", md_table(throughput_table(rep)),
           ""]
    if rep.observed_source:
        out += [observed_line(rep), ""]
    if rep.implied_efficiency:
        out += [IMPLIED_LEAD, ""]
        out += [f"- {x.text}" for x in rep.implied_efficiency] + [""]
    return out


def _scenario_md(rep: Report) -> list[str]:
    """The scenario model's sections: where the time goes, what-ifs, dispatch, stage cost."""
    out = [f"## {ATTRIBUTION_TITLE}", ""]
    for a in rep.attribution:
        out += [f"### {attribution_title(a)}", "", md_table(attribution_table(a)), ""]
    out += ["## What-ifs (one server setting at every concurrency; best first)", ""]
    out += [x for line in whatif_lines(rep) for x in (line, "")]
    out += [md_table(whatif_table(rep)), ""]
    if rep.dispatch_validation:
        out += ["## Model vs dispatch probe (same configuration)", "",
                md_table(dispatch_table(rep)), "", DISPATCH_NOTE, ""]
    if rep.dispatch_micro_batches:
        out += ["## Micro-batch count (dispatch probe's configuration)", "",
                md_table(micro_batch_table(rep)), ""]
    return out + [f"## {STAGE_TITLE}", "", STAGE_NOTE, "", md_table(stage_cost_table(rep)), ""]


def _evidence_md(rep: Report) -> list[str]:
    """Measured timelines and links: evidence of the user's machine."""
    out = []
    if rep.measured_timeline:
        out += [f"## {MEASURED_TITLE}", "",
                md_table(measured_timeline_table(rep)), "", MEASURED_NOTE, ""]
    if rep.topology:
        out += [f"## Links between GPUs (topology.json, {rep.topology.source})", ""]
        lines = topology_lines(rep)   # paragraphs, then the parser's notes as a list
        out += [x for line in lines for x in ([line] if line.startswith("- ") else [line, ""])]
        if lines[-1].startswith("- "):
            out.append("")
        if rep.topology.pipeline_hops:
            out += [md_table(topology_table(rep)), ""]
    return out


def _scenario_tail_md(rep: Report) -> list[str]:
    out = []
    if rep.model_differs:
        out += ["## Where the model differs from SGLang", ""]
        out += [f"- {d}" for d in rep.model_differs] + [""]
    out += ["## Inputs", "", md_table(inputs_table(rep)), ""]
    if rep.assumptions:
        out += ["## Scenario assumptions", ""] + [f"- **{k}**: {v}"
                                                  for k, v in rep.assumptions.items()]
        out += [""]
    return out


def render_md(rep: Report, figures=()) -> str:
    """`figures`: reports/render/timeline_plot.py `Figure`s shown under the answer table (their
    PNG files sit beside report.md). With the built-in scenario set aside
    (reports/scenario_aside.py) its sections follow everything about the server."""
    from reports.scenario_aside import ASIDE_TITLE, evidence_banner
    aside = rep.scenario_aside is not None
    out = [f"# {report_title(rep)}", ""]
    if aside:
        out += [f"**{evidence_banner(rep)}**", ""]
    else:
        out += [f"**{banner(rep)}**" if rep.all_estimated else banner(rep), ""]
    out += answer_md(rep, figures)
    out += (observed_lines(rep)[:1] if aside else header_lines(rep)) + [""]
    out += [f"> warning: {w}  " for w in rep.warnings] + [""]
    out += baseline_lines(rep)
    out += diagnosis_lines(rep)
    out += server_whatif_lines(rep)
    if not aside:
        out += _throughput_md(rep)
    out += ["## Verdicts on the hypotheses", "", md_table(verdict_table(rep)), ""]
    if rep.server:
        out += ["## Your server (observed, sglang.json)", ""]
        for line in server_lines(rep):
            out += [line, ""]
        if any(r.trace_span_ms for r in rep.server.ranks):
            out += ["### GPU time per PP rank (traces) next to the model", "",
                    md_table(server_gpu_table(rep)), ""]
        if any(r.running_req is not None for r in rep.server.ranks):
            out += ["### Scheduler log per PP rank", "", md_table(server_log_table(rep)), ""]
        if rep.server.dp_ranks:
            out += ["### Scheduler log per PP rank and DP rank (DP attention)", "",
                    md_table(server_dp_table(rep)), ""]
        if rep.server.bench:
            out += ["### bench_serving runs", "", md_table(server_bench_table(rep)), ""]
    if rep.watch:  # GPU watch section: reports/render/watch_plot.py
        from reports.render.watch_plot import watch_md
        out += watch_md(rep.watch)
    if aside:
        out += _evidence_md(rep)
        out += [f"## {ASIDE_TITLE}", "", f"{rep.scenario_aside[0].upper()}"
                f"{rep.scenario_aside[1:]}. Everything from here to the glossary is that "
                "scenario's model, not your server (pass --scenario with your deployment to "
                "model it).", ""]
        out += [x for line in header_lines(rep)[len(observed_lines(rep)):]
                for x in (line, "")]
        # what to measure next follows it: its commands and reasons are partly the scenario's
        out += _throughput_md(rep) + _scenario_md(rep) + _scenario_tail_md(rep)
        out += measure_lines(rep)
    else:
        out += _scenario_md(rep) + _evidence_md(rep) + _scenario_tail_md(rep)
        out += measure_lines(rep)
    out += [f"## {GLOSSARY_TITLE}", ""] + [f"- **{k}**: {v}" for k, v in glossary(rep)]
    # text from the evidence (file names, log fields) holds no HTML or link of its own
    from reports.base.text import markdown_safe
    md = markdown_safe("\n".join(out) + "\n")
    for f in figures:   # ppscope's own image links (file names it chose) survive the escaping
        md = md.replace(markdown_safe(figure_md(f)), figure_md(f))
    return md


def glossary(rep: Report) -> list[tuple[str, str]]:
    """Every term the report uses, with the deployment's own GPU memory named."""
    from reports.model.causes import CAUSES
    mem = rep.deployment.memory or "memory"
    out = [
        ("TPOT", "time per output token of one request; with C requests in flight, one decode "
                 "step of the whole pipeline (every running request advances one token)."),
        ("C", "concurrency: requests in flight at once (bench_serving's --max-concurrency)."),
        ("micro-batch / slot", "under PP, SGLang keeps pp + async-depth micro-batch places "
                               "(slots), visited round-robin; a request stays in the slot that "
                               "admitted it, and each slot's requests run as one micro-batch."),
        ("async depth", "--pp-async-batch-depth: extra slots beyond pp, so the next "
                        "micro-batches can start while earlier outputs are still held."),
        ("held outputs", "the last rank keeps each micro-batch's sampled tokens for async-depth "
                         "iterations before returning them (SGLang's token return)."),
        ("rank chaining", "each rank > 0 receives the request list from the rank before it over "
                          "gloo before it can schedule, so the ranks' host work runs in a chain."),
        ("gloo", "PyTorch's CPU communication backend; SGLang sends its Python objects (request "
                 "lists, metadata) between ranks with it."),
        ("NCCL", "NVIDIA's GPU communication library; it carries the hidden states between stages."),
        ("CUDA graph / eager", "a decode step replayed from a captured CUDA graph launches in one "
                               "call; eager runs launch every kernel from Python (slower for "
                               f"small batches); SGLang captures sizes up to {GRAPH_MAX_BS}."),
        ("roofline floor", f"the time a perfect kernel needs: the bytes it must move over the "
                           f"GPU's {mem} bandwidth or its FLOPs over peak, whichever is larger."),
        ("kernel efficiency", "roofline floor / kernel time (1.0 = at the floor)."),
        ("W4A16", "weights stored as 4-bit integers (INT4, in groups with a scale), activations "
                  "in 16-bit: how Kimi K2's routed experts are served."),
        ("KV pool", "the GPU memory SGLang sets aside for the attention cache; its size bounds "
                    "max_running_requests."),
        ("ideal", "the scenario model with every cause off: roofline kernels, balanced stages, "
                  "the requests in equal micro-batches evenly spaced (one per occupied slot, at "
                  "least min(C, pp)), free hops and host."),
        ("Shapley value", "a cause's average effect over every order of switching the causes on; "
                          "the rows add up to the gap and do not depend on an order."),
        ("share of gap", "a cause's Shapley value / (modelled - ideal). A negative share is a "
                         "cause that, given the others, makes the pipeline faster (e.g. fewer "
                         "micro-batches that each carry more requests), so the others' shares "
                         "add up to more than 100%."),
        ("unexplained", "observed - modelled: what the model does not account for (never "
                        "fitted)."),
        ("burst / trickle", "how requests reach the scheduler: all before its next visit (they "
                            "land in one slot) or one per slot visit (consecutive slots)."),
        ("mixed load", "the largest measured C with request lengths drawn as bench_serving's "
                       "default (--random-range-ratio 0), so slot occupancy drifts."),
        ("objective", "the geometric mean of predicted tok/s over the measured concurrencies."),
        ("verdicts", "holds: the cause's row is at least 15% of the gap at that C; minor: 5-15%; "
                     "does not hold: under 5%; not enough evidence: no record measures it. "
                     "\"bandwidth is not the limit\" holds when the link carries under 10% of "
                     "its bandwidth."),
        ("observed / measured / transferred / modelled / estimated / given",
         "from your server's own evidence / a probe run on this machine / measured on another "
         "GPU and carried over at the same fraction of the floor / SGLang's own mechanics run on "
         "the inputs / a datasheet, roofline or stated assumption / a setting or a pasted "
         "`nvidia-smi topo -m` table you gave."),
        ("report.trace.json", "the modelled pipeline timeline, one track per stage: open it in "
                              "ui.perfetto.dev (the dispatch probe writes a measured one too)."),
    ]
    out += [(f"cause `{c.name}`", f"{c.label}: {c.term}; off: {c.reference}.")
            for c in CAUSES.values()]
    return out
