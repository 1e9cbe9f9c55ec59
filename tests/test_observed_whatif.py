"""What-ifs of the model of the observed loop (reports/model/observed/bench_run.py): bench_serving's
closed-loop run over the observed loop, round by round, with SGLang's admission rule.

Hand-made loops whose round time is known (each case works the number out), and the lab's
helpers (reports/lab/whatifs.py) on log lines in SGLang 0.5.23's own format."""
from __future__ import annotations

from dataclasses import replace

import pytest

from reports.model.observed import bench_run as ow
from reports.model.settings_change import Change
from reports.model.observed.bursts import wave_slot_sizes, wave_visits
from reports.model.observed.deployment import Deployment


def _dep(sizes=(6, 2), slots=2, fwd=None, **kw) -> Deployment:
    fwd = fwd or {1: 1000.0, 8: 1000.0}
    base = dict(pp=2, slots=slots, sizes=tuple(sizes), forward=(fwd, fwd), forward_busy=(fwd, fwd),
                host_us=(0.0, 0.0), relay_us=(0.0, 0.0), sync_wait_us=(0.0, 0.0), empty_us=(0.0, 0.0),
                empty_relay_us=(0.0, 0.0), hop_us=(0.0, 0.0), send_wait_us=(0.0, 0.0),
                graph_share=None, concurrency=sum(sizes), observed_tok_per_s=None,
                device="cpu", send_us=(0.0, 0.0), process_us=(0.0, 0.0))
    base.update(kw)
    return Deployment(**base)


SERVER = ow.observed_settings(pp=2, depth=0, cap=1024, rows=2048, chunk=4096)


def test_one_stream_runs_one_token_per_round():
    # C = 1: each request is admitted (a prefill visit), then decodes once per round; the
    # round of one 1-request slot on two ranks with 1 ms forwards and nothing else is 2 ms
    dep = _dep(sizes=(1, 0))
    rounds = ow._Rounds(dep, 2)
    assert rounds((1, 0)) == pytest.approx(2000.0)
    r = ow.bench_run(dep, SERVER, ow.Load(1, 4, 128, 64))
    # 4 requests x (127 decode rounds + the prefill visit), back to back
    assert r.tok_per_s == pytest.approx(4 * 128 / (4 * 128 * 2000e-6), rel=0.02)
    assert r.mean_in_flight == pytest.approx(1.0, abs=0.02)
    assert r.prefill_visits == 4


def test_the_last_wave_runs_below_C():
    # 2C + 2 prompts at C = 8: waves of 8, 8 and 2, so fewer than C in flight on average
    r = ow.bench_run(_dep(), SERVER, ow.Load(8, 18, 128, 64))
    assert 5.5 < r.mean_in_flight < 7.0
    steady = ow.steady_tok_per_s(_dep())
    assert r.tok_per_s < 0.85 * steady


def test_the_cap_splits_a_group_over_the_next_slot():
    s2, _ = ow.apply(SERVER, ow.Load(8, 18, 128), Change("--pp-max-micro-batch-size", 4))
    assert ow.cap_now(s2) == 4
    r = ow.bench_run(_dep(), s2, ow.Load(8, 18, 128, 64))
    assert r.steady_sizes == (4, 4)
    # before: the observed groups as they were
    assert ow.bench_run(_dep(), SERVER, ow.Load(8, 18, 128, 64)).steady_sizes == (6, 2)


def test_max_running_requests_moves_the_default_cap_and_queues_the_rest():
    s2, _ = ow.apply(SERVER, ow.Load(8, 18, 128), Change("--max-running-requests", 4))
    assert ow.cap_now(s2) == 2          # SGLang: pp_max_micro_batch_size = rows // pp
    r = ow.bench_run(_dep(), s2, ow.Load(8, 18, 128, 64))
    assert r.steady_sizes == (2, 2)
    before = ow.bench_run(_dep(), SERVER, ow.Load(8, 18, 128, 64))
    # forwards cost the same at any size here: 4 running instead of 8 roughly halves tok/s
    assert 0.4 < r.tok_per_s / before.tok_per_s < 0.65
    # an explicit cap stays
    s3, _ = ow.apply(ow.observed_settings(2, cap=3, rows=2048), ow.Load(8, 18, 128),
                     Change("--max-running-requests", 4))
    assert ow.cap_now(s3) == 3


def test_a_small_prefill_budget_admits_one_prompt_per_visit():
    load = ow.Load(8, 18, 128, 64)
    s2, _ = ow.apply(SERVER, load, Change("--chunked-prefill-size", 64))
    r = ow.bench_run(_dep(), s2, load)
    assert r.prefill_visits == 18     # one per prompt
    base = ow.bench_run(_dep(), SERVER, load)
    assert base.prefill_visits < 8    # groups share one
    assert r.tok_per_s < base.tok_per_s   # every prefill visit holds its slot's decode


def test_paced_arrivals_spread_over_the_slots():
    load = ow.Load(8, 18, 128, 64)
    _, l2 = ow.apply(SERVER, load, Change("--request-rate", 16.0))
    # 10 ms forwards: a request lasts ~2.6 s, its successors' arrivals 62.5 ms apart do not
    # outlast it (a fast loop would run them one by one)
    slow = _dep(sizes=(8, 0), fwd={1: 10000.0, 8: 10000.0})
    r = ow.bench_run(slow, SERVER, l2)
    assert r.steady_sizes == (4, 4)
    assert ow.bench_run(slow, SERVER, load).steady_sizes == (8, 0)


def test_more_slots_hold_as_many_groups_as_before_per_slot():
    s2, _ = ow.apply(SERVER, ow.Load(8, 18, 128), Change("--pp-async-batch-depth", 1))
    assert s2.slots == 3
    r = ow.bench_run(_dep(), s2, ow.Load(8, 18, 128, 64))
    assert sorted(r.steady_sizes) == [2, 3, 3]   # every slot holds a group, as observed


def test_unknown_setting_is_an_error():
    with pytest.raises(ValueError, match="unknown setting"):
        ow.apply(SERVER, ow.Load(1, 4, 128), Change("--tp-size", 2))


# SGLang 0.5.23's own lines (tests/fixtures/sglang_lab/*/server.log), times changed
_DEC = ("[2026-12-01 22:25:43 PP{r}] Decode batch, #running-req: {n}, #token: 189, token "
        "usage: 0.01, cpu graph: False, gen throughput (token/s): {thr:.2f}, #queue-req: 0, ")


def _log(inside_ms: float, outside_ms: float, n: int = 4) -> str:
    out = []
    for r in (0, 1):
        out += [_DEC.format(r=r, n=n, thr=n / outside_ms * 1e3)] * 8
    out.append("[2026-12-01 22:26:20 PP0] Profiling starts. Traces will be saved to: x "
               "(with profile id: 1)")
    out.append("[2026-12-01 22:26:20 PP1] Profiling starts. Traces will be saved to: x "
               "(with profile id: 1)")
    for r in (0, 1):
        out += [_DEC.format(r=r, n=n, thr=n / inside_ms * 1e3)] * 6
    out.append("[2026-12-01 22:26:25 PP0] Profiling done. Traces are saved to: x")
    out.append("[2026-12-01 22:26:25 PP1] Profiling done. Traces are saved to: x")
    for r in (0, 1):
        out += [_DEC.format(r=r, n=n, thr=n / outside_ms * 1e3)] * 8
    return "\n".join(out)


def test_profiler_slowdown_from_the_decode_lines():
    from microbench.sglang.profiler_cost import slowdown
    assert slowdown(_log(24.0, 20.0).splitlines()) == pytest.approx(1.2, rel=1e-3)
    # no window, or no line outside it at the window's sizes: nothing to say
    assert slowdown(_log(24.0, 20.0).split("Profiling starts")[0].splitlines()) is None
    only_other_sizes = [ln.replace("#running-req: 4", "#running-req: 3")
                        if "22:25:43" in ln and "gen throughput (token/s): 200.00" in ln else ln
                        for ln in _log(24.0, 20.0).splitlines()]
    assert slowdown(only_other_sizes) is None


def test_profiler_slowdown_interval_holds_it_and_widens_with_jitter():
    from microbench.sglang.profiler_cost import SlowdownReader
    steady = SlowdownReader()
    for ln in _log(24.0, 20.0).splitlines():
        steady.feed(ln)
    lo, hi = steady.interval(0.9, 100, 5)
    assert lo == pytest.approx(1.2, rel=1e-3) and hi == pytest.approx(1.2, rel=1e-3)
    # visits that vary inside the window: an interval around the slowdown, wider with the spread
    jitter = [ln.replace("(token/s): 166.67", "(token/s): %.2f" % (4000 / (24 + (i % 5 - 2) * k)))
              for k in (1.0, 4.0) for i, ln in enumerate(_log(24.0, 20.0).splitlines())]
    half = len(jitter) // 2
    widths = []
    for part in (jitter[:half], jitter[half:]):
        r = SlowdownReader()
        for ln in part:
            r.feed(ln)
        lo, hi = r.interval(0.9, 100, 5)
        assert lo <= r.result() <= hi and lo < hi
        widths.append(hi - lo)
    assert widths[1] > widths[0]
    assert SlowdownReader().interval(0.9, 100, 5) is None          # no window: none


def test_the_change_a_lab_case_made():
    from reports.base.payloads.lab_case import CasePlan, LabCase
    from reports.lab.whatifs import change_of
    base = LabCase(CasePlan(8))
    assert change_of(LabCase(CasePlan(8, mmb=4)), base) == ("--pp-max-micro-batch-size", 4)
    assert change_of(LabCase(CasePlan(8, request_rate=16.0)), base) == ("--request-rate", 16.0)
    assert change_of(LabCase(CasePlan(8), extra_args=("--pp-async-batch-depth", "1")), base) == \
        ("--pp-async-batch-depth", 1)
    assert change_of(base, base) is None


# --------------------------------------------------------- the benchmark's own first burst

# SGLang 0.5.23's prefill line (tests/fixtures/sglang_lab/*/server.log), times changed
_PRE = ("[2026-12-02 16:29:29 PP{r}] Prefill batch, #new-seq: {n}, #new-token: {tok}, "
        "#cached-token: 3, token usage: 0.03, #running-req: {run}, #queue-req: 0, "
        "#pending-token: 0, cpu graph: False, input throughput (token/s): 6526.87")


def _burst_log() -> list[str]:
    """The default PP2 CPU server at C = 16 as the lab saw it: the benchmark's 16 prompts
    admitted as 1, 2, 6 (joining the 1) and 7 (joining the 2), groups of 7 and 9; their
    successors as 7 and 9; then the traced window, its own burst of 1, 14 and 1."""
    out = []
    for r in (0, 1):
        out += [_PRE.format(r=r, n=n, tok=64 * n, run=run)
                for n, run in ((1, 0), (2, 0), (6, 1), (7, 2))]
        out += [_DEC.format(r=r, n=n, thr=600.0) for n in (7, 9) * 4]
        out += [_PRE.format(r=r, n=n, tok=64 * n, run=0) for n in (7, 9)]
        out += [_DEC.format(r=r, n=n, thr=600.0) for n in (7, 9) * 4]
    out.append("[2026-12-02 16:29:47 PP0] Profiling starts. Traces will be saved to: x "
               "(with profile id: 1)")
    out += [_PRE.format(r=0, n=n, tok=64 * n, run=run) for n, run in ((1, 0), (14, 0), (1, 1))]
    out += [_DEC.format(r=0, n=n, thr=600.0) for n in (15, 1) * 4]
    out.append("[2026-12-02 16:29:53 PP0] Profiling done. Traces are saved to: x")
    out += [_PRE.format(r=0, n=2, tok=128, run=0)]
    return out


def test_bursts_are_the_prefills_between_decode_lines_outside_the_traced_window():
    from microbench.sglang.arrival_bursts import bursts
    b = bursts(_burst_log())
    assert [x["waves"] for x in b] == [[[1, 0], [2, 0], [6, 1], [7, 2]], [[7, 0], [9, 0]],
                                       [[2, 0]]]
    assert [x["requests"] for x in b] == [16, 16, 2]
    # rank 1 logs the same admission
    assert bursts(_burst_log(), rank="1")[:2] == b[:2]
    assert bursts([]) == [] and bursts(["not a log line"]) == []


def test_each_wave_lands_at_the_visit_its_slot_size_says():
    # 1 into an empty slot, then 7 into the slot holding 1: the next visit (slot 1, empty)
    # took nothing, the one after (slot 0) the 7: SGLang's 8-and-0 herd at C = 8
    assert wave_visits(((1, 0), (7, 1)), 2) == [0, 2]
    assert wave_visits(((1, 0), (2, 0), (6, 1), (7, 2)), 2) == [0, 1, 2, 3]
    # depth 1 (3 slots): 1, 4, then 11 joining the 1 (the third slot's visit took nothing)
    assert wave_visits(((1, 0), (4, 0), (11, 1)), 3) == [0, 1, 3]
    # a wave joining a slot size no slot has: not a burst from an empty server of 2 slots
    assert wave_visits(((1, 0), (7, 3)), 2) is None


def test_the_burst_gives_the_benchmarks_micro_batches():
    # the default PP2 server's burst at C = 16 (1, 2, 6 joining 1, 7 joining 2): 7 and 9
    assert wave_slot_sizes(((1, 0), (2, 0), (6, 1), (7, 2)), 2) == (7, 9)
    # depth 2 (4 slots): 1, 13 and 2 into three empty slots, the fourth left empty
    assert wave_slot_sizes(((1, 0), (13, 0), (2, 0)), 4) == (1, 13, 2, 0)
    assert wave_slot_sizes(((1, 0), (7, 3)), 2) is None and wave_slot_sizes((), 2) is None


def test_the_deployment_takes_its_micro_batches_from_the_benchmarks_burst():
    import json
    from pathlib import Path
    from reports.base.payloads.sglang import ArrivalBurst, LoopProfile
    from reports.base.schema import from_json
    from reports.model.observed.deployment import from_evidence
    # a PP2 loop traced on two H200s (4 slots: depth 2), its traced window's groups 4 and 4
    rec = (Path(__file__).parent / "fixtures" / "h200x2" / "sglang_order"
           / "diag-even-c8-sglang.json")
    loop = from_json(LoopProfile, json.loads(rec.read_text())["data"]["loop"], "loop")
    traced = from_evidence(loop, concurrency=8, observed=None)
    burst = ArrivalBurst(waves=((1, 0), (7, 1)), requests=8)    # 1, then 7 joining it
    other = ArrivalBurst(waves=((3, 0),), requests=3)
    dep = from_evidence(replace(loop, bursts=(other, burst)), concurrency=8, observed=None)
    assert traced.sizes == (4, 0, 4, 0) and traced.sources["sizes"] == "observed"
    assert dep.sizes == (8, 0, 0, 0) and dep.sources["sizes"].endswith("the benchmark's first burst)")
    assert any("8-0-0-0: the benchmark's first burst" in n for n in dep.notes)
    # a burst that does not fit the loop, or of another C: the traced window's groups
    odd = ArrivalBurst(waves=((1, 0), (7, 5)), requests=8)
    assert from_evidence(replace(loop, bursts=(odd, other)), concurrency=8,
                         observed=None).sizes == traced.sizes


def test_the_first_burst_gives_the_observed_groups_back_and_other_slot_counts_its_visits():
    load = ow.Load(8, 18, 128, 64, waves=((1, 0), (7, 1)))
    # the traced window held 6 and 2; the benchmark's burst made 8 and 0
    assert ow.bench_run(_dep(), SERVER, load).steady_sizes == (8, 0)
    assert ow.bench_run(_dep(), SERVER, ow.Load(8, 18, 128, 64)).steady_sizes == (6, 2)
    first = ow._first_waves(_dep(), SERVER, load)
    assert [(w.n, w.visit) for w in first] == [(1, 0), (7, 2)]
    # 3 slots: the same waves at visits 0 and 2, slots 0 and 2
    s3, _ = ow.apply(SERVER, load, Change("--pp-async-batch-depth", 1))
    assert sorted({w.visit % 3 for w in ow._first_waves(_dep(), s3, load)}) == [0, 2]
    # waves that do not add up to C (another run's burst) fall back to the traced groups
    other = ow.Load(8, 18, 128, 64, waves=((1, 0), (2, 0)))
    assert [(w.n, w.visit) for w in ow._first_waves(_dep(), SERVER, other)] == [(6, 0), (2, 1)]


def test_successors_of_a_group_arrive_together():
    # 7 and 9 finish together and come back as 7 and 9 (SGLang's log of the default server)
    load = ow.Load(16, 34, 128, 64, waves=((1, 0), (2, 0), (6, 1), (7, 2)))
    r = ow.bench_run(_dep(sizes=(14, 2)), SERVER, load)
    assert r.steady_sizes in ((7, 9), (9, 7))
