"""Discrete-event model of SGLang's pipeline-parallel decode loop (steady state).

What it models (SGLang `scheduler_pp_mixin.py::event_loop_pp`, FACTS.md):
- `pp + async_depth` micro-batch slots visited round-robin by every rank; slot `k` holds
  `slot_sizes[k]` requests for the whole run (requests never move between slots);
- every rank's loop is chained to the previous rank's: rank `i > 0` cannot start iteration `j`
  before rank `i-1` has sent it the request list (`chain_us` after rank `i-1` started it),
  empty slots included; each visit costs the rank's CPU `host_us` (non-empty slot: schedule +
  launch) or `empty_us` (empty slot); rank 0's non-empty visit costs `first_host_us[b]` when
  that table is given (its host work grows with the slot: tokens to process, request list);
- `result_sync`: rank 0 reads the returned tokens with a host sync on its compute stream
  (`tokens.tolist()`), so it cannot start a slot's host work before its GPU has finished every
  forward already queued; its host time then sits between two forwards instead of hiding
  behind them (measured on the dispatch probe: it is what makes `even` slower than a model
  without it, see reports/model/validate_dispatch.py);
- a non-empty slot on rank `i > 0` waits (blocking receive) for its hidden states: rank `i-1`'s
  forward end + `hop_us[i-1][b]`; rank 0 waits for the sampled tokens of the slot's previous
  decode: last rank's forward end + `hop_us[pp-1][b]` (the last->first token hop);
- each rank's GPU runs one forward at a time: `stage_us[i][b]` for a micro-batch of `b`.

How to read it: `simulate()` runs `rounds` full round-robin rounds and measures the second half,
where the loop is periodic. `tok_per_s` = requests x rounds / elapsed time, `tpot_ms` = one
round (every request advances one token per round), `busy_frac[i]` = GPU `i` busy / round.
With no host costs and `m` equal micro-batches of `B` it reproduces DESIGN.md's closed forms
(`reports/model/closed_form.py`). Pure Python, no numpy: one run of PP8 x 16 slots takes ~1 ms.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class LoopConfig:
    """Everything the simulator needs; times in microseconds, tables indexed by batch size.

    stage_us[i][b]: forward of rank i for a micro-batch of b requests (b = 0..bmax; [0] unused).
    hop_us[i][b]:   rank i -> rank i+1 hidden-state hop; hop_us[pp-1] is last -> first (tokens).
    """
    stage_us: tuple[tuple[float, ...], ...]
    hop_us: tuple[tuple[float, ...], ...]
    async_depth: int
    host_us: float = 0.0
    empty_us: float = 0.0
    chain_us: float = 0.0
    first_host_us: tuple[float, ...] = ()   # rank 0 per non-empty visit, by batch ([0] unused)
    result_sync: bool = False
    rank_host_us: tuple[float, ...] = ()    # per rank, per non-empty visit (overrides the above)

    @property
    def pp(self) -> int:
        return len(self.stage_us)

    @property
    def slots(self) -> int:
        return self.pp + self.async_depth

    def __post_init__(self) -> None:
        if len(self.hop_us) != len(self.stage_us):
            raise ValueError("hop_us needs one row per rank (the last is last -> first)")
        if self.rank_host_us and len(self.rank_host_us) != len(self.stage_us):
            raise ValueError("rank_host_us needs one entry per rank")
        for row in (*self.stage_us, *self.hop_us, self.first_host_us, self.rank_host_us):
            if any(v < 0 for v in row):
                raise ValueError("costs must be >= 0")


@dataclass(frozen=True)
class Span:
    """One forward on one rank's GPU (for the timeline trace)."""
    rank: int
    slot: int
    batch: int
    start_us: float
    end_us: float


@dataclass(frozen=True)
class SimResult:
    tok_per_s: float
    tpot_ms: float
    busy_frac: tuple[float, ...]
    slot_sizes: tuple[int, ...]
    spans: tuple[Span, ...] = ()


def _at(row: Sequence[float], b: int) -> float:
    if b >= len(row):
        raise ValueError(f"no cost for micro-batch size {b} (table goes to {len(row) - 1})")
    return row[b]


def simulate(cfg: LoopConfig, slot_sizes: Sequence[int], rounds: int = 12,
             keep_spans: bool = False) -> SimResult:
    """Run the loop for `rounds` rounds; measure the second half. `slot_sizes` has one entry
    per slot (shorter lists are padded with empty slots)."""
    p, S = cfg.pp, cfg.slots
    sizes = list(slot_sizes) + [0] * (S - len(slot_sizes))
    if len(sizes) > S:
        raise ValueError(f"{len(sizes)} slot sizes for {S} slots")
    if any(n < 0 for n in sizes):
        raise ValueError("slot sizes must be >= 0")
    total = sum(sizes)
    if total == 0:
        return SimResult(0.0, 0.0, tuple(0.0 for _ in range(p)), tuple(sizes))
    cpu = [0.0] * p          # when each rank's CPU is free
    gpu = [0.0] * p          # when each rank's GPU is free
    tok_ready = [0.0] * S    # rank 0: sampled tokens of slot k back from the last rank
    done_at: list[float] = []  # last rank forward end, per non-empty iteration, in order
    spans: list[Span] = []
    for j in range(rounds * S):
        k = j % S
        n = sizes[k]
        req_at = 0.0   # request list from the previous rank
        act_at = 0.0   # hidden states from the previous rank
        for i in range(p):
            t = max(cpu[i], req_at)
            if n > 0:
                t = max(t, act_at if i > 0 else tok_ready[k])
                if i == 0 and cfg.result_sync:
                    t = max(t, gpu[0])  # tokens.tolist() waits for the queued forwards
            req_at = t + cfg.chain_us  # sent at the start of this rank's iteration
            if n == 0:
                cpu[i] = t + cfg.empty_us
                continue
            launched = t + (cfg.rank_host_us[i] if cfg.rank_host_us else
                            _at(cfg.first_host_us, n) if i == 0 and cfg.first_host_us
                            else cfg.host_us)
            start = max(launched, gpu[i])
            end = start + _at(cfg.stage_us[i], n)
            gpu[i] = end
            cpu[i] = launched
            if keep_spans:
                spans.append(Span(i, k, n, start, end))
            act_at = end + _at(cfg.hop_us[i], n)
            if i == p - 1:
                tok_ready[k] = act_at
                done_at.append(end)
    per_round = sum(1 for n in sizes if n > 0)
    half = rounds // 2
    t0 = done_at[half * per_round - 1]
    t1 = done_at[rounds * per_round - 1]
    elapsed = t1 - t0
    n_rounds = rounds - half
    if elapsed <= 0:
        raise ValueError("zero elapsed time: every cost is zero")
    # In the periodic regime every rank runs each non-empty slot once per round.
    period = elapsed / n_rounds
    busy = [sum(_at(cfg.stage_us[i], n) for n in sizes if n > 0) / period for i in range(p)]
    return SimResult(
        tok_per_s=total * n_rounds / elapsed * 1e6,
        tpot_ms=elapsed / n_rounds / 1e3,
        busy_frac=tuple(busy),
        slot_sizes=tuple(sizes),
        spans=tuple(spans),
    )


def uniform_loop(pp: int, async_depth: int, bmax: int, stage_us: Sequence[float] | float,
                 hop_us: float = 0.0, return_us: float | None = None, **kw: float) -> LoopConfig:
    """A loop whose stage and hop costs do not depend on batch size (tests, closed forms)."""
    per = [float(stage_us)] * pp if isinstance(stage_us, (int, float)) else list(stage_us)
    ret = hop_us if return_us is None else return_us
    hops = [hop_us] * (pp - 1) + [ret]
    return LoopConfig(
        stage_us=tuple(tuple([0.0] + [c] * bmax) for c in per),
        hop_us=tuple(tuple([0.0] + [h] * bmax) for h in hops),
        async_depth=async_depth, **kw,
    )
