"""Sizes that hold: per-rank empty visits, the baseline change split by one Shapley split over
what differs, the forward-time row, the traced window checked against C, shares for people.

Hand-made deployments (the model's own inputs) and the lab's recordings of SGLang 0.5.23's PP2
CPU server (tests/fixtures/sglang_lab/, see tests/test_sglang_lab_fixtures.py): `host-delay` is
a host delay on rank 0; the `slow-stage` recording's traced window ran after the benchmark's
load had drained to one request (every decode forward at bs = 1 against C = 8), a window that
is not the benchmark's load.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from types import SimpleNamespace

from reports.base.payloads.sglang import SglangData
from reports.base.schema import from_json
from reports.cli import main
from reports.model.change_split import deployment_of, mixed, split_change
from reports.model.compare import compare
from reports.model.observed.deployment import (OBSERVED_CAUSES, Deployment, at_size, from_evidence, loop_config, run,
                                      window_differs)
from reports.model.observed.diagnose import worded
from reports.model.report_type import ObservedLoop

LAB = Path(__file__).parent / "fixtures" / "sglang_lab"


def _dep(**kw) -> Deployment:
    base = dict(pp=2, slots=2, sizes=(4, 4), forward=({4: 1000.0},) * 2,
                forward_busy=({4: 1000.0},) * 2, host_us=(200.0, 200.0), relay_us=(0.0, 0.0),
                sync_wait_us=(0.0, 0.0), empty_us=(0.0, 0.0), empty_relay_us=(0.0, 0.0),
                hop_us=(50.0, 50.0), send_wait_us=(0.0, 0.0), graph_share=0.0, concurrency=8,
                observed_tok_per_s=None, device="cpu", send_us=(0.0, 0.0),
                process_us=(0.0, 0.0))
    base.update(kw)
    return Deployment(**base)


def _loop(case: str, tmp_path: Path):
    d = LAB / case
    out = tmp_path / f"{case}.json"
    assert main(["sglang", "--log", str(d / "server.log"), "--traces", str(d / "traces"),
                 "--bench", str(d / "bench.jsonl"), "--json", str(out)]) == 0
    return from_json(SglangData, json.loads(out.read_text())["data"]).loop


def test_empty_visits_are_costed_per_rank(tmp_path):
    # SGLang runs the whole visit on an empty slot on every rank (event_loop_pp): each rank's
    # own empty-visit cost, not rank 0's for all
    loop = _loop("host-delay", tmp_path)
    dep = from_evidence(loop, concurrency=8, observed=None)
    r0, r1 = (loop.ranks[r].host_us_empty_mean for r in ("0", "1"))
    assert r0 != pytest.approx(r1, rel=0.5)            # the recording: rank 0 delayed
    assert dep.empty_us == pytest.approx((r0, r1))
    cfg, _ = loop_config(dep, frozenset(OBSERVED_CAUSES))
    assert cfg.cpu("empty_us", 0) == pytest.approx(r0) and cfg.cpu("empty_us", 1) == pytest.approx(r1)
    assert cfg.cpu("empty_us", 1) == 0.0 or loop_config(dep, frozenset())[0].cpu("empty_us", 1) == 0.0


def test_a_costly_empty_visit_on_the_last_rank_lengthens_the_step():
    # one micro-batch in two slots: every round holds an empty visit on each rank
    base = _dep(sizes=(8, 0), forward=({8: 1000.0},) * 2, forward_busy=({8: 1000.0},) * 2)
    slow = replace(base, empty_us=(0.0, 5000.0))
    on = frozenset(OBSERVED_CAUSES)
    assert run(slow, on).tpot_ms > run(base, on).tpot_ms + 2.5    # 2.5 -> 6.2 ms


def test_the_change_is_one_shapley_split_over_what_differs():
    base = _dep()
    now = _dep(host_us=(200.0, 4200.0), forward=({4: 1000.0}, {4: 1500.0}),
               forward_busy=({4: 1000.0}, {4: 1500.0}))
    parts, m_base, m_now = split_change(now, base)
    assert m_base == pytest.approx(run(base, frozenset(OBSERVED_CAUSES)).tpot_ms)
    assert m_now == pytest.approx(run(now, frozenset(OBSERVED_CAUSES)).tpot_ms)
    assert sum(parts.values()) == pytest.approx(m_now - m_base)     # efficient
    assert set(k for k, v in parts.items() if abs(v) > 1e-9) <= {"host", "slow_stage"}
    assert parts["host"] > parts["slow_stage"] > 0
    # the mixed loops at the two ends are the runs themselves
    assert mixed(now, base, frozenset()).host_us == base.host_us
    assert mixed(now, base, frozenset(OBSERVED_CAUSES)).forward == now.forward


def _view(dep: Deployment) -> ObservedLoop:
    return ObservedLoop(dep.pp, dep.slots, dep.sizes, dep.device, dep.host_us, dep.relay_us,
                        dep.sync_wait_us, dep.send_wait_us, dep.hop_us, dep.graph_share,
                        dep.empty_us, tuple({str(b): v for b, v in c.items()} for c in dep.forward),
                        {}, (), "", tuple({str(b): v for b, v in c.items()}
                                          for c in dep.forward_busy),
                        dep.empty_relay_us, dep.send_us, dep.process_us, 8.0)


def test_a_large_host_fault_is_sized_by_the_joint_split(tmp_path):
    from reports.model.observed.diagnose import diagnose
    from reports.model.report_type import ServerDiagnosis
    from dataclasses import fields
    base_dep = _dep()
    now_dep = _dep(host_us=(200.0, 20200.0), empty_us=(0.0, 20000.0))

    def sd(dep):
        dg = diagnose(replace(dep, observed_tok_per_s=8 / run(dep, frozenset(OBSERVED_CAUSES)).tpot_ms
                              * 1e3))
        return ServerDiagnosis(status="ok", concurrency_source="given", bench_run=None,
                               observed_source="given", deployment=_view(dep), time_split=(),
                               **{f.name: getattr(dg, f.name) for f in fields(dg)})
    c = compare(sd(now_dep), sd(base_dep), "b")
    assert c.split == "shapley"
    delta = c.step_ms - c.baseline_step_ms
    host = next(r for r in c.rows if r.cause == "host")
    assert host.growth_ms == pytest.approx(delta, rel=0.01)   # the model is the run: all host
    assert sum(r.growth_ms for r in c.rows) == pytest.approx(delta)
    # the forward row: per rank, the forward at the same size then and now
    assert [(f.rank, f.batch, f.change_pct) for f in c.forward_rows] == [(0, 4, 0.0), (1, 4, 0.0)]
    assert deployment_of(None, 8) is None


def test_forward_time_is_a_row_of_the_baseline_comparison(tmp_path):
    clean = tmp_path / "clean"
    for case, res, extra in (("clean-c8", clean, []),
                             ("host-delay", tmp_path / "hd", ["--baseline",
                                                              str(clean / "report.json")])):
        d = LAB / case
        res.mkdir()
        assert main(["sglang", "--log", str(d / "server.log"), "--traces", str(d / "traces"),
                     "--bench", str(d / "bench.jsonl"), "--json", str(res / "sglang.json")]) == 0
        assert main(["report", "--results", str(res), *extra]) == 0
    c = json.loads((tmp_path / "hd" / "report.json").read_text())["baseline_comparison"]
    base = json.loads((clean / "report.json").read_text())["diagnosis"]["deployment"]
    now = json.loads((tmp_path / "hd" / "report.json").read_text())["diagnosis"]["deployment"]
    rows = c["forward_rows"]
    assert rows and c["split"] == "shapley"
    for r in rows:    # clean traced 2 and 6, host-delay 1 and 7: compared at 2 and 6
        b = r["batch"]
        cb, cn = ({int(k): v for k, v in x["forward_us"][r["rank"]].items()} for x in (base, now))
        assert max(min(cb), min(cn)) <= b <= min(max(cb), max(cn))
        assert r["baseline_us"] == pytest.approx(at_size(cb, b))
        assert r["now_us"] == pytest.approx(at_size(cn, b))
    assert "Forward time" in (tmp_path / "hd" / "report.md").read_text()


def test_a_window_that_is_not_the_benchmark_says_so_first(tmp_path):
    res = tmp_path / "ss"
    res.mkdir()
    d = LAB / "slow-stage"
    assert main(["sglang", "--log", str(d / "server.log"), "--traces", str(d / "traces"),
                 "--bench", str(d / "bench.jsonl"), "--json", str(res / "sglang.json")]) == 0
    assert main(["report", "--results", str(res)]) == 0
    rep = json.loads((res / "report.json").read_text())
    first = next(a for a in rep["answer"] if a.startswith("Your server"))
    assert "the traced window is not the benchmark's load" in first.split(":", 1)[1][:60]
    assert "C=8" in first
    # the served model is not the scenario's MoE model: no Kimi roofline for unseen sizes
    assert "kimi" not in rep["diagnosis"]["deployment"]["shape"].lower()
    # a window at the benchmark's load says nothing of the kind
    assert window_differs(7.4, 8, [1, 7]) is None
    assert "about 1 request" in window_differs(1.0, 8, [1])


def test_a_cause_that_is_most_of_the_step_is_its_share():
    assert worded(97.0, 100.0).startswith("97% of the decode step")
    assert "slower" not in worded(97.0, 100.0)
    assert worded(10.0, 100.0).startswith("makes the server 11% slower")


def test_the_lab_window_waits_for_c_admitted_requests(monkeypatch):
    # SGLang 0.5.23's log lines (the lab's recordings): rank 0's Prefill lines count the
    # admitted requests; the window opens once C + 1 (bench_serving's warm-up first) are in,
    # then `lines` decode lines later
    from microbench.sglang_lab import drive
    from microbench.sglang_lab.venv import LabError
    pre = ("[2026-12-05 03:00:46 PP0] Prefill batch, #new-seq: {n}, #new-token: 22, "
           "#cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0\n")
    dec = ("[2026-12-05 03:00:47 PP0] Decode batch, #running-req: 1, #token: 23, token "
           "usage: 0.00, cpu graph: False, gen throughput (token/s): 0.79, #queue-req: 0\n")
    script = [pre.format(n=1) + dec * 20, pre.format(n=4), pre.format(n=4) + dec, dec * 3, dec]

    class Server:
        calls = 0
        spec = SimpleNamespace(recipe=True)     # started with ppscope's recipe (server.py)

        def log_text(self, since=0):
            self.calls += 1
            return "".join(script[:min(self.calls, len(script))])[since:]
    monkeypatch.setattr(drive.time, "sleep", lambda s: None)
    s = Server()
    drive.wait_load(s, 0, concurrency=8, lines=4, timeout_s=5)
    assert s.calls == 5          # not at the warm-up's 20 decode lines: once 9 were admitted
    s = Server()
    script[:] = [pre.format(n=1) + dec * 50]
    with pytest.raises(LabError):
        drive.wait_load(s, 0, concurrency=8, lines=4, timeout_s=0.05)
