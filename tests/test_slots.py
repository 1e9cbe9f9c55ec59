"""SGLang's slot/admission discipline (reports/base/slots.py): hand-worked cases, no GPU."""
from __future__ import annotations

import pytest

from reports.base.slots import (SlotConfig, admit, default_max_micro_batch, even_micro_batches,
                           even_slots, initial_assignment, slot_action, slot_sizes_of)


def sizes(arrivals, cfg, policy, visits, m=None):
    return slot_sizes_of(initial_assignment(arrivals, cfg, policy, visits, m), cfg)


def test_default_cap_divides_by_pp_not_slots():
    assert default_max_micro_batch(32, 8) == 4      # not 32 // 16 slots
    assert default_max_micro_batch(1024, 8) == 128
    assert default_max_micro_batch(7, 8) == 1       # floor is 1
    assert default_max_micro_batch(0, 2) == 1
    with pytest.raises(ValueError):
        default_max_micro_batch(32, 0)


def test_slot_count_is_pp_plus_depth():
    assert SlotConfig(8, 8, 4).slots == 16          # the seed's PP8 + depth 8
    assert SlotConfig(2, 2, 16).slots == 4
    with pytest.raises(ValueError):
        SlotConfig(2, -1, 4)
    with pytest.raises(ValueError):
        SlotConfig(2, 0, 0)


def test_sglang_burst_lands_in_one_slot_without_a_binding_cap():
    cfg = SlotConfig(2, 2, 128)
    assert sizes([0.0] * 32, cfg, "sglang", [0, 1, 2, 3]) == [32, 0, 0, 0]
    assert initial_assignment([0.0] * 3, cfg, "sglang", [0, 1]) == [0, 0, 0]


def test_sglang_burst_with_default_cap_fills_consecutive_slots():
    # max_running_requests = 32, pp 2 -> cap 16: the burst fills slots 0 and 1, 2 and 3 idle
    cfg = SlotConfig(2, 2, default_max_micro_batch(32, 2))
    assert sizes([0.0] * 32, cfg, "sglang", range(8)) == [16, 16, 0, 0]
    # the seed's PP8 + depth 8 with max_running_requests 32: cap 4, 8 of 16 slots used
    cfg8 = SlotConfig(8, 8, default_max_micro_batch(32, 8))
    assert sizes([0.0] * 32, cfg8, "sglang", range(16)) == [4] * 8 + [0] * 8
    assert sizes([0.0] * 8, cfg8, "sglang", range(16)) == [4, 4] + [0] * 14


def test_sglang_cap_leaves_overflow_unadmitted():
    cfg = SlotConfig(2, 0, 3)                        # 2 slots of 3
    a = initial_assignment([0.0] * 7, cfg, "sglang", [0, 1, 2, 3])
    assert a == [0, 0, 0, 1, 1, 1, None]


def test_even_burst_one_micro_batch_per_stage():
    cfg = SlotConfig(2, 2, 128)
    assert even_slots(cfg, 2) == (0, 2)
    assert sizes([0.0] * 32, cfg, "even", range(4)) == [16, 0, 16, 0]
    assert sizes([0.0] * 5, cfg, "even", range(4)) == [3, 0, 2, 0]
    assert sizes([0.0] * 1, cfg, "even", range(4)) == [1, 0, 0, 0]


def test_even_with_more_micro_batches():
    cfg = SlotConfig(2, 2, 128)
    assert sizes([0.0] * 8, cfg, "even", range(4), m=4) == [2, 2, 2, 2]
    assert sizes([0.0] * 32, cfg, "even", range(4), m=4) == [8, 8, 8, 8]
    assert sizes([0.0] * 8, cfg, "even", range(4), m=9) == [2, 2, 2, 2]   # clamped to slots
    cfg8 = SlotConfig(8, 8, 128)
    assert even_slots(cfg8, 8) == (0, 2, 4, 6, 8, 10, 12, 14)
    assert sizes([0.0] * 32, cfg8, "even", range(16)) == [4, 0] * 8


def test_even_uses_more_slots_when_the_cap_demands():
    cfg = SlotConfig(2, 2, 10)
    assert even_micro_batches(32, cfg) == 4
    assert sizes([0.0] * 32, cfg, "even", range(4)) == [8, 8, 8, 8]
    assert even_micro_batches(25, cfg) == 3
    assert even_slots(cfg, 3) == (0, 1, 2)
    assert sizes([0.0] * 25, cfg, "even", range(4)) == [9, 8, 8, 0]


def test_staggered_arrivals_join_the_slot_being_scheduled():
    cfg = SlotConfig(2, 2, 128)
    arr = [0.0, 1.5, 1.5, 3.2, 10.0]
    # visits at t = 0..4 go to slots 0,1,2,3,0; the request arriving at t=10 is never admitted
    assert initial_assignment(arr, cfg, "sglang", [0, 1, 2, 3, 4]) == [0, 2, 2, 0, None]
    # even: slots 0 and 2 only; at t=2 three have arrived, slot 2's share is 3//2 = 1
    assert initial_assignment(arr, cfg, "even", [0, 1, 2, 3, 4, 5, 6]) == [0, 2, 0, 2, None]


def test_arrival_order_not_index_order():
    cfg = SlotConfig(2, 0, 1)
    assert initial_assignment([2.0, 0.0], cfg, "sglang", [0, 1, 2, 3]) == [1, 0]
    assert initial_assignment([2.0, 0.0], cfg, "sglang", [0, 1, 2]) == [None, 0]
    assert initial_assignment([2.0, 0.0], SlotConfig(2, 0, 2), "sglang", [0, 1, 2]) == [0, 0]


def test_admit_direct():
    cfg = SlotConfig(2, 2, 4)
    assert admit(10, [0, 0, 0, 0], 0, cfg, "sglang") == 4
    assert admit(10, [3, 0, 0, 0], 0, cfg, "sglang") == 1
    assert admit(10, [4, 0, 0, 0], 0, cfg, "sglang") == 0
    assert admit(0, [0, 0, 0, 0], 1, cfg, "sglang") == 0
    assert admit(6, [0, 0, 0, 0], 1, cfg, "even") == 0       # slot 1 not one of (0, 2)
    assert admit(6, [0, 0, 0, 0], 0, cfg, "even") == 3
    with pytest.raises(ValueError, match="unknown admission policy"):
        admit(1, [0, 0, 0, 0], 0, cfg, "fifo")
    with pytest.raises(ValueError, match="expected 4"):
        admit(1, [0, 0], 0, cfg)
    with pytest.raises(ValueError, match="out of range"):
        admit(1, [0, 0, 0, 0], 4, cfg)


def test_slot_action_prefill_first():
    assert slot_action(2, 5) == "prefill"
    assert slot_action(0, 5) == "decode"
    assert slot_action(0, 0) == "idle"
