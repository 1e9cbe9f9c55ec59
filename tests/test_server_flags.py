"""One table of SGLang's names for a server setting (reports/base/server_flags.py): the names
checked against SGLang 0.5.23 as read, and every place that translates a setting to SGLang or
back (the what-ifs, the twin's and the lab's servers, the serve mode, the log reader) using it."""
from __future__ import annotations

import pytest

from microbench.dispatch import serve as SV
from microbench.sglang.log_startup import LoggedServerArgs, startup
from reports.base.server_flags import (BY_FLAG, CAP, HOST_FLAGS, LOOP_FLAGS, SERVER_FLAGS,
                                       server_args)
from reports.base.server_settings import ServerSettings
from reports.model import settings_change as SC
from reports.model.observed import whatifs as sw
from reports.model.observed import bench_run as ow

# SGLang 0.5.23, read from its wheel:
# - the server_args fields: srt/arg_groups/fields/parallel.py (`Parallel`: tp_size, pp_size,
#   pp_max_micro_batch_size default None, pp_async_batch_depth default 0) and
#   srt/arg_groups/fields/schedule.py (`Schedule`: max_running_requests, chunked_prefill_size,
#   max_prefill_tokens) and srt/arg_groups/fields/exec_.py (`cuda_graph_max_bs_decode`; there
#   is no `cuda_graph_max_bs` field, so no `--cuda-graph-max-bs` flag);
# - the flag of a field: srt/arg_groups/arg_utils.py `_field_to_cli_name`,
#   "--" + name.replace("_", "-");
# - the scheduler's start-up line: srt/managers/scheduler.py `Scheduler.__init__`,
#   "max_total_num_tokens=.., chunked_prefill_size=.., max_prefill_tokens=..,
#   max_running_requests=.., context_len=.."; the cap and the depth are not on it;
# - `/set_internal_state`: srt/managers/scheduler_components/internal_state.py accepts
#   "pp_max_micro_batch_size" only.
SGLANG_0_5_23 = {   # setting: (flag, server_args field, start-up line key, live)
    "pp_async_batch_depth": ("--pp-async-batch-depth", "pp_async_batch_depth", None, False),
    "chunked_prefill_size": ("--chunked-prefill-size", "chunked_prefill_size",
                             "chunked_prefill_size", False),
    "max_running_requests": ("--max-running-requests", "max_running_requests",
                             "max_running_requests", False),
    "pp_max_micro_batch_size": ("--pp-max-micro-batch-size", "pp_max_micro_batch_size", None,
                                True),
    "pp_size": ("--pp-size", "pp_size", None, False),
    "tp_size": ("--tp-size", "tp_size", None, False),
    "max_prefill_tokens": ("--max-prefill-tokens", "max_prefill_tokens", "max_prefill_tokens",
                           False),
    "cuda_graph_max_bs": ("--cuda-graph-max-bs-decode", "cuda_graph_max_bs_decode", None, False),
}


def test_the_names_are_sglangs():
    assert {f.setting: (f.flag, f.server_arg, f.startup, f.live) for f in SERVER_FLAGS} == \
        SGLANG_0_5_23
    for f in SERVER_FLAGS:
        assert f.flag == "--" + f.server_arg.replace("_", "-")    # `_field_to_cli_name`
        assert hasattr(ServerSettings(1), f.setting)
        assert f.setting in LoggedServerArgs.__dataclass_fields__


def test_the_what_ifs_change_the_tables_flags():
    assert SC.SERVER_FLAGS == {f.flag: f.setting for f in LOOP_FLAGS}
    assert SC.KNOBS[:4] == ("--pp-max-micro-batch-size", "--pp-async-batch-depth",
                            "--chunked-prefill-size", "--max-running-requests")


def test_a_server_starts_with_the_cap_it_was_set_to_not_the_derived_one():
    """SGLang takes `pp_max_micro_batch_size` from its server_args (None unless given) and only
    then derives max(max_running_requests // pp_size, 1) (managers/scheduler.py
    `Scheduler.__init__`): the derived cap is not a flag to pass."""
    s = ServerSettings(2, 1, max_running_requests=64, chunked_prefill_size=256)
    assert s.max_micro_batch == 32
    assert server_args(s) == ("--pp-async-batch-depth", "1", "--chunked-prefill-size", "256",
                              "--max-running-requests", "64")
    capped = ServerSettings(2, 0, 64, pp_max_micro_batch_size=8)
    assert server_args(capped) == ("--pp-async-batch-depth", "0", "--max-running-requests", "64",
                                   "--pp-max-micro-batch-size", "8")
    # the observed server's settings keep a cap only where the log's was not the default
    assert server_args(ow.observed_settings(2, 0, cap=32, rows=64)) == server_args(
        ServerSettings(2, 0, 64))
    # no chunk (None or 0) leaves SGLang its own
    assert "--chunked-prefill-size" not in server_args(ServerSettings(2, 0, 64, None, 0))


def test_the_flags_read_back_from_the_start_up_lines(tmp_path):
    """A server started with `server_args`' flags logs them under the table's server_args names;
    the log reader gives back the same settings."""
    s = ServerSettings(2, 1, max_running_requests=48, pp_max_micro_batch_size=6,
                       chunked_prefill_size=512, max_prefill_tokens=4096, cuda_graph_max_bs=24)
    args = server_args(s, SERVER_FLAGS)
    given = {BY_FLAG[args[i]].server_arg: int(args[i + 1]) for i in range(0, len(args), 2)}
    log = tmp_path / "server.log"
    log.write_text(f"[2026-01-01 00:00:00] server_args={given!r}\n"
                   "[2026-01-01 00:00:01 PP0] max_total_num_tokens=9000, chunked_prefill_size=512, "
                   "max_prefill_tokens=4096, max_running_requests=48, context_len=2048, "
                   "available_gpu_mem=1.00 GB\n")
    got = startup([log])
    for f in SERVER_FLAGS:
        assert getattr(got.server_args, f.setting) == getattr(s, f.setting), f.setting
        if f.startup:
            assert got.settings[f.startup] == getattr(s, f.setting)


def test_the_serve_mode_answers_under_the_server_args_names():
    args = SV.ServerArgs.of(ServerSettings(2, 2, 64, pp_max_micro_batch_size=4),
                            model_path="m")
    info = args.as_dict()
    assert {f.server_arg for f in SERVER_FLAGS} <= set(info)
    assert info[CAP.server_arg] == 4


def test_the_graph_capture_size_is_said_with_sglangs_flag():
    """The advice, the scenario's inputs and the answer table's fixes name
    `--cuda-graph-max-bs-decode` (SGLang 0.5.23 has no `--cuda-graph-max-bs`), taken from the
    table, never a literal of their own."""
    from reports.render import answer_table as AT
    assert SC.GRAPH_MAX_BS == "--cuda-graph-max-bs-decode"
    assert AT.FIXES["launch_gaps"] == (SC.GRAPH_MAX_BS,)
    table = {f.flag for f in SERVER_FLAGS}
    for knobs in AT.FIXES.values():
        assert all(k in table or k in SC.OTHER_KNOBS for k in knobs), knobs
    assert [k for k in SC.OTHER_KNOBS if k.startswith("--")] == [SC.GRAPH_MAX_BS,
                                                                 SC.REQUEST_RATE]


def test_the_host_work_settings_are_named_not_knobs():
    """SGLang 0.5.23's fields (srt/arg_groups/fields/observability.py `decode_log_interval`
    default 40, `enable_metrics` default False; serving.py `stream_interval` default 1;
    schedule.py `scheduler_recv_interval` default 1): named in the table under SGLang's flag,
    and never a what-if knob (the model holds no cost for them)."""
    assert [f.flag for f in HOST_FLAGS] == ["--decode-log-interval", "--enable-metrics",
                                            "--stream-interval", "--scheduler-recv-interval"]
    for f in HOST_FLAGS:
        assert f.flag == "--" + f.server_arg.replace("_", "-")
        assert f.flag not in SC.KNOBS and f not in SERVER_FLAGS
        with pytest.raises(ValueError):
            SC.check(SC.Change(f.flag, 1))


@pytest.mark.parametrize("key", ["cuda_graph_max_bs_decode", "cuda_graph_max_bs"])
def test_the_graph_capture_size_reads_from_this_and_older_logs(tmp_path, key):
    """0.5.23's `server_args=` dict names the flag's field (and the resolved
    cuda_graph_config); older SGLang's `ServerArgs(...)` line named it `cuda_graph_max_bs`."""
    log = tmp_path / "server.log"
    line = (f"server_args={{'pp_size': 2, '{key}': 48}}" if key.endswith("decode")
            else f"server_args=ServerArgs(pp_size=2, {key}=48, disable_cuda_graph=False)")
    log.write_text(f"[2026-01-01 00:00:00] {line}\n")
    assert startup([log]).server_args.cuda_graph_max_bs == 48


@pytest.mark.parametrize("flag, value, command", [
    ("--pp-async-batch-depth", 1, "--pp-async-batch-depth 1"),
    ("--pp-max-micro-batch-size", 4, "--pp-max-micro-batch-size 4"),
    (SC.REQUEST_RATE, 2.5, "bench_serving --request-rate 2.5"),
    (SC.LAYER_PARTITION, "3,1", "SGLANG_PP_LAYER_PARTITION=3,1 in the server's environment"),
    (SC.GRAPH_MAX_BS, 64, "--cuda-graph-max-bs-decode 64"),
])
def test_the_observed_what_ifs_say_the_command(flag, value, command):
    assert sw._command(SC.Change(flag, value)) == command
