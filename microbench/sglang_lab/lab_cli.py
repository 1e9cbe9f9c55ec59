"""`ppscope sglang-lab`: SGLang's own PP server as the system under test (see __init__.py)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from reports.base.errors import CliError

EPILOG = """\
examples:
  ppscope sglang-lab                       # install (once), run every case, read each one
  ppscope sglang-lab --cases clean-c8,slow-stage
  ppscope sglang-lab --analyse-only        # re-read results/lab/* with today's readers
  ppscope sglang-lab --sglang-python /opt/sglang/bin/python --device cuda \\
                     --model-path /models/llama-3-8b      # drive an existing SGLang on GPUs

  a host without network (a GPU server): on a machine with an index, then on the host
  ppscope sglang-lab --bundle lab.tar --python-version 3.12 --target-freeze host-freeze.txt
  ppscope sglang-lab --from-bundle lab.tar --list           # install (no network), list, exit

afterwards: ppscope report --results results/lab/<case>   (the case's report is already there)
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "sglang-lab", help="run SGLang's own PP server with injected faults; read every case",
        description="Start SGLang's own pipeline-parallel server (a venv of its own, CPU by "
                    "default), load it with bench_serving and ppscope's live probe, profile it, "
                    "inject one fault at a time, and read each case with `ppscope sglang` and "
                    "`ppscope report`. Artefacts: OUT/<case>/.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="artefacts folder (default results/lab)")
    p.add_argument("--lab-dir", default=os.environ.get("PPSCOPE_LAB_DIR", ".lab"),
                   help="the lab venv, model and logs (default .lab; never your environment): a "
                   "new or empty folder, or one the lab made; anything else is refused")
    p.add_argument("--pp", type=int, default=2, help="pipeline size (default 2)")
    p.add_argument("--async-depth", type=int, default=0, metavar="N",
                   help="the server's --pp-async-batch-depth (default 0, SGLang's default)")
    p.add_argument("--cases", default="", metavar="NAME,...",
                   help="only these cases (default: the whole plan; --list shows it)")
    p.add_argument("--reps", type=int, default=None, metavar="N",
                   help="bench_serving repetitions of every case (default: the plan's, 1-3)")
    p.add_argument("--quick", action="store_true",
                   help="clean C=8 and one fault only (the CI tier)")
    p.add_argument("--sizes", action="store_true",
                   help="the sizing plan: large faults (slow stage x1.5, x3; host delay 4 and "
                   "20 ms on rank 0 and the last rank) and a window profiled at another C, each "
                   "sized against the clean run")
    p.add_argument("--whatif", action="store_true",
                   help="the what-if plan: SGLang's defaults and each setting the report can "
                   "recommend, before and after, at C = 1, 8, 16 (cases wi-*; the table at the end, "
                   "again with `python -m reports.lab.whatifs OUT`)")
    p.add_argument("--whatif-live", action="store_true",
                   help="the live what-ifs (micro-batch cap, pacing) interleaved with their "
                   "before runs on one server (cases wl-*)")
    p.add_argument("--whatif-restart", action="store_true",
                   help="the restart settings (--pp-async-batch-depth 1 and pp, "
                   "--chunked-prefill-size, --max-running-requests) against the default, the "
                   "servers alternating, the first default servers profiled (cases wr-*)")
    p.add_argument("--split", action="store_true",
                   help="the layer split: SGLang's default split against each split one layer "
                   "away (SGLANG_PP_LAYER_PARTITION), the servers alternating, C = 8, the "
                   "default server's window profiled with SGLang's defaults (stacks: the layers' "
                   "module events time them) (cases sp-*)")
    p.add_argument("--recipe", action="store_true",
                   help="what ppscope's recipe (--enable-metrics --decode-log-interval 1, with "
                   "which every other plan starts SGLang) costs the server: per round a server "
                   "with SGLang's defaults (neither flag) then one with the recipe, C = 8, two "
                   "bench runs each, nothing profiled (cases rc-*; the table at the end, again "
                   "with `python -m reports.lab.recipe OUT`)")
    p.add_argument("--fixes", action="store_true",
                   help="the report's fix for each fault, applied and measured: SGLang's "
                   "defaults with a slow stage on each rank, a slow hop and a host delay (two "
                   "bench runs each, profiled), then the same fault with one layer moved off the "
                   "slow rank (SGLANG_PP_LAYER_PARTITION) or --pp-async-batch-depth 1, the "
                   "servers alternating (cases fx-*; the table at the end, again with "
                   "`python -m reports.lab.fixes OUT`)")
    p.add_argument("--rounds", type=int, default=None, metavar="N",
                   help="--recipe: rounds of the two servers (default 3); "
                   "--whatif-restart, --split, --fixes: rounds of the alternating servers "
                   "(default 2; every round's default servers profiled, the before evidence of "
                   "each, and, with --whatif-restart, the first round's others); --sizes: rounds "
                   "of a clean server, a control "
                   "clean server and every fault, two bench runs each (default 1: the plan "
                   "without controls)")
    p.add_argument("--list", action="store_true", help="print the plan and exit")
    p.add_argument("--sglang-python", default=None, metavar="PATH",
                   help="an existing SGLang installation's python (no install step; nothing is "
                   "written into it: the fault module is loaded through the server's PYTHONPATH)")
    p.add_argument("--model-path", default=None, metavar="DIR",
                   help="with --sglang-python: a model folder (default: the lab's tiny Llama, "
                   "random weights)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu (default; gloo between ranks, graphs off) or cuda (CUDA graphs on)")
    p.add_argument("--analyse-only", action="store_true",
                   help="run no server: read the cases already in --out again (a case "
                   "without its traces, e.g. a copy brought back from another host: its "
                   "sglang.json)")
    b = p.add_argument_group("offline bundle (a host without network, e.g. a GPU server)")
    b.add_argument("--bundle", default=None, metavar="FILE",
                   help="on a machine with a package index: write the wheels of the lab's pinned "
                   "packages into one file (a tar with a manifest of versions and sha256s), "
                   "leaving out torch, torchvision, triton (the host's are used) and what "
                   "--target-freeze already has; then exit")
    b.add_argument("--python-version", default=None, metavar="X.Y",
                   help="--bundle: the target's Python (default: this one's)")
    b.add_argument("--platform", action="append", default=[], metavar="TAG",
                   help="--bundle: the target's wheel platform, e.g. manylinux_2_34_x86_64 "
                   "(widened to every manylinux tag that glibc accepts; repeatable; default: "
                   "this machine's)")
    b.add_argument("--target-freeze", default=None, metavar="FILE",
                   help="--bundle: `python -m pip freeze` of the target's Python; packages it "
                   "has at the pinned version are left out")
    b.add_argument("--compact", action="store_true",
                   help="--bundle: about a third of the size (for a carry limit): wheels repacked "
                   "stored, the parts of SGLang's wheel the lab never loads left out (listed in "
                   "the manifest), the file xz-compressed; slower to build")
    b.add_argument("--target-copies", action="store_true",
                   help="--bundle with --target-freeze: leave out every package the target has "
                   "at any version (its copy is used; the manifest lists the versions that "
                   "differ from SGLang's pins; the install's import check decides)")
    b.add_argument("--from-bundle", default=None, metavar="FILE",
                   help="on the target, with no network: make the lab venv from FILE over the "
                   "host's torch (pip --no-index), then run as usual (with --list: install, "
                   "list, exit)")
    b.add_argument("--host-python", default=None, metavar="PATH",
                   help="--from-bundle: the Python whose torch the lab venv uses (default: the "
                   "one running ppscope)")
    p.set_defaults(func=run)


# the plans other than the default one, by their flag
PLANS = ("quick", "sizes", "whatif", "whatif_live", "whatif_restart", "split", "recipe",
         "fixes")


def _plan(args):
    from microbench.sglang_lab.cases import (default_plan, fixes_plan, recipe_plan, sizes_plan,
                                             split_plan, whatif_live_plan, whatif_plan,
                                             whatif_restart_plan)
    if not 2 <= args.pp <= max(2, os.cpu_count() or 2):
        raise CliError(f"--pp must be between 2 and the number of cores "
                       f"({os.cpu_count()}), got {args.pp}")
    if not 0 <= args.async_depth <= 64:
        raise CliError(f"--async-depth must be between 0 and 64, got {args.async_depth}")
    if args.rounds is not None and not 1 <= args.rounds <= 10:
        raise CliError(f"--rounds must be between 1 and 10, got {args.rounds}")
    plans = [f"--{n.replace('_', '-')}" for n in PLANS if getattr(args, n)]
    if len(plans) > 1:
        raise CliError(f"{' and '.join(plans)} are two plans: give one of them")
    if args.recipe:
        plan = recipe_plan(args.pp, rounds=args.rounds or 3)
    elif args.sizes:
        plan = sizes_plan(args.pp, rounds=args.rounds or 1)
    elif args.whatif:
        plan = whatif_plan(args.pp)
    elif args.whatif_live:
        plan = whatif_live_plan(args.pp)
    elif args.fixes:
        plan = fixes_plan(args.pp, layers=_fixes_layers(args), rounds=args.rounds or 2)
    elif args.whatif_restart or args.split:
        rounds = args.rounds or 2
        plan = (split_plan(args.pp, rounds=rounds) if args.split else
                whatif_restart_plan(args.pp, rounds=rounds))
    else:
        plan = default_plan(args.pp, quick=args.quick, depth=args.async_depth)
    if args.reps is not None:
        if not 1 <= args.reps <= 20:
            raise CliError(f"--reps must be between 1 and 20, got {args.reps}")
        from dataclasses import replace
        plan = tuple(replace(g, cases=tuple(replace(c, reps=args.reps) for c in g.cases))
                     for g in plan)
    names = [c.name for g in plan for c in g.cases]
    only = tuple(x.strip() for x in args.cases.split(",") if x.strip())
    bad = [x for x in only if x not in names]
    if bad:
        raise CliError(f"--cases: unknown case(s) {', '.join(bad)}; the plan has {', '.join(names)}")
    return plan, only


def _bundle(args) -> int | None:
    """--bundle: build and return 0; --from-bundle: install (the run goes on); else None."""
    from microbench.sglang_lab.venv import LabError
    built_for = [f"--{n.replace('_', '-')}" for n in ("python_version", "platform", "target_freeze",
                                                          "compact", "target_copies")
                 if getattr(args, n)]
    if built_for and not args.bundle:
        raise CliError(f"{', '.join(built_for)} only "
                       f"{'goes' if len(built_for) == 1 else 'go'} with --bundle")
    if args.host_python and not args.from_bundle:
        raise CliError("--host-python only goes with --from-bundle")
    if args.bundle and args.from_bundle:
        raise CliError("--bundle builds a bundle, --from-bundle installs one: give one of them")
    if args.from_bundle and args.sglang_python:
        raise CliError("--from-bundle makes the lab's own venv; --sglang-python uses yours: "
                       "give one of them")
    try:
        if args.bundle:
            from microbench.sglang_lab.bundle import BundleSpec, build_bundle
            from microbench.sglang_lab.lab import say
            build_bundle(BundleSpec(
                out=Path(args.bundle).resolve(), python_version=args.python_version,
                platforms=tuple(args.platform),
                target_freeze=Path(args.target_freeze) if args.target_freeze else None,
                compact=args.compact, target_copies=args.target_copies), say)
            return 0
        if args.from_bundle:
            from microbench.sglang_lab.bundle_install import (default_host_python,
                                                              install_from_bundle)
            from microbench.sglang_lab.lab import say
            host = Path(args.host_python) if args.host_python else default_host_python()
            install_from_bundle(Path(args.from_bundle), Path(args.lab_dir).resolve(), host, say)
    except LabError as e:
        raise CliError(str(e)) from None
    return None


def run(args: argparse.Namespace) -> int:
    from reports.base.paths import results_dir
    from microbench.sglang_lab.lab import LabConfig, run_lab, analyse_case
    from reports.lab.summary import render, summarise
    from microbench.sglang_lab.drive import write_json
    from microbench.sglang_lab.venv import LabError
    plan, only = _plan(args)
    if _bundle(args) == 0:
        return 0
    out = Path(args.out) if args.out else results_dir() / "lab"
    if args.list:
        width = max((len(c.name) for g in plan for c in g.cases), default=12)
        for g in plan:
            for c in g.cases:
                shown = ' '.join(list(g.extra_args) + [f'{k}={v}' for k, v in g.env]
                                 + ([] if g.recipe else ["SGLang's defaults (no recipe)"]))
                hog = "" if c.hog_rank is None else f" hog on rank {c.hog_rank}'s core"
                print(f"{c.name:{width}s} pp={g.pp}{' ' + shown if shown else ''} C={c.concurrency:<3d} {c.fault or ''}"
                      f"{hog}"
                      f"{' mmb=%d' % c.mmb if c.mmb else ''}"
                      f"{' rate=%g/s' % c.request_rate if c.request_rate else ''}")
        return 0
    if args.model_path and not args.sglang_python:
        raise CliError("--model-path needs --sglang-python (the lab's own SGLang runs its tiny model)")
    for name in ("sglang_python", "model_path"):
        v = getattr(args, name)
        if v and not Path(v).exists():
            raise CliError(f"--{name.replace('_', '-')}: {v} does not exist")
    if args.analyse_only and args.recipe:    # nothing of the plan is profiled: only its table
        _recipe_table(args, out)
        return 0
    if args.analyse_only:
        dirs = sorted(d for d in out.glob("*") if (d / "case.json").exists()
                      and ((d / "traces").is_dir() or (d / "sglang.json").is_file())
                      and (not only or d.name in only))
        if not dirs:
            raise CliError(f"--analyse-only: no lab cases in {out}")
        from microbench.sglang_lab.lab import order_for_analysis
        from reports.lab.summary import read_case
        for d in dirs:   # every case.json checked (one line) before any case is read again
            read_case(d)
        for d in order_for_analysis(dirs):
            write_json(d / "analysis.json", analyse_case(d))
        rows = summarise(out)
        write_json(out / "summary.json", rows)
        print(render(rows))
        _whatif_table(args, out)
        _fixes_table(args, out)
        failed = [r["case"] for r in rows
                  if r.get("analysis_error") and r["case"] in {d.name for d in dirs}]
        if failed:
            raise CliError(f"--analyse-only: {len(failed)} of {len(rows)} case(s) could not be "
                           f"read again ({', '.join(failed)}); see each case's sglang.out and "
                           "report.out")
        return 0
    cfg = LabConfig(out=out, lab_dir=Path(args.lab_dir).resolve(), plan=plan,
                    sglang_python=Path(args.sglang_python) if args.sglang_python else None,
                    model=Path(args.model_path).resolve() if args.model_path else None,
                    device=args.device, only=only)
    try:
        rc = run_lab(cfg)
    except LabError as e:
        raise CliError(str(e)) from None
    _whatif_table(args, out)
    _recipe_table(args, out)
    _fixes_table(args, out)
    return rc


def _recipe_table(args, out: Path) -> None:
    """With the recipe plan: its cost per round and over all (reports/lab/recipe.py)."""
    if not args.recipe:
        return
    from reports.lab.recipe import recipe_cost, render
    print(render(*recipe_cost(out)))


def _whatif_table(args, out: Path) -> None:
    """With a what-if plan: predicted against measured change (reports/lab/whatifs.py)."""
    if not (args.whatif or args.whatif_live or args.whatif_restart or args.split):
        return
    from microbench.sglang_lab.drive import write_json
    from reports.lab.whatifs import loop_rows, render, whatif_rows
    w, lp = whatif_rows(out), loop_rows(out)
    write_json(out / "whatifs.json", {"whatifs": w, "loop": lp})
    print(render(w, lp))


def _fixes_layers(args) -> int:
    """The served model's decoder layers, which the split the lab applies is made from: the
    lab's tiny model's, else those of --model-path's config.json."""
    from microbench.sglang_lab.venv import MODEL_LAYERS
    if not args.model_path:
        return MODEL_LAYERS
    from reports.base.model_config import ConfigError, load_model
    cfg = Path(args.model_path) / "config.json"
    try:
        return load_model(cfg).num_layers
    except (ConfigError, OSError, ValueError) as e:
        raise CliError(f"--fixes: the layers of --model-path are not known ({cfg}: "
                       f"{str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def _fixes_table(args, out: Path) -> None:
    """With --fixes: the report's fix for each fault against what it measured
    (reports/lab/fixes.py), printed and kept as OUT/fixes.json."""
    if not args.fixes:
        return
    from microbench.sglang_lab.drive import write_json
    from reports.lab.fixes import fix_rows, render
    rows = fix_rows(out)
    write_json(out / "fixes.json", [r.to_json() for r in rows])
    print(render(rows))
