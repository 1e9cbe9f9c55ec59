"""Fuzzing the readers of users' files (hypothesis): whatever the input, each reader returns a
record or raises a one-line CliError (exit 2); never another exception, never NaN in a record.

Inputs are built from the pieces real files are made of (table cells, log fields, trace events,
metric samples, bench_serving keys) with wrong types, NaN / infinite / negative / huge numbers,
cut lines, binary junk and gzip that ends early mixed in, so that most examples reach deep into
the parsers instead of failing at the first byte. Kept small (< 20 s for the module).
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import math
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from reports.base import bench_serving as sglang_bench  # noqa: E402
from microbench.sglang import log as sglang_log  # noqa: E402
from microbench.sglang import metrics as sglang_metrics  # noqa: E402
from microbench.sglang import trace as sglang_trace  # noqa: E402
from reports.base.errors import CliError  # noqa: E402
from topology.smi_parse import LINK_RE, parse_topo_matrix  # noqa: E402

FUZZ = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# numbers as they go wrong in files: NaN, inf, negative, huge, and plain ones
NUMBERS = st.one_of(st.integers(-10, 10_000), st.integers(-2 ** 70, 2 ** 70),
                    st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0, 1, 8, 0.5, 1e300, -1e300, 4294967295, -1]))
ODD = st.one_of(NUMBERS, st.text(max_size=8), st.none(), st.booleans(),
                st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3),
                                                                     st.integers(), max_size=2))


def _rarely(draw, n: int) -> bool:
    """True about once in n + 1 draws (hypothesis leans to 0, so 0 is the common case)."""
    return draw(st.integers(0, n)) == n


def _num_text(x) -> str:
    return repr(x) if not isinstance(x, str) else x


# 0: plain file (most examples), 1: gzip, 2: gzip cut mid-stream
GZ = st.integers(0, 5).map(lambda x: max(0, x - 3))


def _one_line_error(e: CliError) -> None:
    msg = str(e)
    assert msg.strip() and "\n" not in msg, msg


def _no_nan(record) -> None:
    # raises on NaN / inf anywhere in the record, typed payloads' fields included (not through
    # schema.to_json, which writes them as null)
    json.dumps(record, allow_nan=False, default=lambda o: {
        f.name: getattr(o, f.name) for f in dataclasses.fields(o)})


def _write(d: str, data: bytes, name: str, gz: int) -> Path:
    p = Path(d) / name
    if gz:
        z = gzip.compress(data)
        data = z if gz == 1 else z[: max(2, len(z) // 2)]   # gz == 2: cut mid-stream
        p = Path(d) / (name + ".gz")
    p.write_bytes(data)
    return p


# ------------------------------------------------------------------ nvidia-smi topo -m

CELLS = st.sampled_from(["GPU0", "GPU1", "GPU2", "GPU3", "NIC0", "mlx5_0", " X ", "X", "NV4",
                         "NV18", "SYS", "SOC", "PIX", "PXB", "PHB", "NODE", "C2C", "NODEPXB",
                         "NIC0NIC1", "QQQ", "CPU Affinity", "NUMA Affinity", "GPU NUMA ID",
                         "0-7", "8-15,24-31", "N/A", "", "0", "1", "NUMA 0", "Legend:", "#", "|",
                         "---", "GPU", "\x1b[4m", "abc", "-1", "99999999999999999999"])
SEPS = st.sampled_from(["\t", " ", "    ", "\t\t", " | "])


@st.composite
def topo_texts(draw):
    n = draw(st.integers(1, 4))
    header = "\t" + "\t".join([f"GPU{i}" for i in range(n)] + draw(st.lists(
        st.sampled_from(["NIC0", "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]), max_size=3)))
    lines = draw(st.lists(st.sampled_from(["$ nvidia-smi topo -m", "", "# note"]), max_size=2))
    if draw(st.booleans()):
        lines.append(header)
    for _ in range(draw(st.integers(0, 6))):
        sep = draw(SEPS)
        lines.append(sep.join(draw(st.lists(CELLS, min_size=1, max_size=9))))
    text = "\n".join(lines)
    if draw(st.booleans()):   # arbitrary junk anywhere
        k = draw(st.integers(0, len(text)))
        text = text[:k] + draw(st.text(max_size=12)) + text[k:]
    return text


@FUZZ
@given(topo_texts())
def test_fuzz_topo_matrix(text):
    try:
        t = parse_topo_matrix(text)
    except CliError as e:
        _one_line_error(e)
        return
    n = len(t.gpus)
    for key, level in t.links.items():
        i, j = (int(x) for x in key.split("-"))
        assert 0 <= i < j < n and LINK_RE.match(level) and level != "X"
    assert len(t.links) + len(t.unknown_pairs) == n * (n - 1) // 2
    assert all("\n" not in note for note in t.notes)


# ------------------------------------------------------------------ SGLang server log

VALUES = st.one_of(st.integers(0, 64), st.integers(0, 64), st.floats(0, 1e4), ODD)


@st.composite
def log_lines(draw):
    prefix = draw(st.sampled_from([
        "[2026-01-02 03:04:{s:02d} PP{p}] ", "[2026-01-02 03:04:{s:02d}.{ms:03d} DP{p} TP0] ",
        "[23:59:{s:02d} TP{p}] ", "INFO 1 [metrics_reporter.py:1] ", "", "[2026-13-45 99:99:99] ",
        "[2026-01-02 03:04:{s:02d} PP{p} ATTN_CP{p} TP{p}] ", "junk [2026-01-02 03:04:05] ",
        "2026-01-02 03:04:{s:02d},{ms:03d} INFO 1 [f.py:1] "]))
    prefix = prefix.format(p=draw(st.integers(0, 3)), ms=draw(st.integers(0, 999)),
                           s=draw(st.integers(0, 59)))
    if not _rarely(draw, 3):   # mostly real layouts, with odd values
        v = [_num_text(draw(VALUES)) for _ in range(6)]
        kind = draw(st.sampled_from(["Decode batch, ", "Decode batch. ", "Decode batch [9], "]))
        body = draw(st.sampled_from([
            f"{kind}#running-req: {v[0]}, #token: {v[1]}, token usage: 0.5, cuda graph: "
            f"{draw(st.sampled_from(['True', 'False', 'Maybe']))}, gen throughput (token/s): "
            f"{v[2]}, #queue-req: {v[3]}",
            f"{kind}#running-req: {v[0]}, #token: {v[1]}, token usage: 0.5, gen throughput "
            f"(token/s): {v[2]}, largest-len: 0, #queue-req: {v[3]}, ",
            f"Prefill batch, #new-seq: {v[4]}, #new-token: {v[5]}, #cached-token: 0, token "
            f"usage: 0.1, #running-req: {v[0]}, #queue-req: {v[3]}, "]))
        k = draw(st.integers(0, len(body)))
        return prefix + (body[:k] if _rarely(draw, 4) else body)   # sometimes cut
    kind = draw(st.sampled_from(["Decode batch, ", "Decode batch. ", "Prefill batch, ",
                                 "Decode batch", "INFO:  GET /health "]))
    keys = draw(st.lists(st.sampled_from([
        "#running-req", "#token", "token usage", "cuda graph", "npu graph",
        "gen throughput (token/s)", "#queue-req", "#new-seq", "#new-token", "#cached-token",
        "largest-len", "accept len"]), max_size=8))
    fields = ", ".join(f"{k}: {_num_text(draw(ODD))}" for k in keys)
    return prefix + kind + fields + draw(st.sampled_from(["", ", ", ",", "\r"]))


@FUZZ
@given(st.lists(log_lines(), min_size=0, max_size=15), GZ,
       st.binary(max_size=40), st.booleans())
def test_fuzz_sglang_log(lines, gz, junk, add_junk):
    data = "\n".join(lines).encode()
    if add_junk:
        data += junk
    with tempfile.TemporaryDirectory() as d:
        try:
            s = sglang_log.read_logs([_write(d, data, "server.log", gz)], window=2)
        except CliError as e:
            _one_line_error(e)
            return
    _no_nan(s)
    assert s.log.lines_other >= 0 and s.log.lines_batch >= 0 and s.log.lines_unrecognised >= 0
    for r in s.ranks.values():
        f = r.cuda_graph_frac
        assert f is None or 0 <= f <= 1
        assert r.running_req.min is None or r.running_req.min >= 0


# ------------------------------------------------------------------ Kineto trace

@st.composite
def trace_events(draw):
    if not _rarely(draw, 2):   # mostly well-formed events of the kinds the reader keeps
        c = draw(st.integers(0, 20))
        ts = draw(st.floats(0, 1e4))
        kind = draw(st.sampled_from(["kernel", "runtime", "kernel", "nccl", "step", "kernel",
                                     "range", "sync", "runtime"]))
        ev = {"ph": "X", "ts": ts, "dur": draw(st.floats(0, 500)), "pid": 0, "tid": 0}
        if kind == "kernel":
            ev.update(cat="kernel", name="gemm", args={"stream": 7, "correlation": c})
        elif kind == "runtime":
            ev.update(cat="cuda_runtime", name=draw(st.sampled_from(
                ["cudaLaunchKernel", "cudaGraphLaunch"])), args={"correlation": c})
        elif kind == "nccl":
            ev.update(cat="kernel", name="ncclDevKernel_SendRecv",
                      args={"stream": 20, "correlation": c, "In msg nelems": draw(ODD),
                            "dtype": draw(st.sampled_from(["BFloat16", "Float", 3]))})
        elif kind == "step":
            ev.update(cat="cpu_op", name=f"ProfilerStep#{draw(st.integers(0, 3))}")
        elif kind == "range":
            ev.update(cat="user_annotation", name=draw(st.sampled_from(
                ["run_batch", "recv_requests", "process_batch_result"])))
        else:
            ev.update(cat="cuda_sync", name="Context Sync",
                      args={"stream": draw(st.sampled_from([-1, 7, 4294967295])), "correlation": c})
        if _rarely(draw, 3):   # one field goes wrong
            field = draw(st.sampled_from(["ts", "dur", "args", "ph", "name"]))
            if draw(st.booleans()):
                ev.pop(field, None)
            else:
                ev[field] = draw(ODD)
        return ev
    cat = draw(st.sampled_from(["kernel", "gpu_memcpy", "cuda_runtime", "cuda_driver",
                                "user_annotation", "cuda_sync", "cpu_op", "gpu_user_annotation",
                                "Kernel", 7, None]))
    ev = {"ph": draw(st.sampled_from(["X", "X", "X", "i", "B", None])), "cat": cat,
          "name": draw(st.sampled_from(["gemm", "ncclDevKernel_SendRecv", "Memcpy DtoH",
                                        "Context Sync", "ProfilerStep#1", "ProfilerStep#2",
                                        "run_batch", "recv_requests", "cudaLaunchKernel",
                                        "cudaGraphLaunch", 3, None]))}
    if draw(st.booleans()):
        ev["ts"] = draw(st.one_of(st.floats(0, 1e4), NUMBERS, ODD))
    if draw(st.integers(0, 3)):
        ev["dur"] = draw(st.one_of(st.floats(0, 1e3), NUMBERS, ODD))
    args = {}
    for k in draw(st.lists(st.sampled_from(["stream", "correlation", "In msg nelems", "dtype",
                                            "Collective name"]), max_size=4)):
        args[k] = draw(st.one_of(st.integers(-2, 50), ODD))
    ev["args"] = draw(ODD) if _rarely(draw, 5) else args
    return draw(ODD) if _rarely(draw, 9) else ev


@FUZZ
@given(st.lists(trace_events(), max_size=30), GZ, st.integers(0, 5),
       st.one_of(st.none(), st.integers(-3, 3), ODD))
def test_fuzz_trace(events, gz, cut, rank):
    doc = {"distributedInfo": {"rank": rank}, "traceEvents": events}
    text = json.dumps(doc, allow_nan=True, default=str).encode()
    if cut == 5:   # a document cut short
        text = text[: len(text) * 2 // 3]
    with tempfile.TemporaryDirectory() as d:
        try:
            t = sglang_trace.read_traces(_write(d, text, "t-rank0.json", gz).parent,
                                         hta_compatible=bool(cut == 1))
        except CliError as e:
            _one_line_error(e)
            return
    _no_nan(t)
    for r in t.ranks.values():
        assert r.busy_us >= 0 and r.span_us >= 0
        assert r.busy_frac is None or 0 <= r.busy_frac <= 1 + 1e-9
        assert all(v >= 0 for v in r.idle_split_us.values())


# ------------------------------------------------------------------ Prometheus /metrics

@st.composite
def metric_lines(draw):
    name = draw(st.sampled_from(["sglang:num_running_reqs", "sglang:gen_throughput",
                                 "sglang:inter_token_latency_seconds_bucket",
                                 "sglang:inter_token_latency_seconds_sum",
                                 "sglang:inter_token_latency_seconds_count",
                                 "sglang:cuda_graph_passes_total", "other_metric", "# HELP x",
                                 "sglang:"]))
    labels = {k: draw(st.sampled_from(["0", "1", "abc", "+Inf", "-Inf", "NaN", "0.1", "1e400",
                                       'q"uote', ""]))
              for k in draw(st.lists(st.sampled_from(["le", "pp_rank", "tp_rank", "mode"]),
                                     max_size=3))}
    lab = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
    val = _num_text(draw(st.one_of(NUMBERS, st.sampled_from(["NaN", "+Inf", "-Inf", "x", ""]))))
    return f"{name}{lab} {val}" + draw(st.sampled_from(["", " 1712345678", " junk"]))


@FUZZ
@given(st.lists(metric_lines(), max_size=25))
def test_fuzz_metrics(lines):
    try:
        m = sglang_metrics.parse_metrics("\n".join(lines))
    except CliError as e:
        _one_line_error(e)
        return
    _no_nan(m)


# ------------------------------------------------------------------ bench_serving results

BENCH_KEYS = st.sampled_from(sorted(set(sglang_bench._KEEP) | set(sglang_bench._ALIASES)))


@st.composite
def bench_texts(draw):
    if draw(st.booleans()):   # JSONL
        lines = []
        for _ in range(draw(st.integers(0, 6))):
            d = {k: draw(ODD) for k in draw(st.lists(BENCH_KEYS, max_size=8))}
            if draw(st.booleans()):
                d["output_throughput"] = draw(ODD)
            lines.append(draw(st.text(max_size=20)) if _rarely(draw, 6)
                         else json.dumps(d, allow_nan=True, default=str))
        return "\n".join(lines)
    labels = sorted(sglang_bench._LABELS)
    out = [draw(st.sampled_from(["", "Maximum request concurrency: 8"]))]
    for _ in range(draw(st.integers(0, 2))):
        out.append("============ Serving Benchmark Result ============")
        for lab in draw(st.lists(st.sampled_from(labels), max_size=8)):
            out.append(f"{lab}: {_num_text(draw(ODD))}")
        out.append("=" * 50)
    return "\n".join(out)


@FUZZ
@given(bench_texts(), GZ)
def test_fuzz_bench(text, gz):
    with tempfile.TemporaryDirectory() as d:
        try:
            b = sglang_bench.read_bench(_write(d, text.encode(), "bench.jsonl", gz))
        except CliError as e:
            _one_line_error(e)
            return
    _no_nan(b)
    for r in b["runs"]:
        for k, v in r.items():
            assert v is None or isinstance(v, (int, float, str)), (k, v)
            assert not isinstance(v, float) or math.isfinite(v)
