"""The simulator against DESIGN.md's closed forms, plus the herd and chaining effects."""
from dataclasses import replace

import pytest

from reports.model import closed_form as cf
from reports.model.pipeline_model import simulate, uniform_loop


@pytest.mark.parametrize("pp,depth,m,B", [(8, 8, 8, 4), (8, 8, 16, 2), (4, 0, 4, 1), (2, 2, 1, 8)])
def test_uniform_stages_match_closed_form(pp, depth, m, B):
    cfg = uniform_loop(pp, depth, B, 1000.0, hop_us=60.0, return_us=60.0)
    r = simulate(cfg, [B] * m)
    assert r.tok_per_s == pytest.approx(cf.throughput_tok_s([1000.0] * pp, m, B, 60, 60), rel=1e-9)
    for busy, bub in zip(r.busy_frac, cf.bubbles([1000.0] * pp, m, 60, 60)):
        assert busy == pytest.approx(1 - bub, rel=1e-9)


def test_fewer_micro_batches_than_stages_is_round_trip_bound():
    # m=4 < p=8: R = 8*1000 + 7*60 + 60 = 8480 us; 4*4 tokens per period -> 1886.79 tok/s
    r = simulate(uniform_loop(8, 8, 4, 1000.0, 60.0, 60.0), [4] * 4)
    assert r.tok_per_s == pytest.approx(16 / 8480e-6, rel=1e-9)
    assert r.tpot_ms == pytest.approx(8.48, rel=1e-9)


def test_imbalanced_stage_is_the_bottleneck():
    T = [1000, 1000, 1500, 1000, 1000, 1000, 1000, 900]
    r = simulate(uniform_loop(8, 0, 4, T, 60.0, 60.0), [4] * 8)
    assert r.tok_per_s == pytest.approx(32 / (8 * 1500e-6), rel=1e-9)  # P = m * max T
    assert r.busy_frac[2] == pytest.approx(1.0)
    assert r.busy_frac[0] == pytest.approx(2 / 3)


def test_host_cost_and_chaining_lengthen_the_round_trip():
    # one micro-batch, 2 stages of 500 us, host 100 us per visit, chain 30, empty slots 10:
    # rank 0: host 100 + 500 -> hop 20 -> rank 1 host 100 + 500 -> return 20 = 1240 us per round
    cfg = uniform_loop(2, 2, 1, 500.0, 20.0, 20.0, host_us=100.0, chain_us=30.0, empty_us=10.0)
    r = simulate(cfg, [1, 0, 0, 0])
    assert r.tpot_ms == pytest.approx(1.24, rel=1e-9)


def test_empty_loop_and_bad_sizes():
    cfg = uniform_loop(2, 0, 2, 100.0)
    assert simulate(cfg, [0, 0]).tok_per_s == 0.0
    with pytest.raises(ValueError):
        simulate(cfg, [1, 1, 1])
    with pytest.raises(ValueError):
        simulate(cfg, [3, 0])  # no cost for b=3


def _two_slots(result_sync: bool):
    # PP2, 4 slots, two micro-batches of 4 in slots 0 and 2; forwards 1000 us on both ranks,
    # free hops, rank 0 spends 500 us of host time per non-empty visit, rank 1 none.
    base = uniform_loop(2, 2, 4, 1000.0)
    return replace(base, first_host_us=(0.0, 500.0, 500.0, 500.0, 500.0),
                   result_sync=result_sync)


def test_rank0_host_hides_behind_the_other_forward_without_result_sync():
    # round trip per slot R = 500 host + 1000 + 1000 = 2500 us > 2 x 1000: P = 2500
    r = simulate(_two_slots(False), [4, 0, 4, 0])
    assert r.tpot_ms == pytest.approx(2.5, rel=1e-9)
    assert r.tok_per_s == pytest.approx(8 / 2500e-6, rel=1e-9)


def test_result_sync_puts_rank0_host_between_its_forwards():
    # tolist() waits for rank 0's queued forward: each forward is preceded by 500 us of host
    # on an idle GPU, P = 2 x (500 + 1000) = 3000 us; rank 0 busy 2000/3000
    r = simulate(_two_slots(True), [4, 0, 4, 0])
    assert r.tpot_ms == pytest.approx(3.0, rel=1e-9)
    assert r.tok_per_s == pytest.approx(8 / 3000e-6, rel=1e-9)
    assert r.busy_frac[0] == pytest.approx(2 / 3, rel=1e-9)


def test_result_sync_changes_nothing_with_one_micro_batch():
    # one slot: the GPU is idle when the tokens come back anyway; R = 500 + 2000 = 2500 us
    assert simulate(_two_slots(True), [4, 0, 0, 0]).tpot_ms == pytest.approx(2.5, rel=1e-9)
    assert simulate(_two_slots(False), [4, 0, 0, 0]).tpot_ms == pytest.approx(2.5, rel=1e-9)


def test_first_host_table_must_be_non_negative():
    with pytest.raises(ValueError):
        replace(uniform_loop(2, 2, 1, 100.0), first_host_us=(0.0, -1.0))
