"""report.json's type (reports/model/report_type.py): the file round-trips through `Report`, a
file from another version reads leniently, and a renamed field is an error in every reader."""
from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace

import pytest

from reports.base.schema import SchemaError
from reports.cli import main
from reports.model.report_type import Level, NotDiagnosed, Report
from reports.model.scenario.inputs import build_inputs, load_scenario
from reports.render.render_md import render_md
from reports.report_build import build_report


@pytest.fixture(scope="module")
def seed_report() -> Report:
    return build_report(build_inputs(load_scenario("seed-pp8"), {}), {})


def test_the_seed_report_round_trips(seed_report):
    d = seed_report.to_json()
    back = Report.from_json(json.loads(json.dumps(d)), strict=True)
    assert json.dumps(back.to_json(), indent=1) == json.dumps(d, indent=1)
    # the parts a scenario without evidence has no key for stay out of the file
    assert not {"server", "diagnosis", "scenario_differs", "topology", "watch",
                "baseline_comparison", "measured_timeline", "dispatch_validation"} & set(d)


def test_another_versions_file_reads_leniently(seed_report):
    d = json.loads(json.dumps(seed_report.to_json()))
    d["added_later"] = {"x": 1}                     # a key this version does not know
    d["concurrency"][0]["added_later"] = 2
    for k in ("stage_cost", "best_pair", "arrival"):   # parts an older file lacks
        d.pop(k)
    rep = Report.from_json(d)
    assert rep.arrival is None and rep.best_pair is None and rep.stage_cost == ()
    assert rep.concurrency == seed_report.concurrency
    with pytest.raises(SchemaError, match="added_later: unknown field"):
        Report.from_json(d, strict=True)
    d["schema"] = "ppscope-report/0"
    with pytest.raises(SchemaError, match="report.json.schema"):
        Report.from_json(d)


def test_a_renamed_key_fails_in_the_reader_and_the_renderer(seed_report):
    d = json.loads(json.dumps(seed_report.to_json()))
    d["concurrency"][0]["predicted_tok_per_s"] = d["concurrency"][0].pop("predicted")
    with pytest.raises(SchemaError, match=r"concurrency\[0\]\.predicted: missing"):
        Report.from_json(d)

    @dataclass(frozen=True)
    class Renamed:   # `Level` with `predicted` renamed: a renderer's read of it must fail
        concurrency: int
        ideal_tok_per_s: float
        predicted_tok_per_s: float
        observed: float | None
        predicted_tpot_ms: float
        busy_frac: tuple[float, ...]
        slot_sizes: tuple[int, ...]
    assert len(fields(Renamed)) == len(fields(Level))
    levels = tuple(Renamed(*(getattr(c, f.name) for f in fields(c)))
                   for c in seed_report.concurrency)
    with pytest.raises(AttributeError, match="predicted"):
        render_md(replace(seed_report, concurrency=levels))


def test_a_baseline_that_is_not_a_report_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "report.json"
    bad.write_text(json.dumps({"schema": "ppscope-report/1", "scenario": "x",
                               "diagnosis": {"status": "ok"}}))
    assert main(["report", "--results", str(tmp_path), "--baseline", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--baseline" in err[0]
    assert "report.json.diagnosis.concurrency: missing" in err[0]   # the part its tag names


def test_a_not_diagnosed_part_keeps_its_shape():
    rep = Report("ppscope-report/1", "x", diagnosis=NotDiagnosed("not diagnosed", "no traces"))
    d = rep.to_json()
    assert "diagnosis" not in d     # written only beside `server`, as the file has always had it
    assert Report.from_json({**d, "server": None, "diagnosis": {
        "status": "not diagnosed", "reason": "no traces"}}).diagnosis == rep.diagnosis


def test_the_diagnosis_part_mirrors_diagnose_s_diagnosis():
    import typing

    from reports.model.observed.diagnose import Diagnosis, DiagnosisFigures
    from reports.model.report_type import ServerDiagnosis
    # one declaration of the figures, both types built on it
    assert issubclass(ServerDiagnosis, DiagnosisFigures) and issubclass(Diagnosis, DiagnosisFigures)
    own = [f.name for f in fields(ServerDiagnosis)]
    theirs = [f.name for f in fields(Diagnosis)]
    assert own[own.index("time_split") + 1:] == theirs[1:] and own[1] == theirs[0]
    h_own, h_theirs = typing.get_type_hints(ServerDiagnosis), typing.get_type_hints(Diagnosis)
    assert all(h_own[n] == h_theirs[n] for n in theirs)
