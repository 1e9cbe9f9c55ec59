"""The layer split checked on SGLang's own server (the lab's `--split` plan, BENCHMARKS 19).

tests/fixtures/sglang_lab/split/: SGLang 0.5.23's PP2 CPU server with the lab's 4-layer Llama,
servers alternating: SGLang's default split (2,2), `SGLANG_PP_LAYER_PARTITION=3,1` and `1,3`,
three rounds, one bench_serving run each at C = 8. The first default server's window was
profiled with SGLang's defaults (stacks; trimmed by microbench/sglang_lab/fixtures.py
--iterations 30, slimmed with one pass whole); the others keep their bench_serving runs and
case.json only. SGLang applied each split: its log's KV-cache lines give the 1-layer rank half
the K size of the 3-layer one. What must hold: the layers are read from the module events, the
report offers the split on that server, and the lab's table pairs each split with its default
runs and predicts it from the default server's evidence. No timing is asserted here."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from reports.cli import main
from reports.lab.whatifs import whatif_rows
from reports.model.settings_change import LAYER_PARTITION

SPLIT = Path(__file__).parent / "fixtures" / "sglang_lab" / "split"
BASE = SPLIT / "sp-base-c8.1"


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    if not BASE.is_dir():
        pytest.skip("no split recording")
    rec = tmp_path_factory.mktemp("records")
    (rec / BASE.name).mkdir()
    assert main(["sglang", "--log", str(BASE / "server.log"), "--traces", str(BASE / "traces"),
                 "--bench", str(BASE / "bench.jsonl"), "--concurrency", "8",
                 "--json", str(rec / BASE.name / "sglang.json")]) == 0
    return rec


def test_the_default_split_is_read_from_sglangs_module_events(records):
    loop = json.loads((records / BASE.name / "sglang.json").read_text())["data"]["loop"]
    assert [loop["ranks"][r]["layers_per_forward"] for r in ("0", "1")] == [2, 2]
    assert all(loop["ranks"][r]["layer_us_by_batch"] for r in ("0", "1"))


def test_the_report_offers_the_split_on_that_server(records):
    res = records / BASE.name
    assert main(["report", "--results", str(res)]) == 0
    rep = json.loads((res / "report.json").read_text())
    rows = [r for r in rep["server_whatifs"]["rows"] if r["knob"] == LAYER_PARTITION]
    assert len(rows) == 1 and rows[0]["setting"] in ("3,1", "1,3")
    assert f"{LAYER_PARTITION}={rows[0]['setting']}" in rows[0]["command"]


def test_the_lab_table_predicts_each_split_from_the_default_server(records):
    rows = {r["value"]: r for r in whatif_rows(SPLIT, records=records)}
    assert set(rows) == {"3,1", "1,3"}
    for r in rows.values():
        assert r["knob"] == LAYER_PARTITION and r["interleaved"]
        assert r["before_runs"] == 3 and r["after_runs"] == 3
        assert r["evidence"] == BASE.name
        assert r["predicted_pct"] != 0.0
