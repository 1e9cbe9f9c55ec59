"""The lab's case.json as a payload (reports/base/payloads/lab_case.py): the plan's case and the
payload keep one set of fields, every case.json the lab recorded (old and new) reads, the writer
refuses a shape its readers would not read, and a case.json of another shape is one line, exit 2
(`ppscope sglang-lab --analyse-only`). Every case folder is made here."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from microbench.sglang_lab.cases import Case
from microbench.sglang_lab.lab import lab_case
from reports.base.errors import CliError
from reports.base.payloads.lab_case import CasePlan, LabCase
from reports.base.schema import SchemaError
from reports.lab.summary import read_case

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "tests" / "fixtures" / "sglang_lab"


def test_every_field_of_the_plans_case_is_the_payloads_with_its_default():
    plan = {f.name: f for f in dataclasses.fields(CasePlan)}
    for f in dataclasses.fields(Case):
        assert f.name in plan, f"cases.Case.{f.name}: add it to CasePlan"
        if f.default is not dataclasses.MISSING and f.name != "baseline":
            assert plan[f.name].default == f.default, f.name


def test_every_recorded_case_reads_as_its_payload():
    dirs = sorted(p.parent for p in LAB.rglob("case.json"))
    assert len(dirs) >= 50
    for d in dirs:
        lc = read_case(d)
        raw = json.loads((d / "case.json").read_text())
        assert lc.case.concurrency == raw["case"]["concurrency"] and lc.pp == raw["pp"], d
    # an earlier lab named the hog's core in the case itself
    old = [read_case(d).case for d in dirs if "hog_core" in
           json.loads((d / "case.json").read_text())["case"]]
    assert old and all(c.hog_rank is None for c in old)


def _written(**over) -> dict:
    d = {"case": dataclasses.asdict(Case("clean-c8", 8, hog_rank=1)), "pp": 2, "device": "cpu",
         "extra_args": ["--pp-async-batch-depth", "1"], "pp_max_micro_batch_size": 4,
         "env": {"SGLANG_LOG_MS": "1"}, "server": {"rank_cores": [0, 1]}, "hog_core": 1,
         "started_unix": 1.7e9, "seconds": 42.0, "input_len": 1000, "output_len": 64,
         "flush_cache": True}
    return {**d, **over}


def test_the_writer_gives_what_the_readers_read(tmp_path):
    d = tmp_path / "clean-c8"
    d.mkdir()
    (d / "case.json").write_text(json.dumps(lab_case(_written())))
    lc = read_case(d)
    assert isinstance(lc, LabCase) and lc.case == CasePlan(**{
        k: v for k, v in dataclasses.asdict(Case("clean-c8", 8, hog_rank=1)).items()})
    assert lc.extra_args == ("--pp-async-batch-depth", "1") and lc.hog_core == 1
    assert "hog_core" not in json.loads((d / "case.json").read_text())["case"]


@pytest.mark.parametrize("over, field", [({"pp": 0}, "case.json.pp"),
                                         ({"extra_args": "--x 1"}, "case.json.extra_args"),
                                         ({"mystery": 1}, "case.json.mystery")])
def test_the_writer_refuses_a_shape_no_reader_reads(over, field):
    with pytest.raises(SchemaError, match=field.replace(".", r"\.")):
        lab_case(_written(**over))


@pytest.mark.parametrize("key, value", [("reps", "3"), ("mmb", -2), ("request_rate", "fast"),
                                        ("stacks", "yes")])
def test_a_case_of_another_shape_is_one_line(tmp_path, key, value):
    d = tmp_path / "c"
    d.mkdir()
    doc = _written()
    doc["case"][key] = value
    (d / "case.json").write_text(json.dumps(doc))
    with pytest.raises(CliError) as e:
        read_case(d)
    msg = str(e.value)
    assert "\n" not in msg and str(d / "case.json") in msg and f"case.{key}" in msg, msg


def test_analyse_only_on_a_case_of_another_shape_is_exit_2(tmp_path, capsys):
    from reports.cli import main
    d = tmp_path / "lab" / "clean-c8"
    shutil.copytree(LAB / "clean-c8", d, ignore=shutil.ignore_patterns("traces-stacks"))
    doc = json.loads((d / "case.json").read_text())
    doc["case"]["reps"] = "three"
    (d / "case.json").write_text(json.dumps(doc))
    rc = main(["sglang-lab", "--analyse-only", "--out", str(tmp_path / "lab")])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1 and "case.reps" in err[0], err
    assert not (d / "analysis.json").exists()
