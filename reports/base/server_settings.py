"""SGLang's server settings that shape the PP loop, in one type (no torch, no SGLang).

The PP-loop probe (its configuration, the rank configuration, its serve mode), the slot
admission (reports/base/slots.py) and the report's model inputs (reports/model/scenario/inputs.py)
all embed `ServerSettings`, so a setting has one name everywhere -- SGLang's own flag name
(SGLang 0.5.23 server_args.py, arg_groups/fields/) -- and the two rules derived from the
settings are written here only:
- the slot count `pp_loop_size = pp_size + pp_async_batch_depth` (managers/scheduler_pp_mixin.py,
  `event_loop_pp`): micro-batch slots visited round-robin;
- the default per-slot cap `pp_max_micro_batch_size = max(max_running_requests // pp_size, 1)`
  (managers/scheduler.py, `Scheduler.__init__`, `pp_max_micro_batch_size_default`): divided by
  the number of stages, not of slots.
The defaults that depend on the GPU or the model (chunked prefill size, graph max bs,
max_running_requests from the KV pool) are in reports/base/sglang_defaults.py; a
`ServerSettings` holds the values once they are resolved.
"""
from __future__ import annotations

from dataclasses import dataclass

from reports.base.sglang_defaults import MAX_PREFILL_TOKENS, PP_ASYNC_BATCH_DEPTH


def slot_count(pp_size: int, pp_async_batch_depth: int) -> int:
    """SGLang's `pp_loop_size`: `pp_size + pp_async_batch_depth` micro-batch slots
    (SGLang 0.5.23 managers/scheduler_pp_mixin.py, `event_loop_pp`)."""
    return int(pp_size) + int(pp_async_batch_depth)


def default_max_micro_batch(max_running_requests: int, pp_size: int) -> int:
    """SGLang's default `pp_max_micro_batch_size`: `max(max_running_requests // pp_size, 1)`
    (SGLang 0.5.23 managers/scheduler.py, `Scheduler.__init__`,
    `scheduler.pp_max_micro_batch_size_default`)."""
    if pp_size < 1:
        raise ValueError(f"pp_size must be >= 1, got {pp_size}")
    return max(int(max_running_requests) // int(pp_size), 1)


def chunk_budget(chunked_prefill_size: int | None) -> int | None:
    """The prefill token budget of one slot visit; None when chunked prefill is off (SGLang
    turns it off with -1; None and 0 read the same here)."""
    c = chunked_prefill_size
    return c if c is not None and c > 0 else None


def _at_least(name: str, value: int | None, low: int) -> None:
    if value is not None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")


@dataclass(frozen=True)
class ServerSettings:
    """The server settings the PP loop runs with, under SGLang's flag names.
    `max_running_requests` None: no limit known (the probe's loop without a KV pool, a server
    whose log does not say); `pp_max_micro_batch_size` None: SGLang's default (`max_micro_batch`);
    `chunked_prefill_size` None or <= 0: chunked prefill off; `cuda_graph_max_bs` None: not
    known or no graphs."""
    pp_size: int
    pp_async_batch_depth: int = PP_ASYNC_BATCH_DEPTH
    max_running_requests: int | None = None
    pp_max_micro_batch_size: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int = MAX_PREFILL_TOKENS
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int | None = None
    tp_size: int = 1
    page_size: int = 1

    def __post_init__(self) -> None:
        for name, low in (("pp_size", 1), ("pp_async_batch_depth", 0), ("tp_size", 1),
                          ("max_running_requests", 1), ("pp_max_micro_batch_size", 1),
                          ("max_prefill_tokens", 1), ("cuda_graph_max_bs", 0),
                          ("page_size", 1)):
            _at_least(name, getattr(self, name), low)

    @property
    def slots(self) -> int:
        """SGLang's `pp_loop_size` (`slot_count`)."""
        return slot_count(self.pp_size, self.pp_async_batch_depth)

    @property
    def max_micro_batch(self) -> int | None:
        """The per-slot cap the server runs with: `pp_max_micro_batch_size` when set, else
        SGLang's default from `max_running_requests` (`default_max_micro_batch`); None when
        neither is known."""
        if self.pp_max_micro_batch_size is not None:
            return self.pp_max_micro_batch_size
        if self.max_running_requests is None:
            return None
        return default_max_micro_batch(self.max_running_requests, self.pp_size)

    @property
    def max_micro_batch_upper(self) -> int:
        """The largest `pp_max_micro_batch_size` `/set_internal_state` accepts:
        `max_running_requests // pp_size` (SGLang 0.5.23
        managers/scheduler_components/internal_state.py)."""
        if self.max_running_requests is None:
            raise ValueError("max_running_requests is not known")
        return self.max_running_requests // self.pp_size

    @property
    def chunk_budget(self) -> int | None:
        """Prefill tokens per slot visit with chunked prefill on (`chunk_budget`)."""
        return chunk_budget(self.chunked_prefill_size)

    @property
    def graphs(self) -> bool:
        """CUDA graphs on (SGLang's `--disable-cuda-graph` not given)."""
        return not self.disable_cuda_graph


class SettingsNames:
    """The server's settings under the short names the probe, the model and the report read,
    for a type that embeds them as `server` (RankConfig, the model's Inputs)."""
    server: ServerSettings

    @property
    def pp(self) -> int:
        return self.server.pp_size

    @property
    def async_depth(self) -> int:
        return self.server.pp_async_batch_depth

    @property
    def graphs(self) -> bool:
        return self.server.graphs

