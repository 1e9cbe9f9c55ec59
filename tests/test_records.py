import json
import math
from dataclasses import dataclass

import pytest

from reports.base import records
from reports.base.records import (RecordError, beside, make_record, read_record, save_record,
                                  write_record)


@dataclass(frozen=True)
class _Point:
    latency_us: float
    bandwidth_gbps: float | None
    sizes: tuple[int, ...]


def test_round_trip(tmp_path):
    # a probe without a payload class: the envelope alone (typed payloads: test_payloads.py)
    rec = make_record("example", {"points": [_Point(1.5, math.nan, (1, 2))]}, argv=["x"])
    path = write_record(rec, tmp_path / "example.json")
    back = read_record(path)
    assert back.probe == "example" and back.status == "ok"
    assert back.schema_version == records.SCHEMA_VERSION
    # NaN never reaches JSON; tuples become lists
    assert back.data == {"points": [{"latency_us": 1.5, "bandwidth_gbps": None, "sizes": [1, 2]}]}
    assert back.provenance.argv == ("x",)
    assert back.provenance.utc.endswith("+00:00")


def test_waived_needs_reason():
    with pytest.raises(ValueError):
        make_record("topology", None, status="waived")
    rec = records.waived("topology", "needs NVIDIA GPUs", argv=[])
    assert rec.status == "waived" and rec.reason == "needs NVIDIA GPUs"


def test_bad_status_rejected():
    with pytest.raises(ValueError):
        make_record("x", {}, status="fine", reason="r")


def test_atomic_write_leaves_no_temp_files(tmp_path):
    write_record(make_record("a", {"v": 1}, argv=[]), tmp_path / "a.json")
    write_record(make_record("a", {"v": 2}, argv=[]), tmp_path / "a.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]
    assert read_record(tmp_path / "a.json").data == {"v": 2}


def test_unserialisable_value_does_not_clobber_old_file(tmp_path):
    path = write_record(make_record("a", {"v": 1}, argv=[]), tmp_path / "a.json")
    with pytest.raises(TypeError):
        records.write_json_atomic(path, {"v": object()})
    assert json.loads(path.read_text())["data"] == {"v": 1}


@pytest.mark.parametrize("content, fragment", [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "not an object"),
    ('{"probe": "x"}', "not a ppscope record"),
])
def test_corrupt_record_one_line_error(tmp_path, content, fragment):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(RecordError) as e:
        read_record(p)
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg and fragment in msg


def test_provenance_does_not_import_torch():
    import subprocess, sys
    code = ("import sys; from reports.base.records import collect_provenance; collect_provenance([]); "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ---- the status rule (reports.base.records.save_record) ----

def _rec(status: str, v: int):
    return make_record("a", {"v": v}, status=status, reason=None if status == "ok" else "why",
                       argv=[])


def test_ok_replaces_ok(tmp_path):
    path = tmp_path / "a.json"
    save_record(_rec("ok", 1), path)
    dest, note = save_record(_rec("ok", 2), path)
    assert dest == path and note is None and read_record(path).data == {"v": 2}


@pytest.mark.parametrize("status", ["waived", "error", "partial"])
def test_other_statuses_go_beside_an_ok_record(tmp_path, status):
    path = tmp_path / "a.json"
    save_record(_rec("ok", 1), path)
    dest, note = save_record(_rec(status, 2), path)
    assert dest == beside(path, status) == tmp_path / f"a.{status}.json"
    assert read_record(path).data == {"v": 1} and read_record(dest).status == status
    assert f"kept the ok record {path}" in note and str(dest) in note and "\n" not in note


@pytest.mark.parametrize("status", ["waived", "error"])
def test_failed_runs_go_beside_a_partial_record(tmp_path, status):
    path = tmp_path / "a.json"
    save_record(_rec("partial", 1), path)
    dest, _ = save_record(_rec(status, 2), path)
    assert dest == beside(path, status) and read_record(path).status == "partial"


def test_partial_replaces_partial_and_anything_replaces_a_failed_record(tmp_path):
    path = tmp_path / "a.json"
    save_record(_rec("partial", 1), path)
    assert save_record(_rec("partial", 2), path) == (path, None)
    save_record(_rec("error", 3), tmp_path / "b.json")
    assert save_record(_rec("waived", 4), tmp_path / "b.json")[0] == tmp_path / "b.json"


def test_ok_removes_stale_beside_files(tmp_path):
    path = tmp_path / "a.json"
    save_record(_rec("ok", 1), path)
    for st in ("waived", "error", "partial"):
        save_record(_rec(st, 2), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a.error.json", "a.json", "a.partial.json", "a.waived.json"]
    save_record(_rec("ok", 3), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]
    assert read_record(path).data == {"v": 3}


def _plan(v: int):
    return make_record("a", {"v": v}, argv=["ppscope", "a", "--plan"])


def test_a_plan_never_replaces_a_measured_record(tmp_path):
    # a plan measured nothing: over a measured record it goes beside as a.plan.json
    path = tmp_path / "a.json"
    save_record(_rec("ok", 1), path)
    dest, note = save_record(_plan(2), path, plan=True)
    assert dest == tmp_path / "a.plan.json" and read_record(path).data == {"v": 1}
    assert f"kept the ok record {path}" in note and "this plan run went to" in note
    save_record(_rec("ok", 3), path)                      # a measured run still replaces it


def test_a_plan_replaces_a_plan_and_fills_an_empty_place(tmp_path):
    path = tmp_path / "a.json"
    assert save_record(_plan(1), path, plan=True) == (path, None)
    assert save_record(_plan(2), path, plan=True) == (path, None)
    assert read_record(path).data == {"v": 2}
