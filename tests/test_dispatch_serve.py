"""`ppscope dispatch --serve` on CPU: the real HTTP front-end (microbench/dispatch/serve_http.py) on
loopback, in front of the real admission / control relay (microbench/dispatch/serve.py) driven by the
single-process stand-in for the ranks; the live probe (`ppscope sglang --url`) and the metrics
reader are the clients. What only runs on GPUs (the torchrun ranks) is in test_dispatch_gpu.py."""
from __future__ import annotations

import gzip
import http.client
import json
import shutil
import socket
import threading
import time

import pytest

from microbench.dispatch import serve as SV
from microbench.dispatch import serve_http as SH
from microbench.sglang import live as sglang_live
from microbench.sglang import metrics as sglang_metrics
from reports import cli
from reports.base.errors import CliError
from reports.base.slots import SlotConfig

STEP_S = 0.002     # one forward of the stand-in loop


def _args(pp=2, depth=2, mrr=64, mmb=None, chunk=8192):
    return SV.ServerArgs(model_path="kimi-k2", pp_size=pp, max_running_requests=mrr,
                         pp_max_micro_batch_size=mmb or mrr // pp, pp_async_batch_depth=depth,
                         chunked_prefill_size=chunk, max_prefill_tokens=16384,
                         cuda_graph_max_bs=32, disable_cuda_graph=False)


class FakeProfiler:
    """Stands in for torch.profiler on one rank: records calls; export writes a real per-rank
    trace (a checked-in PP2 Kineto trace) under the name it is given."""
    calls: list = []

    def __init__(self, fixtures, rank_of):
        self.fixtures, self.rank_of = fixtures, rank_of

    def __call__(self, activities):
        parent = self

        class P:
            def start(self):
                FakeProfiler.calls.append(("start", tuple(activities)))

            def stop(self):
                FakeProfiler.calls.append(("stop",))

            def export(self, path):
                r = parent.rank_of(path)
                shutil.copy(parent.fixtures / "traces" / "pp2" / f"pp2_burst_c8-rank{r}.json.gz",
                            path)
                FakeProfiler.calls.append(("export", path.name))
        return P()


@pytest.fixture
def served(fixtures, tmp_path):
    """Start a served stand-in loop on 127.0.0.1:<free port>; yields (url, state, result)."""
    made = []

    def start(args=None, step_s=STEP_S):
        args = args or _args()
        state = SV.ServeState(args)
        srv = SH.make_server(state, "127.0.0.1", 0)
        SH.start(srv)
        scfg = SlotConfig(args.pp_size, args.pp_async_batch_depth, args.pp_max_micro_batch_size,
                          args.max_running_requests, args.chunked_prefill_size)
        out = {}
        prof = FakeProfiler(fixtures, lambda p: int(p.name.split("-PP-")[1].split(".")[0]))

        def loop():
            out["sched"], out["sides"] = SV.run_cpu_loop(state, scfg, step_s=step_s,
                                                         profiler=prof,
                                                         profile_dir=str(tmp_path / "default"))
        th = threading.Thread(target=loop, daemon=True)
        th.start()
        made.append((srv, state, th))
        deadline = time.monotonic() + 5
        while not state.healthy() and time.monotonic() < deadline:
            time.sleep(0.01)
        return f"http://127.0.0.1:{srv.server_address[1]}", state, out
    FakeProfiler.calls = []
    yield start
    for srv, state, th in made:
        state.close("test over")
        th.join(5)
        srv.shutdown()
        srv.server_close()


def _raw(url, method, path, body=None, raw=None, headers=None):
    host, port = url.split("//")[1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=10)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    c.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
    r = c.getresponse()
    out = r.status, r.read(), r.getheader("Content-Type")
    c.close()
    return out


def test_live_probe_streams_exact_tokens_and_metrics_parse(served):
    url, state, out = served()
    cfg = sglang_live.LiveConfig(url=url, concurrency=4, max_tokens=6, timeout_s=20)
    res = sglang_live.run_live(cfg)
    run = res["runs"][0]
    assert res["model"] == "kimi-k2"
    assert run["streams_ok"] == 4 and run["errors"] == [] and run["chunks"] == 24
    deadline = time.monotonic() + 5
    while True:   # finished requests leave their slot at its next visit, a few ms later
        m = sglang_metrics.read_metrics(url)["ranks"]["0"]
        if m["num_running_reqs"] == 0.0 or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert m["num_requests_total{is_streaming=true}"] == 4.0
    assert m["num_requests_total{is_streaming=false}"] == 0.0
    assert m["generation_tokens_total{is_streaming=true}"] == 24.0
    # the prompt: 45 UTF-8 bytes -> ceil(45 / 4) = 12 tokens each
    assert len(cfg.prompt.encode()) == 45
    assert m["prompt_tokens_total{is_streaming=true}"] == 4 * 12.0
    assert m["time_to_first_token_seconds"]["count"] == 4.0
    assert m["inter_token_latency_seconds"]["count"] == 4 * 5.0
    assert m["e2e_request_latency_seconds"]["count"] == 4.0
    assert m["request_time_per_output_token_seconds"]["count"] == 4.0
    assert m["num_running_reqs"] == 0.0 and m["num_queue_reqs"] == 0.0
    # ITL = one slot-loop turn: 4 visits, one of them a forward of STEP_S (+ loop overhead)
    assert STEP_S <= m["inter_token_latency_seconds"]["p50"] <= 0.1
    assert out == {}   # loop still running


def test_sse_framing_completions_and_chat(served):
    url, _, _ = served()
    for path, body in (("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 5,
                                            "stream": True,
                                            "stream_options": {"include_usage": True}}),
                       ("/v1/chat/completions", {"messages": [{"role": "user",
                                                               "content": "abcdefgh"}],
                                                 "max_tokens": 3, "stream": True})):
        st, raw, ctype = _raw(url, "POST", path, body)
        assert st == 200 and ctype == "text/event-stream"
        events = raw.decode().split("\n\n")
        assert events[-1] == "" and events[-2] == "data: [DONE]"
        assert all(e.startswith("data: ") and "\n" not in e for e in events[:-1])
        chunks = [json.loads(e[6:]) for e in events[:-2]]
        if path == "/v1/completions":
            toks, use = chunks[:-1], chunks[-1]
            assert len(toks) == 5 and use["choices"] == []
            assert use["usage"] == {"prompt_tokens": 3, "completion_tokens": 5,
                                    "total_tokens": 8}
            assert [c["choices"][0]["text"] for c in toks] == [SV.token_text(k)
                                                               for k in range(5)]
            assert all(c["object"] == "text_completion" for c in toks)
        else:
            toks = chunks
            assert len(toks) == 3 and toks[0]["choices"][0]["delta"]["role"] == "assistant"
            assert all(c["object"] == "chat.completion.chunk" for c in toks)
        assert [c["choices"][0]["finish_reason"] for c in toks] == \
            [None] * (len(toks) - 1) + ["length"]
        assert len({c["id"] for c in toks}) == 1


def test_non_streaming_reply_and_prompt_token_count(served):
    url, _, _ = served()
    st, raw, _ = _raw(url, "POST", "/v1/completions", {"prompt": "x" * 9, "max_tokens": 4})
    d = json.loads(raw)
    assert st == 200 and d["object"] == "text_completion"
    assert d["choices"][0]["finish_reason"] == "length"
    assert d["choices"][0]["text"] == "".join(SV.token_text(k) for k in range(4))
    assert d["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    st, raw, _ = _raw(url, "POST", "/v1/chat/completions",
                      {"messages": [{"role": "user", "content": [{"type": "text", "text": "ab"}]}]})
    d = json.loads(raw)
    assert d["object"] == "chat.completion" and d["usage"]["completion_tokens"] == 16


def test_info_models_health_routes(served):
    url, state, _ = served(_args(mrr=32))
    st, raw, _ = _raw(url, "GET", "/health")
    assert st == 200 and raw == b""
    st, raw, _ = _raw(url, "GET", "/v1/models")
    assert json.loads(raw)["data"][0]["id"] == "kimi-k2"
    st, raw, _ = _raw(url, "GET", "/get_server_info")
    info = json.loads(raw)
    for k, v in (("pp_size", 2), ("max_running_requests", 32), ("pp_max_micro_batch_size", 16),
                 ("pp_async_batch_depth", 2), ("chunked_prefill_size", 8192),
                 ("cuda_graph_max_bs_decode", 32), ("disable_cuda_graph", False),
                 ("model_path", "kimi-k2")):
        assert info[k] == v, k
    assert info["internal_states"][0]["pp_max_micro_batch_size"] == 16


def test_set_internal_state_reaches_every_rank_and_admission(served):
    url, state, out = served(_args(mrr=64))
    cfg = sglang_live.LiveConfig(url=url, concurrency=4, max_tokens=3, timeout_s=20,
                                 mmb_sweep=(1, 2, 40))
    res = sglang_live.run_live(cfg)
    sweep = res["mmb_sweep"]
    assert [s["status"] for s in sweep] == ["ok", "ok", "waived"]   # 40 > 64 // 2
    assert "[False]" in sweep[2]["reason"]
    assert [s["chunks"] for s in sweep[:2]] == [12, 12]
    st, raw, _ = _raw(url, "GET", "/get_internal_state")
    assert json.loads(raw)[0]["pp_max_micro_batch_size"] == 2
    state.close("done")
    deadline = time.monotonic() + 5
    while "sides" not in out and time.monotonic() < deadline:
        time.sleep(0.01)
    sides = out["sides"]
    # every rank applied both accepted values, at the same iteration
    applied = [[(it, a["pp_max_micro_batch_size"]) for it, k, a in s.applied
                if k == "set_internal_state"] for s in sides]
    assert [v for _, v in applied[0]] == [1, 2] and applied[0] == applied[1]
    assert sides[1].mmb == 2 and out["sched"].scfg.max_micro_batch == 2


def test_cap_of_one_spreads_a_burst_over_the_slots():
    # the scheduler alone, visit by visit: a burst of 4 with cap 1 takes 4 slots
    args = _args(mrr=64)
    state = SV.ServeState(args)
    sched = SV.ServeScheduler(state, SlotConfig(2, 2, 1, 64, 8192))
    streams = [state.submit(5, 2, True) for _ in range(4)]
    metas = [sched.visit(it, it % 4) for it in range(4)]
    assert [m["kind"] for m in metas] == ["prefill"] * 4
    assert sched.adm.sizes == [1, 1, 1, 1]
    # outputs of slot 1 processed (at the visit of slot 0): its request's first token
    sched.outputs(1, 1.0)
    assert streams[1].next(0) == ("token", 0, False) and streams[0].next(0) is None
    sched.outputs(1, 2.0)   # nothing ran in slot 1 since: no second token
    assert streams[1].next(0) is None


def test_tokens_finish_and_leave_and_chunked_prefill():
    state = SV.ServeState(_args())
    S = 4
    sched = SV.ServeScheduler(state, SlotConfig(2, 2, 32, 64, chunked_prefill_size=10))
    a = state.submit(4, 2, True)       # fits the budget
    b = state.submit(15, 3, False)     # 6 tokens this visit, 9 more in the next one
    m0 = sched.visit(0, 0)
    assert (m0["kind"], m0["n"], m0["rows"]) == ("prefill", 2, 10)
    assert sched.members[0] == [a.req] and sched.chunked is b.req
    m1 = sched.visit(1, 1)              # b's last chunk runs in slot 1: it joins slot 1
    assert (m1["kind"], m1["n"], m1["rows"]) == ("prefill", 1, 9)
    assert sched.members[1] == [b.req] and sched.chunked is None
    sched.outputs(0, 1.0)               # a's first token (from its prefill)
    m4 = sched.visit(4, 0)              # slot 0 decodes a
    assert (m4["kind"], m4["n"]) == ("decode", 1)
    sched.outputs(0, 2.0)               # a's second and last token
    assert [a.next(0), a.next(0), a.next(0)] == [("token", 0, False), ("token", 1, True),
                                                 ("end", "length")]
    m8 = sched.visit(8, 0)              # a has left its slot
    assert m8["kind"] == "idle" and sched.adm.sizes[0] == 0
    assert state.counters["generation_false"] == 0 and state.counters["generation_true"] == 2
    sched.close("stopped")
    assert b.next(0) == ("end", "stopped")
    assert state.counters["aborted"] == 1
    assert S == sched.scfg.slots


def test_profile_start_stop_writes_sglang_named_traces_read_back(served, tmp_path):
    url, state, out = served()
    d = tmp_path / "traces"
    cfg = sglang_live.LiveConfig(url=url, concurrency=2, max_tokens=4, timeout_s=20,
                                 profile=True, trace_dir=str(d), profile_steps=1000)
    res = sglang_live.run_live(cfg)
    p = res["profile"]
    assert p["stop_profile"] == "ok"
    assert sorted(p["traces"]["ranks"]) == ["0", "1"]
    assert p["traces"]["ranks"]["1"]["nccl_recv"]["kernels"] == 6   # the fixture's
    names = sorted(p["files"])
    pid = names[0].split("-TP-")[0]
    assert names == [f"{pid}-TP-0-PP-0.trace.json.gz", f"{pid}-TP-0-PP-1.trace.json.gz"]
    float(pid)   # SGLang's profile id: the start time in seconds
    kinds = [c[0] for c in FakeProfiler.calls]
    assert kinds == ["start", "start", "stop", "export", "stop", "export"]
    assert FakeProfiler.calls[0] == ("start", ("CPU", "GPU"))
    # a second stop: nothing to stop (SGLang refuses it too)
    st, raw, _ = _raw(url, "POST", "/stop_profile", {})
    assert st == 400 and b"not in progress" in raw
    state.close("done")
    deadline = time.monotonic() + 5
    while "sides" not in out and time.monotonic() < deadline:
        time.sleep(0.01)
    its = [[it for it, k, _ in s.applied if k in ("start_profile", "stop_profile")]
           for s in out["sides"]]
    assert its[0] == its[1] and len(its[0]) == 2


def test_profile_num_steps_stops_on_its_own(served, tmp_path):
    url, state, out = served()
    st, raw, _ = _raw(url, "POST", "/start_profile", {"output_dir": str(tmp_path),
                                                      "num_steps": 3})
    assert st == 200 and raw == b"Start profiling.\n"
    st, raw, _ = _raw(url, "POST", "/start_profile", {"output_dir": str(tmp_path)})
    assert st == 400 and b"already in progress" in raw
    _raw(url, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 8})
    deadline = time.monotonic() + 5
    while len(list(tmp_path.glob("*.trace.json.gz"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(list(tmp_path.glob("*-TP-0-PP-*.trace.json.gz"))) == 2
    state.close("done")
    while "sides" not in out and time.monotonic() < deadline:
        time.sleep(0.01)
    # stopped after num_steps + 1 = 4 forwards since the start (SGLang's count)
    starts = [it for it, k, _ in out["sides"][0].applied if k == "start_profile"]
    stops = [it for it, k, _ in out["sides"][0].applied if k == "stop_profile"]
    assert len(starts) == len(stops) == 1


def test_num_steps_stops_after_num_steps_plus_one_forwards(tmp_path):
    # the scheduler and rank 0's side by hand: SGLang stops once forward_ct reaches the count
    # at start + num_steps + 1 (managers/scheduler_components/profiler_manager.py)
    state = SV.ServeState(_args())
    sched = SV.ServeScheduler(state, SlotConfig(2, 2, 32, 64, 8192))
    written = []

    class P:
        def start(self):
            pass

        def stop(self):
            pass

        def export(self, path):
            written.append(path.name)
    side = SV.RankSide(0, sched, profiler=lambda acts: P())
    replies = []
    th = threading.Thread(target=lambda: replies.append(state.control(
        "start_profile", {"num_steps": 3, "output_dir": str(tmp_path), "profile_id": "p1"}, 5)))
    th.start()
    it, forwards, started, stopped = 0, 0, False, False
    deadline = time.monotonic() + 5
    while not stopped and time.monotonic() < deadline:
        m = sched.visit(it, it % 4)
        for c in m["ctl"]:   # applied at the top of the visit, before its forward
            side.apply(c, it)
            if c["kind"] == "start_profile":
                started = True
                state.submit(4, 50, True)
            elif c["kind"] == "stop_profile":
                assert c["id"] is None   # the loop's own stop, no HTTP request behind it
                stopped = True
        if started and not stopped and m["rows"]:
            forwards += 1   # a forward the profile recorded
        if m["rows"]:
            sched.outputs(it % 4, float(it))
        it += 1
    th.join(5)
    assert replies == [(200, "Start profiling.\n")]
    assert forwards == 4 and written == ["p1-TP-0-PP-0.trace.json.gz"]
    assert not sched.profiling


@pytest.mark.parametrize("method,path,body,status,needle", [
    ("POST", "/v1/completions", b"{not json", 400, "not valid JSON"),
    ("POST", "/v1/completions", b'{"prompt": "x", "n": 2}', 400, "n must be"),
    ("POST", "/v1/completions", b'{"prompt": "x", "max_tokens": 0}', 400, "max_tokens"),
    ("POST", "/v1/completions", b'{"prompt": 5}', 400, "prompt must be"),
    ("POST", "/v1/chat/completions", b'{"messages": []}', 400, "messages"),
    ("POST", "/set_internal_state", b'{"server_args": {"pp_max_micro_batch_size": "8"}}', 400,
     "must be a number"),
    ("POST", "/start_profile", b'{"activities": ["MEM"]}', 400, "CPU and GPU"),
    ("GET", "/nope", None, 404, "no route"),
    ("GET", "/v1/completions", None, 405, "use POST"),
])
def test_errors_are_one_line_json(served, method, path, body, status, needle):
    url, _, _ = served()
    st, raw, ctype = _raw(url, method, path, raw=body)
    assert st == status and ctype == "application/json"
    assert raw.count(b"\n") == 0 and b"Traceback" not in raw
    d = json.loads(raw)
    assert d["code"] == status and needle in d["message"]


def test_body_bound_and_refusal_when_stopped(served):
    url, state, _ = served()
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"POST /v1/completions HTTP/1.0\r\nContent-Length: %d\r\n\r\n"
                  % (SH.MAX_BODY + 1))
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.0 413") and b"over 1048576 bytes" in reply
    state.close("stopped by test")
    st, raw, _ = _raw(url, "POST", "/v1/completions", {"prompt": "x"})
    assert st == 503 and b"stopped by test" in raw
    assert _raw(url, "GET", "/health")[0] == 503


def test_set_internal_state_bare_body_and_sglang_reply_shape(served):
    url, _, _ = served(_args(mrr=64))
    st, raw, _ = _raw(url, "POST", "/set_internal_state", {"pp_max_micro_batch_size": 4})
    assert st == 200 and json.loads(raw) == [True]
    st, raw, _ = _raw(url, "POST", "/set_internal_state", {"server_args": {"max_running_requests": 4}})
    assert st == 200 and json.loads(raw) == [False]


def test_parse_address():
    assert SH.parse_address("30000") == ("127.0.0.1", 30000)
    assert SH.parse_address("0.0.0.0:8000") == ("0.0.0.0", 8000)
    assert SH.parse_address(":8000") == ("127.0.0.1", 8000)
    for bad in ("x", "70000", "0", "a b:1"):
        with pytest.raises(ValueError, match="--serve"):
            SH.parse_address(bad)


def test_cli_serve_bad_address_and_port_taken(monkeypatch, tmp_path, capsys):
    from microbench.dispatch import probe as D
    monkeypatch.setattr(D, "available", lambda: None)
    monkeypatch.setattr(D, "visible_gpus", lambda: 2)
    rc = cli.main(["dispatch", "--pp", "2", "--serve", "99999", "--json", str(tmp_path / "d.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "port must be" in err[0]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rc = cli.main(["dispatch", "--pp", "2", "--serve", str(port), "--json",
                       str(tmp_path / "d.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "cannot listen" in err[0]
    rc = cli.main(["dispatch", "--pp", "2", "--serve", "30000", "--policies", "sglang,even",
                   "--json", str(tmp_path / "d.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "one admission policy" in err[0]
    assert not (tmp_path / "d.json").exists()


def test_loop_config_serve():
    from microbench.dispatch import probe as D
    lc = D.loop_config(D.DispatchConfig(pp=2, max_running_requests=64, serve="127.0.0.1:30000",
                                        policies=("sglang",), work="busy"))
    assert lc["serve"] == {"host": "127.0.0.1", "port": 30000, "policy": "sglang",
                           "seconds": None}
    assert [p["arrival"] for p in lc["points"]] == ["served"]
    assert lc["concurrency"] == [64]


def test_live_refusal_list_is_waived():
    assert sglang_live.refused(200, [False]) and sglang_live.refused(200, {"success": False})
    assert not sglang_live.refused(200, [True]) and sglang_live.refused(500, "x")


def test_metrics_reader_drops_moe_ep_rank():
    txt = 'sglang:num_running_reqs{moe_ep_rank="0",pp_rank="1",tp_rank="0"} 3\n'
    assert sglang_metrics.parse_metrics(txt)["ranks"]["1"]["num_running_reqs"] == 3.0


def test_unreachable_is_cli_error():
    with pytest.raises(CliError):
        sglang_live.run_live(sglang_live.LiveConfig(url="http://127.0.0.1:9", concurrency=1,
                                                    max_tokens=1, timeout_s=2))


def test_rank_profiler_writes_a_real_trace_the_reader_reads(tmp_path):
    # the GPU loop's profiler (torch.profiler, here with CPU activity only) through a rank's
    # control handling: start, SGLang's ranges while it records, stop, SGLang's file name
    import contextlib

    import torch

    from microbench.dispatch.pp_loop import RankProfiler
    from microbench.sglang import trace as sglang_trace
    ctx: dict = {}
    side = SV.RankSide(1, None, profiler=lambda acts: RankProfiler(torch, ctx, acts))
    side.apply({"id": None, "kind": "start_profile",
                "args": {"output_dir": str(tmp_path), "activities": ["CPU"],
                         "profile_id": "123.5"}}, 0)
    assert ctx["profiler"] is not None
    for _ in range(3):
        with (torch.profiler.record_function("recv_requests") if ctx.get("profiler")
              else contextlib.nullcontext()):
            torch.ones(64).sum()
    side.apply({"id": None, "kind": "stop_profile", "args": {}}, 1)
    assert ctx["profiler"] is None
    assert [p.name for p in tmp_path.iterdir()] == ["123.5-TP-0-PP-1.trace.json.gz"]
    f = tmp_path / "123.5-TP-0-PP-1.trace.json.gz"
    ev = json.loads(gzip.decompress(f.read_bytes()))["traceEvents"]
    assert sum(1 for e in ev if e.get("name") == "recv_requests") == 3
    rank, a = sglang_trace.read_trace(f)   # CPU only: the reader finds the rank, no GPU work
    assert rank == 1 and a["gpu_events"] == 0


def test_start_serving_from_the_loop_config():
    from microbench.dispatch import probe as D
    from microbench.dispatch.pp_loop import start_serving
    lc = D.loop_config(D.DispatchConfig(pp=2, max_running_requests=64, max_micro_batch=24,
                                        serve="127.0.0.1:30000", policies=("even",), work="busy"))
    lc["serve"]["port"] = 0   # any free port
    state, server = start_serving(lc)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert _raw(url, "GET", "/health")[0] == 503   # stages not built yet
        info = json.loads(_raw(url, "GET", "/get_server_info")[1])
        assert (info["pp_size"], info["pp_max_micro_batch_size"], info["pp_async_batch_depth"],
                info["cuda_graph_max_bs_decode"], info["policy"]) == (2, 24, 2, 24, "even")
    finally:
        state.close("test over")
        server.shutdown()
        server.server_close()


def test_served_run_stopped_by_ctrl_c_is_an_ok_record_beside_nothing(monkeypatch, tmp_path,
                                                                    fake_rank):
    # the launcher side of serve mode: the ranks write their session, the user's Ctrl-C is the
    # normal end (ok, not partial); a failed session never replaces a good record
    from microbench.dispatch import probe as D
    from reports.base.records import read_record

    def ranks_then_ctrl_c(cmd, env, timeout_s, grace_s=20.0):
        assert timeout_s is None   # serve mode: no whole-run limit unless given
        out = cmd[cmd.index("--out-dir") + 1]
        for r in (0, 1):
            d = fake_rank(r, 0.0)
            d["points"][0]["point"] = {"policy": "sglang", "arrival": "served",
                                       "concurrency": 8, "inject": []}
            (D.Path(out) / f"rank{r}.json").write_text(json.dumps(d))
        raise KeyboardInterrupt
    monkeypatch.setattr(D, "available", lambda: None)
    monkeypatch.setattr(D.launch, "run_group", ranks_then_ctrl_c)
    path = tmp_path / "dispatch_serve.json"
    cfg = D.DispatchConfig(pp=2, work="busy", policies=("sglang",), serve="127.0.0.1:30000",
                           json_path=str(path), timeout_s=None)
    rec, note = D.run(cfg)
    assert rec.status == "ok" and "served until stopped" in rec.reason and note is None
    (run,) = read_record(path).data["runs"]
    assert run["arrival"] == "served" and run["decode_tokens"] == 16

    def rank_fails(cmd, env, timeout_s, grace_s=20.0):
        out = cmd[cmd.index("--out-dir") + 1]
        (D.Path(out) / "rank1.error").write_text("rank 1: RuntimeError: boom\n")
        return 1, False
    monkeypatch.setattr(D.launch, "run_group", rank_fails)
    rec, note = D.run(cfg)
    assert rec.status == "error" and "boom" in rec.reason
    assert read_record(path).status == "ok"          # the good record stays
    assert (tmp_path / "dispatch_serve.error.json").exists()
