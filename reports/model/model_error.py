"""The model's own error on a cause's size, measured in the lab, added to a change's intervals.

A cause's growth against a baseline (reports/model/compare.py) is the model's answer to "how
much slower did this cause make the server". Its window interval (the traced windows resampled,
reports/model/observed/resample.py) holds the windows' sampling noise only. On the lab's rounds
(`ppscope sglang-lab --sizes --rounds N`), where the fault and its measured slowdown are known,
the model's size was off by far more than that noise: host delays came out smaller than the
measured slowdown, the slow stage larger (docs/BENCHMARKS.md section 21). This module keeps
that error as a record, `configs/records/model-error.json`, written by
`python -m reports.lab.calibration OUT... --model-error FILE`: per cause, the ratios
measured slowdown / modelled growth over the lab's fault cases, and the central LEVEL of them.

A growth interval [lo, hi] (ms per step, window noise only) then becomes
[min(lo, lo x r_lo), max(hi, hi x r_hi)] for a growing cause (r: the cause's ratio band; the
pooled band of every calibrated cause for one the lab never injected), mirrored for a shrinking
one: a prediction interval for what the benchmark will measure, as wide as the model was wrong
in the lab. What it cannot hold: an error of another kind than the lab's faults (another model,
a GPU server's own mechanisms) — the report says where the band was measured.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from reports.base.lab_record import central, read_checked
from reports.base.paths import CONFIGS

RECORD = "model-error.json"
POOLED = "pooled"


@dataclass(frozen=True)
class CauseError:
    """Measured slowdown / modelled growth over the lab's cases of one cause."""
    cause: str
    cases: int
    ratio_lo: float           # the central `level` of the ratios: its low end
    ratio_hi: float
    ratio_median: float


@dataclass(frozen=True)
class ModelError:
    level: float
    measured_on: str          # where the lab ran (machine, server, rounds)
    command: str
    causes: tuple[CauseError, ...]

    def band(self, cause: str) -> tuple[CauseError | None, bool]:
        """(the cause's band, whether it is the cause's own); the pooled band otherwise."""
        by = {c.cause: c for c in self.causes}
        if cause in by:
            return by[cause], True
        return by.get(POOLED), False

    def to_dict(self) -> dict:
        return {"kind": "ppscope-model-error", **asdict(self)}

    @classmethod
    def from_dict(cls, d) -> ModelError:
        if not isinstance(d, dict) or d.get("kind") != "ppscope-model-error":
            raise ValueError("not a ppscope model-error record")
        causes = []
        for c in d.get("causes") or ():
            e = CauseError(str(c["cause"]), int(c["cases"]), float(c["ratio_lo"]),
                           float(c["ratio_hi"]), float(c["ratio_median"]))
            if not (0 < e.ratio_lo <= e.ratio_median <= e.ratio_hi and
                    math.isfinite(e.ratio_hi) and e.cases > 0):
                raise ValueError(f"cause {e.cause!r}: ratios must be 0 < lo <= median <= hi")
            causes.append(e)
        level = float(d["level"])
        if not 0 < level < 1:
            raise ValueError(f"level {level} is not in (0, 1)")
        return cls(level, str(d["measured_on"]), str(d["command"]), tuple(causes))


def band_of(cause: str, ratios: list[float], level: float) -> CauseError:
    """The central `level` of the ratios, with their median (reports/base/lab_record.py)."""
    lo, med, hi = central(ratios, level)
    return CauseError(cause, len(ratios), round(lo, 3), round(hi, 3), round(med, 3))


def read(path: Path) -> ModelError:
    return read_checked(path, ModelError.from_dict)


@lru_cache(maxsize=1)
def shipped() -> ModelError | None:
    """The record shipped in configs/records/ (None where there is none)."""
    path = CONFIGS / "records" / RECORD
    return read(path) if path.exists() else None


def widened(cause: str, ci: tuple[float, float], err: ModelError | None
            ) -> tuple[tuple[float, float], bool]:
    """The growth interval with the model's error added, and whether the cause's own band
    was used (False: the pooled band, or none: the interval unchanged)."""
    band, own = err.band(cause) if err is not None else (None, False)
    lo, hi = ci
    if band is None:
        return ci, False
    if lo >= 0:
        return (min(lo, lo * band.ratio_lo), max(hi, hi * band.ratio_hi)), own
    if hi <= 0:
        return (min(lo, lo * band.ratio_hi), max(hi, hi * band.ratio_lo)), own
    return (lo * band.ratio_hi, hi * band.ratio_hi), own
