"""Closed forms for a PP decode loop with `m` equal micro-batches in flight, no host costs.

DESIGN.md's forms: round trip of one micro-batch `R = sum_i T_i + (p-1)*c + h` (stage forwards,
p-1 hidden-state hops of `c`, the last->first token hop `h`); period `P = max(m * max_i T_i, R)`;
throughput `m * B / P`; stage `i` bubble `1 - m * T_i / P`. They hold in SGLang's loop
(reports/model/sim/pipeline_model.py) for one micro-batch, and with `--pp-async-batch-depth 0` when
no two occupied slots are adjacent.

With `async_depth > 0` SGLang 0.5.23 (managers/scheduler_pp_mixin.py, `event_loop_pp`,
`_pp_send_output_to_next_stage`) holds a slot's sampled tokens on the last rank and sends them
`depth` iterations later, on the schedule stream, behind the receive of the hidden states of the
slot being visited then. For `m` micro-batches evenly spaced `g = slots / m >= 2` apart, the slot
whose hidden states the send waits for is `k = depth // g` micro-batches ahead, so the tokens of
a micro-batch return no earlier than `k * P / m` after it left plus the trip to the last-but-one
stage: `P >= (R - T_last) + k * P / m`, i.e. `period_held_us` (exact when the loop is evenly
spaced in time, e.g. pp = depth; the simulator is tested against it).
"""
from __future__ import annotations

from typing import Sequence


def round_trip_us(stage_us: Sequence[float], hop_us: float, return_us: float) -> float:
    return sum(stage_us) + (len(stage_us) - 1) * hop_us + return_us


def period_us(stage_us: Sequence[float], m: int, hop_us: float, return_us: float) -> float:
    return max(m * max(stage_us), round_trip_us(stage_us, hop_us, return_us))


def throughput_tok_s(stage_us: Sequence[float], m: int, batch: int, hop_us: float = 0.0,
                     return_us: float = 0.0) -> float:
    return m * batch / period_us(stage_us, m, hop_us, return_us) * 1e6


def bubbles(stage_us: Sequence[float], m: int, hop_us: float = 0.0,
            return_us: float = 0.0) -> tuple[float, ...]:
    P = period_us(stage_us, m, hop_us, return_us)
    return tuple(1 - m * t / P for t in stage_us)


def period_held_us(stage_us: Sequence[float], m: int, slots: int, depth: int,
                   hop_us: float = 0.0, return_us: float = 0.0) -> float:
    """Period with the last rank's held token send (depth > 0), `m` micro-batches evenly spaced
    `slots // m >= 2` apart: max(m * max T, R, (R - T_last) / (1 - k / m)), k = depth // gap."""
    if m < 1 or slots % m:
        raise ValueError(f"{m} micro-batches cannot be evenly spaced over {slots} slots")
    g = slots // m
    if g < 2 and m > 1:
        raise ValueError("adjacent micro-batches: no closed form (the next slot's tokens gate "
                         "each forward)")
    R = round_trip_us(stage_us, hop_us, return_us)
    k = depth // g if m > 1 else 0
    held = (R - stage_us[-1]) / (1 - k / m) if k else R
    return max(m * max(stage_us), R, held)
