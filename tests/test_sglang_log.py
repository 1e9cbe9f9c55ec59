"""SGLang server-log reader on fixtures re-created from SGLang's format strings (see the comment
at the top of tests/fixtures/sglang/pp2_mixed.log and the README there)."""
from __future__ import annotations

import math

import pytest

from microbench.sglang import log as sglang_log
from reports.base.errors import CliError


def test_mixed_ranks_one_file(fixtures):
    s = sglang_log.read_logs([fixtures / "sglang" / "pp2_mixed.log"], window=4)
    assert s["lines_total"] == 23
    assert s["lines_other"] == 4          # 3 comment lines + 1 HTTP access line
    assert s["lines_unrecognised"] == 1   # the line cut mid-way
    assert set(s["ranks"]) == {"0", "1"}
    r0, r1 = s["ranks"]["0"], s["ranks"]["1"]
    assert (r0["decode_lines"], r0["prefill_lines"]) == (8, 1)
    assert (r1["decode_lines"], r1["prefill_lines"]) == (8, 1)
    assert r0["running_req"] == {"min": 0, "median": 0.0, "max": 8}
    assert r0["cuda_graph_frac"] == 0.75
    assert r1["cuda_graph_frac"] == 1.0
    assert r0["queue_req"]["max"] == 2
    assert r0["gen_throughput_tok_s"] == {"min": 100.0, "median": 135.0, "max": 170.0}
    assert r0["span_s"] == pytest.approx(61.5 - 50.12)
    si = r0["slot_imbalance"]
    assert si["windows"] == 2 and si["max_over_mean_median"] == 4.0
    assert si["cv"] == pytest.approx(math.sqrt(3))
    assert s["slot_imbalance"]["rank"] == 0
    # 10 s bins from the first decode line: 7 lines at t < 10 s, 1 after
    ot = r0["over_time"]
    assert [b["lines"] for b in ot] == [7, 1]
    assert ot[0]["gen_throughput_tok_s"] == pytest.approx(130.0)


def test_old_layout_one_file_per_rank_with_gzip(fixtures):
    d = fixtures / "sglang"
    s = sglang_log.read_logs([d / "old_rank0.log", d / "old_rank1.log.gz"], window=4)
    assert s["lines_unrecognised"] == 0
    assert s["ranks"]["0"]["running_req"] == {"min": 4, "median": 4.0, "max": 4}
    assert s["ranks"]["1"]["running_req"] == {"min": 2, "median": 4.0, "max": 6}
    assert s["ranks"]["1"]["cuda_graph_frac"] == 0.5
    assert s["ranks"]["0"]["slot_imbalance"]["max_over_mean_median"] == 1.0
    assert s["ranks"]["1"]["slot_imbalance"]["max_over_mean_median"] == 1.5
    assert s["ranks"]["1"]["slot_imbalance"]["cv"] == pytest.approx(0.5)


def test_tp_ranks_not_double_counted(fixtures):
    s = sglang_log.read_logs([fixtures / "sglang" / "tp2_pp2.log"])
    assert s["lines_other_tp"] == 8
    assert s["ranks"]["0"]["decode_lines"] == 4
    assert s["ranks"]["1"]["running_req"]["median"] == 5
    assert s["ranks"]["1"]["dp_ranks"] == [0]


@pytest.mark.parametrize("line,kind,pp,it", [
    ("[2026-01-02 03:04:05.678 DP1 TP0 EP0 PP3] Decode batch, #running-req: 3, #token: 9, "
     "token usage: 0.00, cpu graph: False, gen throughput (token/s): 1.50, #queue-req: 0, ",
     "Decode", 3, None),
    ("[2026-01-02 03:04:05 PP7 TP1] Prefill batch [12], #new-seq: 1, #new-token: 158, "
     "#cached-token: 0, token usage: 0.08, #running-req: 31, #queue-req: 0, cuda graph: True, "
     "input throughput (token/s): 559.53", "Prefill", 7, 12),
])
def test_parse_line_variants(line, kind, pp, it):
    bl = sglang_log.parse_line(line)
    assert bl.kind == kind and bl.pp == pp and bl.iteration == it


def test_unrecognised_and_other():
    assert sglang_log.parse_line("[2026-01-02 03:04:05] Decode batch, #running-req") == "bad"
    assert sglang_log.parse_line("[2026-01-02 03:04:05] Load weight end.") is None


def test_truncated_gzip_and_empty(fixtures):
    with pytest.raises(CliError, match="truncated or corrupt gzip"):
        sglang_log.read_logs([fixtures / "sglang" / "truncated.log.gz"])
    with pytest.raises(CliError, match="empty log file"):
        sglang_log.read_logs([fixtures / "sglang" / "empty.log"])
    with pytest.raises(CliError, match="cannot read log"):
        sglang_log.read_logs([fixtures / "sglang" / "nope.log"])


def test_no_batch_lines(fixtures, tmp_path):
    (tmp_path / "access.log").write_text('INFO:     127.0.0.1:5 - "GET /health HTTP/1.1" 200 OK\n')
    with pytest.raises(CliError, match="no 'Decode batch' / 'Prefill batch' lines in 1 lines"):
        sglang_log.read_logs([tmp_path / "access.log"])
    s = sglang_log.read_logs([fixtures / "sglang" / "old_rank0.log", tmp_path / "access.log"])
    assert s["files_without_batch_lines"] == [str(tmp_path / "access.log")]
    assert s["lines_other"] == 1


def test_startup_line_gives_the_server_settings(tmp_path):
    # SGLang 0.5.23 managers/scheduler.py logs this once per rank at start-up (numbers ours)
    log = tmp_path / "server.log"
    log.write_text(
        "[2026-11-30 10:00:00 PP0] max_total_num_tokens=683105, chunked_prefill_size=8192, "
        "max_prefill_tokens=16384, max_running_requests=2048, context_len=262144, "
        "available_gpu_mem=7.21 GB\n"
        "[2026-11-30 10:00:05 PP0] Decode batch, #running-req: 8, #token: 8000, token usage: "
        "0.01, cuda graph: True, gen throughput (token/s): 80.00, #queue-req: 0, \n")
    from microbench.sglang.log import read_logs
    s = read_logs([log])["server_settings"]
    assert s == {"max_total_num_tokens": 683105, "chunked_prefill_size": 8192,
                 "max_prefill_tokens": 16384, "max_running_requests": 2048,
                 "context_len": 262144}


def test_report_takes_max_running_requests_from_the_log():
    from reports.base.records import make_record
    from reports.model.scenario import build_inputs, load_scenario
    rec = make_record("sglang", {"log": {"server_settings": {
        "max_running_requests": 48, "chunked_prefill_size": 4096}}}, argv=[])
    inp = build_inputs(load_scenario("seed-pp8"), {"sglang": rec})
    assert inp.max_running_requests == 48 and inp.max_micro_batch == 6
    assert inp.chunked_prefill_size == 4096
    assert inp.src("max_running_requests") == ("observed", "sglang.json")
