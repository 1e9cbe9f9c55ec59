"""The PP-loop probe (microbench/dispatch/pp_loop.py) held against SGLang 0.5.23's own PP2 server on the CPU.

The probe runs as `ppscope dispatch --device cpu` (two ranks under torchrun, gloo, the forward on
the host, as SGLang's `--device cpu`); the reference is the lab's recording of SGLang itself
(tests/fixtures/sglang_lab/clean-c8: `--pp-size 2 --device cpu`, pp_async_batch_depth 0, 8
streams that SGLang ran as two busy micro-batches). Compared, rank by rank:
- the loop iteration as the trace shows it (from one `recv_requests` to the next): the
  scheduler's ranges in order, what is nested in each (`scheduler.*`, the `step[...]` span) and
  how many `gloo:send` / `gloo:recv` ranges start inside each, or between two ranges (SGLang's
  hidden-state receive has no range): that is the number of messages per hop;
- the log lines: both read by microbench/sglang/log.py to the same fields in the same order;
- the probe's traces read by `ppscope sglang --traces`, SGLang's own reader, into a loop profile.
Not marked gpu: it runs here, in about a minute.
"""
from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest

from microbench.sglang.log import parse_line
from microbench.sglang.trace import SCHEDULER_RANGES, STEP_RE, iter_events

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "tests" / "fixtures" / "sglang_lab" / "clean-c8"


def iteration_shapes(path: Path) -> list[tuple]:
    """Each loop iteration of one rank's trace as a tuple of (range, nested names, gloo sends
    starting inside, gloo receives starting inside); gloo ranges outside every scheduler range
    between two of them count as one ("-", (), sends, receives) entry. Iterations start at
    `recv_requests`; the first and last (cut by the profiler) are dropped."""
    top, inner, gloo = [], [], []
    for ev in iter_events(path):
        if not isinstance(ev, dict) or ev.get("ph") != "X" or ev.get("cat") != "user_annotation":
            continue
        name, a = ev["name"], float(ev["ts"])
        b = a + float(ev["dur"])
        if name in SCHEDULER_RANGES:
            top.append((a, b, name))
        elif name.startswith("scheduler."):
            inner.append((a, name))
        elif STEP_RE.match(name):
            inner.append((a, f"step[{STEP_RE.match(name).group(1)}]"))
        elif name.startswith(("gloo:send", "gloo:recv")):
            gloo.append((a, name[5:9]))
    top.sort()
    inner.sort()
    gloo.sort()
    starts = [a for a, _, n in top if n == "recv_requests"]
    shapes = []
    for lo, hi in zip(starts, starts[1:]):
        items, cursor = [], lo
        for a, b, name in (t for t in top if lo <= t[0] < hi):
            free = [k for t, k in gloo if cursor <= t < a]
            if free:
                items.append(("-", (), free.count("send"), free.count("recv")))
            ops = [k for t, k in gloo if a <= t <= b]
            items.append((name, tuple(n for t, n in inner if a <= t <= b),
                          ops.count("send"), ops.count("recv")))
            cursor = b
        free = [k for t, k in gloo if cursor <= t < hi]
        if free:
            items.append(("-", (), free.count("send"), free.count("recv")))
        shapes.append(tuple(items))
    return shapes[1:]


def steady_decode_shape(path: Path) -> tuple:
    """The most common iteration that runs a decode forward and processes a result."""
    shapes = [s for s in iteration_shapes(path)
              if any("step[DECODE]" in it[1] for it in s)
              and any(it[0] == "process_batch_result" for it in s)]
    assert shapes, f"{path.name}: no decode iteration"
    return collections.Counter(shapes).most_common(1)[0][0]


def _rank_file(d: Path, rank: int) -> Path:
    (f,) = sorted(d.glob(f"*-TP-0-PP-{rank}.trace.json.gz"))
    return f


def _fields_by_kind(lines) -> dict:
    out: dict = {}
    for ln in lines:
        b = parse_line(ln)
        if b is None or b == "bad":
            continue
        out.setdefault((b.kind, b.pp), set()).add(tuple(b.fields))
    return out


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    """The probe on the CPU, shaped like the lab's run: PP2, depth 0 (SGLang's default, the
    lab's server_args), 8 streams over both slots (a cap of 4 per micro-batch; SGLang split
    them 6 + 2 as they trickled in), profiled with its log lines beside the traces."""
    d = tmp_path_factory.mktemp("probe")
    cmd = [sys.executable, "-m", "reports.cli", "dispatch", "--device", "cpu", "--pp", "2",
           "--work", "busy", "--cost-us", "1:1500,8:2500", "--async-depth", "0",
           "--max-micro-batch", "4", "--concurrency", "8", "--policies", "sglang",
           "--seconds", "0.4", "--chunked-prefill-size", "4096", "--profile",
           "--trace-dir", str(d / "traces"), "--json", str(d / "dispatch.json"),
           "--timeout", "150"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=200)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    return d


def test_lab_reference_is_what_sglang_recorded():
    # SGLang 0.5.23 on the CPU, per iteration of a busy PP2 loop at depth 0 (hand-read from
    # the lab's traces): rank 0 relays the (empty) request list in one message, sends the
    # outputs on (metadata size + bytes + token tensor = 3) before receiving the next slot's
    # (3), then the hidden states (metadata 2 + hidden_states + residual = 4); rank 1 gets the
    # list (1), the hidden states with no range around them (4), then outputs recv-first.
    r0 = steady_decode_shape(_rank_file(LAB / "traces", 0))
    r1 = steady_decode_shape(_rank_file(LAB / "traces", 1))
    rr = ("recv_requests", ("scheduler.recv_requests", "scheduler.process_input_requests"))
    gb = ("get_next_batch_to_run", ("scheduler.get_next_batch_to_run",), 0, 0)
    rb = ("run_batch", ("scheduler.run_batch", "step[DECODE]"), 0, 0)
    pb = ("process_batch_result", ("scheduler.process_batch_result",), 0, 0)
    assert r0 == (rr + (0, 0), ("send_reqs_to_next_stage", (), 1, 0), gb, rb,
                  ("send_res_dict_to_next_stage", (), 3, 0),
                  ("recv_res_dict_from_prev_stage", (), 0, 3), pb,
                  ("send_proxy_dict_to_next_stage", (), 4, 0))
    assert r1 == (rr + (0, 1), gb, ("-", (), 0, 4), rb,
                  ("recv_res_dict_from_prev_stage", (), 0, 3),
                  ("send_res_dict_to_next_stage", (), 3, 0), pb)


@pytest.mark.parametrize("rank", [0, 1])
def test_probe_iteration_is_sglangs(probe, rank):
    """Same ranges per loop iteration, same nesting, same messages per hop, on each rank."""
    assert steady_decode_shape(_rank_file(probe / "traces", rank)) == \
        steady_decode_shape(_rank_file(LAB / "traces", rank))


def test_probe_empty_relay_is_one_message(probe):
    # every steady iteration of rank 1 receives the request list in one message, as SGLang's
    shapes = iteration_shapes(_rank_file(probe / "traces", 1))
    relay = collections.Counter(s[0][3] for s in shapes if s[0][0] == "recv_requests")
    assert relay.most_common(1)[0][0] == 1


def test_probe_log_lines_parse_like_sglangs(probe):
    lab = _fields_by_kind((LAB / "server.log").read_text().splitlines())
    logs = sorted((probe / "traces").glob("*.log"))
    assert len(logs) == 2
    got = _fields_by_kind(ln for f in logs for ln in f.read_text().splitlines())
    assert set(got) == {(k, r) for k in ("Decode", "Prefill") for r in (0, 1)}
    for key, fields in got.items():
        assert fields == lab[key], key   # the same fields, in the same order, on each rank
    # decode lines are written at result time: one per processed batch, in time order
    for f in logs:
        ts = [parse_line(ln).t_s for ln in f.read_text().splitlines() if parse_line(ln)]
        assert ts == sorted(ts) and len(ts) > 10


def test_probe_record_names_what_it_keeps_different(probe):
    from microbench.dispatch.pp_loop import KEPT_DIFFERENCES
    rec = json.loads((probe / "dispatch.json").read_text())
    assert rec["status"] == "ok" and KEPT_DIFFERENCES in rec["reason"]
    assert rec["data"]["devices"] == {"0": "cpu", "1": "cpu"}


def test_probe_traces_read_by_sglangs_reader(probe, tmp_path):
    from reports import cli
    out = tmp_path / "sglang.json"
    assert cli.main(["sglang", "--traces", str(probe / "traces"), "--json", str(out)]) == 0
    loop = json.loads(out.read_text())["data"]["loop"]
    assert sorted(loop["ranks"]) == ["0", "1"]
    for r in loop["ranks"].values():
        assert r["device"] == "cpu" and r["batch_source"] == "step spans"
        assert r["forwards"] > 10 and set(r["forward_us_by_batch"]) == {"4"}
