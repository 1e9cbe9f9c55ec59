"""The herd of an observed server drawn from its own traces (reports/render/observed_herd.py).

Fixture: the lab's recording of SGLang 0.5.23's own PP2 server on CPU at C = 8 with its
defaults (tests/fixtures/sglang_lab/whatif/wl-base-c8.1: server log, both ranks' traces,
bench_serving's run), read by `ppscope sglang` as a user's server would be.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from microbench.sglang import forward_window
from reports.base.records import read_record
from reports.cli import main
from reports.render.observed_herd import FILE, traced_spans

CASE = Path(__file__).parent / "fixtures" / "sglang_lab" / "whatif" / "wl-base-c8.1"


def _sglang(out: Path, traces: bool) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    args = ["sglang", "--log", str(CASE / "server.log"), "--bench", str(CASE / "bench.jsonl"),
            "--concurrency", "8", "--json", str(out / "sglang.json")]
    if traces:
        args += ["--traces", str(CASE / "traces")]
    assert main(args) == 0
    return out


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    res = _sglang(tmp_path_factory.mktemp("traced") / "results", traces=True)
    out = res.parent / "out"
    assert main(["report", "--results", str(res), "--out", str(out), "--no-cache"]) == 0
    return read_record(res / "sglang.json").payload.loop, out


def test_the_loop_profile_keeps_a_capped_window_of_every_ranks_forwards(traced):
    loop, _ = traced
    assert loop.forwards
    ranks = {f.rank for f in loop.forwards}
    assert ranks == {0, 1}
    for r in ranks:
        assert len([f for f in loop.forwards if f.rank == r]) <= forward_window.MAX_PER_RANK
    assert min(f.start_us for f in loop.forwards) == 0.0
    assert all(f.end_us > f.start_us for f in loop.forwards)
    assert {f.mode for f in loop.forwards} <= {"DECODE", "EXTEND"}


def test_lanes_and_slots_follow_the_micro_batches_down_the_pipeline(traced):
    loop, out = traced
    rep = json.loads((out / "report.json").read_text())
    slots = rep["diagnosis"]["deployment"]["slots"]
    spans = traced_spans(loop, slots)
    assert {s.rank for s in spans} == {0, 1}          # one lane per PP rank
    assert {s.slot for s in spans} <= set(range(slots))
    # SGLang's burst of 8 at C = 8 went into two micro-batches (7 and 1): two slots occupied,
    # and each keeps its size on both ranks
    assert len({s.slot for s in spans if s.rank == 0}) == 2
    size = {}
    for s in spans:
        if s.rank == 0 and s.batch:
            size.setdefault(s.slot, set()).add(s.batch)
    assert sorted(min(v) for v in size.values()) == [1, 7]
    for s in spans:
        if s.rank == 1 and s.batch:
            up = [u for u in spans if u.rank == 0 and u.end_us <= s.start_us]
            if up:
                feeder = max(up, key=lambda u: u.end_us)
                assert (feeder.slot, feeder.batch) == (s.slot, s.batch)


def test_the_report_shows_the_traced_loop_beside_its_model(traced):
    _, out = traced
    png = (out / FILE).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    assert f"]({FILE})" in md and "The loop your server ran, from its own traces" in md
    assert base64.b64encode(png).decode() in html
    assert md.index(f"]({FILE})") < md.index("### In detail")


def test_without_traces_it_is_absent_with_one_line_why(tmp_path):
    res = _sglang(tmp_path / "results", traces=False)
    assert main(["report", "--results", str(res), "--out", str(tmp_path / "out"),
                 "--no-cache"]) == 0
    assert not (tmp_path / "out" / FILE).exists()
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    why = [w for w in rep["warnings"] if w.startswith("the traced loop is not drawn")]
    assert len(why) == 1 and "--traces" in why[0] and "\n" not in why[0]


def test_the_window_is_taken_from_the_middle_and_capped():
    fw = {r: [{"start": 100.0 * i + 10 * r, "end": 100.0 * i + 10 * r + 50, "batch": 4,
               "mode": "DECODE", "visit": i} for i in range(200)] for r in (0, 1, 2)}
    rows = forward_window.keep(fw, max_per_rank=8)
    first = [d for d in rows if d["rank"] == 0]
    assert [d["visit"] for d in first] == list(range(96, 104))
    assert all(len([d for d in rows if d["rank"] == r]) <= 8 for r in (0, 1, 2))
    assert rows[0]["start_us"] == 0.0
    assert forward_window.keep({0: []}) == [] and forward_window.keep({}) == []
