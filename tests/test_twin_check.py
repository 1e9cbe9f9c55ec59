"""The report's view of a twin record: a what-if row matched to the twin's server by its flags,
the twin's change beside the model's, another deployment's twin refused, a broken file one line."""
from __future__ import annotations

import json

import pytest

from reports.base.errors import CliError
from reports.model.checks.twin_check import change_of, matches, read_twin, twin_text


def whatif_row(knob: str, setting: str):
    """A what-if row as the report carries it: shown strings and the changes applied."""
    from types import SimpleNamespace
    from reports.model.settings_change import Change
    changes = tuple(Change(f.strip(), v.strip()) for f, v in zip(knob.split(" + "),
                                                                  setting.split(" + ")))
    return SimpleNamespace(knob=knob, setting=setting, changes=changes)


def record(tmp_path, rows, scenario="seed-pp8", pp=8, **extra):
    data = {"scenario": scenario, "pp": pp, "calibration": {"k": 60}, "rows": rows,
            "hold": "stream"}
    (tmp_path / "twin.json").write_text(json.dumps({"probe": "twin", "status": "ok",
                                                    "data": {**data, **extra}}))
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
    one = twin_text(rec, whatif_row("--chunked-prefill-size", "2048"))
    assert one == ("on SGLang's scheduler (twin, k = 60; bench_serving's TPOT): +0% at C=1 (model +0%), "
                   "+38% at C=8 (model +76%)")
    both = twin_text(rec, whatif_row("--chunked-prefill-size + --pp-async-batch-depth", "2048 + 0"))
    assert both == "on SGLang's scheduler (twin, k = 60; bench_serving's TPOT): +75% at C=8 (model +108%)"
    assert twin_text(rec, whatif_row("--pp-async-batch-depth", "0")) is None        # never run on the twin
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
    text = "on SGLang's scheduler (twin, k = 60; bench_serving's TPOT): +38% at C=8 (model +76%)"
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


def test_repetitions_are_set_against_the_default_of_their_own_repetition(tmp_path):
    """Interleaved runs: each setting's run is compared with the default's run of the same
    repetition; the report gives the median and the range."""
    rows = []
    for rep, (base, chunk) in enumerate([(80.0, 120.0), (100.0, 140.0), (90.0, 180.0)], 1):
        rows += [dict(row("default", BASE, 8, base, 82.8), rep=rep),
                 dict(row("recommended", CHUNK, 8, chunk, 146.0), rep=rep)]
    rec = read_twin(record(tmp_path, rows))
    (ch,) = rec.changes[change_of("--chunked-prefill-size", "2048")]
    assert (ch.runs, ch.twin, ch.lo, ch.hi) == (3, pytest.approx(0.5), pytest.approx(0.4),
                                                pytest.approx(1.0))
    assert twin_text(rec, whatif_row("--chunked-prefill-size", "2048")) == (
        "on SGLang's scheduler (twin, k = 60; bench_serving's TPOT): +50% at C=8 (median of 3 runs, +40% to +100%; "
        "model +76%)")
    rows.append(dict(row("recommended", CHUNK, 8, 500.0, 146.0), rep=4))   # no default of rep 4
    (ch,) = read_twin(record(tmp_path, rows)).changes[change_of("--chunked-prefill-size", "2048")]
    assert ch.runs == 3


def test_the_twin_verdict_supports_withdraws_or_corrects_the_models_figure(tmp_path):
    from reports.model.checks.twin_check import (AGREES, DIFFERS, LOSES, TwinChange, agrees,
                                                   verdict)
    assert agrees(TwinChange(8, 0.85, 0.76)) and agrees(TwinChange(32, 0.10, 0.07))
    assert not agrees(TwinChange(8, 0.51, 1.09)) and not agrees(TwinChange(8, -0.10, 0.10))
    rec = read_twin(record(tmp_path, [
        row("default", BASE, 8, 80.0, 82.8), row("recommended", CHUNK, 8, 150.0, 146.0),
        row("pair", PAIR, 8, 120.0, 172.0), row("default", BASE, 32, 260.0, 260.0),
        row("recommended", CHUNK, 32, 250.0, 270.0)]))
    assert verdict(rec, whatif_row("--chunked-prefill-size + --pp-async-batch-depth", "2048 + 0")) == DIFFERS
    assert verdict(rec, whatif_row("--chunked-prefill-size", "2048")) == LOSES       # -4% at C=32
    assert verdict(rec, whatif_row("--pp-async-batch-depth", "0")) is None
    rows = [row("default", BASE, 8, 80.0, 82.8), row("recommended", CHUNK, 8, 150.0, 146.0)]
    assert verdict(read_twin(record(tmp_path, rows)), whatif_row("--chunked-prefill-size", "2048")) == AGREES


def _report(tmp_path, rows):
    from reports.cli import main
    res = record(tmp_path, rows)
    assert main(["report", "--results", str(res), "--out", str(res / "o"), "--no-cache"]) == 0
    return json.loads((res / "o" / "report.json").read_text()), (res / "o" / "report.md").read_text()


def test_a_pair_no_better_than_the_single_setting_on_the_twin_is_not_recommended(tmp_path):
    """The model's best pair gains more than the single setting, the twin gives it less: the
    answer names the pair as not recommended, with the twin's figure."""
    rep, md = _report(tmp_path, [
        row("default", BASE, 8, 80.0, 82.8), row("recommended", CHUNK, 8, 148.0, 146.0),
        row("pair", PAIR, 8, 120.0, 172.0)])
    assert rep["recommendation"]["twin_verdict"] == "agrees"
    assert rep["best_pair"]["twin_verdict"] == "no better than one setting"
    answer = " ".join(rep["answer"])
    assert "The model's best two settings together" in answer and "are not recommended" in answer
    assert "Best two settings together" not in answer
    assert "gained no more than --chunked-prefill-size 2048 alone: not recommended" in md


def test_a_recommendation_that_loses_on_the_twin_is_withdrawn(tmp_path):
    rep, md = _report(tmp_path, [
        row("default", BASE, 8, 80.0, 82.8), row("recommended", CHUNK, 8, 70.0, 146.0)])
    assert rep["recommendation"]["twin_verdict"] == "loses"
    answer = " ".join(rep["answer"])
    assert "The model's best single server setting" in answer
    assert "it lost on SGLang's scheduler: not recommended" in answer
    assert "The model's pick, not recommended: --chunked-prefill-size 2048" in md


def test_a_twin_recorded_with_the_earlier_hold_is_flagged(tmp_path):
    """A user's twin.json from before the hold ordered the PP messages on SGLang's schedule
    stream is used, with a warning; the first stream-order records say so only in `emulated`."""
    from reports.cli import main
    rows = [row("default", BASE, 8, 80.0, 82.8), row("recommended", CHUNK, 8, 150.0, 146.0)]
    old = {"hold": None, "mode": "async", "emulated": "device time as a GPU's: the CPU runs "
           "ahead of the forward"}
    assert not read_twin(record(tmp_path, rows, **old)).stream_order
    assert read_twin(record(tmp_path, rows, **dict(old, emulated="the PP messages ordered on "
                                                   "SGLang's schedule stream"))).stream_order
    res = record(tmp_path, rows, **old)
    assert main(["report", "--results", str(res), "--out", str(res / "o"), "--no-cache"]) == 0
    rep = json.loads((res / "o" / "report.json").read_text())
    assert any("earlier ppscope twin" in w for w in rep["warnings"])
    assert rep["recommendation"]["twin"]                 # still used


def test_the_steady_decode_is_the_twins_figure_where_every_run_has_one(tmp_path):
    def steady(r, tpot):
        return {**r, "twin_steady_tpot_ms": tpot}
    rows = [steady(row("default", BASE, 32, 265.8, 265.7), 124.4),
            steady(row("pair", PAIR, 32, 364.9, 426.9), 90.5),
            steady(row("default", BASE, 8, 81.3, 82.8), 100.0),
            row("pair", PAIR, 8, 154.9, 173.0)]          # no steady window in its log
    rec = read_twin(record(tmp_path, rows))
    at = {c.concurrency: c for c in rec.changes[change_of(
        "--chunked-prefill-size + --pp-async-batch-depth", "2048 + 0")]}
    assert at[32].basis == "steady" and at[32].twin == pytest.approx(124.4 / 90.5 - 1)
    assert at[8].basis == "bench" and at[8].twin == pytest.approx(154.9 / 81.3 - 1)
    text = twin_text(rec, whatif_row("--chunked-prefill-size + --pp-async-batch-depth", "2048 + 0"))
    assert "steady decode where its log had one" in text and "+37% at C=32" in text
