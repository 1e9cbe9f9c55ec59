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
    exact = sglang_trace.read_traces(d, hta_compatible=True).ranks
    ours = sglang_trace.read_traces(d).ranks
    assert sorted(int(k) for k in exact) == sorted(ref.index)
    for r, row in ref.iterrows():
        e, o = exact[str(r)], ours[str(r)]
        # with HTA's rules and its rounding (every interval inward to whole us) we agree exactly
        assert e.rules["mode"] == "hta_compatible" and o.rules["mode"] == "default"
        assert e.span_us == row["kernel_time(us)"]
        assert e.idle_us == row["idle_time(us)"]
        assert e.compute_us == row["compute_time(us)"]
        assert e.non_compute_us == row["non_compute_time(us)"]
        for _, s in idle_ref[r].iterrows():
            got = e.idle_split_by_stream[str(int(s["stream"]))][s["idle_category"] + "_us"]
            assert got == pytest.approx(s["idle_time"], abs=0.5)
        # By default we differ from HTA by its rounding, which shrinks each interval by < 2 us
        # (ceil start, floor end): at most 2 us per GPU event, 2 us on the span; and by the
        # sync events it counts busy on a stream (at most their total time)
        busy_ref = row["kernel_time(us)"] - row["idle_time(us)"]
        assert e.busy_us == busy_ref
        syncs = o.sync_excluded_us
        assert abs(o.busy_us - busy_ref) <= (o.gpu_events + e.gpu_events) * 2.0 + syncs
        if o.sync_events_excluded:   # a sync outside the kernels widened HTA's span
            assert o.span_us <= row["kernel_time(us)"] + 2.0
        else:
            assert abs(o.span_us - row["kernel_time(us)"]) <= 2.0


def test_pp2_burst_numbers(fixtures):
    t = sglang_trace.read_traces(fixtures / "traces" / "pp2" / "pp2_burst_c8-rank1.json.gz",
                                 link_gbps=100.0)
    r = t.ranks["1"]
    assert r.gpu_events == 440 and r.graph_kernels == 0
    rec = r.nccl_recv
    assert rec.kernels == 6
    assert rec.bytes == 6 * 57344 * 2  # bf16 hidden states, 57344 elements each
    assert rec.transfer_us == pytest.approx(6 * 57344 * 2 / 1e5)
    assert rec.wait_us == pytest.approx(rec.total_us - rec.transfer_us)
    assert rec.total_us / r.span_us > 0.75  # rank 1 mostly waits for rank 0 (burst)
    assert r.dispatch_latency_us.n == 6
    assert len(r.busy_frac_over_time) == 20
    assert all(0.0 <= b <= 1.0 + 1e-9 for b in r.busy_frac_over_time)


def test_small_chunks_give_same_answer(fixtures, monkeypatch):
    f = fixtures / "traces" / "pp2" / "pp2_burst_c8-rank0.json.gz"
    big = sglang_trace.read_trace(f)
    monkeypatch.setattr(sglang_trace, "CHUNK_CHARS", 997)
    small = sglang_trace.read_trace(f)
    assert big == small


def test_truncated_and_bad_traces(fixtures, tmp_path, refused):
    raw = gzip.decompress((fixtures / "traces" / "pp2" / "pp2_burst_c8-rank0.json.gz").read_bytes())
    read = sglang_trace.read_trace
    refused(read, tmp_path / "cut.json", raw[: len(raw) // 2], "truncated")
    gz = gzip.compress(raw)
    refused(read, tmp_path / "cut.json.gz", gz[: len(gz) // 2], "truncated|corrupt")
    refused(read, tmp_path / "empty.json", "", "empty")
    refused(read, tmp_path / "x.json", '{"foo": 1}', "no traceEvents")
    with pytest.raises(CliError, match="no such trace directory"):
        sglang_trace.read_traces(tmp_path / "nope")
    refused(read, tmp_path / "gzempty.json.gz", gzip.compress(b""), "empty")
    refused(read, tmp_path / "junk.json.gz", b"\x1f\x8b" + b"not gzip at all", "corrupt gzip")


def test_two_profiles_in_one_dir_is_an_error(fixtures, tmp_path):
    pp2 = fixtures / "traces" / "pp2"
    with pytest.raises(CliError, match="a second trace for rank 0"):
        sglang_trace.read_traces(pp2)
    # one profile's files, given as a list, read fine
    t = sglang_trace.read_traces([pp2 / "pp2_burst_c8-rank0.json.gz",
                                  pp2 / "pp2_burst_c8-rank1.json.gz"])
    assert sorted(t.ranks) == ["0", "1"]


def test_malformed_events_are_counted(tmp_path):
    # a well-formed trace with three events HTA/Kineto would never write: a number, a kernel
    # without ts, a runtime call with a non-numeric correlation; the good kernel still counts
    ev = [{"ph": "X", "cat": "kernel", "name": "gemm", "ts": 10.0, "dur": 5.0,
           "args": {"stream": 7, "correlation": 1}},
          3, {"ph": "X", "cat": "kernel", "name": "gemm", "args": {"stream": 7}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 9.0,
           "args": {"correlation": "x"}}]
    (tmp_path / "t-TP-0-PP-0.trace.json").write_text(json.dumps({"traceEvents": ev}))
    r = sglang_trace.read_traces(tmp_path).ranks["0"]
    assert (r.events, r.events_unrecognised, r.gpu_events) == (4, 3, 1)
    assert r.busy_us == 5.0


def test_recorded_pp2_sglang_burst(fixtures):
    """ppscope dispatch --profile traces (2x H200, PP2, C=8 burst: all 8 requests in one slot)."""
    t = sglang_trace.read_traces(fixtures / "traces" / "recorded", link_gbps=300.0).ranks
    r0, r1 = t["0"], t["1"]
    for r in (r0, r1):
        assert r.gpu_events == 4873 and r.graph_launches == 64
        assert (r.graph_kernels, r.eager_kernels) == (4608, 265)  # 72 kernels per graph
        assert r.nccl_recv.kernels == 65
        assert r.busy_us + r.idle_us == pytest.approx(r.span_us)
    # rank 0 receives sampled tokens (8 x int64) back from the last rank; rank 1 hidden states
    # (bf16, 7168 wide): 640 token rows over 65 receives (64 decodes of 8, one larger first)
    assert r0.nccl_recv.bytes == 65 * 8 * 8
    assert r1.nccl_recv.bytes == 640 * 7168 * 2
    # rank 1 is "busy" 83% of the time, but half of its span is a receive waiting for rank 0
    assert r1.busy_frac == pytest.approx(0.8313, abs=1e-4)
    assert r1.compute_us / r1.span_us == pytest.approx(0.3416, abs=1e-4)
    assert r1.nccl_recv.wait_us / r1.span_us == pytest.approx(0.4889, abs=1e-4)
    # forward starts ~8 us after its input lands (GPU view), ~25 us after recv_requests (CPU)
    assert r1.dispatch_latency_us.p50 == pytest.approx(8.03, abs=0.01)
    assert r1.cpu_dispatch_latency_us.n == 65  # one per run_batch, not per empty slot
    assert r1.cpu_dispatch_latency_us.p50 == pytest.approx(24.70, abs=0.01)
    assert r0.cpu_dispatch_latency_us.n == 0   # rank 0 has no recv_requests range here
    assert r1.scheduler_ranges_us["recv_requests"]["count"] == 261
    assert r1.scheduler_ranges_us["run_batch"]["count"] == 65
    assert r1.idle_split_compute_stream_us["stream"] == 7
    split = r1.idle_split_compute_stream_us
    assert split["host_wait_us"] == pytest.approx(342808.85, abs=0.01)  # CPU blocked in recv


def _ev(cat, name, ts, dur, **args):
    gpu = cat in ("kernel", "gpu_memcpy", "cuda_sync")
    return {"ph": "X", "cat": cat, "name": name, "pid": 0 if gpu else 1,
            "tid": args.get("stream", 1) if gpu else 1, "ts": ts, "dur": dur, "args": args}


def _rules_trace(path):
    """Three 1000 us ProfilerSteps, three 50.25 us kernels launched in each (the last step's are
    left out, as HTA does); two kernels whose launch is not in the trace; three sync events:
    Context Sync on stream -1 and on 4294967295 (how some Kineto versions write -1), a Stream
    Sync on stream 7."""
    ev = []
    for k, t0 in enumerate((1000.0, 2000.0, 3000.0)):
        ev.append(_ev("cpu_op", f"ProfilerStep#{k + 1}", t0, 999.0))
        for j in range(3):
            c = 100 * k + j
            ev.append(_ev("cuda_runtime", "cudaLaunchKernel", t0 + 10 + 100 * j, 5.0,
                          correlation=c))
            ev.append(_ev("kernel", "gemm_kernel", t0 + 20.5 + 100 * j, 50.25, stream=7,
                          correlation=c, device=0))
    ev.append(_ev("kernel", "gemm_kernel", 1400.0, 200.0, stream=7, correlation=9001, device=0))
    ev.append(_ev("kernel", "ncclDevKernel_SendRecv", 1700.0, 150.0, stream=20, correlation=9002,
                  device=0))
    for c, (name, ts, dur, stream) in enumerate((("Context Sync", 900.0, 40.0, -1),
                                                  ("Context Sync", 2500.0, 60.0, 4294967295),
                                                  ("Stream Sync", 2700.0, 30.0, 7))):
        ev.append(_ev("cuda_sync", name, ts, dur, stream=stream, correlation=9100 + c, device=0))
        ev.append(_ev("cuda_runtime", "cudaDeviceSynchronize", 2400.0, 5.0, correlation=9100 + c))
    path.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": ev}))
    return path


def test_sync_and_launchless_rules_default_and_hta_compatible(tmp_path):
    _rules_trace(tmp_path / "syn-rank0.json")
    d = sglang_trace.read_traces(tmp_path).ranks["0"]
    # default: syncs are waits (never busy); launch-less kernels are GPU work (kept)
    assert (d.sync_events_excluded, d.sync_excluded_us) == (3, 130.0)
    assert (d.gpu_events_without_launch, d.gpu_events_without_launch_dropped) == (2, 0)
    assert d.gpu_events_last_step_dropped == 3
    assert d.span_us == 2270.75 - 1020.5                 # first to last kept kernel
    assert d.busy_us == 6 * 50.25 + 200.0 + 150.0
    assert (d.compute_us, d.non_compute_us) == (6 * 50.25 + 200.0, 150.0)
    h = sglang_trace.read_traces(tmp_path, hta_compatible=True).ranks["0"]
    # HTA: only the stream -1 sync is left out; the launch-less kernels are dropped (3 steps)
    assert (h.sync_events_excluded, h.gpu_events_without_launch_dropped) == (1, 2)
    assert (h.span_us, h.busy_us, h.idle_us) == (1709.0, 384.0, 1325.0)
    assert (h.compute_us, h.non_compute_us) == (294.0, 90.0)
    assert h.rules["kernels_without_launch"].startswith("as HTA")
    assert "not busy" in d.rules["sync_events"]


def test_hta_compatible_matches_hta_on_the_rules_trace(tmp_path):
    pytest.importorskip("hta.trace_analysis", exc_type=ImportError)
    from hta.trace_analysis import TraceAnalysis
    _rules_trace(tmp_path / "syn-rank0.json")
    logging.disable(logging.WARNING)
    try:
        ref = TraceAnalysis(trace_dir=str(tmp_path)).get_temporal_breakdown(visualize=False)
    finally:
        logging.disable(logging.NOTSET)
    row = ref.set_index("rank").loc[0]
    h = sglang_trace.read_traces(tmp_path, hta_compatible=True).ranks["0"]
    assert (h.span_us, h.idle_us, h.compute_us, h.non_compute_us) == (
        row["kernel_time(us)"], row["idle_time(us)"], row["compute_time(us)"],
        row["non_compute_time(us)"])


@pytest.mark.parametrize("bad,field", [
    ({}, "events_without_dur"),                       # no dur at all
    ({"dur": float("nan")}, "events_bad_time"),
    ({"dur": -5.0}, "events_bad_time"),
    ({"dur": 1e300}, "events_bad_time"),
    ({"dur": 5.0, "ts": float("inf")}, "events_bad_time"),
    ({"dur": 5.0, "ts": -1e30}, "events_bad_time"),
])
def test_events_with_unusable_durations_are_skipped_and_counted(tmp_path, bad, field):
    good = {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 10.0, "dur": 5.0,
            "args": {"stream": 7, "correlation": 1}}
    broken = {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 100.0,
              "args": {"stream": 7, "correlation": 2}, **bad}
    rng = {"ph": "X", "cat": "user_annotation", "name": "run_batch", "ts": 10.0, **bad}
    (tmp_path / "t-rank0.json").write_text(json.dumps({"traceEvents": [good, broken, rng]}))
    r = sglang_trace.read_traces(tmp_path).ranks["0"]
    assert getattr(r, field) == 2 and r.gpu_events == 1
    assert (r.busy_us, r.span_us, r.busy_frac) == (5.0, 5.0, 1.0)
    assert r.warnings and all("\n" not in w for w in r.warnings)
    assert "run_batch" not in r.scheduler_ranges_us


def test_ranks_read_in_worker_processes_give_the_same_record(fixtures):
    d = fixtures / "traces" / "recorded"
    files = [d / f"dispatch-sglang-burst-c8-TP-0-PP-{r}.trace.json.gz" for r in (0, 1)]
    one = sglang_trace.read_traces(files, workers=1)
    two = sglang_trace.read_traces(files, workers=2)
    assert one == two and sorted(two.ranks) == ["0", "1"]


def test_a_merged_trace_alone_says_why_and_the_fix(tmp_path, capsys):
    """sgl-project/sglang#17567: with PP, merge_profiles keeps only rank 0's traces; a
    `merged-*` file without per-rank files is a one-line explanation and the fix."""
    import gzip
    from tests.test_fuzz_bad_inputs import one_line_error, run
    f = tmp_path / "merged-1796164084.5.trace.json.gz"
    f.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    rc, _, err = run(["sglang", "--traces", tmp_path, "--json", tmp_path / "s.json"], capsys)
    one_line_error(rc, err, "#17567", "only rank 0", "without merge_profiles", "-PP-")
