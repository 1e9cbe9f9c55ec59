"""The layer split (`SGLANG_PP_LAYER_PARTITION`) as a what-if of the observed server.

The layers are timed from SGLang's own traces: the lab's clean C=8 case profiled with SGLang's
defaults (tests/fixtures/sglang_lab/clean-c8/traces-stacks: SGLang 0.5.23, PP2, CPU, the lab's
4-layer Llama, so SGLang's `get_pp_indices` gives 2,2) holds the Python tracer's module events,
one `nn.Module: LlamaDecoderLayer_<i>` per layer a rank runs."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from microbench.sglang.cpu_steps import layer_costs
from microbench.sglang.steps import read_loop
from microbench.sglang_lab.cases import PARTITION_ENV, split_plan
from reports.lab.whatifs import change_of
from reports.model.observed import layer_split as ls
from reports.model.observed.deployment import from_evidence
from reports.model.settings_change import LAYER_PARTITION
from reports.model.observed import bench_run as ow

LAB = Path(__file__).parent / "fixtures" / "sglang_lab" / "clean-c8"


def _loop(sub: str):
    files = {int(p.name.split("-PP-")[1].split(".")[0]): p
             for p in (LAB / sub).glob("*.trace.json.gz")}
    return read_loop(files)


@pytest.fixture(scope="module")
def stacks():
    return _loop("traces-stacks")


def test_the_layers_each_rank_ran_are_read_from_the_module_events(stacks):
    assert [stacks.ranks[r].layers_per_forward for r in sorted(stacks.ranks)] == [2, 2]
    for x in stacks.ranks.values():
        per = x.curve("layer_us_by_batch", None)
        fwd = x.curve("forward_us_by_batch", None)
        assert per and set(per) <= set(fwd)
        # a rank's layers are part of its forward, never more than it
        assert all(0 < 2 * per[b] < 1.2 * fwd[b] for b in per)


def test_a_window_without_stacks_times_no_layer():
    plain = _loop("traces")
    assert all(x.layers_per_forward is None and not x.layer_us_by_batch
               for x in plain.ranks.values())
    dep = from_evidence(plain, concurrency=8, observed=None)
    assert ls.split_of(dep) is None and "stacks" in ls.why_not(dep)


def test_layer_costs_counts_the_layers_inside_each_forward():
    dec = [{"start": 0.0, "end": 100.0, "batch": 2}, {"start": 200.0, "end": 300.0, "batch": 2},
           {"start": 400.0, "end": 500.0, "batch": 4}]
    layers = [(10, 30), (40, 60), (210, 240), (250, 280), (410, 450), (460, 500),
              (600, 610)]                      # the last one is in no forward
    got = layer_costs(dec, layers)
    assert got["layers_per_forward"] == 2
    assert got["layer_us_by_batch"] == {"2": 25.0, "4": 40.0}
    assert layer_costs(dec, []) == {}


@pytest.fixture(scope="module")
def dep(stacks):
    return from_evidence(stacks, concurrency=8, observed=None)


def test_resplit_moves_whole_layers(dep):
    assert ls.split_of(dep) == (2, 2)
    new = ls.resplit(dep, "3,1")
    assert new.layers == (3, 1)
    for b, v in dep.forward[0].items():
        L = ls.layer_at(dep, b)
        assert new.forward[0][b] == pytest.approx(v + L)
        assert new.forward[1][b] == pytest.approx(max(0.0, dep.forward[1][b] - L))
    assert ls.resplit(dep, "2,2").forward == dep.forward
    for bad in ("4,0", "2,1", "1,1,2", "a,b"):
        with pytest.raises(ValueError):
            ls.resplit(dep, bad)


def test_neighbours_are_one_layer_away():
    assert sorted(ls.neighbours((2, 2))) == [(1, 3), (3, 1)]
    assert ls.neighbours((1, 1)) == []
    assert set(ls.neighbours((7, 7, 8))) == {(8, 6, 8), (6, 8, 8), (7, 8, 7), (7, 6, 9)}


def test_without_stacks_the_layers_follow_sglangs_rule_over_the_models_layers():
    # SGLang 0.5.23 get_pp_indices: SGLANG_PP_LAYER_PARTITION where set, else the even split
    # with the last ranks one layer more
    plain = _loop("traces")
    for total, part, want in ((4, None, (2, 2)), (5, None, (2, 3)), (4, "3,1", (3, 1))):
        loop = replace(plain, num_layers=total, layer_partition=part)
        dep = from_evidence(loop, concurrency=8, observed=None)
        assert ls.split_of(dep) == want and not dep.layer_us and ls.why_not(dep) is None
        assert ("even split" in dep.layers_from) == (part is None)
        assert "forward over its layers" in ls.cost_from(dep)


def test_module_events_on_a_gpu_are_not_layer_times(stacks):
    # on a GPU the module events time the launches: the split then rests on the forward
    gpu = replace(stacks, device="gpu",
                  ranks={r: replace(x, device=None) for r, x in stacks.ranks.items()})
    dep = from_evidence(gpu, concurrency=8, observed=None)
    assert dep.device == "gpu" and not dep.layer_us and ls.split_of(dep) is None
    assert "--model" in ls.why_not(dep)
    dep = from_evidence(replace(gpu, num_layers=4), concurrency=8, observed=None)
    assert ls.split_of(dep) == (2, 2) and not dep.layer_us


def test_a_split_from_the_forward_scales_each_ranks_forward_by_its_layers():
    dep = from_evidence(replace(_loop("traces"), num_layers=4), concurrency=8, observed=None)
    new = ls.resplit(dep, "3,1")
    for r, k in ((0, 1.5), (1, 0.5)):
        for b, v in dep.forward[r].items():
            assert new.forward[r][b] == pytest.approx(v * k)
            assert ls.layer_at(dep, b, r) == pytest.approx(v / 2)
        for b, v in dep.forward_busy[r].items():
            assert new.forward_busy[r][b] == pytest.approx(v * k)


def test_the_observed_server_is_offered_the_split_and_it_is_predicted(dep):
    server = ow.observed_settings(2, dep.slots - 2)
    load = ow.Load(concurrency=8, prompts=18, output_len=128, prompt_len=64)
    before = ow.bench_run(dep, server, load)
    cands = __import__("reports.model.observed.whatifs", fromlist=["x"]).candidates(
        server, load, before, dep)
    split = [c for c in cands if c.knob == LAYER_PARTITION]
    assert len(split) == 1 and split[0].value in ("3,1", "1,3")
    p = ow.predict(dep, server, load, LAYER_PARTITION, "3,1")
    assert p.after.tok_per_s != p.before.tok_per_s
    # the rank that gains a layer is the one whose forward grows: moving every layer's worth
    # onto one rank can only lengthen the step
    worst = ow.predict(dep, server, load, LAYER_PARTITION, "1,3")
    assert min(p.change_pct, worst.change_pct) < 0


def test_the_lab_plan_alternates_the_splits_and_names_the_change():
    plan = split_plan(pp=2, layers=4, rounds=2)
    envs = [dict(g.env).get(PARTITION_ENV) for g in plan]
    assert envs == [None, "3,1", "1,3", None, "3,1", "1,3"]
    base = next(c for c in plan[0].cases)
    assert base.window_stacks and base.profile
    from reports.base.payloads.lab_case import CasePlan, LabCase
    after = LabCase(CasePlan(8), env={PARTITION_ENV: "3,1"})
    before = LabCase(CasePlan(8))
    assert change_of(after, before) == (LAYER_PARTITION, "3,1")
    assert change_of(before, before) is None


def test_a_gpu_server_gets_its_split_from_the_models_layers():
    # a PP2 H200 recording of the PP-loop probe with rank 1 slowed (tests/fixtures/h200x2), read
    # by an older ppscope: `--model kimi-k2` named, its 61 layers read from the preset here
    from reports.base.records import read_record
    from reports.model.observed.deployment import OBSERVED_CAUSES, run
    rec = read_record(Path(__file__).parent / "fixtures" / "h200x2" / "fault_cases" / "slow-stage"
                      / "diag-even-c8-sglang.json")
    dep = from_evidence(rec.payload.loop, concurrency=8, observed=None)
    assert dep.device == "gpu" and ls.split_of(dep) == (30, 31) and not dep.layer_us
    full = run(dep, frozenset(OBSERVED_CAUSES)).tpot_ms
    fix = ls.split_fix(dep, full)
    assert fix.now == "30,31" and fix.gain_pct > 0 and fix.gain_ci is None
    # the split balances the model of the loop, not the forwards alone: rank 0's host work
    # is on its critical path too, so no split one layer away runs a shorter step
    best = tuple(int(x) for x in fix.value.split(","))
    assert fix.step_ms == pytest.approx(run(ls.resplit(dep, fix.value),
                                            frozenset(OBSERVED_CAUSES)).tpot_ms, abs=1e-3)
    for n in ls.neighbours(best):
        assert run(ls.resplit(dep, ls.text(n)), frozenset(OBSERVED_CAUSES)).tpot_ms >= \
            fix.step_ms - 1e-3
