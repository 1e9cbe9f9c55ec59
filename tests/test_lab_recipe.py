"""What ppscope's recipe (--enable-metrics --decode-log-interval 1) costs the server: the lab's
recipe plan (SGLang's defaults against the recipe, the servers alternating), a server started
without the recipe (no flags, nothing read from /metrics), `python -m reports.lab.recipe` on lab
folders made here, its record read back with every figure checked, and the report's line on the
recipe with and without a shipped record. No server runs: the lab's HTTP and bench_serving calls
are stood in for."""
from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from microbench.sglang_lab import drive, lab, server
from microbench.sglang_lab.cases import Case, Group, recipe_plan
from microbench.sglang_lab.venv import LabError
from reports.base import recipe_cost as rcmod
from reports.base.errors import CliError
from reports.base.server_flags import RECIPE_ARGS
from reports.lab import recipe
from reports.model.compare import change_interval
from reports.model.report_type import RecipeNote
from reports.render.recipe_line import CLAUSE_CHARS, recipe_clause, recipe_line

RECIPE = ["--enable-metrics", "--decode-log-interval", "1"]


# ---- the plan -------------------------------------------------------------------------------

def test_the_plan_alternates_defaults_and_recipe_servers_per_round():
    plan = recipe_plan(pp=2)
    assert [g.name for g in plan] == ["rc-sglang-1", "rc-recipe-1", "rc-sglang-2",
                                      "rc-recipe-2", "rc-sglang-3", "rc-recipe-3"]
    assert [g.recipe for g in plan] == [False, True] * 3
    cases = [c for g in plan for c in g.cases]
    assert [c.name for c in cases] == [f"rc-{s}-c8.{k}" for k in (1, 2, 3)
                                       for s in ("sglang", "recipe")]
    assert all(c.concurrency == 8 and c.reps == 2 and not c.profile and not c.stacks
               and not c.live and c.fault == "" for c in cases)
    # the recipe case is read against its own round's defaults case
    assert [(c.name, c.baseline) for c in cases if "recipe" in c.name] == [
        (f"rc-recipe-c8.{k}", f"rc-sglang-c8.{k}") for k in (1, 2, 3)]
    assert all(c.baseline == "" for c in cases if "sglang" in c.name)
    assert len(recipe_plan(pp=4, rounds=5)) == 10 and recipe_plan(4)[0].pp == 4


def test_a_group_without_the_recipe_holds_no_window_and_no_live_probe():
    with pytest.raises(ValueError, match="a server without ppscope's recipe"):
        Group("g", 2, (), (Case("x", 8),), recipe=False)          # profile on by default
    with pytest.raises(ValueError, match="group g: x profile or probe"):
        Group("g", 2, (), (Case("x", 8, profile=False, live=True),), recipe=False)
    assert Group("g", 2, (), (Case("x", 8),)).recipe              # every other plan: the recipe


def test_the_cli_lists_the_plan_and_refuses_two_plans(capsys):
    from reports.cli import main
    assert main(["sglang-lab", "--recipe", "--rounds", "2", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == ["rc-sglang-c8.1", "rc-recipe-c8.1",
                                                 "rc-sglang-c8.2", "rc-recipe-c8.2"]
    assert all("SGLang's defaults (no recipe)" in line for line in out[::2])
    assert not any("no recipe" in line for line in out[1::2])
    assert main(["sglang-lab", "--recipe", "--sizes", "--list"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "two plans" in err[0]


def test_the_help_says_what_the_plan_is(capsys):
    from reports.cli import main
    with pytest.raises(SystemExit):
        main(["sglang-lab", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--recipe what ppscope's recipe" in text and "SGLang's defaults (neither flag)" in text


# ---- the server -----------------------------------------------------------------------------

def _spec(recipe: bool, device: str = "cpu") -> server.ServerSpec:
    return server.ServerSpec(python=Path("py"), model=Path("/m/model"), pp=2, device=device,
                             recipe=recipe)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_launch_args_with_and_without_the_recipe(device):
    on = server.launch_args(_spec(True, device), 1234)
    off = server.launch_args(_spec(False, device), 1234)
    assert tuple(RECIPE_ARGS) == tuple(RECIPE)
    i = on.index("--enable-metrics")
    assert on[i:i + 3] == RECIPE
    assert "--enable-metrics" not in off and "--decode-log-interval" not in off
    assert on[:i] + on[i + 3:] == off       # nothing else differs


def test_next_steps_start_the_server_with_the_flag_tables_recipe():
    from reports.model import next_steps as ns
    from reports.model.report_type import Report
    rep = Report(schema="ppscope-report/1", scenario="x")
    cmd = ns.next_steps(rep, [8], 2)[0].commands[1]
    assert " ".join(RECIPE_ARGS) + " 2>&1 | tee server.log" in cmd


# ---- run_case on a server without metrics ---------------------------------------------------

BENCH_LINE = {"backend": "sglang", "dataset_name": "random", "max_concurrency": 8,
              "random_input_len": 64, "random_output_len": 128, "random_range_ratio": 1.0,
              "duration": 9.7, "completed": 18, "total_output_tokens": 2304,
              "request_throughput": 1.85, "mean_tpot_ms": 24.3, "median_itl_ms": 27.6,
              "mean_ttft_ms": 473.5, "concurrency": 6.6}


def bench_line(tok: float) -> str:
    return json.dumps({**BENCH_LINE, "output_throughput": tok}) + "\n"


@pytest.fixture
def fake_drive(monkeypatch):
    """The lab's calls to a server, recorded; bench_serving writes one run per call."""
    calls = []

    def run_bench(bench, log, **kw):
        calls.append(("bench", kw["concurrency"]))
        with open(kw["out"], "a") as f:
            f.write(bench_line(200.0 + len(calls)))

    def scrape(url, dest):
        calls.append(("metrics", dest.name))
        dest.write_text("sglang:num_running_reqs 0\n")

    def forbidden(name):
        def f(*a, **k):
            calls.append((name,))
            raise AssertionError(f"{name} called")
        return f
    monkeypatch.setattr(drive, "run_bench", run_bench)
    monkeypatch.setattr(drive, "scrape_metrics", scrape)
    monkeypatch.setattr(drive, "set_mmb", lambda url, n: calls.append(("mmb", n)))
    for name in ("start_bench", "profile_window", "http_call"):
        monkeypatch.setattr(drive, name, forbidden(name))
    monkeypatch.setattr(lab.time, "sleep", lambda s: None)
    return calls


def _server(tmp_path: Path, recipe: bool):
    log = tmp_path / f"server-{recipe}.log"
    log.write_text("server_args=...\nThe server is fired up and ready to roll\n")
    return SimpleNamespace(spec=_spec(recipe), url="http://127.0.0.1:1", choices=None,
                           log_size=lambda: log.stat().st_size,
                           log_text=lambda start=0, end=None, tail=None: log.read_text()[start:end])


def _bench():
    return drive.BenchSpec(python=Path("py"), url="http://127.0.0.1:1", model=Path("/m/model"),
                           dataset=Path("d.json"))


def test_run_case_on_a_server_without_the_recipe_never_scrapes(tmp_path, fake_drive):
    (case,) = recipe_plan()[0].cases
    fault = tmp_path / "fault"
    d = lab.run_case(case, _server(tmp_path, recipe=False), _bench(), fault, None,
                     tmp_path / "out", "")
    assert fake_drive == [("bench", 8), ("bench", 8)]
    assert not (d / "metrics.txt").exists() and not (d / "metrics-start.txt").exists()
    meta = json.loads((d / "case.json").read_text())
    assert meta["recipe"] is False and meta["case"]["name"] == "rc-sglang-c8.1"
    assert len((d / "bench.jsonl").read_text().splitlines()) == 2


def test_run_case_on_a_recipe_server_scrapes_its_window(tmp_path, fake_drive):
    case = recipe_plan()[1].cases[0]
    d = lab.run_case(case, _server(tmp_path, recipe=True), _bench(), tmp_path / "fault", None,
                     tmp_path / "out", "")
    assert fake_drive == [("metrics", "metrics-start.txt"), ("bench", 8), ("bench", 8),
                          ("metrics", "metrics.txt")]
    assert json.loads((d / "case.json").read_text())["recipe"] is True


def test_a_window_on_a_server_without_the_recipe_is_refused_before_it_starts(tmp_path,
                                                                              fake_drive):
    out = tmp_path / "out"
    with pytest.raises(LabError, match="without ppscope's recipe"):
        lab.run_case(Case("w", 8), _server(tmp_path, recipe=False), _bench(),
                     tmp_path / "fault", None, out, "")
    assert fake_drive == [] and not (out / "w").exists()


@pytest.mark.parametrize("wait", ["idle", "load"])
def test_waits_that_read_metrics_or_decode_lines_refuse_a_server_without_the_recipe(
        tmp_path, fake_drive, wait):
    srv = _server(tmp_path, recipe=False)
    with pytest.raises(LabError, match="needs a server started with ppscope's recipe"):
        if wait == "idle":
            drive.wait_idle(srv)
        else:
            drive.wait_load(srv, 0, 8, 4)
    assert fake_drive == []        # not one /metrics call


# ---- reports.lab.recipe ---------------------------------------------------------------------

def make_case(out: Path, name: str, runs: list[float], recipe: bool | None, C: int = 8,
              baseline: str = "") -> Path:
    d = out / name
    d.mkdir(parents=True)
    meta = {"case": {"name": name, "concurrency": C, "baseline": baseline, "reps": len(runs)},
            "pp": 2, "device": "cpu"}
    if recipe is not None:
        meta["recipe"] = recipe
    (d / "case.json").write_text(json.dumps(meta))
    if runs:
        (d / "bench.jsonl").write_text("".join(bench_line(x) for x in runs))
    return d


ROUNDS = {1: ([240.0, 236.0], [231.0, 229.0]), 2: ([238.0, 242.0], [236.0, 233.0]),
          3: ([235.0, 239.0], [228.0, 234.0])}     # round: (defaults runs, recipe runs)


def lab_folder(tmp_path: Path, rounds=None) -> Path:
    out = tmp_path / "lab"
    for k, (sgl, rec) in (rounds or ROUNDS).items():
        make_case(out, f"rc-sglang-c8.{k}", sgl, False)
        make_case(out, f"rc-recipe-c8.{k}", rec, True, baseline=f"rc-sglang-c8.{k}")
    make_case(out, "clean-c8", [300.0], None)        # another plan's case: not read
    return out


def test_cost_per_round_and_over_all_rounds(tmp_path):
    rc, missing = recipe.recipe_cost(lab_folder(tmp_path), "test box")
    assert missing == [] and rc.concurrency == 8 and rc.flags == tuple(RECIPE)
    assert [r.round for r in rc.rounds] == [1, 2, 3]
    r1 = rc.rounds[0]
    # by hand: geometric means sqrt(240*236) = 237.99, sqrt(231*229) = 229.99 -> +3.48%
    assert r1.cost_pct == pytest.approx(100 * (math.sqrt(240 * 236) / math.sqrt(231 * 229) - 1),
                                        abs=0.005)
    assert r1.cost_pct == pytest.approx(3.48, abs=0.005)
    assert r1.cost_ci == change_interval([240.0, 236.0], [231.0, 229.0])
    sgl = [x for s, _ in ROUNDS.values() for x in s]
    rec = [x for _, r in ROUNDS.values() for x in r]
    assert rc.cost_ci == change_interval(sgl, rec)
    lo, hi = rc.cost_ci
    assert lo < rc.cost_pct < hi and lo > 0 and rc.significant is True
    assert rc.level == pytest.approx(0.90)
    text = recipe.render(rc)
    assert "round 1" in text and "all 3 rounds" in text and "significant" in text


def test_an_interval_holding_zero_is_no_significant_change(tmp_path):
    out = lab_folder(tmp_path, {1: ([230.0, 240.0], [241.0, 229.0]),
                                2: ([235.0, 236.0], [236.0, 234.0])})
    rc, _ = recipe.recipe_cost(out)
    lo, hi = rc.cost_ci
    assert lo <= 0 <= hi and rc.significant is False
    assert recipe.render(rc).count("no significant change") >= 2


def test_a_round_missing_a_side_is_left_out_and_said(tmp_path):
    out = lab_folder(tmp_path)
    for f in (out / "rc-recipe-c8.2").iterdir():
        if f.name == "bench.jsonl":
            f.unlink()
    rc, missing = recipe.recipe_cost(out)
    assert [r.round for r in rc.rounds] == [1, 3] and missing == [2]
    assert "Left out: round 2" in recipe.render(rc, missing)


def test_one_run_a_side_gives_no_interval(tmp_path):
    rc, _ = recipe.recipe_cost(lab_folder(tmp_path, {1: ([240.0], [230.0])}))
    assert rc.cost_ci is None and rc.significant is None
    assert "one run on a side" in recipe.render(rc)


def test_the_cli_writes_a_record_its_reader_reads_back(tmp_path, capsys):
    out, dest = lab_folder(tmp_path), tmp_path / "rc.json"
    assert recipe.main([str(out), "--md", "--json", str(dest), "--machine", "16-core box"]) == 0
    text = capsys.readouterr().out
    assert "| round 1" in text and f"wrote {dest}" in text
    back = rcmod.read_recipe_cost(dest)
    assert back == recipe.recipe_cost(out, "16-core box")[0]
    # the record is replaced by a newer one, never another file
    assert recipe.main([str(out), "--json", str(dest), "--machine", "other box"]) == 0
    assert rcmod.read_recipe_cost(dest).machine == "other box"


class TestBadLabFolders:
    """Each a one-line error and exit 2, nothing written."""

    def _refused(self, capsys, argv, *words):
        assert recipe.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("recipe: error: "), err
        for w in words:
            assert w in err[0]

    def test_no_folder(self, tmp_path, capsys):
        self._refused(capsys, [str(tmp_path / "typo")], "not a lab results folder")

    def test_no_recipe_cases(self, tmp_path, capsys):
        make_case(tmp_path / "lab", "clean-c8", [300.0], None)
        self._refused(capsys, [str(tmp_path / "lab")], "no recipe cases", "--recipe")

    def test_a_case_whose_server_is_not_its_sides(self, tmp_path, capsys):
        out = tmp_path / "lab"
        make_case(out, "rc-sglang-c8.1", [240.0, 236.0], True)
        make_case(out, "rc-recipe-c8.1", [231.0, 229.0], True, baseline="rc-sglang-c8.1")
        self._refused(capsys, [str(out)], "rc-sglang-c8.1", "started with the recipe")

    def test_a_recipe_case_against_another_rounds_baseline(self, tmp_path, capsys):
        out = tmp_path / "lab"
        make_case(out, "rc-sglang-c8.1", [240.0, 236.0], False)
        make_case(out, "rc-recipe-c8.1", [231.0, 229.0], True, baseline="rc-sglang-c8.2")
        self._refused(capsys, [str(out)], "not its round's defaults case")

    def test_a_case_at_another_concurrency_than_its_name(self, tmp_path, capsys):
        out = tmp_path / "lab"
        make_case(out, "rc-sglang-c8.1", [240.0, 236.0], False, C=16)
        self._refused(capsys, [str(out)], "concurrency 16")

    def test_a_case_json_that_is_not_one(self, tmp_path, capsys):
        out = lab_folder(tmp_path)
        (out / "rc-recipe-c8.1" / "case.json").write_text("{not json")
        self._refused(capsys, [str(out)], "case.json")

    def test_no_round_with_both_sides(self, tmp_path, capsys):
        out = tmp_path / "lab"
        make_case(out, "rc-sglang-c8.1", [240.0, 236.0], False)
        self._refused(capsys, [str(out)], "no round has both servers")

    def test_json_without_machine(self, tmp_path, capsys):
        dest = tmp_path / "rc.json"
        self._refused(capsys, [str(lab_folder(tmp_path)), "--json", str(dest)], "--machine")
        assert not dest.exists()

    def test_json_onto_a_file_that_is_not_a_record(self, tmp_path, capsys):
        dest = tmp_path / "report.json"
        dest.write_text('{"schema": "ppscope-report/1"}')
        self._refused(capsys, [str(lab_folder(tmp_path)), "--json", str(dest), "--machine",
                               "box"], "not replaced")
        assert dest.read_text() == '{"schema": "ppscope-report/1"}'


# ---- the record's reader --------------------------------------------------------------------

def good_record(tmp_path) -> dict:
    rc, _ = recipe.recipe_cost(lab_folder(tmp_path), "16-core box")
    return rc.to_dict()


class TestBadRecords:
    """A record no lab run gives is a one-line CliError naming the file, never a figure."""

    def _refused(self, tmp_path, doc, *words, raw: str | None = None):
        p = tmp_path / "recipe-cost.json"
        p.write_text(raw if raw is not None else json.dumps(doc, allow_nan=True))
        with pytest.raises(CliError) as e:
            rcmod.read_recipe_cost(p)
        msg = str(e.value)
        assert "\n" not in msg and str(p) in msg, msg
        for w in words:
            assert w in msg, msg

    def test_the_good_record_reads(self, tmp_path):
        p = tmp_path / "ok.json"
        p.write_text(json.dumps(good_record(tmp_path)))
        assert rcmod.read_recipe_cost(p).machine == "16-core box"

    @pytest.mark.parametrize("raw", ["", "{", "[]", "null", "\x00\x01", '"text"'])
    def test_not_a_record(self, tmp_path, raw):
        self._refused(tmp_path, None, raw=raw)

    @pytest.mark.parametrize("key,value,word", [
        ("schema", "ppscope-report/1", "schema"),
        ("cost_pct", float("nan"), ""),
        ("cost_pct", -100.0, "cost_pct"),
        ("cost_pct", 1e9, "cost_pct"),
        ("cost_pct", "3%", "cost_pct"),
        ("level", 1.5, "level"),
        ("concurrency", 0, "concurrency"),
        ("recipe_tok_per_s", -1.0, "recipe_tok_per_s"),
        ("machine", "   ", "machine"),
        ("rounds", [], "rounds"),
        ("flags", [], "flags"),
        ("significant", "yes", "significant"),
        ("extra", 1, "extra"),
    ])
    def test_a_field_no_run_gives(self, tmp_path, key, value, word):
        doc = good_record(tmp_path)
        doc[key] = value
        self._refused(tmp_path, doc, word)

    def test_a_missing_field(self, tmp_path):
        doc = good_record(tmp_path)
        del doc["cost_pct"]
        self._refused(tmp_path, doc, "cost_pct", "missing")

    def test_a_cost_its_runs_do_not_give(self, tmp_path):
        doc = good_record(tmp_path)
        doc["cost_pct"] += 1.0
        self._refused(tmp_path, doc, "cost_pct", "not the change its runs give")

    def test_an_interval_that_does_not_hold_its_cost(self, tmp_path):
        doc = good_record(tmp_path)
        doc["cost_ci"] = [doc["cost_pct"] + 1, doc["cost_pct"] + 2]
        self._refused(tmp_path, doc, "cost_ci")

    def test_a_significance_the_interval_does_not_say(self, tmp_path):
        doc = good_record(tmp_path)
        doc["significant"] = not doc["significant"]
        self._refused(tmp_path, doc, "significant")

    def test_a_side_mean_that_is_not_its_runs(self, tmp_path):
        doc = good_record(tmp_path)
        doc["sglang_tok_per_s"] *= 1.1
        self._refused(tmp_path, doc, "sglang_tok_per_s")

    def test_a_round_run_that_is_not_a_throughput(self, tmp_path):
        doc = good_record(tmp_path)
        doc["rounds"][0]["recipe_tok_per_s"][0] = 0
        self._refused(tmp_path, doc, "rounds[0].recipe_tok_per_s[0]")

    def test_a_round_given_twice(self, tmp_path):
        doc = good_record(tmp_path)
        doc["rounds"][1]["round"] = doc["rounds"][0]["round"]
        self._refused(tmp_path, doc, "twice")

    def test_a_shipped_record_that_is_bad_stops_the_report_in_one_line(self, tmp_path,
                                                                        monkeypatch):
        bad = tmp_path / "recipe-cost.json"
        bad.write_text("{}")
        monkeypatch.setattr(rcmod, "SHIPPED", bad)
        with pytest.raises(CliError, match="configs/records/recipe-cost.json"):
            rcmod.shipped_recipe_cost()


# ---- the report's line ----------------------------------------------------------------------

def test_no_shipped_record_means_not_measured(tmp_path, monkeypatch):
    monkeypatch.setattr(rcmod, "SHIPPED", tmp_path / "absent.json")
    assert rcmod.shipped_recipe_cost() is None


def test_the_shipped_record_is_the_labs_measurement():
    """configs/records/recipe-cost.json, written by `reports.lab.recipe --json` from the lab's
    --recipe plan on the GPU host (docs/BENCHMARKS.md section 22), reads through its checks."""
    rc = rcmod.shipped_recipe_cost()
    assert rc is not None and rc.concurrency == 8 and rc.rounds
    assert "16-core" in rc.machine


def _note(tmp_path, rounds=None) -> RecipeNote:
    rc = recipe.recipe_cost(lab_folder(tmp_path, rounds), "16-core box")[0] if rounds != {} \
        else None
    return RecipeNote(tuple(RECIPE), rcmod.SHIPPED_LABEL, rc)


def test_the_line_without_a_record_says_not_measured(tmp_path):
    note = _note(tmp_path, {})
    full, term = recipe_line(note), recipe_clause(note)
    assert "not measured" in full and "not taken off the diagnosis" in full
    assert " ".join(RECIPE) in full and "configs/records/recipe-cost.json" in full
    assert "not measured" in term and len(term) <= CLAUSE_CHARS


def test_the_line_with_a_significant_cost_says_the_figures_include_it(tmp_path):
    note = _note(tmp_path, ROUNDS)
    full, term = recipe_line(note), recipe_clause(note)
    rc = note.measured
    assert f"{rc.cost_pct:+.1f}%" in full and "16-core box" in full and "3 rounds" in full
    assert "figures here include it" in full and term.endswith("in the figures")
    assert len(term) <= CLAUSE_CHARS


def test_the_line_with_no_significant_change_is_not_taken_off(tmp_path):
    note = _note(tmp_path, {1: ([230.0, 240.0], [241.0, 229.0])})
    assert "no significant change; not taken off the diagnosis" in recipe_line(note)
    assert recipe_clause(note).endswith("not taken off")


def test_the_terminal_clause_fits_for_any_figure_a_record_holds(tmp_path):
    note = _note(tmp_path, ROUNDS)
    from dataclasses import replace
    worst = replace(note.measured, cost_pct=10_000.0, cost_ci=(-99.99, 10_000.0),
                    significant=True)
    assert len(recipe_clause(replace(note, measured=worst))) <= CLAUSE_CHARS


def test_the_note_is_there_only_where_the_report_reads_a_server_log(tmp_path, monkeypatch):
    from reports.report_build import recipe_note
    monkeypatch.setattr(rcmod, "SHIPPED", tmp_path / "absent.json")
    assert recipe_note(None) is None
    assert recipe_note(SimpleNamespace(log=None)) is None
    note = recipe_note(SimpleNamespace(log=object()))
    assert note.flags == tuple(RECIPE) and note.measured is None
    p = tmp_path / "recipe-cost.json"
    p.write_text(json.dumps(good_record(tmp_path)))
    monkeypatch.setattr(rcmod, "SHIPPED", p)
    assert recipe_note(SimpleNamespace(log=object())).measured.machine == "16-core box"


def test_the_report_of_a_server_log_says_the_recipes_cost_within_25_lines(
        tmp_path, fixtures, monkeypatch, capsys):
    from reports.cli import main
    from reports.model.report_type import Report
    p = tmp_path / "recipe-cost.json"
    p.write_text(json.dumps(good_record(tmp_path)))
    monkeypatch.setattr(rcmod, "SHIPPED", p)
    assert main(["report", "--results", str(fixtures / "report"), "--out",
                 str(tmp_path / "out"), "--no-cache"]) == 0
    out = capsys.readouterr().out.splitlines()
    rep = Report.from_json(json.loads((tmp_path / "out" / "report.json").read_text()),
                           strict=True)
    assert rep.recipe.measured.machine == "16-core box"
    assert len(out) <= 25 and max(map(len, out[1:-2])) <= 100     # out[0] names the folder
    # on the server line, tagged [lab] as its figures are [log] and [traces]
    k = next(k for k, line in enumerate(out) if line.startswith("your server"))
    srv = " ".join(line.strip() for line in out[k:k + 2])
    assert srv.endswith("; " + recipe_clause(rep.recipe))
    assert recipe_clause(rep.recipe) == "recipe's cost [lab] +2.8%, in the figures"
    md = (tmp_path / "out" / "report.md").read_text()
    html = (tmp_path / "out" / "report.html").read_text()
    assert recipe_line(rep.recipe) in md
    assert "measured in the lab on 16-core box" in html


def test_the_lab_reads_its_recipe_cases_again_without_a_server(tmp_path, capsys):
    from reports.cli import main
    out = lab_folder(tmp_path)
    assert main(["sglang-lab", "--recipe", "--analyse-only", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "all 3 rounds" in text and "--enable-metrics --decode-log-interval 1" in text
