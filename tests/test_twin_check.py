"""The report's view of a twin record: a what-if row matched to the twin's server by its flags,
the twin's change beside the model's, another deployment's twin refused, a broken file one line."""
from __future__ import annotations

import json

import pytest

from reports.base.errors import CliError
from reports.model.scenario.twin_check import change_of, matches, read_twin, twin_text


def record(tmp_path, rows, scenario="seed-pp8", pp=8):
    (tmp_path / "twin.json").write_text(json.dumps({"probe": "twin", "status": "ok", "data": {
        "scenario": scenario, "pp": pp, "calibration": {"k": 60}, "rows": rows}}))
    return tmp_path


def row(setting, flags, C, twin, model):
    return {"setting": setting, "flags": flags, "concurrency": C,
            "twin_decode_tok_per_s": twin, "model_tok_per_s": model}


BASE = ["--pp-async-batch-depth", "8", "--chunked-prefill-size", "8192"]
CHUNK = ["--pp-async-batch-depth", "8", "--chunked-prefill-size", "2048"]
PAIR = ["--chunked-prefill-size", "2048", "--pp-async-batch-depth", "0"]


def test_a_setting_is_matched_by_the_flags_it_changes(tmp_path):
    rec = read_twin(record(tmp_path, [
        row("default", BASE, 8, 80.0, 82.8), row("recommended", CHUNK, 8, 110.4, 146.0),
        row("pair", PAIR, 8, 140.0, 172.0), row("default", BASE, 1, 30.0, 30.9),
        row("recommended", CHUNK, 1, 30.0, 30.9)]))
    assert rec.k == 60
    one = twin_text(rec, "--chunked-prefill-size", "2048")
    assert one == ("on SGLang's scheduler (twin, k = 60): +0% at C=1 (model +0%), "
                   "+38% at C=8 (model +76%)")
    both = twin_text(rec, "--chunked-prefill-size + --pp-async-batch-depth", "2048 + 0")
    assert both == "on SGLang's scheduler (twin, k = 60): +75% at C=8 (model +108%)"
    assert twin_text(rec, "--pp-async-batch-depth", "0") is None        # never run on the twin
    assert change_of("--a + --b", "1 + 2") == frozenset({("--a", "1"), ("--b", "2")})


def test_another_deployments_twin_is_not_used(tmp_path):
    rec = read_twin(record(tmp_path, [row("default", BASE, 8, 80.0, 82.8)], "lab-pp2", 2))
    assert "lab-pp2 (PP2)" in matches(rec, "seed-pp8", 8)
    assert matches(rec, "lab-pp2", 2) is None


def test_no_record_is_none_and_a_broken_one_is_one_line(tmp_path):
    assert read_twin(tmp_path) is None
    (tmp_path / "twin.json").write_text("{not json")
    with pytest.raises(CliError, match="not a twin record"):
        read_twin(tmp_path)
    (tmp_path / "twin.json").write_text(json.dumps({"data": {"rows": [
        row("default", BASE, 8, 0.0, 82.8), row("recommended", CHUNK, 8, 1.0, 1.0)],
        "scenario": "s", "pp": 8, "calibration": {"k": 1}}}))
    with pytest.raises(CliError, match="not a twin record"):
        read_twin(tmp_path)


def test_the_report_says_what_the_twin_measured_beside_the_setting(tmp_path, capsys):
    from reports.cli import main
    res = record(tmp_path, [row("default", BASE, 8, 80.0, 82.8),
                            row("recommended", CHUNK, 8, 110.4, 146.0)])
    assert main(["report", "--results", str(res), "--out", str(res / "o"), "--no-cache"]) == 0
    out = capsys.readouterr().out
    rep = json.loads((res / "o" / "report.json").read_text())
    rec = rep["recommendation"]
    assert (rec["knob"], rec["setting"]) == ("--chunked-prefill-size", "2048")
    text = "on SGLang's scheduler (twin, k = 60): +38% at C=8 (model +76%)"
    assert rec["twin"] == text
    assert text in (res / "o" / "report.md").read_text()
    assert "twin, k = 60" in out                  # the terminal's answer says it too
    others = [w for w in rep["what_ifs"] if w["knob"] != "--chunked-prefill-size"]
    assert all(w["twin"] is None for w in others)


def test_a_twin_of_another_deployment_is_a_warning(tmp_path, capsys):
    from reports.cli import main
    res = record(tmp_path, [row("default", BASE, 8, 80.0, 82.8),
                            row("recommended", CHUNK, 8, 110.4, 146.0)], "lab-pp2", 2)
    assert main(["report", "--results", str(res), "--out", str(res / "o"), "--no-cache"]) == 0
    err = capsys.readouterr().err
    assert "lab-pp2 (PP2)" in err and "not used" in err
    rep = json.loads((res / "o" / "report.json").read_text())
    assert rep["recommendation"]["twin"] is None
