"""Bad input never gets past: the classes of inputs that once gave a wrong answer with exit 0,
an "internal error", a blocked read, an error naming the wrong thing or a refusal of acceptable
input. Each case runs the CLI as a user does and asserts its contract: exit 2 with one line on
stderr, no traceback, no good record replaced (or exit 0 with the right result where the input
is acceptable). Small inputs are committed (tests/fixtures/bad_inputs/), variants of recorded
traces and logs and the big inputs are built here; a few parsers are fuzzed (hypothesis, few
examples: the module runs in well under a minute).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from fake_http import QuietHandler

from reports.base.errors import CliError
from reports.cli import main

ROOT = Path(__file__).resolve().parents[1]
BAD = Path(__file__).parent / "fixtures" / "bad_inputs"
FIX = Path(__file__).parent / "fixtures"
PP2 = FIX / "traces" / "pp2"
FUZZ = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def run(argv, capsys) -> tuple[int, str, str]:
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:   # argparse: its usage line + exit 2
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc: int, err: str, *words: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, (rc, err)
    assert "Traceback" not in err and "internal error" not in err, err
    assert len(lines) == 1, err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def good_sglang(tmp_path, capsys) -> Path:
    """A good results/sglang.json (a log and a bench run read) that no failed run may touch."""
    path = tmp_path / "results" / "sglang.json"
    rc, _, err = run(["sglang", "--log", FIX / "sglang" / "pp2_mixed.log",
                      "--bench", FIX / "sglang" / "bench.jsonl", "--json", path], capsys)
    assert rc == 0, err
    return path


def trace_variant(src: Path, dst: Path, change) -> Path:
    d = json.loads(gzip.decompress(src.read_bytes()))
    change(d)
    dst.write_text(json.dumps(d))
    return dst


def read_rank(path: Path, capsys) -> dict:
    out = path.parent / "sglang.json"
    rc, _, err = run(["sglang", "--traces", path, "--json", out], capsys)
    assert rc == 0, err
    ranks = json.loads(out.read_text())["data"]["traces"]["ranks"]
    assert len(ranks) == 1
    return next(iter(ranks.values()))


# ------------------------------------------- 1. a wrong answer with exit 0 (nothing told)

def test_duplicated_trace_events_are_counted_once(tmp_path, capsys):
    src = PP2 / "pp2_burst_c8-rank1.json.gz"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    clean = read_rank(trace_variant(src, tmp_path / "a" / "t-rank1.json", lambda d: None), capsys)
    dup = read_rank(trace_variant(src, tmp_path / "b" / "t-rank1.json", lambda d: d.update(
        traceEvents=[e for e in d["traceEvents"] for _ in (0, 1)])), capsys)
    assert dup["nccl_recv"]["total_us"] == clean["nccl_recv"]["total_us"] > 0
    assert dup["busy_us"] == clean["busy_us"] and dup["gpu_events"] == clean["gpu_events"]
    assert dup["events_duplicate"] > 0
    assert any("duplicated" in w for w in dup["warnings"])


@pytest.mark.parametrize("change, words", [
    (lambda d: d.update(traceEvents=[json.dumps(e) for e in d["traceEvents"]]),
     "no usable GPU event"),
    (lambda d: [e["args"].update(stream=str(e["args"]["stream"])) for e in d["traceEvents"]
                if isinstance(e.get("args"), dict) and "stream" in e["args"]],
     "no usable GPU event"),
    (lambda d: d.update(distributedInfo={"rank": -1}), "distributedInfo.rank is -1"),
])
def test_malformed_traces_are_refused(tmp_path, capsys, good_sglang, change, words):
    before = digest(good_sglang)
    t = trace_variant(PP2 / "pp2_burst_c8-rank1.json.gz", tmp_path / "t.json", change)
    rc, _, err = run(["sglang", "--traces", t, "--json", good_sglang], capsys)
    one_line_error(rc, err, str(t), words)
    assert digest(good_sglang) == before


def test_nccl_kernels_with_malformed_args_keep_their_busy_time(tmp_path, capsys):
    src = PP2 / "pp2_burst_c8-rank1.json.gz"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()

    def bad_args(d):
        for e in d["traceEvents"]:
            if isinstance(e.get("args"), dict) and "In msg nelems" in e["args"]:
                e["args"]["In msg nelems"] = "abc"
    clean = read_rank(trace_variant(src, tmp_path / "a" / "t-rank1.json", lambda d: None), capsys)
    bad = read_rank(trace_variant(src, tmp_path / "b" / "t-rank1.json", bad_args), capsys)
    assert bad["busy_frac"] == clean["busy_frac"]
    assert bad["nccl_recv"]["kernels"] == clean["nccl_recv"]["kernels"]
    assert bad["nccl_recv_size_unknown"] == clean["nccl_recv"]["kernels"] > 0
    assert any("message size" in w for w in bad["warnings"])


def test_histogram_with_count_zero_gives_no_percentiles(tmp_path):
    from microbench.sglang.metrics import parse_metrics
    text = "\n".join([
        'sglang:inter_token_latency_seconds_bucket{le="0.01",pp_rank="0"} 5',
        'sglang:inter_token_latency_seconds_bucket{le="+Inf",pp_rank="0"} 9',
        'sglang:inter_token_latency_seconds_sum{pp_rank="0"} 0.0',
        'sglang:inter_token_latency_seconds_count{pp_rank="0"} 0',
        'sglang:num_running_reqs{pp_rank="0"} 3'])
    h = parse_metrics(text)["ranks"]["0"]["inter_token_latency_seconds"]
    assert (h["count"], h["mean"], h["p50"], h["p99"]) == (0, None, None, None)


def test_observed_concurrency_given_twice_is_an_error(tmp_path, capsys):
    rc, _, err = run(["report", "--results", tmp_path, "--observed", "1:34,1:35"], capsys)
    one_line_error(rc, err, "--observed", "concurrency 1 given twice")


def test_model_config_with_absurd_vocabulary_is_refused(tmp_path, capsys):
    out = tmp_path / "stage_cost.json"
    rc, _, err = run(["stage-cost", "--plan", "--gpu", "rtx-pro-6000", "--model",
                      BAD / "model_huge_vocab.json", "--json", out], capsys)
    one_line_error(rc, err, "vocab_size")
    assert not out.exists()


def test_topology_bad_hidden_never_replaces_the_record(tmp_path, capsys):
    out = tmp_path / "topology.json"
    smi = FIX / "topo" / "rtxpro6000x8_pcie.txt"
    rc, _, err = run(["topology", "--from-nvidia-smi", smi, "--json", out, "--no-png"], capsys)
    assert rc == 0, err
    before = digest(out)
    rc, _, err = run(["topology", "--from-nvidia-smi", smi, "--json", out, "--no-png",
                      "--hidden", "-1"], capsys)
    one_line_error(rc, err, "--hidden")
    assert digest(out) == before


# ------------------------------------------------ 2. the live probe believes no server

def _fake_server(mode: str):
    class H(QuietHandler):
        def do_GET(self):
            self.reply(200, b'{"data": [{"id": "m"}]}')

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if mode == "not_json":
                return self.reply(200, b"data: hello there\n\n", "text/event-stream")
            if mode == "html":
                return self.reply(200, b"<html><body>Sign in</body></html>", "text/html")
            chunk = {"infinity": b'data: {"choices": [{"text": "a", "logprob": Infinity}]}\n\n',
                     "utf8": b'data: {"choices": [{"text": "\xff\xfe"}]}\n\n',
                     "null_choice": b'data: {"choices": [null]}\n\n',
                     "good": b'data: {"choices": [{"text": "tok"}]}\n\n'}[mode]
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for _ in range(4):
                self.wfile.write(chunk)
            self.wfile.write(b"data: [DONE]\n\n")

    class Quiet(ThreadingHTTPServer):
        def handle_error(self, request, client_address):
            pass   # the probe hangs up on a bad reply: the server's broken pipe is expected

    srv = Quiet(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    return srv


def _not_http_server():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)

    def serve():
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            c.recv(4096)
            c.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\x00\x01\x02garbage\r\n\r\n")
            c.close()
    threading.Thread(target=serve, daemon=True).start()
    return s


LIVE = ["--live-concurrency", "2", "--live-tokens", "4", "--live-arrival", "burst",
        "--live-timeout", "10"]


def _live_run(mode: str, record: Path, capsys):
    """`ppscope sglang --url` against a fake server replying in `mode`, writing `record`."""
    srv = _fake_server(mode)
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        return run(["sglang", "--url", url, *LIVE, "--json", record], capsys)
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("mode, words", [
    ("not_json", "not JSON"), ("html", "Content-Type text/html"),
    ("infinity", "Infinity"), ("utf8", "not UTF-8"), ("null_choice", "null choice")])
def test_live_probe_checks_every_reply(good_sglang, capsys, mode, words):
    before = digest(good_sglang)
    rc, _, err = _live_run(mode, good_sglang, capsys)
    one_line_error(rc, err, words)
    assert digest(good_sglang) == before


def test_a_reply_that_is_not_http_is_named_so(good_sglang, capsys):
    before = digest(good_sglang)
    s = _not_http_server()
    try:
        rc, _, err = run(["sglang", "--url", f"http://127.0.0.1:{s.getsockname()[1]}", *LIVE,
                          "--json", good_sglang], capsys)
    finally:
        s.close()
    line = one_line_error(rc, err, "not HTTP")
    assert "cannot reach" not in line and "SSH" not in line and "garbage" not in line
    assert digest(good_sglang) == before


def test_url_that_is_not_a_url(good_sglang, capsys):
    rc, _, err = run(["sglang", "--url", "not a url", "--json", good_sglang], capsys)
    one_line_error(rc, err, "not an http(s) URL")


def test_sglang_runs_accumulate_each_source_its_own_part(good_sglang, capsys):
    rc, _, err = _live_run("good", good_sglang, capsys)
    assert rc == 0, err
    d = json.loads(good_sglang.read_text())["data"]
    assert d["live"]["runs"][0]["chunks"] == 8 and d["ranks"] and d["bench"]
    live = d["live"]
    # a later --log run replaces the log's part only: the live probe's ITL/lockstep stay
    rc, _, err = run(["sglang", "--log", FIX / "sglang" / "tp2_pp2.log", "--json", good_sglang],
                     capsys)
    assert rc == 0, err
    d2 = json.loads(good_sglang.read_text())["data"]
    assert d2["live"] == live and d2["bench"] == d["bench"] and d2["ranks"] != d["ranks"]
    assert set(d2["sources"]) == {"log", "bench", "live"} and "kept from the earlier" in err
    # and the report still reads it
    rc, _, err = run(["report", "--results", good_sglang.parent], capsys)
    assert rc == 0, err


# ---------------------------------------------- 3. "internal error" (exit 1) no more

@pytest.mark.parametrize("name, field", [
    ("pp0", "'pp'"), ("pp_negative", "'pp'"), ("concurrency_string", "'concurrency'"),
    ("concurrency_empty", "'concurrency'"), ("depth_negative", "'async_depth'"),
    ("pp_1e308", "'pp'"), ("pp_non_ascii", "'pp'"), ("concurrency_zero", "'concurrency[0]'"),
    ("estimate_string", "'estimates.host_us'"), ("not_json", "not valid JSON")])
def test_bad_scenario_is_one_line_naming_the_file_and_field(tmp_path, capsys, name, field):
    p = BAD / f"scenario_{name}.json"
    rc, _, err = run(["report", "--results", tmp_path, "--scenario", p], capsys)
    one_line_error(rc, err, str(p), field)


def test_scenario_error_names_the_users_file_not_the_shipped_one(tmp_path, capsys):
    p = BAD / "scenario_named_seed_bad_gpu.json"
    rc, _, err = run(["report", "--results", tmp_path, "--scenario", p], capsys)
    line = one_line_error(rc, err, str(p), "no-such-gpu")
    assert "configs/scenarios/seed-pp8.json" not in line


@pytest.mark.parametrize("probe", ["stage_cost", "dispatch"])
def test_graph_max_bs_with_stage_cost_or_dispatch_records(tmp_path, capsys, probe):
    res = tmp_path / "results"
    if probe == "stage_cost":
        rc, _, err = run(["stage-cost", "--plan", "--gpu", "h200", "--json",
                          res / "stage_cost.json"], capsys)
        assert rc == 0, err
    else:
        rc, _, err = run(["dispatch", "--json", res / "dispatch.json"], capsys)
    rc, _, err = run(["report", "--results", res, "--scenario",
                      BAD / "scenario_graph_max_bs.json"], capsys)
    assert rc == 0 and "Traceback" not in err and "internal error" not in err, err
    rep = json.loads((res / "report.json").read_text())
    assert rep


def test_record_of_another_probe_is_skipped_with_a_warning(tmp_path, capsys):
    res = tmp_path / "results"
    rc, _, err = run(["stage-cost", "--plan", "--gpu", "h200", "--json", res / "x.json"], capsys)
    assert rc == 0, err
    d = json.loads((res / "x.json").read_text())
    d["schema_version"] = 2                       # dispatch's version: a plausible record
    (res / "dispatch.json").write_text(json.dumps(d))
    d["probe"] = "graphs"                         # graphs' name, stage_cost's data
    d["schema_version"] = 1
    (res / "graphs.json").write_text(json.dumps(d))
    (res / "x.json").unlink()
    rc, _, err = run(["report", "--results", res], capsys)
    assert rc == 0 and "internal error" not in err and "Traceback" not in err, err
    assert "dispatch.json" in err and "graphs.json" in err and "skipped" in err


def test_trace_with_deeply_nested_args(tmp_path, capsys, good_sglang):
    before = digest(good_sglang)
    deep = "[" * 200_000 + "]" * 200_000          # built here: 400 kB of nesting
    t = tmp_path / "t-rank0.json"
    t.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, '
                 '"dur": 1, "args": {"stream": 7, "x": ' + deep + '}}]}')
    rc, _, err = run(["sglang", "--traces", t, "--json", good_sglang], capsys)
    one_line_error(rc, err, str(t))
    assert digest(good_sglang) == before


def test_graphs_plan_with_absurd_max_bs_is_refused_early(tmp_path, capsys):
    rc, _, err = run(["graphs", "--plan", "--max-bs", "1000000000", "--json",
                      tmp_path / "g.json"], capsys)
    one_line_error(rc, err, "--max-bs")


def test_stage_cost_plan_with_a_device_as_model(tmp_path, capsys):
    rc, _, err = run(["stage-cost", "--plan", "--gpu", "h200", "--model", "/dev/zero",
                      "--json", tmp_path / "s.json"], capsys)
    one_line_error(rc, err, "/dev/zero", "character device")


# ----------------------------------------------------------- 4. unbounded reads

def _cli(args: list[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    """The CLI in its own interpreter, so that a read that blocks fails the test, not hangs it."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PPSCOPE_RESULTS=str(cwd / "results"))
    return subprocess.run([sys.executable, "-c", "import sys; from reports.cli import main; "
                           "sys.exit(main())", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("args", [
    ["sglang", "--log", "{fifo}"], ["sglang", "--bench", "{fifo}"],
    ["sglang", "--traces", "{fifo}"], ["sglang", "--metrics", "{fifo}"],
    ["topology", "--from-nvidia-smi", "{fifo}", "--no-png"],
    ["report", "--scenario", "{fifo}"], ["stage-cost", "--plan", "--model", "{fifo}"]])
def test_a_fifo_is_refused_not_read_forever(tmp_path, args):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    r = _cli([a.format(fifo=fifo) for a in args], tmp_path, timeout=60)
    one_line_error(r.returncode, r.stderr, str(fifo), "FIFO")


@pytest.mark.parametrize("flag", ["--log", "--bench", "--metrics"])
def test_a_character_device_is_refused(tmp_path, capsys, flag):
    rc, _, err = run(["sglang", flag, "/dev/zero", "--json", tmp_path / "s.json"], capsys)
    one_line_error(rc, err, "/dev/zero", "character device")


# --------------------------------------------------- 5. errors that name the right thing

def test_a_folder_given_as_json_is_named(tmp_path, capsys):
    # a folder given to --json holds the record under its default name (as `--json out/`,
    # tests/test_fuzz_outputs.py); where that name is itself a folder, the error names it
    (tmp_path / "out").mkdir()
    rc, _, err = run(["sglang", "--log", FIX / "sglang" / "pp2_mixed.log", "--json",
                      tmp_path / "out"], capsys)
    assert rc == 0, err
    assert (tmp_path / "out" / "sglang.json").is_file()
    (tmp_path / "out2" / "sglang.json").mkdir(parents=True)
    rc, _, err = run(["sglang", "--log", FIX / "sglang" / "pp2_mixed.log", "--json",
                      tmp_path / "out2"], capsys)
    line = one_line_error(rc, err, str(tmp_path / "out2" / "sglang.json"), "a directory")
    assert ".tmp" not in line


def test_a_symlink_loop_is_named(tmp_path, capsys):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / "r").mkdir()
    rc, _, err = run(["report", "--results", tmp_path / "r", "--json", tmp_path / "a" / "x.json"],
                     capsys)
    line = one_line_error(rc, err, "symbolic-link loop")
    assert "File exists" not in line
    rc, _, err = run(["sglang", "--log", tmp_path / "a", "--json", tmp_path / "s.json"], capsys)
    one_line_error(rc, err, str(tmp_path / "a"), "symbolic-link loop")


def test_a_read_only_results_folder_is_named_not_the_temp_file(tmp_path, monkeypatch, capsys):
    # as root a mode-0555 folder is writable, so the refusal the kernel gives an ordinary user
    # is made here, where the writer asks for its temp file
    import tempfile

    def refuse(*a, **kw):
        raise PermissionError(13, "Permission denied", str(tmp_path / "r" / ".report.json.x.tmp"))
    (tmp_path / "r").mkdir()
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    rc, _, err = run(["report", "--results", tmp_path / "r"], capsys)
    line = one_line_error(rc, err, str(tmp_path / "r" / "report.json"), "Permission denied")
    assert ".tmp" not in line


def test_a_long_observed_argument_is_not_echoed_whole(tmp_path, capsys):
    arg = ",".join(f"{i}:x" for i in range(10_000))
    rc, _, err = run(["report", "--results", tmp_path, "--observed", arg], capsys)
    assert len(one_line_error(rc, err, "--observed")) < 300


# ----------------------------------------------------- 6. acceptable input is accepted

def _ranks(path: Path, log: Path, capsys) -> dict:
    rc, _, err = run(["sglang", "--log", log, "--json", path], capsys)
    assert rc == 0, err
    return json.loads(path.read_text())["data"]["ranks"]


def test_log_with_nul_bytes_and_crlf_is_read(tmp_path, capsys):
    src = FIX / "sglang" / "pp2_mixed.log"
    odd = tmp_path / "copied.log"
    odd.write_bytes(b"\x00" * 4096 + src.read_bytes().replace(b"\n", b"\r\n"))
    assert _ranks(tmp_path / "a.json", odd, capsys) == _ranks(tmp_path / "b.json", src, capsys)


def test_log_behind_a_container_runtime_prefix_keeps_rank_tags(tmp_path, capsys):
    src = FIX / "sglang" / "pp2_mixed.log"
    k8s = tmp_path / "k8s.log"
    k8s.write_bytes(b"".join(b"2026-11-30T10:00:00.123456789Z stdout F " + ln
                             for ln in src.read_bytes().splitlines(keepends=True)))
    clean = _ranks(tmp_path / "b.json", src, capsys)
    assert sorted(clean) == ["0", "1"]
    assert _ranks(tmp_path / "a.json", k8s, capsys) == clean


def test_topo_paste_with_numa_na_is_read_right():
    from topology.smi_parse import parse_topo_matrix, read_smi_file
    t = parse_topo_matrix(read_smi_file(BAD / "topo_numa_na_spaces.txt"))
    assert len(t.gpus) == 8 and not t.unknown_pairs
    assert [g.cpu_affinity for g in t.gpus] == ["0-31,64-95"] * 4 + ["32-63,96-127"] * 4
    assert all(g.numa_node is None for g in t.gpus)    # N/A, never the CPU list's first CPU


# ------------------------------------------------------------- big inputs, made here

def test_big_log_without_newlines_is_refused_in_bounded_time(tmp_path, capsys):
    big = tmp_path / "big.log"
    with open(big, "wb") as f:
        for _ in range(40):
            f.write(b"Decode batch, #running-req: 1, " * 65536)   # 40 x 2 MB, no newline
    rc, _, err = run(["sglang", "--log", big, "--json", tmp_path / "s.json"], capsys)
    one_line_error(rc, err, str(big), "longer than")


def test_big_bench_file_is_refused(tmp_path, capsys):
    big = tmp_path / "bench.jsonl"
    line = json.dumps({"output_throughput": 1.0, "max_concurrency": 1}).encode() + b"\n"
    with open(big, "wb") as f:
        f.write(line * (70 * 2**20 // len(line)))
    rc, _, err = run(["sglang", "--bench", big, "--json", tmp_path / "s.json"], capsys)
    one_line_error(rc, err, str(big), "larger than")


# ----------------------------------------------------------------- fuzzed parsers

@FUZZ
@given(d=st.dictionaries(st.sampled_from(["model", "gpu", "pp", "async_depth", "concurrency",
                                          "tp", "graph_max_bs", "range_ratio", "estimates",
                                          "observed_tok_per_s", "cuda_graphs", "prompt_len"]),
                         st.one_of(st.integers(-5, 10**6), st.floats(allow_nan=False),
                                   st.text(max_size=5), st.none(), st.booleans(),
                                   st.lists(st.integers(-3, 70000), max_size=3),
                                   st.dictionaries(st.text(max_size=3), st.integers(-1, 99),
                                                   max_size=2)),
                         max_size=12))
def test_fuzz_scenario(tmp_path, d):
    from reports.model.scenario.inputs import build_inputs, load_scenario
    base = {"model": "kimi-k2", "gpu": "h200", "pp": 8, "async_depth": 1, "concurrency": [1]}
    p = tmp_path / "s.json"
    p.write_text(json.dumps({**base, **d}))
    try:
        build_inputs(load_scenario(str(p)), {})
    except CliError as e:
        assert "\n" not in str(e) and str(p) in str(e)


@FUZZ
@given(text=st.text(alphabet="0123456789:,.-e xna", max_size=40))
def test_fuzz_observed(text):
    from reports.model.scenario.inputs import parse_observed
    try:
        out = parse_observed(text)
    except CliError as e:
        assert "\n" not in str(e) and len(str(e)) < 300
    else:
        assert all(c >= 1 and 0 < v < 1e9 for c, v in out.items())


_SMALL = st.one_of(st.none(), st.integers(), st.text(max_size=3))
_CHOICE = st.one_of(_SMALL, st.dictionaries(st.sampled_from(["text", "delta"]), st.one_of(
    _SMALL, st.dictionaries(st.just("content"), _SMALL)), max_size=2))
_CHUNK = st.one_of(st.binary(max_size=60), st.builds(
    lambda c: json.dumps({"choices": c}).encode(),
    st.one_of(_SMALL, st.lists(_CHOICE, max_size=2))))


@FUZZ
@given(raw=_CHUNK)
def test_fuzz_streamed_chunk(raw):
    from microbench.sglang.live import BadReply, _chunk_text
    try:
        t = _chunk_text(raw, "/v1/completions")
    except BadReply as e:
        assert "\n" not in str(e)
    else:
        assert t is None or isinstance(t, str)


@FUZZ
@given(url=st.one_of(st.text(max_size=30), st.builds(lambda h: f"http://{h}:30000", st.text(
    max_size=12))))
def test_fuzz_url(url):
    from microbench.sglang.http import split_url
    try:
        host, port, _, _ = split_url(url)
    except CliError as e:
        assert "\n" not in str(e) and len(str(e)) < 200
    else:
        assert host and host.isprintable() and " " not in host and 0 <= port < 65536
