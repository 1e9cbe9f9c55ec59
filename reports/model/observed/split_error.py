"""The layer split's own error, measured in the lab, added to its predicted gain's interval.

The split what-if (reports/model/observed/layer_split.py) predicts the gain of moving layers
between ranks; its interval is the traced window's noise (the block bootstrap) only. In the lab
(`ppscope sglang-lab --fixes`), where the split is applied to SGLang's own server and its gain
measured, the prediction missed by more than that noise: the estimate of a rank's forward after
the split, and host work that moved between the two servers (docs/BENCHMARKS.md section 24).
This module keeps that error as a record, `configs/records/split-error.json`, written by
`python -m reports.lab.fixes OUT... --split-error FILE --machine TEXT`: the differences measured
gain - predicted gain, in points of tok/s, over the lab's splits, and the central LEVEL of them.

The predicted gain's interval [lo, hi] (%) then becomes [min(lo, lo + d_lo), max(hi, hi + d_hi)]:
a range for what the server will measure, as wide as the prediction missed in the lab. Added,
not multiplied: a split the lab measured at no gain at all predicted +23% (a ratio would need a
band through zero). What it cannot hold: another model's forward shape, a GPU server's own
mechanisms; the report says where the band was measured.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from reports.base.lab_record import central, read_checked
from reports.base.paths import CONFIGS

RECORD = "split-error.json"
KIND = "ppscope-split-error"
LEVEL = 0.9


@dataclass(frozen=True)
class SplitError:
    """Measured gain - predicted gain (points of tok/s, %) over the lab's applied splits."""
    level: float
    cases: int
    points_lo: float          # the central `level` of the differences: its low end
    points_hi: float
    points_median: float
    measured_on: str
    command: str

    def to_dict(self) -> dict:
        return {"kind": KIND, **asdict(self)}

    @classmethod
    def from_dict(cls, d) -> SplitError:
        if not isinstance(d, dict) or d.get("kind") != KIND:
            raise ValueError("not a ppscope split-error record")
        e = cls(float(d["level"]), int(d["cases"]), float(d["points_lo"]),
                float(d["points_hi"]), float(d["points_median"]), str(d["measured_on"]),
                str(d["command"]))
        if not (0 < e.level < 1 and e.cases > 0
                and all(math.isfinite(x) for x in (e.points_lo, e.points_hi, e.points_median))
                and e.points_lo <= e.points_median <= e.points_hi):
            raise ValueError("split-error: level in (0, 1), cases > 0 and finite points "
                             "lo <= median <= hi")
        return e

    def where(self) -> str:
        return (f"measured gain - predicted, {self.points_lo:+.0f} to {self.points_hi:+.0f} "
                f"points over {self.cases} splits applied in the lab ({self.measured_on})")


def band_of(diffs: list[float], measured_on: str, command: str, level: float = LEVEL
            ) -> SplitError:
    """The central `level` of the differences, with their median (reports/base/lab_record.py)."""
    if not diffs:
        raise ValueError("no applied split with a predicted and a measured gain")
    lo, med, hi = central(diffs, level)
    return SplitError(level, len(diffs), round(lo, 2), round(hi, 2), round(med, 2),
                      measured_on, command)


def read(path: Path) -> SplitError:
    return read_checked(path, SplitError.from_dict)


@lru_cache(maxsize=1)
def shipped() -> SplitError | None:
    """The record shipped in configs/records/ (None where there is none)."""
    path = CONFIGS / "records" / RECORD
    return read(path) if path.exists() else None


def widened(ci: tuple[float, float] | None, err: SplitError | None
            ) -> tuple[float, float] | None:
    """The predicted gain's interval (%) with the lab's split error added (module docstring);
    unchanged where there is no interval or no record."""
    if ci is None or err is None:
        return ci
    lo, hi = ci
    return (round(min(lo, lo + err.points_lo), 1), round(max(hi, hi + err.points_hi), 1))
