"""ppscope on artefacts SGLang's own server wrote: the lab's recordings (tests/fixtures/sglang_lab/).

Each folder is one lab case (`ppscope sglang-lab`, microbench/sglang_lab/): SGLang 0.5.23's own
`launch_server --pp-size 2 --device cpu` (gloo between the ranks, a tiny Llama with random
weights), loaded by its own `bench_serving`, profiled through `/start_profile` (no stacks; the
clean case also with SGLang's defaults), with one fault injected into its processes. Trimmed
by microbench/sglang_lab/fixtures.py: 60 loop iterations of each trace (20 with stacks), of
which the first 3 keep every event and the rest only what ppscope reads (SGLang's ranges and
c10d's ops: tests/test_fixture_slim.py), the log's first 400 batch lines; otherwise the files
are as SGLang wrote them.

What must hold on them (each failed before ppscope read SGLang's real formats):
- every case is diagnosed (the traces have no GPU event: forwards are `run_batch` ranges,
  sizes `step[DECODE bs=N]`), and the report's headline is the traced server (PP2, cpu, C=8),
  not the built-in PP8 scenario, whose what-ifs are then not offered as advice;
- async `gloo:send` ranges are not waiting: no host work becomes rank chaining;
- bench_serving's cap (`max_concurrency` 8) is C, not its peak (`max_concurrent_requests`);
- graphs disabled by setting are "off by setting", never a fallback;
- the Prefill lines' `#new-seq` are read;
- each fault is the first named cause of its case.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from reports.cli import main

LAB = Path(__file__).parent / "fixtures" / "sglang_lab"
CASES = sorted(d.name for d in LAB.iterdir() if (d / "case.json").exists()) if LAB.exists() else []


def _read(case: str, tmp_path: Path, traces: str = "traces", baseline: Path | None = None):
    d = LAB / case
    res = tmp_path / case
    res.mkdir(parents=True, exist_ok=True)
    args = ["sglang", "--log", str(d / "server.log"), "--traces", str(d / traces),
            "--bench", str(d / "bench.jsonl"), "--json", str(res / "sglang.json")]
    if (d / "metrics.txt").exists():
        args += ["--metrics", str(d / "metrics.txt")]
    assert main(args) == 0
    rep_args = ["report", "--results", str(res)]
    if baseline is not None:
        rep_args += ["--baseline", str(baseline)]
    assert main(rep_args) == 0
    sg = json.loads((res / "sglang.json").read_text())["data"]
    rep = json.loads((res / "report.json").read_text())
    return sg, rep, (res / "report.md").read_text()


def test_the_lab_fixtures_are_there():
    assert {"clean-c8", "host-delay", "slow-stage", "hop-delay"} <= set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_every_lab_case_is_diagnosed_as_the_server_it_is(case, tmp_path):
    sg, rep, md = _read(case, tmp_path)
    c = json.loads((LAB / case / "case.json").read_text())["case"]["concurrency"]
    assert rep["diagnosis"]["status"] == "ok", rep["diagnosis"]
    assert rep["diagnosis"]["concurrency"] == c
    assert rep["diagnosis"]["concurrency_source"].startswith("bench_serving's --max-concurrency")
    head = md.splitlines()[0]
    assert head.startswith("# ppscope report: your server (PP2, on cpu") and f"C={c}" in head
    obs = rep["observed_deployment"]
    assert obs["pp"]["value"] == 2 and obs["device"]["value"] == "cpu"
    assert obs["cuda_graphs"]["value"].startswith("off by setting")
    assert rep["scenario_differs"]
    assert not any("Best single server setting" in a for a in rep["answer"])
    # no scenario model of another deployment is set against this server's tok/s
    assert all(x["observed"] is None for x in rep["concurrency"])
    assert sg["loop"]["device"] == "cpu"
    for r in sg["loop"]["ranks"].values():
        assert r["batch_source"] is None or r["batch_source"] == "step spans"
        assert r["forwards"] > 0 and r["slots"] in (None, 2)   # None: no idle pass in the window
        assert r["relay_wait_us_mean"] == 0.0          # waiting is not a cost
    assert rep["diagnosis"]["deployment"]["slots"] == 2


def test_graphs_off_by_setting_is_not_a_fallback(tmp_path):
    _, rep, _ = _read("clean-c8", tmp_path)
    v = next(v for v in rep["verdicts"] if v["hypothesis"].startswith("CUDA-graph"))
    assert v["verdict"] != "holds" and "off by setting" in v["number"]


def test_bench_cap_is_c_and_lengths_are_read(tmp_path):
    sg, rep, _ = _read("clean-c8", tmp_path)
    runs = sg["bench"]
    assert {b["max_concurrency"] for b in runs} == {8}
    assert all(b["peak_concurrency"] >= 8 for b in runs)
    assert all(b["mean_output_len"] == 128 and b["mean_input_len"] == 64 for b in runs)
    p = {x["name"]: x for x in rep["params"]}
    assert p["output_len"]["value"] == 128 and p["output_len"]["source"] == "observed"


def test_prefill_waves_are_read(tmp_path):
    sg, _, _ = _read("clean-c8", tmp_path)
    r0 = sg["ranks"]["0"]
    assert r0["prefill_new_seq_total"] > 0 and r0["prefill_waves"]
    assert sum(int(k) * v for k, v in r0["prefill_new_seq_hist"].items()) == \
        r0["prefill_new_seq_total"]


def test_async_gloo_sends_are_not_rank_chaining(tmp_path):
    # get_next_batch_to_run lies inside gloo:send ranges on SGLang's real traces (isend, wait
    # a phase later); the loop profile must count it as host work, not as relay wait
    import gzip
    d = LAB / "clean-c8" / "traces"
    f = sorted(d.glob("*PP-0*"))[0]
    ev = json.load(gzip.open(f))["traceEvents"]
    sends = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("name") == "gloo:send")
    gnb = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("name") == "get_next_batch_to_run"]
    inside = sum(1 for a, b in gnb if any(s <= a and b <= e for s, e in sends))
    assert inside > len(gnb) // 2          # the real format this test is about
    sg, rep, _ = _read("clean-c8", tmp_path)
    dep = rep["diagnosis"]["deployment"]
    assert dep["relay_us"] == [0.0, 0.0] and all(h > 0 for h in dep["host_us"])


@pytest.mark.parametrize("case,cause", [("host-delay", "host"), ("slow-stage", "slow_stage"),
                                        ("hop-delay", "hop")])
def test_each_fault_is_named_first(case, cause, tmp_path):
    _, base, _ = _read("clean-c8", tmp_path)
    _, rep, _ = _read(case, tmp_path / "f", baseline=tmp_path / "clean-c8" / "report.json")
    assert rep["diagnosis"]["named"][0] == cause, rep["diagnosis"]["answer"]
    cmp_ = rep["baseline_comparison"]
    assert cmp_["status"] == "ok"
    grown = max((r for r in cmp_["rows"] if r["cause"] != "unexplained"),
                key=lambda r: r["growth_ms"])
    assert grown["cause"] == cause


def test_traces_with_sglang_default_stacks_are_read(tmp_path):
    if not (LAB / "clean-c8" / "traces-stacks").exists():
        pytest.skip("no with-stacks recording")
    sg, rep, _ = _read("clean-c8", tmp_path, traces="traces-stacks")
    assert rep["diagnosis"]["status"] == "ok"
    plain, _, _ = _read("clean-c8", tmp_path / "plain")
    # the Python tracer inflates host time: never less than without it
    h_st = [r["host_us_mean"] for r in sg["loop"]["ranks"].values()]
    h = [r["host_us_mean"] for r in plain["loop"]["ranks"].values()]
    assert sum(h_st) > sum(h)
