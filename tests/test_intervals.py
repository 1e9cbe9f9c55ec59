"""How sure the diagnosis is: the window's blocks (microbench/sglang/window_blocks.py), the block
bootstrap and the runs' t interval (reports/model/observed/resample.py), the intervals on the
diagnosis and the verdicts they decide (reports/model/observed/diagnose.py, verdicts.py), and
`--baseline` as change detection (reports/model/compare.py).

Small cases are worked out by hand; the lab's recordings (tests/fixtures/sglang_lab: SGLang
0.5.23's PP2 CPU server, its traces, log and bench_serving runs) check the mechanics end to end:
intervals present around their point, a control pair (two windows and two pairs of bench runs
of one clean server) read as no significant change, a fault's growth clear of zero."""
from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from microbench.sglang import window_blocks
from reports.base.records import read_record
from reports.cli import main
from reports.model.compare import change_interval
from reports.model.observed import resample
from reports.model.observed.deployment import from_evidence
from reports.model.causes import HERD, NOISE, STAGES
from reports.model.observed.diagnose import _split, diagnose
from reports.model.verdicts import observed_verdicts

LAB = Path(__file__).parent / "fixtures" / "sglang_lab"


# ---------------------------------------------------------------- the window's blocks

def test_block_count_needs_rounds():
    assert window_blocks.block_count(11) == 0          # 5 blocks of 2 rounds: too few
    assert window_blocks.block_count(12) == 6
    assert window_blocks.block_count(1000) == window_blocks.MAX_BLOCKS


def test_block_sums_place_samples_by_time():
    inner = window_blocks.edges(0.0, 30.0, 3)           # [10, 20]
    assert inner == [10.0, 20.0]
    got = window_blocks.sums([(0.0, 1.0), (9.9, 2.0), (10.0, 4.0), (29.0, 8.0)], inner)
    assert got == [[3.0, 2], [4.0, 1], [8.0, 1]]


def test_reader_keeps_blocks_of_one_clock_on_every_rank(tmp_path):
    rec = _sglang(tmp_path, "clean-c8")
    loop = rec.payload.loop
    assert loop.block_count >= window_blocks.MIN_BLOCKS
    for r in loop.ranks.values():
        assert all(len(b) == loop.block_count for b in r.blocks.values())
        # the blocks hold every decode visit's host work: their mean is the record's mean
        s, n = (sum(x[k] for x in r.blocks["host"]) for k in (0, 1))
        assert s / n == pytest.approx(r.host_us_mean, rel=1e-4)
    for h in loop.hops.values():
        assert sum(n for _, n in h.blocks) == h.n


# ---------------------------------------------------------------- the statistics

def test_runs_interval_is_students_t_by_hand():
    lo, hi = resample.runs_interval([1.0, 2.0, 3.0])    # mean 2, sd 1, t(2) = 2.920
    assert (lo, hi) == pytest.approx((2 - 2.920 / math.sqrt(3), 2 + 2.920 / math.sqrt(3)))
    assert resample.runs_interval([5.0]) is None


def test_percentile_interval_and_draws():
    assert resample.percentile_interval(range(101)) == pytest.approx((5.0, 95.0))
    d = resample.draws(7, n=50)
    assert len(d) == 50 and all(sum(w) == 7 for w in d)
    assert d == resample.draws(7, n=50)                  # a fixed seed: the same every run
    assert d != resample.draws(7, n=50, seed=resample.SEED + 1)


def test_a_replicate_that_draws_every_block_once_is_the_point(tmp_path):
    dep = _dep(tmp_path, "clean-c8")
    same = resample.replicate(dep, dep.blocks, [1] * dep.blocks.count)
    for f in ("host_us", "empty_us", "send_us", "process_us", "hop_us"):
        assert getattr(same, f) == pytest.approx(getattr(dep, f))
    for a, b in zip(same.forward_busy, dep.forward_busy):
        assert a == pytest.approx(b)


def test_welch_change_interval_by_hand():
    # log tok/s: 100, 110 then; 80, 90 now. d = mean log then - mean log now (the step's log
    # ratio), se from each side's variance of the logs, df by Welch-Satterthwaite, t from the
    # table: the step's change is exp(d -+ t se) - 1, here an interval that holds no change
    lb, ln = [math.log(100.0), math.log(110.0)], [math.log(80.0), math.log(90.0)]
    d = sum(lb) / 2 - sum(ln) / 2
    vb, vn = (lb[0] - lb[1]) ** 2 / 2 / 2, (ln[0] - ln[1]) ** 2 / 2 / 2
    df = (vb + vn) ** 2 / (vb ** 2 + vn ** 2)
    assert 1 < df < 2                                  # t of 1 degree of freedom: 6.314
    h = 6.314 * math.sqrt(vb + vn)
    lo, hi = change_interval([100.0, 110.0], [80.0, 90.0])
    assert lo == pytest.approx(100 * math.expm1(d - h), abs=0.01)
    assert hi == pytest.approx(100 * math.expm1(d + h), abs=0.01)
    assert lo < 0 < hi
    assert change_interval([100.0], [80.0, 90.0]) is None


def test_change_interval_is_finite_however_wide():
    # two runs a side far apart (the lab's device rounds): the tok/s difference's interval
    # crossed zero tok/s, a step change without bound that a report could not hold
    lo, hi = change_interval([330.0, 410.0], [120.0, 290.0])
    assert math.isfinite(lo) and math.isfinite(hi) and lo < 0 < hi
    assert change_interval([300.0, 300.0], [200.0, 200.0]) == (50.0, 50.0)   # no spread
    assert change_interval([300.0, 0.0], [200.0, 210.0]) is None


# ---------------------------------------------------------------- the diagnosis

def test_diagnosis_intervals_hold_their_points(tmp_path):
    dep = _dep(tmp_path, "clean-c8")
    dg = diagnose(dep, runs=(236.8, 229.5, 208.7))
    assert dg.interval_level == resample.LEVEL
    for r in dg.rows:
        assert r.ms_ci[0] - 1e-3 <= r.ms_per_step <= r.ms_ci[1] + 1e-3, r.cause
    lo, hi = dg.modelled_step_ci
    assert lo < dg.modelled_step_ms < hi
    assert dg.observed_step_ci[0] < dg.observed_step_ms < dg.observed_step_ci[1]
    assert dg.unexplained_ci[0] < dg.unexplained_ms < dg.unexplained_ci[1]
    top = dg.rows[0]
    assert top.cause == "host" and top.size_ci[0] >= 10 and dg.named[0] == "host"
    assert f"({top.size_ci[0]:.0f}-{top.size_ci[1]:.0f}%)" in dg.answer
    assert "3 bench_serving runs" in dg.interval_note


def test_a_size_whose_interval_straddles_the_threshold_is_within_noise(tmp_path):
    dep = _dep(tmp_path, "clean-c8")
    point = {r.cause: r for r in diagnose(replace(dep, blocks=None)).rows}
    assert point["host"].size_pct >= 10
    wide = {c: (0.0, 2 * (point[c].size_pct or 0) + 1) for c in point}     # straddles 10%
    rows, _, _, answer, named, noise = _split(dep, None, ({}, wide))
    assert "host" not in named and "host" in noise
    assert answer.startswith("within noise") and "a longer traced window" in answer
    clear = {c: (point[c].size_pct - 0.1, point[c].size_pct + 0.1) for c in point
             if point[c].size_pct is not None}
    assert _split(dep, None, ({}, clear))[4][0] == "host"
    # the verdicts: a straddling interval is "within noise", a clear one holds or does not
    dg = diagnose(dep)
    noisy = replace(dg, rows=tuple(replace(r, size_ci=(1.0, 30.0)) for r in dg.rows))
    got = observed_verdicts(_as_server(noisy, dep))
    assert {v.verdict for v in got.values()} == {NOISE}
    sure = observed_verdicts(_as_server(dg, dep))
    assert sure[STAGES].verdict != NOISE and sure[HERD].verdict != NOISE


def test_a_window_without_blocks_is_diagnosed_and_says_so(tmp_path):
    dep = replace(_dep(tmp_path, "clean-c8"), blocks=None)
    dg = diagnose(dep, runs=(200.0,))
    assert all(r.ms_ci is None for r in dg.rows) and dg.interval_level is None
    assert "kept no blocks" in dg.interval_note and "give two or more" in dg.interval_note


# ---------------------------------------------------------------- --baseline

def test_control_pair_is_no_significant_change(tmp_path):
    """Two windows of one clean server (its plain and its stacks profile), two bench runs on
    each side: nothing changed, and the report says so instead of splitting noise."""
    base = _report(tmp_path, "base", "clean-c8", "traces", bench_runs=(0, 1))
    now = _report(tmp_path, "now", "clean-c8", "traces", bench_runs=(2, 1),
                  baseline=base)
    c = now["baseline_comparison"]
    assert c["status"] == "ok" and c["runs"] == [2, 2]
    assert c["significant"] is False
    lo, hi = c["change_ci"]
    assert lo < 0 < hi
    assert c["answer"].startswith("against the baseline: no significant change")


def test_fault_pair_grows_its_cause_clear_of_zero(tmp_path):
    base = _report(tmp_path, "base", "clean-c8", "traces", bench_runs=(0, 1, 2))
    now = _report(tmp_path, "now", "host-delay", "traces", bench_runs=(0,), baseline=base)
    c = now["baseline_comparison"]
    host = next(r for r in c["rows"] if r["cause"] == "host")
    assert host["growth_ci"][0] > 0 and c["split"] == "shapley"
    # the windows' noise alone, widened by the model's error the lab measured (shipped record)
    w = host["growth_window_ci"]
    assert host["growth_ci"][0] <= w[0] < w[1] <= host["growth_ci"][1]
    assert host["growth_ci"][1] - host["growth_ci"][0] > w[1] - w[0]
    assert c["model_error"].startswith("the lab's PP2 CPU server")
    assert "the largest change is host work" in c["answer"]
    # one run on a side: its spread is unknown, and the answer says it may be noise
    assert c["significant"] is None and "one bench run on a side" in c["answer"]


# ---------------------------------------------------------------- helpers

def _sglang(tmp_path: Path, case: str, traces: str = "traces", bench_runs=None):
    src = LAB / case
    d = tmp_path / f"{case}-{traces}-rec"
    d.mkdir(exist_ok=True)
    bench = src / "bench.jsonl"
    if bench_runs is not None:
        lines = bench.read_text().splitlines()
        bench = d / "bench.jsonl"
        bench.write_text("".join(lines[i] + "\n" for i in bench_runs))
    out = d / "sglang.json"
    assert main(["sglang", "--log", str(src / "server.log"), "--traces", str(src / traces),
                 "--bench", str(bench), "--json", str(out)]) == 0
    return read_record(out)


def _dep(tmp_path: Path, case: str):
    rec = _sglang(tmp_path, case)
    return from_evidence(rec.payload.loop, concurrency=8, observed=220.0)


def _host_scaled(dep, k: float):
    blocks = resample.WindowBlocks(dep.blocks.count, tuple(
        {q: tuple((s * k, n) for s, n in b) if q in ("host", "host_empty") else b
         for q, b in r.items()} for r in dep.blocks.ranks), dep.blocks.hops)
    return replace(dep, host_us=tuple(k * v for v in dep.host_us),
                   empty_us=tuple(k * v for v in dep.empty_us), blocks=blocks)


def _as_server(dg, dep):
    """A ServerDiagnosis around `dg` with the fields observed_verdicts reads."""
    from dataclasses import fields
    from reports.model.report_type import ObservedLoop, ServerDiagnosis
    loop = ObservedLoop(dep.pp, dep.slots, dep.sizes, dep.device, dep.host_us, dep.relay_us,
                        dep.sync_wait_us, dep.send_wait_us, dep.hop_us, dep.graph_share,
                        dep.empty_us, (), dict(dep.sources), (), "")
    return ServerDiagnosis(status="ok", concurrency_source="", bench_run=None,
                           observed_source=None, deployment=loop, time_split=(),
                           **{f.name: getattr(dg, f.name) for f in fields(dg)})


def _report(tmp_path: Path, name: str, case: str, traces: str, bench_runs, baseline=None):
    _sglang(tmp_path, case, traces, bench_runs)
    d = tmp_path / name
    d.mkdir()
    shutil.copy(tmp_path / f"{case}-{traces}-rec" / "sglang.json", d / "sglang.json")
    argv = ["report", "--results", str(d), "--no-cache"]
    if baseline is not None:
        argv += ["--baseline", str(baseline)]
    assert main(argv) == 0
    return json.loads((d / "report.json").read_text()) if baseline is not None else \
        d / "report.json"


def test_sizes_plan_rounds_measure_the_labs_own_noise():
    from microbench.sglang_lab.cases import sizes_plan
    one = [c.name for g in sizes_plan(2) for c in g.cases]
    assert "clean-c8" in one and not any("control" in n for n in one)
    plan = sizes_plan(2, rounds=3)
    assert len(plan) == 3
    for k, g in enumerate(plan, 1):
        clean, control, *faults = g.cases
        assert (clean.name, clean.baseline) == (f"clean-c8.{k}", "")
        assert (control.name, control.baseline, control.fault) == (f"control-c8.{k}",
                                                                   clean.name, "")
        assert faults and all(c.baseline == clean.name and c.fault for c in faults)
        assert all(c.reps >= 2 for c in g.cases)     # a spread on both sides of each pair
