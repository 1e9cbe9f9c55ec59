"""SGLang's names for each server setting ppscope changes or reads, in one table.

A `ServerSettings` field (reports/base/server_settings.py) is named after SGLang's server_args
field; SGLang 0.5.23 spells the same setting three more ways, and each is written here once:
- the command-line flag: the field with `_` -> `-` after `--` (srt/arg_groups/arg_utils.py,
  `_field_to_cli_name`; the fields in srt/arg_groups/fields/parallel.py, schedule.py and
  exec_.py);
- the `server_args=` start-up line and `/get_server_info`: the field name itself;
- the scheduler's start-up line (managers/scheduler.py, `Scheduler.__init__`: "max_total_num_tokens=..,
  chunked_prefill_size=.., max_prefill_tokens=.., max_running_requests=.., context_len=.."): the
  value SGLang resolved, under its own key, for the settings it prints there.

The decode CUDA-graph capture size is `cuda_graph_max_bs_decode`, flag
`--cuda-graph-max-bs-decode` (srt/arg_groups/fields/exec_.py); 0.5.23 has no
`--cuda-graph-max-bs` (argparse reads it as an ambiguous prefix of the decode and prefill
flags). SGLang folds the flag into `cuda_graph_config['decode']['max_bs']`
(srt/arg_groups/cuda_graph_hook.py), which its `server_args=` line and `/server_info` carry
resolved (`ServerArgs.resolved_dict`); versions before it logged `cuda_graph_max_bs`
(`ServerFlag.older_arg`).

SGLang takes `pp_max_micro_batch_size` from its server_args as given (None unless the flag is
set) and only then derives its default from the rows it runs with (`Scheduler.__init__`,
`scheduler.pp_max_micro_batch_size_default`: `max(max_running_requests // pp_size, 1)`), so a
server is started with the cap it was set to, not with the cap derived from it (`server_args`).

The what-ifs change `LOOP_FLAGS` (reports/model/settings_change.py); the twin and the lab start
SGLang's server with them (`server_args`); the PP-loop probe's serve mode answers under their
server_args names; the log reader reads them from the start-up lines
(microbench/sglang/log_startup.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from reports.base.server_settings import ServerSettings


@dataclass(frozen=True)
class ServerFlag:
    """One setting: its `ServerSettings` field, SGLang's command-line flag, its server_args
    field (the `server_args=` line's and `/get_server_info`'s key), its key on the scheduler's
    start-up line (None: not printed there), whether `/set_internal_state` changes it on a
    running server (SGLang 0.5.23 managers/scheduler_components/internal_state.py), and its
    server_args key in SGLang before 0.5.23 where that differs (read from older logs only)."""
    setting: str
    flag: str
    server_arg: str
    startup: str | None = None
    live: bool = False
    older_arg: str | None = None


# The settings a what-if changes, in the order a server is started with them.
LOOP_FLAGS = (
    ServerFlag("pp_async_batch_depth", "--pp-async-batch-depth", "pp_async_batch_depth"),
    ServerFlag("chunked_prefill_size", "--chunked-prefill-size", "chunked_prefill_size",
               "chunked_prefill_size"),
    ServerFlag("max_running_requests", "--max-running-requests", "max_running_requests",
               "max_running_requests"),
    ServerFlag("pp_max_micro_batch_size", "--pp-max-micro-batch-size", "pp_max_micro_batch_size",
               live=True),
)
# The other settings ppscope reads under the same names (the deployment's shape and the
# prefill cap).
SHAPE_FLAGS = (
    ServerFlag("pp_size", "--pp-size", "pp_size"),
    ServerFlag("tp_size", "--tp-size", "tp_size"),
    ServerFlag("max_prefill_tokens", "--max-prefill-tokens", "max_prefill_tokens",
               "max_prefill_tokens"),
)
# The decode CUDA-graph capture size: a stage-cost input of the scenario model and a what-if
# there (reports/model/settings_change.py `GRAPH_MAX_BS`), not an admission setting.
GRAPH_MAX_BS_FLAG = ServerFlag("cuda_graph_max_bs", "--cuda-graph-max-bs-decode",
                               "cuda_graph_max_bs_decode", older_arg="cuda_graph_max_bs")
SERVER_FLAGS = LOOP_FLAGS + SHAPE_FLAGS + (GRAPH_MAX_BS_FLAG,)
# Settings that change the host work of a decode step (docs/MODEL.md, "Settings that act on host
# work and hops"): named here so the lab and the report say them under SGLang's names; not
# `ServerSettings` fields and not what-if knobs, since the model holds no cost for them apart
# from the host time it observes (SGLang 0.5.23 srt/arg_groups/fields/observability.py,
# serving.py, schedule.py). ppscope's recipe starts SGLang with the first two set.
HOST_FLAGS = (
    ServerFlag("decode_log_interval", "--decode-log-interval", "decode_log_interval"),
    ServerFlag("enable_metrics", "--enable-metrics", "enable_metrics"),
    ServerFlag("stream_interval", "--stream-interval", "stream_interval"),
    ServerFlag("scheduler_recv_interval", "--scheduler-recv-interval", "scheduler_recv_interval"),
)
HOST_BY_SETTING = {f.setting: f for f in HOST_FLAGS}
# ppscope's recipe: what its readings of a server need SGLang to be started with. SGLang's
# defaults are metrics off (no /metrics endpoint) and a decode log line every 40 decode steps
# (SGLang 0.5.23 srt/arg_groups/fields/observability.py: `enable_metrics = False`,
# `decode_log_interval = 40`); the log reader reads every decode step's slot size, so one line
# per step. `python -m reports.lab.recipe` reads what the recipe costs the server.
RECIPE_ARGS = (HOST_BY_SETTING["enable_metrics"].flag,
               HOST_BY_SETTING["decode_log_interval"].flag, "1")
BY_FLAG = {f.flag: f for f in SERVER_FLAGS}
BY_SETTING = {f.setting: f for f in SERVER_FLAGS}
CAP = BY_SETTING["pp_max_micro_batch_size"]


def flag_of(setting: str) -> str:
    """SGLang's command-line flag of a `ServerSettings` field."""
    return BY_SETTING[setting].flag


def server_args(settings: ServerSettings,
                flags: Sequence[ServerFlag] = LOOP_FLAGS) -> tuple[str, ...]:
    """`settings` as SGLang's command-line arguments, for the flags of `flags`: the async depth
    always (0 is a value), the others where set (None, and a chunk of 0, leave SGLang its
    default); the per-slot cap as set, never the default derived from the rows (module
    docstring)."""
    out: list[str] = []
    for f in flags:
        v = getattr(settings, f.setting)
        if v is None or (not v and f.setting != "pp_async_batch_depth"):
            continue
        out += [f.flag, str(v)]
    return tuple(out)
