"""The report's fix for each fault, applied by the lab and measured (`ppscope sglang-lab
--fixes`, reports/lab/fixes.py). No server runs here: the plan is checked as data, and the table
is read from case folders made in tmp_path, whose before cases hold report.json files that
`ppscope sglang` + `ppscope report` write from the lab's recorded slow stage (rank 1 x2) and
slow hop (tests/fixtures/sglang_lab/), as the lab's analysis reads a fix case (the even split
given, so the report offers the layer split from a window without stacks). The bench runs are
written here, so every measured figure is known exactly."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from microbench.sglang_lab.cases import PARTITION_ENV, fixes_plan
from reports.cli import main, run_guarded
from reports.lab import fixes
from reports.model.compare import change_interval
from reports.model.settings_change import LAYER_PARTITION

LAB = Path(__file__).parent / "fixtures" / "sglang_lab"
DEPTH = "--pp-async-batch-depth"


# ------------------------------------------------------------------ the plan

def test_each_round_runs_the_faults_on_the_defaults_then_each_fix_on_its_own_server():
    plan = fixes_plan(pp=2, layers=4, rounds=2)
    assert [g.name for g in plan] == [
        "fx-default-1", "fx-slow1-split-1", "fx-slow0-split-1", "fx-hop-depth1-1",
        "fx-default-2", "fx-slow1-split-2", "fx-slow0-split-2", "fx-hop-depth1-2"]
    for k in (1, 2):
        by = {c.name: (g, c) for g in plan for c in g.cases}
        g, _ = by[f"fx-slow1-c8.{k}"]
        assert g.name == f"fx-default-{k}" and not g.extra_args and not g.env
        assert [(c.name, c.fault, c.expect) for c in g.cases] == [
            (f"fx-slow1-c8.{k}", "slow-stage=1:2", "slow_stage"),
            (f"fx-slow0-c8.{k}", "slow-stage=0:2", "slow_stage"),
            (f"fx-hop-c8.{k}", "hop-delay=0:4000", "hop"),
            (f"fx-host-c8.{k}", "host-delay=0:4000", "host")]
        # the before evidence: profiled (no stacks), two bench runs, the even split given
        assert all(c.profile and not c.window_stacks and c.reps == 2 and c.baseline == ""
                   and c.layer_partition == "2,2" for c in g.cases)
        after = {name: (dict(g.env), g.extra_args, c) for name, (g, c) in by.items()
                 if c.baseline}
        assert {n: (env, args, c.baseline, c.fault) for n, (env, args, c) in after.items()
                if n.endswith(f".{k}")} == {
            f"fx-slow1-split-c8.{k}": ({PARTITION_ENV: "3,1"}, (), f"fx-slow1-c8.{k}",
                                       "slow-stage=1:2"),
            f"fx-slow0-split-c8.{k}": ({PARTITION_ENV: "1,3"}, (), f"fx-slow0-c8.{k}",
                                       "slow-stage=0:2"),
            f"fx-hop-depth1-c8.{k}": ({}, (DEPTH, "1"), f"fx-hop-c8.{k}", "hop-delay=0:4000")}
        # the split servers are profiled too (each rank's forward after the split); the
        # depth server only measured
        assert {n: c.profile for n, (_, _, c) in after.items() if n.endswith(f".{k}")} == {
            f"fx-slow1-split-c8.{k}": True, f"fx-slow0-split-c8.{k}": True,
            f"fx-hop-depth1-c8.{k}": False}
        assert all(c.reps == 2 and not c.window_stacks for _, _, c in after.values())
    assert not any(c.fault.startswith("host") and c.baseline for g in plan for c in g.cases)


def test_the_split_is_derived_from_the_models_layers_and_pp():
    # 5 layers on 2 ranks: SGLang gives the last rank the extra layer (2,3)
    plan = fixes_plan(pp=2, layers=5, rounds=1)
    env = {g.name: dict(g.env).get(PARTITION_ENV) for g in plan}
    assert env == {"fx-default-1": None, "fx-slow1-split-1": "3,2", "fx-slow0-split-1": "1,4",
                   "fx-hop-depth1-1": None}
    assert plan[0].cases[0].layer_partition == "2,3"
    # three ranks: the last rank's layer goes to the one before it, rank 0's to rank 1
    plan = fixes_plan(pp=3, layers=6, rounds=1)
    assert [dict(g.env).get(PARTITION_ENV) for g in plan] == [None, "2,3,1", "1,3,2", None]
    assert plan[0].cases[0].name == "fx-slow2-c8.1"


def test_the_lab_lists_the_plan_and_says_it_in_its_help(capsys):
    assert main(["sglang-lab", "--fixes", "--rounds", "1", "--list"]) == 0
    out = capsys.readouterr().out
    names = [ln.split()[0] for ln in out.splitlines() if ln.strip()]
    assert names == ["fx-slow1-c8.1", "fx-slow0-c8.1", "fx-hop-c8.1", "fx-host-c8.1",
                     "fx-slow1-split-c8.1", "fx-slow0-split-c8.1", "fx-hop-depth1-c8.1"]
    assert f"{PARTITION_ENV}=3,1" in out and f"{DEPTH} 1" in out
    assert main(["sglang-lab", "--fixes", "--list"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 14      # two rounds by default
    with pytest.raises(SystemExit):
        main(["sglang-lab", "--help"])
    assert "--fixes" in capsys.readouterr().out


def test_the_labs_analysis_gives_ppscope_sglang_the_split_the_case_names(tmp_path, monkeypatch):
    import subprocess
    from microbench.sglang_lab import lab
    seen = []

    class Done:
        returncode, stdout, stderr = 0, "", ""

    def fake_run(cmd, **kw):
        seen.append(cmd)
        return Done()
    monkeypatch.setattr(subprocess, "run", fake_run)
    for name, part in (("with", "2,2"), ("without", "")):
        d = tmp_path / name
        (d / "traces").mkdir(parents=True)
        (d / "case.json").write_text(json.dumps({"case": {
            "name": name, "concurrency": 8, "baseline": "", "layer_partition": part}}))
        assert lab.analyse_case(d) == {"sglang_rc": 0, "report_rc": 0}
    sg = [c for c in seen if "sglang" in c]
    assert len(sg) == 2
    assert sg[0][sg[0].index("--layer-partition") + 1] == "2,2"
    assert "--layer-partition" not in sg[1]


# ------------------------------------------------------------------ the table

def _report_of(case: str, tmp: Path) -> Path:
    """report.json of a recorded lab case, as the lab's analysis writes it for a fix case."""
    src, o = LAB / case, tmp / case
    o.mkdir()
    assert main(["sglang", "--log", str(src / "server.log"), "--traces", str(src / "traces"),
                 "--bench", str(src / "bench.jsonl"), "--concurrency", "8",
                 "--layer-partition", "2,2", "--json", str(o / "sglang.json")]) == 0
    assert main(["report", "--results", str(o)]) == 0
    return o / "report.json"


@pytest.fixture(scope="module")
def reports_(tmp_path_factory) -> dict[str, Path]:
    if not (LAB / "slow-stage" / "traces").is_dir():
        pytest.skip("no lab recordings")
    tmp = tmp_path_factory.mktemp("fx-reports")
    return {c: _report_of(c, tmp) for c in ("slow-stage", "hop-delay")}


BENCH_LINE = json.loads((LAB / "slow-stage" / "bench.jsonl").read_text().splitlines()[0]) \
    if (LAB / "slow-stage" / "bench.jsonl").exists() else {}


def _case(out: Path, name: str, fault: str, tok: list[float], *, baseline: str = "",
          expect: str = "", env: dict | None = None, extra: tuple[str, ...] = (),
          report: Path | None = None, started: float = 0.0) -> Path:
    """A case folder as the lab leaves it: case.json (run_case's keys), bench.jsonl (one
    bench_serving line per run, the recorded one with its tok/s replaced), report.json."""
    d = out / name
    d.mkdir(parents=True)
    (d / "case.json").write_text(json.dumps({
        "case": {"name": name, "concurrency": 8, "fault": fault, "baseline": baseline,
                 "expect": expect, "reps": len(tok), "mmb": None, "request_rate": None},
        "pp": 2, "device": "cpu", "extra_args": list(extra), "env": env or {},
        "pp_max_micro_batch_size": 1024, "started_unix": started}))
    (d / "bench.jsonl").write_text("".join(json.dumps({**BENCH_LINE, "output_throughput": t})
                                           + "\n" for t in tok))
    if report is not None:
        shutil.copy(report, d / "report.json")
    return d


def _split(report: Path) -> dict:
    return json.loads(report.read_text())["diagnosis"]["layer_split"]


def _depth1(report: Path) -> dict:
    rows = json.loads(report.read_text())["server_whatifs"]["rows"]
    return next(r for r in rows if r["knob"] == DEPTH and r["setting"] == "1")


def _round(out: Path, k: int, rep: dict[str, Path], slow1_after: list[float],
           hop_after: list[float]) -> None:
    """One round of the plan: the four faults on the defaults at 100 and 104 tok/s, the
    fixes at the tok/s given."""
    before = [100.0, 104.0]
    s = rep["slow-stage"]
    _case(out, f"fx-slow1-c8.{k}", "slow-stage=1:2", before, expect="slow_stage", report=s,
          started=10 * k)
    _case(out, f"fx-slow0-c8.{k}", "slow-stage=0:2", before, expect="slow_stage", report=s,
          started=10 * k + 1)
    _case(out, f"fx-hop-c8.{k}", "hop-delay=0:4000", before, expect="hop",
          report=rep["hop-delay"], started=10 * k + 2)
    _case(out, f"fx-host-c8.{k}", "host-delay=0:4000", before, expect="host",
          report=rep["hop-delay"], started=10 * k + 3)
    _case(out, f"fx-slow1-split-c8.{k}", "slow-stage=1:2", slow1_after,
          baseline=f"fx-slow1-c8.{k}", expect="slow_stage", env={PARTITION_ENV: "3,1"})
    _case(out, f"fx-slow0-split-c8.{k}", "slow-stage=0:2", [130.0, 132.0],
          baseline=f"fx-slow0-c8.{k}", expect="slow_stage", env={PARTITION_ENV: "1,3"})
    _case(out, f"fx-hop-depth1-c8.{k}", "hop-delay=0:4000", hop_after,
          baseline=f"fx-hop-c8.{k}", expect="hop", extra=(DEPTH, "1"))


@pytest.fixture(scope="module")
def lab_out(reports_, tmp_path_factory) -> tuple[Path, dict]:
    """Two rounds (2 and 10: the round is a number, not text): in round 2 the slow stage's
    fix gains inside the report's interval and the hop's depth 1 loses about as predicted; in
    round 10 the split gains less than predicted and depth 1 gains."""
    out = tmp_path_factory.mktemp("fx-lab")
    split = _split(reports_["slow-stage"])
    inside = 102.0 * (1 + (split["gain_ci"][0] + split["gain_ci"][1]) / 200)
    d1 = _depth1(reports_["hop-delay"])
    near = 102.0 * (1 + d1["effects"][0]["gain"])
    _round(out, 2, reports_, [inside - 0.5, inside + 0.5], [near - 1, near + 1])
    _round(out, 10, reports_, [103.0, 105.0], [140.0, 142.0])
    return out, {"split": split, "depth1": d1}


def test_the_reports_recorded_fixes_are_the_ones_the_lab_applies(reports_):
    split = _split(reports_["slow-stage"])
    assert split["value"] == "3,1" and split["now"] == "2,2" and split["gain_pct"] > 0
    assert split["gain_ci"] and split["gain_ci"][0] <= split["gain_pct"] <= split["gain_ci"][1]
    assert "as given" in split["layers_from"]
    assert _depth1(reports_["hop-delay"])["effects"][0]["gain"] < 0


def test_one_row_per_fault_per_round_in_the_order_they_ran(lab_out):
    out, _ = lab_out
    rows = fixes.fix_rows(out)
    assert [(r.round, r.before, r.after) for r in rows] == [
        (k, f"fx-{f}-c8.{k}", a.format(k=k) if a else None) for k in ("2", "10")
        for f, a in (("slow1", "fx-slow1-split-c8.{k}"), ("slow0", "fx-slow0-split-c8.{k}"),
                     ("hop", "fx-hop-depth1-c8.{k}"), ("host", None))]


def test_the_slow_stages_fix_is_the_reports_split_with_its_interval(lab_out):
    out, known = lab_out
    r = {x.before: x for x in fixes.fix_rows(out)}["fx-slow1-c8.2"]
    split = known["split"]
    assert r.first_cause == "slow_stage" and r.cause == "slow_stage"
    assert (r.fix.knob, r.fix.value, r.fix.gain_pct) == (LAYER_PARTITION, "3,1",
                                                         split["gain_pct"])
    assert list(r.fix.gain_ci) == split["gain_ci"]
    assert (r.applied_knob, r.applied_value, r.applied_is_reports) == (LAYER_PARTITION, "3,1",
                                                                       True)
    assert r.predicted_pct == split["gain_pct"] and list(r.predicted_ci) == split["gain_ci"]
    assert r.right_sign is True and r.within is True


def test_the_measured_gain_is_after_over_before_with_welchs_interval_on_its_side(lab_out):
    out, _ = lab_out
    r = {x.before: x for x in fixes.fix_rows(out)}["fx-slow1-c8.10"]
    assert (r.before_tok_per_s, r.after_tok_per_s) == (102.0, 104.0)
    assert (r.before_runs, r.after_runs) == (2, 2)
    assert r.measured_pct == pytest.approx(100 * (104 / 102 - 1))
    # a gain, not a step change: the interval is the after side's, around +2%
    assert tuple(r.measured_ci) == change_interval([103.0, 105.0], [100.0, 104.0])
    lo, hi = r.measured_ci
    assert lo < r.measured_pct < hi and hi > 0
    # right sign, but below the report's interval
    assert r.right_sign is True and r.within is False


def test_the_hops_fix_is_the_async_depth_tried_on_the_servers_own_loop(lab_out):
    out, known = lab_out
    rows = {x.before: x for x in fixes.fix_rows(out)}
    d1 = known["depth1"]
    pred = 100 * d1["effects"][0]["gain"]
    for k, sign, within in (("2", True, True), ("10", False, False)):
        r = rows[f"fx-hop-c8.{k}"]
        assert r.first_cause == "hop" and r.cause == "hop"
        assert (r.fix.knob, r.fix.value, r.fix.gain_ci) == (DEPTH, "1", None)
        assert r.fix.gain_pct == pytest.approx(pred)
        assert r.fix.offered is False      # it loses: the report tries it, never offers it
        assert (r.applied_knob, r.applied_value, r.applied_is_reports) == (DEPTH, "1", True)
        assert r.predicted_pct == pytest.approx(pred) and r.predicted_ci is None
        # no interval: within +-25 points of the predicted gain
        assert (r.right_sign, r.within) == (sign, within), (k, r.measured_pct, pred)


def test_a_split_other_than_the_reports_is_said_with_both_and_not_judged(lab_out):
    out, _ = lab_out
    r = {x.before: x for x in fixes.fix_rows(out)}["fx-slow0-c8.2"]
    assert (r.fix.value, r.applied_value, r.applied_is_reports) == ("3,1", "1,3", False)
    assert r.predicted_pct is None and r.right_sign is None and r.within is None
    assert r.measured_pct == pytest.approx(100 * (131 / 102 - 1))
    assert "no: report 3,1, lab 1,3" in fixes.render([r])


def test_a_split_the_report_could_not_estimate_is_said_and_not_judged(reports_, tmp_path):
    # the report of a window without stacks whose layers were not given: no layer_split
    rep = json.loads(reports_["slow-stage"].read_text())
    del rep["diagnosis"]["layer_split"]
    rep["server_whatifs"]["rows"] = [r for r in rep["server_whatifs"]["rows"]
                                     if r["knob"] != LAYER_PARTITION]
    (tmp_path / "report.json").write_text(json.dumps(rep))
    out = tmp_path / "lab"
    _case(out, "fx-slow1-c8.1", "slow-stage=1:2", [100.0, 104.0], expect="slow_stage",
          report=tmp_path / "report.json")
    _case(out, "fx-slow1-split-c8.1", "slow-stage=1:2", [120.0, 124.0],
          baseline="fx-slow1-c8.1", env={PARTITION_ENV: "3,1"})
    (r,) = fixes.fix_rows(out)
    assert r.fix.value is None and "not estimated" in r.fix.note
    assert r.applied_is_reports is False and r.predicted_pct is None and r.right_sign is None
    text = fixes.render([r])
    assert f"{LAYER_PARTITION}: not estimated" in text and "no: report none" in text


def test_host_work_has_no_server_setting_and_nothing_is_applied(lab_out):
    out, _ = lab_out
    r = {x.before: x for x in fixes.fix_rows(out)}["fx-host-c8.2"]
    assert r.fix.knob is None and r.fix.note.startswith("no server setting")
    assert r.after is None and r.applied_knob is None and r.measured_pct is None
    assert r.right_sign is None and r.within is None
    line = next(ln for ln in fixes.render([r]).splitlines() if "host-delay" in ln)
    assert "no server setting" in line and "nothing" in line


def test_the_summary_counts_the_judged_faults(lab_out, capsys, tmp_path):
    out, _ = lab_out
    rows = fixes.fix_rows(out)
    assert fixes.summary_line(rows).startswith("right sign 3 of 4, within 2 of 4")
    dest = tmp_path / "fixes.json"
    assert fixes.main([str(out), "--md", "--json", str(dest)]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith("| ") and "right sign 3 of 4, within 2 of 4" in text
    got = json.loads(dest.read_text())
    assert len(got) == 8 and got[0]["fix"]["knob"] == LAYER_PARTITION


def test_the_table_reads_and_writes_nothing_in_the_lab_folder(lab_out):
    out, _ = lab_out
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    fixes.fix_rows(out)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before


def test_a_case_whose_analysis_failed_shows_no_earlier_report(reports_, tmp_path):
    out = tmp_path / "lab"
    d = _case(out, "fx-slow1-c8.1", "slow-stage=1:2", [100.0, 104.0], expect="slow_stage",
              report=reports_["slow-stage"])
    (d / "analysis.json").write_text(json.dumps({"sglang_rc": 1, "error": "ppscope sglang: x"}))
    _case(out, "fx-slow1-split-c8.1", "slow-stage=1:2", [120.0, 124.0],
          baseline="fx-slow1-c8.1", env={PARTITION_ENV: "3,1"})
    _case(out, "fx-hop-c8.1", "hop-delay=0:4000", [100.0, 104.0], expect="hop")   # no report
    rows = {r.before: r for r in fixes.fix_rows(out)}
    a, b = rows["fx-slow1-c8.1"], rows["fx-hop-c8.1"]
    assert a.first_cause == "analysis failed" and a.fix.knob is None
    assert "analysis failed" in a.fix.note and a.right_sign is None
    assert a.measured_pct == pytest.approx(100 * (122 / 102 - 1))     # still measured
    assert b.fix.knob is None and "not analysed" in b.fix.note and b.applied_knob is None


# ------------------------------------------------------------------ bad input

def _fixes_cli(argv, capsys) -> tuple[int, str]:
    rc = run_guarded("fixes", lambda: fixes.main([str(a) for a in argv]))
    return rc, capsys.readouterr().err


def _one_line(rc: int, err: str, *words: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (rc, err)
    for w in words:
        assert w in lines[0], (w, lines[0])


class TestTheFixTableRefusesWhatIsNotALabFolder:
    def test_a_missing_folder(self, tmp_path, capsys):
        _one_line(*_fixes_cli([tmp_path / "none"], capsys), "not a lab results folder")

    def test_a_file_instead_of_a_folder(self, tmp_path, capsys):
        f = tmp_path / "report.json"
        f.write_text("{}")
        _one_line(*_fixes_cli([f], capsys), str(f), "not a lab results folder")
        assert f.read_text() == "{}"

    def test_a_folder_without_fix_cases(self, tmp_path, capsys):
        (tmp_path / "clean-c8").mkdir()
        (tmp_path / "clean-c8" / "case.json").write_text(json.dumps({"case": {
            "name": "clean-c8", "concurrency": 8}}))
        _one_line(*_fixes_cli([tmp_path], capsys), "no fix cases", "--fixes")

    def test_no_folder(self, tmp_path, capsys):
        rc, err = _fixes_cli([], capsys)
        assert rc == 2 and "usage" in err
        # several folders are read together; an empty one is said
        (tmp_path / "a").mkdir()
        _one_line(*_fixes_cli([tmp_path / "a", tmp_path / "a"], capsys), "no fix cases")

    def test_a_split_error_record_needs_its_machine(self, tmp_path, capsys):
        _one_line(*_fixes_cli([tmp_path, "--split-error", tmp_path / "e.json"], capsys),
                  "--machine")
        _one_line(*_fixes_cli([tmp_path, "--split-error"], capsys), "--split-error needs a file")
        assert not (tmp_path / "e.json").exists()

    def test_an_unknown_option_or_a_json_without_its_file(self, tmp_path, capsys):
        _one_line(*_fixes_cli([tmp_path, "--csv"], capsys), "--csv")
        _one_line(*_fixes_cli([tmp_path, "--json"], capsys), "--json needs a file")

    @pytest.mark.parametrize("text", ["garbage", "[]", '{"case": {"name": "x"}}'])
    def test_a_case_json_that_is_not_a_lab_case(self, tmp_path, capsys, text):
        d = tmp_path / "fx-slow1-c8.1"
        d.mkdir()
        (d / "case.json").write_text(text)
        _one_line(*_fixes_cli([tmp_path], capsys), "case.json")

    @pytest.mark.parametrize("text,words", [
        ("garbage", ("report.json",)),
        ('{"schema": "something-else"}', ("not a ppscope report.json",)),
        ('{"schema": "ppscope-report/1", "scenario": "x", "diagnosis": {"status": "ok"}}',
         ("report.json",))])
    def test_a_damaged_report_json(self, tmp_path, capsys, text, words):
        d = _case(tmp_path, "fx-hop-c8.1", "hop-delay=0:4000", [100.0, 104.0], expect="hop")
        (d / "report.json").write_text(text)
        _one_line(*_fixes_cli([tmp_path], capsys), *words)
        assert (d / "report.json").read_text() == text

    def test_a_bench_file_with_no_runs(self, tmp_path, capsys):
        d = _case(tmp_path, "fx-hop-c8.1", "hop-delay=0:4000", [100.0, 104.0], expect="hop")
        (d / "bench.jsonl").write_text("not a bench run\n")
        _one_line(*_fixes_cli([tmp_path], capsys), "bench.jsonl")


class TestTheLabRefusesAFixPlanMixedWithAnother:
    @pytest.mark.parametrize("other", ["--split", "--sizes", "--whatif-restart", "--quick"])
    def test_fixes_with_another_plan_is_one_line(self, other, capsys):
        rc = run_guarded("ppscope", lambda: main(["sglang-lab", "--fixes", other, "--list"]))
        _one_line(rc, capsys.readouterr().err, "--fixes", other)

    def test_a_model_path_without_a_config_is_one_line(self, tmp_path, capsys):
        rc = run_guarded("ppscope", lambda: main(["sglang-lab", "--fixes", "--list",
                                                  "--model-path", str(tmp_path)]))
        _one_line(rc, capsys.readouterr().err, "--fixes", "config.json")

    def test_a_model_paths_layers_make_the_split(self, tmp_path, capsys):
        (tmp_path / "config.json").write_text(json.dumps({
            "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 6,
            "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128,
            "vocab_size": 256}))
        assert main(["sglang-lab", "--fixes", "--list", "--rounds", "1",
                     "--model-path", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert f"{PARTITION_ENV}=4,2" in out and f"{PARTITION_ENV}=2,4" in out


def test_the_splits_error_is_measured_and_each_round_judged_by_the_others(lab_out, tmp_path,
                                                                          capsys):
    # round 2's split gains inside the report's interval, round 10's far less: the split error
    # is the two differences; leave one round out, each split is judged by the other's
    from reports.model.observed.split_error import read
    out, known = lab_out
    rows = fixes.fix_rows(out)
    diffs = fixes.split_diffs(rows)
    assert len(diffs) == 2          # the report's own split of both rounds (slow0's is not)
    by = {r.after: r for r in rows if r.after}
    assert by["fx-slow1-split-c8.10"].measured_pct - by["fx-slow1-split-c8.10"].predicted_pct \
        in diffs
    cv = {r.after: r for r in fixes.cross_validated(rows) if r.after}
    r2, r10 = cv["fx-slow1-split-c8.2"], cv["fx-slow1-split-c8.10"]
    for r in (r2, r10):
        lo, hi = r.predicted_ci
        w = r.predicted_window_ci
        assert lo <= w[0] and hi >= w[1] and r.within == (lo <= r.measured_pct <= hi)
    # the hop's row is not a split: as it was
    assert cv["fx-hop-depth1-c8.2"] == by["fx-hop-depth1-c8.2"]
    dest = tmp_path / "split-error.json"
    assert fixes.main([str(out), "--split-error", str(dest), "--machine", "the lab"]) == 0
    err = read(dest)
    assert err.cases == 2 and err.points_lo <= err.points_median <= err.points_hi
    assert "split error" in capsys.readouterr().out

