"""`ppscope report`: the bottleneck attribution report, from whatever is in results/.

    ppscope report                               # seed scenario, results/ if any
    ppscope report --observed 1:34,8:81.7,32:248.1 --scenario seed-pp8
    ppscope report --bench bench.jsonl --out results/
    ppscope report --validate-dispatch results/dispatch.json
    ppscope report --results after/ --baseline before/report.json   # what one change did

Writes report.json (the truth), report.md, report.html (self-contained) and report.trace.json
(simulated timeline for ui.perfetto.dev) to --out; when --results holds dispatch.trace.json
(the dispatch probe's measured loop) a few decode rounds of it are plotted beside the simulated
timeline, and sglang.json (your server's logs, traces, bench runs) fills a "Your server" section
and, unless --observed/--bench are given, the observed tok/s; and prints a compact summary: the answer,
throughput per concurrency, the top 3 what-ifs by gain, the attribution at the highest
concurrency, the verdicts and (with dispatch.json) the model's worst miss against the probe.
"""
from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time
from pathlib import Path
from dataclasses import replace
from typing import TYPE_CHECKING

from reports.base.errors import CliError
from reports.base.paths import results_dir

if TYPE_CHECKING:   # the model's modules load only when a report is made (`ppscope --help`)
    from reports.model.report_type import Report


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="bottleneck attribution report (no GPU needed)",
        description="Combine the probe records in --results with a scenario and your observed "
                    "benchmark: where the time goes (Shapley attribution), verdicts on each "
                    "hypothesis, and what-ifs. Missing records fall back to estimates.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=None, help="records directory (default: results/)")
    p.add_argument("--scenario", default="seed-pp8",
                   help="scenario name in configs/scenarios or a path (default: seed-pp8)")
    p.add_argument("--observed", default=None, metavar="C:TOKS,...",
                   help='observed decode tok/s per concurrency, e.g. "1:34,8:81.7,32:248.1"')
    p.add_argument("--bench", default=None, metavar="FILE",
                   help="sglang.bench_serving --output-file JSONL (observed tok/s per C); "
                   "without it and --observed, the bench runs in results/sglang.json are used")
    p.add_argument("--out", default=None, help="output directory (default: --results)")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="also write report.json here")
    p.add_argument("--baseline", default=None, metavar="REPORT_JSON",
                   help="report.json of an earlier run of the same server (before a change): "
                   "the report then says what changed, per cause, in ms per decode step "
                   "(needs a diagnosis from traces on both sides)")
    p.add_argument("--validate-dispatch", default=None, metavar="FILE",
                   help="compare the model with a dispatch.json (automatic when results/ has one)")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from reports.model import loop_builder as lb
    from reports.base.records import RecordError, json_text, read_record, write_files
    from reports.render.render_md import render_md
    from reports.report_build import build_report
    from reports.base.bench_serving import observed_points, read_bench
    from reports.model.scenario import (build_inputs, load_records, load_scenario, observed_from_sglang,
                                  parse_observed)
    from reports.render.timeline_trace import chrome_trace

    t0 = time.monotonic()
    results = Path(args.results) if args.results else results_dir()
    out = Path(args.out) if args.out else results
    sc = load_scenario(args.scenario)
    for what, d in (("--results", results), ("--out", out)):
        if d.exists() and not d.is_dir():
            raise CliError(f"{what} {d}: not a directory")
    named = args.results or os.environ.get("PPSCOPE_RESULTS", "results") != "results"
    if named and not results.exists():  # a typo must not pass for "no records yet"
        raise CliError(f"--results {results}: no such folder (an empty folder means no "
                       "records; leave --results out for the default results/)")
    records, warns = load_records(results)
    if args.validate_dispatch:
        try:
            records["dispatch"] = read_record(args.validate_dispatch)
        except RecordError as e:
            raise CliError(str(e)) from None
    from reports.base.bench_serving import bench_workload
    observed, osrc, workload = None, None, None
    if args.bench:  # same reader and rule as `ppscope sglang --bench` (reports/base/bench_serving.py)
        bench, osrc = read_bench(args.bench), Path(args.bench).name
        warns += bench["notes"]                   # runs left out (0 completed requests)
        observed, notes = observed_points(bench["runs"], osrc)
        warns += notes
        workload, notes = bench_workload(bench["runs"], osrc)
        warns += notes
        if bench["lines_unrecognised"]:
            warns.append(f"{osrc}: {bench['lines_unrecognised']} line(s) not bench_serving runs, "
                         "skipped")
    if args.observed:
        observed, osrc, workload = parse_observed(args.observed), "--observed", None
    if observed is None:  # the user's own bench_serving runs, read into sglang.json
        obs, notes = observed_from_sglang(records.get("sglang"))
        warns += notes
        if obs:
            observed, osrc = obs, "sglang.json (bench_serving)"
            workload, notes = bench_workload(records["sglang"].payload.bench, "sglang.json")
            warns += notes
    baseline = read_baseline(args.baseline) if args.baseline else None
    inp = build_inputs(sc, records, warns, observed, osrc, workload=workload)
    rep, measured = measured_timelines(results, max(inp.concurrency),
                                       build_report(inp, records, baseline))
    Cmax = max(inp.concurrency)
    spans = lb.run(inp, Cmax, keep_spans=True).spans
    from reports.render.render_html import render_html
    # one result, one commit: every file rendered first, then written together (write_files),
    # so a failure on the way (a full disk) leaves the earlier report's files whole
    rep_json = json_text(rep.to_json())
    write_files([(out / "report.json", rep_json), *([(args.json, rep_json)] if args.json else []),
                 (out / "report.md", render_md(rep)),
                 (out / "report.trace.json", json_text(chrome_trace(
                     {C: lb.run(inp, C, keep_spans=True).spans for C in inp.concurrency}))),
                 (out / "report.html", render_html(rep, spans, measured))])
    for w in rep.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(terminal_summary(rep, results_label=str(results)))
    print(f"\nwrote {out}/report.{{json,md,html,trace.json}} in {time.monotonic() - t0:.1f} s")
    n = sum(len(st.commands) for st in rep.measure_your_server)
    if n:
        print(f"Measure your server: {n} commands to paste, in {out}/report.md and report.html "
              "(section \"Measure your server\")")
    return 0


BASELINE_MAX_BYTES = 64 << 20   # a report.json is a few hundred kB; refuse anything huge


def read_baseline(path: str) -> tuple[str, Report]:
    """(label, report) of an earlier `ppscope report`, possibly an older version's (a part it
    lacks is None, a key this version does not know is skipped); one-line error otherwise."""
    import json

    from reports.base.schema import SchemaError
    from reports.model.report_type import REPORT_SCHEMA, Report
    p = Path(path)
    if p.is_dir():
        p = p / "report.json"
    from reports.base.paths import read_input
    raw = read_input(p, "report.json", BASELINE_MAX_BYTES)   # regular files only, bounded
    try:
        rep = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise CliError(f"--baseline {p}: not JSON (give an earlier run's report.json)") from None
    if not isinstance(rep, dict) or rep.get("schema") != REPORT_SCHEMA:
        raise CliError(f"--baseline {p}: not a ppscope report.json ({REPORT_SCHEMA})")
    try:
        out = Report.from_json(rep)
    except SchemaError as e:
        raise CliError(f"--baseline {p}: {e} (not a report.json this ppscope reads)") from None
    from reports.model.compare import bad_figure
    bad = bad_figure(out.diagnosis)   # bounded before compare divides by it
    if bad is not None:
        raise CliError(f"--baseline {p}: {bad}; not a figure a run gives")
    return str(p), out


def measured_timelines(results: Path, max_c: int, rep: Report) -> tuple[Report, tuple]:
    """A few decode rounds of results/dispatch.trace.json (the dispatch probe's measured loop):
    the report with their summary as `measured_timeline`, and the timelines; an unreadable
    trace is a warning, not an error."""
    from reports.render.measured_timeline import read_dispatch_trace
    path = results / "dispatch.trace.json"
    if not path.exists():
        return rep, ()
    try:
        tls = read_dispatch_trace(path, max_c=max_c)
    except ValueError as e:
        return replace(rep, warnings=(*rep.warnings, f"{e}")), ()
    if tls:
        return replace(rep, measured_timeline=tuple(t.summary() for t in tls)), tls
    return replace(rep, warnings=(*rep.warnings, f"{path.name}: no GPU forward events; "
                                  "measured timeline not shown")), tls


def server_line(rep: Report) -> str | None:
    """One line on the user's server (sglang.json), every number observed with its source."""
    srv = rep.server
    if not srv or not srv.ranks:
        return None
    rs = srv.ranks
    parts = []
    if any(r.compute_pct is not None for r in rs):
        parts.append("GPU compute % per PP rank [traces] " + " ".join(
            "-" if r.compute_pct is None else f"{r.compute_pct:.0f}" for r in rs))
    sz = [r.running_req for r in rs if r.running_req and r.running_req.max is not None]
    if sz:
        parts.append("slot size median/max [log] " + " ".join(
            f"{x.median:g}/{x.max:g}" for x in sz))
    cg = [r.cuda_graph_frac for r in rs if r.cuda_graph_frac is not None]
    if cg:
        parts.append("decode on CUDA graph [log] " + " ".join(f"{x:.0%}" for x in cg))
    if srv.dp_ranks:   # DP attention: the figures above count every DP rank's batches
        parts.append(f"DP attention, {srv.dp_ranks} DP ranks per PP rank, all counted; gen "
                     "tok/s summed over DP ranks [log] " + " ".join(
                         "-" if r.gen_tok_per_s_dp_sum is None
                         else f"{r.gen_tok_per_s_dp_sum:.0f}" for r in rs))
    return ("your server (sglang.json, observed): " + "; ".join(parts)) if parts else None


def terminal_summary(rep: Report, width: int = 100, results_label: str = "results") -> str:
    """The report in about 40 lines: answer, throughput, top 3 what-ifs (best row of each of
    the three best knobs), attribution at the highest C (zero rows left out), verdicts grouped."""
    from tabulate import tabulate

    def f(x, nd=1):
        return "-" if x is None else f"{x:.{nd}f}"

    out = []
    if rep.all_estimated and rep.server:
        out.append(f"every model input is estimated (no probe records in "
                   f"{results_label.rstrip('/')}/); observed: sglang.json")
    elif rep.all_estimated:
        tr = any(p.source == "transferred" for p in rep.params)
        out.append(f"every figure is estimated{' or transferred' if tr else ''} (no records in "
                   f"{results_label.rstrip('/')}/)")
    out.append("The answer:")
    for s in rep.answer:
        out += textwrap.wrap(s, width, initial_indent="  - ", subsequent_indent="    ")
    out.append("")
    out.append(tabulate(
        [[c.concurrency, f(c.ideal_tok_per_s), f(c.predicted), f(c.observed),
          f(c.predicted_tpot_ms, 2), " ".join(str(s) for s in c.slot_sizes if s)]
         for c in rep.concurrency],
        headers=["C", "ideal tok/s", "modelled tok/s", "observed tok/s", "modelled TPOT ms",
                 "occupied slots"]))
    srv = server_line(rep)
    if srv:
        out += textwrap.wrap(srv, width, subsequent_indent="  ")
    out.append("")
    sw = rep.server_whatifs
    if sw is not None and sw.status == "ok" and sw.rows:
        out.append(tabulate(
            [[r.command, f"{r.before_tok_per_s:.1f} -> {r.after_tok_per_s:.1f}",
              f"{r.change_pct:+.1f}%"] for r in sw.rows],
            headers=["what-if on your server's own loop", f"modelled tok/s (C={sw.concurrency})",
                     "change"]))
        out.append("")
    top, seen = [], set()
    for w in rep.what_ifs:  # best first; one row per knob so the three differ
        if w.knob not in seen:
            seen.add(w.knob)
            top.append(w)
    out.append(tabulate(
        [[w.knob, w.setting, " ".join(f"{e.gain:+.0%}" for e in w.effects),
          f"{w.gain:+.1%}", "yes" if w.eligible else "no"] for w in top[:3]],
        headers=["top what-if" if not rep.scenario_differs else
                 f"scenario what-if ({rep.scenario}, not your server)", "setting",
                 "gain at " + "/".join(f"C={C}" for C in rep.measured_concurrency),
                 "geo-mean", "server, <=2% loss"]))
    out.append("")
    atts = sorted(rep.attribution, key=lambda x: x.concurrency)
    live = {r.cause for a in atts for r in a.rows if abs(r.ms_per_step) > 1e-9}
    causes = [c for c in dict.fromkeys(r.cause for a in atts for r in a.rows
                                       if r.cause != "unexplained") if c in live]
    causes += ["unexplained"] if "unexplained" in live else []

    def cell(a, c):
        r = next((r for r in a.rows if r.cause == c), None)
        if r is None:
            return "-"
        return (f"{r.ms_per_step:+.1f} ms" if r.share is None
                else f"{r.share:.0%} ({r.ms_per_step:.1f} ms)")
    src = {r.cause: r.source for a in atts for r in a.rows}
    out.append(tabulate([[c, *(cell(a, c) for a in atts), src[c]] for c in causes],
                        headers=["cause: share of gap", *(f"C={a.concurrency}" for a in atts),
                                 "source"]))
    out.append("")
    by: dict[str, list[str]] = {}
    for v in rep.verdicts:
        held = [a.concurrency for a in v.at if a.verdict == v.verdict and a.concurrency]
        where = (f" (C={', '.join(map(str, held))})" if held and len(held) < len(v.at)
                 else "")
        by.setdefault(v.verdict, []).append(v.hypothesis + where)
    text = "; ".join(f"{k}: {', '.join(hs)}" for k, hs in by.items())
    out += textwrap.wrap(f"verdicts -- {text}", width, subsequent_indent="  ")
    dv = rep.dispatch_validation or ()
    if dv:
        worst = max(dv, key=lambda c: abs(c.diff_pct))
        out.append(f"\nmodel vs dispatch probe: {len(dv)} runs, worst {worst.diff_pct:+.1f}% "
                   f"({worst.policy}, C={worst.concurrency})")
    return "\n".join(out)
