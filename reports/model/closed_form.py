"""DESIGN.md's closed forms for a PP decode loop with `m` equal micro-batches in flight.

Round trip of one micro-batch `R = sum_i T_i + (p-1)*c + h` (stage forwards, p-1 hidden-state
hops of `c`, the last->first token hop `h`); period of the loop `P = max(m * max_i T_i, R)`;
throughput `m * B / P` tokens per period; stage `i` bubble `1 - m * T_i / P`.
They hold with no host costs; the simulator (`reports/model/pipeline_model.py`) is tested against them.
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
