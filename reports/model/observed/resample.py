"""How sure the diagnosis is: intervals from the evidence's own variation.

Two sources of variation, each resampled as what it is:

- **The traced window** (a block bootstrap). The reader cut the window into blocks of equal
  wall time and kept, per rank and per quantity the model takes (host work per visit, the
  forward by micro-batch size, each hop ...), the sum and count of its samples in each block
  (microbench/sglang/window_blocks.py). A replicate draws as many blocks as there are, with
  replacement, the same blocks on every rank (one stretch of time stays whole: neighbouring
  visits are correlated, single visits are not resampled), and shifts each of the model's
  inputs by its replicate mean less its whole-window mean. Every figure the model gives (each
  cause's ms per step and size, the modelled step) is computed again per replicate; its
  interval is the replicates' central LEVEL (percentiles). Efron & Tibshirani, *An
  Introduction to the Bootstrap* (1993), ch. 13 (percentile intervals); Kunsch (1989) for
  blocks of a dependent series.
- **The benchmark runs** (bench_serving, one tok/s per run at the traced C): the mean of the
  runs, with Student's t interval (runs are few and independent; pyperf reports the same
  mean +- spread over runs). One run gives no interval: its spread is unknown.

The replicates are drawn from a fixed seed, so one report's figures never change from one run
of ppscope to the next (and the disk cache can never change them either).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from statistics import mean, stdev

LEVEL = 0.90          # the intervals' nominal coverage
REPLICATES = 100      # bootstrap replicates of the traced window
SEED = 20261207

# Student's t, two-sided 90% (the 0.95 quantile), by degrees of freedom 1..30; above: normal
_T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782,
        1.771, 1.761, 1.753, 1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711,
        1.708, 1.706, 1.703, 1.701, 1.699, 1.697)

Blocks = tuple[tuple[float, int], ...]     # [sum, samples] per block


@dataclass(frozen=True)
class WindowBlocks:
    """The window's blocks as the Deployment needs them: per rank (in rank order) quantity ->
    blocks; per hop (in hop_us order) its blocks, () where the reader kept none."""
    count: int
    ranks: tuple[dict[str, Blocks], ...]
    hops: tuple[Blocks, ...]


def t95(df: int) -> float:
    return _T95[df - 1] if df <= len(_T95) else 1.645


def runs_interval(values) -> tuple[float, float] | None:
    """Student's t interval (LEVEL) of the mean of independent runs; None under two runs."""
    v = [float(x) for x in values]
    if len(v) < 2:
        return None
    m, h = mean(v), t95(len(v) - 1) * stdev(v) / math.sqrt(len(v))
    return m - h, m + h


def percentile_interval(values) -> tuple[float, float]:
    """The central LEVEL of `values` (linear between order statistics)."""
    v = sorted(values)
    a = (1 - LEVEL) / 2

    def q(p: float) -> float:
        x = p * (len(v) - 1)
        i = int(math.floor(x))
        return v[i] if i + 1 >= len(v) else v[i] + (x - i) * (v[i + 1] - v[i])
    return q(a), q(1 - a)


def draws(count: int, n: int = REPLICATES, seed: int = SEED) -> list[tuple[int, ...]]:
    """n replicates: how many times each of `count` blocks is drawn (they sum to `count`)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        w = [0] * count
        for k in rng.choices(range(count), k=count):
            w[k] += 1
        out.append(tuple(w))
    return out


def _mean(b: Blocks, w) -> float | None:
    den = sum(wk * n for wk, (_, n) in zip(w, b))
    return sum(wk * s for wk, (s, _) in zip(w, b)) / den if den else None


def _shift(b: Blocks | None, w) -> float:
    """The replicate's mean less the whole window's (0 where the replicate drew no sample)."""
    if not b:
        return 0.0
    rep, n = _mean(b, w), sum(k for _, k in b)
    return 0.0 if rep is None or not n else rep - sum(x for x, _ in b) / n


# Deployment field (a per-rank tuple) -> the window quantity whose variation it takes
_PER_RANK = {"host_us": "host", "empty_us": "host_empty", "relay_us": "relay_wait",
             "empty_relay_us": "relay_empty", "sync_wait_us": "sync_wait",
             "send_wait_us": "send_wait", "send_us": "send", "process_us": "process"}


def replicate(dep, blocks: WindowBlocks, w):
    """The deployment with every input the window measured shifted to replicate `w`'s mean
    (never below 0). Inputs the window did not sample (the micro-batch sizes, the slots, a
    figure the reader kept no blocks for) stay as they are."""
    def per_rank(field: str):
        q = _PER_RANK[field]
        vals = getattr(dep, field)
        return tuple(max(0.0, v + _shift(blocks.ranks[r].get(q), w)) if r < len(blocks.ranks)
                     else v for r, v in enumerate(vals))

    def curve(r: int, c: dict[int, float], busy: bool) -> dict[int, float]:
        b = blocks.ranks[r] if r < len(blocks.ranks) else {}
        out = {}
        for size, v in c.items():
            if busy and f"forward_busy:{size}" in b:    # GPU view: kernels + queueing
                d = _shift(b[f"forward_busy:{size}"], w) + _shift(b.get("foreign"), w)
            else:
                d = _shift(b.get(f"forward:{size}"), w)
            out[size] = max(0.0, v + d)
        return out
    kw = {f: per_rank(f) for f in _PER_RANK if len(getattr(dep, f))}
    hops = tuple(max(0.0, h + _shift(blocks.hops[k] if k < len(blocks.hops) else (), w))
                 for k, h in enumerate(dep.hop_us))
    return replace(dep, forward=tuple(curve(r, c, False) for r, c in enumerate(dep.forward)),
                   forward_busy=tuple(curve(r, c, True) for r, c in enumerate(dep.forward_busy)),
                   hop_us=hops, **kw)


def replicates(dep, n: int = REPLICATES, seed: int = SEED) -> list:
    """The deployment's bootstrap replicates ([] where its window kept no blocks)."""
    blocks = getattr(dep, "blocks", None)
    if blocks is None or not blocks.count:
        return []
    return [replicate(dep, blocks, w) for w in draws(blocks.count, n, seed)]


def blocks_of(loop, order: list[str]) -> WindowBlocks | None:
    """WindowBlocks from sglang.json's loop profile (ranks in `order`, hops r -> next)."""
    if loop is None or not getattr(loop, "block_count", 0):
        return None
    pp = len(order)
    ranks = tuple({k: tuple((float(s), int(n)) for s, n in v)
                   for k, v in loop.ranks[r].blocks.items()} for r in order)
    hops = []
    for k, r in enumerate(order):
        h = loop.hops.get(f"{r}->{order[(k + 1) % pp]}")
        hops.append(tuple((float(s), int(n)) for s, n in h.blocks) if h is not None else ())
    return WindowBlocks(int(loop.block_count), ranks, tuple(hops))
