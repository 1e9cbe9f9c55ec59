"""What the report makes of real-world inputs: a DP-attention server log (every DP rank's batches
shown and counted) and a pasted `nvidia-smi topo -m` (labelled `given`, its unknown links
undecided, what the parser skipped said), next to a probed topology that stays `measured`.

Fixtures: tests/fixtures/sglang/dp_attention_pp2_tp4_dp4.log (PP2, 4 DP ranks per PP rank; DP
ranks 0/1 run 2 requests, 2/3 run 6; gen tok/s medians 52/62/152/162 on PP0 and one more on PP1;
PP1 DP3 off the CUDA graph on 1 of its 3 lines), tests/fixtures/topo/
issue_paste_asymmetric_cell_4gpu.txt (the GPU1/GPU2 cell reads NODE in one row, SYS in the
other: unknown), readme_trimmed_numa_notes_shifted_row.txt (two sockets, every link readable).
"""
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from reports.cli import main
from reports.base.payloads.topology import HopCost
from reports.base.records import make_record
from reports.model.scenario.inputs import build_inputs, load_scenario
from reports.model.report_type import Report
from reports.render.terminal import server_line

ROOT = Path(__file__).resolve().parents[1]


def _report(check, res: Path, *extra) -> tuple[dict, str, str]:
    out = res / "out"
    assert main(["report", "--results", str(res), "--out", str(out), *extra]) == 0
    rep = json.loads((out / "report.json").read_text())
    check(rep)
    return rep, (out / "report.md").read_text(), (out / "report.html").read_text()


@pytest.fixture
def report_of(check_report_schema):
    """`_report` with the report checked against its schema."""
    return lambda *a, **k: _report(check_report_schema, *a, **k)


def _verdict(rep: dict, name: str) -> dict:
    return next(v for v in rep["verdicts"] if v["hypothesis"] == name)


def _section(md: str, title: str) -> str:
    return md[md.index(title):].split("\n## ", 1)[0]


# -- DP attention ------------------------------------------------------------------------------

@pytest.fixture
def dp_report(tmp_path, fixtures, report_of):
    log = fixtures / "sglang" / "dp_attention_pp2_tp4_dp4.log"
    assert main(["sglang", "--log", str(log), "--json", str(tmp_path / "sglang.json")]) == 0
    return report_of(tmp_path)


def test_dp_attention_report_json_counts_every_dp_rank(dp_report):
    rep, _, _ = dp_report
    s = rep["server"]
    assert s["dp_ranks"] == 4 and "summed over the DP ranks" in s["dp_rules"]
    r0, r1 = s["ranks"]
    for r in (r0, r1):   # 4 DP ranks x 3 decode lines: not DP0's 3
        assert (r["decode_lines"], r["prefill_lines"]) == (12, 4)
        assert r["running_req"] == {"min": 2, "median": 4.0, "max": 6}
        assert [d["dp"] for d in r["dp"]] == [0, 1, 2, 3]
        assert [d["decode_lines"] for d in r["dp"]] == [3, 3, 3, 3]
        assert [d["running_req"]["median"] for d in r["dp"]] == [2.0, 2.0, 6.0, 6.0]
    assert [d["gen_tok_per_s_median"] for d in r0["dp"]] == [52.0, 62.0, 152.0, 162.0]
    assert (r0["gen_tok_per_s_dp_sum"], r1["gen_tok_per_s_dp_sum"]) == (428.0, 432.0)
    assert r1["cuda_graph_frac"] == pytest.approx(11 / 12)
    assert r1["dp"][3]["cuda_graph_frac"] == pytest.approx(2 / 3)
    # the index is the PP rank's, pooled over every DP rank's windows
    assert s["slot_imbalance"]["dp_ranks"] == 4 and s["slot_imbalance"]["dp"] is None


def test_dp_attention_verdicts_use_every_dp_rank(dp_report):
    rep, _, _ = dp_report
    g = _verdict(rep, "CUDA-graph fallback")
    # pooled per PP rank 92% would read as no fallback; DP3 of PP1 is at 67%
    assert g["verdict"] == "holds"
    assert g["number"] == ("log: lowest per-rank share of decode batches on graphs 67% (rank 1 "
                           "DP 3); over all DP ranks' decode batches per PP rank 0: 100%, 1: 92%")
    h = _verdict(rep, "thundering herd / uneven split")
    assert "(log, PP rank 0, 12 decode lines of 4 DP ranks): slot size median 4, max 6" \
        in h["number"]
    assert server_line(Report.from_json(rep)).endswith("DP attention, 4 DP ranks per PP rank, all counted; gen "
                                     "tok/s summed over DP ranks [log] 428 432")


def test_dp_attention_report_md_and_html_show_each_dp_rank(dp_report):
    rep, md, html = dp_report
    sec = _section(md, "### Scheduler log per PP rank and DP rank (DP attention)")
    rows = [ln for ln in sec.splitlines() if ln.startswith("|") and ln[1:].strip()[:1].isdigit()]
    assert [tuple(c.strip() for c in ln.split("|")[1:3]) for ln in rows] == [
        (str(p), str(d)) for p in (0, 1) for d in range(4)]
    assert rows[-1].split("|")[6].strip() == "67%" and rows[3].split("|")[7].strip() == "162.0"
    per_pp = _section(md, "### Scheduler log per PP rank\n")
    assert "gen tok/s, sum of DP ranks' medians [log]" in per_pp
    assert "428.0" in per_pp and "432.0" in per_pp
    assert "4 DP ranks per PP rank in the log. DP attention: every DP rank" in md
    assert "Slot-imbalance index [log, PP rank 0, all 4 DP ranks]" in md
    assert "Scheduler log per PP rank and DP rank (DP attention)</h3>" in html
    assert html.count("<td") > md.count("|         1 |")   # the DP table is in the page too


# -- pasted topology ---------------------------------------------------------------------------

def _pasted(tmp_path, fixtures, name: str) -> Path:
    src = fixtures / "topo" / f"{name}.txt"
    assert main(["topology", "--from-nvidia-smi", str(src), "--json",
                 str(tmp_path / "topology.json"), "--no-png"]) == 0
    return tmp_path


def test_pasted_unknown_link_leaves_numa_undecided_and_is_given(tmp_path, fixtures, report_of):
    rep, md, html = report_of(_pasted(tmp_path, fixtures, "issue_paste_asymmetric_cell_4gpu"))
    v = _verdict(rep, "cross-socket NUMA")
    assert v["verdict"] == "not enough evidence"
    assert v["number"].startswith("undecided: link GPU1\u2013GPU2 unknown in the pasted table")
    assert v["number"].endswith("known to cross: GPU3->GPU0 SYS")
    assert v["evidence"] == "topology.json (given)"
    t = rep["topology"]
    assert (t["source"], t["pasted"], t["links_unknown"]) == ("given", True, ["1-2"])
    assert t["pipeline_hops"][1] == {"src": 1, "dst": 2, "link": None, "hop_class": None}
    assert t["notes"][0] == ("line 9: GPU2->GPU1 is SYS but GPU1->GPU2 is NODE (matrix not "
                             "symmetric); link unknown")
    sec = _section(md, "## Links between GPUs (topology.json, given)")
    assert "measured" not in sec
    assert "Unknown links (1 GPU pair(s) the pasted table left unreadable" in sec
    assert "GPU1\u2013GPU2." in sec
    assert "What the parser skipped or could not read in the pasted table:" in sec
    assert f"- {t['notes'][0]}" in sec
    assert "| GPU1 -> GPU2 | unknown" in sec and "| GPU3 -> GPU0 | SYS" in sec
    assert "Links between GPUs (topology.json, given)</h2>" in html
    assert any(line.startswith("The topology record lists") and "labelled given" in line
               for line in md.splitlines())


def test_pasted_crossing_is_given_never_measured(tmp_path, fixtures, report_of):
    # every link readable: the 3->4 and 7->0 hops are SYS. Before, a pasted record (no timed
    # hops) gave "no PP hop crosses a socket" labelled measured
    rep, md, _ = report_of(_pasted(tmp_path, fixtures, "readme_trimmed_numa_notes_shifted_row"))
    v = _verdict(rep, "cross-socket NUMA")
    assert v["number"].startswith("2 PP hop(s) cross a socket (GPU3->GPU4 SYS, GPU7->GPU0 SYS, "
                                  "link levels given)")
    assert v["evidence"].startswith("topology.json (given) + ")
    assert "measured" not in v["evidence"]
    assert rep["topology"]["links_unknown"] == []
    assert "line 12: row GPU5 has 7 link entries" in _section(md, "## Links between GPUs")


def test_pasted_record_with_hops_labels_hop_cost_given(fixtures):
    from topology.probe import from_smi_text
    rec = from_smi_text((fixtures / "topo" / "rtxpro6000x8_pcie.txt").read_text())
    assert rec.payload.figure_label == "given"
    hops = tuple(HopCost(src=i, dst=i + 1, batch=1, hop_us=50.0) for i in range(7))
    rec = make_record("topology", replace(rec.payload, hops=hops), argv=[])
    inp = build_inputs(load_scenario("seed-pp8"), {"topology": rec})
    assert inp.src("hop_us") == ("given", "topology.json")


def test_probed_topology_stays_measured(tmp_path, report_of):
    # the 2x H200 record the topology probe wrote, under a 2x H200 scenario (a model whose
    # weights fit two H200s: Kimi K2's 553 GiB do not)
    shutil.copy(ROOT / "tests" / "fixtures" / "h200x2" / "topology.json", tmp_path / "topology.json")
    sc = json.loads((ROOT / "configs" / "scenarios" / "seed-pp8.json").read_text())
    sc.update(name="h200-pp2", gpu="h200", pp=2, model="llama-3-70b")
    (tmp_path / "sc.json").write_text(json.dumps(sc))
    rep, md, _ = report_of(tmp_path, "--scenario", str(tmp_path / "sc.json"))
    assert rep["topology"]["source"] == "measured" and rep["topology"]["pasted"] is False
    v = _verdict(rep, "cross-socket NUMA")
    assert (v["verdict"], v["number"], v["evidence"]) == (
        "does not hold", "no PP hop crosses a socket", "topology.json (measured)")
    hop = next(p for p in rep["params"] if p["name"] == "hop_us")
    assert (hop["source"], hop["evidence"]) == ("measured", "topology.json")
    assert "## Links between GPUs (topology.json, measured)" in md


def test_pasted_table_parsed_on_a_gpu_machine_still_decides(tmp_path, fixtures, report_of):
    # parsed where a GPU is present, the record's provenance names that machine's GPU (here one
    # H200); the pasted table describes the user's server, so that must not make the report
    # call it "another machine" (this failed on a 1x H200 before the fix)
    res = _pasted(tmp_path, fixtures, "readme_trimmed_numa_notes_shifted_row")
    path = res / "topology.json"
    rec = json.loads(path.read_text())
    rec["provenance"]["gpus"] = ["NVIDIA H200"]
    path.write_text(json.dumps(rec))
    rep, _, _ = report_of(res)
    v = _verdict(rep, "cross-socket NUMA")
    assert v["number"].startswith("2 PP hop(s) cross a socket (GPU3->GPU4 SYS, GPU7->GPU0 SYS, "
                                  "link levels given)")
