"""A stand-in for nvidia-ml-py (`pynvml`) that answers from recorded samples, for the watch's CPU
tests. Only what microbench/watch/sampler.py calls, with NVML's own error codes and shapes:
`nvmlDeviceGetSamples` returns (value type, samples newer than the timestamp given) or raises
NOT_FOUND when there is none; a lost GPU raises its error code from `lost_at` on.

The samples are modelled on an H200 (driver 580): utilization samples 200 ms apart, a buffer of
about 14 s, power in mW, PCIe throughput in KB/s.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

NVML_CLOCK_SM = 1
NVML_GPU_UTILIZATION_SAMPLES = 1
NVML_MEMORY_UTILIZATION_SAMPLES = 2
NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1
MESSAGES = {3: "Not Supported", 4: "Insufficient Permissions", 6: "Not Found", 10: "Timeout",
            15: "GPU is lost", 999: "Unknown Error"}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return MESSAGES.get(self.value, f"NVML error {self.value}")


def unsupported(*_):
    raise NVMLError(3)


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    # (timestamp us, value); None: the driver has no sample buffer (NOT_SUPPORTED)
    util_samples: list[tuple[int, float]] | None = field(default_factory=list)
    mem_samples: list[tuple[int, float]] | None = field(default_factory=list)
    util_now: Callable[[float], tuple[int, int]] | None = None   # t -> (gpu %, memory %)
    power_mw: Callable[[float], int] | None = lambda t: 120_000
    sm_mhz: Callable[[float], int] | None = lambda t: 1980
    pcie_kbs: tuple[int, int] | None = (0, 0)                     # (TX, RX) KB/s
    procs: Callable[[float], list] = lambda t: []
    gen: int = 5
    width: int = 16
    buffer_len: int | None = None       # the driver keeps only this many newest samples
    lost_at: float | None = None        # wall time from which every call fails
    lost_code: int = 15
    fail: dict[str, list[float]] = field(default_factory=dict)    # call -> times it fails once


class FakeNvml:
    """Module-shaped: put it in sys.modules["pynvml"] or pass it as Watch(nv=...)."""
    NVMLError = NVMLError
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_GPU_UTILIZATION_SAMPLES = NVML_GPU_UTILIZATION_SAMPLES
    NVML_MEMORY_UTILIZATION_SAMPLES = NVML_MEMORY_UTILIZATION_SAMPLES

    def __init__(self, gpus: list[FakeGpu], clock: Callable[[], float]) -> None:
        self.gpus, self.clock = gpus, clock
        self.calls: list[tuple[str, int, tuple]] = []

    def _g(self, h: int, call: str, *args) -> FakeGpu:
        self.calls.append((call, h, args))
        g = self.gpus[h]
        now = self.clock()
        if g.lost_at is not None and now >= g.lost_at:
            raise NVMLError(g.lost_code)
        times = g.fail.get(call, [])
        if times and now >= times[0]:
            times.pop(0)
            raise NVMLError(10)
        return g

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return "580.159.04"

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self._g(h, "name").name

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-0000000{h}-fake"

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._g(h, "gen").gen

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._g(h, "width").width

    def nvmlDeviceGetSamples(self, h, sampling_type, last_seen):
        g = self._g(h, "samples", sampling_type, last_seen)
        buf = g.util_samples if sampling_type == NVML_GPU_UTILIZATION_SAMPLES else g.mem_samples
        if buf is None:
            raise NVMLError(3)
        now_us = self.clock() * 1e6
        held = [(ts, v) for ts, v in buf if ts <= now_us][-(g.buffer_len or len(buf) + 1):]
        new = [SimpleNamespace(timeStamp=ts, sampleValue=SimpleNamespace(uiVal=v))
               for ts, v in held if ts > last_seen]
        if not new:
            raise NVMLError(6)
        return 1, new            # NVML_VALUE_TYPE_UNSIGNED_INT

    def nvmlDeviceGetUtilizationRates(self, h):
        g = self._g(h, "utilization")
        if g.util_now is None:
            raise NVMLError(3)
        u, m = g.util_now(self.clock())
        return SimpleNamespace(gpu=u, memory=m)

    def nvmlDeviceGetPowerUsage(self, h):
        g = self._g(h, "power")
        if g.power_mw is None:
            raise NVMLError(3)
        return g.power_mw(self.clock())

    def nvmlDeviceGetClockInfo(self, h, clock_type):
        g = self._g(h, "sm_clock", clock_type)
        if g.sm_mhz is None:
            raise NVMLError(3)
        return g.sm_mhz(self.clock())

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        g = self._g(h, "pcie", counter)
        if g.pcie_kbs is None:
            raise NVMLError(3)
        return g.pcie_kbs[counter]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return self._g(h, "processes").procs(self.clock())


def driver_samples(t0: float, t1: float, value: Callable[[float], float],
                   period_s: float = 0.2) -> list[tuple[int, float]]:
    """The driver's buffer between wall times t0 and t1: one sample per period, stamped (us)
    at the end of its window."""
    out, k = [], 0
    while t0 + k * period_s <= t1 + 1e-9:
        t = t0 + k * period_s
        out.append((round(t * 1e6), value(t)))
        k += 1
    return out


class FakeClock:
    """A wall clock the test moves."""

    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def two_gpus(clock=None) -> "FakeNvml":
    """Two GPUs whose driver buffers read 60% and 20% from a second ago to a minute ahead (the
    CLI tests' machine)."""
    import time as _t
    clock = clock or _t.time
    now = clock()
    return FakeNvml([FakeGpu(util_samples=driver_samples(now - 1, now + 60, lambda t: 60)),
                     FakeGpu(util_samples=driver_samples(now - 1, now + 60, lambda t: 20))],
                    clock)


def sglang_args(argv):
    """`ppscope sglang ARGV` parsed as the console script parses it."""
    import argparse

    from microbench.sglang import cli as sglang_cli
    p = argparse.ArgumentParser()
    sglang_cli.register(p.add_subparsers())
    a = p.parse_args(["sglang", *argv])
    a.argv = ["ppscope", "sglang", *argv]
    return a
