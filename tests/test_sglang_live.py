"""Live probe against a real HTTP server on 127.0.0.1 that streams tokens with scripted timing."""
from __future__ import annotations

import json
import shutil
import threading
import time
from http.server import ThreadingHTTPServer

import pytest
from fake_http import QuietHandler

from microbench.sglang import live as sglang_live
from reports.base.errors import CliError

PERIOD_S = 0.03   # one token per stream every 30 ms
TOKENS = 8


def _server(mode: str, fixtures=None):
    state = {"grid0": None, "n": 0, "lock": threading.Lock(), "mmb": []}

    class H(QuietHandler):
        def do_GET(self):
            self.reply(200, {"data": [{"id": "fake-model"}]})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path == "/set_internal_state":
                state["mmb"].append(body["server_args"]["pp_max_micro_batch_size"])
                return self.reply(200, {"success": True})
            if self.path == "/start_profile":
                state["out"] = body["output_dir"]
                state["profile_at"] = time.perf_counter()
                return self.reply(200, {"success": True})
            if self.path == "/stop_profile":
                for r in (0, 1):
                    shutil.copy(fixtures / "traces" / "pp2" / f"pp2_burst_c8-rank{r}.json.gz",
                                f"{state['out']}/p-TP-0-PP-{r}.trace.json.gz")
                return self.reply(200, {"success": True})
            if mode == "error":
                return self.reply(503, {"error": "overloaded"})
            assert body["stream"] is True and body["ignore_eos"] is True
            with state["lock"]:
                if state["grid0"] is None:
                    state["grid0"] = time.perf_counter() + 0.05
                i = state["n"]
                state["n"] += 1
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            # lockstep: every stream on the same 30 ms grid (a herd in one slot);
            # independent: stream i shifted by i/C of a period (requests spread over slots)
            phase = 0.0 if mode == "lockstep" else (i % 4) / 4 * PERIOD_S
            grid0 = state["grid0"]
            k0 = int(max(0.0, time.perf_counter() - grid0) / PERIOD_S) + 1
            for k in range(k0, k0 + body["max_tokens"]):
                t = grid0 + k * PERIOD_S + phase
                time.sleep(max(0.0, t - time.perf_counter()))
                chunk = {"choices": [{"text": "tok", "index": 0}]}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
                if k == k0:
                    with state["lock"]:
                        state.setdefault("first", []).append(time.perf_counter())
            self.wfile.write(b"data: [DONE]\n\n")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    th = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    th.start()
    return srv, state


@pytest.fixture
def server(request, fixtures):
    srv, state = _server(request.param, fixtures)
    yield f"http://127.0.0.1:{srv.server_address[1]}", state
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("server", ["lockstep"], indirect=True)
def test_lockstep_server_gives_index_near_one(server):
    url, _ = server
    cfg = sglang_live.LiveConfig(url=url, concurrency=4, max_tokens=TOKENS, timeout_s=20)
    out = sglang_live.run_live(cfg)
    run = out["runs"][0]
    assert out["model"] == "fake-model"
    assert run["streams_ok"] == 4 and run["chunks"] == 4 * TOKENS
    assert run["itl_ms"]["p50"] == pytest.approx(PERIOD_S * 1e3, rel=0.25)
    assert run["lockstep"]["index"] > 0.8


@pytest.mark.parametrize("server", ["independent"], indirect=True)
def test_independent_server_gives_index_near_zero(server):
    url, state = server
    cfg = sglang_live.LiveConfig(url=url, concurrency=4, max_tokens=TOKENS, timeout_s=20,
                                 arrival="both", stagger_s=0.01, mmb_sweep=(1, 2))
    out = sglang_live.run_live(cfg)
    assert [r["arrival"] for r in out["runs"]] == ["burst", "staggered"]
    for r in out["runs"]:
        assert r["lockstep"]["index"] < 0.2
        assert r["tok_per_s"] > 0
    assert state["mmb"] == [1, 2]
    assert [s["status"] for s in out["mmb_sweep"]] == ["ok", "ok"]


def test_lockstep_index_known_answers():
    t = [[k * 0.03 for k in range(10)] for _ in range(4)]
    assert sglang_live.lockstep_index(t)["index"] == 1.0
    spread = [[k * 0.03 + i * 0.0075 for k in range(10)] for i in range(4)]
    assert sglang_live.lockstep_index(spread)["index"] == 0.0
    assert sglang_live.lockstep_index([[0.1, 0.2]])["index"] is None


@pytest.mark.parametrize("server", ["lockstep"], indirect=True)
def test_profile_hands_traces_to_reader(server, tmp_path):
    url, _ = server
    cfg = sglang_live.LiveConfig(url=url, concurrency=2, max_tokens=4, timeout_s=20,
                                 profile=True, trace_dir=str(tmp_path))
    out = sglang_live.run_live(cfg)
    p = out["profile"]
    assert sorted(p["traces"]["ranks"]) == ["0", "1"]
    assert p["traces"]["ranks"]["1"]["nccl_recv"]["kernels"] == 6


@pytest.mark.parametrize("server", ["lockstep"], indirect=True)
def test_profile_starts_once_the_load_has_reached_c(server, tmp_path):
    # a window opened before every stream decodes holds the ramp (bench_serving's warm-up:
    # every forward at bs = 1), not the load measured
    url, state = server
    cfg = sglang_live.LiveConfig(url=url, concurrency=3, max_tokens=6, timeout_s=20,
                                 profile=True, trace_dir=str(tmp_path))
    sglang_live.run_live(cfg)
    profiled = state["first"][-3:]          # the profiled run's three streams
    assert len(state["first"]) == 6 and all(t <= state["profile_at"] for t in profiled)


@pytest.mark.parametrize("server", ["error"], indirect=True)
def test_http_error_is_one_line(server):
    url, _ = server
    with pytest.raises(CliError, match="HTTP 503"):
        sglang_live.run_live(sglang_live.LiveConfig(url=url, concurrency=2, max_tokens=4))


def test_unreachable():
    with pytest.raises(CliError, match="cannot reach server"):
        sglang_live.run_live(sglang_live.LiveConfig(url="http://127.0.0.1:9", concurrency=1,
                                                    max_tokens=2, timeout_s=2))


def _write_in_two_parts(src, dst, pause_s):
    """A rank's trace written as a slow exporter does: the first half, a pause, the rest."""
    data = src.read_bytes()
    with open(dst, "wb") as f:
        f.write(data[:len(data) // 2])
        f.flush()
        time.sleep(pause_s)
        f.write(data[len(data) // 2:])


def test_a_trace_still_being_written_is_read_once_whole(fixtures, tmp_path):
    """The writer pauses longer than the quiet window _wait_traces allows (a busy host): the
    cut file is read again until it is whole, not reported as corrupt."""
    src = fixtures / "traces" / "pp2" / "pp2_burst_c8-rank1.json.gz"
    dst = tmp_path / "1.0-TP-0-PP-1.trace.json.gz"
    th = threading.Thread(target=_write_in_two_parts, args=(src, dst, 3.0))
    th.start()
    try:
        files = sglang_live._wait_traces(tmp_path, 5.0, quiet_s=0.4)
        assert files == [dst] and dst.stat().st_size < src.stat().st_size   # cut, and taken
        rank, got = sglang_live._read_written_trace(dst, time.monotonic() + 20, None)
    finally:
        th.join()
    assert rank == 1 and got["nccl_recv"]["kernels"] == 6


def test_a_trace_cut_for_good_still_fails_in_one_line(fixtures, tmp_path):
    from microbench.sglang.trace import TraceError
    data = (fixtures / "traces" / "pp2" / "pp2_burst_c8-rank0.json.gz").read_bytes()
    dst = tmp_path / "1.0-TP-0-PP-0.trace.json.gz"
    dst.write_bytes(data[:len(data) // 2])
    t0 = time.monotonic()
    with pytest.raises(TraceError, match="truncated"):
        sglang_live._read_written_trace(dst, time.monotonic() + 1.0, None)
    assert time.monotonic() - t0 < 10
