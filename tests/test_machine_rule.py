"""A record made on another machine never decides a verdict about the user's (DESIGN: evidence
first): the CUDA-graph verdict for the built-in RTX PRO 6000 PP8 scenario with a graphs.json
measured on one H200 says which machine that record describes, as topology's already does."""
from __future__ import annotations

import json
from dataclasses import replace

from reports.base.payloads.graphs import GraphPoint, GraphsData
from reports.base.records import make_record, write_record
from reports.cli import main


def graphs_record(tmp_path, gpus: tuple[str, ...]):
    d = GraphsData(model="kimi-k2", pp=8, max_bs=256, capture_sizes=(1, 2, 4, 8),
                   by_batch=tuple(GraphPoint(batch=b, padded_to=b, eager_us=900.0 + b,
                                             graph_us=400.0 + b) for b in (1, 2, 4, 8)))
    rec = make_record("graphs", d, argv=["ppscope", "graphs"])
    rec = replace(rec, provenance=replace(rec.provenance, gpus=gpus))
    write_record(rec, tmp_path / "graphs.json")


def graph_verdict(tmp_path) -> dict:
    assert main(["report", "--results", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    text = json.dumps(rep)
    assert "graphs.json" in text
    vs = [v for v in rep["verdicts"] if "graph" in json.dumps(v).lower()
          and "fall" in json.dumps(v).lower()]
    assert vs, rep["verdicts"]
    return vs[0]


def test_an_h200_graphs_record_does_not_decide_the_rtx_pro_6000_verdict(tmp_path):
    graphs_record(tmp_path, ("NVIDIA H200",))
    v = graph_verdict(tmp_path)
    text = json.dumps(v)
    assert "graphs.json describes 1x NVIDIA H200, the deployment 8x rtx-pro-6000" in text, v
    assert "(measured)" not in text


def test_the_deployments_own_graphs_record_decides_it(tmp_path):
    graphs_record(tmp_path, ("NVIDIA RTX PRO 6000 Blackwell Server Edition",) * 8)
    v = graph_verdict(tmp_path)
    assert "graphs.json (measured)" in json.dumps(v), v


# Every other verdict's inputs (reports/model/verdicts.py `elsewhere`): a stage_cost.json or
# topology.json of one H200 host never decides a verdict about the RTX PRO 6000 PP8 scenario.
H200 = "1x NVIDIA H200, the deployment 8x rtx-pro-6000"


def _on(rec, gpus):
    return replace(rec, provenance=replace(rec.provenance, gpus=gpus, host="h200-box"))


def _verdicts(records: dict, scenario_records: dict | None = None) -> dict:
    from reports.model.attribution import attribute
    from reports.model.scenario.inputs import build_inputs, load_scenario
    from reports.model.verdicts import model_verdicts
    inp = build_inputs(load_scenario("seed-pp8"), scenario_records or {})
    vs = model_verdicts(inp, [attribute(inp, C) for C in inp.concurrency], records)
    return {v.hypothesis: v for v in vs}


def _h200_stage_cost():
    from reports.base.payloads.stage_cost import LayerPoint, StageCostData
    d = StageCostData(model="kimi-k2", pp=8, gpu="h200", mem_bw_gbps=4800.0, zipf_s=1.0,
                      layers={"moe": {"8": LayerPoint(measured_us=500.0)}})
    return _on(make_record("stage_cost", d, argv=[]), ("NVIDIA H200",))


def _h200_topology():
    from reports.base.payloads.topology import HopCost, TopoGpu, TopologyData
    d = TopologyData(source="live", gpus=(TopoGpu(0, "NVIDIA H200"),), links={},
                     links_source="nvidia-smi", pipeline=(0,),
                     hops=(HopCost(src=0, dst=0, batch=1, bytes=28672, hop_us=300.0),))
    return _on(make_record("topology", d, argv=[]), ("NVIDIA H200",))


def test_an_h200_stage_cost_does_not_decide_stage_imbalance():
    v = _verdicts({"stage_cost": _h200_stage_cost()})["stage imbalance"]
    assert v.verdict == "not enough evidence", v
    assert f"stage_cost.json describes {H200}" in v.number and "h200-box" in v.evidence


def test_an_h200_zipf_run_does_not_label_routing_measured():
    v = _verdicts({"stage_cost": _h200_stage_cost()})["MoE routing imbalance"]
    assert "measured" not in v.evidence and f"stage_cost.json describes {H200}" in v.evidence


def test_an_h200_topology_does_not_decide_bandwidth_or_numa():
    topo = _h200_topology()
    vs = _verdicts({"topology": topo}, {"topology": topo})
    bw, numa = vs["bandwidth is not the limit"], vs["cross-socket NUMA"]
    assert "(measured)" not in bw.evidence and "describes 1x NVIDIA H200" in bw.evidence, bw
    assert "link bandwidth (spec)" in bw.evidence
    assert numa.verdict == "not enough evidence" and f"describes {H200}" in numa.number
