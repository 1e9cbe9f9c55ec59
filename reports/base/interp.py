"""Piecewise interpolation over measured (x, y) points (linear in x, or linear in log(batch)),
shared by the probes and the model."""
from __future__ import annotations

import math
from typing import Sequence


def interp_linear(points: Sequence[tuple[float, float]], x: float) -> float:
    """Linear between points; flat below the first; the last segment's slope beyond the last
    (flat with a single point). Fits latency + size/bandwidth shapes exactly."""
    pts = sorted(points)
    if x <= pts[0][0] or len(pts) == 1:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = pts[-2], pts[-1]
    return y1 + (y1 - y0) * (x - x1) / (x1 - x0)


def interp_log(curve: tuple[tuple[int, float], ...] | list, b: float) -> float:
    """Piecewise-linear in log(batch); flat beyond the ends."""
    pts = sorted(curve)
    if b <= pts[0][0]:
        return pts[0][1]
    if b >= pts[-1][0]:
        return pts[-1][1]
    for (b0, v0), (b1, v1) in zip(pts, pts[1:]):
        if b0 <= b <= b1:
            if b1 == b0:
                return v1
            w = (math.log(b) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return v0 + w * (v1 - v0)
    return pts[-1][1]
