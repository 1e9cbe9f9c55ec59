"""Typed payloads: every shipped record loads and validates; a wrong field fails with one line
naming the file and the field; the writer refuses what its readers would reject."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from reports.base.payloads import PAYLOADS
from reports.base.payloads.graphs import GraphPoint, GraphsData
from reports.base.payloads.stage_cost import StageCostData
from reports.base.records import RecordError, make_record, read_record
from reports.base.schema import from_json, to_json

ROOT = Path(__file__).parent.parent
RUNS = ROOT / "tests" / "fixtures"    # h200x2/: records of 2x H200, copied from docs/runs/
SHIPPED = sorted(p for d in (ROOT / "tests" / "fixtures", ROOT / "configs" / "records")
                 for p in d.glob("**/*.json") if not p.name.endswith(".trace.json")
                 and '"provenance"' in p.read_text())   # probe records, not other inputs


def test_shipped_records_are_found():
    assert {read_record(p).probe for p in SHIPPED} >= {"topology", "stage_cost", "graphs",
                                                       "dispatch"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_record_loads_typed(path):
    rec = read_record(path)
    assert rec.probe in PAYLOADS, f"{rec.probe}: no payload class"
    data = rec.payload
    assert isinstance(data, PAYLOADS[rec.probe])
    # the shape is stable: writing the payload back and reading it gives the same object
    assert from_json(type(data), json.loads(json.dumps(to_json(data)))) == data


def _broken(tmp_path, name: str, edit) -> Path:
    d = json.loads((RUNS / "h200x2" / name).read_text())
    edit(d["data"])
    out = tmp_path / name
    out.write_text(json.dumps(d))
    return out


@pytest.mark.parametrize("name, edit, message", [
    ("stage_cost.json",
     lambda d: d["stages"][0]["by_batch"]["8"].update(measured_us="x"),
     "data.stages[0].by_batch.8.measured_us: expected a number >= 0, got 'x'"),
    ("stage_cost.json",
     lambda d: d["layers"]["moe"]["1"].update(efficiency=7.5),
     "data.layers.moe.1.efficiency: expected a number <= 1.5, got 7.5"),
    ("stage_cost.json", lambda d: d.pop("model"), "data.model: missing"),
    ("topology.json", lambda d: d["hops"][3].update(hop_us=-2.0),
     "data.hops[3].hop_us: expected a number >= 0, got -2.0"),
    ("topology.json", lambda d: d["p2p"][0].update(op="copy"),
     "data.p2p[0].op: expected one of 'write', 'read', got 'copy'"),
    ("topology.json", lambda d: d["gpus"][1].update(vram="141GB"),
     "data.gpus[1].vram: unknown field"),
    ("graphs.json", lambda d: d["by_batch"][2].update(padding_waste=1.5),
     "data.by_batch[2].padding_waste: expected a number <= 1, got 1.5"),
    ("graphs.json", lambda d: d.update(max_bs="256"),
     "data.max_bs: expected an integer >= 1, got '256'"),
])
def test_wrong_field_is_one_line_naming_file_and_field(tmp_path, name, edit, message):
    path = _broken(tmp_path, name, edit)
    with pytest.raises(RecordError) as e:
        read_record(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: {message}") and "\n" not in msg


def test_report_on_a_wrong_field_is_one_line_exit_2(tmp_path, capsys):
    from reports.cli import main
    _broken(tmp_path, "graphs.json", lambda d: d["by_batch"][0].update(eager_us=None,
                                                                       graph_us="fast"))
    assert main(["report", "--results", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "graphs.json: data.by_batch[0].graph_us: expected a number" in err
    assert "\n" not in err


def test_writer_refuses_what_readers_would_reject():
    d = StageCostData(model="kimi-k2", pp=2, gpu="h200", mem_bw_gbps=4800.0,
                      batches=(0,))                   # a batch of 0 requests
    with pytest.raises(ValueError, match=r"data.batches\[0\]: expected a number >= 1"):
        make_record("stage_cost", d, argv=[])
    with pytest.raises(TypeError, match="must be a StageCostData"):
        make_record("stage_cost", GraphsData(model="m", pp=1, max_bs=8), argv=[])
    g = GraphsData(model="m", pp=1, max_bs=8, by_batch=(GraphPoint(batch=1, eager_us=-1.0),))
    with pytest.raises(ValueError, match=r"by_batch\[0\].eager_us: expected a number >= 0"):
        make_record("graphs", g, argv=[])
