"""What ppscope's recipe costs a server, as the lab measured it: the record `python -m
reports.lab.recipe OUT --machine TEXT --json FILE` writes, and the report reads from
configs/records/recipe-cost.json where one is shipped.

The recipe is what ppscope asks SGLang to be started with (reports/base/server_flags.py
`RECIPE_ARGS`: `--enable-metrics --decode-log-interval 1`): a Prometheus endpoint and one decode
log line per micro-batch per step, where SGLang's defaults have neither. The lab's recipe plan
(`ppscope sglang-lab --recipe`, microbench/sglang_lab/cases.py `recipe_plan`) runs, per round, a
server with SGLang's defaults then one with the recipe, bench_serving at the same C on each.

`cost_pct` is the decode step's change with the recipe, % of the step with SGLang's defaults
(positive: the recipe slows the server): the ratio of the geometric means of the runs' output
tok/s, defaults over recipe, minus 1; `cost_ci` its `level` interval (Welch's t on log tok/s,
reports/model/compare.py `change_interval`), None under two runs a side. Per round and over
every round (all runs of the rounds that have both sides pooled). `significant`: the interval
excludes zero (None without one).

Checked on read: every field's type and range (reports/base/schema.py), then that its figures
are the ones its runs give (each side's geometric mean, the cost from them, the cost inside its
interval, `significant` as the interval says): a file that breaks one is a one-line CliError
naming the file and the field, never a figure in a report.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Literal

from reports.base.errors import CliError
from reports.base.paths import CONFIGS, read_input_json
from reports.base.schema import SchemaError, between, from_json, ge, gt, to_json

SCHEMA = "ppscope-recipe-cost/1"
SHIPPED = CONFIGS / "records" / "recipe-cost.json"
SHIPPED_LABEL = "configs/records/recipe-cost.json"
MAX_BYTES = 1 << 20
SLACK_PCT = 0.01         # the figures are written to 2 decimals: a check allows that much
# a cost or an interval's end (%): above -100 (a step cannot vanish) and at most 100x slower;
# beyond it a figure is not one a run gives, and is refused before it is printed
COST_RANGE = {"gt": -100.0, "le": 10_000.0}


def cost_field(**kw):
    return field(metadata=COST_RANGE, **kw)


def geo_mean(runs: tuple[float, ...]) -> float:
    """The geometric mean of positive tok/s (the centre of the interval on log tok/s)."""
    return math.exp(fmean(math.log(x) for x in runs))


def cost_of(sglang_runs: tuple[float, ...], recipe_runs: tuple[float, ...]) -> float:
    """The decode step's change with the recipe, % of SGLang's defaults' (module docstring)."""
    return round(100 * (geo_mean(sglang_runs) / geo_mean(recipe_runs) - 1), 2)


@dataclass(frozen=True)
class RecipeRound:
    """One round: each side's bench_serving runs (output tok/s), the cost from them."""
    round: int = ge(1)
    recipe_tok_per_s: tuple[float, ...] = gt(0)     # each run's output tok/s, recipe server
    sglang_tok_per_s: tuple[float, ...] = gt(0)     # SGLang's defaults' server
    cost_pct: float = cost_field()
    cost_ci: tuple[float, float] | None = cost_field(default=None)


@dataclass(frozen=True)
class RecipeCost:
    schema: Literal["ppscope-recipe-cost/1"]
    machine: str                       # what the lab ran on, as given (--machine)
    flags: tuple[str, ...]             # the recipe as the lab started SGLang with it
    concurrency: int = ge(1)
    level: float = between(0.5, 0.999)   # the intervals' nominal coverage
    rounds: tuple[RecipeRound, ...]
    recipe_tok_per_s: float = gt(0)    # geometric mean over every round's runs
    sglang_tok_per_s: float = gt(0)
    cost_pct: float = cost_field()
    cost_ci: tuple[float, float] | None = cost_field(default=None)
    significant: bool | None = None

    def to_dict(self) -> dict:
        return to_json(self)

    @staticmethod
    def from_dict(d, path: str) -> RecipeCost:
        """The record of parsed JSON `d`, checked (module docstring); CliError naming `path`."""
        try:
            rec = from_json(RecipeCost, d, "recipe-cost")
        except SchemaError as e:
            raise CliError(f"{path}: {e}: not a recipe-cost record ppscope wrote") from None
        why = rec.inconsistency()
        if why:
            raise CliError(f"{path}: {why}: not a recipe-cost record ppscope wrote")
        return rec

    def inconsistency(self) -> str | None:
        """The first figure its runs do not give, as `field: why`; None: all agree."""
        if not self.machine.strip():
            return "recipe-cost.machine: empty (what the lab ran on)"
        if not self.flags:
            return "recipe-cost.flags: empty (the recipe's flags)"
        if not self.rounds:
            return "recipe-cost.rounds: no round"
        if len({r.round for r in self.rounds}) != len(self.rounds):
            return "recipe-cost.rounds: a round given twice"
        for i, r in enumerate(self.rounds):
            where = f"recipe-cost.rounds[{i}]"
            if not r.recipe_tok_per_s or not r.sglang_tok_per_s:
                return f"{where}: a side without a run"
            why = _figures(where, r.sglang_tok_per_s, r.recipe_tok_per_s, r.cost_pct, r.cost_ci)
            if why:
                return why
        rec = tuple(x for r in self.rounds for x in r.recipe_tok_per_s)
        sgl = tuple(x for r in self.rounds for x in r.sglang_tok_per_s)
        for name, runs, v in (("recipe_tok_per_s", rec, self.recipe_tok_per_s),
                              ("sglang_tok_per_s", sgl, self.sglang_tok_per_s)):
            if not math.isclose(v, geo_mean(runs), rel_tol=1e-6):
                return f"recipe-cost.{name}: {v!r}, not the geometric mean of its rounds' runs"
        why = _figures("recipe-cost", sgl, rec, self.cost_pct, self.cost_ci)
        if why:
            return why
        held = None if self.cost_ci is None else not (self.cost_ci[0] <= 0 <= self.cost_ci[1])
        if self.significant != held:
            return (f"recipe-cost.significant: {self.significant!r}, but the interval "
                    f"{self.cost_ci!r} says {held!r}")
        return None


def _figures(where: str, sgl, rec, cost: float, ci) -> str | None:
    if abs(cost - cost_of(sgl, rec)) > SLACK_PCT:
        return f"{where}.cost_pct: {cost!r}, not the change its runs give ({cost_of(sgl, rec)})"
    if ci is not None and not (ci[0] - SLACK_PCT <= cost <= ci[1] + SLACK_PCT):
        return f"{where}.cost_ci: {list(ci)} does not hold its cost {cost!r}"
    if ci is not None and (len(sgl) < 2 or len(rec) < 2):
        return f"{where}.cost_ci: an interval from one run on a side"
    return None


def read_recipe_cost(path: Path, label: str | None = None) -> RecipeCost:
    """The record at `path` (named `label` in errors), checked; a one-line CliError else."""
    d = read_input_json(path, "recipe-cost record", MAX_BYTES)
    return RecipeCost.from_dict(d, label or str(path))


def shipped_recipe_cost() -> RecipeCost | None:
    """The lab's measurement shipped with ppscope, or None where none is (not measured)."""
    if not SHIPPED.is_file():
        return None
    return read_recipe_cost(SHIPPED, SHIPPED_LABEL)


def dumps(rec: RecipeCost) -> str:
    """The record's file text; checked as its reader checks it, so none is written that the
    reader would refuse."""
    RecipeCost.from_dict(json.loads(json.dumps(rec.to_dict())), "recipe-cost record")
    return json.dumps(rec.to_dict(), indent=1) + "\n"
