"""/metrics scrapes that do not belong together are never differenced as one window (issue 55,
item 3): a second scrape of another server or another process lifetime, of other PP ranks,
behind a load balancer (a window's differences longer than the window), and Prometheus exports
with NaN samples, a series that starts late or a value that is not a number. The fuzz tier's
contract (tests/test_fuzz_bad_inputs.py): exit 2 with one line on stderr and nothing written, or
exit 0 with the right window and what was done said in the record's `caveats`.

The pages are variants, built here, of the lab's two scrapes of SGLang 0.5.23's PP2 CPU server
(tests/fixtures/sglang_lab/metrics-window/, SGLang's own text format); the start-up lines added
are SGLang 0.5.23's (`sglang:startup_time_seconds{phase}`, the tokenizer's labels), the export
is what Prometheus's /api/v1/query_range answers (matrix, values as strings).
"""
from __future__ import annotations

import json
import re
import threading
from http.server import HTTPServer
from pathlib import Path

import pytest

from test_fuzz_bad_inputs import one_line_error, run   # the fuzz tier's contract
from test_metrics_window import _Pages, advanced, pages

CLEAN, SLOW = "clean-c8", "slow-stage"


def text(case: str, which: int) -> str:
    return Path(pages(case)[which]).read_text()


def startup(load_weight_s: float) -> str:
    """SGLang 0.5.23's start-up gauges (TokenizerMetricsCollector.emit_startup_time), as the
    lab's full page prints them: one launch's durations, which another launch does not repeat."""
    lab = 'engine_type="unified",model_name="model-llama-4l"'
    return ("# HELP sglang:startup_time_seconds Engine startup duration by phase in seconds.\n"
            "# TYPE sglang:startup_time_seconds gauge\n"
            f'sglang:startup_time_seconds{{{lab},phase="load_weight"}} {load_weight_s!r}\n'
            f'sglang:startup_time_seconds{{{lab},phase="scheduler_e2e"}} 2.07945225200001\n')


def write(tmp_path: Path, name: str, body: str) -> Path:
    p = tmp_path / name
    p.write_text(body)
    return p


def window_of(path: Path) -> dict:
    return json.loads(path.read_text())["data"]["metrics_window"]


def verdict(tmp_path: Path, capsys) -> dict:
    rc, _, err = run(["report", "--results", tmp_path, "--out", tmp_path / "out"], capsys)
    assert rc == 0, err
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    return {v["hypothesis"]: v for v in rep["verdicts"]}["stage imbalance"]


def live_window(tmp_path: Path, served: list[bytes], capsys) -> tuple[int, str, str]:
    """`ppscope sglang --url ... --metrics-window 1` against a server answering `served` in turn."""
    _Pages.served = served
    srv = HTTPServer(("127.0.0.1", 0), _Pages)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        return run(["sglang", "--url", f"http://127.0.0.1:{srv.server_port}",
                    "--metrics-window", "1", "--json", tmp_path / "sglang.json"], capsys)
    finally:
        srv.shutdown()


# ------------------------------------------------------------- one server, one lifetime

def test_a_second_scrape_of_another_launch_is_refused(tmp_path, capsys):
    a = write(tmp_path, "a.txt", text(SLOW, 0) + startup(0.03961186600008659))
    b = write(tmp_path, "b.txt", text(SLOW, 1) + startup(0.04120553299994208))
    rc, _, err = run(["sglang", "--metrics", a, b, "--json", tmp_path / "s.json"], capsys)
    one_line_error(rc, err, "startup_time_seconds", "two launches")
    assert not (tmp_path / "s.json").exists()
    # the same launch in both: read
    b.write_text(text(SLOW, 1) + startup(0.03961186600008659))
    rc, _, err = run(["sglang", "--metrics", a, b, "--json", tmp_path / "s.json"], capsys)
    assert rc == 0, err


def test_process_start_times_that_differ_are_refused(tmp_path, capsys):
    a = write(tmp_path, "a.txt", text(SLOW, 0) + "process_start_time_seconds 1.79643759e+09\n")
    b = write(tmp_path, "b.txt", text(SLOW, 1) + "process_start_time_seconds 1.79643902e+09\n")
    rc, _, err = run(["sglang", "--metrics", a, b, "--json", tmp_path / "s.json"], capsys)
    one_line_error(rc, err, "process_start_time_seconds", "two processes")


def test_a_window_behind_a_load_balancer_is_refused(tmp_path, capsys):
    # `--url --metrics-window 1` where the second request reaches another server: 40 s of
    # loop per rank in a 1 s window (the report once said "stage imbalance" from it)
    rc, _, err = live_window(tmp_path, [Path(p).read_bytes() for p in pages(SLOW)], capsys)
    one_line_error(rc, err, "PP rank 0", "s window", "not of one server")
    assert not (tmp_path / "sglang.json").exists()


def test_idle_time_beyond_the_window_is_said(tmp_path, capsys):
    # a scheduler that slept through the first scrape adds its idle time when it wakes: not
    # refused (its work fits the window), said
    start = text(SLOW, 0)
    idle0 = re.search(r'category="idle",[^}]*pp_rank="0"[^}]*\} (\S+)', start).group(1)
    later = advanced(SLOW, 1 / 40).decode()
    later = re.sub(r'(category="idle",[^}]*pp_rank="0"[^}]*\} )\S+',
                   lambda m: m.group(1) + repr(float(idle0) + 600.0), later)
    rc, out, err = live_window(tmp_path, [start.encode(), later.encode()], capsys)
    assert rc == 0, err
    cav = window_of(tmp_path / "sglang.json")["caveats"]
    assert any("PP rank 0" in c and "idle" in c for c in cav), cav
    assert "caveat: PP rank 0" in out


# ---------------------------------------------------------------------- one set of series

def _ranks_0_to_3(page: str) -> str:
    extra = [ln.replace('pp_rank="0"', f'pp_rank="{r}"') for ln in page.splitlines()
             for r in (2, 3) if 'pp_rank="0"' in ln]
    return page + "\n".join(extra) + "\n"


def test_a_second_scrape_with_other_pp_ranks_is_refused(tmp_path, capsys):
    a = write(tmp_path, "a.txt", text(SLOW, 0))
    b = write(tmp_path, "b.txt", _ranks_0_to_3(text(SLOW, 1)))
    rc, _, err = run(["sglang", "--metrics", a, b, "--json", tmp_path / "s.json"], capsys)
    one_line_error(rc, err, "PP ranks 0, 1 in the first scrape", "0, 1, 2, 3 in the second")


def test_pp_ranks_that_are_not_0_to_n_are_refused(tmp_path, capsys):
    page = write(tmp_path, "m.txt", text(SLOW, 1).replace('pp_rank="1"', 'pp_rank="7"'))
    rc, _, err = run(["sglang", "--metrics", page, "--json", tmp_path / "s.json"], capsys)
    one_line_error(rc, err, "pp_rank labels 0, 7")


def test_a_counter_in_the_second_scrape_only_is_refused(tmp_path, capsys):
    # SGLang creates the idle counter when the scheduler starts: absent from the first
    # scrape, it starts late (differenced against nothing it would be the server's whole life)
    first = "\n".join(ln for ln in text(SLOW, 0).splitlines()
                      if not ln.startswith("sglang:scheduler_idle_seconds_total{"))
    a, b = write(tmp_path, "a.txt", first), write(tmp_path, "b.txt", text(SLOW, 1))
    rc, _, err = run(["sglang", "--metrics", a, b, "--json", tmp_path / "s.json"], capsys)
    one_line_error(rc, err, "scheduler_idle_seconds_total", "second scrape only")


def test_a_graph_pass_counter_created_in_the_window_counts_from_0(tmp_path, capsys):
    # cuda_graph_passes_total{mode} is created at its first increment: from 0, not refused
    first = "\n".join(ln for ln in text(SLOW, 0).splitlines()
                      if 'mode="decode_none"' not in ln)
    a, b = write(tmp_path, "a.txt", first), write(tmp_path, "b.txt", text(SLOW, 1))
    rc, _, err = run(["sglang", "--metrics", a, b, "--json", tmp_path / "s.json"], capsys)
    assert rc == 0, err
    assert window_of(tmp_path / "s.json")["ranks"]["1"]["decode_passes"] == 2516


@pytest.mark.parametrize("value", ["NaN", "abc", "-3.0"])
def test_a_counter_that_is_not_a_number_is_refused(tmp_path, capsys, value):
    page = re.sub(r'(sglang:scheduler_stage_seconds_total\{category="run_batch"[^}]*'
                  r'pp_rank="1"[^}]*\} )\S+', lambda m: m.group(1) + value, text(SLOW, 1))
    a, b = write(tmp_path, "a.txt", text(SLOW, 0)), write(tmp_path, "b.txt", page)
    rc, _, err = run(["sglang", "--metrics", a, b, "--json", tmp_path / "s.json"], capsys)
    one_line_error(rc, err, "scheduler_stage_seconds_total of PP rank 1", "second scrape")


# ------------------------------------------------------------------ Prometheus exports

def step_s(case: str, n: int = 7) -> float:
    """The seconds between samples that give the case's own window (case.json) in n samples."""
    return json.loads((Path(pages(case)[0]).parent / "case.json").read_text())["seconds"] / (n - 1)


def export(case: str, n: int = 7, late: dict | None = None, change=None) -> dict:
    """The case's window as Prometheus's query_range answers it: every series sampled n times
    from the first scrape's value to the last's, linearly (a steady load), over the case's own
    window; `late` {series text: samples}: that series starts so many samples late;
    `change(key, values)`: edits."""
    first, last = text(case, 0), text(case, 1)
    dt = step_s(case, n)
    end = dict(ln.rsplit(" ", 1) for ln in last.splitlines() if ln and ln[0] != "#")
    result = []
    for ln in first.splitlines():
        if not ln or ln[0] == "#":
            continue
        key, v = ln.rsplit(" ", 1)
        name, _, rest = key.partition("{")
        m = {"__name__": name, **dict(re.findall(r'(\w+)="([^"]*)"', rest))}
        a, b = float(v), float(end[key])
        vals = [[1000.0 + i * dt, repr(a + (b - a) * i / (n - 1))] for i in range(n)]
        for pat, k in (late or {}).items():
            if pat in key:
                vals = vals[k:]
        if change:
            change(key, vals)
        result.append({"metric": m, "values": vals})
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def _read_export(tmp_path: Path, doc: dict, capsys) -> tuple[int, str, str]:
    f = write(tmp_path, "grafana.json", json.dumps(doc))
    return run(["sglang", "--metrics", f, "--json", tmp_path / "sglang.json"], capsys)


def test_an_export_with_a_series_starting_late_is_cut_and_said(tmp_path, capsys):
    whole = tmp_path / "whole"
    whole.mkdir()
    rc, _, err = _read_export(whole, export(CLEAN), capsys)
    assert rc == 0, err
    v_whole = verdict(whole, capsys)
    assert v_whole["verdict"] == "does not hold", v_whole
    rank1_run_batch = 'category="run_batch",engine_type="unified",forward_overlap="none",' \
                      'model_name="model-llama-4l",moe_ep_rank="0",pp_rank="1"'
    dt = step_s(CLEAN)                  # 12.75 s: the series starts 51 s late
    rc, _, err = _read_export(tmp_path, export(CLEAN, late={rank1_run_batch: 4}), capsys)
    assert rc == 0, err
    w = window_of(tmp_path / "sglang.json")
    assert w["seconds"] == pytest.approx(2 * dt)
    assert any(f"starts {4 * dt:.0f} s after" in c and "pp_rank=1" in c and "cut to the" in c
               for c in w["caveats"]), w["caveats"]
    v = verdict(tmp_path, capsys)       # the same steady load: the same verdict as the whole
    assert v["verdict"] == v_whole["verdict"], (v, v_whole)


def test_an_export_with_a_nan_first_sample_says_so(tmp_path, capsys):
    def nan_first(key, vals):
        if 'category="run_batch"' in key and 'pp_rank="0"' in key:
            vals[0][1] = "NaN"
    rc, _, err = _read_export(tmp_path, export(CLEAN, change=nan_first), capsys)
    assert rc == 0, err
    w = window_of(tmp_path / "sglang.json")
    assert any("NaN sample" in c and "run_batch" in c for c in w["caveats"]), w["caveats"]
    assert w["seconds"] == pytest.approx(5 * step_s(CLEAN))   # cut to rank 0's run_batch's
    assert verdict(tmp_path, capsys)["verdict"] == "does not hold"


def test_an_export_with_a_string_value_is_refused(tmp_path, capsys):
    def string(key, vals):
        if 'category="idle"' in key and 'pp_rank="1"' in key:
            vals[3][1] = "n/a"
    rc, _, err = _read_export(tmp_path, export(CLEAN, change=string), capsys)
    one_line_error(rc, err, "scheduler_stage_seconds_total", "'n/a'", "not a number")
    assert not (tmp_path / "sglang.json").exists()


def test_an_export_whose_counter_falls_is_refused(tmp_path, capsys):
    def restart(key, vals):         # falls to near 0 mid-window, and grows past the start
        if 'category="run_batch"' in key and 'pp_rank="0"' in key:
            vals[4][1] = "0.5"
    rc, _, err = _read_export(tmp_path, export(CLEAN, change=restart), capsys)
    one_line_error(rc, err, "went down", "restarted inside the export")
