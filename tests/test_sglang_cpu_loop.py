"""SGLang's CPU backend and SGLang's real trace conventions, on hand-made events.

The rules checked here come from SGLang 0.5.23 (srt/managers/scheduler_pp_mixin.py
`event_loop_pp`, srt/utils/profile_utils.py) and c10d: `gloo:send` ranges are asynchronous
(open at isend, close when the send completes) and are not waiting, except where the thread
runs nothing until one closes (a commit that waited for its send); `gloo:recv` ranges
are blocking; a pass over all slots that ran nothing ends with one `scheduler.idle` range;
`step[DECODE bs=N]` gives the raw size on every rank; trace files are named
`{id}-TP-{t}[-PP-{p}][-EXTEND|-DECODE].trace.json.gz`, `merged-{id}...` mixes every rank.
Recorded SGLang traces (tests/fixtures/sglang_lab/) are checked in test_sglang_lab_fixtures.py.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from microbench.sglang import cpu_steps
from microbench.sglang.trace import TraceError, select_rank_files
from reports.model.sim.pipeline_model import LoopConfig, simulate


def _ev(ranges=(), steps=(), recvs=(), idle=()):
    r = {k: [] for k in cpu_steps.RANGES}
    for name, s, e in ranges:
        r[name].append((s, e))
    for v in r.values():
        v.sort()
    r["scheduler.idle"] = sorted(idle)
    return {"ranges": r, "steps": sorted(steps), "recvs": sorted(recvs), "gpu_events": 0}


def _iteration(t, fwd=None, bs=1, recv=(), gnb=100.0, proc=0.0, send=0.0, span=10_000.0):
    """One loop iteration starting at t: recv_requests, get_next_batch_to_run, [run_batch
    with its step span], [process_batch_result], [proxy send]."""
    rg = [("recv_requests", t, t + 50), ("get_next_batch_to_run", t + 60, t + 60 + gnb)]
    st = []
    c = t + 60 + gnb
    for a, b in recv:
        c = max(c, b)
    if fwd:
        rg.append(("run_batch", c, c + fwd))
        st.append((c + 10, c + fwd - 10, "DECODE", bs))
        c += fwd
    if proc:
        rg.append(("process_batch_result", c, c + proc))
        c += proc
    if send:
        rg.append(("send_proxy_dict_to_next_stage", c, c + send))
    return rg, st, t + span


def test_cpu_iteration_splits_into_forward_host_process_send_and_waits():
    ranges, steps, recvs = [], [], []
    t = 0.0
    for k in range(6):
        rcv = [(t + 200, t + 1200)]             # 1 ms blocked on the hidden states
        rg, st, t2 = _iteration(t, fwd=5000, bs=4, recv=rcv, proc=700, send=300)
        ranges += rg
        steps += st
        recvs += rcv
        t = t2
    ranges.append(("recv_requests", t, t + 50))
    d = cpu_steps.summarize(_ev(ranges, steps, recvs), rank=1)
    assert d["forwards"] == 6 and d["forward_count_by_batch"] == {"4": 6}
    assert d["forward_us_by_batch"] == {"4": 5000}
    assert d["process_us_mean"] == 700 and d["send_us_mean"] == 300
    assert d["wait_us_mean"]["input"] == 1000
    # 10 ms iteration - 5 ms forward - 1 ms blocked - 0.7 ms processing - 0.3 ms send = 3 ms
    assert d["host_us_mean"] == pytest.approx(3000)
    assert d["relay_wait_us_mean"] == 0.0      # waiting is never a cost


def test_async_gloo_send_ranges_are_not_waiting():
    # a gloo:send range covering the whole iteration (isend now, wait() next phase) changes
    # nothing: only gloo:recv ranges are collected as blocked time
    import gzip
    import json
    import tempfile
    evs = [{"ph": "X", "cat": "user_annotation", "name": n, "ts": s, "dur": d}
           for n, s, d in [("recv_requests", 0, 50), ("gloo:send", 60, 9000),
                           ("get_next_batch_to_run", 100, 2000), ("recv_requests", 10_000, 50)]]
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "t.json.gz"
        with gzip.open(p, "wt") as f:
            json.dump({"traceEvents": evs}, f)
        ev = cpu_steps.collect(p)
    assert ev["recvs"] == [] and ev["ranges"]["get_next_batch_to_run"] == [(100.0, 2100.0)]
    # the thread went on 940 us after the send ended: not waiting for it
    assert ev["commits"] == []


def _trace(tmp_path, evs) -> dict:
    import gzip
    import json
    p = tmp_path / "t.json.gz"
    with gzip.open(p, "wt") as f:
        json.dump({"traceEvents": [{"ph": "X", "cat": c, "name": n, "ts": s, "dur": d}
                                   for c, n, s, d in evs]}, f)
    return cpu_steps.collect(p)


def test_a_commit_that_waits_for_its_send_is_waiting_not_host_work(tmp_path):
    # SGLang's empty visit on rank 0 (the lab's PP2 server, depth 1, C = 1): recv_requests,
    # then nothing at all until the previous request list's gloo send completes (the next rank
    # was in its forward and had not posted the receive), then the next send at once
    ua = "user_annotation"
    evs = []
    for k in range(6):
        t = k * 10_000.0
        evs += [(ua, "recv_requests", t, 250), ("cpu_op", "c10d::send", t + 300, 50),
                (ua, "send_reqs_to_next_stage", t + 280, 100),
                (ua, "gloo:send", t + 350, 9_600),       # completes at t + 9950
                (ua, "get_next_batch_to_run", t + 400, 100)]
    evs.append((ua, "recv_requests", 60_000.0, 250))
    ev = _trace(tmp_path, evs)
    # each gap after get_next_batch_to_run (t + 500) closes 50 us after the send completed
    assert ev["commits"][:2] == [(500.0, 9950.0), (10_500.0, 19_950.0)]
    d = cpu_steps.summarize(ev, rank=0)
    assert d["iterations_empty"] == 6
    assert d["wait_us_mean"]["commit"] == pytest.approx(9450)
    # the visit's own work: 10 ms - 9.45 ms waiting = 0.55 ms (it was 10 ms, counted as work)
    assert d["host_us_empty_mean"] == pytest.approx(550)
    assert d["time_split"]["comm_wait_us"] == pytest.approx(6 * 9450)


def test_commit_waits_need_the_thread_to_resume_at_the_send_end():
    busy = [(0.0, 100.0), (5_000.0, 5_100.0), (9_000.0, 9_100.0)]
    sends = [(50.0, 4_900.0),       # resumed 100 us later: waited 100 -> 4900
             (5_050.0, 6_000.0)]    # the thread went on idle for 3 ms more: not its wait
    assert cpu_steps.commit_waits(busy, sends) == [(100.0, 4_900.0)]
    assert cpu_steps.commit_waits(busy, []) == []


def test_idle_passes_give_the_slot_count_and_are_left_out():
    # 3 slots; the server idles for 4 passes (a scheduler.idle after each), then runs
    starts = [float(i * 1000) for i in range(30)]
    idle = [(starts[3 * p + 2] + 500, starts[3 * p + 2] + 510) for p in range(4)]
    slots, skip = cpu_steps.idle_passes(starts, idle)
    assert slots == 3 and skip == set(range(12))
    assert cpu_steps.idle_passes(starts, idle[:1]) == (None, set())


def test_sglang_trace_file_names_one_file_per_pp_rank():
    names = ["17.5-TP-0-PP-0.trace.json.gz", "17.5-TP-1-PP-0.trace.json.gz",
             "17.5-TP-0-PP-1-EXTEND.trace.json.gz", "17.5-TP-0-PP-1-DECODE.trace.json.gz",
             "merged-17.5.trace.json.gz", "p-17.5-TP-0-DP-1-PP-2-EP-3.trace.json.gz"]
    keep, skipped = select_rank_files([Path(n) for n in names])
    assert sorted(p.name for p in keep) == ["17.5-TP-0-PP-0.trace.json.gz",
                                            "17.5-TP-0-PP-1-DECODE.trace.json.gz",
                                            "p-17.5-TP-0-DP-1-PP-2-EP-3.trace.json.gz"]
    assert len(skipped) == 3 and any("another TP rank" in s for s in skipped)
    with pytest.raises(TraceError, match="merged"):
        select_rank_files([Path("merged-17.5.trace.json.gz")])


def test_forward_on_the_cpu_holds_the_rank_until_it_ends():
    # PP2, one slot of 1 request, 5 ms forwards, 3 ms host per visit: on a GPU the CPU runs
    # ahead (host overlaps the forward); on the CPU the rank is busy for host + forward
    stage = ((0.0, 5000.0), (0.0, 5000.0))
    hop = ((0.0, 0.0), (0.0, 0.0))
    gpu = simulate(LoopConfig(stage, hop, 0, rank_host_us=(3000.0, 3000.0)), [1, 0])
    cpu = simulate(LoopConfig(stage, hop, 0, rank_host_us=(3000.0, 3000.0), cpu_forward=True),
                   [1, 0])
    # one request: each round is host + forward on both ranks in turn, either way
    assert cpu.tpot_ms == pytest.approx(16.0, rel=1e-6)
    assert gpu.tpot_ms <= cpu.tpot_ms
    # two slots: on the CPU both ranks are busy 2 x (3 + 5) ms per round
    cpu2 = simulate(LoopConfig(stage, hop, 0, rank_host_us=(3000.0, 3000.0), cpu_forward=True),
                    [1, 1])
    assert cpu2.tpot_ms == pytest.approx(16.0, rel=1e-6)
    # the hidden-state send's CPU time delays the next rank's input: one slot, +1 ms per round
    send = simulate(LoopConfig(stage, hop, 0, rank_host_us=(3000.0, 3000.0), cpu_forward=True,
                               send_us=(1000.0, 0.0)), [1, 0])
    assert send.tpot_ms == pytest.approx(17.0, rel=1e-6)


def test_lab_fault_grammar():
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "faults", Path(__file__).parents[1] / "microbench/sglang_lab/boot/inject/ppscope_lab_faults.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    assert m.parse("host-delay=0:4000") == ("host-delay", 0, 4000.0)
    assert m.parse("slow-stage=1:2") == ("slow-stage", 1, 2.0)
    for bad in ("nap=0:1", "host-delay=x:1", "host-delay"):
        with pytest.raises(ValueError):
            m.parse(bad)


def test_an_empty_visit_that_processes_the_next_slot_is_not_charged_twice():
    # C = 1 on two slots: slot 0 runs a forward (slot 1 is empty: nothing to process), slot 1's
    # empty visit processes slot 0's outputs (800 us). The processing is `process_us`, once
    # per round where the next slot holds a batch; the empty visit's own cost leaves it out
    ranges, steps = [], []
    t = 0.0
    for k in range(8):
        if k % 2 == 0:
            rg, st, t2 = _iteration(t, fwd=5000, bs=1, span=8000.0)
        else:
            rg, st, t2 = _iteration(t, proc=800, span=2000.0)
        ranges += rg
        steps += st
        t = t2
    ranges.append(("recv_requests", t, t + 50))
    d = cpu_steps.summarize(_ev(ranges, steps), rank=0)
    assert d["process_us_mean"] == pytest.approx(800)
    assert d["host_us_empty_mean"] == pytest.approx(2000 - 800)
    assert d["host_us_mean"] == pytest.approx(8000 - 5000)


def test_slot_sizes_come_from_the_rounds_that_held_the_most_requests():
    # SGLang's C = 8 PP2 server as the lab traced it: 7 and 1 in the two slots, then the run's
    # tail (one request left, the other slot empty) - counted by forwards, bs=1 outweighs bs=7
    steady = [(7, "DECODE"), (1, "DECODE")] * 4
    tail = [(1, "DECODE"), (0, None)] * 10
    # (the first visit ends no whole round)
    assert cpu_steps.full_rounds(steady + tail, 2) == {"1": 4, "7": 3}
    # a prefill visit counts its new requests (not as a decode forward); an idle pass breaks
    # the round
    v = [(7, "DECODE"), (1, "EXTEND"), (7, "DECODE"), (1, "DECODE"), (7, "DECODE"), (-1, None),
         (1, "DECODE"), (6, "DECODE")]
    assert cpu_steps.full_rounds(v, 2) == {"1": 1, "7": 2}
    # no slot count, or fewer full forwards than slots: no claim
    assert cpu_steps.full_rounds(steady, None) == {}
    assert cpu_steps.full_rounds([(3, "DECODE"), (0, None)], 2) == {}


def test_the_phases_every_visit_runs_are_measured_apart():
    # recv_requests (50 us) and get_next_batch_to_run (gnb) run on every visit, batch or not
    # (SGLang's event_loop_pp); 200 us of get_next_batch_to_run blocked in a receive is
    # waiting, not work. A host delay inside get_next_batch_to_run shows in both.
    ranges, steps, recvs = [], [], []
    t = 0.0
    for k in range(8):
        if k % 2 == 0:
            rcv = [(t + 100, t + 300)]
            rg, st, t2 = _iteration(t, fwd=5000, bs=4, gnb=20_000.0, recv=rcv, span=30_000.0)
            recvs += rcv
        else:
            rg, st, t2 = _iteration(t, gnb=19_000.0, span=20_000.0)
        ranges += rg
        steps += st
        t = t2
    ranges.append(("recv_requests", t, t + 50))
    d = cpu_steps.summarize(_ev(ranges, steps, recvs), rank=0)
    assert d["host_us_every_visit_mean"] == pytest.approx(50 + 20_000 - 200)
    assert d["host_us_every_visit_empty_mean"] == pytest.approx(50 + 19_000)
    assert d["host_us_empty_mean"] == pytest.approx(20_000)
