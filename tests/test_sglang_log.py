"""SGLang server-log reader on fixtures re-created from SGLang's format strings (see the comment
at the top of tests/fixtures/sglang/pp2_mixed.log and the README there)."""
from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np
import pytest

from microbench.sglang import log as sglang_log
from microbench.sglang import log_scan, log_startup   # the reader's parts (patched below)
from reports.base.errors import CliError
from reports.base.payloads.sglang import Dist, SlotImbalance
from reports.base.schema import to_json


def test_mixed_ranks_one_file(fixtures):
    s = sglang_log.read_logs([fixtures / "sglang" / "pp2_mixed.log"], window=4)
    assert s.log.lines_total == 23
    assert s.log.lines_other == 4          # 3 comment lines + 1 HTTP access line
    assert s.log.lines_unrecognised == 1   # the line cut mid-way
    assert set(s.ranks) == {"0", "1"}
    r0, r1 = s.ranks["0"], s.ranks["1"]
    assert (r0.decode_lines, r0.prefill_lines) == (8, 1)
    assert (r1.decode_lines, r1.prefill_lines) == (8, 1)
    assert r0.running_req == Dist(0, 0.0, 8)
    assert r0.cuda_graph_frac == 0.75
    assert r1.cuda_graph_frac == 1.0
    assert r0.queue_req.max == 2
    assert r0.gen_throughput_tok_s == Dist(100.0, 135.0, 170.0)
    assert r0.span_s == pytest.approx(61.5 - 50.12)
    si = r0.slot_imbalance
    assert si.windows == 2 and si.max_over_mean_median == 4.0
    assert si.cv == pytest.approx(math.sqrt(3))
    assert s.slot_imbalance.rank == 0
    # 10 s bins from the first decode line: 7 lines at t < 10 s, 1 after
    ot = r0.over_time
    assert [b["lines"] for b in ot] == [7, 1]
    assert ot[0]["gen_throughput_tok_s"] == pytest.approx(130.0)


def test_old_layout_one_file_per_rank_with_gzip(fixtures):
    d = fixtures / "sglang"
    s = sglang_log.read_logs([d / "old_rank0.log", d / "old_rank1.log.gz"], window=4)
    assert s.log.lines_unrecognised == 0
    assert s.ranks["0"].running_req == Dist(4, 4.0, 4)
    assert s.ranks["1"].running_req == Dist(2, 4.0, 6)
    assert s.ranks["1"].cuda_graph_frac == 0.5
    assert s.ranks["0"].slot_imbalance.max_over_mean_median == 1.0
    assert s.ranks["1"].slot_imbalance.max_over_mean_median == 1.5
    assert s.ranks["1"].slot_imbalance.cv == pytest.approx(0.5)


def test_tp_ranks_not_double_counted(fixtures):
    s = sglang_log.read_logs([fixtures / "sglang" / "tp2_pp2.log"])
    assert s.log.lines_other_tp == 8
    assert s.ranks["0"].decode_lines == 4
    assert s.ranks["1"].running_req.median == 5
    assert s.ranks["1"].dp_ranks == (0,)


@pytest.mark.parametrize("line,kind,pp,it", [
    ("[2026-01-02 03:04:05.678 DP1 TP0 EP0 PP3] Decode batch, #running-req: 3, #token: 9, "
     "token usage: 0.00, cpu graph: False, gen throughput (token/s): 1.50, #queue-req: 0, ",
     "Decode", 3, None),
    ("[2025-02-27 04:46:39 PP1 TP0] Decode batch. #running-req: 8, #token: 62531, token usage: "
     "0.12, gen throughput (token/s): 186.64, #queue-req: 0", "Decode", 1, None),
    ("(SchedulerActor pid=88) [2025-06-01 10:00:00 DP2 ATTN_CP1 TP5] Prefill batch. #new-seq: 1, "
     "#new-token: 6, #cached-token: 0, token usage: 0.00, #unbootstrapped-req: 0, #queue-req: 0, "
     "#transferring-req: 0, ", "Prefill", None, None),
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
    assert s.log.files_without_batch_lines == (str(tmp_path / "access.log"),)
    assert s.log.lines_other == 1


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
    s = read_logs([log]).log.server_settings
    assert s == {"max_total_num_tokens": 683105, "chunked_prefill_size": 8192,
                 "max_prefill_tokens": 16384, "max_running_requests": 2048,
                 "context_len": 262144}


def test_report_takes_max_running_requests_from_the_log():
    from reports.base.records import make_record
    from reports.model.scenario.inputs import build_inputs, load_scenario
    rec = make_record("sglang", {"log": {"server_settings": {
        "max_running_requests": 48, "chunked_prefill_size": 4096}}}, argv=[])
    inp = build_inputs(load_scenario("seed-pp8"), {"sglang": rec})
    assert inp.max_running_requests == 48 and inp.max_micro_batch == 6
    assert inp.chunked_prefill_size == 4096
    assert inp.src("max_running_requests") == ("observed", "sglang.json")


def test_early_2025_period_trailing_comma_and_fields_after_gen(fixtures):
    # "Decode batch." (0.4.3), trailing ", ", largest-len between gen throughput and #queue-req
    s = sglang_log.read_logs([fixtures / "sglang" / "early2025_period_commas.log"], window=2)
    assert (s.log.lines_total, s.log.lines_unrecognised, s.log.lines_other) == (15, 0, 5)
    assert s.log.lines_other_tp == 5 and s.log.lines_batch == 5   # TP1 repeats TP0's batches
    r = s.ranks["0"]
    assert (r.decode_lines, r.prefill_lines, r.prefill_new_tokens) == (4, 1, 2048)
    assert r.running_req == Dist(8, 231.0, 509)
    assert r.gen_throughput_tok_s == Dist(100.0, 250.0, 400.0)
    assert r.queue_req.max == 3 and r.span_s == 16.0
    assert r.cuda_graph_frac == 0.0   # only the last line logs the field (False)


def test_dp_attention_every_dp_rank_is_its_own_batch(fixtures):
    # TP8 / DP8 with DP attention: 8 schedulers, each logs its own batch; all are counted
    s = sglang_log.read_logs([fixtures / "sglang" / "dp_attention_tp8_dp8.log"], window=2)
    assert s.log.lines_other_tp == 0 and s.log.lines_batch == 40
    r = s.ranks["0"]
    assert r.dp_ranks == tuple(range(8))
    assert (r.decode_lines, r.prefill_lines) == (32, 8)
    assert r.running_req == Dist(1, 4.5, 8)
    assert r.cuda_graph_frac == 31 / 32
    assert r.prefill_new_tokens == 100 * sum(range(1, 9))
    # windows never mix two DP ranks: each scheduler's slots are all the same size here
    assert r.slot_imbalance == SlotImbalance(window=2, windows=16, max_over_mean_median=1.0,
                                             cv=0.0)
    d7 = r.by_dp["7"]
    assert (d7.decode_lines, d7.running_req.median) == (4, 8.0)
    assert d7.cuda_graph_frac == 0.75
    assert s.slot_imbalance.rank == 0 and s.slot_imbalance.dp == 0


def test_attention_cp_npu_and_disaggregated_prefill(fixtures):
    s = sglang_log.read_logs([fixtures / "sglang" / "attn_cp_npu_prefill.log"])
    assert s.log.lines_unrecognised == 0 and s.log.lines_other == 6
    assert s.log.lines_other_tp == 5      # the ATTN_CP1 TP1 lines repeat ATTN_CP0 TP0's
    r0, r1 = s.ranks["0"], s.ranks["1"]
    # PP0 is a disaggregated prefill server: no #running-req in its prefill lines
    assert (r0.prefill_lines, r0.prefill_new_tokens, r0.decode_lines) == (3, 24576, 0)
    assert r0.running_req.median is None and r0.span_s == 2.0
    assert (r1.prefill_lines, r1.decode_lines, r1.cuda_graph_frac) == (2, 1, 0.0)
    assert r1.span_s == 239.0


def test_custom_logging_format_without_sglang_prefix(fixtures):
    d = fixtures / "sglang"
    s = sglang_log.read_logs([d / "custom_format_rank0.log", d / "custom_format_rank1.log"],
                             window=2)
    assert (s.log.lines_total, s.log.lines_unrecognised) == (13, 1)   # the cut WARNING line
    r0, r1 = s.ranks["0"], s.ranks["1"]   # no PP tags: the file's index is its rank
    assert (r0.decode_lines, r0.prefill_lines, r0.span_s) == (3, 1, None)
    assert r0.over_time == () and r0.running_req == Dist(2, 4.0, 6)
    # asctime with a comma before the milliseconds; the reordered line is read field by field
    assert r1.span_s == 2.5 and r1.running_req == Dist(3, 4.0, 5)
    assert r1.cuda_graph_frac == 0.5


def test_dateless_clock_wraps_past_midnight(fixtures):
    s = sglang_log.read_logs([fixtures / "sglang" / "dateless_2024_midnight.log"], window=2)
    r = s.ranks["0"]
    assert r.decode_lines == 4 and r.span_s == 4.0 and s.log.lines_unrecognised == 0
    assert [b["lines"] for b in r.over_time] == [4]


def _all_fixture_logs(fixtures):
    d = fixtures / "sglang"
    return [[d / "pp2_mixed.log"], [d / "tp2_pp2.log"], [d / "early2025_period_commas.log"],
            [d / "dp_attention_tp8_dp8.log"], [d / "attn_cp_npu_prefill.log"],
            [d / "custom_format_rank0.log", d / "custom_format_rank1.log"],
            [d / "dateless_2024_midnight.log"], [d / "old_rank0.log", d / "old_rank1.log.gz"],
            [fixtures / "sglang_lab" / "log_pp2_cpu.log"]]


def test_fast_and_line_by_line_reads_agree(fixtures, monkeypatch):
    # the block-wide fast read and the field-by-field read of each line give the same record
    fast = [sglang_log.read_logs(f, window=2) for f in _all_fixture_logs(fixtures)]
    monkeypatch.setattr(log_scan, "_DEC_SIZE", re.compile(rb"(x)never"))
    monkeypatch.setattr(log_scan, "_PRE_FAST", re.compile(rb"(x)never"))
    monkeypatch.setattr(log_scan, "_fast_prefix", lambda lines: (   # every prefix per line
        np.full(len(lines), np.nan), np.zeros(len(lines), dtype=np.int64), [None],
        np.zeros(len(lines), dtype=bool)))
    slow = [sglang_log.read_logs(f, window=2) for f in _all_fixture_logs(fixtures)]
    assert fast == slow


def test_small_blocks_and_worker_processes_give_the_same_answer(fixtures, monkeypatch, tmp_path):
    big = tmp_path / "big.log"
    with open(big, "wb") as out:
        for _ in range(30):
            for f in ("pp2_mixed.log", "tp2_pp2.log", "dp_attention_tp8_dp8.log"):
                out.write((fixtures / "sglang" / f).read_bytes())
    one = sglang_log.read_logs([big], workers=1)
    monkeypatch.setattr(log_scan, "CHUNK_BYTES", 4099)   # blocks cut mid-line, many of them
    monkeypatch.setattr(log_scan, "RANGE_BYTES", 4099)
    assert sglang_log.read_logs([big], workers=1) == one
    assert sglang_log.read_logs([big], workers=2) == one


@pytest.mark.parametrize("make,words", [
    (lambda p: "/dev/zero", "/dev/zero: a character device, not a log file"),
    (lambda p: str(p), ": a directory, not a log file"),
    (lambda p: (p / "bin.log").write_bytes(bytes(range(256)) * 64) and p / "bin.log",
     "binary data, not a text log"),
    (lambda p: (p / "long.log").write_bytes(b"Decode batch, " * 100_000) and p / "long.log",
     "line 1 is longer than 1 MB"),
])
def test_unreadable_inputs_are_one_line_errors(tmp_path, make, words):
    with pytest.raises(CliError) as e:
        sglang_log.read_logs([make(tmp_path)])
    assert words in str(e.value) and "\n" not in str(e.value)


# -- which MoE kernel the server runs (start-up lines of SGLang 0.5.23: the scheme chosen in
# layers/quantization/compressed_tensors/compressed_tensors.py, the Triton config lookup in
# layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py; paths and times ours)

_DECODE = ("[2026-11-30 10:00:05 TP0 PP0] Decode batch, #running-req: 8, #token: 8000, token "
           "usage: 0.01, cuda graph: True, gen throughput (token/s): 80.00, #queue-req: 0, \n")
_CFG = ("/usr/lib/python3.12/site-packages/sglang/srt/layers/moe/moe_runner/triton_utils/configs/"
        "triton_3_5_1/E=384,N=256,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition,"
        "dtype=int4_w4a16.json")


@pytest.mark.parametrize("lines,want", [
    (["Using CompressedTensorsWNA16MarlinMoEMethod"],
     {"scheme": "CompressedTensorsWNA16MarlinMoEMethod", "kernel": "marlin"}),
    (["Using CompressedTensorsWNA16TritonMoE (moe_runner_backend=triton)",
      f"Using default MoE kernel config. Performance might be sub-optimal! Config file not found "
      f"at {_CFG}, you can create them with https://github.com/sgl-project/sglang/tree/main/"
      f"benchmark/kernels/fused_moe_triton"],
     {"scheme": "CompressedTensorsWNA16TritonMoE", "kernel": "triton",
      "reason": "moe_runner_backend=triton", "triton_config": "default", "config_file": _CFG}),
    ([f"Using MoE kernel config from {_CFG}."], {"triton_config": "tuned", "config_file": _CFG}),
    ([f"Config file not found at /x/triton_3_6_0/E=384.json. Fallback to triton version 3.5.1 "
      f"and use MoE kernel config from {_CFG}. Performance might be sub-optimal!"],
     {"triton_config": "fallback", "config_file": _CFG}),
    (["Using CompressedTensorsW8A8Fp8MoE", "Load weight end. type=DeepseekV3ForCausalLM"],
     {"scheme": "CompressedTensorsW8A8Fp8MoE", "kernel": "other"}),
    (["Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16"], {}),
    # scheme names end in MoE / MoEMethod; other "Using Mo..." lines name no kernel
    (["Using MoE LoRA GEMM config from /x/lora.json.", "Using MoeRunner backend triton"], {}),
])
def test_startup_lines_name_the_moe_kernel(tmp_path, lines, want):
    log = tmp_path / "server.log"
    log.write_text("".join(f"[2026-11-30 10:00:0{i} TP0 PP0] {ln}\n" for i, ln in enumerate(lines))
                   + _DECODE)
    assert sglang_log.read_logs([log]).log.moe_kernel == want


def test_moe_kernel_read_only_at_start_up_and_across_block_edges(tmp_path, monkeypatch):
    monkeypatch.setattr(log_scan, "CHUNK_BYTES", 64)
    monkeypatch.setattr(log_startup, "SETTINGS_BYTES", 4096)
    line = "[2026-11-30 11:00:00 TP0 PP0] Using CompressedTensorsWNA16MarlinMoEMethod\n"
    log = tmp_path / "server.log"
    log.write_text("x" * 50 + "\n" + line + _DECODE)       # the line spans two 64-byte blocks
    assert sglang_log.startup_moe_kernel([log])["kernel"] == "marlin"
    log.write_text(_DECODE * (4096 // len(_DECODE) + 2) + line)   # past the start-up window
    assert sglang_log.startup_moe_kernel([log]) == {}


# -- which attention backend decodes (SGLang 0.5.23: srt/arg_groups/overrides.py logs the
# default it picks; srt/entrypoints/engine.py logs the resolved arguments as a dict, older
# releases as ServerArgs(...); the argument lists are cut short here, the neighbours that share
# the word are kept)

_ARGS_DICT = ("server_args={'model_path': '/models/Kimi-K2', 'tp_size': 1, 'pp_size': 8, "
              "'attention_backend': 'triton', 'decode_attention_backend': None, "
              "'prefill_attention_backend': None, 'sampling_backend': 'flashinfer', "
              "'mm_attention_backend': None, 'speculative_draft_attention_backend': None}")
_ARGS_OLD = ("server_args=ServerArgs(model_path='/models/DeepSeek-V3', tp_size=8, "
             "attention_backend='flashinfer', decode_attention_backend='fa3', "
             "prefill_attention_backend=None, mm_attention_backend='fa3')")


@pytest.mark.parametrize("lines,want", [
    (["Attention backend not specified. Use triton backend by default."],
     {"backend": "triton", "source": "default"}),
    ([_ARGS_DICT, "Attention backend not specified. Use triton backend by default."],
     {"backend": "triton", "source": "--attention-backend"}),
    ([_ARGS_OLD], {"backend": "fa3", "source": "--decode-attention-backend"}),
    # the multimodal and draft backends are other models' attention: not read
    (["server_args={'mm_attention_backend': 'fa3', 'speculative_draft_attention_backend': "
      "'triton', 'nsa_decode_backend': 'flashmla_kv'}"], {}),
    # a backend word outside the argument line names nothing
    (["Using attention_backend='fa3' for the draft worker"], {}),
    ([], {}),
])
def test_startup_lines_name_the_attention_backend(tmp_path, lines, want):
    log = tmp_path / "server.log"
    log.write_text("".join(f"[2026-11-30 10:00:0{i}] {ln}\n" for i, ln in enumerate(lines))
                   + _DECODE)
    assert sglang_log.read_logs([log]).log.attention_backend == want
    assert sglang_log.startup_attention_backend([log]) == want


def test_attention_backend_of_the_first_file_that_names_one(tmp_path):
    a, b = tmp_path / "r0.log", tmp_path / "r1.log"
    a.write_text(_DECODE)
    b.write_text(f"[2026-11-30 10:00:00] {_ARGS_DICT}\n" + _DECODE)
    assert sglang_log.startup_attention_backend([a, b]) == {
        "backend": "triton", "source": "--attention-backend"}


# -- SGLang 0.5.23's own server, PP2 on CPU, recorded by the ppscope lab (`--pp-size 2 --device
# cpu --disable-cuda-graph --decode-log-interval 1 --attention-backend torch_native`, bursts of 8
# requests from bench_serving). tests/fixtures/sglang_lab/log_pp2_cpu.log keeps four stretches
# of that log byte for byte (start-up through the first burst, a burst admitted as 1 + 4 + 3, a
# profiled burst admitted as 1 + 6 + 2, shutdown): the `[date time PPn]` tags, `cpu graph:` in
# the batch lines, the server_args dict, the ANSI-coloured deprecation warning, USDT and Python
# warning lines without a prefix. Only machine paths were replaced (the model directory by
# `model-llama-4l`, the virtualenv's by `site-packages/`, the trace directory by `traces`).

import calendar  # noqa: E402


def _lab(fixtures):
    return fixtures / "sglang_lab" / "log_pp2_cpu.log"


def _epoch(clock: str) -> float:
    return float(calendar.timegm(tuple(int(x) for x in re.split("[- :]", clock))))


def test_lab_cpu_graph_lines_read_like_cuda_graph(fixtures, tmp_path):
    s = sglang_log.read_logs([_lab(fixtures)], window=2)
    assert (s.log.lines_total, s.log.lines_batch, s.log.lines_unrecognised) == (345, 190, 0)
    r0, r1 = s.ranks["0"], s.ranks["1"]
    assert (r0.decode_lines, r0.prefill_lines) == (86, 10)
    assert (r1.decode_lines, r1.prefill_lines) == (84, 10)
    # every decode line says `cpu graph: False`: none on the graph path, and the label is kept
    assert r0.cuda_graph_frac == 0.0 and r1.cuda_graph_frac == 0.0
    assert r0.graph_device == "cpu" and r1.graph_device == "cpu"
    # the same log with SGLang's CUDA label reads the same, but for the label
    cuda = tmp_path / "cuda.log"
    cuda.write_text(_lab(fixtures).read_text().replace("cpu graph:", "cuda graph:"))
    c = sglang_log.read_logs([cuda], window=2)
    for r in ("0", "1"):
        assert c.ranks[r].graph_device == "cuda"
        assert replace(c.ranks[r], graph_device="cpu") == s.ranks[r]


@pytest.mark.parametrize("labels,frac,device", [
    (["cpu graph: True", "cpu graph: False", "cpu graph: True", "cpu graph: True"], 0.75, "cpu"),
    (["npu graph: True", "npu graph: True"], 1.0, "npu"),
    (["cpu graph: True", "cuda graph: False"], 0.5, "cpu,cuda"),   # two files of one rank
])
def test_graph_label_of_any_device_counts_and_is_recorded(tmp_path, labels, frac, device,
                                                          monkeypatch):
    log = tmp_path / "server.log"
    log.write_text("".join(
        f"[2026-12-01 21:41:{10 + i} PP0] Decode batch, #running-req: 4, #token: 60, token usage:"
        f" 0.00, {g}, gen throughput (token/s): 50.00, #queue-req: 0\n"
        for i, g in enumerate(labels)))
    r = sglang_log.read_logs([log]).ranks["0"]
    assert (r.cuda_graph_frac, r.graph_device) == (frac, device)
    monkeypatch.setattr(log_scan, "_DEC_SIZE", re.compile(rb"(x)never"))   # line by line
    assert sglang_log.read_logs([log]).ranks["0"] == r


def test_lab_prefill_waves_per_rank(fixtures):
    s = sglang_log.read_logs([_lab(fixtures)], window=2)
    for r in ("0", "1"):
        d = s.ranks[r]
        # a warm-up request, one request alone, then bursts of 8 admitted as 1 + 7, 1 + 4 + 3
        # and 1 + 6 + 2 (on PP1 the 3 comes after a PP0 decode line: still in its place)
        assert [w.new_seq for w in d.prefill_waves] == [1, 1, 1, 7, 1, 4, 3, 1, 6, 2]
        assert d.prefill_new_seq_total == 27
        assert d.prefill_new_seq_hist == {"1": 5, "2": 1, "3": 1, "4": 1, "6": 1, "7": 1}
        assert d.prefill_new_tokens == 1476 and d.prefill_cached_tokens == 210
        assert to_json(d.prefill_waves[0]) == {
            "t_s": _epoch("2026-12-01 21:41:23"), "new_seq": 1, "new_token": 22,
            "cached_token": 0, "running_req": 0, "queue_req": 0}
        assert to_json(d.prefill_waves[6]) == {
            "t_s": _epoch("2026-12-01 21:42:20"), "new_seq": 3, "new_token": 186,
            "cached_token": 6, "running_req": 1, "queue_req": 0}


def test_prefill_waves_capped_and_without_running_req(fixtures, tmp_path):
    log = tmp_path / "server.log"
    log.write_text("".join(
        f"[2026-12-01 21:41:{i % 60:02d} PP0] Prefill batch, #new-seq: {1 + i % 3}, #new-token: "
        f"64, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: {i % 2}, "
        f"#pending-token: 0, cpu graph: False, input throughput (token/s): 10.00\n"
        for i in range(sglang_log.PREFILL_WAVES + 6)))
    d = sglang_log.read_logs([log]).ranks["0"]
    n = sglang_log.PREFILL_WAVES + 6
    assert d.prefill_lines == n and len(d.prefill_waves) == sglang_log.PREFILL_WAVES
    assert d.prefill_new_seq_total == sum(1 + i % 3 for i in range(n))
    assert d.prefill_new_seq_hist == {"1": 24, "2": 23, "3": 23}
    # a disaggregated prefill server logs no #running-req: None, not 0
    p = sglang_log.read_logs([fixtures / "sglang" / "attn_cp_npu_prefill.log"]).ranks["0"]
    assert [w.running_req for w in p.prefill_waves] == [None, None, None]
    assert p.prefill_new_seq_total == sum(w.new_seq for w in p.prefill_waves)


_LAB_ARGS = {"form": "dict", "pp_size": 2, "tp_size": 1, "device": "cpu",
             "attention_backend": "torch_native", "disable_cuda_graph": True,
             "decode_graph_backend": "disabled", "cuda_graph_max_bs": 32,
             "enable_torch_compile": False, "pp_async_batch_depth": 0,
             "pp_max_micro_batch_size": None, "max_running_requests": None,
             "chunked_prefill_size": 4096, "max_prefill_tokens": 16384}


def test_lab_server_args_summary(fixtures, tmp_path):
    s = sglang_log.read_logs([_lab(fixtures)])
    assert to_json(s.log.server_args) == _LAB_ARGS
    # the scheduler's own start-up line still gives what SGLang chose for the defaults
    assert s.log.server_settings["max_running_requests"] == 2048
    assert s.log.attention_backend == {"backend": "torch_native", "source": "--attention-backend"}
    # a value whose repr is not a literal: each key is read on its own, to the same summary
    text = _lab(fixtures).read_text()
    odd = tmp_path / "odd.log"
    odd.write_text(text.replace("server_args={", "server_args={'x': <Backend.DISABLED: 1>, "))
    assert to_json(sglang_log.read_logs([odd]).log.server_args) == _LAB_ARGS


def test_server_args_older_form():
    # releases before the argument groups log the dataclass repr (argument list cut short)
    block = (b"[2025-06-01 10:00:00] server_args=ServerArgs(model_path='m', tp_size=8, "
             b"pp_size=2, device='cuda', cuda_graph_max_bs=160, disable_cuda_graph=False, "
             b"enable_torch_compile=False, max_running_requests=256, chunked_prefill_size=-1, "
             b"max_prefill_tokens=16384, attention_backend='fa3', pp_max_micro_batch_size=None)"
             b"\n")
    sa = log_startup._server_args_in(block)
    assert sa == sglang_log.LoggedServerArgs(
        form="ServerArgs(...)", pp_size=2, tp_size=8, device="cuda", attention_backend="fa3",
        disable_cuda_graph=False, cuda_graph_max_bs=160, enable_torch_compile=False,
        max_running_requests=256, chunked_prefill_size=-1, max_prefill_tokens=16384)
    assert sglang_log.graph_setting(sa, ()) == {"off_by_setting": False, "reasons": []}


# A POST /set_internal_state as `ppscope sglang --mmb-sweep` sends it; the line is SGLang
# 0.5.23's format string (managers/scheduler_components/internal_state.py,
# `Config updated via context override: {overrides}`) under each scheduler's prefix
_OVERRIDE = ("[2026-12-01 21:42:30 PP0] Config updated via context override: "
             "{'pp_max_micro_batch_size': 4}\n"
             "[2026-12-01 21:42:31 PP1] Config updated via context override: "
             "{'pp_max_micro_batch_size': 4}\n"
             '[2026-12-01 21:42:31] INFO:     127.0.0.1:44100 - "POST /set_internal_state '
             'HTTP/1.1" 200 OK\n')


def _with_override(fixtures, tmp_path):
    lines = _lab(fixtures).read_text().splitlines(keepends=True)
    cut = next(i for i, ln in enumerate(lines) if ln.startswith("[2026-12-01 21:42:43"))
    log = tmp_path / "override.log"
    log.write_text("".join(lines[:cut]) + _OVERRIDE + "".join(lines[cut:]))
    return log


def test_runtime_setting_change_recorded_with_its_time(fixtures, tmp_path):
    s = sglang_log.read_logs([_with_override(fixtures, tmp_path)])
    assert to_json(s.log.config_overrides) == [{
        "t_s": _epoch("2026-12-01 21:42:30"), "clock": "2026-12-01 21:42:30", "ranks": [0, 1],
        "overrides": {"pp_max_micro_batch_size": 4},
        "text": "{'pp_max_micro_batch_size': 4}"}]
    assert s.log.lines_other == 155 + 3
    assert sglang_log.read_logs([_lab(fixtures)]).log.config_overrides == ()
    from reports.model.observed.server_log import log_setting_lines
    assert ("Setting changed at run time [log] 2026-12-01 21:42:30 (PP rank 0, 1): "
            "pp_max_micro_batch_size=4.") in log_setting_lines(s.log, s.ranks)


def test_lab_log_in_blocks_and_worker_processes(fixtures, tmp_path, monkeypatch):
    big = tmp_path / "big.log"
    one = _with_override(fixtures, tmp_path).read_text()
    # 20 copies, each with its change at another minute (the same change at the same clock
    # would be one change logged 20 times)
    big.write_text("".join(one.replace("21:42:30 PP0] Config", f"20:{k:02d}:30 PP0] Config")
                           .replace("21:42:31 PP1] Config", f"20:{k:02d}:31 PP1] Config")
                           for k in range(20)))
    whole = sglang_log.read_logs([big], workers=1)
    assert [o.clock for o in whole.log.config_overrides] == [
        f"2026-12-01 20:{k:02d}:30" for k in range(20)]
    assert all(o.ranks == (0, 1) for o in whole.log.config_overrides)
    monkeypatch.setattr(log_scan, "CHUNK_BYTES", 4099)   # blocks cut mid-line
    assert sglang_log.read_logs([big], workers=1) == whole
    assert sglang_log.read_logs([big], workers=2) == whole


def test_lab_graphs_off_by_setting_with_the_reasons(fixtures):
    s = sglang_log.read_logs([_lab(fixtures)])
    assert to_json(s.log.graph_setting) == {"off_by_setting": True, "reasons": [
        "device cpu without --enable-torch-compile: SGLang captures no CPU graph",
        "server_args disable_cuda_graph=True",
        "server_args cuda_graph_config decode backend 'disabled'",
        "SGLang: Cuda graph is disabled because of using torch native attention backend",
        "--disable-cuda-graph given (SGLang's deprecation warning for it)"]}
    from reports.model.observed.server_log import log_setting_lines
    text = "\n".join(log_setting_lines(s.log, s.ranks))
    assert ("Decode graphs [log]: off by setting (device cpu without --enable-torch-compile: "
            "SGLang captures no CPU graph; ") in text
    assert "off the `cpu graph` path are this setting, not a fallback." in text
    assert "Prefill waves [log], PP rank 1: 10 prefills admitted 27 requests; #new-seq per " \
           "prefill: 1 1 1 7 1 4 3 1 6 2 (prefills per #new-seq 1: 5, 2: 1, 3: 1, 4: 1, 6: 1, " \
           "7: 1)." in text
    assert text.startswith("Server args [log]: pp_size 2, tp_size 1, device cpu, "
                           "attention_backend torch_native, disable_cuda_graph True, ")


@pytest.mark.parametrize("sa,notes,want", [
    # CUDA, graphs left on: a `cuda graph: False` decode line is then a real fallback
    (dict(device="cuda", disable_cuda_graph=False, decode_graph_backend="full"), (),
     {"off_by_setting": False, "reasons": []}),
    # CPU with torch.compile: SGLang 0.5.23 captures CPU graphs (the CUDA switch is not read)
    (dict(device="cpu", disable_cuda_graph=True, enable_torch_compile=True), (),
     {"off_by_setting": False, "reasons": []}),
    (None, ("Cuda graph is disabled because deepep_mode=`normal`",),
     {"off_by_setting": True,
      "reasons": ["SGLang: Cuda graph is disabled because deepep_mode=`normal`"]}),
    (None, (), {"off_by_setting": None, "reasons": []}),
])
def test_graph_setting_rules(sa, notes, want):
    args = None if sa is None else sglang_log.LoggedServerArgs(form="dict", **sa)
    assert sglang_log.graph_setting(args, notes) == want


def test_graph_notes_read_from_start_up_lines(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("[2026-11-30 10:00:00] CUDA graph is disabled because --enable-mis is set.\n"
                   + _DECODE)
    assert to_json(sglang_log.read_logs([log]).log.graph_setting) == {
        "off_by_setting": True,
        "reasons": ["SGLang: CUDA graph is disabled because --enable-mis is set."]}


def test_graph_verdict_number_says_off_by_setting():
    from reports.model.observed.server_log import graph_off_number
    assert graph_off_number(["server_args disable_cuda_graph=True"], [("0", 0.0, 86)]) == (
        "Decode graphs off by setting (server_args disable_cuda_graph=True): decode runs eager on "
        "purpose, not a fallback; log: lowest per-rank share of decode batches on graphs 0% "
        "(rank 0)")


def test_report_verdict_on_graphs_off_by_setting(fixtures):
    from reports.model.verdicts import NOT, graph_evidence
    sg = sglang_log.read_logs([_lab(fixtures)])
    v, number, evidence = graph_evidence(sg)
    assert v == NOT and number.startswith("Decode graphs off by setting (device cpu without ")
    assert evidence == "sglang.json (observed: log start-up lines)"
