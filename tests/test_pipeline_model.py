"""The simulator of SGLang's PP loop against closed forms and hand-worked timelines."""
import pytest

from reports.model.sim import closed_form as cf
from reports.model.sim.pipeline_model import LoopConfig, simulate, uniform_loop


def spaced(slots, m, b):
    g = slots // m
    return [b if i % g == 0 and i // g < m else 0 for i in range(slots)]


@pytest.mark.parametrize("pp,depth", [(2, 2), (8, 8), (4, 0), (8, 0), (3, 5)])
def test_one_micro_batch_is_the_round_trip(pp, depth):
    # R = p*1000 + (p-1)*60 + 60, whatever the depth: nothing else is in flight
    r = simulate(uniform_loop(pp, depth, 4, 1000.0, 60.0, 60.0), [4])
    assert r.tpot_ms * 1e3 == pytest.approx(cf.round_trip_us([1000.0] * pp, 60, 60), rel=1e-9)
    assert r.tok_per_s == pytest.approx(cf.throughput_tok_s([1000.0] * pp, 1, 4, 60, 60),
                                        rel=1e-9)


@pytest.mark.parametrize("pp,m,B", [(8, 4, 4), (8, 2, 3), (4, 2, 1)])
def test_depth0_spaced_micro_batches_match_design_closed_form(pp, m, B):
    # depth 0: tokens go out right after the forward; no two occupied slots adjacent
    r = simulate(uniform_loop(pp, 0, B, 1000.0, 60.0, 60.0), spaced(pp, m, B))
    assert r.tok_per_s == pytest.approx(cf.throughput_tok_s([1000.0] * pp, m, B, 60, 60),
                                        rel=1e-9)
    for busy, bub in zip(r.busy_frac, cf.bubbles([1000.0] * pp, m, 60, 60)):
        assert busy == pytest.approx(1 - bub, rel=1e-9)


@pytest.mark.parametrize("pp,depth,m,T,c,h", [
    (2, 2, 2, 1000.0, 60.0, 60.0), (8, 8, 8, 1000.0, 60.0, 60.0), (8, 8, 4, 500.0, 200.0, 100.0),
    (4, 4, 4, 1000.0, 10.0, 300.0), (2, 8, 5, 1000.0, 60.0, 60.0), (8, 2, 5, 1000.0, 0.0, 0.0)])
def test_held_token_send_matches_its_closed_form(pp, depth, m, T, c, h):
    S = pp + depth
    r = simulate(uniform_loop(pp, depth, 2, T, c, h), spaced(S, m, 2))
    assert r.tpot_ms * 1e3 == pytest.approx(cf.period_held_us([T] * pp, m, S, depth, c, h),
                                            rel=1e-9)


def test_held_send_worked_by_hand_pp2():
    # PP2, depth 2, slots 0 and 2, forwards 1000 us, hops 60. The last rank sends slot 0's
    # tokens at its iteration for slot 2, behind slot 2's hidden-state receive, so slot 0's
    # next forward on rank 0 starts >= slot 2's start on rank 0 + 1000 + 60 + 60 (half a
    # period later): P = 2 * 1120 = 2240 us, not R = 2120
    r = simulate(uniform_loop(2, 2, 4, 1000.0, 60.0, 60.0), [4, 0, 4, 0])
    assert r.tpot_ms == pytest.approx(2.24, rel=1e-9)


def test_seed_shape_even_pacing_halves_throughput():
    # PP8 + depth 8, eight micro-batches in every other slot: each waits for the one 4 ahead,
    # P = 2 * (R - T) = 2 * (7000 + 7 * 60 + 60) = 14960 us instead of R = 8480
    r = simulate(uniform_loop(8, 8, 4, 1000.0, 60.0, 60.0), spaced(16, 8, 4))
    assert r.tpot_ms == pytest.approx(14.96, rel=1e-9)


def test_adjacent_slots_wait_for_the_next_slots_tokens():
    # PP2, depth 2, slots 0 and 1: with depth > 0 outputs are exchanged before the forward, so
    # slot 0's forward waits (schedule stream) for slot 1's tokens of the last round, which
    # come back R after slot 1 started; slot 1 starts T + c after slot 0 on rank 0, since the
    # next forward also waits for the last proxy send to complete (committed on the schedule
    # stream): P = T + c + R = 1000 + 60 + 2120
    r = simulate(uniform_loop(2, 2, 4, 1000.0, 60.0, 60.0), [4, 4, 0, 0])
    assert r.tpot_ms == pytest.approx(3.18, rel=1e-9)
    # depth 0 exchanges after the forward: back to max(2T, R)
    r0 = simulate(uniform_loop(2, 0, 4, 1000.0, 60.0, 60.0), [4, 4])
    assert r0.tpot_ms > 2.12 and r0.tpot_ms < 3.12


def test_host_work_overlaps_the_upstream_forward():
    # one micro-batch, PP2 + depth 2, forwards 500, hops 20; schedule 100, launch 50, result
    # processing 30, gloo 10, empty visit 5. Only rank 0's schedule + launch and its result
    # processing are on the round trip: 100 + 50 + 500 + 20 + 500 + 20 + 30 = 1220 us
    kw = dict(host_us=100.0, launch_us=50.0, process_us=30.0, chain_us=10.0, empty_us=5.0)
    r = simulate(uniform_loop(2, 2, 1, 500.0, 20.0, 20.0, **kw), [1])
    assert r.tpot_ms == pytest.approx(1.22, rel=1e-9)
    # rank 1's host work hides behind rank 0's forward until it is longer than it
    kw2 = dict(kw, host_us=(100.0, 400.0))
    assert simulate(uniform_loop(2, 2, 1, 500.0, 20.0, 20.0, **kw2), [1]).tpot_ms == \
        pytest.approx(1.22, rel=1e-9)
    kw3 = dict(kw, host_us=(100.0, 700.0))
    assert simulate(uniform_loop(2, 2, 1, 500.0, 20.0, 20.0, **kw3), [1]).tpot_ms > 1.22


def test_every_rank_syncs_on_its_previous_forward():
    # one rank's CPU is held one forward behind its GPU: with a host cost per iteration longer
    # than the forward, the GPU idles (2 full slots, PP2, depth 0, T=100, launch 300)
    cfg = uniform_loop(2, 0, 1, 100.0, 0.0, 0.0, launch_us=300.0)
    r = simulate(cfg, [1, 1])
    assert max(r.busy_frac) < 0.5


def test_empty_loop_and_bad_sizes():
    cfg = uniform_loop(2, 0, 2, 100.0)
    assert simulate(cfg, [0, 0]).tok_per_s == 0.0
    with pytest.raises(ValueError):
        simulate(cfg, [1, 1, 1])
    with pytest.raises(ValueError):
        simulate(cfg, [3, 0])  # no cost for b=3


def test_costs_must_be_non_negative_and_per_rank_tuples_sized():
    with pytest.raises(ValueError):
        uniform_loop(2, 2, 1, 100.0, host_us=-1.0)
    with pytest.raises(ValueError):
        uniform_loop(2, 2, 1, 100.0, host_us=(1.0, 2.0, 3.0))
    assert isinstance(uniform_loop(2, 2, 1, 100.0, process_us=(1.0, 2.0)), LoopConfig)


@pytest.mark.parametrize("sizes", [[4, 0] * 8, [4] * 4, [4] * 16, [4]])
def test_idealised_return_is_designs_closed_form(sizes):
    # token_return=False (the attribution's ideal loop): tokens straight back to rank 0, no
    # held send, no per-rank sync -> P = max(m * T, R) for any placement
    from dataclasses import replace
    cfg = replace(uniform_loop(8, 8, 4, 1000.0, 60.0, 60.0), token_return=False)
    m = sum(1 for s in sizes if s)
    assert simulate(cfg, sizes).tpot_ms * 1e3 == pytest.approx(
        cf.period_us([1000.0] * 8, m, 60, 60), rel=1e-9)


def _uneven_loops():
    """Loops whose ranks differ (stage, hop and CPU costs), in each of the loop's modes."""
    from dataclasses import replace
    base = LoopConfig(
        stage_us=((0.0, 900.0, 950.0, 1010.0), (0.0, 1200.0, 1230.0, 1300.0),
                  (0.0, 700.0, 760.0, 800.0)),
        hop_us=((0.0, 40.0, 45.0, 52.0), (0.0, 70.0, 71.0, 90.0), (0.0, 15.0, 15.0, 15.0)),
        async_depth=2, host_us=(30.0, 55.0, 20.0), empty_us=5.0, chain_us=12.5,
        launch_us=(80.0, 60.0, 95.0), process_us=(40.0, 10.0, 25.0))
    return [("held", base, [3, 0, 2, 1, 1]),
            ("depth 0", replace(base, async_depth=0), [3, 2, 0]),
            ("ideal return", replace(base, token_return=False), [1, 3, 0, 0, 2]),
            ("traced host", replace(base, rank_host_us=(400.0, 150.0, 90.0)), [2, 2, 2, 0, 3]),
            ("cpu forward", replace(base, cpu_forward=True, send_us=(20.0, 35.0, 0.0)),
             [1, 1, 0, 3, 0])]


@pytest.mark.parametrize("name,cfg,sizes", _uneven_loops(), ids=lambda x: x
                         if isinstance(x, str) else "")
def test_a_run_without_spans_stops_after_the_measured_rounds_with_the_same_times(name, cfg,
                                                                                sizes):
    # the last rank's forwards before `need` depend only on earlier messages: a run that stops
    # there (no spans to draw) gives the full run's times exactly, and the same result
    from reports.model.sim.pipeline_model import _drive
    need = 6 * cfg.slots
    full = _drive(cfg, sizes, need + 2 * cfg.slots + cfg.pp, None)
    short = _drive(cfg, sizes, need + 2 * cfg.slots + cfg.pp, None, last_iters=need)
    assert short == {j: e for j, e in full.items() if j < need}
    with_spans, without = simulate(cfg, sizes, keep_spans=True), simulate(cfg, sizes)
    assert (without.tok_per_s, without.tpot_ms, without.busy_frac) == \
        (with_spans.tok_per_s, with_spans.tpot_ms, with_spans.busy_frac)
    assert with_spans.spans and not without.spans


def test_loops_that_differ_only_at_sizes_no_slot_holds_are_one_run(monkeypatch):
    # the simulator reads a cost table only at the batch sizes that run: a loop whose table
    # differs at size 2 (unused) or goes further is the same run, one that differs at a used
    # size is not; the model's memo (loop_builder._sim) runs each such loop once
    from dataclasses import replace
    from reports.model.scenario import loop_builder as lb
    from reports.model.sim.pipeline_model import run_key
    a = uniform_loop(3, 2, 3, 1000.0, 60.0, 60.0, host_us=20.0)
    other = tuple((0.0, c[1], 5.0, c[3]) for c in a.stage_us)           # size 2 differs
    longer = uniform_loop(3, 2, 6, 1000.0, 60.0, 60.0, host_us=20.0)   # tables to size 6
    used = tuple((0.0, c[1], c[2], 1.0) for c in a.stage_us)           # size 3 differs
    sizes = (3, 0, 1, 0, 0)
    assert run_key(a, sizes) == run_key(replace(a, stage_us=other), sizes) == \
        run_key(longer, sizes)
    assert run_key(a, sizes) != run_key(replace(a, stage_us=used), sizes)
    assert run_key(a, sizes) != run_key(replace(a, host_us=21.0), sizes)
    assert run_key(a, (9,)) is a                     # no cost for 9: simulate says so
    runs = []
    monkeypatch.setattr(lb, "simulate", lambda *x, **k: runs.append(x) or simulate(*x, **k))
    monkeypatch.setattr(lb, "_SIMS", {})
    got = [lb._sim(c, sizes, False) for c in (a, replace(a, stage_us=other), longer)]
    assert len(runs) == 1 and got[0] == got[1] == got[2] == simulate(longer, sizes)
    lb._sim(replace(a, stage_us=used), sizes, False)
    assert len(runs) == 2
