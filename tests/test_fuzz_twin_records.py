"""Twin records taken as they come: a `results/twin.json` whose figures no twin run gives
(k outside the twin's dilations, a TPOT or tok/s that is NaN, infinite, zero, negative or huge,
a change between two settings beyond 100x) is a one-line error naming the file and the field,
never a "k = -40", "+nan%" or 311-digit percentage in the report; a record of a run that stopped
early is used for the runs it finished and says so; a failed one is not used, and the report
says so. `ppscope twin` refuses a concurrency or a setting given twice before anything starts,
and its errors name a partial record only where this run wrote one. Every record is made here.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from reports.base.errors import CliError
from reports.model.checks.twin_check import apply_twin, key_of, read_twin, twin_text
from reports.model.settings_change import Change

BASE = ["--pp-async-batch-depth", "8", "--chunked-prefill-size", "8192"]
CHUNK = ["--pp-async-batch-depth", "8", "--chunked-prefill-size", "2048"]


def row(setting, flags, C, twin, model, **extra):
    return {"setting": setting, "flags": flags, "concurrency": C,
            "twin_decode_tok_per_s": twin, "model_tok_per_s": model, **extra}


def good_rows():
    return [row("default", BASE, 8, 80.0, 82.8, twin_tpot_ms=100.0),
            row("recommended", CHUNK, 8, 110.4, 146.0, twin_tpot_ms=72.5)]


def write(tmp_path, rows=None, k=60, status="ok", **extra):
    data = {"scenario": "seed-pp8", "pp": 8, "calibration": {"k": k},
            "rows": good_rows() if rows is None else rows, "hold": "stream", **extra}
    # allow_nan: the file as a careless tool would write it (NaN and Infinity tokens)
    (tmp_path / "twin.json").write_text(json.dumps(
        {"probe": "twin", "status": status, "data": data}, allow_nan=True))
    return tmp_path


def refused(tmp_path, *words) -> str:
    with pytest.raises(CliError) as e:
        read_twin(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and "twin.json" in msg, msg
    for w in words:
        assert w in msg, (w, msg)
    return msg


@pytest.fixture(scope="module")
def seed_report():
    """The built-in scenario's report, the twin not yet applied (one model run per module)."""
    from pathlib import Path
    from reports.model.scenario.inputs import build_inputs, load_records, load_scenario
    from reports.report_run import model_run
    records, warnings = load_records(Path("/nonexistent"))
    inp = build_inputs(load_scenario("seed-pp8"), records, warnings)
    return model_run(inp, records, None, use_cache=False).report


# ------------------------------------------------------------------ k

@pytest.mark.parametrize("k", [-40, float("nan"), 1e308, float("inf"), 0, 0.5, 1001, "60",
                               True, None])
def test_a_dilation_the_twin_never_uses_is_refused(tmp_path, k):
    msg = refused(write(tmp_path, k=k), "calibration.k", "1 to 1000")
    assert "nan" not in msg.split("=")[0]


def test_the_twins_own_dilations_are_read(tmp_path):
    for k in (1, 52, 60.0, 1000):
        assert read_twin(write(tmp_path, k=k)).k == k


# ------------------------------------------------------------------ TPOT and tok/s

@pytest.mark.parametrize("key", ["twin_decode_tok_per_s", "model_tok_per_s", "twin_tpot_ms",
                                 "twin_steady_tpot_ms", "twin_output_tok_per_s"])
@pytest.mark.parametrize("value", [-12.5, 0, float("nan"), float("inf"), -float("inf"), 1e308,
                                   "80", False])
def test_a_figure_no_run_gives_is_refused(tmp_path, key, value):
    rows = good_rows()
    rows[1][key] = value
    refused(write(tmp_path, rows), f"rows[1].{key}", "positive number")


def test_a_figure_left_out_as_none_is_not_measured(tmp_path):
    rows = good_rows()
    rows[0]["twin_steady_tpot_ms"] = rows[1]["twin_steady_tpot_ms"] = None
    rows[1]["run_model_tpot_ms"] = None
    rec = read_twin(write(tmp_path, rows))
    w = SimpleNamespace(knob="--chunked-prefill-size", setting="2048",
                        changes=(Change("--chunked-prefill-size", 2048),))
    assert twin_text(rec, w).endswith("+38% at C=8 (model +76%)")
    # a what-if of a report written before what-ifs kept their changes: its shown strings
    old = SimpleNamespace(knob="--chunked-prefill-size", setting="2048", changes=())
    assert key_of(old) == key_of(w) and twin_text(rec, old) == twin_text(rec, w)


@pytest.mark.parametrize("twin, model, who", [(1e-6, 82.8, "the twin's"),
                                               (8e8, 146.0, "the twin's"),
                                               (110.4, 1e-3, "the model's")])
def test_a_change_beyond_100x_is_refused_before_it_is_printed(tmp_path, twin, model, who):
    rows = good_rows()
    rows[1].update(twin_decode_tok_per_s=twin, model_tok_per_s=model)
    msg = refused(write(tmp_path, rows), who, "--chunked-prefill-size 2048", "C=8")
    assert len(msg) < 300


@pytest.mark.parametrize("key, value", [("concurrency", 0), ("concurrency", 8.5),
                                        ("concurrency", 10 ** 9), ("rep", -1),
                                        ("setting", None)])
def test_a_run_of_no_concurrency_or_setting_is_refused(tmp_path, key, value):
    rows = good_rows()
    rows[1][key] = value
    refused(write(tmp_path, rows), f"rows[1].{key}")


@pytest.mark.parametrize("pp", [0, -8, 8.5, "8", 10 ** 6])
def test_a_pipeline_of_no_size_is_refused(tmp_path, pp):
    write(tmp_path)
    doc = json.loads((tmp_path / "twin.json").read_text())
    doc["data"]["pp"] = pp
    (tmp_path / "twin.json").write_text(json.dumps(doc))
    refused(tmp_path, "pp")


def test_a_record_of_another_probe_is_refused(tmp_path):
    write(tmp_path)
    doc = json.loads((tmp_path / "twin.json").read_text())
    (tmp_path / "twin.json").write_text(json.dumps(dict(doc, probe="topology")))
    refused(tmp_path, "'topology'", "not a twin record")


def test_the_report_refuses_a_negative_k_in_one_line(tmp_path, capsys):
    from reports.cli import main
    write(tmp_path, k=-40)
    rc = main(["report", "--results", str(tmp_path), "--out", str(tmp_path / "o"),
               "--no-cache"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1 and "calibration.k = -40" in err[0], err
    assert not (tmp_path / "o" / "report.json").exists()


# ------------------------------------------------------------------ partial and failed

@pytest.mark.parametrize("status, complete", [("partial", False), ("ok", False)])
def test_a_partial_record_is_used_and_says_so(tmp_path, seed_report, status, complete):
    rec = read_twin(write(tmp_path, status=status, complete=complete))
    assert getattr(rec, "state", None) == "partial"
    rep = apply_twin(seed_report, rec)
    assert rep.recommendation.twin.startswith(
        "on SGLang's scheduler (twin, k = 60, a run stopped early;")
    assert "+38% at C=8 (model +76%)" in rep.recommendation.twin
    assert any("twin.json is the record of a twin run that stopped early" in w
               for w in rep.warnings)


@pytest.mark.parametrize("status", ["error", "failed", "waived", None, 7])
def test_a_failed_record_is_not_used_and_says_so(tmp_path, seed_report, status):
    write(tmp_path, k=-40, status=status,
          rows=[row("default", BASE, 8, float("nan"), -1.0)])   # not read: not used
    doc = json.loads((tmp_path / "twin.json").read_text())
    (tmp_path / "twin.json").write_text(json.dumps(dict(doc, reason="SGLang did not start")))
    rec = read_twin(tmp_path)
    assert getattr(rec, "state", None) == "failed"
    rep = apply_twin(seed_report, rec)
    assert rep.recommendation.twin is None and rep.recommendation.twin_verdict is None
    assert all(w.twin is None for w in rep.what_ifs)
    (warn,) = [w for w in rep.warnings if "failed twin run" in w]
    assert f"status {status}" in warn and "SGLang did not start" in warn and "not used" in warn


def test_a_complete_record_says_nothing_more(tmp_path, seed_report):
    rep = apply_twin(seed_report, read_twin(write(tmp_path, complete=True)))
    assert "stopped early" not in rep.recommendation.twin
    assert not any("twin" in w for w in rep.warnings)


# ------------------------------------------------------------------ ppscope twin

@pytest.fixture
def no_lab(monkeypatch):
    """Anything that would start installing or running SGLang fails the test."""
    import microbench.sglang_lab.twin.run as twin
    import microbench.sglang_lab.venv as venv

    def never(*a, **k):
        raise AssertionError("the twin started")
    monkeypatch.setattr(twin, "run_twin", never)
    monkeypatch.setattr(venv, "ensure_venv", never)


@pytest.mark.parametrize("argv, word", [
    (["--concurrency", "8,8"], "--concurrency: 8 given twice"),
    (["--concurrency", "1,8,32,8,1"], "--concurrency: 1, 8 given twice"),
    (["--settings", "default,default"], "--settings: default given twice"),
    (["--settings", "pair,default,pair"], "--settings: pair given twice")])
def test_a_point_given_twice_is_refused_before_anything_starts(tmp_path, capsys, no_lab,
                                                               argv, word):
    from reports.cli import main
    rc = main(["twin", "--results", str(tmp_path), *argv])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1 and word in err[0], err
    assert "partial" not in err[0]
    assert list(tmp_path.iterdir()) == []


def _twin_failing(tmp_path, capsys, monkeypatch, finished: int) -> str:
    """`ppscope twin` whose run fails after `finished` runs (LabError)."""
    import microbench.sglang_lab.twin.run as twin
    from microbench.sglang_lab.venv import LabError
    from reports.cli import main

    def run_twin(inp, settings, conc, out, lab_dir, output_len, max_k, k, keep=None, reps=1):
        for i in range(finished):
            keep({"scenario": inp.name, "pp": inp.pp, "rows": [], "complete": False})
        raise LabError("pip install sglang failed (log: /x/pip.log)")
    monkeypatch.setattr(twin, "run_twin", run_twin)
    rc = main(["twin", "--results", str(tmp_path), "--settings", "default",
               "--concurrency", "8", "--lab-dir", str(tmp_path / "lab")])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1, err
    return err[0]


def test_a_failure_before_any_run_names_no_partial_record(tmp_path, capsys, monkeypatch):
    err = _twin_failing(tmp_path, capsys, monkeypatch, 0)
    assert "pip install sglang failed" in err and "no run finished" in err
    assert "partial" not in err and not (tmp_path / "twin.partial.json").exists()


def test_a_failure_after_a_run_names_the_partial_record_it_wrote(tmp_path, capsys,
                                                                monkeypatch):
    err = _twin_failing(tmp_path, capsys, monkeypatch, 1)
    partial = tmp_path / "twin.partial.json"
    assert f"runs finished so far: {partial}" in err and partial.is_file()
    assert json.loads(partial.read_text())["status"] == "partial"


# ------------------------------------------------------------------ the record's shape

def test_every_twin_record_shipped_or_kept_reads_as_its_payload():
    """The shipped record and the test records, old and new (the k = 10 record from a 16-core
    host among them), read as `TwinData` (fields added since have defaults that say so)."""
    from pathlib import Path
    from reports.base.payloads.twin import TwinData
    from reports.base.schema import from_json
    root = Path(__file__).resolve().parents[1]
    files = ([root / "configs" / "records" / "seed-pp8.twin.json"]
             + sorted((root / "tests" / "fixtures" / "twin").rglob("*.twin.json")))
    assert len(files) >= 10
    for f in files:
        d = from_json(TwinData, json.loads(f.read_text())["data"])
        assert d.rows and d.calibration.k >= 1 and d.costs.ranks, f


@pytest.mark.parametrize("key, value, field", [
    ("waves", ["7"], "rows[1].waves[0]"), ("flags", "--chunked-prefill-size 2048", "rows[1].flags"),
    ("steady_cycles", -3, "rows[1].steady_cycles"), ("completed", 8.5, "rows[1].completed"),
    ("mystery", 1, "rows[1].mystery")])
def test_a_row_of_another_shape_is_one_line(tmp_path, key, value, field):
    rows = good_rows()
    rows[1][key] = value
    refused(write(tmp_path, rows), field)


@pytest.mark.parametrize("costs, field", [
    ({"mode": "gpu"}, "costs.mode"), ({"ranks": "eight"}, "costs.ranks"),
    ({"hop_us": [1.0, -2.0]}, "costs.hop_us[1]")])
def test_a_cost_table_of_another_shape_is_one_line_and_exit_2(tmp_path, capsys, costs, field):
    from reports.cli import main
    table = {"k": 60.0, "mode": "async", "ranks": [], "hop_us": [0.0], "layer_split": [8],
             "sources": {}}
    write(tmp_path, costs={**table, **costs})
    refused(tmp_path, field)
    rc = main(["report", "--results", str(tmp_path), "--out", str(tmp_path / "o"), "--no-cache"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1 and field in err[0], err
    assert not (tmp_path / "o" / "report.json").exists()
