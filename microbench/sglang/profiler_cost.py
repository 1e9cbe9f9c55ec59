"""How much slower the profiled window ran than the rest of the run, from SGLang's own log.

A loop profile's costs come from the window `/start_profile` .. `/stop_profile` opened; the
torch profiler records every op of SGLang's Python, so the traced loop runs slower than the
benchmark around it (more so on a loaded host). SGLang's `Decode batch` lines say how long each
visit took: with `--decode-log-interval 1` a line's `gen throughput` is the tokens generated
since the rank's previous decode line over the time since it (managers/scheduler_components/
metrics_reporter.py, `gap_latency`), so `#running-req / gen throughput` is one visit's time.
The rank's `Profiling starts` / `Profiling done` lines bound the window.

slowdown = sum over the window's lines of the median visit time at that line's `#running-req`
inside the window / the same outside it (both on the same rank, sizes seen at least `MIN_LINES`
times outside), over the same sum with the outside medians: 1.0 = the window ran at the
benchmark's speed. None without a window or without matching lines outside it.

Its interval (`SlowdownReader.interval`): a block bootstrap of the same ratio. Each (rank,
inside or outside, #running-req) group's visit times are cut, in log order, into blocks of
about sqrt(n) consecutive lines (neighbouring visits share the host's state, so single lines
would understate the spread); a replicate draws each group's blocks with replacement, and the
interval is the central `level` of the replicates' slowdowns.
"""
from __future__ import annotations

import math
import random
import re
from pathlib import Path
from statistics import median
from typing import Iterable, Iterator

MIN_LINES = 5
_DECODE = re.compile(r"PP(\d+)\] Decode batch, #running-req: (\d+),.*?gen throughput "
                     r"\(token/s\): ([\d.]+)")
_PROFILE = re.compile(r"PP(\d+)\] Profiling (starts|done)")


class SlowdownReader:
    """`slowdown`, fed one log line at a time (one pass over a log serves several readers:
    `window_evidence`)."""

    def __init__(self, min_lines: int = MIN_LINES) -> None:
        self.min_lines = min_lines
        self.inside: dict[str, bool] = {}
        self.dt: dict[tuple[str, bool, int], list[float]] = {}

    def feed(self, ln: str) -> None:
        m = _PROFILE.search(ln)
        if m:
            self.inside[m.group(1)] = m.group(2) == "starts"
            return
        m = _DECODE.search(ln)
        if m is None:
            return
        r, bs, thr = m.group(1), int(m.group(2)), float(m.group(3))
        if thr > 0 and bs > 0:
            self.dt.setdefault((r, self.inside.get(r, False), bs), []).append(bs / thr)

    def _pairs(self) -> list[tuple[list[float], list[float]]]:
        """(inside, outside) visit times of every rank and size seen in both."""
        out = []
        for (r, ins, bs), v in self.dt.items():
            outside = self.dt.get((r, False, bs))
            if ins and outside and len(outside) >= self.min_lines:
                out.append((v, outside))
        return out

    def result(self) -> float | None:
        return _ratio(self._pairs())

    def interval(self, level: float, replicates: int, seed: int) -> tuple[float, float] | None:
        """The slowdown's central `level` interval (module docstring); None where there is
        no slowdown or fewer than 2 lines inside the window."""
        pairs = self._pairs()
        if not pairs or sum(len(v) for v, _ in pairs) < 2:
            return None
        import numpy as np
        rng = random.Random(seed)
        got = [x for x in (_ratio([(_redraw(v, rng), _redraw(o, rng)) for v, o in pairs])
                           for _ in range(replicates)) if x is not None]
        if not got:
            return None
        a = 100 * (1 - level) / 2          # linear between order statistics, numpy's default
        lo, hi = np.percentile(got, [a, 100 - a])
        return float(lo), float(hi)


def _ratio(pairs: list[tuple[list[float], list[float]]]) -> float | None:
    num = sum(len(v) * median(v) for v, _ in pairs)
    den = sum(len(v) * median(o) for v, o in pairs)
    return num / den if den else None


def _redraw(values: list[float], rng: random.Random) -> list[float]:
    """As many values, drawn as whole blocks of about sqrt(n) consecutive ones."""
    n = len(values)
    size = max(1, math.isqrt(n))
    blocks = [values[i:i + size] for i in range(0, n, size)]
    out: list[float] = []
    while len(out) < n:
        out += blocks[rng.randrange(len(blocks))]
    return out[:n]


def slowdown(lines: Iterable[str], min_lines: int = MIN_LINES) -> float | None:
    """The profiled window's slowdown (module docstring) from a log's lines."""
    reader = SlowdownReader(min_lines)
    for ln in lines:
        reader.feed(ln)
    return reader.result()


def log_lines(paths: Iterable[str | Path]) -> Iterator[str]:
    """The given log files' lines, in order (plain text, undecodable bytes replaced); opening
    or reading a file raises OSError."""
    for p in paths:
        with open(p, "rb") as f:
            for raw in f:
                yield raw.decode("utf-8", "replace")


def window_evidence(paths: Iterable[str | Path], level: float = 0.90, replicates: int = 100,
                    seed: int = 0) -> tuple[float | None, tuple[float, float] | None, list[dict]]:
    """The profiled window's slowdown, its interval and the bursts of admission outside it
    (microbench/sglang/arrival_bursts.py), in one pass over the given logs (plain text;
    unreadable: None, None and [])."""
    from microbench.sglang.arrival_bursts import BurstReader
    slow, bursts = SlowdownReader(), BurstReader()
    try:
        for ln in log_lines(paths):
            slow.feed(ln)
            bursts.feed(ln)
    except OSError:
        return None, None, []
    return slow.result(), slow.interval(level, replicates, seed), bursts.result()
