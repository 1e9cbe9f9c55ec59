"""One bench_serving rule for both ways into the report: `ppscope sglang --bench` (runs kept in
sglang.json, then read by the report) and `ppscope report --bench` give the same observed points
for the same file; an uncapped run is kept in the record but is never a point for a C."""
import json

import pytest

from reports.base.bench_serving import bench_workload, observed_points, read_bench
from reports.base.records import read_record
from reports.cli import main
from reports.model.scenario.inputs import observed_from_sglang


def _bench_file(tmp_path, fixtures):
    # the fixture plus a later C=8 run: the last run per C wins
    f = tmp_path / "bench.jsonl"
    later = {"backend": "sglang", "max_concurrency": 8, "output_token_throughput": 90.0}
    f.write_text((fixtures / "sglang" / "bench.jsonl").read_text() + json.dumps(later) + "\n")
    return f


def test_sglang_and_report_paths_give_same_observed_points(tmp_path, fixtures, capsys):
    f = _bench_file(tmp_path, fixtures)
    rec_path = tmp_path / "res" / "sglang.json"
    assert main(["sglang", "--bench", str(f), "--json", str(rec_path)]) == 0
    rec = read_record(rec_path)
    kept = [b for b in rec.data["bench"] if b["concurrency_from"] == "measured"]
    assert [(b["max_concurrency"], b["mean_concurrency"]) for b in kept] == [(None, 7.9)]
    via_sglang, notes_sglang = observed_from_sglang(rec)

    via_report, notes_report = observed_points(read_bench(f)["runs"], "bench.jsonl")
    assert via_sglang == via_report == {1: 34.0, 8: pytest.approx(85.85), 32: 248.1}
    uncapped = ("bench run without --max-concurrency (mean concurrency 7.9, 81.7 tok/s) not "
                "used as an observed point")
    assert [n.split(": ", 1)[1] for n in notes_report] == \
        [uncapped, "2 runs at C=8 (81.7, 90.0 tok/s); their mean (85.8 tok/s) is the "
         "observed point, their spread its interval"]     # repetitions: their mean, said
    # the report says the repetitions in its "How sure" line, not as a warning
    assert [n.split(": ", 1)[1] for n in notes_sglang] == [uncapped]

    out = tmp_path / "out"
    (tmp_path / "empty").mkdir()
    assert main(["report", "--results", str(tmp_path / "empty"), "--out", str(out),
                 "--bench", str(f)]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert {c["concurrency"]: c["observed"] for c in rep["concurrency"]
            if c["observed"] is not None} == via_report
    assert any("bench.jsonl: bench run without --max-concurrency" in w for w in rep["warnings"])
    assert any("bench.jsonl: 1 line(s) that are not bench_serving runs" in w
               for w in rep["warnings"])


# --------------------------------------------------- SGLang 0.5.23's own --output-file JSONL
# tests/fixtures/sglang_lab/bench_pp2_cpu_c8_out{64,128}.jsonl: written by SGLang 0.5.23's
# bench_serving (`--dataset-name random --random-input-len 64 --random-output-len 64|128
# --random-range-ratio 1 --max-concurrency 8`) against its own PP2 CPU server, trimmed:
# `server_info` cut to the keys read here plus a few others, the model path replaced by a bare
# name; every other key and value as written (`request_rate` is the bare token `Infinity`).
# bench_pp2_cpu_c8_printed.txt: the block 0.5.23 prints for the out64 run (its own format
# strings, that run's numbers).
OUT64, OUT128 = "bench_pp2_cpu_c8_out64.jsonl", "bench_pp2_cpu_c8_out128.jsonl"


def _lab(fixtures, name):
    return fixtures / "sglang_lab" / name


def _real_line(fixtures, name=OUT64) -> dict:
    return json.loads(_lab(fixtures, name).read_text())


def _write_lines(tmp_path, *lines) -> str:
    f = tmp_path / "bench.jsonl"
    f.write_text("".join(json.dumps(d) + "\n" for d in lines))
    return str(f)


def test_real_jsonl_keys_runs_by_the_cap_and_keeps_the_peak(fixtures, tmp_path):
    # the line has max_concurrency 8 (the cap) and max_concurrent_requests 16 (the most
    # requests seen in one 1 s bucket): C is the cap, on every path into the report
    f = _lab(fixtures, OUT64)
    (r,) = read_bench(f)["runs"]
    assert (r["max_concurrency"], r["concurrency"], r["concurrency_from"]) == \
        (8, 8, "max_concurrency")
    assert (r["peak_concurrency"], r["peak_output_throughput"]) == (16, 325.0)
    assert (r["mean_concurrency"], r["request_rate"]) == (7.945570008472251, "inf")
    assert observed_points([r], "b") == ({8: 276.94221137057286}, [])

    rec_path = tmp_path / "sglang.json"
    assert main(["sglang", "--bench", str(f), "--json", str(rec_path)]) == 0
    (b,) = read_record(rec_path).payload.bench
    assert (b.max_concurrency, b.peak_concurrency, b.peak_output_throughput) == (8, 16, 325.0)
    assert observed_from_sglang(read_record(rec_path)) == ({8: 276.94221137057286}, [])
    (tmp_path / "empty").mkdir()
    assert main(["report", "--results", str(tmp_path / "empty"), "--out", str(tmp_path / "o"),
                 "--bench", str(f)]) == 0
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert {c["concurrency"]: c["observed"] for c in rep["concurrency"]
            if c["observed"] is not None} == {8: 276.94221137057286}


def test_uncapped_real_run_stays_uncapped_despite_its_peak(fixtures, tmp_path):
    # the same run without --max-concurrency (bench_serving writes null): its peak of 16 is
    # not a cap, so it is no observed point
    d = _real_line(fixtures) | {"max_concurrency": None}
    (r,) = read_bench(_write_lines(tmp_path, d))["runs"]
    assert (r["max_concurrency"], r["peak_concurrency"]) == (None, 16)
    assert (r["concurrency"], r["concurrency_from"]) == (7.945570008472251, "measured")
    pts, notes = observed_points([r], "b")
    assert pts == {} and len(notes) == 1 and "mean concurrency 7.945570008472251" in notes[0]


def test_printed_block_cap_and_peak(fixtures):
    (r,) = read_bench(_lab(fixtures, "bench_pp2_cpu_c8_printed.txt"))["runs"]
    assert (r["max_concurrency"], r["peak_concurrency"], r["mean_concurrency"]) == (8, 16, 7.95)
    assert (r["output_throughput"], r["peak_output_throughput"]) == (276.94, 325.0)
    # no requested lengths in the block; the served means come from its totals: 2048 / 32
    assert (r["completed"], r["total_input_tokens"], r["total_output_tokens"]) == (32, 2048, 2048)
    assert (r["mean_input_len"], r["mean_output_len"], r["random_output_len"]) == (64.0, 64.0, None)


def test_real_jsonl_request_lengths(fixtures):
    got = [(r["dataset_name"], r["random_input_len"], r["random_output_len"],
            r["random_range_ratio"], r["completed"], r["total_input_tokens"],
            r["total_output_tokens"], r["mean_input_len"], r["mean_output_len"])
           for name in (OUT64, OUT128) for r in read_bench(_lab(fixtures, name))["runs"]]
    assert got == [("random", 64, 64, 1.0, 32, 2048, 2048, 64.0, 64.0),
                   ("random", 64, 128, 1.0, 24, 1536, 3072, 64.0, 128.0)]


def test_random_lengths_only_for_the_datasets_that_read_them(fixtures, tmp_path):
    # bench_serving writes --random-*-len's defaults (1024) for a ShareGPT run too
    d = _real_line(fixtures) | {"dataset_name": "sharegpt", "random_input_len": 1024,
                                "random_output_len": 1024, "random_range_ratio": 0.0}
    ids = _real_line(fixtures) | {"dataset_name": "random-ids", "max_concurrency": 4}
    share, rid = read_bench(_write_lines(tmp_path, d, ids))["runs"][::-1]
    assert (share["random_input_len"], share["random_output_len"],
            share["random_range_ratio"]) == (None, None, None)
    assert (share["mean_input_len"], share["mean_output_len"]) == (64.0, 64.0)
    assert (rid["random_input_len"], rid["random_output_len"]) == (64, 64)


def test_bench_workload_from_real_runs(fixtures, tmp_path):
    w, notes = bench_workload(read_bench(_lab(fixtures, OUT64))["runs"], "b")
    assert (w.prompt_len, w.output_len, w.range_ratio, notes) == (64, 64, 1.0, [])
    assert w.note == ("b, bench_serving runs at C=8: prompt 64 tokens (mean per completed "
                      "request), output 64 tokens (--random-output-len 64, ratio 1)")
    # both files appended: two runs at C=8, the later one is the point and gives the lengths
    both = [_real_line(fixtures), _real_line(fixtures, OUT128)]
    w, _ = bench_workload(read_bench(_write_lines(tmp_path, *both))["runs"], "b")
    assert (w.prompt_len, w.output_len) == (64, 128)
    # at two Cs with different lengths: no one workload, and a note says why
    both[1]["max_concurrency"] = 16
    w, notes = bench_workload(read_bench(_write_lines(tmp_path, *both))["runs"], "b")
    assert w is None and notes == ["b: the bench runs differ in request lengths (C=8: prompt "
                                   "64, output 64 ratio 1; C=16: prompt 64, output 128 ratio 1); "
                                   "no one workload for every C is taken from them"]


def test_bench_workload_mean_against_the_requested_draw(fixtures, tmp_path):
    base = _real_line(fixtures)
    # ratio 1: every output is 64 tokens, yet 1920 / 32 = 60 were served: the mean is used
    short = base | {"total_output_tokens": 1920}
    # ratio 0.5 over [500, 1000]: mean 750, sd of a 100-request mean sqrt((501^2-1)/12/100) =
    # 14.4, so 760 agrees (within 4 sd + 0.5) and the requested draw stands
    spread = base | {"random_output_len": 1000, "random_range_ratio": 0.5, "completed": 100,
                     "total_input_tokens": 6400, "total_output_tokens": 76000}
    got = []
    for d in (short, spread):
        w, _ = bench_workload(read_bench(_write_lines(tmp_path, d))["runs"], "b")
        got.append((w.prompt_len, w.output_len, w.range_ratio))
    assert got == [(64, 60, None), (64, 1000, 0.5)]


def test_server_info_summary(fixtures, tmp_path):
    (r,) = read_bench(_lab(fixtures, OUT64))["runs"]
    # pp_max_micro_batch_size and max_running_requests are null as arguments: the scheduler's
    # resolved 1024 and 2048 (the server log says max_running_requests=2048); 0.5.23 has no
    # cuda_graph_max_bs argument: cuda_graph_config.decode.max_bs
    assert r["server_info"] == {
        "version": "0.5.23", "model": "model-llama-4l", "device": "cpu", "pp_size": 2,
        "tp_size": 1, "dp_size": 1, "pp_async_batch_depth": 0, "pp_max_micro_batch_size": 1024,
        "max_running_requests": 2048, "chunked_prefill_size": 4096, "max_prefill_tokens": 16384,
        "attention_backend": "torch_native", "disable_cuda_graph": True, "cuda_graph_max_bs": 32,
        "resolved": ["pp_max_micro_batch_size", "max_running_requests", "cuda_graph_max_bs"]}
    rec_path = tmp_path / "sglang.json"
    assert main(["sglang", "--bench", str(_lab(fixtures, OUT64)), "--json", str(rec_path)]) == 0
    s = read_record(rec_path).payload.bench[0].server_info
    assert (s.pp_size, s.model, s.resolved) == (2, "model-llama-4l", (
        "pp_max_micro_batch_size", "max_running_requests", "cuda_graph_max_bs"))


def test_server_info_wrong_types_are_none(fixtures, tmp_path):
    d = _real_line(fixtures)
    d["server_info"] = {"pp_size": "2", "tp_size": 0, "disable_cuda_graph": "true",
                        "model_path": "/home/me/models/Llama-3-8B/", "chunked_prefill_size": -1,
                        "cuda_graph_max_bs": 160, "max_running_requests": True, "dp_size": 2,
                        "internal_states": [{"effective_max_running_requests_per_dp": 64}],
                        "version": 5}
    no_info = _real_line(fixtures) | {"server_info": None, "max_concurrency": 4}
    runs = read_bench(_write_lines(tmp_path, d, no_info))["runs"]
    s = runs[1]["server_info"]
    assert (s["pp_size"], s["tp_size"], s["disable_cuda_graph"], s["version"]) == (None,) * 4
    assert (s["model"], s["chunked_prefill_size"], s["cuda_graph_max_bs"]) == \
        ("Llama-3-8B", -1, 160)
    # two DP ranks: one rank's running-request cap is not the server's
    assert (s["max_running_requests"], s["resolved"]) == (None, [])
    assert runs[0]["server_info"] is None
    assert main(["sglang", "--bench", _write_lines(tmp_path, d, no_info),
                 "--json", str(tmp_path / "sglang.json")]) == 0


def test_counts_are_integers_a_zero_cap_is_none(fixtures, tmp_path):
    # sglang.json holds counts as integers and a cap >= 1: 8.0 is 8; --max-concurrency 0 is
    # "not set" (bench_serving prints it so); --use-trace-timestamps writes request_rate "trace"
    line = {k: v for k, v in _real_line(fixtures).items() if k != "max_concurrent_requests"}
    a = line | {"max_concurrency": 8.0, "completed": 32.0}
    b = line | {"max_concurrency": 0, "request_rate": "trace"}
    f = _write_lines(tmp_path, a, b)
    r8, r0 = read_bench(f)["runs"][::-1]
    assert (r8["max_concurrency"], r8["completed"]) == (8, 32)
    assert type(r8["max_concurrency"]) is int and type(r8["completed"]) is int
    assert (r0["max_concurrency"], r0["concurrency_from"], r0["request_rate"]) == \
        (None, "measured", "trace")
    assert main(["sglang", "--bench", f, "--json", str(tmp_path / "sglang.json")]) == 0
    assert [b.max_concurrency for b in read_record(tmp_path / "sglang.json").payload.bench] == \
        [None, 8]   # sorted by C: the uncapped run by its measured mean, 7.95
