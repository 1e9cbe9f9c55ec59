"""`ppscope report`: the bottleneck attribution report, from whatever is in results/.

    ppscope report                               # seed scenario, results/ if any
    ppscope report --observed 1:34,8:81.7,32:248.1 --scenario seed-pp8
    ppscope report --bench bench.jsonl --out results/
    ppscope report --validate-dispatch results/dispatch.json

Writes report.json (the truth), report.md, report.html (self-contained) and report.trace.json
(simulated timeline for ui.perfetto.dev) to --out, and prints a compact table.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from reports.errors import CliError
from reports.paths import results_dir


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
                   help="sglang.bench_serving --output-file JSONL (observed tok/s per C)")
    p.add_argument("--out", default=None, help="output directory (default: --results)")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="also write report.json here")
    p.add_argument("--validate-dispatch", default=None, metavar="FILE",
                   help="compare the model with a dispatch.json (automatic when results/ has one)")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from reports import loop_builder as lb
    from reports.records import RecordError, read_record, write_json_atomic
    from reports.render_md import render_md, terminal_table
    from reports.report_build import build_report
    from reports.scenario import (build_inputs, load_records, load_scenario, parse_bench_jsonl,
                                  parse_observed)
    from reports.timeline_trace import chrome_trace

    t0 = time.monotonic()
    results = Path(args.results) if args.results else results_dir()
    out = Path(args.out) if args.out else results
    sc = load_scenario(args.scenario)
    records, warns = load_records(results)
    if args.validate_dispatch:
        try:
            records["dispatch"] = read_record(args.validate_dispatch)
        except RecordError as e:
            raise CliError(str(e)) from None
    observed, osrc = None, None
    if args.bench:
        observed, osrc = parse_bench_jsonl(args.bench), Path(args.bench).name
    if args.observed:
        observed, osrc = parse_observed(args.observed), "--observed"
    inp = build_inputs(sc, records, warns, observed, osrc)
    rep = build_report(inp, records)
    Cmax = max(inp.concurrency)
    spans = lb.run(inp, Cmax, keep_spans=True).spans
    md = render_md(rep)
    write_json_atomic(out / "report.json", rep)
    if args.json:
        write_json_atomic(args.json, rep)
    (out / "report.md").write_text(md)
    write_json_atomic(out / "report.trace.json",
                      chrome_trace({C: lb.run(inp, C, keep_spans=True).spans
                                    for C in inp.concurrency}))
    from reports.render_html import render_html
    hops = records["topology"].data.get("hops") if "topology" in records else None
    (out / "report.html").write_text(render_html(rep, md, spans, hops))
    for w in inp.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(terminal_table(rep))
    print(f"\nwrote {out}/report.{{json,md,html,trace.json}} in {time.monotonic() - t0:.1f} s")
    return 0
