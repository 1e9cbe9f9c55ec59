"""Routing-skew verdict and the stage-cost --plan routing block (seeded, exact numbers)."""
from dataclasses import replace

import pytest

from reports.model.scenario import loop_builder as lb
from reports.model.attribution import attribute
from reports.base.payloads.stage_cost import LayerPoint, StageCostData
from reports.base.records import make_record
from reports.model.scenario.inputs import build_inputs, load_scenario
from reports.model.verdicts import routing_verdict


@pytest.fixture(scope="module")
def seed():
    return build_inputs(load_scenario("seed-pp8"), {})


def _verdict(inp, records=None):
    att = attribute(inp, 32)
    sizes = [s for s in lb.admitted_sizes(inp, 32) if s]
    return routing_verdict(inp, att, records or {}, sizes)


def test_seed_routing_verdict_is_quantitative(seed):
    v = _verdict(seed)
    # seed scenario (uniform routing) re-run at zipf 1: fewer distinct experts per micro-batch
    # of 8 -> faster; skew cannot explain the gap, and routing noise never changes the slowest
    # stage (lm_head keeps stage 7 slowest).
    base = lb.run(seed, 32).tok_per_s
    skew = lb.run(replace(seed, zipf_s=1.0), 32).tok_per_s
    assert skew / base - 1 == pytest.approx(0.265, abs=5e-4)
    assert v.verdict == "does not hold"
    assert "+26.5% at C=32" in v.number and "max/mean 1.242 at b=8" in v.number
    assert "slowdown = 0% of the gap" in v.number
    assert v.evidence == "roofline Monte-Carlo (estimated)"


def test_measured_label_needs_a_measured_zipf_run(seed):
    plan = StageCostData(model="kimi-k2", pp=8, gpu="h200", mem_bw_gbps=4800.0, zipf_s=1.0)
    data = replace(plan, layers={"moe": {"8": LayerPoint(measured_us=500.0)}})
    v = _verdict(seed, {"stage_cost": make_record("stage_cost", data)})
    assert v.evidence == "stage_cost.json (measured with --zipf)"
    v = _verdict(seed, {"stage_cost": make_record("stage_cost", plan)})
    assert v.evidence == "roofline Monte-Carlo (estimated)"


def test_stage_cost_plan_routing_block(tmp_path):
    from microbench.stage_cost import probe as sc
    from microbench.stage_cost.cli import render_routing

    cfg = sc.StageCostConfig(plan=True, batches=(1, 8, 32), out=tmp_path / "sc.json")
    r = sc.run(cfg)[0].payload.routing
    assert list(r.by_zipf) == ["0", "0.5", "1", "1.5"]
    e = r.by_zipf["1"]["8"]
    assert e.distinct_experts == pytest.approx(44.10963, abs=1e-4)
    assert e.moe_bytes_per_token == pytest.approx(148_287_002.3, rel=1e-8)  # (router + shared + 44.11 experts) / 8
    assert r.by_zipf["0"]["1"].stage_spread_max_over_mean == pytest.approx(1.526104, abs=1e-6)
    table = render_routing(r)
    assert "s=1.5: experts / MB/token / stage max/mean" in table
    assert "44.1 / 148 / 1.238" in table  # seed 0, 200 draws, batches up to 32
