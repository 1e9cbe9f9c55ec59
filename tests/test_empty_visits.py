"""The cost of an empty visit where the traced window saw none (reports/model/observed/
deployment.py `empty_visit_us`).

SGLang 0.5.23 runs the whole visit on an empty slot too (managers/scheduler_pp_mixin.py
`event_loop_pp`: recv_requests and get_next_batch_to_run for every `mb_id`), so a host delay in
get_next_batch_to_run is spent on empty visits as well. The fixture: the lab's host delay of
20 ms on rank 0 (SGLang's CPU server, PP2, C = 8, recorded on the 2-core machine and read by
`ppscope sglang`): its traced window ran two occupied slots (5 and 3 requests), while the
benchmark's first burst put all 8 into one slot, so the modelled run has an empty slot the
window never timed.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from reports.base.records import read_record
from reports.model.observed import bench_run as ow
from reports.model.observed.deployment import empty_visit_us

FIXTURE = Path(__file__).parent / "fixtures" / "sglang_lab" / "host-burst" / "sglang.json"


def _rank(empty=0, every=None, host=None):
    return SimpleNamespace(iterations_empty=empty, host_us_every_visit_mean=every,
                           host_us_mean=host)


def test_an_unseen_empty_visit_lies_between_the_phases_every_visit_runs_and_a_whole_visit():
    notes: list[str] = []
    est = empty_visit_us([_rank(every=21_000, host=23_000), _rank(every=900, host=4_000)],
                         ["0", "1"], True, notes)
    assert est == (22_000, 2_450)
    assert len(notes) == 1 and "saw none" in notes[0] and "rank 0 22000 us (21000-23000)" in notes[0]
    # not needed: the same estimate, no note
    quiet: list[str] = []
    assert empty_visit_us([_rank(every=1, host=3), _rank(every=1, host=3)], ["0", "1"], False,
                          quiet) == (2, 2) and quiet == []


def test_an_observed_empty_visit_is_used_as_measured():
    notes: list[str] = []
    assert empty_visit_us([_rank(empty=3, every=1, host=5), _rank(every=1, host=5)], ["0", "1"],
                          True, notes) is None and notes == []


def test_a_record_without_the_phases_says_so_where_it_matters():
    # an older record, or the GPU view: no estimate, and a note where the loop needs one
    notes: list[str] = []
    assert empty_visit_us([_rank(host=5), _rank(host=5)], ["0", "1"], True, notes) is None
    assert notes and "taken as no CPU work" in notes[0]


def test_the_recorded_burst_runs_its_empty_slot_at_the_estimated_cost():
    sg = read_record(FIXTURE).payload
    dep, server, load, measured = ow.from_sglang(sg)
    assert dep.sizes == (8, 0)                       # the benchmark's burst, one slot empty
    rk = sg.loop.ranks
    assert all(x.iterations_empty == 0 for x in rk.values())
    lo, hi = rk["0"].host_us_every_visit_mean, rk["0"].host_us_mean
    assert lo > 20_000 and lo < dep.empty_us[0] < hi     # the 20 ms sleep is in both bounds
    assert dep.sources["empty visits"] == "estimated"
    assert any("empty visits" in n for n in dep.notes)
    # with the empty visit taken as free (as before), the model runs the burst's loop far
    # faster than the server did; with the estimate it comes nearer the observed tok/s
    free = ow.bench_run(replace(dep, empty_us=(0.0, 0.0)), server, load).tok_per_s
    est = ow.bench_run(dep, server, load).tok_per_s
    assert est < free
    assert abs(est / measured - 1) < abs(free / measured - 1)
