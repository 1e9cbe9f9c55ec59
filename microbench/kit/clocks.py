"""What the GPU's clocks did while a figure was timed (NVML, nvidia-ml-py).

A latency-bound kernel's time follows the SM clock, and the SM clock falls when the board hits
its power limit: on an H200 (700 W) the INT4 MoE layer drew the board to its limit and NVML
reported `sw_power_cap` with the SM clock at 1455-1620 MHz instead of 1980, and the same layer
took up to 11% longer from one repetition to the next (docs/BENCHMARKS.md section 8). So each
timed point records the SM clock and the limiting reasons seen while it ran (`ClockSampler`),
and a run where they fell says so beside its efficiencies.

`ClockSampler` polls NVML from a thread every `period_s` (default 10 ms; one poll is well under
a millisecond) between `start()` and `stop()`. Without NVML it records nothing and says why.
"""
from __future__ import annotations

import os
import statistics
import threading
from dataclasses import dataclass
from typing import Any

# nvmlClocksEventReasons bits (nvml.h; "throttle reasons" in older headers); idle and the
# application-clock setting are not slowdowns and are left out
REASONS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal_slowdown",
           0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown"}
CLOCK_SM = 1        # NVML_CLOCK_SM


@dataclass(frozen=True)
class ClockSummary:
    """SM clock over a timed window: median / lowest of the samples and the board's max."""
    sm_mhz_median: float | None
    sm_mhz_min: float | None
    sm_mhz_max_spec: float | None
    power_w_max: float | None
    power_limit_w: float | None
    reasons: tuple[str, ...]            # slowdown reasons NVML reported in any sample
    samples: int
    note: str | None = None             # why nothing was sampled

    def slowed(self, frac: float = 0.9) -> bool:
        """Ran below `frac` of the max SM clock (median), or a slowdown reason was reported."""
        low = (self.sm_mhz_median is not None and self.sm_mhz_max_spec is not None
               and self.sm_mhz_median < frac * self.sm_mhz_max_spec)
        return low or bool(self.reasons)

    def describe(self) -> str:
        if self.sm_mhz_median is None:
            return f"clocks not sampled ({self.note or 'no samples'})"
        s = (f"SM clock {self.sm_mhz_median:.0f} MHz median, {self.sm_mhz_min:.0f} lowest"
             + (f" of {self.sm_mhz_max_spec:.0f}" if self.sm_mhz_max_spec else ""))
        if self.power_w_max is not None:
            s += f"; power up to {self.power_w_max:.0f} W" + (
                f" of {self.power_limit_w:.0f}" if self.power_limit_w else "")
        return s + (f"; limited by {', '.join(self.reasons)}" if self.reasons else "")

    def as_record(self) -> dict[str, Any]:
        return {"sm_clock_mhz": self.sm_mhz_median, "sm_clock_min_mhz": self.sm_mhz_min,
                "sm_clock_max_mhz": self.sm_mhz_max_spec, "power_w_max": self.power_w_max,
                "clock_limits": ",".join(self.reasons) or None}


def reason_names(mask: int) -> tuple[str, ...]:
    return tuple(n for bit, n in REASONS.items() if mask & bit)


def _visible_index(device_index: int) -> int:
    """NVML index of CUDA device `device_index`: its entry in CUDA_VISIBLE_DEVICES when that
    is an integer list, else the same index."""
    vis = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if device_index < len(vis) and vis[device_index].isdigit():
        return int(vis[device_index])
    return device_index


class ClockSampler:
    """Polls one GPU's SM clock, power and slowdown reasons while started."""

    def __init__(self, device_index: int = 0, period_s: float = 0.01, nv: Any = None):
        self.period_s = period_s
        self.note: str | None = None
        self._nv, self._h = nv, None
        self._max_mhz = self._limit_w = None
        self._rows: list[tuple[float | None, float | None, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            if self._nv is None:
                import pynvml
                pynvml.nvmlInit()
                self._nv = pynvml
            self._h = self._nv.nvmlDeviceGetHandleByIndex(_visible_index(device_index))
        except Exception as e:  # noqa: BLE001 - no library / driver: figures go unlabelled
            self.note = f"NVML unavailable: {type(e).__name__}"
            self._h = None
            return
        self._max_mhz = self._try(self._nv.nvmlDeviceGetMaxClockInfo, self._h, CLOCK_SM)
        lim = self._try(self._nv.nvmlDeviceGetEnforcedPowerLimit, self._h)
        self._limit_w = lim / 1000 if lim is not None else None

    @staticmethod
    def _try(fn, *args):
        try:
            return fn(*args)
        except Exception:  # noqa: BLE001 - a counter this GPU does not have
            return None

    def _reasons(self) -> int:
        for name in ("nvmlDeviceGetCurrentClocksEventReasons",
                     "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(self._nv, name, None)
            if fn is not None:
                v = self._try(fn, self._h)
                if v is not None:
                    return int(v)
        return 0

    def sample(self) -> None:
        if self._h is None:
            return
        mhz = self._try(self._nv.nvmlDeviceGetClockInfo, self._h, CLOCK_SM)
        mw = self._try(self._nv.nvmlDeviceGetPowerUsage, self._h)
        self._rows.append((mhz, mw / 1000 if mw is not None else None, self._reasons()))

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def start(self) -> "ClockSampler":
        if self._thread is not None:    # a window left open by an exception: close it
            self._stop.set()
            self._thread.join()
            self._thread = None
        self._rows.clear()
        if self._h is not None:
            self._stop.clear()
            self.sample()
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> ClockSummary:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.sample()
        return self.summary()

    def summary(self) -> ClockSummary:
        mhz = [r[0] for r in self._rows if r[0] is not None]
        w = [r[1] for r in self._rows if r[1] is not None]
        mask = 0
        for r in self._rows:
            mask |= r[2]
        return ClockSummary(statistics.median(mhz) if mhz else None, min(mhz) if mhz else None,
                            self._max_mhz, max(w) if w else None, self._limit_w,
                            reason_names(mask), len(self._rows),
                            None if mhz else (self.note or "NVML gave no SM clock"))

    def __enter__(self) -> "ClockSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
