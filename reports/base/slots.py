"""SGLang's pipeline-parallel slot and admission discipline, as pure functions (no torch).

What it models (SGLang `scheduler_pp_mixin.py::event_loop_pp`, see FACTS.md):
- `pp_size + pp_async_batch_depth` micro-batch *slots*, visited round-robin by rank 0;
- a waiting request joins the slot being scheduled at that moment, up to the per-slot cap
  `pp_max_micro_batch_size` (default `max(max_running_requests // pp_size, 1)`: divided by the
  number of stages, not by the number of slots);
- requests never move between slots;
- a slot that admits requests runs a prefill that turn instead of its decode ("prefill first").

Two admission policies:
- `sglang`: what SGLang does. A burst of arrivals lands in the slot being scheduled (and the
  next, once the cap is hit) and stays there: the "thundering herd".
- `even`: spread the requests over `micro_batches` slots (default `pp`, i.e. about one
  micro-batch per stage in flight, ~C/pp requests each), the slots chosen evenly spaced in the
  round-robin. `micro_batches` is a choice: with MoE every micro-batch re-reads the experts its
  tokens touch, so more micro-batches than stages costs weight bandwidth (FACTS.md, "the herd
  at PP2"). If the cap cannot hold everything in `micro_batches` slots, more slots are used.

Both the dispatch probe (`microbench/pp_loop.py`, on real GPUs) and the report's discrete-event
pipeline model use these functions, so the probe and the model admit requests identically.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

POLICIES = ("sglang", "even")


def default_max_micro_batch(max_running_requests: int, pp_size: int) -> int:
    """SGLang's default `pp_max_micro_batch_size`: `max(max_running_requests // pp_size, 1)`."""
    if pp_size < 1:
        raise ValueError(f"pp_size must be >= 1, got {pp_size}")
    return max(int(max_running_requests) // int(pp_size), 1)


@dataclass(frozen=True)
class SlotConfig:
    """`pp` stages, `async_depth` extra slots, per-slot cap `max_micro_batch` (requests)."""
    pp: int
    async_depth: int
    max_micro_batch: int

    def __post_init__(self) -> None:
        if self.pp < 1:
            raise ValueError(f"pp must be >= 1, got {self.pp}")
        if self.async_depth < 0:
            raise ValueError(f"async_depth must be >= 0, got {self.async_depth}")
        if self.max_micro_batch < 1:
            raise ValueError(f"max_micro_batch must be >= 1, got {self.max_micro_batch}")

    @property
    def slots(self) -> int:
        """SGLang's `pp_loop_size`."""
        return self.pp + self.async_depth


def _check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise ValueError(f"unknown admission policy {policy!r}; choose from {', '.join(POLICIES)}")


def even_slots(cfg: SlotConfig, micro_batches: int) -> tuple[int, ...]:
    """The `micro_batches` slots the `even` policy fills, evenly spaced in the round-robin
    (4 slots, 2 micro-batches -> (0, 2)), so the micro-batches sit one stage apart."""
    m = max(1, min(int(micro_batches), cfg.slots))
    return tuple((i * cfg.slots) // m for i in range(m))


def even_micro_batches(total: int, cfg: SlotConfig, micro_batches: int | None = None) -> int:
    """How many slots `even` uses for `total` requests: `micro_batches` (default pp), raised
    until the cap holds everyone, never more than the slot count."""
    m = cfg.pp if micro_batches is None else int(micro_batches)
    if m < 1:
        raise ValueError(f"micro_batches must be >= 1, got {m}")
    need = -(-int(total) // cfg.max_micro_batch)  # ceil
    return max(1, min(max(m, need), cfg.slots))


def admit(waiting: int, slot_sizes: Sequence[int], slot: int, cfg: SlotConfig,
          policy: str = "sglang", micro_batches: int | None = None) -> int:
    """How many of `waiting` requests (FIFO) the slot `slot` admits now.

    `slot_sizes[s]` = requests already running in slot s (len == cfg.slots).
    """
    _check_policy(policy)
    if len(slot_sizes) != cfg.slots:
        raise ValueError(f"slot_sizes has {len(slot_sizes)} entries, expected {cfg.slots}")
    if not 0 <= slot < cfg.slots:
        raise ValueError(f"slot {slot} out of range 0..{cfg.slots - 1}")
    room = max(0, cfg.max_micro_batch - slot_sizes[slot])
    if waiting <= 0 or room == 0:
        return 0
    if policy == "sglang":
        return min(waiting, room)
    total = sum(slot_sizes) + waiting
    chosen = even_slots(cfg, even_micro_batches(total, cfg, micro_batches))
    if slot not in chosen:
        return 0
    k, m = chosen.index(slot), len(chosen)
    share = min(total // m + (1 if k < total % m else 0), cfg.max_micro_batch)
    return max(0, min(waiting, share - slot_sizes[slot]))


def slot_action(admitted: int, running: int) -> str:
    """What a slot runs on its turn: `prefill` if it admitted (prefill first), else `decode`
    if it holds requests, else `idle` (an empty slot still costs each rank a loop turn)."""
    if admitted > 0:
        return "prefill"
    return "decode" if running > 0 else "idle"


def initial_assignment(arrival_times: Sequence[float], cfg: SlotConfig, policy: str = "sglang",
                       visit_times: Sequence[float] = (), micro_batches: int | None = None
                       ) -> list[int | None]:
    """Slot of each request, given arrival times and the times rank 0 visits slots.

    Visit `i` schedules slot `i % cfg.slots` at `visit_times[i]`; requests with arrival time
    <= that time are waiting, and are admitted in arrival order (ties: request index). Requests
    never leave (a decode benchmark's streams run throughout). A request not admitted by the
    last visit gets None. Deterministic.
    """
    _check_policy(policy)
    order = sorted(range(len(arrival_times)), key=lambda i: (arrival_times[i], i))
    out: list[int | None] = [None] * len(arrival_times)
    sizes = [0] * cfg.slots
    nxt = 0  # index into `order` of the first request not yet admitted
    for v, t in enumerate(visit_times):
        slot = v % cfg.slots
        arrived = nxt
        while arrived < len(order) and arrival_times[order[arrived]] <= t:
            arrived += 1
        n = admit(arrived - nxt, sizes, slot, cfg, policy, micro_batches)
        for r in order[nxt:nxt + n]:
            out[r] = slot
        sizes[slot] += n
        nxt += n
        if nxt == len(order):
            break
    return out


def slot_sizes_of(assignment: Sequence[int | None], cfg: SlotConfig) -> list[int]:
    """Requests per slot from `initial_assignment`'s output (unadmitted ones left out)."""
    sizes = [0] * cfg.slots
    for s in assignment:
        if s is not None:
            sizes[s] += 1
    return sizes
