"""The diagnosis from SGLang's /metrics alone (microbench/sglang/metrics_window.py,
reports/model/observed/metrics_verdicts.py), on the lab's two scrapes of SGLang 0.5.23's PP2 CPU server
(tests/fixtures/sglang_lab/metrics-window/: a scrape at the case's start and at its end, cut to
the series read, by microbench/sglang_lab/fixtures.py `trim_window`): the clean C=8 case and
the slow-stage case (rank 1's forward x3)."""
from __future__ import annotations

import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from microbench.sglang import metrics_window as mw
from microbench.sglang.metrics import parse_metrics
from reports.model.observed import metrics_verdicts as mv
from tests.test_fuzz_bad_inputs import one_line_error, run

FIX = Path(__file__).parent / "fixtures"
WIN = FIX / "sglang_lab" / "metrics-window"
# SGLang's own environment: the lab's venv (`ppscope sglang-lab`, default `.lab`), or any
# python with prometheus_client named by PPSCOPE_SGLANG_PYTHON
LAB_PY = Path(os.environ.get("PPSCOPE_SGLANG_PYTHON")
              or Path(__file__).resolve().parents[1] / ".lab" / "venv" / "bin" / "python")


def pages(case: str) -> list[str]:
    return [str(WIN / case / "metrics-start.txt"), str(WIN / case / "metrics.txt")]


def window(case: str) -> dict:
    return mw.window(*mw.read_pages(pages(case))[:2])


def test_the_window_is_the_difference_of_the_two_scrapes():
    w = window("slow-stage")
    r0, r1 = w["ranks"]["0"], w["ranks"]["1"]
    # run_batch: 9.95782067 - 7.184205715999999 and 16.299181187000002 - 7.862991223
    assert r0["stage_s"]["run_batch"] == pytest.approx(2.773614954, abs=1e-9)
    assert r1["stage_s"]["run_batch"] == pytest.approx(8.436189964, abs=1e-9)
    assert r1["decode_passes"] == 2516 - 1770 and r1["decode_graph_passes"] == 0
    assert r0["fwd_occupancy_pct"] is None and r0["fwd_occupancy_nan"]   # NaN on the lab
    assert r0["graphs_captured"] is False and w["scrapes"] == 2


def test_slow_stage_from_metrics_alone_names_rank_1():
    v, number, ev, rank = mv.slow_stage(window("slow-stage"))
    assert (v, rank) == ("holds", 1), number
    assert "observed (metrics)" in ev and "fwd_occupancy NaN" in number


def test_the_clean_case_has_no_slow_stage_and_graphs_off_by_setting():
    w = window("clean-c8")
    v, number, _, rank = mv.slow_stage(w)
    assert v == "does not hold", number     # rank 1 (sampling) 4% above the mean
    g = mv.graph_verdict(w)
    assert g[0] == "does not hold" and g[1].startswith("off by setting"), g


def test_occupancy_where_it_is_a_number_gives_the_bubble():
    text = "\n".join(f'sglang:{n}{{pp_rank="{r}"}} {v}' for r, occ, rb in (("0", 40, 5), ("1", 90, 9))
                     for n, v in (("fwd_occupancy", occ),
                                  ('scheduler_stage_seconds_total{category="run_batch"}', rb)))
    text = text.replace('}{', ',')
    w = mw.window([parse_metrics(text)], "hand-made")
    b, how = mv.bubble(mv.as_window(w).ranks["0"])
    assert b == pytest.approx(0.6) and how == "1 - fwd_occupancy"
    assert "fwd_occupancy rank 0 40%, rank 1 90%" in mv.slow_stage(w)[1]


def prom_export(case: str, t0: float = 1000.0, t1: float = 1060.0) -> dict:
    """The two pages as Prometheus's /api/v1/query_range answers them (matrix, string values)."""
    first, last = (Path(p).read_text() for p in pages(case))
    series: dict[str, dict] = {}
    for t, text in ((t0, first), (t1, last)):
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            key, val = line.rsplit(" ", 1)
            name, _, rest = key.partition("{")
            labels = dict(kv.split("=", 1) for kv in rest.rstrip("}").split(",") if kv)
            m = {"__name__": name, **{k: v.strip('"') for k, v in labels.items()}}
            series.setdefault(key, {"metric": m, "values": []})["values"].append([t, val])
    return {"status": "success", "data": {"resultType": "matrix", "result": list(series.values())}}


def test_a_prometheus_export_gives_the_same_window(tmp_path):
    f = tmp_path / "grafana.json"
    f.write_text(json.dumps(prom_export("slow-stage")))
    p, src, secs = mw.read_pages([str(f)])
    w = mw.window(p, src, secs)
    assert secs == 60.0 and "Prometheus query_range" in w["source"]
    assert w["ranks"] == window("slow-stage")["ranks"]


def test_bad_windows_are_one_line_errors(tmp_path, capsys):
    a, b = pages("slow-stage")
    rc, _, err = run(["sglang", "--metrics", b, a, "--json", tmp_path / "s.json"], capsys)
    one_line_error(rc, err, "went down between the scrapes")
    f = tmp_path / "x.json"
    f.write_text('{"data": {"resultType": "vector", "result": []}}')
    rc, _, err = run(["sglang", "--metrics", f, "--json", tmp_path / "s.json"], capsys)
    one_line_error(rc, err, "query_range")
    rc, _, err = run(["sglang", "--metrics", a, b, a, "--json", tmp_path / "s.json"], capsys)
    one_line_error(rc, err, "one or two scrapes")


def test_the_report_from_metrics_alone(tmp_path, capsys):
    """`ppscope sglang --metrics A B` then `ppscope report`: the graph verdict (off by setting
    on the CPU server), the per-rank figures and the slow stage, rank 1."""
    assert run(["sglang", "--metrics", *pages("slow-stage"), "--json",
                tmp_path / "sglang.json"], capsys)[0] == 0
    rc, out, err = run(["report", "--results", tmp_path, "--out", tmp_path / "out"], capsys)
    assert rc == 0, err
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    vs = {v["hypothesis"]: v for v in rep["verdicts"]}
    g, s = vs["CUDA-graph fallback"], vs["stage imbalance"]
    assert g["number"].startswith("off by setting") and "observed (metrics)" in g["evidence"]
    assert s["verdict"] == "holds" and "slowest stage PP rank 1" in s["number"]
    lines = rep["server"]["metrics_lines"]
    assert lines[0].startswith("/metrics, PP rank 0 [observed (metrics)]")
    assert "cannot tell" in lines[-1] and "slot sizes" in lines[-1]


def test_metrics_beside_the_log_show_a_disagreement():
    from reports.base.payloads.sglang import LogRank, SglangData
    from reports.model.verdicts import graph_evidence
    sg = SglangData(ranks={"0": LogRank(decode_lines=20, cuda_graph_frac=1.0)},
                    metrics_window=mv.as_window(window("slow-stage")))
    v, number, ev = graph_evidence(sg)
    assert v == "does not hold" and "log:" in number and "/metrics (observed (metrics))" in number
    assert "the evidence disagrees" in number, number


class _Pages(BaseHTTPRequestHandler):
    served: list[bytes] = []

    def do_GET(self):
        body = self.served.pop(0) if len(self.served) > 1 else self.served[0]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def advanced(case: str, share: float) -> bytes:
    """The case's second scrape as if taken `share` of the way through its window: each
    sample of the first page moved that share towards the last (counters and gauges alike)."""
    first, last = (Path(p).read_text().splitlines() for p in pages(case))
    end = dict(ln.rsplit(" ", 1) for ln in last if ln and not ln.startswith("#"))
    out = []
    for ln in first:
        if ln and not ln.startswith("#") and ln.rsplit(" ", 1)[0] in end:
            key, v = ln.rsplit(" ", 1)
            try:
                a, b = float(v), float(end[key])
                ln = f"{key} {a + share * (b - a)!r}"
            except ValueError:
                pass
        out.append(ln)
    return ("\n".join(out) + "\n").encode()


def test_a_live_window_takes_both_scrapes_itself(tmp_path, capsys):
    # the lab's window was 40 s; the live one is about 1 s: its second page is 1/40 of the
    # way (a page 40 s on in a 1 s window is another server's, and refused: test_fuzz_scrapes)
    _Pages.served = [Path(pages("slow-stage")[0]).read_bytes(), advanced("slow-stage", 1 / 40)]
    srv = HTTPServer(("127.0.0.1", 0), _Pages)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_port}"
        rc, out, err = run(["sglang", "--url", url, "--metrics-window", "1", "--json",
                            tmp_path / "s.json"], capsys)
    finally:
        srv.shutdown()
    assert rc == 0, err
    data = json.loads((tmp_path / "s.json").read_text())["data"]
    assert data["metrics_window"]["seconds"] >= 1.0 and data["live"] is None
    assert data["metrics_window"]["ranks"]["1"]["stage_s"]["run_batch"] == pytest.approx(
        8.436189964 / 40)


# The product keeps its own text parser (microbench/sglang/metrics.py): ppscope's runtime
# dependencies are fixed. prometheus_client (SGLang's own dependency) checks it here, through
# the lab venv's python, on every recorded page.
_PROM = """
import json, math, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for fam in text_string_to_metric_families(open(sys.argv[1]).read()):
    for s in fam.samples:
        out.append([s.name, s.labels, None if math.isnan(s.value) else s.value])
print(json.dumps(out))
"""


@pytest.mark.parametrize("page", [FIX / "sglang_lab" / "clean-c8" / "metrics.txt",
                                  FIX / "sglang" / "metrics.txt", *map(Path, pages("slow-stage"))])
def test_the_text_parser_agrees_with_prometheus_client(page):
    if not LAB_PY.exists():
        pytest.skip("no SGLang environment (prometheus_client): set PPSCOPE_SGLANG_PYTHON")
    samples = json.loads(subprocess.run([str(LAB_PY), "-c", _PROM, str(page)], check=True,
                                        capture_output=True, text=True, timeout=120).stdout)
    ours = parse_metrics(page.read_text())
    n = 0
    for name, labels, v in samples:
        if not name.startswith("sglang:") or name.endswith(("_bucket", "_sum", "_count")):
            continue
        rank = labels.pop("pp_rank", "0")
        if v is None:
            assert name[len("sglang:"):] in ours["nan"][rank]
            continue
        for k in ("tp_rank", "moe_ep_rank", "model_name", "engine_type"):
            labels.pop(k, None)
        extra = ",".join(f"{k}={labels[k]}" for k in sorted(labels))
        key = name[len("sglang:"):] + (f"{{{extra}}}" if extra else "")
        if v < 0:
            continue     # ours skips negative values (counted in lines_other)
        assert ours["ranks"][rank][key] == pytest.approx(v), key
        n += 1
    assert n >= 5
