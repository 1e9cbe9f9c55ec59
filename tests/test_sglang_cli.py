"""`ppscope sglang` end to end on the fixtures."""
from __future__ import annotations

import argparse
import json

import pytest

from microbench.sglang import cli as sglang_cli
from reports.base.errors import CliError


def _args(argv):
    p = argparse.ArgumentParser()
    sglang_cli.register(p.add_subparsers())
    return p.parse_args(["sglang", *argv])


def test_wants():
    assert not sglang_cli.wants(_args([]))
    assert sglang_cli.wants(_args(["--bench", "x"]))


def test_run_writes_record(fixtures, tmp_path, capsys):
    f = fixtures / "sglang"
    out = tmp_path / "sglang.json"
    a = _args(["--log", str(f / "pp2_mixed.log"), "--slot-window", "4",
               "--traces", str(fixtures / "traces" / "pp2" / "pp2_burst_c8-rank1.json.gz"),
               "--bench", str(f / "bench.jsonl"), "--metrics", str(f / "metrics.txt"),
               "--link-gbps", "100", "--json", str(out)])
    assert sglang_cli.run(a) == 0
    rec = json.loads(out.read_text())
    d = rec["data"]
    assert rec["probe"] == "sglang" and rec["status"] == "ok"
    assert d["ranks"]["0"]["decode_lines"] == 8 and d["slot_imbalance"]["max_over_mean_median"] == 4.0
    assert [b["concurrency"] for b in d["bench"]] == [1, 7.9, 8, 32]
    assert d["traces"]["ranks"]["1"]["nccl_recv"]["kernels"] == 6
    out = capsys.readouterr().out
    assert "Server log, per PP rank" in out
    bench = out[out.index("bench_serving"):].splitlines()
    assert "max concurrency" in bench[1] and "mean concurrency" in bench[1]
    assert bench[3].split()[:3] == ["1", "1.00", "34.0"]
    assert bench[4].split()[:3] == ["none", "7.90", "81.7"]
    assert bench[5].split()[:3] == ["8", "7.98", "81.7"]  # cap 8, measured mean 7.98


def test_nothing_to_read():
    with pytest.raises(CliError, match="needs at least one"):
        sglang_cli.collect(_args([]))


def test_log_names_the_attention_backend_end_to_end(fixtures, tmp_path, capsys):
    """A log with SGLang's default-backend line: the record keeps it and the printout says it."""
    log = tmp_path / "server.log"
    log.write_text("[2026-11-30 10:00:00 TP0 PP0] Attention backend not specified. Use triton "
                   "backend by default.\n"
                   + (fixtures / "sglang" / "pp2_mixed.log").read_text())
    out = tmp_path / "sglang.json"
    assert sglang_cli.run(_args(["--log", str(log), "--json", str(out)])) == 0
    d = json.loads(out.read_text())["data"]
    assert d["log"]["attention_backend"] == {"backend": "triton", "source": "default"}
    printed = capsys.readouterr().out
    assert "Attention backend [log]: triton (SGLang's default for this model and GPU)." in printed
    assert "python3 -m microbench.stage_cost.sglang_anchor" in printed


def test_readers_return_the_payload_types(fixtures, tmp_path, capsys):
    """The log, trace and loop readers hand back sglang.json's typed parts
    (reports/base/payloads/sglang.py), and `ppscope sglang` writes exactly those: the record
    read back is what the readers returned. On SGLang 0.5.23's own PP2 CPU server (the lab's
    clean-c8 case)."""
    from dataclasses import replace

    from microbench.sglang import log, steps, trace
    from reports.base.payloads.sglang import (LogRank, LogSummary, LoopProfile, LoopRank,
                                              SglangData, TraceRank, Traces)
    from reports.base.records import read_record
    case = fixtures / "sglang_lab" / "clean-c8"
    lg = log.read_logs([case / "server.log"], window=16)
    assert type(lg) is SglangData and type(lg.log) is LogSummary
    assert {type(r) for r in lg.ranks.values()} == {LogRank} and set(lg.ranks) == {"0", "1"}
    assert lg.traces is None and lg.loop is None and lg.bench == ()   # the log's parts only
    tr = trace.read_traces(case / "traces")
    assert type(tr) is Traces and {type(r) for r in tr.ranks.values()} == {TraceRank}
    paths = {int(r): next((case / "traces").glob(f"*-PP-{r}.trace.json.gz")) for r in tr.ranks}
    lp = steps.read_loop(paths, no_gpu_events=True)
    assert type(lp) is LoopProfile and lp.device == "cpu"
    assert {type(r) for r in lp.ranks.values()} == {LoopRank}

    out = tmp_path / "sglang.json"
    assert sglang_cli.run(_args(["--log", str(case / "server.log"), "--traces",
                                 str(case / "traces"), "--concurrency", "8",
                                 "--json", str(out)])) == 0
    sg = read_record(out).payload
    assert sg.ranks == lg.ranks and sg.log == lg.log and sg.traces == tr
    assert replace(sg.loop, concurrency=None, concurrency_from=None, bursts=(),
                   profiler_slowdown=None) == lp
    # #running-req's min and max are whole requests: printed as such, as before the payloads
    # were typed (Dist holds them as floats)
    row = capsys.readouterr().out.split("Server log, per PP rank\n")[1].splitlines()[2]
    assert row.split()[:6] == ["0", "195", "5", "1", "2.00", "6"]
