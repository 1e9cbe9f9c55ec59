"""Report rendering: HTML page, Markdown order, terminal summary, answer, TP what-if numbers."""
import json
import re
from dataclasses import replace

import pytest

from reports.model.scenario import loop_builder as lb
from reports.cli import main
from reports.base.payloads.topology import HopCost, TopoGpu, TopologyData, TransportPoint
from reports.base.records import make_record, write_record
from reports.model.scenario.inputs import build_inputs, load_scenario
from reports.model.scenario.whatifs import (RING_STEP_LATENCY_US, _tp_tok_s, allreduce_us, transport_points,
                            transport_us)


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


def test_html_is_self_contained_and_ordered(tmp_path, check_report_schema):
    _topology(tmp_path)
    assert main(["report", "--results", str(tmp_path), "--out", str(tmp_path)]) == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    check_report_schema(rep)
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
    assert not re.search(r"""(?:src|href)\s*=\s*["']?https?:""", page)
    assert "<script" not in page and "<link" not in page
    # the herd, throughput, stage, timeline, links
    assert page.count('src="data:image/png;base64,') == 5
    heads = ["The answer", "Throughput", "Verdicts", "Where the time goes", "What-ifs",
             "Per-stage cost", "Links between GPUs", "Inputs", "Scenario assumptions"]
    h2 = re.findall(r"<h2[^>]*>([^<]*)</h2>", page)
    assert [next(h for h in heads if t.startswith(h)) for t in h2
            if any(t.startswith(h) for h in heads)] == heads
    import html as _html
    for s in rep["answer"]:
        assert f"<li>{_html.escape(s)}</li>" in page
    # one verdict pill per hypothesis in the answer table, and again in the verdict table
    assert page.count('<span class="pill v-') == 2 * len(rep["verdicts"])
    assert page.count("<tr class=\"total\">") == len(rep["attribution"])
    assert '<td class="n">301.0' not in page  # hops are plotted, not tabled
    assert "<th>ms per decode step</th>" in page and '<span class="pill s-measured">' in page


def test_md_order_and_answer(tmp_path):
    (tmp_path / "none").mkdir()
    assert main(["report", "--results", str(tmp_path / "none"), "--out", str(tmp_path)]) == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    md = (tmp_path / "report.md").read_text()
    heads = ["## The answer", "## Throughput", "## Verdicts", "## Where the time goes",
             "## What-ifs", "## Inputs", "## Scenario assumptions"]
    pos = [md.index(h) for h in heads]
    assert pos == sorted(pos)
    assert md.index("**Every figure below is estimated or transferred") < pos[0]
    assert "| C | ideal tok/s |" in md.replace("   ", " ").replace("  ", " ")
    ans = rep["answer"]
    assert 3 <= len(ans) <= 6
    # the user's hypotheses first, each with the concurrencies where it holds
    assert ans[0].startswith("Your hypotheses, judged at every concurrency: thundering herd / "
                             "uneven split: holds at C=8")
    assert "[row herd]" in ans[0] and "bandwidth is not the limit: holds" in ans[0]
    assert ans[1].startswith("Biggest cause of the gap between ideal and modelled throughput: ")
    assert "thundering herd at C=8" in ans[1]
    assert ans[2].startswith("The answer hangs on how requests arrive: C=8 ")
    rec = rep["recommendation"]
    assert rec["eligible"] and rec == rep["what_ifs"][0]
    best = next(a for a in ans if a.startswith("Best single server setting"))
    assert f"{rec['knob']} = {rec['setting']}, " in best
    assert all(f"C={e['concurrency']} " in best for e in rec["effects"])
    assert "outside PP, a rough estimate, not a measurement, puts TP instead of PP" in best
    assert any("C=32 observed 248.1 vs modelled" in a and "ms/step slower" in a for a in ans)
    assert ans[-1].startswith("Every figure except the observed tok/s is estimated or "
                              "transferred")
    for s in ans:
        assert f"- {s}" in md
    # SGLang 0.5.23's flag for the decode graphs' capture size (it has no --cuda-graph-max-bs)
    assert "(--cuda-graph-max-bs-decode " in md and "--cuda-graph-max-bs " not in md


def test_herd_share_is_a_number_that_matches_its_row(tmp_path):
    (tmp_path / "none").mkdir()
    assert main(["report", "--results", str(tmp_path / "none"), "--out", str(tmp_path)]) == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    herd = next(v for v in rep["verdicts"] if v["cause"] == "herd")
    assert herd["verdict"] == "holds"
    for a in herd["at"]:
        att = next(x for x in rep["attribution"] if x["concurrency"] == a["concurrency"])
        row = next(r for r in att["rows"] if r["cause"] == "herd")
        assert a["share"] == row["share"]
        assert a["verdict"] == ("holds" if row["share"] >= 0.15 else
                                "does not hold" if row["share"] < 0.05 else "minor")
    assert {a["concurrency"]: a["verdict"] for a in herd["at"]}[8] == "holds"
    # one name per cause in every rendering
    md = (tmp_path / "report.md").read_text()
    assert "| herd " in md.replace("  ", " ") and "slot_imbalance" not in md


def test_recommendation_loses_nowhere_it_claims_to_hold(tmp_path):
    from reports.model.scenario import loop_builder as lb
    from reports.model.scenario import whatifs as wi
    from reports.model.scenario.inputs import build_inputs, load_scenario
    inp = build_inputs(load_scenario("seed-pp8"), {})
    rows = wi.what_ifs(inp)
    rec = wi.recommendation(rows)
    assert rec is not None and rec.checked_up_to == 4 * 32
    assert rec.mixed.gain >= -wi.MAX_LOSS
    ov = rec.changes
    top = rec.checked_up_to if rec.loses_at is None else rec.holds_up_to
    for C in wi.range_cs(inp):
        if C <= top:
            assert lb.run(inp, C, changes=ov).tok_per_s >= (1 - wi.MAX_LOSS) * lb.run(inp, C).tok_per_s
    # a tie goes to the setting that holds over the widest range
    tied = [w for w in rows if w.eligible and w.gain >= rec.gain - wi.TIE and w.checked_up_to]
    assert all(w.loses_at is not None or rec.loses_at is None for w in tied)


def test_nonexistent_results_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["report", "--results", str(tmp_path / "typo"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "typo" in err[0] and "no such folder" in err[0]
    assert not (tmp_path / "typo").exists() and not (tmp_path / "report.json").exists()


def test_html_holds_every_section_of_the_md(tmp_path):
    (tmp_path / "none").mkdir()
    assert main(["report", "--results", str(tmp_path / "none"), "--out", str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    page = (tmp_path / "report.html").read_text()
    md_heads = [h.strip() for h in re.findall(r"^#{2,3} (.+)$", md, re.M)]
    html_heads = [re.sub(r"<[^>]+>", "", h).strip()
                  for h in re.findall(r"<h[23][^>]*>(.*?)</h[23]>", page)]
    import html as _html
    html_heads = [_html.unescape(h) for h in html_heads]
    assert [h for h in md_heads if h not in html_heads] == []
    assert [h for h in html_heads if h not in md_heads] == []
    for cmd in re.findall(r"^   ([^`\s].*)$", md, re.M):   # every command of "Measure your server"
        assert _html.escape(cmd) in page


def test_terminal_summary_compact(tmp_path, capsys):
    (tmp_path / "none").mkdir()
    assert main(["report", "--results", str(tmp_path / "none"), "--out", str(tmp_path)]) == 0
    cap = capsys.readouterr()
    out = cap.out.splitlines()
    assert len(out) <= 25
    assert out[0] == f"every figure is estimated or transferred (no records in {tmp_path / 'none'}/)"
    assert out[1].split()[:2] == ["hypothesis", "verdict"]
    assert "Measure your server" in out[-1] and out[-2].startswith(f"wrote {tmp_path}/report.")


def _md_table_rows(md: str) -> list[list[str]]:
    """Each markdown table of report.md as its rows' cell counts (a `\\|` is inside a cell)."""
    tables, cur = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            cur.append(len(re.split(r"(?<!\\)\|", line)) - 2)
        elif cur:
            tables.append(cur)
            cur = []
    return tables


def test_a_pipe_in_a_cell_stays_in_its_cell():
    from reports.render.render_md import md_table
    from reports.render.table import Table
    t = Table(("file", "value"), (("runs|a.json", "1"), ("two\nlines", None)), (False, True))
    md = md_table(t)
    assert "runs\\|a.json" in md and "two lines" in md and "None" not in md
    assert _md_table_rows(md) == [[2, 2, 2, 2]]
