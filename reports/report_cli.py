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
and, unless --observed/--bench are given, the observed tok/s. report.md has the herd drawn beside
it (report.herd.png; reports/render/timeline_plot.py). Prints the answer (reports/render/
terminal.py): the table of hypotheses, three sentences, where the rest is; 25 lines at most.
The model's runs and the plots are kept in a disk cache keyed by every input and the code
(reports/base/disk_cache.py; --no-cache to do without), so the same inputs report in under a
second the second time, with the same bytes.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from dataclasses import replace
from typing import TYPE_CHECKING

from reports.base.errors import CliError
from reports.base.paths import folder_error, json_path, results_dir

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
    p.add_argument("--scenario", default=None,
                   help="scenario name in configs/scenarios or a path (default: seed-pp8, set "
                   "aside below the server's own sections where results/ holds a traced "
                   "server of another deployment)")
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
    p.add_argument("--no-cache", action="store_true",
                   help="run the model afresh and keep nothing in the cache (by default the "
                   "model's runs and the plots are kept in $PPSCOPE_CACHE, else "
                   "~/.cache/ppscope/report, keyed by a hash of every input and of ppscope's code)")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from reports.base.records import RecordError, json_text, read_record, write_files
    from reports.render.render_md import render_md
    from reports.report_run import model_run
    from reports.base.bench_serving import observed_points, read_bench
    from reports.model.scenario.inputs import (build_inputs, load_records, load_scenario, observed_from_sglang,
                                  parse_observed)
    from reports.render.timeline_trace import chrome_trace

    t0 = time.monotonic()
    results = Path(args.results) if args.results else results_dir()
    out = Path(args.out) if args.out else results
    sc = load_scenario(args.scenario or DEFAULT_SCENARIO)
    for what, d in (("--results", results), ("--out", out)):
        why = folder_error(d, what)     # a file, a symbolic-link loop, a dangling link
        if why:
            raise CliError(why)
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
        warns += bench["notes"]        # runs left out, lines skipped, server_info missing
        observed, notes = observed_points(bench["runs"], osrc, repeats=False)
        warns += notes
        workload, notes = bench_workload(bench["runs"], osrc)
        warns += notes
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
    run = model_run(inp, records, baseline, use_cache=not args.no_cache)
    from reports.model.checks.twin_check import apply_twin, read_twin, shipped_twin
    twin = read_twin(results)          # what SGLang's scheduler said: the user's twin run, else
    if twin is None and sc.twin_record:   # the scenario's own shipped one
        twin = shipped_twin(sc.twin_record, sc.source or sc.name)
    rep = apply_twin(run.report, twin)
    if args.scenario is None:          # the built-in scenario: aside where it is not the server
        from reports.scenario_aside import set_aside
        rep = set_aside(rep)
    if rep is not run.report:          # the prose says what the twin measured too
        from reports.answer import answer
        rep = replace(rep, answer=tuple(answer(rep)))
    rep, measured = measured_timelines(results, max(inp.concurrency), rep)
    spans = run.spans[max(inp.concurrency)]
    from reports.render.render_html import render_html
    from reports.render.timeline_plot import herd_figure
    herd = herd_figure(rep, run.herd, use_cache=not args.no_cache)
    figures = (herd,) if herd else ()
    if "sglang" in records:   # a traced server: its own forwards beside the model of its loop
        from reports.render.observed_herd import observed_herd_figure
        got = observed_herd_figure(rep, records["sglang"].payload.loop, run.observed,
                                   use_cache=not args.no_cache)
        if isinstance(got, str):
            rep = replace(rep, warnings=(*rep.warnings, got))
        else:
            figures += (got,)
    # one result, one commit: every file rendered first, then written together (write_files),
    # so a failure on the way (a full disk) leaves the earlier report's files whole
    rep_json = json_text(rep.to_json())
    write_files([(out / "report.json", rep_json), *([(json_path(args.json, "report.json"), rep_json)] if args.json else []),
                 (out / "report.md", render_md(rep, figures)),
                 *((out / f.file, f.png) for f in figures),
                 (out / "report.trace.json", json_text(chrome_trace(run.spans))),
                 (out / "report.html", render_html(rep, spans, measured, figures,
                                                   use_cache=not args.no_cache))])
    for w in rep.warnings:
        print(f"warning: {w}", file=sys.stderr)
    from reports.render.terminal import terminal_summary
    print(terminal_summary(rep, results_label=str(results)))
    print(f"wrote {out}/report.{{json,md,html,trace.json}} in {time.monotonic() - t0:.1f} s")
    n = sum(len(st.commands) for st in rep.measure_your_server)
    if n:
        print(f"Measure your server: {n} commands to paste (that section of {out}/report.md)")
    return 0


DEFAULT_SCENARIO = "seed-pp8"
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
