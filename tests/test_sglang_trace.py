"""Streaming Kineto trace reader, checked against Holistic Trace Analysis on the same files."""
from __future__ import annotations

import gzip
import json
import logging
import shutil

import pytest

from microbench.sglang import trace as sglang_trace
from reports.base.errors import CliError

HTA_SETS = [("hta", ["critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz"]),
            ("hta", ["ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"]),
            ("hta", ["trace_filter_sampled_rank-0.json.gz", "trace_filter_sampled_rank-1.json.gz"]),
            ("pp2", ["pp2_burst_c8-rank0.json.gz", "pp2_burst_c8-rank1.json.gz"]),
            # recorded by ppscope dispatch --profile (SGLang-style names, CUDA graphs, 2 ranks)
            ("recorded", ["dispatch-sglang-burst-c8-TP-0-PP-0.trace.json.gz",
                          "dispatch-sglang-burst-c8-TP-0-PP-1.trace.json.gz"])]


def _copy(fixtures, tmp_path, sub, names):
    for n in names:
        shutil.copy(fixtures / "traces" / sub / n, tmp_path / n)
    return tmp_path


@pytest.mark.parametrize("sub,names", HTA_SETS)
def test_busy_idle_agrees_with_hta(fixtures, tmp_path, sub, names):
    pytest.importorskip("hta.trace_analysis", exc_type=ImportError)
    from hta.trace_analysis import TraceAnalysis
    d = _copy(fixtures, tmp_path, sub, names)
    logging.disable(logging.WARNING)
    try:
        ta = TraceAnalysis(trace_dir=str(d))
        ref = ta.get_temporal_breakdown(visualize=False).set_index("rank")
        idle_ref = {r: ta.get_idle_time_breakdown(ranks=[r], visualize=False)[0]
                    for r in ref.index}
    finally:
        logging.disable(logging.NOTSET)
    exact = sglang_trace.read_traces(d, hta_rounding=True)["ranks"]
    ours = sglang_trace.read_traces(d)["ranks"]
    assert sorted(int(k) for k in exact) == sorted(ref.index)
    for r, row in ref.iterrows():
        e, o = exact[str(r)], ours[str(r)]
        # HTA rounds every interval inward to whole us; with the same rounding we agree exactly
        assert e["span_us"] == row["kernel_time(us)"]
        assert e["idle_us"] == row["idle_time(us)"]
        assert e["compute_us"] == row["compute_time(us)"]
        assert e["non_compute_us"] == row["non_compute_time(us)"]
        for _, s in idle_ref[r].iterrows():
            got = e["idle_split_by_stream"][str(int(s["stream"]))][s["idle_category"] + "_us"]
            assert got == pytest.approx(s["idle_time"], abs=0.5)
        # At full (sub-us) precision we differ from HTA only by its rounding, which shrinks each
        # interval by < 2 us (ceil start, floor end): at most 2 us per GPU event, 2 us on the span.
        busy_ref = row["kernel_time(us)"] - row["idle_time(us)"]
        assert e["busy_us"] == pytest.approx(busy_ref, rel=0.01)
        assert e["idle_us"] == pytest.approx(row["idle_time(us)"], rel=0.01)
        assert abs(o["busy_us"] - busy_ref) <= o["gpu_events"] * 2.0
        assert abs(o["span_us"] - row["kernel_time(us)"]) <= 2.0


def test_pp2_burst_numbers(fixtures):
    t = sglang_trace.read_traces(fixtures / "traces" / "pp2" / "pp2_burst_c8-rank1.json.gz",
                                 link_gbps=100.0)
    r = t["ranks"]["1"]
    assert r["gpu_events"] == 440 and r["graph_kernels"] == 0
    rec = r["nccl_recv"]
    assert rec["kernels"] == 6
    assert rec["bytes"] == 6 * 57344 * 2  # bf16 hidden states, 57344 elements each
    assert rec["transfer_us"] == pytest.approx(6 * 57344 * 2 / 1e5)
    assert rec["wait_us"] == pytest.approx(rec["total_us"] - rec["transfer_us"])
    assert rec["total_us"] / r["span_us"] > 0.75  # rank 1 mostly waits for rank 0 (burst)
    assert r["dispatch_latency_us"]["n"] == 6
    assert len(r["busy_frac_over_time"]) == 20
    assert all(0.0 <= b <= 1.0 + 1e-9 for b in r["busy_frac_over_time"])


def test_small_chunks_give_same_answer(fixtures, monkeypatch):
    f = fixtures / "traces" / "pp2" / "pp2_burst_c8-rank0.json.gz"
    big = sglang_trace.read_trace(f)
    monkeypatch.setattr(sglang_trace, "CHUNK_CHARS", 997)
    small = sglang_trace.read_trace(f)
    assert big == small


def test_truncated_and_bad_traces(fixtures, tmp_path):
    raw = gzip.decompress((fixtures / "traces" / "pp2" / "pp2_burst_c8-rank0.json.gz").read_bytes())
    (tmp_path / "cut.json").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CliError, match="truncated"):
        sglang_trace.read_trace(tmp_path / "cut.json")
    gz = gzip.compress(raw)
    (tmp_path / "cut.json.gz").write_bytes(gz[: len(gz) // 2])
    with pytest.raises(CliError, match="truncated|corrupt"):
        sglang_trace.read_trace(tmp_path / "cut.json.gz")
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(CliError, match="empty"):
        sglang_trace.read_trace(tmp_path / "empty.json")
    (tmp_path / "x.json").write_text('{"foo": 1}')
    with pytest.raises(CliError, match="no traceEvents"):
        sglang_trace.read_trace(tmp_path / "x.json")
    with pytest.raises(CliError, match="no such trace directory"):
        sglang_trace.read_traces(tmp_path / "nope")
    (tmp_path / "gzempty.json.gz").write_bytes(gzip.compress(b""))
    with pytest.raises(CliError, match="empty"):
        sglang_trace.read_trace(tmp_path / "gzempty.json.gz")
    (tmp_path / "junk.json.gz").write_bytes(b"\x1f\x8b" + b"not gzip at all")
    with pytest.raises(CliError, match="corrupt gzip"):
        sglang_trace.read_trace(tmp_path / "junk.json.gz")


def test_two_profiles_in_one_dir_is_an_error(fixtures, tmp_path):
    pp2 = fixtures / "traces" / "pp2"
    with pytest.raises(CliError, match="a second trace for rank 0"):
        sglang_trace.read_traces(pp2)
    # one profile's files, given as a list, read fine
    t = sglang_trace.read_traces([pp2 / "pp2_burst_c8-rank0.json.gz",
                                  pp2 / "pp2_burst_c8-rank1.json.gz"])
    assert sorted(t["ranks"]) == ["0", "1"]


def test_malformed_events_are_counted(tmp_path):
    # a well-formed trace with three events HTA/Kineto would never write: a number, a kernel
    # without ts, a runtime call with a non-numeric correlation; the good kernel still counts
    ev = [{"ph": "X", "cat": "kernel", "name": "gemm", "ts": 10.0, "dur": 5.0,
           "args": {"stream": 7, "correlation": 1}},
          3, {"ph": "X", "cat": "kernel", "name": "gemm", "args": {"stream": 7}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 9.0,
           "args": {"correlation": "x"}}]
    (tmp_path / "t-TP-0-PP-0.trace.json").write_text(json.dumps({"traceEvents": ev}))
    r = sglang_trace.read_traces(tmp_path)["ranks"]["0"]
    assert (r["events"], r["events_unrecognised"], r["gpu_events"]) == (4, 3, 1)
    assert r["busy_us"] == 5.0


def test_recorded_pp2_sglang_burst(fixtures):
    """ppscope dispatch --profile traces (2x H200, PP2, C=8 burst: all 8 requests in one slot)."""
    t = sglang_trace.read_traces(fixtures / "traces" / "recorded", link_gbps=300.0)["ranks"]
    r0, r1 = t["0"], t["1"]
    for r in (r0, r1):
        assert r["gpu_events"] == 4873 and r["graph_launches"] == 64
        assert (r["graph_kernels"], r["eager_kernels"]) == (4608, 265)  # 72 kernels per graph
        assert r["nccl_recv"]["kernels"] == 65
        assert r["busy_us"] + r["idle_us"] == pytest.approx(r["span_us"])
    # rank 0 receives sampled tokens (8 x int64) back from the last rank; rank 1 hidden states
    # (bf16, 7168 wide): 640 token rows over 65 receives (64 decodes of 8, one larger first)
    assert r0["nccl_recv"]["bytes"] == 65 * 8 * 8
    assert r1["nccl_recv"]["bytes"] == 640 * 7168 * 2
    # rank 1 is "busy" 83% of the time, but half of its span is a receive waiting for rank 0
    assert r1["busy_frac"] == pytest.approx(0.8313, abs=1e-4)
    assert r1["compute_us"] / r1["span_us"] == pytest.approx(0.3416, abs=1e-4)
    assert r1["nccl_recv"]["wait_us"] / r1["span_us"] == pytest.approx(0.4889, abs=1e-4)
    # forward starts ~8 us after its input lands (GPU view), ~25 us after recv_requests (CPU)
    assert r1["dispatch_latency_us"]["p50"] == pytest.approx(8.03, abs=0.01)
    assert r1["cpu_dispatch_latency_us"]["n"] == 65  # one per run_batch, not per empty slot
    assert r1["cpu_dispatch_latency_us"]["p50"] == pytest.approx(24.70, abs=0.01)
    assert r0["cpu_dispatch_latency_us"]["n"] == 0   # rank 0 has no recv_requests range here
    assert r1["scheduler_ranges_us"]["recv_requests"]["count"] == 261
    assert r1["scheduler_ranges_us"]["run_batch"]["count"] == 65
    assert r1["idle_split_compute_stream_us"]["stream"] == 7
    split = r1["idle_split_compute_stream_us"]
    assert split["host_wait_us"] == pytest.approx(342808.85, abs=0.01)  # CPU blocked in recv
