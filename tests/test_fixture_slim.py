"""The lab's traces are `slim`med (microbench/sglang_lab/fixtures.py): after their first loop
passes, the events no reader takes are left out. That is safe only while it is true: here each
recorded case is slimmed from its very first pass, and what ppscope reads of it (the loop
profile and the trace summary) must not change."""
from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import pytest

from microbench.sglang.steps import read_loop
from microbench.sglang.trace import read_traces
from microbench.sglang_lab.fixtures import FULL_ITERATIONS, slim, trim_trace, unread

LAB = Path(__file__).parent / "fixtures" / "sglang_lab"
CASES = ["clean-c8/traces", "clean-c8/traces-stacks", "host-delay/traces"]


def _rank_files(d: Path) -> dict[int, Path]:
    files = sorted(d.glob("*.trace.json.gz"))
    return {int(p.name.split("-PP-")[1].split(".")[0]): p for p in files}


def _docs(d: Path) -> dict[str, dict]:
    return {p.name: json.loads(gzip.open(p, "rt").read()) for p in d.glob("*.trace.json.gz")}


def _plain(x):
    return dataclasses.asdict(x) if dataclasses.is_dataclass(x) else x


@pytest.mark.parametrize("case", CASES)
def test_slimming_from_the_first_pass_changes_nothing_read(case, tmp_path):
    src = LAB / case
    if not src.is_dir():
        pytest.skip(f"no {case} recording")
    dropped = 0
    for name, doc in _docs(src).items():
        ev = doc["traceEvents"]
        kept = slim(ev, full_iterations=0)
        dropped += len(ev) - len(kept)
        first = min(e["ts"] for e in ev if e.get("name") == "recv_requests")
        assert not any(unread(e) and e["ts"] >= first for e in kept)
        trim_trace({**doc, "traceEvents": kept}, tmp_path / name, None)
    assert dropped, "the recording's first passes keep CPU ops: there is something to drop"
    before, after = read_loop(_rank_files(src)), read_loop(_rank_files(tmp_path))
    assert _plain(after) == _plain(before)
    t0, t1 = _plain(read_traces(src, workers=1)), _plain(read_traces(tmp_path, workers=1))
    t0.pop("dir"), t1.pop("dir")
    for r in t0["ranks"]:                 # the event count is the only thing that may differ
        t0["ranks"][r].pop("events", None), t1["ranks"][r].pop("events", None)
        t0["ranks"][r].pop("file", None), t1["ranks"][r].pop("file", None)
    assert t1 == t0


def test_the_first_passes_keep_every_event():
    doc = json.loads(gzip.open(next((LAB / "clean-c8" / "traces").glob("*.gz")), "rt").read())
    ev = doc["traceEvents"]
    marks = sorted(e["ts"] for e in ev if e.get("name") == "recv_requests" and e.get("ph") == "X")
    early = [e for e in ev if e.get("ph") == "X" and e["ts"] < marks[FULL_ITERATIONS]]
    late = [e for e in ev if e.get("ph") == "X" and e["ts"] >= marks[FULL_ITERATIONS]]
    assert any(unread(e) for e in early)         # the format as the profiler wrote it
    assert not any(unread(e) for e in late)
    assert slim(ev) == ev                         # slimming twice changes nothing
