"""Time intervals (start, end) of trace events: union, total length, overlap. One copy for the
trace reader's busy time and the loop profile's waits."""
from __future__ import annotations

from typing import Iterable


def merge(iv: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of intervals, sorted (HTA merge_kernel_intervals)."""
    out: list[list[float]] = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def length(merged: list[tuple[float, float]]) -> float:
    """Total length of merged (disjoint) intervals."""
    return sum(e - s for s, e in merged)


def overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total overlap of two merged interval lists (one sweep)."""
    i = j = 0
    tot = 0.0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            tot += e - s
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tot
