"""bench_serving results (JSONL of several versions, printed block) and Prometheus /metrics."""
from __future__ import annotations

import pytest

from reports.base import bench_serving as sglang_bench
from microbench.sglang import metrics as sglang_metrics
from reports.base.errors import CliError


def test_bench_jsonl_any_version(fixtures):
    b = sglang_bench.read_bench(fixtures / "sglang" / "bench.jsonl")
    assert b["source"] == "jsonl" and b["lines_unrecognised"] == 1
    # keyed by the cap (--max-concurrency); the uncapped run falls back to its measured mean
    assert [r["concurrency"] for r in b["runs"]] == [1, 7.9, 8, 32]
    assert [r["mean_concurrency"] for r in b["runs"]] == [1.0, 7.9, 7.98, 31.2]
    assert [r["concurrency_from"] for r in b["runs"]] == ["max_concurrency", "measured",
                                                          "max_concurrency", "max_concurrency"]
    c32 = b["runs"][-1]
    assert (c32["output_throughput"], c32["mean_tpot_ms"], c32["median_itl_ms"]) == (248.1, 120.2, 110.0)
    old = b["runs"][1]  # older keys: output_token_throughput, max_concurrency null (uncapped)
    assert old["max_concurrency"] is None
    assert old["output_throughput"] == 81.7 and old["completed"] == 8 and old["duration"] == 12.0


def test_bench_printed_block(fixtures):
    b = sglang_bench.read_bench(fixtures / "sglang" / "bench_printed.txt")
    assert b["source"] == "printed" and len(b["runs"]) == 1
    r = b["runs"][0]
    assert (r["concurrency"], r["max_concurrency"], r["mean_concurrency"]) == (8, 8, 7.98)
    assert r["output_throughput"] == 81.7
    assert (r["mean_ttft_ms"], r["median_tpot_ms"], r["p99_itl_ms"]) == (310.4, 96.5, 310.75)
    assert r["request_rate"] == float("inf") or r["request_rate"] == "inf"


def test_bench_printed_cap_above_block(fixtures):
    b = sglang_bench.read_bench(fixtures / "sglang" / "bench_printed_old.txt")
    assert b["source"] == "printed"
    assert [(r["concurrency"], r["mean_concurrency"]) for r in b["runs"]] == [(1, None), (32, None)]
    assert [r["total_throughput"] for r in b["runs"]] == [170.0, 3421.7]
    assert [r["output_throughput"] for r in b["runs"]] == [34.0, 248.1]
    assert b["runs"][1]["p99_itl_ms"] == 300.0


def test_bench_errors(tmp_path, refused):
    refused(sglang_bench.read_bench, tmp_path / "e.txt", "", "empty")
    refused(sglang_bench.read_bench, tmp_path / "x.txt", "hello\n", "no bench_serving results")


def test_metrics_per_rank(fixtures):
    m = sglang_metrics.read_metrics(str(fixtures / "sglang" / "metrics.txt"))
    r0, r1 = m["ranks"]["0"], m["ranks"]["1"]
    assert r0["num_running_reqs"] == 8.0 and r1["num_running_reqs"] == 2.0
    assert r0["cuda_graph_passes_total{mode=decode}"] == 900.0
    assert r1["scheduler_stage_seconds_total{category=idle}"] == 12.5
    itl = r0["inter_token_latency_seconds"]
    assert itl["count"] == 100.0 and itl["mean"] == pytest.approx(0.095)
    assert itl["p50"] == pytest.approx(0.05 + 0.05 * 50 / 80)   # inside the (0.05, 0.1] bucket
    assert itl["p99"] == pytest.approx(0.1 + 0.1 * 19 / 20)
    assert m["lines_other"] == 1


def test_metrics_histogram_summed_over_series():
    # One PP rank, two TP ranks' series of the same histogram (SGLang's collector labels each
    # series with tp_rank and pp_rank): the quantile is over their sum by `le`, as Prometheus's
    # histogram_quantile(sum by (le) ...) gives.
    lines = []
    for tp, counts in (("0", (10, 10, 10)), ("1", (0, 10, 10))):
        for le, c in zip(("0.1", "0.2", "+Inf"), counts):
            lines.append(f'sglang:inter_token_latency_seconds_bucket{{le="{le}",pp_rank="0",'
                         f'tp_rank="{tp}"}} {c}')
        lines.append(f'sglang:inter_token_latency_seconds_count{{pp_rank="0",tp_rank="{tp}"}} 10')
    itl = sglang_metrics.parse_metrics("\n".join(lines))["ranks"]["0"]["inter_token_latency_seconds"]
    assert itl["count"] == 20.0
    assert itl["p50"] == pytest.approx(0.1)                   # 10 of 20 at or below 0.1
    assert itl["p99"] == pytest.approx(0.1 + 0.1 * 9.8 / 10)  # inside the (0.1, 0.2] bucket


def test_metrics_unreachable():
    with pytest.raises(CliError, match="cannot read metrics"):
        sglang_metrics.read_metrics("http://127.0.0.1:9/metrics")


def test_metrics_bad_bounds_and_values_are_counted_not_fatal():
    lines = ['sglang:inter_token_latency_seconds_bucket{le="abc",pp_rank="0"} 5',
             'sglang:inter_token_latency_seconds_bucket{le="0.1",pp_rank="0"} 5',
             'sglang:inter_token_latency_seconds_bucket{le="+Inf",pp_rank="0"} 10',
             'sglang:inter_token_latency_seconds_count{pp_rank="0"} 10',
             'sglang:num_running_reqs{pp_rank="0"} NaN',
             'sglang:gen_throughput{pp_rank="0"} -3',
             'sglang:num_queue_reqs{pp_rank="0"} 2']
    m = sglang_metrics.parse_metrics("\n".join(lines))
    r = m["ranks"]["0"]
    assert m["lines_other"] == 3 and r["num_queue_reqs"] == 2.0
    assert "num_running_reqs" not in r and "gen_throughput" not in r
    assert r["inter_token_latency_seconds"]["p50"] == pytest.approx(0.1)


def test_bench_jsonl_mixed_types_are_none_or_unrecognised(tmp_path):
    (tmp_path / "b.jsonl").write_text("\n".join([
        '{"output_throughput": "fast", "max_concurrency": 8}',          # no number: not a run
        '{"output_throughput": 100.5, "max_concurrency": [8], "mean_ttft_ms": "x", '
        '"duration": NaN, "completed": true, "backend": 7, "median_itl_ms": -4}',
        '{"output_throughput": "250", "max_concurrency": "16", "concurrency": 15.5}',
        '[1, 2, 3]', '{"output_throughput": 1e999}']))
    b = sglang_bench.read_bench(tmp_path / "b.jsonl")
    # the list is no run at all; the two runs without a throughput are left out, each said
    assert b["lines_unrecognised"] == 1 and len(b["runs"]) == 2
    left_out = [n for n in b["notes"] if "is not a throughput" in n]
    assert len(left_out) == 2 and "run 1 (C=8)" in left_out[0] and "inf" in left_out[1]
    r1, r2 = b["runs"]   # sorted: the run with no usable cap is keyed by nothing, last
    assert (r1["output_throughput"], r1["concurrency"], r1["mean_concurrency"]) == (250, 16, 15.5)
    assert r2["output_throughput"] == 100.5 and r2["concurrency"] is None
    assert [r2[k] for k in ("max_concurrency", "mean_ttft_ms", "duration", "completed",
                            "backend", "median_itl_ms")] == [None] * 6


@pytest.mark.parametrize("reader", [sglang_bench.read_bench, sglang_metrics.read_metrics])
def test_bench_and_metrics_files_that_are_not_files(tmp_path, reader):
    for src, words in (("/dev/zero", "a character device"), (str(tmp_path), "a directory"),
                       (str(tmp_path / "bin"), "binary data")):
        (tmp_path / "bin").write_bytes(b"\x00\x01\x02" * 10)
        with pytest.raises(CliError) as e:
            reader(src)
        assert words in str(e.value) and "\n" not in str(e.value)
