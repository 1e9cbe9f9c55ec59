"""How sure the diagnosis is, checked on the lab's own rounds (`ppscope sglang-lab --sizes
--rounds N`): the intervals' actual coverage beside their nominal level.

What is known in the lab, and so what each interval should contain:
- a control pair (a second clean measurement read against its round's clean one,
  `--baseline`) changed nothing: the change's interval should hold 0, and the report should say
  "no significant change";
- a fault case's measured slowdown (bench_serving, against its round's clean case) is what the
  expected cause's growth should come to: its growth's interval (the cause that grew most, as a
  share of the clean step) should hold it, and the expected cause should be named first. Faults
  whose slowdown is under twice the clean case's own spread are counted apart: there the noise
  is as large as the fault, and "within noise" or a right size are both right answers.

`python -m reports.lab.calibration OUT [OUT ...] [--md] [--against-control]` reads each OUT's cases (their
report.json, as `reports.lab.summary` does) and prints the table; `--json FILE` keeps the rows.

The model's error (reports/model/model_error.py): `--model-error FILE --machine TEXT` writes the
record of the ratios measured slowdown / modelled growth over the faults (expected cause grown
most, slowdown at least twice the clean spread); `--apply FILE` judges every growth interval as
the windows' noise widened by FILE's bands (an out-of-sample check: a record measured on other
rounds); `--cross-validate` does so round by round, each round judged by the band of all the
others (leave one round out), the coverage a shipped record can be expected to give.
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from reports.base.errors import CliError
from reports.lab.summary import read_case, summarise
from reports.model.model_error import POOLED, ModelError, band_of, read, widened
from reports.model.observed.resample import LEVEL


@dataclass(frozen=True)
class Outcome:
    """One case of a round against its clean case."""
    folder: str
    case: str
    kind: str                              # "control", "fault", "fault (small)"
    expect: str
    slowdown_pct: float | None             # measured: clean tok/s / case tok/s - 1
    slowdown_ci: tuple[float, float] | None
    clean_spread_pct: float | None
    significant: bool | None               # the report's change detection
    first_cause: str | None
    moved_cause: str | None
    moved_ci: tuple[float, float] | None    # the growth's interval, % of the clean step
    holds: bool | None                     # the interval holds what is known (module doc)
    moved_window_ci: tuple[float, float] | None = None   # the windows' noise alone


def _holds(ci, value: float | None) -> bool | None:
    if not ci or value is None:
        return None
    return min(ci) <= value <= max(ci)


def outcomes(out: Path, against_control: bool = False) -> list[Outcome]:
    """`against_control`: a fault's measured slowdown set against its round's control case
    (the clean load measured just before the faults) instead of its clean case; for rounds
    whose clean load drifted between the two (docs/BENCHMARKS.md section 18)."""
    rows = {r["case"]: r for r in summarise(out)}
    got = []
    for name, r in rows.items():
        base = _baseline_of(out / name)
        if not base or base not in rows or r.get("slowdown_pct") is None:
            continue
        clean = rows[base]
        spread = clean.get("spread_pct")
        if name.startswith("control-"):
            kind, known = "control", 0.0
            holds = _holds(r.get("slowdown_ci"), 0.0)
        else:
            ctl = rows.get("control-" + base.split("-", 1)[1]) if against_control else None
            if ctl and ctl.get("tok_per_s") and r.get("tok_per_s"):
                r = {**r, "slowdown_pct": 100 * (ctl["tok_per_s"] / r["tok_per_s"] - 1),
                     "slowdown_ci": None}
                spread = ctl.get("spread_pct")
            big = spread is not None and r["slowdown_pct"] >= 2 * spread
            kind, known = ("fault" if big else "fault (small)"), r["slowdown_pct"]
            holds = _holds(r.get("moved_ci"), known) if r.get("moved_cause") == r.get("expect") \
                else (False if r.get("moved_ci") else None)
        got.append(Outcome(out.name, name, kind, r.get("expect") or "", r["slowdown_pct"],
                           _pair(r.get("slowdown_ci")), spread, r.get("significant"),
                           r.get("first_cause"), r.get("moved_cause"), _pair(r.get("moved_ci")),
                           holds, _pair(r.get("moved_window_ci") or r.get("moved_ci"))))
    return got


def _pair(x) -> tuple[float, float] | None:
    return (float(x[0]), float(x[1])) if x else None


def _baseline_of(case_dir: Path) -> str:
    return read_case(case_dir).case.baseline or ""


@dataclass(frozen=True)
class Tally:
    controls: int
    controls_no_change: int          # the report said "no significant change"
    controls_held: int               # the change's interval held 0
    faults: int                      # slowdown at least twice the clean spread
    faults_named: int                # the expected cause named first
    faults_held: int                 # its growth's interval held the measured slowdown
    small: int
    small_noise_or_right: int        # within noise, nothing named, or the growth held it


def tally(rows: list[Outcome]) -> Tally:
    ctl = [r for r in rows if r.kind == "control"]
    big = [r for r in rows if r.kind == "fault"]
    small = [r for r in rows if r.kind == "fault (small)"]
    return Tally(
        len(ctl), sum(r.significant is False for r in ctl), sum(bool(r.holds) for r in ctl),
        len(big), sum(r.first_cause == r.expect for r in big), sum(bool(r.holds) for r in big),
        len(small), sum(r.first_cause != r.expect or bool(r.holds) for r in small))


def _ratio(r: Outcome) -> float | None:
    """Measured slowdown / the expected cause's modelled growth (the windows' interval's
    middle), for a fault that stands out of the noise and whose expected cause grew most."""
    ci = r.moved_window_ci
    if r.kind != "fault" or r.moved_cause != r.expect or not ci or r.slowdown_pct is None:
        return None
    mid = (ci[0] + ci[1]) / 2
    return r.slowdown_pct / mid if mid > 0 and r.slowdown_pct > 0 else None


def model_error_of(rows: list[Outcome], measured_on: str, command: str) -> ModelError:
    """The record of the model's error over `rows`: a band per expected cause and a pooled one."""
    by: dict[str, list[float]] = {}
    for r in rows:
        x = _ratio(r)
        if x is not None:
            by.setdefault(r.expect, []).append(x)
    if not by:
        raise CliError("calibration: no fault stands out of its clean run's noise with its "
                       "expected cause grown most: no model error to measure")
    causes = [band_of(c, v, LEVEL) for c, v in sorted(by.items())]
    causes.append(band_of(POOLED, [x for v in by.values() for x in v], LEVEL))
    return ModelError(LEVEL, measured_on, command, tuple(causes))


def judged(rows: list[Outcome], err: ModelError) -> list[Outcome]:
    """Every fault's growth interval as the windows' noise widened by `err`, and whether it
    holds the measured slowdown (controls as they were)."""
    out = []
    for r in rows:
        if r.kind == "control" or not r.moved_window_ci:
            out.append(r)
            continue
        ci, _ = widened(r.moved_cause or "", r.moved_window_ci, err)
        holds = _holds(ci, r.slowdown_pct) if r.moved_cause == r.expect else False
        out.append(replace(r, moved_ci=ci, holds=holds))
    return out


def _round(r: Outcome) -> tuple[str, str]:
    return r.folder, r.case.rsplit(".", 1)[-1] if "." in r.case else ""


def cross_validated(rows: list[Outcome]) -> list[Outcome]:
    """Each round judged by the band measured on every other round (leave one round out)."""
    out = []
    for key in dict.fromkeys(_round(r) for r in rows):
        rest = [r for r in rows if _round(r) != key]
        mine = [r for r in rows if _round(r) == key]
        try:
            err = model_error_of(rest, "", "")
        except CliError:
            out += mine
            continue
        out += judged(mine, err)
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1f}%"


def _ci(x) -> str:
    return "-" if not x else f"{min(x):+.1f} to {max(x):+.1f}%"


def render(rows: list[Outcome], md: bool = False) -> str:
    from tabulate import tabulate
    yes = {True: "yes", False: "no", None: "-"}
    table = tabulate(
        [[r.folder, r.case, r.kind, _pct(r.slowdown_pct), _ci(r.slowdown_ci),
          _pct(r.clean_spread_pct), yes[r.significant], r.first_cause or "-",
          f"{r.moved_cause or '-'} {_ci(r.moved_ci)}", yes[r.holds]] for r in rows],
        headers=["folder", "case", "kind", "measured slowdown", f"its {LEVEL:.0%} interval",
                 "clean spread", "significant", "named first", "grew most (interval)",
                 "interval holds the truth"],
        tablefmt="github" if md else "simple")
    t = tally(rows)
    held = t.controls_held + t.faults_held
    n = t.controls + t.faults
    lines = [table, "",
             f"controls: {t.controls_no_change} of {t.controls} said no significant change; "
             f"the change's interval held 0 in {t.controls_held} of {t.controls}",
             f"faults (slowdown at least twice the clean spread): named first {t.faults_named} "
             f"of {t.faults}; growth's interval held the measured slowdown {t.faults_held} "
             f"of {t.faults}",
             f"small faults: within noise, not named or sized right {t.small_noise_or_right} "
             f"of {t.small}",
             f"coverage: nominal {LEVEL:.0%}, actual "
             + (f"{100 * held / n:.0f}% ({held} of {n} intervals)" if n else "- (no cases)")]
    return "\n".join(lines)


USAGE = ("usage: python -m reports.lab.calibration OUT [OUT ...] [--md] [--json FILE] "
         "[--against-control] [--model-error FILE --machine TEXT | --apply FILE | "
         "--cross-validate]")
_VALUED = ("--json", "--model-error", "--machine", "--apply")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    opt = {}
    for k in _VALUED:
        if k in argv:
            i = argv.index(k)
            if i + 1 >= len(argv):
                raise CliError(f"calibration: {k} needs a value")
            opt[k] = argv[i + 1]
    folders = [Path(a) for i, a in enumerate(argv)
               if not a.startswith("--") and (i == 0 or argv[i - 1] not in _VALUED)]
    if not folders:
        print(USAGE, file=sys.stderr)
        return 2
    bad = [str(f) for f in folders if not f.is_dir()]
    if bad:
        print(f"calibration: {bad[0]} is not a lab results folder", file=sys.stderr)
        return 2
    if "--model-error" in opt and "--machine" not in opt:
        raise CliError("calibration: --model-error needs --machine TEXT (where the lab ran)")
    rows = [o for f in folders for o in outcomes(f, "--against-control" in argv)]
    if "--apply" in opt:
        rows = judged(rows, read(Path(opt["--apply"])))
    elif "--cross-validate" in argv:
        rows = cross_validated(rows)
    print(render(rows, "--md" in argv))
    if "--json" in opt:
        Path(opt["--json"]).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    if "--model-error" in opt:
        cmd = ("python -m reports.lab.calibration " + " ".join(f.name for f in folders)
               + (" --against-control" if "--against-control" in argv else "")
               + f" --model-error {Path(opt['--model-error']).name} --machine '...'")
        err = model_error_of(rows, opt["--machine"], cmd)
        Path(opt["--model-error"]).write_text(json.dumps(err.to_dict(), indent=1) + "\n")
        for c in err.causes:
            print(f"model error, {c.cause}: measured / modelled {c.ratio_lo:.2f} to "
                  f"{c.ratio_hi:.2f} (median {c.ratio_median:.2f}, {c.cases} cases)")
    return 0


if __name__ == "__main__":
    from reports.cli import run_guarded
    sys.exit(run_guarded("calibration", main))
