"""SGLang's slot/admission discipline (reports/base/slots.py): hand-worked cases, no GPU."""
from __future__ import annotations

import pytest

from reports.base.server_settings import default_max_micro_batch
from reports.base.slots import (AdmitState, SlotConfig, Visit, admit, burst_sizes, closed_loop,
                                even_micro_batches, even_slots, herd_off_sizes, initial_assignment,
                                output_lengths, slot_action, slot_sizes_of, visit)


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


# ---- prefill token budget, request rows, chunked prefill (SGLang 0.5.23 PrefillAdder) ----

def test_token_budget_splits_a_burst_whatever_the_cap():
    # chunked_prefill_size 8192, 1000-token prompts: 8 requests + 192 tokens of a 9th per
    # visit; the 9th finishes in the next slot, which then takes 7 more: 8 / 8 / 8 / 8
    cfg = SlotConfig(8, 8, 256, max_running_requests=2048, chunked_prefill_size=8192)
    assert burst_sizes(32, cfg, 1000) == [8, 8, 8, 8] + [0] * 12
    assert burst_sizes(8, cfg, 1000) == [8] + [0] * 15
    # the per-slot cap still binds when it is smaller
    assert burst_sizes(32, SlotConfig(8, 8, 4, 2048, 8192), 1000) == [4] * 8 + [0] * 8
    # chunked prefill off: max_prefill_tokens (16384) is the budget, 16 per visit
    assert burst_sizes(32, SlotConfig(8, 8, 256, 2048, None), 1000) == [16, 16] + [0] * 14


def test_chunked_request_joins_the_slot_of_its_last_chunk():
    cfg = SlotConfig(2, 2, 64, chunked_prefill_size=2500)
    st = AdmitState.empty(cfg)
    v0 = visit(st, [1000] * 5, 0, cfg)       # 2 whole + 500 tokens of the 3rd
    assert (v0.joined, v0.taken, v0.batch, v0.tokens) == (2, 3, 3, 2500)
    assert st.chunk_left == 500 and st.sizes == [2, 0, 0, 0]
    v1 = visit(st, [1000] * 2, 1, cfg)       # the chunk ends here (500) + 2 whole
    assert (v1.joined, v1.taken, v1.batch, v1.tokens) == (3, 2, 3, 2500)
    assert st.sizes == [2, 3, 0, 0] and st.chunk_left == 0
    # a continuing chunk prefills even in a full slot (SGLang skips the cap check for it)
    st2 = AdmitState([1, 0, 0, 0], chunk_left=300)
    v = visit(st2, [], 0, SlotConfig(2, 2, 1, chunked_prefill_size=2500))
    assert v.kind == "prefill" and v.joined == 1 and st2.sizes[0] == 2
    assert initial_assignment([0.0] * 5, cfg, "sglang", range(4), prompt_lens=1000) == \
        [0, 0, 1, 1, 1]


def test_request_rows_limit_admission():
    # max_running_requests 6 over all slots; cap 4 per slot
    cfg = SlotConfig(2, 2, 4, max_running_requests=6)
    assert burst_sizes(10, cfg, 1) == [4, 2, 0, 0]
    st = AdmitState([4, 2, 0, 0])
    assert visit(st, [1] * 3, 2, cfg).joined == 0   # no free row
    assert admit(3, [3, 0, 0, 0], 1, cfg) == 3


def test_without_chunking_only_the_first_request_may_exceed_the_input_cap():
    cfg = SlotConfig(2, 2, 64, chunked_prefill_size=None, max_prefill_tokens=1000)
    st = AdmitState.empty(cfg)
    assert visit(st, [3000, 10], 0, cfg).joined == 1    # the first always goes
    assert visit(st, [600, 600], 1, cfg).joined == 1    # 600 + 600 > 1000: one


def test_even_policy_respects_the_token_budget():
    cfg = SlotConfig(8, 8, 256, 2048, 8192)
    assert burst_sizes(32, cfg, 1000, "even") == [4, 0] * 8
    # 16 per chosen slot would be 16000 tokens: whole requests that fit, the rest next visit
    assert burst_sizes(128, cfg, 1000, "even") == [16, 0] * 8


def _naive_closed_loop(cfg, C, prompt_len, lens, reissue=2, rounds=60):
    """Visit by visit, no jumping: the reference for `closed_loop`'s event skipping."""
    S, st = cfg.slots, AdmitState.empty(cfg)
    it = iter(lens)
    members = [[] for _ in range(S)]       # [client, left]
    leaving = [0] * S
    ready = [(0, c) for c in range(C)]
    queue, chunked, seen = [], None, []
    for v in range(rounds * S):
        s = v % S
        st.sizes[s] -= leaving[s]
        leaving[s] = 0
        for w in sorted(w for w in ready if w[0] <= v):
            ready.remove(w)
            queue.append(w[1])
        vis = visit(st, [prompt_len] * len(queue), s, cfg) if queue or st.chunk_left \
            else Visit()
        joining = queue[:vis.taken]
        del queue[:vis.taken]
        if chunked is not None and (st.chunk_left == 0 or vis.taken):
            joining.insert(0, chunked)
            chunked = None
        if st.chunk_left and vis.taken:
            chunked = joining.pop()
        for c in joining:
            left = next(it) - 1
            if left > 0:
                members[s].append([c, left])
            else:
                leaving[s] += 1
                ready.append((v + S - 1 + reissue, c))
        if vis.batch == 0:
            for m in list(members[s]):
                m[1] -= 1
                if m[1] == 0:
                    members[s].remove(m)
                    leaving[s] += 1
                    ready.append((v + S - 1 + reissue, m[0]))
        if s == S - 1 and v // S >= rounds // 2:
            seen.append(tuple(len(m) for m in members[:]))
    return seen


@pytest.mark.parametrize("cfg,C,plen", [
    (SlotConfig(2, 2, 4), 5, 10), (SlotConfig(2, 2, 3, 5, 20), 6, 10),
    (SlotConfig(3, 1, 8, None, 25), 7, 10), (SlotConfig(4, 4, 64, 2048, 8192), 16, 1000),
    # every slot full while prompts wait: by the cap, by the request rows, with chunking
    (SlotConfig(2, 2, 1), 9, 10), (SlotConfig(3, 1, 4, 6), 11, 10),
    (SlotConfig(2, 2, 2, None, 25), 13, 10), (SlotConfig(8, 8, 1, 2048, 8192), 32, 1000)])
@pytest.mark.parametrize("ratio", [1.0, 0.0])
def test_closed_loop_event_skipping_matches_visit_by_visit(cfg, C, plen, ratio):
    occ = closed_loop(cfg, C, plen, 9, ratio, rounds=60, seed=3)
    lens = output_lengths(10000, 9, ratio, seed=3)
    assert list(occ.series) == _naive_closed_loop(cfg, C, plen, lens, rounds=60)


def test_closed_loop_skips_the_visits_where_every_slot_is_full(monkeypatch):
    # one request per slot and twice as many clients as slots: prompts always wait, and only
    # a slot whose request finished admits; the visits between finishes are skipped, not run
    import reports.base.slots as slots
    calls = []
    real = slots.visit
    monkeypatch.setattr(slots, "visit", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    cfg = SlotConfig(8, 8, 1, 2048, 8192)
    occ = closed_loop(cfg, 32, 1000, 1000, 0.0, rounds=2000)
    assert len(occ.series) == 1000 and max(sum(s) for s in occ.series) == cfg.slots
    assert len(calls) < 2000 * cfg.slots // 20


def test_drift_with_fixed_lengths_keeps_the_split_with_lengths_that_differ_it_spreads():
    cfg = SlotConfig(8, 8, 256, 2048, 8192)
    fixed = closed_loop(cfg, 32, 1000, 1000, 1.0, rounds=3000)
    assert {tuple(sorted(s for s in snap if s)) for snap in fixed.series if sum(snap)} == \
        {(8, 8, 8, 8)}
    mixed = closed_loop(cfg, 32, 1000, 1000, 0.0, rounds=3000)
    occupied = [sum(1 for s in snap if s) for snap in mixed.series]
    assert max(occupied) > 4 and len(set(mixed.series)) > 50
    assert len(mixed.sample(6)) == 6


def test_a_burst_stops_at_the_visit_where_every_slot_is_full(monkeypatch):
    # requests never leave a burst's slots: once no slot has room (the cap here), the visits
    # left would place nobody, so the burst stops there with the rest unplaced
    import reports.base.slots as slots
    calls = []
    real = slots.visit
    monkeypatch.setattr(slots, "visit", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    cfg = SlotConfig(8, 8, 1, 2048, 8192)
    assert burst_sizes(128, cfg, 1000) == [1] * 16
    assert len(calls) == cfg.slots
    calls.clear()
    rows = SlotConfig(2, 2, 4, 6)     # 6 request rows: slots of 4 and 2, then no row is free
    assert sum(burst_sizes(20, rows, 10)) == 6 and len(calls) <= rows.slots


def test_herd_off_keeps_the_requests_and_the_occupied_slots():
    """The herd switched off (both model pipelines): the same requests in as many equal
    micro-batches as the slots they occupied, at least min(requests, pp), evenly spaced."""
    assert herd_off_sizes((4, 1, 1, 1, 3), 4) == (2, 2, 2, 2, 2)     # pp 4, depth 1: 5, not 4
    assert herd_off_sizes((8, 0, 0, 0), 2) == (4, 0, 4, 0)          # one per stage
    assert herd_off_sizes((7, 0, 0, 0, 0, 0), 3) == (3, 0, 2, 0, 2, 0)
    assert herd_off_sizes((2, 0, 0, 0), 4) == (1, 0, 1, 0)          # never more than requests
    assert herd_off_sizes((5, 0, 2), 2) == (4, 3, 0)                # pp 2, depth 1, 2 occupied
    assert herd_off_sizes((0, 0, 0), 2) == (0, 0, 0)
