"""The report's fix for each fault, applied in the lab and measured (`ppscope sglang-lab
--fixes`, microbench/sglang_lab/cases.py `fixes_plan`).

Each fault runs on SGLang's defaults (a "before" case `fx-<fault>-c8.<k>`, profiled and read by
`ppscope sglang` + `ppscope report`), then on a server with the fix the report can give (an
"after" case whose `baseline` is that before case, only measured). Per fault and round:

- the before case's first named cause (its report.json's diagnosis);
- the report's fix for the fault's cause, as its report.json gives it: for a slow stage the
  diagnosis' layer split (`SGLANG_PP_LAYER_PARTITION`, its predicted gain and interval); for
  another cause the best of the settings tried on the server's own loop that act on it
  (render/answer_table.py `FIXES`, the `server_whatifs` rows, best first: its modelled change,
  no interval; "offered" where it gains over the what-ifs' no-change bound, else only tried);
  where no setting acts on the cause (host work), "no server setting" and what would;
- the setting the lab applied (the after case's change against the before case,
  reports/lab/whatifs.py `change_of`) and whether it is the report's;
- the measured gain: mean tok/s after / mean tok/s before - 1 over each case's bench_serving
  runs, with its 90% interval (reports/model/compare.py `change_interval`, Welch on log tok/s);
- "right sign": the measured and the predicted gain (the report's for the setting applied) have
  the same sign; "within": the measured gain lies inside the predicted interval, or within
  WITHIN_POINTS of the predicted gain where the prediction has no interval.

    python -m reports.lab.fixes OUT [--md] [--json FILE]

Read-only (FILE aside): a folder with no fix cases, or a case file that is not what the lab
writes, is a one-line error (exit 2).
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from statistics import mean

from reports.base.errors import CliError
from reports.lab.summary import analysis_error, bench_tok_per_s, read_case
from reports.lab.whatifs import change_of
from reports.base.payloads.lab_case import LabCase
from reports.base.records import write_json_atomic
from reports.model.compare import change_interval
from reports.model.observed.split_error import band_of, widened
from reports.model.report_type import REPORT_SCHEMA, Report
from reports.model.settings_change import LAYER_PARTITION
from reports.render.answer_table import FIXES, NO_SETTING

PREFIX = "fx-"           # cases.fixes_plan's case names
WITHIN_POINTS = 25.0     # "within" where the report gives no interval: +-25 points of its gain
REPORT_MAX_BYTES = 64 << 20
USAGE = ("usage: python -m reports.lab.fixes OUT [OUT ...] [--md] [--json FILE] "
         "[--split-error FILE --machine TEXT] [--cross-validate]")


@dataclass(frozen=True)
class ReportFix:
    """What the before case's report gives for a cause: a setting (`knob` and `value`) with its
    predicted change of tok/s, %, or no setting (`knob` None) with `note` saying why."""
    knob: str | None
    value: str | None = None
    gain_pct: float | None = None
    gain_ci: tuple[float, float] | None = None
    offered: bool = False        # the report's answer recommends it (else: tried only)
    note: str = ""
    # the split's interval of the traced window alone, where `gain_ci` adds the lab's split
    # error (reports/model/observed/split_error.py); a report written before: `gain_ci`
    window_ci: tuple[float, float] | None = None

    def text(self) -> str:
        if self.knob is None or self.value is None or self.gain_pct is None:
            return self.note
        ci = f" ({self.gain_ci[0]:+.1f} to {self.gain_ci[1]:+.1f})" if self.gain_ci else ""
        tried = "" if self.offered else " (tried, not offered: gains too little)"
        return f"{_setting(self.knob, self.value)}: {self.gain_pct:+.1f}%{ci}{tried}"


@dataclass(frozen=True)
class FixRow:
    """One fault in one round: the report's fix against what the lab measured (module
    docstring). Gains are % of the before case's tok/s; None where not known."""
    round: str
    fault: str
    cause: str                      # the fault's cause (the case's `expect`)
    before: str
    after: str | None               # None: nothing applied (no after case)
    first_cause: str | None
    fix: ReportFix
    applied_knob: str | None        # the setting the lab applied (None: nothing)
    applied_value: str | None
    applied_is_reports: bool | None
    predicted_pct: float | None     # the report's gain for the setting applied
    predicted_ci: tuple[float, float] | None
    before_tok_per_s: float | None
    after_tok_per_s: float | None
    before_runs: int
    after_runs: int
    measured_pct: float | None
    measured_ci: tuple[float, float] | None
    right_sign: bool | None
    within: bool | None
    folder: str = ""
    predicted_window_ci: tuple[float, float] | None = None   # the window's noise alone

    def to_json(self) -> dict:
        return asdict(self)


def _setting(knob: str, value) -> str:
    return f"{knob}={value}" if knob == LAYER_PARTITION else f"{knob} {value}"


def read_report(d: Path) -> Report | None:
    """The case's report.json; None where the case has none; a one-line CliError naming the
    file where it is not a report this ppscope reads."""
    from reports.base.paths import read_input_json
    from reports.base.schema import SchemaError
    p = d / "report.json"
    if not p.exists():
        return None
    raw = read_input_json(p, "report.json", REPORT_MAX_BYTES)
    if not isinstance(raw, dict) or raw.get("schema") != REPORT_SCHEMA:
        raise CliError(f"{p}: not a ppscope report.json ({REPORT_SCHEMA})")
    try:
        return Report.from_json(raw, str(p))
    except SchemaError as e:
        raise CliError(f"{p}: {e} (not a report.json this ppscope reads)") from None


def report_fix(rep: Report | None, cause: str, why_none: str = "") -> ReportFix:
    """The report's fix for `cause` (module docstring), the choice render/answer_table.py
    `observed_what_to_do` makes for its cell."""
    if rep is None or rep.diagnosed is None:
        return ReportFix(None, note=why_none or "no diagnosis in the report")
    if cause == "slow_stage":
        f = rep.diagnosed.layer_split
        if f is None:
            return ReportFix(LAYER_PARTITION, note=f"{LAYER_PARTITION}: not estimated")
        win = f.gain_window_ci or f.gain_ci
        return ReportFix(LAYER_PARTITION, f.value, f.gain_pct,
                         tuple(f.gain_ci) if f.gain_ci else None, offered=True,
                         window_ci=tuple(win) if win else None)
    knobs = FIXES.get(cause, ())
    if not knobs:
        return ReportFix(None, note=f"no server setting (what would: "
                                    f"{NO_SETTING.get(cause, 'other hardware')})")
    sw = rep.server_whatifs
    if sw is None or sw.status != "ok":
        why = sw.reason if sw is not None and sw.reason else "no bench run in the evidence"
        return ReportFix(None, note=f"settings not tried on this server: {why}")
    w = next((w for w in sw.rows if w.knob in knobs), None)     # the rows are best first
    if w is None:
        return ReportFix(None, note="no setting that acts on it was tried")
    return ReportFix(w.knob, w.setting, w.change_pct, None,
                     offered=w.change_pct > sw.no_change_pct)


def _predicted(rep: Report | None, fix: ReportFix, knob: str, value: str
               ) -> tuple[float | None, tuple[float, float] | None]:
    """The report's gain for the setting the lab applied: its fix's where they are the same,
    else the setting's own row among those tried on the server's loop (no interval)."""
    if (fix.knob, fix.value) == (knob, value):
        return fix.gain_pct, fix.gain_ci
    sw = rep.server_whatifs if rep is not None else None
    rows = sw.rows if sw is not None and sw.status == "ok" else ()
    w = next((w for w in rows if (w.knob, str(w.setting)) == (knob, value)), None)
    return (w.change_pct, None) if w is not None else (None, None)


def _same_sign(a: float, b: float) -> bool:
    return (a > 0 and b > 0) or (a < 0 and b < 0) or a == b == 0


def _round_no(name: str) -> int:
    """The round of a case named `<case>.<k>` (0 where it has none)."""
    k = name.rpartition(".")[2]
    return int(k) if "." in name and k.isdigit() else 0


def _first_cause(rep: Report | None) -> str | None:
    dg = rep.diagnosed if rep is not None else None
    return dg.named[0] if dg is not None and dg.named else None


def fix_rows(out: Path) -> list[FixRow]:
    """One row per fix case of `out` whose baseline is empty (a fault on SGLang's defaults),
    in the order they ran."""
    if not out.is_dir():
        raise CliError(f"{out} is not a lab results folder")
    dirs = sorted(d for d in out.iterdir() if d.name.startswith(PREFIX)
                  and (d / "case.json").exists())
    if not dirs:
        raise CliError(f"{out}: no fix cases ({PREFIX}*/case.json; `ppscope sglang-lab --fixes`)")
    cases = {d.name: read_case(d) for d in dirs}   # one line naming a bad one
    befores = [d for d in dirs if not cases[d.name].case.baseline]
    befores.sort(key=lambda d: (_round_no(d.name), cases[d.name].started_unix or 0.0,
                                d.name))
    rows = []
    for b in befores:
        cb = cases[b.name]
        afters = [d for d in dirs if cases[d.name].case.baseline == b.name]
        failed = analysis_error(b)
        rep = None if failed else read_report(b)
        cause = cb.case.expect or _first_cause(rep) or ""
        fix = report_fix(rep, cause, "analysis failed" if failed else "not analysed (no "
                         "report.json)")
        first = "analysis failed" if failed else _first_cause(rep)
        tb = bench_tok_per_s(b)
        for a in afters or [None]:
            rows.append(_row(b, a, cb, cases[a.name] if a is not None else None, cause, first,
                             rep, fix, tb))
    return rows


def _row(b: Path, a: Path | None, cb: LabCase, ca: LabCase | None, cause: str, first: str | None,
         rep: Report | None, fix: ReportFix, tb: list[float]) -> FixRow:
    ta = bench_tok_per_s(a) if a is not None else []
    ch = change_of(ca, cb) if ca is not None else None
    knob, value = (ch[0], str(ch[1])) if ch is not None else (None, None)
    pred, pci = _predicted(rep, fix, knob, value) if knob is not None else (None, None)
    meas = 100 * (mean(ta) / mean(tb) - 1) if ta and tb else None
    # change_interval gives the step's change, baseline / now - 1 in tok/s: with the after
    # runs as its baseline it is after / before - 1, the gain (not the step's change)
    mci = change_interval(ta, tb) if ta and tb else None
    sign = _same_sign(meas, pred) if meas is not None and pred is not None else None
    within = None
    if meas is not None and pred is not None:
        within = (pci[0] <= meas <= pci[1] if pci else abs(meas - pred) <= WITHIN_POINTS)
    return FixRow(
        round=b.name.rpartition(".")[2] if "." in b.name else "", fault=cb.case.fault
        or "", cause=cause, before=b.name, after=a.name if a is not None else None,
        first_cause=first, fix=fix, applied_knob=knob, applied_value=value,
        applied_is_reports=((fix.knob, fix.value) == (knob, value)) if knob else None,
        predicted_pct=pred, predicted_ci=pci,
        before_tok_per_s=mean(tb) if tb else None, after_tok_per_s=mean(ta) if ta else None,
        before_runs=len(tb), after_runs=len(ta), measured_pct=meas,
        measured_ci=tuple(mci) if mci else None, right_sign=sign, within=within,
        folder=b.parent.name,
        predicted_window_ci=fix.window_ci if (fix.knob, fix.value) == (knob, value) else None)


def _applied_cell(r: FixRow) -> str:
    if r.applied_knob is None:
        return "nothing"
    return _setting(r.applied_knob, r.applied_value)


def _reports_cell(r: FixRow) -> str:
    """yes; else both: the values where the setting is the same, else the settings."""
    if r.applied_knob is None:
        return "-"
    if r.applied_is_reports:
        return "yes"
    if r.fix.knob == r.applied_knob and r.fix.value is not None:
        return f"no: report {r.fix.value}, lab {r.applied_value}"
    shown = _setting(r.fix.knob, r.fix.value) if r.fix.value is not None else "none"
    return f"no: report {shown}, lab {_applied_cell(r)}"


def _pct(x: float | None, ci: tuple[float, float] | None = None) -> str:
    if x is None:
        return "-"
    return f"{x:+.1f}%" + (f" ({ci[0]:+.1f} to {ci[1]:+.1f})" if ci else "")


def _tok_cell(before: float | None, after: float | None) -> str:
    if before is None:
        return "-"
    return f"{before:.1f} -> {after:.1f}" if after is not None else f"{before:.1f}"


def summary_line(rows: list[FixRow]) -> str:
    judged = [r for r in rows if r.right_sign is not None]
    m = len(judged)
    return (f"right sign {sum(r.right_sign for r in judged)} of {m}, within "
            f"{sum(bool(r.within) for r in judged)} of {m} (the faults whose fix was applied "
            f"and predicted; {len(rows) - m} of {len(rows)} not judged)")


def render(rows: list[FixRow], fmt: str = "simple") -> str:
    from tabulate import tabulate
    yn = {True: "yes", False: "no", None: "-"}
    body = tabulate([[r.round, r.fault, r.first_cause or "-", r.fix.text(), _applied_cell(r),
                      _reports_cell(r), _pct(r.predicted_pct, r.predicted_ci),
                      _tok_cell(r.before_tok_per_s, r.after_tok_per_s),
                      _pct(r.measured_pct, r.measured_ci), yn[r.right_sign], yn[r.within]]
                     for r in rows],
                    headers=["round", "fault", "first cause", "report's fix", "lab applied",
                             "the report's?", "predicted gain (90%)", "tok/s (mean)",
                             "measured gain (90%)", "right sign", "within"], tablefmt=fmt)
    return body + "\n\n" + summary_line(rows)


def split_diffs(rows: list[FixRow]) -> list[float]:
    """Measured - predicted gain (points) of each applied split the report gave (the lab's
    split error, reports/model/observed/split_error.py)."""
    return [r.measured_pct - r.predicted_pct for r in rows
            if r.applied_knob == LAYER_PARTITION and r.applied_is_reports
            and r.measured_pct is not None and r.predicted_pct is not None]


def cross_validated(rows: list[FixRow]) -> list[FixRow]:
    """Each applied split judged by the split error of the other rounds' splits (leave one
    round out): "within" where its measured gain lies in the window's interval widened by that
    band. Other rows as they are."""
    out = []
    for r in rows:
        ci = r.predicted_window_ci
        if r.applied_knob != LAYER_PARTITION or ci is None or r.measured_pct is None:
            out.append(r)
            continue
        rest = split_diffs([x for x in rows if (x.folder, x.round) != (r.folder, r.round)])
        if not rest:
            out.append(replace(r, within=None))
            continue
        lo, hi = widened(ci, band_of(rest, "", ""))
        out.append(replace(r, predicted_ci=(lo, hi), within=lo <= r.measured_pct <= hi))
    return out


def _option(argv: list[str], name: str, what: str = "a file") -> str | None:
    if name not in argv:
        return None
    i = argv.index(name)
    if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
        raise CliError(f"fixes: {name} needs {what} ({USAGE})")
    value = argv.pop(i + 1)
    argv.pop(i)
    return value


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    dest = _option(argv, "--json")
    split_out = _option(argv, "--split-error")
    machine = _option(argv, "--machine", "a text")
    if (split_out is None) != (machine is None):
        raise CliError(f"fixes: --split-error FILE needs --machine TEXT, and the other way "
                       f"round ({USAGE})")
    md = "--md" in argv
    cv = "--cross-validate" in argv
    rest = [a for a in argv if a not in ("--md", "--cross-validate")]
    unknown = [a for a in rest if a.startswith("--")]
    if unknown:
        raise CliError(f"fixes: unknown option {unknown[0]} ({USAGE})")
    if not rest:
        print(USAGE, file=sys.stderr)
        return 2
    rows = [r for out in rest for r in fix_rows(Path(out))]
    if cv:
        rows = cross_validated(rows)
    print(render(rows, "github" if md else "simple"))
    if cv:
        print("(each applied split judged by the split error of the other rounds: its "
              "predicted interval is the traced window's, widened by that band)")
    if dest is not None:
        write_json_atomic(dest, [r.to_json() for r in rows])
    if split_out is not None:
        diffs = split_diffs(rows)
        if not diffs:
            raise CliError("fixes: no applied split with a predicted and a measured gain "
                           "to measure the split's error from")
        cmd = ("python -m reports.lab.fixes " + " ".join(rest)
               + f" --split-error {Path(split_out).name} --machine '...'")
        err = band_of(diffs, machine, cmd)
        write_json_atomic(Path(split_out), err.to_dict())
        print(f"split error: measured - predicted gain {err.points_lo:+.1f} to "
              f"{err.points_hi:+.1f} points (median {err.points_median:+.1f}, {err.cases} "
              f"splits)")
    return 0


if __name__ == "__main__":
    from reports.cli import run_guarded
    sys.exit(run_guarded("fixes", main))
