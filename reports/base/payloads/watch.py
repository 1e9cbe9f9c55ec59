"""`watch.json`: every visible GPU sampled through NVML while the user's load runs
(`ppscope sglang --watch SECONDS`, microbench/sglang/watch.py).

Self-contained so it can sit on its own in `results/watch.json` or inside another record.
One `GpuSeries` per GPU, its series as parallel tuples: entry i of every tuple is the sampler's
tick i for that GPU (`t_s`, seconds from the watch's start), `None` where the value was not read
(counter unsupported, a transient NVML error, a PCIe reading not taken on that tick, or the
driver's utilization buffer not read yet in a partial record). A lost GPU's series stops at the
tick it was lost.

What each number is (NVML's definitions, not ours):
- `util_pct`: share of the driver's sample period (`util_period_ms`; 200 ms measured on an H200)
  during which at least one kernel was running. Not SM occupancy: a GPU spinning in an NCCL
  receive kernel reads 100%. From the driver's sample buffer (`util_source` "sample_buffer",
  nvmlDeviceGetSamples) where it has one: the value at a tick is the mean of the driver samples
  that ended since the previous tick, else the last one (the window that ended most recently);
  otherwise nvmlDeviceGetUtilizationRates at the tick ("instantaneous", same windows).
- `mem_util_pct`: the same for device-memory reads/writes.
- `power_w`: nvmlDeviceGetPowerUsage; NVML documents it as averaged over about 1 s on Ampere
  (other than GA100) and newer GPUs, instantaneous on older ones.
- `sm_mhz`: SM clock (nvmlDeviceGetClockInfo, NVML_CLOCK_SM).
- `pcie_tx_gbps` / `pcie_rx_gbps`: nvmlDeviceGetPcieThroughput, NVML's "KB/s" (taken as 1024
  bytes) measured by the driver over a 20 ms window per call, so a reading is a 20 ms snapshot,
  not an average over the tick; GB = 1e9 bytes. TX = out of the GPU. Host traffic and P2P over
  PCIe only: GPU-to-GPU traffic over NVLink does not appear here. It reads above the payload:
  under back-to-back pinned host-to-GPU copies on an H200, 59.9 GB/s RX while 54.2 GB/s of data
  was copied (+10%; +8% if NVML's KB were 1000 bytes), presumably PCIe packet overhead.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from reports.base.schema import SchemaError, between, ge

SERIES = ("t_s", "util_pct", "mem_util_pct", "power_w", "sm_mhz", "pcie_tx_gbps",
          "pcie_rx_gbps")


@dataclass(frozen=True)
class GpuProcess:
    pid: int = ge(0)
    used_mib: float | None = ge(0, default=None)
    name: str | None = None             # /proc/PID/comm where this host can read it


@dataclass(frozen=True)
class ProcessSnapshot:
    """The compute processes on a GPU from `t_s` on (written when the set of pids changes)."""
    t_s: float = ge(0)
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class GpuSeries:
    index: int = ge(0)                  # NVML index
    name: str = ""
    uuid: str | None = None
    pci_bus_id: str | None = None
    pcie_gen_max: int | None = ge(0, default=None)     # link maximum (GPU and slot), NVML
    pcie_width_max: int | None = ge(0, default=None)
    util_source: Literal["sample_buffer", "instantaneous", "none"] = "none"
    util_period_ms: float | None = ge(0, default=None)  # median gap between driver samples
    t_s: tuple[float, ...] = ge(0, default=())
    util_pct: tuple[float | None, ...] = between(0, 100, default=())
    mem_util_pct: tuple[float | None, ...] = between(0, 100, default=())
    power_w: tuple[float | None, ...] = ge(0, default=())
    sm_mhz: tuple[float | None, ...] = ge(0, default=())
    pcie_tx_gbps: tuple[float | None, ...] = ge(0, default=())
    pcie_rx_gbps: tuple[float | None, ...] = ge(0, default=())
    processes: tuple[ProcessSnapshot, ...] = ()
    lost_at_s: float | None = ge(0, default=None)       # NVML said GPU lost / unknown error
    lost_reason: str | None = None
    unsupported: dict[str, str] = field(default_factory=dict)  # counter -> what NVML said
    errors: dict[str, int] = ge(0, default_factory=dict)       # counter -> transient failures

    def __post_init__(self) -> None:
        n = len(self.t_s)
        for f in SERIES[1:]:
            if len(getattr(self, f)) != n:
                raise SchemaError(f"gpus[GPU {self.index}].{f}: {len(getattr(self, f))} values "
                                  f"for {n} ticks (the series are parallel)")


@dataclass(frozen=True)
class WatchData:
    SCHEMA_VERSION: ClassVar[int] = 1
    source: Literal["nvml", "dcgm"] = "nvml"
    requested_hz: float = ge(0, default=0.0)
    achieved_hz: float | None = ge(0, default=None)     # ticks / wall time of the watch
    duration_s: float = ge(0, default=0.0)
    ticks: int = ge(0, default=0)
    late_ticks: int = ge(0, default=0)                  # ticks that started over a period late
    started_utc: str = ""
    # The sampler's own cost: CPU time of its threads (sampling, PCIe, record writes) over the
    # watch's wall time, in % of one core; `cpu_s` splits it. Thread CPU time, so a load running
    # in the same process (the live probe) is not counted.
    cpu_pct_of_core: float | None = ge(0, default=None)
    cpu_s: dict[str, float] = ge(0, default_factory=dict)
    call_us: dict[str, float] = ge(0, default_factory=dict)    # mean wall time per NVML call
    pcie_every_s: float | None = ge(0, default=None)   # each GPU's PCIe TX+RX read this often
    processes_every_s: float | None = ge(0, default=None)
    buffer_every_s: float | None = ge(0, default=None)  # driver sample buffer read this often
    load: str | None = None             # what ran during the watch, when ppscope ran it
    dcgm_note: str | None = None        # DCGM bindings found but not used, and why
    notes: tuple[str, ...] = ()
    gpus: tuple[GpuSeries, ...] = ()

    @property
    def lost_gpus(self) -> dict[int, float]:
        return {g.index: g.lost_at_s for g in self.gpus if g.lost_at_s is not None}

    @property
    def unsupported_counters(self) -> dict[str, tuple[int, ...]]:
        """counter -> GPUs whose driver said it cannot give it."""
        out: dict[str, list[int]] = {}
        for g in self.gpus:
            for c in g.unsupported:
                out.setdefault(c, []).append(g.index)
        return {c: tuple(v) for c, v in out.items()}

