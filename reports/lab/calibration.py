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
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from reports.lab.summary import summarise
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
                           holds))
    return got


def _pair(x) -> tuple[float, float] | None:
    return (float(x[0]), float(x[1])) if x else None


def _baseline_of(case_dir: Path) -> str:
    from reports.lab.summary import read_case
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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    js = argv[argv.index("--json") + 1] if "--json" in argv else None
    folders = [Path(a) for i, a in enumerate(argv)
               if not a.startswith("--") and (i == 0 or argv[i - 1] != "--json")]
    if not folders:
        print("usage: python -m reports.lab.calibration OUT [OUT ...] [--md] [--json FILE] "
              "[--against-control]",
              file=sys.stderr)
        return 2
    bad = [str(f) for f in folders if not f.is_dir()]
    if bad:
        print(f"calibration: {bad[0]} is not a lab results folder", file=sys.stderr)
        return 2
    rows = [o for f in folders for o in outcomes(f, "--against-control" in argv)]
    print(render(rows, "--md" in argv))
    if js:
        Path(js).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    from reports.cli import run_guarded
    sys.exit(run_guarded("calibration", main))
