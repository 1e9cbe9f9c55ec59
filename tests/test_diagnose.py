"""Diagnosis from evidence: the per-iteration loop profile (microbench/sglang/steps.py), the
observed deployment (reports/model/observed/deployment.py) and its Shapley diagnosis (diagnose.py).

Hand-made events give exact numbers; the recorded fixtures (tests/fixtures/traces/faults/: 45 ms
windows of the PP-loop probe's own traces on 2x H200, one clean run and three with an injected
fault, see that folder's README) check that each fault is found from its evidence alone."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from microbench.sglang.steps import loop_profile, read_loop, summarize_steps
from reports.base.model_config import load_model
from reports.base.payloads.sglang import LoopProfile
from reports.base.schema import from_json
from reports.model.observed.deployment import (OBSERVED_CAUSES, Deployment, from_evidence, loop_config,
                                      moe_shape, run)
from reports.model.observed.diagnose import NAME_PCT, diagnose
from reports.model.causes import SCENARIO
from reports.model.scenario.loop_builder import switched_sizes
from reports.model.sim.pipeline_model import simulate

FAULTS = Path(__file__).parent / "fixtures" / "traces" / "faults"
CASES = Path(__file__).parent / "fixtures" / "h200x2" / "fault_cases"


def _rank(kernels, recvs, rt, ranges, rank, syncs=(), relay=()):
    return summarize_steps(kernels, recvs, rt, list(syncs), ranges, hidden=10, rank=rank,
                           relay=relay)


def test_loop_profile_splits_each_wait_exactly():
    # rank 0: iteration at 0 (process 0..50, run_batch 50..100), forward kernels 100..400 launched
    # at 90; a second iteration at 1000 whose forward waits for tokens received 900..950
    # (rank 1's forward ended at 920): input on the GPU at 950, CPU ready at 1000, blocked in a
    # sync 1000..1030, launch at 1100, kernel at 1150 (queue 50, no send running: foreign)
    k0 = [(100.0, 400.0, 1, True, False, False), (1150.0, 1450.0, 2, True, False, False),
          (900.0, 950.0, 9, False, True, True)]
    r0 = {"process_batch_result": [(0.0, 50.0), (1000.0, 1040.0)],
          "run_batch": [(50.0, 100.0), (1040.0, 1120.0)]}
    a = _rank(k0, [(900.0, 950.0, 8 * 8, 4)], {1: (90.0, False), 2: (1100.0, True)}, r0, 0,
              syncs=[(1000.0, 1030.0)])
    # rank 1: receives hidden states 400..420 (rank 0's forward ended at 400), forward 425..920
    k1 = [(425.0, 920.0, 5, True, False, False), (390.0, 420.0, 8, False, True, True)]
    r1 = {"recv_requests": [(0.0, 380.0)], "run_batch": [(380.0, 430.0)]}
    b = _rank(k1, [(390.0, 420.0, 2 * 4 * 10, 4 * 10)], {5: (385.0, False)}, r1, 1)
    prof = loop_profile({0: a, 1: b})
    r0p, r1p = prof["ranks"]["0"], prof["ranks"]["1"]
    assert r0p["forwards"] == 2 and r0p["graph_forwards"] == 1
    # first forward: CPU ready at its iteration's start (0), launch at 90: 90 of host work;
    # second: ready = max(950, 400, 1000) = 1000; 1100 - 1000 - 30 blocked = 70 host
    assert r0p["host_us_mean"] == pytest.approx((90.0 + 70.0) / 2)
    assert r0p["sync_wait_us_mean"] == pytest.approx(30.0 / 2)
    assert r0p["foreign_queue_us_mean"] == pytest.approx((10.0 + 50.0) / 2)
    # 495 us of kernels + 5 us between its input (420) and its first kernel (425)
    assert r1p["forward_effective_us_by_batch"] == {"4": pytest.approx(500.0)}
    assert prof["hops"]["0->1"]["mean_us"] == pytest.approx(20.0)   # 400 -> 420
    assert prof["hops"]["1->0"]["mean_us"] == pytest.approx(30.0)   # 920 -> 950
    ts = r0p["time_split"]
    assert ts["window_us"] == pytest.approx(1350.0) and ts["compute_us"] == pytest.approx(600.0)
    assert ts["idle_us"] == pytest.approx(1350.0 - 650.0)
    assert "_fwds" not in r0p and "_syncs" not in r0p   # raw lists never reach the record


def test_herd_off_is_one_rule_for_the_observed_loop_and_the_scenario():
    """pp 4, depth 1 (5 slots), every slot occupied: the same 10 requests in 5 equal
    micro-batches on both pipelines (the observed loop spread them over 4 and idled a slot)."""
    off = frozenset(set(OBSERVED_CAUSES) - {"herd"})
    four = ({1: 100.0, 2: 150.0, 3: 200.0, 4: 250.0},) * 4
    dep = _dep(pp=4, slots=5, sizes=(4, 1, 1, 1, 3), forward=four, forward_busy=four,
               host_us=(0.0,) * 4, relay_us=(0.0,) * 4, sync_wait_us=(0.0,) * 4,
               empty_us=(0.0,) * 4, empty_relay_us=(0.0,) * 4, hop_us=(0.0,) * 4,
               send_wait_us=(0.0,) * 4, concurrency=10)
    _, observed = loop_config(dep, off)
    assert observed == [2, 2, 2, 2, 2]
    assert switched_sizes([4, 1, 1, 1, 3], frozenset(SCENARIO) - {"herd"}, 4) == observed
    # an even split is its own herd-off: the herd then costs nothing
    even = replace(dep, sizes=(2, 2, 2, 2, 2))
    assert loop_config(even, off)[1] == [2, 2, 2, 2, 2]
    # fewer occupied slots than stages: one micro-batch per stage, evenly spaced
    assert loop_config(replace(dep, sizes=(8, 0, 0, 0, 0)), off)[1] == [2, 2, 2, 2, 0]


def test_herd_off_of_the_labs_depth_1_recording():
    """The lab's PP2 server at depth 1 (3 slots, tests/fixtures/sglang_lab/whatif/wi-d1-c8):
    its log admitted the burst of 8 as 1, 2 and 5 into all three slots; with the herd off both
    pipelines run those 8 in three micro-batches of 3, 3 and 2 (the observed one ran 4 and 4
    and left a slot idle)."""
    from microbench.sglang.arrival_bursts import bursts
    from reports.base.slots import herd_off_sizes
    from reports.model.observed.bursts import wave_slot_sizes
    log = Path(__file__).parent / "fixtures" / "sglang_lab" / "whatif" / "wi-d1-c8" / "server.log"
    burst = next(b for b in bursts(log.read_text(errors="replace").splitlines())
                 if b["requests"] == 8)
    sizes = wave_slot_sizes([tuple(w) for w in burst["waves"]], 3)
    assert sizes == (1, 2, 5)
    assert herd_off_sizes(sizes, 2) == (3, 3, 2)
    assert switched_sizes(sizes, frozenset(), 2) == [3, 3, 2]


def _dep(**kw) -> Deployment:
    base = dict(pp=2, slots=4, sizes=(8, 0, 0, 0), forward=({8: 1000.0, 4: 600.0},) * 2,
                forward_busy=({8: 1000.0, 4: 600.0},) * 2, host_us=(200.0, 0.0),
                relay_us=(0.0, 0.0), sync_wait_us=(0.0, 0.0), empty_us=(0.0, 0.0), empty_relay_us=(0.0, 0.0),
                hop_us=(50.0, 50.0), send_wait_us=(0.0, 0.0), graph_share=1.0, concurrency=8,
                observed_tok_per_s=None)
    base.update(kw)
    return Deployment(**base)


def test_model_of_the_observed_loop_closed_form():
    # one slot of 8: step = host 200 + 1000 + hop 50 + 1000 + hop 50 = 2300 us
    r = run(_dep(), frozenset(OBSERVED_CAUSES))
    assert r.tpot_ms == pytest.approx(2.3)
    # herd off: 2 slots of 4 (slots 0 and 2): rank 0 runs host+600 twice per 2300-us round trip
    cfg, sizes = loop_config(_dep(), frozenset(set(OBSERVED_CAUSES) - {"herd"}))
    assert sizes == [4, 0, 4, 0]
    assert simulate(cfg, sizes).tpot_ms == run(_dep(), frozenset(set(OBSERVED_CAUSES) - {"herd"})).tpot_ms


def test_diagnosis_rows_add_up_and_name_the_largest():
    g = diagnose(_dep(observed_tok_per_s=3000.0))
    assert sum(r.ms_per_step for r in g.rows) == pytest.approx(g.modelled_step_ms -
                                                               g.reference_step_ms)
    assert g.unexplained_ms == pytest.approx(8 / 3000 * 1e3 - g.modelled_step_ms)
    assert g.rows[0].cause == "herd" and g.named[0] == "herd"
    assert g.answer.startswith("thundering herd")
    # a balanced, graph-captured, even loop with no host names nothing
    calm = _dep(sizes=(4, 0, 4, 0), host_us=(0.0, 0.0), hop_us=(0.0, 0.0))
    assert diagnose(calm).answer.startswith("nothing big") and NAME_PCT == 10.0


def test_slow_stage_is_kernels_not_launch_gaps():
    # rank 1's forward spans 1500 us but its kernels take 1000: launch gaps, not a slow stage
    d = _dep(sizes=(4, 0, 4, 0), host_us=(0.0, 0.0), hop_us=(0.0, 0.0),
             forward=({4: 1000.0}, {4: 1500.0}), forward_busy=({4: 1000.0}, {4: 1000.0}))
    rows = {r.cause: r for r in diagnose(d).rows}
    assert rows["slow_stage"].ms_per_step == pytest.approx(0.0, abs=1e-9)
    assert rows["launch_gaps"].ms_per_step > 0.9


def _tok(case: str, policy: str) -> float:
    d = json.loads((CASES / case / "dispatch.json").read_text())["data"]
    return next(r["tok_per_s"] for r in d["runs"] if r["policy"] == policy
                and r["concurrency"] == 8)


def _diag(case: str, policy: str):
    lp = read_loop({r: FAULTS / f"{case}-{policy}-c8-TP-0-PP-{r}.trace.json.gz" for r in (0, 1)},
                   hidden=load_model("kimi-k2").hidden, link_gbps=390.0)
    shape = moe_shape(load_model("kimi-k2"))
    dep = from_evidence(lp, concurrency=8, observed=_tok(case, policy), shape=shape)
    return dep, diagnose(dep, shape)


# The fixtures were recorded with the PP-loop probe before it followed SGLang's loop order
# (it returned the sampled tokens at once instead of holding them async_depth iterations on the
# last rank). The pipeline model now holds them as SGLang 0.5.23 does (scheduler_pp_mixin.py,
# _pp_send_output_to_next_stage): behind a 510 us hop that hold costs the modelled loop what the
# old probe never paid. Re-recording with the current probe (docs/runs/h200x2-model) settles it.
# strict: the day this case is modelled within 10% (re-recorded, or the model changed), the
# expected failure turns into a failure to look at, not a silent pass
_OLD_PROBE = pytest.mark.xfail(reason="recorded before the probe held outputs as SGLang does",
                               strict=True)


@pytest.mark.parametrize("case,policy", [("base", "even"), ("base", "sglang"),
                                         ("host-delay", "even"),
                                         pytest.param("hop-delay", "even", marks=_OLD_PROBE)])
def test_recorded_runs_are_modelled_within_10_percent(case, policy):
    dep, g = _diag(case, policy)
    assert abs(g.unexplained_pct) < 10, g.unexplained_pct
    assert dep.slots == 4 and dep.pp == 2


def test_recorded_faults_are_found_from_their_evidence():
    clean = {r.cause: r.ms_per_step for r in _diag("base", "even")[1].rows}
    dep, herd = _diag("base", "sglang")
    assert dep.sizes == (8, 0, 0, 0) and herd.rows[0].cause == "herd"
    _, host = _diag("host-delay", "even")       # +1000 us per rank-0 visit with a batch
    assert host.rows[0].cause == "host"
    assert {r.cause: r.ms_per_step for r in host.rows}["host"] - clean["host"] > 1.0
    dep, hop = _diag("hop-delay", "even")      # every hidden-state send 500 us late
    assert 450 < dep.hop_us[0] < 600
    assert {r.cause: r.ms_per_step for r in hop.rows}["hop"] - clean["hop"] > 0.5


def test_no_loop_profile_is_a_reason_not_a_crash():
    from reports.model.observed.deployment import NoLoopEvidence
    with pytest.raises(NoLoopEvidence, match="--traces"):
        from_evidence(None, concurrency=8, observed=None)


def test_cpu_costs_scaled_to_an_unprofiled_tok_s():
    # the SGLang-order clean run's own traces (profiled, 1211 tok/s) against a faster tok/s as
    # a bench_serving run without the profiler would give: the CPU factor found makes the
    # model meet it, and the corrected split shrinks the CPU rows, never the GPU ones
    from reports.model.observed.diagnose import cpu_scaled
    root = CASES.parent / "sglang_order"
    d = json.loads((root / "diag-even-c8-sglang.json").read_text())["data"]
    shape = moe_shape(load_model("kimi-k2"))
    loop = from_json(LoopProfile, d["loop"], "loop")
    dep = from_evidence(loop, concurrency=8, observed=1800.0, shape=shape)
    g = diagnose(dep, shape)
    assert g.unexplained_pct < -NAME_PCT and g.cpu_scale is not None and 0 < g.cpu_scale < 1
    step = run(cpu_scaled(dep, g.cpu_scale), frozenset(OBSERVED_CAUSES), shape).tpot_ms
    assert step == pytest.approx(8 / 1800.0 * 1e3, rel=1e-3)
    before = {r.cause: r.ms_per_step for r in g.rows}
    after = {r.cause: r.ms_per_step for r in g.corrected_rows}
    assert after["relay"] < before["relay"] and g.corrected_answer in g.caveats[-1]
    # within 10% of the observation: no correction
    same = diagnose(from_evidence(loop, concurrency=8, observed=1211.0, shape=shape), shape)
    assert same.cpu_scale is None and same.corrected_rows == ()
