"""What ppscope's recipe costs the server, read from the lab's recipe plan (`ppscope sglang-lab
--recipe`, microbench/sglang_lab/cases.py `recipe_plan`): per round, bench_serving's output tok/s
on SGLang's defaults (`rc-sglang-c<C>.<k>`) and with the recipe (`rc-recipe-c<C>.<k>`,
`--enable-metrics --decode-log-interval 1`), and the recipe's cost: the decode step's change,
% of the defaults' (positive: the recipe slows the server), with its interval from Welch's t on
log tok/s (reports/model/compare.py `change_interval`, reports/model/observed/resample.py
LEVEL). Then the same over every round (the runs of every round that has both sides, pooled).
"no significant change" where the interval holds zero; with one run on a side there is no
interval, and the table says so.

    python -m reports.lab.recipe OUT [--md] [--json FILE --machine TEXT]

`--json FILE` writes the typed record (reports/base/recipe_cost.py `RecipeCost`: rounds, tok/s
per side, cost %, interval, level, and the machine as `--machine` describes it), the record the
report reads when it is shipped as configs/records/recipe-cost.json. A FILE that holds
something other than such a record is never replaced.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from reports.base.errors import CliError
from reports.base.recipe_cost import (SCHEMA, RecipeCost, RecipeRound, cost_of, dumps, geo_mean,
                                      read_recipe_cost)
from reports.base.server_flags import RECIPE_ARGS
from reports.lab.summary import bench_tok_per_s, read_case
from reports.model.compare import change_interval
from reports.model.observed.resample import LEVEL

CASE_RE = re.compile(r"rc-(recipe|sglang)-c(\d+)\.(\d+)")
MAX_MACHINE = 200        # characters of --machine


def _sides(out: Path) -> tuple[int, dict[int, dict[str, list[float]]]]:
    """(C, {round: {"recipe": runs, "sglang": runs}}) of the rc-* cases in `out`, each checked
    against its case.json: the side its name says, its round's defaults case as the recipe
    case's baseline, one C for all."""
    if not out.is_dir():
        raise CliError(f"{out}: not a lab results folder")
    by: dict[int, dict[str, list[float]]] = {}
    cs = set()
    for d in sorted(p for p in out.iterdir() if (p / "case.json").is_file()):
        m = CASE_RE.fullmatch(d.name)
        if not m:
            continue
        side, C, k = m.group(1), int(m.group(2)), int(m.group(3))
        rec = read_case(d)        # a case without `recipe` predates the plan: it ran with it
        case = rec.case
        if case.concurrency != C:
            raise CliError(f"{d / 'case.json'}: concurrency {case.concurrency}, but the case "
                           f"is named for C={C}")
        if rec.recipe != (side == "recipe"):
            raise CliError(f"{d / 'case.json'}: its server was started "
                           f"{'with' if side == 'sglang' else 'without'} the recipe, but the "
                           f"case is named for the {side} side")
        if side == "recipe" and case.baseline != f"rc-sglang-c{C}.{k}":
            raise CliError(f"{d / 'case.json'}: baseline {case.baseline!r}, not its "
                           f"round's defaults case rc-sglang-c{C}.{k}")
        cs.add(C)
        by.setdefault(k, {}).setdefault(side, []).extend(bench_tok_per_s(d))
    if not by:
        raise CliError(f"{out}: no recipe cases (rc-recipe-c*.k, rc-sglang-c*.k): run "
                       "`ppscope sglang-lab --recipe`")
    if len(cs) > 1:
        raise CliError(f"{out}: recipe cases at C = {', '.join(map(str, sorted(cs)))}: one C "
                       "per folder")
    return cs.pop(), by


def recipe_rounds(out: Path) -> tuple[int, list[RecipeRound], list[int]]:
    """(C, every round with both sides measured, the rounds left out for a missing side)."""
    C, by = _sides(out)
    rounds, missing = [], []
    for k in sorted(by):
        rec, sgl = tuple(by[k].get("recipe", ())), tuple(by[k].get("sglang", ()))
        if not rec or not sgl:
            missing.append(k)
            continue
        rounds.append(RecipeRound(k, rec, sgl, cost_of(sgl, rec), change_interval(sgl, rec)))
    return C, rounds, missing


def recipe_cost(out: Path, machine: str = "not given") -> tuple[RecipeCost, list[int]]:
    """The record of the recipe cases in `out` (module docstring), and the rounds it leaves
    out (a side without bench runs: a case that failed)."""
    C, rounds, missing = recipe_rounds(out)
    if not rounds:
        raise CliError(f"{out}: no round has both servers measured (rounds "
                       f"{', '.join(map(str, missing))} lack a side's bench runs)")
    rec = tuple(x for r in rounds for x in r.recipe_tok_per_s)
    sgl = tuple(x for r in rounds for x in r.sglang_tok_per_s)
    ci = change_interval(sgl, rec)
    return RecipeCost(SCHEMA, machine, RECIPE_ARGS, C, LEVEL, tuple(rounds), geo_mean(rec),
                      geo_mean(sgl), cost_of(sgl, rec), ci,
                      None if ci is None else not (ci[0] <= 0 <= ci[1])), missing


def verdict(ci: tuple[float, float] | None) -> str:
    if ci is None:
        return "one run on a side: no interval"
    return "no significant change" if ci[0] <= 0 <= ci[1] else "significant"


def render(rc: RecipeCost, missing: list[int] = (), fmt: str = "simple") -> str:
    from tabulate import tabulate

    def row(name, rec, sgl, cost, ci):
        return [name, f"{geo_mean(rec):.1f} ({len(rec)})", f"{geo_mean(sgl):.1f} ({len(sgl)})",
                f"{cost:+.1f}%", f"{ci[0]:+.1f} to {ci[1]:+.1f}%" if ci else "-", verdict(ci)]
    rows = [row(f"round {r.round}", r.recipe_tok_per_s, r.sglang_tok_per_s, r.cost_pct,
                r.cost_ci) for r in rc.rounds]
    rows.append(row(f"all {len(rc.rounds)} rounds",
                    tuple(x for r in rc.rounds for x in r.recipe_tok_per_s),
                    tuple(x for r in rc.rounds for x in r.sglang_tok_per_s),
                    rc.cost_pct, rc.cost_ci))
    head = (f"ppscope's recipe ({' '.join(rc.flags)}) against SGLang's defaults, C = "
            f"{rc.concurrency}, bench_serving output tok/s (geometric mean, runs); cost: the "
            f"decode step's change with the recipe, {rc.level:.0%} interval")
    left = (f"\n\nLeft out: round {', '.join(map(str, missing))} (a side without bench runs)"
            if missing else "")
    return head + "\n\n" + tabulate(
        rows, headers=["round", "recipe tok/s", "defaults tok/s", "cost",
                       f"{rc.level:.0%} interval", ""], tablefmt=fmt,
        disable_numparse=True) + left


def _write(path: Path, rc: RecipeCost) -> None:
    """`rc` into `path`, replacing only a recipe-cost record (never another file)."""
    from reports.base.records import write_atomic
    if path.is_file():
        try:
            read_recipe_cost(path)
        except CliError:
            raise CliError(f"{path}: exists and is not a recipe-cost record; not replaced "
                           "(give another --json file)") from None
    write_atomic(path, dumps(rc))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m reports.lab.recipe",
        description="What ppscope's recipe (--enable-metrics --decode-log-interval 1) costs the "
                    "server: the lab's recipe cases (ppscope sglang-lab --recipe) per round and "
                    "over all rounds.")
    ap.add_argument("out", type=Path, help="the lab's results folder (its rc-* cases)")
    ap.add_argument("--md", action="store_true", help="a Markdown table")
    ap.add_argument("--json", type=Path, default=None, metavar="FILE",
                    help="write the record (configs/records/recipe-cost.json is the one the "
                    "report reads); needs --machine")
    ap.add_argument("--machine", default=None, metavar="TEXT",
                    help="what the lab ran on, for the record (e.g. '16-core Xeon, pp 2, CPU')")
    a = ap.parse_args(argv)
    from reports.cli import run_guarded   # ppscope's error rules: one line, exit 2
    return run_guarded("recipe", lambda: _main(a))


def _main(a) -> int:
    machine = None if a.machine is None else " ".join(a.machine.split())
    if a.json is not None and not machine:
        raise CliError("--json needs --machine TEXT: what the lab ran on")
    if machine is not None and not (machine and len(machine) <= MAX_MACHINE):
        raise CliError(f"--machine: 1 to {MAX_MACHINE} characters, got {len(machine)}")
    rc, missing = recipe_cost(a.out, machine or "not given")
    print(render(rc, missing, "github" if a.md else "simple"))
    if a.json is not None:
        _write(a.json, rc)
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

