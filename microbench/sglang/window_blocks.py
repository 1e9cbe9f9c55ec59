"""The traced window cut into blocks of consecutive rounds, for the report's intervals.

The loop profile feeds the model means (host work per visit, forward time by micro-batch size,
hop per link ...). How sure those means are is a question about the window's own variation,
and neighbouring visits are correlated (a slow stretch of the host slows several rounds in a
row), so single visits must not be resampled one by one. The window is cut instead into
`count` blocks of equal wall time, the same edges on every rank (one host, one clock; a few ms
of offset between hosts is small against a block), and each block keeps, per quantity, the sum
of its samples and their number. The report resamples whole blocks (a block bootstrap:
reports/model/observed/resample.py) and rebuilds each mean as sum over count of the blocks it
drew, so a replicate keeps every rank of one stretch of time together.

A sample is `(t_us, value)`: t is when the visit (or the arrival, for a hop) happened on the
trace's clock.
"""
from __future__ import annotations

import bisect

# at most this many blocks; fewer when the window has few rounds (at least MIN_ROUNDS rounds of
# the slot loop in each), none below MIN_BLOCKS (the report then says the window is too short)
MAX_BLOCKS = 20
MIN_BLOCKS = 6
MIN_ROUNDS = 2


def block_count(rounds: int) -> int:
    """Blocks for a window of `rounds` rounds of the slot loop (0: too short for blocks)."""
    k = min(MAX_BLOCKS, rounds // MIN_ROUNDS)
    return k if k >= MIN_BLOCKS else 0


def edges(t0: float, t1: float, count: int) -> list[float]:
    """The inner edges of `count` blocks of equal wall time over [t0, t1]."""
    return [t0 + (t1 - t0) * k / count for k in range(1, count)]


def sums(samples: list[tuple[float, float]], inner: list[float]) -> list[list[float]]:
    """[[sum, n], ...] per block, for samples placed by their time."""
    out = [[0.0, 0] for _ in range(len(inner) + 1)]
    for t, v in samples:
        k = bisect.bisect_right(inner, t)
        out[k][0] += float(v)
        out[k][1] += 1
    return [[round(s, 3), n] for s, n in out]


def cut(rank_samples: dict, hop_samples: dict, rounds: int) -> tuple[int, dict, dict]:
    """(count, rank -> quantity -> blocks, link -> blocks). `rank_samples`: rank -> quantity ->
    samples; `hop_samples`: "a->b" -> samples; `rounds`: rounds of the slot loop the window
    ran (its decode visits on one rank over the slots it has). Empty when too short."""
    count = block_count(rounds)
    times = [t for qs in rank_samples.values() for s in qs.values() for t, _ in s]
    if not count or len(times) < 2:
        return 0, {}, {}
    inner = edges(min(times), max(times), count)
    per_rank = {r: {q: sums(s, inner) for q, s in qs.items() if s}
                for r, qs in rank_samples.items()}
    hops = {link: sums(s, inner) for link, s in hop_samples.items() if s}
    return count, per_rank, hops


def attach(loop: dict, rounds: int) -> None:
    """Replace the `_samples` a loop-profile pass left on its ranks and hops (a dict as
    cpu_steps/steps build it) with their blocks, and set `block_count`."""
    rs = {r: d.pop("_samples", None) or {} for r, d in loop["ranks"].items()}
    hs = {k: h.pop("_samples", None) or [] for k, h in loop["hops"].items()}
    for d in loop["ranks"].values():
        d.pop("_rounds", None)
    count, per_rank, hops = cut(rs, hs, rounds)
    loop["block_count"] = count
    for r, d in loop["ranks"].items():
        if per_rank.get(r):
            d["blocks"] = per_rank[r]
    for k, h in loop["hops"].items():
        if hops.get(k):
            h["blocks"] = hops[k]
