"""The lab's calibration table (reports/lab/calibration.py): what each interval should hold in
the lab's rounds (0 for a control pair, the measured slowdown for a fault's growth), counted
against the nominal level. Case folders made here: case.json, bench.jsonl, report.json as the
lab writes them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from reports.lab import calibration


def _case(out: Path, name: str, toks: list[float], baseline: str = "", expect: str = "",
          report: dict | None = None) -> None:
    d = out / name
    d.mkdir(parents=True)
    (d / "case.json").write_text(json.dumps({"case": {
        "name": name, "concurrency": 8, "baseline": baseline, "expect": expect,
        "fault": "slow-stage=1:3" if expect else None}}))
    (d / "bench.jsonl").write_text("".join(json.dumps(
        {"output_throughput": t, "max_concurrency": 8, "completed": 80}) + "\n" for t in toks))
    (d / "report.json").write_text(json.dumps(report or {}))


def _cmp(significant, cause=None, growth_ci=None, step=40.0):
    rows = [{"cause": cause, "growth_ms": sum(growth_ci) / 2, "growth_ci": growth_ci}] \
        if cause else []
    return {"baseline_comparison": {"status": "ok", "rows": rows, "baseline_step_ms": step,
                                    "significant": significant, "kind": "observed"},
            "diagnosis": {"status": "ok", "named": [cause] if cause else [],
                          "rows": [{"cause": cause, "size_pct": 30.0}] if cause else []}}


def test_controls_and_faults_are_counted_against_what_is_known(tmp_path):
    out = tmp_path / "lab"
    _case(out, "clean-c8.1", [200.0, 204.0])
    _case(out, "control-c8.1", [199.0, 205.0], baseline="clean-c8.1", report=_cmp(False))
    # slowdown 202/150 - 1 = 34.7%; the growth's interval 12-16 ms of a 40 ms step: 30-40%
    _case(out, "slow-x3.1", [149.0, 151.0], baseline="clean-c8.1", expect="slow_stage",
          report=_cmp(True, "slow_stage", [12.0, 16.0]))
    # another cause grew most: a miss, whatever its interval
    _case(out, "host-r0-20ms.1", [150.0, 151.0], baseline="clean-c8.1", expect="host",
          report=_cmp(True, "slow_stage", [12.0, 16.0]))
    # 1% slower against a 2% clean spread: a small fault, not named: a right answer
    _case(out, "host-r0-4ms.1", [200.0, 200.0], baseline="clean-c8.1", expect="host",
          report=_cmp(False))
    rows = {r.case: r for r in calibration.outcomes(out)}
    assert set(rows) == {"control-c8.1", "slow-x3.1", "host-r0-20ms.1", "host-r0-4ms.1"}
    assert rows["control-c8.1"].kind == "control" and rows["control-c8.1"].holds is True
    assert rows["slow-x3.1"].kind == "fault" and rows["slow-x3.1"].holds is True
    assert rows["host-r0-20ms.1"].holds is False
    assert rows["host-r0-4ms.1"].kind == "fault (small)"
    t = calibration.tally(list(rows.values()))
    assert (t.controls, t.controls_no_change, t.controls_held) == (1, 1, 1)
    assert (t.faults, t.faults_named, t.faults_held) == (2, 1, 1)
    assert (t.small, t.small_noise_or_right) == (1, 1)
    text = calibration.render(list(rows.values()))
    assert "coverage: nominal 90%, actual 67% (2 of 3 intervals)" in text


def test_a_control_whose_interval_misses_zero_is_counted_so(tmp_path):
    out = tmp_path / "lab"
    _case(out, "clean-c8.1", [200.0, 201.0])
    _case(out, "control-c8.1", [150.0, 151.0], baseline="clean-c8.1", report=_cmp(True))
    (row,) = calibration.outcomes(out)
    assert row.holds is False and row.significant is True
    assert "controls: 0 of 1 said no significant change" in calibration.render([row])


def test_bad_folders_are_one_line_exit_2(tmp_path, capsys):
    assert calibration.main([]) == 2
    assert calibration.main([str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "not a lab results folder" in err


def test_faults_against_the_control_case(tmp_path):
    out = tmp_path / "lab"
    _case(out, "clean-c8.1", [300.0, 260.0])                    # drifting down to the control
    _case(out, "control-c8.1", [250.0, 250.0], baseline="clean-c8.1", report=_cmp(False))
    _case(out, "host-r0-4ms.1", [200.0, 200.0], baseline="clean-c8.1", expect="host",
          report=_cmp(True, "host", [9.0, 11.0]))               # growth 22.5-27.5% of 40 ms
    by_clean = {r.case: r for r in calibration.outcomes(out)}["host-r0-4ms.1"]
    by_ctl = {r.case: r for r in calibration.outcomes(out, against_control=True)}["host-r0-4ms.1"]
    assert by_clean.slowdown_pct == pytest.approx(40.0) and by_clean.holds is False
    assert by_ctl.slowdown_pct == pytest.approx(25.0) and by_ctl.holds is True


def _round(out: Path, k: int, slow_toks: float, growth_ci) -> None:
    _case(out, f"clean-c8.{k}", [200.0, 202.0])
    _case(out, f"slow-x3.{k}", [slow_toks, slow_toks + 1], baseline=f"clean-c8.{k}",
          expect="slow_stage", report=_cmp(True, "slow_stage", growth_ci))


def test_model_error_record_and_leave_one_round_out(tmp_path, capsys):
    out = tmp_path / "lab"
    # measured slowdowns 201/100.5 - 1 = 100%, 201/150.5 - 1 = 34%, 201/120.5 - 1 = 67% against
    # growths of 50% of a 40 ms step (20 ms): ratios 2.0, 0.67 and 1.33
    for k, toks in ((1, 100.0), (2, 150.0), (3, 120.0)):
        _round(out, k, toks, [19.0, 21.0])
    rows = calibration.outcomes(out)
    assert sum(bool(r.holds) for r in rows) == 0          # the windows' noise alone: 48-53%
    err = calibration.model_error_of(rows, "a test machine", "cmd")
    host = {c.cause: c for c in err.causes}
    assert host["slow_stage"].cases == 3 and host["pooled"].cases == 3
    assert host["slow_stage"].ratio_lo < 1.33 < host["slow_stage"].ratio_hi
    # judged by the band of the same rounds, the middle round is held
    judged = {r.case: r for r in calibration.judged(rows, err)}
    assert judged["slow-x3.3"].holds is True
    # left out, a round's extreme ratio falls outside the others' band
    cv = {r.case: r for r in calibration.cross_validated(rows)}
    assert cv["slow-x3.1"].holds is False and cv["slow-x3.3"].holds is True
    rec = tmp_path / "m.json"
    assert calibration.main([str(out), "--model-error", str(rec), "--machine", "here"]) == 0
    assert json.loads(rec.read_text())["measured_on"] == "here"
    assert str(tmp_path) not in rec.read_text()
    assert calibration.main([str(out), "--apply", str(rec)]) == 0
    assert "coverage: nominal 90%" in capsys.readouterr().out


def test_model_error_needs_a_machine_and_faults(tmp_path):
    out = tmp_path / "lab"
    _case(out, "clean-c8.1", [200.0, 202.0])
    with pytest.raises(calibration.CliError):
        calibration.main([str(out), "--model-error", str(tmp_path / "m.json")])
    with pytest.raises(calibration.CliError):
        calibration.main([str(out), "--model-error", str(tmp_path / "m.json"), "--machine", "x"])
    assert not (tmp_path / "m.json").exists()
