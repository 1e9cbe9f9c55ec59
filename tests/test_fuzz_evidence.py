"""Evidence that does not belong together is never diagnosed as one (issue 35, item 3): a
baseline of another deployment or with impossible figures, record parts of two servers, rank
traces of two runs, two profiles or two clocks, a `rounds` record with another run's traces, a
bench file of two servers, several runs at one C or runs that completed nothing. The fuzz
tier's contract (tests/test_fuzz_bad_inputs.py): exit 2 with one line on stderr and no record
replaced, or exit 0 with the right answer and a warning naming both sides. Variants of the
recorded fixtures (tests/fixtures/sglang_lab, traces/pp2, h200x2/fault_cases) are built here,
in a temporary folder.
"""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from reports.cli import main
from test_fuzz_bad_inputs import digest, one_line_error, run   # the fuzz tier's contract

FIX = Path(__file__).parent / "fixtures"
LAB = FIX / "sglang_lab"
CASES = FIX / "h200x2" / "fault_cases"


def shifted(src: Path, dst: Path, us: float = 0.0) -> Path:
    """A copy of a gzipped Kineto trace, its timestamps moved by `us` (another clock)."""
    d = json.loads(gzip.decompress(src.read_bytes()))
    for e in d["traceEvents"]:
        if isinstance(e, dict) and isinstance(e.get("ts"), (int, float)):
            e["ts"] += us
    dst.write_text(json.dumps(d))
    return dst


def lab_traces(case: str, dst: Path, shift_rank1_us: float = 0.0) -> Path:
    """The case's two rank traces in `dst` (plain JSON, SGLang's names), rank 1 shifted."""
    dst.mkdir(parents=True, exist_ok=True)
    for p in sorted((LAB / case / "traces").glob("*.trace.json.gz")):
        shifted(p, dst / p.name[:-3], shift_rank1_us if "-PP-1" in p.name else 0.0)
    return dst


# ------------------------------------------------------------------------- --baseline

def _fault_report(tmp_path: Path, case: str = "base") -> Path:
    d = tmp_path / case
    d.mkdir()
    shutil.copy(CASES / case / "diag-even-c8-sglang.json", d / "sglang.json")
    assert main(["report", "--results", str(d), "--observed", "8:1000"]) == 0
    return d / "report.json"


def test_baseline_of_another_deployment_is_not_compared(tmp_path, capsys):
    base = _fault_report(tmp_path)                    # 2x H200, the PP-loop probe's traces
    lab = tmp_path / "lab"
    L = LAB / "clean-c8"                              # SGLang on the CPU, a 4-layer Llama
    rc, _, err = run(["sglang", "--log", L / "server.log", "--bench", L / "bench.jsonl",
                      "--traces", L / "traces", "--json", lab / "sglang.json"], capsys)
    assert rc == 0, err
    rc, out, err = run(["report", "--results", lab, "--baseline", base], capsys)
    assert rc == 0, err
    c = json.loads((lab / "report.json").read_text())["baseline_comparison"]
    assert c["status"] == "not compared" and "another deployment" in c["reason"]
    assert "device gpu" in c["reason"] and "device cpu" in c["reason"]
    assert "against the baseline" not in out.lower().replace("\n", " ")
    assert any("another deployment" in ln and "cpu" in ln and "gpu" in ln
               for ln in err.splitlines() if ln.startswith("warning:"))


@pytest.mark.parametrize("step", [-5, 1e308, 0])
def test_baseline_step_out_of_bounds_is_one_line(tmp_path, capsys, step):
    base = _fault_report(tmp_path)
    rep = json.loads(base.read_text())
    rep["diagnosis"]["observed_step_ms"] = step
    base.write_text(json.dumps(rep))
    now = _fault_report(tmp_path, "host-delay")
    before = digest(now)
    capsys.readouterr()     # the two reports' own output and warnings: not this run's error
    rc, _, err = run(["report", "--results", now.parent, "--baseline", base], capsys)
    one_line_error(rc, err, str(base), "diagnosis.observed_step_ms")
    assert digest(now) == before


# ----------------------------------------------------------- record parts of two servers

def test_record_parts_of_two_servers_are_refused(tmp_path, capsys):
    rec = tmp_path / "sglang.json"
    L = LAB / "clean-c8"
    rc, _, err = run(["sglang", "--log", L / "server.log", "--bench", L / "bench.jsonl",
                      "--json", rec], capsys)
    assert rc == 0, err
    before = digest(rec)
    pp2 = FIX / "traces" / "pp2"
    rc, _, err = run(["sglang", "--traces", pp2 / "pp2_burst_c8-rank0.json.gz",
                      pp2 / "pp2_burst_c8-rank1.json.gz", "--json", rec], capsys)
    one_line_error(rc, err, "server.log", "pp2_burst_c8-rank0", "cpu", "NVIDIA H200",
                   "two servers")
    assert digest(rec) == before
    # one run given both: refused the same way, nothing written
    rc, _, err = run(["sglang", "--log", L / "server.log", "--traces",
                      pp2 / "pp2_burst_c8-rank0.json.gz", pp2 / "pp2_burst_c8-rank1.json.gz",
                      "--json", tmp_path / "b.json"], capsys)
    one_line_error(rc, err, "two servers")
    assert not (tmp_path / "b.json").exists()


# --------------------------------------------------------------- rank traces together

def test_rank_windows_an_hour_apart_are_refused(tmp_path, capsys):
    t = lab_traces("slow-stage", tmp_path / "t", shift_rank1_us=3600e6)
    rc, _, err = run(["sglang", "--traces", t, "--json", tmp_path / "s.json"], capsys)
    one_line_error(rc, err, "PP-0", "PP-1", "do not overlap")
    assert not (tmp_path / "s.json").exists()


def _loop(path: Path) -> dict:
    return json.loads(path.read_text())["data"]["loop"]


def test_a_clock_offset_of_20_ms_is_estimated_and_corrected(tmp_path, capsys):
    same = lab_traces("slow-stage", tmp_path / "a")
    apart = lab_traces("slow-stage", tmp_path / "b", shift_rank1_us=20e3)
    rc, _, err = run(["sglang", "--traces", same, "--concurrency", "8", "--json",
                      tmp_path / "a.json"], capsys)
    assert rc == 0, err
    rc, out, err = run(["sglang", "--traces", apart, "--concurrency", "8", "--json",
                        tmp_path / "b.json"], capsys)
    assert rc == 0, err
    assert "rank 1's clock is +19.9" in out or "rank 1's clock is +20.0" in out
    assert "corrected" in out
    off = json.loads((tmp_path / "b.json").read_text())["data"]["traces"]["ranks"]["1"]
    assert off["clock_offset_us"] == pytest.approx(20e3, abs=100)
    a, b = _loop(tmp_path / "a.json"), _loop(tmp_path / "b.json")
    assert a["hops"].keys() == b["hops"].keys() and a["hops"]
    for k in a["hops"]:                  # the hops as on one clock, within the estimate's error
        assert b["hops"][k]["mean_us"] == pytest.approx(a["hops"][k]["mean_us"], abs=100)
    for r in a["ranks"]:
        for k in ("host_us_mean", "forwards"):
            assert b["ranks"][r].get(k) == pytest.approx(a["ranks"][r].get(k), rel=0.02, abs=50)


def test_a_clock_offset_that_cannot_be_told_is_said(tmp_path, capsys):
    # several offsets fit and zero does not: not corrected, and said naming both files (not
    # refused: SGLang's own one-host recordings can look so too, evidence.py)
    t = lab_traces("clean-c8", tmp_path / "t", shift_rank1_us=20e3)
    rc, out, err = run(["sglang", "--traces", t, "--json", tmp_path / "s.json"], capsys)
    assert rc == 0, err
    clock = json.loads((tmp_path / "s.json").read_text())["data"]["traces"]["clock"]
    note = next(n for n in clock["notes"] if "cannot be told" in n)
    assert "PP-0" in note and "PP-1" in note and "one clock assumed" in note
    assert "cannot be told" in out


def test_two_profiles_in_one_folder_are_refused(tmp_path, capsys):
    d = tmp_path / "t"
    d.mkdir()
    for case in ("slow-stage", "host-delay"):
        for p in (LAB / case / "traces").glob("*.trace.json.gz"):
            shutil.copy(p, d / p.name)
    rc, _, err = run(["sglang", "--traces", d, "--json", tmp_path / "s.json"], capsys)
    line = one_line_error(rc, err, "a second trace for PP rank")
    assert sum(Path(p).name in line for p in d.iterdir()) == 2   # both files named


def test_a_file_named_pp1_holding_rank_0_is_refused(tmp_path, capsys):
    src = next((LAB / "slow-stage" / "traces").glob("*-PP-0.trace.json.gz"))
    d = tmp_path / "t"
    d.mkdir()
    shutil.copy(src, d / src.name)
    wrong = d / src.name.replace("-PP-0", "-PP-1")
    shutil.copy(src, wrong)
    rc, _, err = run(["sglang", "--traces", d, "--json", tmp_path / "s.json"], capsys)
    one_line_error(rc, err, wrong.name, src.name, "distributedInfo.rank 0")


def test_rounds_on_a_record_with_another_runs_traces(tmp_path, capsys):
    from microbench.sglang_lab import rounds
    R = LAB / "restart"
    case = tmp_path / "wr-d2-c1.1"
    case.mkdir()
    rc, _, err = run(["sglang", "--log", R / "wr-d2-c1.1" / "server.log", "--traces",
                      R / "wr-d2-c1.1" / "traces", "--bench", R / "wr-d2-c1.1" / "bench.jsonl",
                      "--concurrency", "1", "--json", case / "sglang.json"], capsys)
    assert rc == 0, err
    (case / "traces").symlink_to((R / "wr-d1-c1.1" / "traces").resolve())   # another run's
    assert rounds.main([str(case)]) == 2
    out, err = capsys.readouterr()
    assert "model vs trace" not in out
    one_line_error(2, err, "another run")
    # the same trace under the record's own name: its loop count gives it away
    (case / "traces").unlink()
    (case / "traces").mkdir()
    own = next((R / "wr-d2-c1.1" / "traces").glob("*PP-0*"))
    other = next((R / "wr-d1-c1.1" / "traces").glob("*PP-0*"))
    shutil.copy(other, case / "traces" / own.name)
    assert rounds.main([str(case)]) == 2
    one_line_error(2, capsys.readouterr()[1], "loop iterations", "another run")


# -------------------------------------------------------------------------- bench runs

def _bench_lines(case: str = "clean-c8") -> list[dict]:
    return [json.loads(ln) for ln in (LAB / case / "bench.jsonl").read_text().splitlines()
            if ln.strip()]


def _write(path: Path, runs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in runs))
    return path


def test_bench_file_of_two_servers_is_refused(tmp_path, capsys):
    a, b = _bench_lines()[:2]
    b["server_info"] = dict(b["server_info"], model_path="/models/Kimi-K2", device="cuda",
                            pp_size=8)
    f = _write(tmp_path / "bench.jsonl", [a, b])
    rc, _, err = run(["sglang", "--bench", f, "--json", tmp_path / "s.json"], capsys)
    one_line_error(rc, err, str(f), "two servers", "model-llama-4l vs Kimi-K2")
    rc, _, err = run(["report", "--results", tmp_path, "--bench", f], capsys)
    one_line_error(rc, err, str(f), "two servers")


def test_several_runs_at_one_c_keep_their_mean_and_say_so(tmp_path, capsys):
    runs = _bench_lines()                       # the lab's three repetitions at C=8
    f = _write(tmp_path / "bench.jsonl", runs)
    rc, _, err = run(["sglang", "--bench", f, "--json", tmp_path / "s.json"], capsys)
    assert rc == 0, err
    m = sum(r["output_throughput"] for r in runs) / len(runs)
    assert any("3 runs at C=8" in ln and "their mean" in ln and f"{m:.1f}" in ln
               for ln in err.splitlines() if ln.startswith("warning:")), err


def test_runs_that_completed_nothing_are_left_out(tmp_path, capsys):
    a, b = _bench_lines()[:2]
    b = dict(b, completed=0, output_throughput=0.0, max_concurrency=16)
    f = _write(tmp_path / "bench.jsonl", [a, b])
    rc, _, err = run(["sglang", "--bench", f, "--json", tmp_path / "s.json"], capsys)
    assert rc == 0, err
    kept = json.loads((tmp_path / "s.json").read_text())["data"]["bench"]
    assert [r["max_concurrency"] for r in kept] == [8]
    assert any("completed 0 requests" in ln and "C=16" in ln for ln in err.splitlines()), err
    f = _write(tmp_path / "none.jsonl", [b])
    rc, _, err = run(["sglang", "--bench", f, "--json", tmp_path / "n.json"], capsys)
    one_line_error(rc, err, str(f), "completed 0")


# ------------------------------------------ issue 55, item 6: evidence still taken as one

def test_a_log_without_server_args_and_another_servers_traces_are_refused(tmp_path, capsys):
    # the log's device from its batch lines ("cpu graph: False", SGLang 0.5.23's CPU server)
    L = LAB / "clean-c8"
    log = tmp_path / "server.log"
    log.write_text("".join(ln for ln in L.joinpath("server.log").read_text().splitlines(True)
                           if "server_args=" not in ln))
    pp2 = FIX / "traces" / "pp2"
    rc, _, err = run(["sglang", "--log", log, "--traces", pp2 / "pp2_burst_c8-rank0.json.gz",
                      pp2 / "pp2_burst_c8-rank1.json.gz", "--json", tmp_path / "s.json"], capsys)
    one_line_error(rc, err, "server.log", "device cpu", "NVIDIA H200", "two servers")
    assert not (tmp_path / "s.json").exists()


def test_log_ranks_beyond_the_servers_pp_size_are_refused(tmp_path, capsys):
    # ranks {0, 7} of a PP2 server (its server_args say pp_size 2)
    log = tmp_path / "server.log"
    log.write_text((LAB / "clean-c8" / "server.log").read_text().replace(" PP1]", " PP7]"))
    rc, _, err = run(["sglang", "--log", log, "--json", tmp_path / "s.json"], capsys)
    one_line_error(rc, err, "server.log", "PP rank(s) 0, 7", "PP2", "rank 7")
    assert not (tmp_path / "s.json").exists()


def test_metrics_ranks_beyond_the_logs_pp_size_are_refused(tmp_path, capsys):
    rec = tmp_path / "sglang.json"
    rc, _, err = run(["sglang", "--log", LAB / "clean-c8" / "server.log", "--json", rec], capsys)
    assert rc == 0, err
    win = FIX / "sglang_lab" / "metrics-window" / "clean-c8" / "metrics.txt"
    page = win.read_text()
    extra = [ln.replace('pp_rank="1"', f'pp_rank="{r}"') for ln in page.splitlines()
             for r in (2, 3) if 'pp_rank="1"' in ln]
    (m := tmp_path / "metrics.txt").write_text(page + "\n".join(extra) + "\n")
    before = digest(rec)
    rc, _, err = run(["sglang", "--metrics", m, "--json", rec], capsys)
    one_line_error(rc, err, "PP rank(s) 0, 1, 2, 3", "PP2", "kept in sglang.json")
    assert digest(rec) == before


def test_bench_runs_of_another_engine_are_refused(tmp_path, capsys):
    a, b = _bench_lines()[:2]
    for r in (a, b):
        r.pop("server_info")
    b = dict(b, backend="vllm", max_concurrency=16)
    f = _write(tmp_path / "bench.jsonl", [a, b])
    rc, _, err = run(["sglang", "--bench", f, "--json", tmp_path / "s.json"], capsys)
    one_line_error(rc, err, str(f), "two servers", "--backend sglang", "--backend vllm")


def test_bench_runs_without_server_info_are_said_to_be_unchecked(tmp_path, capsys):
    a, b = _bench_lines()[:2]
    for r in (a, b):
        r.pop("server_info")
    f = _write(tmp_path / "bench.jsonl", [a, dict(b, max_concurrency=16)])
    for argv in (["sglang", "--bench", f, "--json", tmp_path / "s.json"],
                 ["report", "--results", tmp_path, "--bench", f, "--out", tmp_path / "out"]):
        rc, _, err = run(argv, capsys)
        assert rc == 0, err
        assert any("no run carries server_info" in ln and "not checked" in ln
                   for ln in err.splitlines() if ln.startswith("warning:")), err


@pytest.mark.parametrize("tok_s", [0.0, -34.0, "NaN", "fast"])
def test_runs_with_no_throughput_are_left_out_and_said(tmp_path, capsys, tok_s):
    a, b = _bench_lines()[:2]
    f = _write(tmp_path / "bench.jsonl", [a, dict(b, max_concurrency=16, output_throughput=tok_s)])
    rc, _, err = run(["sglang", "--bench", f, "--json", tmp_path / "s.json"], capsys)
    assert rc == 0, err
    kept = json.loads((tmp_path / "s.json").read_text())["data"]["bench"]
    assert [r["max_concurrency"] for r in kept] == [8]
    assert any("run 2 (C=16)" in ln and "not a throughput" in ln and "left out" in ln
               for ln in err.splitlines() if ln.startswith("warning:")), err


def test_bench_lines_that_are_not_runs_are_counted_aloud(tmp_path, capsys):
    f = tmp_path / "bench.jsonl"
    f.write_text(json.dumps(_bench_lines()[0]) + '\n{"note": "warm-up"}\nnot json at all\n')
    rc, _, err = run(["sglang", "--bench", f, "--json", tmp_path / "s.json"], capsys)
    assert rc == 0, err
    assert any("2 line(s) that are not bench_serving runs" in ln and "skipped" in ln
               for ln in err.splitlines() if ln.startswith("warning:")), err


def test_an_unaligned_clock_is_a_caveat_of_the_reports_answer(tmp_path, capsys):
    # clean-c8's ranks 20 ms apart: `ppscope sglang` says the offset cannot be told (one clock
    # assumed); the report's answer, which then names hops, carries that caveat
    L = LAB / "clean-c8"
    t = lab_traces("clean-c8", tmp_path / "t", shift_rank1_us=20e3)
    res = tmp_path / "res"
    rc, _, err = run(["sglang", "--traces", t, "--log", L / "server.log", "--bench",
                      L / "bench.jsonl", "--json", res / "sglang.json"], capsys)
    assert rc == 0, err
    rc, _, err = run(["report", "--results", res], capsys)
    assert rc == 0, err
    rep = json.loads((res / "report.json").read_text())
    first = rep["answer"][0]
    assert "could not be aligned" in first and "PP ranks 0 and 1" in first, first
    assert any("could not be aligned" in c for c in rep["diagnosis"]["caveats"])
