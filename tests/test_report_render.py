"""Report rendering: HTML page, Markdown order, terminal summary, answer, TP what-if numbers."""
import json
import re
from dataclasses import replace

import pytest

from reports.model import loop_builder as lb
from reports.cli import main
from reports.base.payloads.topology import HopCost, TopoGpu, TopologyData, TransportPoint
from reports.base.records import make_record, write_record
from reports.model.scenario import build_inputs, load_scenario
from reports.model.whatif import (RING_STEP_LATENCY_US, _tp_tok_s, allreduce_us, transport_points,
                            transport_us)
from tests.test_report import SCHEMA, validate


@pytest.fixture(scope="module")
def seed():
    return build_inputs(load_scenario("seed-pp8"), {})


def _hop(src, dst, b, hop_us, transport_us=13.0):
    return HopCost(src=src, dst=dst, batch=b, bytes=b * 28672, hop_us=hop_us,
                   nccl_transport_us=transport_us, link="NV18", hop_class="nvlink")


TWO_H200 = TopologyData(source="live", gpus=(TopoGpu(0, "NVIDIA H200"), TopoGpu(1, "NVIDIA H200")),
                        links={"0-1": "NV18"}, links_source="nvidia-smi", pipeline=(0, 1))


def _topology(tmp_path):
    # shape of topology.json on 2 GPUs joined by NVLink (numbers rounded, ours)
    data = replace(TWO_H200,
                   hops=(_hop(0, 1, 1, 301.0), _hop(0, 1, 8, 308.0), _hop(1, 0, 1, 450.0)),
                   nccl_transport=(TransportPoint(bytes=1024, nccl_transport_us=5.0),
                                   TransportPoint(bytes=2048, nccl_transport_us=9.0)))
    write_record(make_record("topology", data, argv=[]), tmp_path / "topology.json")


def test_transport_interpolation_is_linear_in_bytes():
    pts = [(128.0, 6.0), (2048.0, 8.0)]
    assert transport_us(pts, 64) == 6.0                      # flat below the smallest size
    assert transport_us(pts, 1088) == pytest.approx(7.0)     # 6 + 2 x 960/1920
    assert transport_us(pts, 4096) == pytest.approx(8.0 + 2.0 * 2048 / 1920)  # last slope
    assert transport_us([(100.0, 3.0)], 1e6) == 3.0


def test_transport_points_prefer_sweep_then_hops():
    sweep = replace(TWO_H200, nccl_transport=(TransportPoint(bytes=8, nccl_transport_us=6.5),),
                    hops=(HopCost(src=0, dst=1, batch=1, bytes=8, nccl_transport_us=99.0),))
    assert transport_points(sweep) == [(8.0, 6.5)]
    hops = replace(TWO_H200, hops=(HopCost(src=0, dst=1, batch=1, bytes=100,
                                           nccl_transport_us=10.0),
                                   HopCost(src=1, dst=0, batch=1, bytes=100,
                                           nccl_transport_us=14.0),
                                   HopCost(src=0, dst=1, batch=2, bytes=200)))
    assert transport_points(hops) == [(100.0, 12.0)]
    assert transport_points(None) == [] and transport_points(TWO_H200) == []


def test_tp_allreduce_ring_on_measured_transport(seed):
    # Kimi K2 hidden 7168, bf16, C=1, p=8: S = 14336 B, ring step carries S/8 = 1792 B;
    # measured 5 us at 1 KiB, 9 us at 2 KiB -> step = 5 + 4 x 768/1024 = 8 us; 2(p-1) = 14 steps
    ar, how = allreduce_us(seed, 1, [(1024.0, 5.0), (2048.0, 9.0)])
    assert ar == pytest.approx(112.0)
    assert how.startswith("14 steps of 1792 B, measured")
    tok, ar2, _ = _tp_tok_s(seed, 1, [(1024.0, 5.0), (2048.0, 9.0)])
    step = sum(lb.stage_cost_us(seed, lb.ALL_ON, 1)) / 8 + 2 * 61 * 112.0 + seed.host_us
    assert ar2 == pytest.approx(112.0) and tok == pytest.approx(1e6 / step)


def test_tp_allreduce_pcie_estimate(seed):
    # no measurement: 7 us per step + 1792 B / (PCIe Gen5 x16 = 16 x 3.938 GB/s)
    ar, how = allreduce_us(seed, 1)
    assert RING_STEP_LATENCY_US == 7.0
    assert ar == pytest.approx(14 * (7.0 + 1792 / (16 * 3.938e9) * 1e6))
    assert "estimated" in how and "63 GB/s" in how
    # one batch of 1 on 8 GPUs reading 1/8 of the weights each beats PP8's serial stages once
    # an all-reduce costs tens of us rather than a PP hop's hundreds
    assert _tp_tok_s(seed, 1)[0] > lb.run(seed, 1).tok_per_s


def test_html_is_self_contained_and_ordered(tmp_path):
    _topology(tmp_path)
    assert main(["report", "--results", str(tmp_path), "--out", str(tmp_path)]) == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    validate(rep, SCHEMA)
    assert rep["topology"]["hops"] == [
        {"src": 0, "dst": 1, "batch": 1, "hop_us": 301.0, "link": "NV18", "hop_class": "nvlink"},
        {"src": 1, "dst": 0, "batch": 1, "hop_us": 450.0, "link": "NV18", "hop_class": "nvlink"}]
    tp = [w for w in rep["what_ifs"] if w["knob"].startswith("TP")]
    assert all("measured NCCL transport" in w["note"] for w in tp)
    # eligible server settings first, each group best first on the objective
    order = [(not w["eligible"], -round(w["gain"], 9)) for w in rep["what_ifs"]]
    assert order == sorted(order)
    page = (tmp_path / "report.html").read_text()
    # self-contained: no fetched resource, no script, every link is an in-page anchor
    assert re.findall(r"""\b(?:src|href)\s*=\s*(\S{6})""", page)
    assert all(v.startswith(('"data:', '"#')) for v in
               re.findall(r"""\b(?:src|href)\s*=\s*(\S{6})""", page))
    assert "http://" not in page and "https://" not in page
    assert "<script" not in page and "<link" not in page
    assert page.count('src="data:image/png;base64,') == 4   # throughput, stage, timeline, links
    heads = ["The answer", "Throughput", "Verdicts", "Where the time goes", "What-ifs",
             "Per-stage cost", "Links between GPUs", "Inputs", "Scenario assumptions"]
    h2 = re.findall(r"<h2[^>]*>([^<]*)</h2>", page)
    assert [next(h for h in heads if t.startswith(h)) for t in h2
            if any(t.startswith(h) for h in heads)] == heads
    for s in rep["answer"]:
        assert f"<li>{s.replace('&', '&amp;').replace('<', '&lt;').replace('>', '&gt;')}</li>" \
            in page
    assert page.count('<span class="pill v-') == len(rep["verdicts"])
    assert page.count("<tr class=\"total\">") == len(rep["attribution"])
    assert '<td class="n">301.0' not in page  # hops are plotted, not tabled
    assert "<th>ms per decode step</th>" in page and '<span class="pill s-measured">' in page


def test_md_order_and_answer(tmp_path):
    assert main(["report", "--results", str(tmp_path / "none"), "--out", str(tmp_path)]) == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    md = (tmp_path / "report.md").read_text()
    heads = ["## The answer", "## Throughput", "## Verdicts", "## Where the time goes",
             "## What-ifs", "## Inputs", "## Scenario assumptions"]
    pos = [md.index(h) for h in heads]
    assert pos == sorted(pos)
    assert md.index("**Every figure below is estimated") < pos[0]
    assert "| C | ideal tok/s |" in md.replace("   ", " ").replace("  ", " ")
    ans = rep["answer"]
    assert 3 <= len(ans) <= 5
    assert ans[0].startswith("Biggest cause of the gap between ideal and modelled throughput: ")
    assert "too few micro-batches in flight at C=8" in ans[0]
    assert ans[1].startswith("Holds: bandwidth is not the limit")
    rec = rep["recommendation"]
    assert rec["eligible"] and rec == next(w for w in rep["what_ifs"] if w["eligible"])
    assert ans[2].startswith("Best single server setting (geometric mean of tok/s over the "
                             "measured concurrencies, none worse by over 2%): "
                             f"{rec['knob']} = {rec['setting']}, ")
    assert all(f"C={e['concurrency']} " in ans[2] for e in rec["effects"])
    assert "outside PP, a rough estimate, not a measurement, puts TP instead of PP" in ans[2]
    assert "C=32 observed 248.1 vs modelled" in ans[3] and "ms/step slower" in ans[3]
    assert ans[4].startswith("Every figure except the observed tok/s is estimated")
    for s in ans:
        assert f"- {s}" in md


def test_terminal_summary_compact(tmp_path, capsys):
    assert main(["report", "--results", str(tmp_path / "none"), "--out", str(tmp_path)]) == 0
    cap = capsys.readouterr()
    out = cap.out.splitlines()
    assert len(out) <= 45
    assert out[0] == f"every figure is estimated (no records in {tmp_path / 'none'}/)"
    assert f"note: {tmp_path / 'none'} does not exist" in cap.err  # a typo is not "no records"
    assert out[1] == "The answer:" and out[2].startswith("  - Biggest cause")
    i = next(k for k, line in enumerate(out) if line.startswith("top what-if"))
    rows = out[i + 2:i + 5]
    rep = json.loads((tmp_path / "report.json").read_text())
    knobs = list(dict.fromkeys(w["knob"] for w in rep["what_ifs"]))[:3]
    assert [r.startswith(k) for r, k in zip(rows, knobs)] == [True] * 3
    assert out[i + 5] == ""
    assert any(line.startswith("verdicts -- holds: ") for line in out)
