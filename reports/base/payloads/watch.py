"""`watch.json`: every visible GPU sampled through NVML, and through DCGM's profiling fields where
`dcgmi` runs, while the user's load runs (`ppscope sglang --watch SECONDS`,
microbench/watch/sampler.py).

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

DCGM's profiling fields (`dcgmi dmon`; empty tuples where DCGM was not used, `None` at a tick
where DCGM printed N/A or had no row recent enough). DCGM's definitions (dcgm_fields.h), each
averaged by DCGM over its sampling period (`WatchSource.dcgm_period_ms`); a tick holds the mean
of the rows that arrived since the previous tick, else the last row if it is at most two
periods old:
- `sm_active` (field 1002, ratio 0..1): the share of SM-cycles with at least one warp resident,
  over all SMs. Not NVML's "a kernel ran": an NCCL receive kernel spinning on a few SMs reads
  low here, 100% in `util_pct`.
- `sm_occupancy` (1003, ratio 0..1): resident warps over the SMs' maximum, per elapsed cycle.
- `dram_active` (1005, ratio 0..1): share of cycles the device-memory interface was busy.
- `pcie_tx_bytes_per_s` / `pcie_rx_bytes_per_s` (1009/1010): PCIe bytes per second, header and
  payload, TX = out of the GPU (device-to-host copies show in TX).
- `nvlink_tx_bytes_per_s` / `nvlink_rx_bytes_per_s` (1011/1012): the same over all NVLinks.

`WatchData.source` says which counters came from NVML and which from DCGM; `dcgm_note` says, in
one line, why DCGM's counters are not in the record when they are not.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from reports.base.schema import SchemaError, between, ge

SERIES = ("t_s", "util_pct", "mem_util_pct", "power_w", "sm_mhz", "pcie_tx_gbps",
          "pcie_rx_gbps")
NVML_COUNTERS = SERIES[1:]
# DCGM profiling field id -> the GpuSeries series it fills (ids: dcgm_fields.h, NVIDIA/DCGM)
DCGM_FIELDS = {1002: "sm_active", 1003: "sm_occupancy", 1005: "dram_active",
               1009: "pcie_tx_bytes_per_s", 1010: "pcie_rx_bytes_per_s",
               1011: "nvlink_tx_bytes_per_s", 1012: "nvlink_rx_bytes_per_s"}
DCGM_SERIES = tuple(DCGM_FIELDS.values())


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
    # DCGM profiling fields, on the same ticks (module docstring); () where DCGM was not used
    sm_active: tuple[float | None, ...] = between(0, 1, default=())
    sm_occupancy: tuple[float | None, ...] = between(0, 1, default=())
    dram_active: tuple[float | None, ...] = between(0, 1, default=())
    pcie_tx_bytes_per_s: tuple[float | None, ...] = ge(0, default=())
    pcie_rx_bytes_per_s: tuple[float | None, ...] = ge(0, default=())
    nvlink_tx_bytes_per_s: tuple[float | None, ...] = ge(0, default=())
    nvlink_rx_bytes_per_s: tuple[float | None, ...] = ge(0, default=())
    dcgm_rows: int = ge(0, default=0)   # dmon rows read for this GPU
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
        for f in DCGM_SERIES:
            if len(getattr(self, f)) not in (0, n):
                raise SchemaError(f"gpus[GPU {self.index}].{f}: {len(getattr(self, f))} values "
                                  f"for {n} ticks (a DCGM series is empty or parallel)")

    def has(self, series: str) -> bool:
        """True when the series holds at least one value."""
        return any(v is not None for v in getattr(self, series))


@dataclass(frozen=True)
class WatchSource:
    """Where the record's counters came from. `nvml` and `dcgm` name GpuSeries series; a DCGM
    field asked for but N/A on every GPU throughout is in `dcgm_unavailable`, not in `dcgm`."""
    nvml: tuple[str, ...] = NVML_COUNTERS
    dcgm: tuple[str, ...] = ()
    dcgm_unavailable: tuple[str, ...] = ()
    dcgm_command: tuple[str, ...] = ()          # the dcgmi command line run, when it was
    dcgm_period_ms: int | None = ge(1, default=None)  # dmon -d
    dcgm_rows: int = ge(0, default=0)           # data rows parsed, all GPUs
    dcgm_skipped_lines: int = ge(0, default=0)  # lines not understood, or cut at the byte cap
    dcgm_errors: tuple[str, ...] = ()           # error lines dcgmi printed (first few, cut)
    dcgm_exit_code: int | None = None           # None: still running when the watch ended


@dataclass(frozen=True)
class WatchData:
    SCHEMA_VERSION: ClassVar[int] = 1
    # WatchSource; a record from before DCGM support holds the string "nvml" (read as
    # WatchSource(), every counter from NVML)
    source: WatchSource | Literal["nvml", "dcgm"] = field(default_factory=WatchSource)
    requested_hz: float = ge(0, default=0.0)
    achieved_hz: float | None = ge(0, default=None)     # ticks / wall time of the watch
    duration_s: float = ge(0, default=0.0)
    ticks: int = ge(0, default=0)
    late_ticks: int = ge(0, default=0)                  # ticks that started over a period late
    started_utc: str = ""
    # The sampler's own cost: CPU time of its threads (sampling, PCIe, record writes, the dmon
    # reader `dcgm`) and of the dcgmi process (`dcgmi`; not DCGM's host engine) over the
    # watch's wall time, in % of one core; `cpu_s` splits it. Thread CPU time, so a load running
    # in the same process (the live probe) is not counted.
    cpu_pct_of_core: float | None = ge(0, default=None)
    cpu_s: dict[str, float] = ge(0, default_factory=dict)
    call_us: dict[str, float] = ge(0, default_factory=dict)    # mean wall time per NVML call
    pcie_every_s: float | None = ge(0, default=None)   # each GPU's PCIe TX+RX read this often
    processes_every_s: float | None = ge(0, default=None)
    buffer_every_s: float | None = ge(0, default=None)  # driver sample buffer read this often
    load: str | None = None             # what ran during the watch, when ppscope ran it
    dcgm_note: str | None = None        # one line: why DCGM's counters are not in the record
    notes: tuple[str, ...] = ()
    gpus: tuple[GpuSeries, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.source, str):   # an older record: NVML only
            object.__setattr__(self, "source", WatchSource())

    @property
    def dcgm_used(self) -> bool:
        return bool(self.source.dcgm)

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

