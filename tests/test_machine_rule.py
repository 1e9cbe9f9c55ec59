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
