"""`ppscope twin`: a deployment's PP loop on SGLang's own scheduler, device time emulated
(microbench/sglang_lab/twin/run.py)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from reports.base.errors import CliError

EPILOG = """\
examples:
  ppscope twin                                   # the built-in PP8 scenario, C = 1, 8, 32
  ppscope twin --concurrency 8 --settings default,recommended
  ppscope twin --scenario my.json --k 40         # a fixed dilation, no calibration
  ppscope twin --observed results/lab/clean-c8/sglang.json   # the held-out check (k = 1)

The output says k, the calibration and that every forward is emulated. Figures are divided by k:
TPOT and tok/s are the deployment's as SGLang's loop runs it, not this machine's.
"""
SETTINGS = ("default", "recommended", "pair")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "twin", help="the deployment's PP loop on SGLang's own scheduler (forwards emulated)",
        description="Start SGLang's own server (the lab's venv, CPU) at a deployment's settings, "
                    "hold every rank's forward, hop and host visit to the deployment's times "
                    "(the figures the pipeline model uses) times a dilation k chosen by "
                    "calibration, and run bench_serving at each concurrency: the twin's TPOT "
                    "beside the model's and the user's, for SGLang's defaults and for the "
                    "settings the report recommends.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", default="seed-pp8", help="scenario name or file (default seed-pp8)")
    p.add_argument("--results", default=None, help="records the report reads (default results/)")
    p.add_argument("--concurrency", default=None, metavar="C,...",
                   help="concurrencies (default: the scenario's)")
    p.add_argument("--settings", default="default,recommended,pair", metavar="NAME,...",
                   help="which servers: default (the deployment as it is), recommended (the "
                   "report's best single setting), pair (its best pair); default all three")
    p.add_argument("--output-len", type=int, default=32, metavar="N",
                   help="output tokens per request (default 32: decode TPOT is compared, the "
                   "prompt length stays the scenario's)")
    p.add_argument("--max-k", type=float, default=60.0, metavar="K",
                   help="the largest dilation the calibration may choose (default 60)")
    p.add_argument("--k", type=float, default=None, metavar="K",
                   help="a fixed dilation (no calibration run)")
    p.add_argument("--lab-dir", default=os.environ.get("PPSCOPE_LAB_DIR", ".lab"),
                   help="the lab's venv and models (default .lab)")
    p.add_argument("--out", default=None, help="artefacts folder (default results/twin)")
    p.add_argument("--json", default=None, help="the record (default results/twin.json)")
    p.add_argument("--observed", default=None, metavar="SGLANG_JSON",
                   help="the held-out check instead: the twin of an observed SGLang CPU server "
                   "(its `ppscope sglang` record) at k = 1, each decode forward held to its "
                   "traced time, alternating with the same server unheld, at the record's load "
                   "(record: results/twin-observed.json)")
    p.add_argument("--reps", type=int, default=None, metavar="N",
                   help="repetitions, the settings interleaved: each repetition starts every "
                   "setting's server again (default 1; with --observed, runs of each side, "
                   "alternating, default 2)")
    p.add_argument("--raw", action="store_true",
                   help="--observed: hold the forwards to their traced times as they are "
                   "(default: the profiled window's own slowdown, from SGLang's log, taken off)")
    p.set_defaults(func=run)


def run_observed(args: argparse.Namespace) -> int:
    """`--observed`: microbench/sglang_lab/twin/observed.py."""
    from reports.base.paths import json_path, results_dir
    from reports.base.records import RecordError, write_json_atomic
    from microbench.sglang_lab.twin.observed import render, run_observed_twin
    from microbench.sglang_lab.venv import LabError
    reps = 2 if args.reps is None else args.reps
    rec = Path(args.observed)
    if not rec.is_file():
        raise CliError(f"--observed {rec}: no such file")
    results = Path(args.results) if args.results else results_dir()
    out = Path(args.out) if args.out else results / "twin-observed"
    try:
        data = run_observed_twin(rec, out.resolve(), Path(args.lab_dir).resolve(), reps,
                                 raw=args.raw)
    except (LabError, RecordError, ValueError) as e:
        raise CliError(f"--observed {rec.name}: {str(e).splitlines()[0]}") from None
    dest = json_path(args.json, results / "twin-observed.json")
    write_json_atomic(dest, {"probe": "twin-observed", "status": "ok", "data": data})
    print(render(data))
    print(f"wrote {dest}")
    return 0


def _ints(text: str, what: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"{what}: expected integers separated by commas, got {text[:60]!r}") from None
    if not vals or any(not 1 <= v <= 256 for v in vals):
        raise CliError(f"{what}: each value between 1 and 256, got {text[:60]!r}")
    _once(vals, what)
    return vals


def _once(vals: list, what: str) -> None:
    """A value given twice would run twice into the same artefacts folder (and the record
    would hold two rows of one point): refused before anything starts."""
    twice = sorted({str(v) for v in vals if vals.count(v) > 1})
    if twice:
        raise CliError(f"{what}: {', '.join(twice)[:60]} given twice; give each once "
                       "(--reps repeats the runs)")


def _setting_names(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in SETTINGS]
    if bad or not names:
        shown = ", ".join(bad)[:60] or "empty list"
        raise CliError(f"--settings: unknown {shown}; one or more of {', '.join(SETTINGS)}")
    _once(names, "--settings")
    return names


def settings_to_run(inp, names: list[str]):
    """The twin's servers: the deployment, the report's recommendation and its best pair, as
    SGLang flags (server knobs only; pacing and TP are not server settings)."""
    from microbench.sglang_lab.twin.run import TwinSetting, with_flag
    from reports.base.server_flags import server_args
    from reports.model.scenario.whatifs import best_pair, recommendation, what_ifs
    base = server_args(inp.server)
    out = [TwinSetting("default", base)] if "default" in names else []
    if not {"recommended", "pair"} & set(names):
        return out
    rows = what_ifs(inp)
    picks = [("recommended", recommendation(rows)), ("pair", best_pair(inp, rows))]
    for name, w in picks:
        if name not in names or w is None:
            continue
        flags = base
        for c in w.changes:            # the row's own settings changes (WhatIf.changes)
            if not c.server:
                raise CliError(f"the {name} setting {c.flag} {c.value} is not a server flag "
                               "the twin can start with")
            flags = with_flag(flags, c.flag, str(c.value))
        ov = tuple(w.changes)
        out.append(TwinSetting(name, flags, ov, source=f"{w.knob} {w.setting}"))
    return out


def run(args: argparse.Namespace) -> int:
    if args.reps is not None and not 1 <= args.reps <= 10:
        raise CliError(f"--reps must be between 1 and 10, got {args.reps}")
    if args.observed:
        return run_observed(args)
    from reports.base.paths import json_path, results_dir
    from reports.base.records import write_json_atomic
    from reports.base.schema import SchemaError, to_json
    from reports.model.scenario.inputs import build_inputs, load_records, load_scenario
    from microbench.sglang_lab.twin.run import run_twin
    from microbench.sglang_lab.venv import LabError
    if not 1 <= args.output_len <= 4096:
        raise CliError(f"--output-len must be between 1 and 4096, got {args.output_len}")
    if not 1 <= args.max_k <= 1000 or (args.k is not None and not 1 <= args.k <= 1000):
        raise CliError("--k and --max-k must be between 1 and 1000")
    names = _setting_names(args.settings)
    given = _ints(args.concurrency, "--concurrency") if args.concurrency else None
    results = Path(args.results) if args.results else results_dir()
    records, warnings = load_records(results)
    inp = build_inputs(load_scenario(args.scenario), records, warnings)
    conc = given or list(inp.concurrency)
    out = Path(args.out) if args.out else results / "twin"
    settings = settings_to_run(inp, names)
    dest = json_path(args.json, results / "twin.json")
    partial = dest.with_name(dest.stem + ".partial.json")

    kept = []             # whether this run wrote the partial record

    def keep(data):       # every finished run at once, beside the last complete record
        write_json_atomic(partial, {"probe": "twin", "status": "partial", "data": to_json(data)})
        kept.append(True)
    try:
        data = run_twin(inp, settings, conc, out.resolve(), Path(args.lab_dir).resolve(),
                        args.output_len, args.max_k, args.k, keep=keep, reps=args.reps or 1)
    except (LabError, SchemaError) as e:   # names the partial record only where one was written
        first = str(e).splitlines()[0] if str(e).strip() else type(e).__name__
        raise CliError(first + (f" (runs finished so far: {partial})" if kept else
                                " (no run finished)")) from None
    write_json_atomic(dest, {"probe": "twin", "status": "ok", "data": to_json(data)})
    partial.unlink(missing_ok=True)
    from microbench.sglang_lab.twin.table import render
    print(render(data))
    print(f"wrote {dest}")
    return 0
