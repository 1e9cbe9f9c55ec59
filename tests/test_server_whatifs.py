"""The observed server's own what-ifs (reports/model/observed/whatifs.py): which settings are tried
on the model of the traced loop, and what the report says where it cannot try them.

The candidates on hand-made settings (each case says why a setting is or is not worth trying),
and the whole path on a recording of SGLang 0.5.23's own PP2 server on the CPU
(tests/fixtures/sglang_lab/whatif/wl-base-c8.1: C = 8, SGLang's defaults), read by
`ppscope sglang` as a user would."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from reports.cli import main
from reports.model.observed import bench_run as ow
from reports.model.observed import whatifs as sw
from reports.model.settings_change import WhatIf, effect

CASE = Path(__file__).parent / "fixtures" / "sglang_lab" / "whatif" / "wl-base-c8.1"
RUN = ow.Run(tok_per_s=100.0, seconds=18.0, mean_in_flight=8.0, steady_sizes=(7, 1),
             prefill_visits=10)


def _knobs(server, load):
    return {c.knob: c.value for c in sw.candidates(server, load, RUN)}


def test_defaults_at_c8_try_the_depths_the_spread_and_pacing():
    # SGLang's defaults on PP2: cap = rows // pp = 1024 lets a burst of 8 sit in one slot
    server = ow.observed_settings(pp=2, depth=0, cap=None, rows=2048, chunk=8192)
    load = ow.Load(concurrency=8, prompts=18, output_len=128, prompt_len=64)
    k = _knobs(server, load)
    assert k["--pp-async-batch-depth"] == 2           # 1 and pp: the dict keeps the last
    assert k["--pp-max-micro-batch-size"] == 4        # ceil(8 / 2)
    assert k["--request-rate"] == 1.0                 # 18 prompts finished in 18 s
    # 8 x 64 tokens fit the 8192 budget, 2048 rows hold 8 streams: neither is worth trying
    assert "--chunked-prefill-size" not in k and "--max-running-requests" not in k


def test_a_small_budget_and_few_rows_are_tried_larger():
    server = ow.observed_settings(pp=2, depth=1, cap=2, rows=4, chunk=64)
    load = ow.Load(concurrency=8, prompts=18, output_len=128, prompt_len=64, rate=4.0)
    c = {x.knob: (x.value, x.note) for x in sw.candidates(server, load, RUN)}
    assert c["--max-running-requests"][0] == 8
    assert c["--chunked-prefill-size"][0] == 512      # 8 x 64 = 512, a power of two
    assert "holds 1" in c["--chunked-prefill-size"][1]
    # the cap already splits the burst finer than pp slots; a paced run is not paced again
    assert "--pp-max-micro-batch-size" not in c and "--request-rate" not in c
    assert {x.value for x in sw.candidates(server, load, RUN)
            if x.knob == "--pp-async-batch-depth"} == {0, 2}


def test_one_stream_tries_only_the_depths():
    server = ow.observed_settings(pp=2, depth=0, cap=None, rows=2048, chunk=8192)
    load = ow.Load(concurrency=1, prompts=4, output_len=128, prompt_len=64)
    assert {x.knob for x in sw.candidates(server, load, RUN)} == {"--pp-async-batch-depth"}


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    out = tmp_path_factory.mktemp("sw") / "sglang.json"
    assert main(["sglang", "--log", str(CASE / "server.log"), "--traces", str(CASE / "traces"),
                 "--bench", str(CASE / "bench.jsonl"), "--concurrency", "8",
                 "--json", str(out)]) == 0
    from reports.base.records import read_record
    return read_record(out).payload


def test_sglang_own_server_gets_its_own_whatifs(record):
    got = sw.server_whatifs(record)
    assert got.status == "ok" and got.concurrency == 8 and got.prompts == 18
    rows = {(r.knob, r.setting): r for r in got.rows}
    assert {r.side for r in got.rows} == {"observed server"}
    assert set(rows) >= {("--pp-async-batch-depth", "1"), ("--pp-async-batch-depth", "2"),
                         ("--pp-max-micro-batch-size", "4")}
    # best first; each row's change is its own after / before
    assert [r.change_pct for r in got.rows] == sorted((r.change_pct for r in got.rows),
                                                      reverse=True)
    for r in got.rows:
        assert r.change_pct == pytest.approx(100 * (r.after_tok_per_s / r.before_tok_per_s - 1))
    # SGLang's own server lost 31% at depth 2 here (docs/BENCHMARKS.md section 15): the model
    # must say it loses, and more than depth 1 does
    d1, d2 = rows["--pp-async-batch-depth", "1"], rows["--pp-async-batch-depth", "2"]
    assert d2.change_pct < d1.change_pct < 0
    assert len(d2.sizes_after) == 4
    assert rows["--pp-max-micro-batch-size", "4"].command == "--pp-max-micro-batch-size 4"


def test_where_the_run_model_was_not_checked_it_says_so(record):
    loop = record.loop
    ranks = {k: dataclasses.replace(r, device="cuda") for k, r in loop.ranks.items()}
    gpu = dataclasses.replace(record, loop=dataclasses.replace(loop, device="cuda", ranks=ranks))
    got = sw.server_whatifs(gpu)
    assert got.status == "not modelled" and "gpu" in got.reason and not got.rows
    nobench = dataclasses.replace(record, bench=[])
    got = sw.server_whatifs(nobench)
    assert got.status == "not modelled" and "bench_serving" in got.reason
    assert sw.server_whatifs(None).status == "not modelled"


def test_best_is_a_gain_beyond_the_models_resolution():
    def row(pct):
        e = effect(8, 100.0, 100.0 + pct)
        return WhatIf("--pp-async-batch-depth", "1", (e,), None, e.gain, e.gain, True, "",
                      side="observed server", command="--pp-async-batch-depth 1")
    assert sw.ServerWhatIfs("ok", rows=(row(1.5), row(-4.0))).best is None
    assert sw.ServerWhatIfs("ok", rows=(row(12.0), row(1.5))).best.change_pct == pytest.approx(12.0)
    assert sw.ServerWhatIfs("not modelled", reason="x").best is None


def test_the_report_of_sglang_own_server_shows_its_own_whatifs(record, tmp_path, capsys):
    # the same recording through `ppscope report`: report.json holds the rows, report.md,
    # report.html and the terminal show them, and the file reads back as a Report
    import json
    from reports.model.report_type import Report
    res = tmp_path / "res"
    res.mkdir()
    assert main(["sglang", "--log", str(CASE / "server.log"), "--traces", str(CASE / "traces"),
                 "--bench", str(CASE / "bench.jsonl"), "--concurrency", "8",
                 "--json", str(res / "sglang.json")]) == 0
    capsys.readouterr()
    assert main(["report", "--results", str(res), "--out", str(tmp_path / "out")]) == 0
    term = capsys.readouterr().out
    d = json.loads((tmp_path / "out" / "report.json").read_text())
    assert d["server_whatifs"]["status"] == "ok"
    cmds = [r["command"] for r in d["server_whatifs"]["rows"]]
    assert "--pp-async-batch-depth 2" in cmds
    rep = Report.from_json(d, strict=True)
    assert rep.server_whatifs.rows[0].command == cmds[0]
    md = (tmp_path / "out" / "report.md").read_text()
    html = (tmp_path / "out" / "report.html").read_text()
    for text in (md, html, term):
        assert "--pp-async-batch-depth 2" in text
    assert "## What-ifs on your server (its own loop)" in md
    assert 'id="server-whatifs"' in html
    assert "On your server's own loop (C=8)" in term
    assert len(term.splitlines()) <= 25         # the terminal's answer (reports/render/terminal.py)
    assert "Settings tried on your server's own loop" in " ".join(d["answer"])
    # the unexplained share over bench_serving's run, in the answer and in the diagnosis
    br = d["diagnosis"]["bench_run"]
    assert br["unexplained_pct"] == pytest.approx(
        100 * (1 - br["observed_tok_per_s"] / br["modelled_tok_per_s"]))
    # with the profiler slowdown's interval carried into it where the log gives one
    left = br.get("unexplained_ci")
    said = f"{br['unexplained_pct']:+.0f}%" + (
        f" ({min(left):+.0f} to {max(left):+.0f}%)" if left else "") + " unexplained"
    assert said in md
    if br.get("profiler_slowdown"):
        assert br["profiler_slowdown_ci"] and min(br["profiler_slowdown_ci"]) <= \
            br["profiler_slowdown"] <= max(br["profiler_slowdown_ci"])


def test_it_says_where_the_first_prompts_came_from(record):
    got = sw.server_whatifs(record)
    # this recording's log holds the benchmark's first burst of 8 outside the traced window
    assert got.arrivals.startswith("as the benchmark's first burst was admitted")
    no_log = dataclasses.replace(record, loop=dataclasses.replace(record.loop, bursts=()))
    assert "traced window's micro-batches" in sw.server_whatifs(no_log).arrivals


def test_each_observed_row_carries_the_change_it_tried(record):
    got = sw.server_whatifs(record)
    for r in got.rows:
        (c,) = r.changes
        assert (c.flag, str(c.value)) == (r.knob, r.setting)
    d1 = next(r for r in got.rows if (r.knob, r.setting) == ("--pp-async-batch-depth", "1"))
    assert d1.changes[0].value == 1 and d1.changes[0].server
