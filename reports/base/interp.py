"""Piecewise-linear interpolation over measured (x, y) points, shared by the probes and the model."""
from __future__ import annotations

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
