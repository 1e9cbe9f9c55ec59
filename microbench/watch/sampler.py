"""Watch every visible GPU through NVML while the user's load runs: the `nvidia-smi dmon` view,
kept as a record (`results/watch.json`, payload `reports/base/payloads/watch.py`) and as Perfetto
counter tracks (`results/watch.trace.json`, one track per GPU per metric).

    ppscope sglang --watch 60                        # sample 60 s beside your own benchmark
    ppscope sglang --url http://127.0.0.1:30000 --watch   # the watch covers the live load
    python -m microbench.bench.watch --seconds 20  # the sampler's own rate and CPU cost

What is sampled and how often (the definitions are NVML's; the payload module says what each
number means):
- every tick (`--watch-hz`, default 10): power (nvmlDeviceGetPowerUsage) and SM clock; GPU and
  memory utilization from nvmlDeviceGetUtilizationRates only where the driver has no sample
  buffer.
- GPU and memory utilization from the driver's own sample buffer (nvmlDeviceGetSamples with
  NVML_GPU_UTILIZATION_SAMPLES / NVML_MEMORY_UTILIZATION_SAMPLES), read every few seconds from
  the last timestamp seen: every window the driver measured is kept with the driver's timestamp,
  none is lost between ticks or counted twice. Reading it is dear (about 2.8 ms of CPU per call
  on an H200, measured) and its span is finite (71 samples 200 ms apart, 14 s, on an H200), so
  it is read every 0.8 of its span (2 to 10 s); a gap between the last sample seen and
  the next (the buffer overran) is marked unknown, noted, and the reads come twice as often.
  (One call with a preallocated array does not help: the size query costs 24 us, the copy the
  rest.)
- PCIe TX/RX (nvmlDeviceGetPcieThroughput) in a thread of its own: each call blocks for the
  driver's 20 ms counting window (21 ms wall, 0.9 ms CPU measured on an H200), so 8 GPUs x 2
  directions cannot sit inside a 100 ms tick. Each GPU is read every `pcie_every_s` (default
  2 s, or n_gpus / 2 s beyond 4 GPUs, so the PCIe reads cost at most ~0.4% of a core).
- the compute processes on each GPU every `processes_every_s` (2 s), kept when the set changes.

Its own cost is measured, not assumed: CPU time of its threads (and of dcgmi, when it ran; not
DCGM's host engine) over the watch's wall time (`cpu_pct_of_core`), mean wall time per NVML
call (`call_us`), ticks achieved per second. On
2 H200s (driver 580) at 10 Hz: 10.0 Hz achieved, 0.50% of one core over 30 s idle (0.29%
sampling, 0.21% PCIe), 0.46% under a matmul load; at 50 Hz, 49.9 Hz and 1.1%. Per GPU-second at
10 Hz that is power + SM clock ~0.4 ms, buffer reads ~0.5 ms, PCIe ~0.9 ms (every 2 s), so 8 GPUs
(PCIe every 4 s) come to about 1% of a core: measure it with bench_watch.
Written as it goes: a `partial` record after 5 s, then each time the watch has doubled (a write
costs in proportion to what was sampled), `ok` at the end; Ctrl-C keeps what was sampled. A GPU that NVML calls
lost (GPU is lost / unknown error) is marked lost from that moment while the others go on; a
counter the driver does not support is recorded once as unsupported, not as an error.

DCGM (`--watch-source auto|nvml|dcgm`, default auto): where `dcgmi` is on PATH, `dcgmi dmon`
runs beside the NVML sampler (microbench/watch/dcgm.py, no DCGM Python bindings needed) for
DCGM's profiling fields: SM active, SM occupancy, DRAM active, PCIe and NVLink bytes per second,
each averaged by DCGM over its period (the tick, at least 100 ms). Its rows land on the same
ticks as the NVML series; the record's `source` says which counters came from which. If dcgmi
is missing, exits early, prints an error (profiling not supported, another client holds the
profiling module, no host engine) or gives only N/A, the watch goes on with NVML and
`dcgm_note` says why in one line. `auto` and `dcgm` differ only when dcgmi is not on PATH
(`dcgm` is then an error). The DCGM path is tested only against a fake dcgmi that prints the
layout DCGM's own source gives (dcgm.py says where each detail comes from;
tests/test_watch_dcgm.py), never against a real DCGM host engine.

No CUDA and no torch: NVML (and dcgmi), so the watch never takes GPU memory or a context.
"""
from __future__ import annotations

import datetime as _dt
import math
import os
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from microbench.watch import dcgm as D
from reports.base.payloads.watch import (DCGM_FIELDS, DCGM_SERIES, NVML_COUNTERS, GpuProcess,
                                         GpuSeries, ProcessSnapshot, WatchData, WatchSource)

# NVML return codes (nvml.h): the sampler reads `NVMLError.value`.
NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND = 3, 4, 6
GPU_IS_LOST, UNKNOWN = 15, 999
LOST_CODES = (GPU_IS_LOST, UNKNOWN)
UNSUPPORTED_CODES = (NOT_SUPPORTED, NO_PERMISSION)

GPU_UTILIZATION_SAMPLES, MEMORY_UTILIZATION_SAMPLES = 1, 2   # nvmlSamplingType_t
PCIE_TX, PCIE_RX = 0, 1                                       # nvmlPcieUtilCounter_t
CLOCK_SM = 1
# nvmlValueType_t -> the c_nvmlValue_t member holding the sample
VALUE_FIELD = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
NVML_KB = 1024          # nvmlDeviceGetPcieThroughput's "KB/s"; the header does not say 1000 or 1024
BUFFER_READ_MAX_S = 10.0
BUFFER_READ_MIN_S = 2.0
BUFFER_READ_SHARE = 0.8     # of the buffer's span between two reads
_EMPTY = object()       # nvmlDeviceGetSamples: no sample newer than the timestamp given


@dataclass(frozen=True)
class WatchConfig:
    hz: float = 10.0
    duration_s: float | None = None      # None: until stop()
    pcie_every_s: float | None = None    # each GPU's TX+RX pair this often; None: max(2, n/2)
    processes_every_s: float = 2.0
    save_every_s: float = 5.0            # partial record; the gap doubles on long watches
    gpus: tuple[int, ...] | None = None  # NVML indices; None: every visible GPU
    load: str | None = None              # what runs beside the watch, for the record
    source: str = "auto"                 # auto | nvml | dcgm: DCGM's dmon beside NVML or not


def nvml():
    """The NVML module (nvidia-ml-py), initialised; raises with the reason it cannot be used."""
    import pynvml
    pynvml.nvmlInit()
    return pynvml


def available() -> str | None:
    """None when NVML answers with at least one GPU, else why the watch cannot run here."""
    try:
        nv = nvml()
    except ImportError:
        return "nvidia-ml-py (pynvml) is not installed"
    except Exception as e:  # noqa: BLE001 - no driver / no library: the reason is the message
        return f"NVML cannot start here ({e})"
    try:
        if nv.nvmlDeviceGetCount() < 1:
            return "NVML sees no GPU"
    finally:
        nv.nvmlShutdown()
    return None


def visible_indices(nv, env: dict[str, str] | None = None) -> tuple[tuple[int, ...], str | None]:
    """NVML indices of the GPUs the user's processes see: CUDA_VISIBLE_DEVICES (indices or
    GPU- UUIDs) when set, else every GPU NVML lists. Integer entries are taken as NVML (PCI bus)
    order, which is CUDA's order under CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    n = int(nv.nvmlDeviceGetCount())
    vis = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if vis is None:
        return tuple(range(n)), None
    out, skipped = [], []
    uuids = None
    for tok in (v.strip() for v in vis.split(",")):
        if not tok or tok == "-1":
            continue
        if tok.isdigit():
            (out if int(tok) < n else skipped).append(int(tok) if int(tok) < n else tok)
            continue
        if uuids is None:
            uuids = {_s(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i))): i
                     for i in range(n)}
        hit = [i for u, i in uuids.items() if u.startswith(tok)]
        (out if hit else skipped).append(hit[0] if hit else tok)
    note = (f"CUDA_VISIBLE_DEVICES entries not matched to an NVML GPU: {', '.join(skipped)}"
            if skipped else None)
    return tuple(dict.fromkeys(out)), note


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _proc_name(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() or None
    except OSError:  # another pid namespace, or gone
        return None


SAMPLING_TYPES = (("util", GPU_UTILIZATION_SAMPLES), ("mem", MEMORY_UTILIZATION_SAMPLES))


# ---- the driver's sample buffers ------------------------------------------------------------

class _Buffer:
    """One driver sample buffer (one GPU, one sampling type): what was read so far, and how it
    lands on the sampler's ticks."""

    def __init__(self) -> None:
        self.samples: list[tuple[int, float | None]] = []   # (driver timestamp us, value)
        self.last_seen_us = 0
        self.seed: float | None = None               # newest sample from before the watch
        self.read_until_us = 0                       # buffer read up to this wall time
        self.period_ms: float | None = None

    def prime(self, res: Any, t0_us: int) -> float | None:
        """The first read (every sample the driver holds, from timestamp 0): the newest one
        seeds the first ticks and the next read starts after it. Returns the buffer's span in
        seconds where its sampling period could be seen, else None."""
        self.last_seen_us = self.read_until_us = t0_us
        if res is _EMPTY:
            return None
        vt, samples = res
        pts = [(int(s.timeStamp), _value(s.sampleValue, vt)) for s in samples]
        if not pts:
            return None
        self.seed, self.last_seen_us = pts[-1][1], max(t0_us, pts[-1][0])
        gaps = [b2 - a for (a, _), (b2, _) in zip(pts, pts[1:]) if b2 > a]
        if not gaps:
            return None
        self.period_ms = statistics.median(gaps) / 1e3
        return (pts[-1][0] - pts[0][0]) / 1e6

    def add(self, res: Any, now_us: int) -> bool:
        """The samples of one read newer than the last one seen (lastSeenTimeStamp
        bookkeeping). True when the buffer overran since the previous read: a None sample then
        marks the windows it dropped as unknown."""
        overran = False
        if res is not _EMPTY:
            vt, samples = res
            new = sorted((int(s.timeStamp), _value(s.sampleValue, vt)) for s in samples
                         if int(s.timeStamp) > self.last_seen_us)
            if new and self.period_ms and (self.samples or self.seed is not None) and \
                    new[0][0] - self.last_seen_us > 2.5 * self.period_ms * 1e3:
                # the buffer overran since the last read: what it dropped is unknown
                self.samples.append((self.last_seen_us + round(self.period_ms * 1e3), None))
                overran = True
            self.samples += new
            if self.samples:
                self.last_seen_us = max(self.last_seen_us, self.samples[-1][0])
        self.read_until_us = now_us
        return overran

    def aligned(self, ticks_us: list[int], t0_us: int) -> list[float | None]:
        """The buffer on the ticks (`align`), from the watch's start at t0_us."""
        # windows that ended before the watch began seed the hold; they are not averaged in
        pre = 0
        while pre < len(self.samples) and self.samples[pre][0] <= t0_us:
            pre += 1
        seed = self.samples[pre - 1][1] if pre else self.seed
        return align(ticks_us, self.samples[pre:], seed, self.read_until_us)

    def period(self) -> float | None:
        """The driver's sampling period, ms: seen at the first read, else from the samples."""
        if self.samples and self.period_ms is None:
            gaps = [b - a for (a, _), (b, _) in zip(self.samples, self.samples[1:]) if b > a]
            return statistics.median(gaps) / 1e3 if gaps else None
        return self.period_ms


class _Gpu:
    """One GPU's state during a watch (written by the sampler threads only)."""

    def __init__(self, index: int, handle: Any) -> None:
        self.index, self.handle = index, handle
        self.name, self.uuid, self.pci = "", None, None
        self.gen_max = self.width_max = None
        self.t_us: list[int] = []
        self.power: list[float | None] = []
        self.sm: list[float | None] = []
        self.util_inst: list[float | None] = []
        self.mem_inst: list[float | None] = []
        self.tx: list[float | None] = []
        self.rx: list[float | None] = []
        self.buffers: dict[str, _Buffer | None] = {"util": None, "mem": None}
        self.pcie_pending: tuple[float | None, float | None] | None = None
        self.procs: list[ProcessSnapshot] = []
        self.last_pids: tuple[int, ...] | None = None
        self.unsupported: dict[str, str] = {}
        self.errors: Counter = Counter()
        self.lost_at_us: int | None = None
        self.lost_reason: str | None = None

    @property
    def alive(self) -> bool:
        return self.lost_at_us is None


def align(ticks_us: list[int], samples: list[tuple[int, float | None]], seed: float | None,
          known_until_us: int) -> list[float | None]:
    """Driver samples onto the sampler's ticks. A sample stamped T describes the window ending
    at T; at tick t the value is the mean of the samples ending in (previous tick, t], else the
    newest one before (the window that ended most recently: what nvmlDeviceGetUtilizationRates
    would have said). Ticks after the buffer's last read are None (not known yet), and so are
    ticks after a None sample (windows the buffer dropped) until the next real one."""
    out: list[float | None] = []
    j, last = 0, seed
    for t in ticks_us:
        if t > known_until_us:
            out.append(None)
            continue
        acc, gap = [], False
        while j < len(samples) and samples[j][0] <= t:
            if samples[j][1] is None:
                gap, acc = True, []
            else:
                acc.append(samples[j][1])
            j += 1
        if acc:
            last = sum(acc) / len(acc)
        elif gap:
            last = None
        out.append(last)
    return out


# ---- NVML reads -----------------------------------------------------------------------------

class NvmlReader:
    """Every NVML call the watch makes goes through `call`: a counter the driver does not
    support is recorded once, a lost GPU is marked lost from that moment, other failures are
    counted, and each NVML function's calls and wall time are kept (`call_us`)."""

    def __init__(self, nv: Any, lock: threading.Lock, clock: Callable[[], float],
                 origin_us: Callable[[], int]) -> None:
        self.nv, self.lock, self.clock, self.origin_us = nv, lock, clock, origin_us
        self.calls: dict[str, list[float]] = {}   # NVML function -> [calls, wall seconds]

    def call(self, g: _Gpu, counter: str, fn: Callable, *args, empty_ok: bool = False):
        """fn(*args); None when the counter is unsupported (recorded once), the GPU is lost
        (marked), or the call failed (counted); `_EMPTY` for NOT_FOUND when empty_ok."""
        if not g.alive or counter in g.unsupported:
            return None
        t = time.perf_counter()
        try:
            return fn(*args)
        except self.nv.NVMLError as e:
            code = getattr(e, "value", None)
            if empty_ok and code == NOT_FOUND:
                return _EMPTY
            with self.lock:
                if code in UNSUPPORTED_CODES:
                    g.unsupported.setdefault(counter, str(e) or f"NVML error {code}")
                elif code in LOST_CODES:
                    self.lose(g, str(e) or f"NVML error {code}")
                else:
                    g.errors[counter] += 1
            return None
        finally:
            c = self.calls.setdefault(getattr(fn, "__name__", counter), [0, 0.0])
            c[0] += 1
            c[1] += time.perf_counter() - t

    def lose(self, g: _Gpu, reason: str) -> None:
        if g.alive:
            g.lost_at_us = max(self.origin_us(), round(self.clock() * 1e6))
            g.lost_reason = reason

    def call_us(self) -> dict[str, float]:
        """Mean wall time per call of each NVML function, microseconds."""
        return {k: round(1e6 * v[1] / v[0], 1) for k, v in sorted(self.calls.items()) if v[0]}

    def describe(self, g: _Gpu) -> bool:
        """What is fixed: handle, name, UUID, PCI bus id, PCIe link; False when the GPU has no
        handle (gone before the watch began: lost from its start)."""
        nv = self.nv
        try:
            g.handle = nv.nvmlDeviceGetHandleByIndex(g.index)
        except nv.NVMLError as e:
            self.lose(g, f"no NVML handle: {e}")
            return False
        g.name = _s(self.call(g, "name", nv.nvmlDeviceGetName, g.handle) or "")
        u = self.call(g, "uuid", nv.nvmlDeviceGetUUID, g.handle)
        g.uuid = None if u is None else _s(u)
        pci = self.call(g, "pci_info", nv.nvmlDeviceGetPciInfo, g.handle)
        g.pci = None if pci is None else _s(getattr(pci, "busId", "")) or None
        g.gen_max = self.call(g, "pcie_link", nv.nvmlDeviceGetMaxPcieLinkGeneration, g.handle)
        g.width_max = self.call(g, "pcie_link", nv.nvmlDeviceGetMaxPcieLinkWidth, g.handle)
        return True

    def samples(self, g: _Gpu, kind: str, sampling_type: int, since_us: int):
        """nvmlDeviceGetSamples newer than since_us: (value type, samples), `_EMPTY` or None."""
        return self.call(g, f"{kind}_samples", self.nv.nvmlDeviceGetSamples, g.handle,
                         sampling_type, since_us, empty_ok=True)

    def tick(self, g: _Gpu) -> tuple:
        """One tick's readings: power (mW), SM clock (MHz) and, where the driver has no sample
        buffer, instantaneous GPU and memory utilization (%)."""
        nv = self.nv
        p = self.call(g, "power", nv.nvmlDeviceGetPowerUsage, g.handle)
        sm = self.call(g, "sm_clock", nv.nvmlDeviceGetClockInfo, g.handle, CLOCK_SM)
        util = mem = None
        if g.buffers["util"] is None or g.buffers["mem"] is None:
            u = self.call(g, "utilization", nv.nvmlDeviceGetUtilizationRates, g.handle)
            if u is not None:
                util, mem = float(u.gpu), float(u.memory)
        return p, sm, util, mem

    def pcie(self, g: _Gpu) -> tuple:
        """PCIe TX and RX, NVML's KB/s (each call blocks for the driver's 20 ms window)."""
        nv = self.nv
        tx = self.call(g, "pcie_tx", nv.nvmlDeviceGetPcieThroughput, g.handle, PCIE_TX)
        rx = self.call(g, "pcie_rx", nv.nvmlDeviceGetPcieThroughput, g.handle, PCIE_RX)
        return tx, rx

    def processes(self, g: _Gpu):
        return self.call(g, "processes", self.nv.nvmlDeviceGetComputeRunningProcesses, g.handle)


def _snapshot(ps: list, t_s: float) -> ProcessSnapshot:
    return ProcessSnapshot(t_s=t_s, processes=tuple(GpuProcess(
        pid=int(p.pid), name=_proc_name(int(p.pid)),
        used_mib=None if getattr(p, "usedGpuMemory", None) is None
        else p.usedGpuMemory / 2**20) for p in ps))


# ---- the DCGM side process ------------------------------------------------------------------

class DcgmSide:
    """`dcgmi dmon` beside the NVML sampler (microbench/watch/dcgm.py): started when the source
    allows it, its rows put on the NVML ticks, and one line saying why it was not used."""

    def __init__(self) -> None:
        self.dmon: D.Dmon | None = None
        self.period_ms: int | None = None
        self.why: str | None = None     # why dmon was not started

    def start(self, cfg: WatchConfig, nv: Any, gpus: list[_Gpu],
              clock: Callable[[], float]) -> None:
        """`dcgmi dmon` beside the NVML sampler, when the source allows it and dcgmi is here."""
        if cfg.source == "nvml":
            self.why = "DCGM not asked for (--watch-source nvml)"
            return
        exe = D.dcgmi_path()
        if exe is None:
            self.why = "dcgmi not on PATH: NVML counters only"
            return
        idx = tuple(g.index for g in gpus)
        try:
            every = tuple(range(int(nv.nvmlDeviceGetCount())))
        except Exception:  # noqa: BLE001 - name the GPUs then
            every = None
        self.period_ms = D.period_ms(cfg.hz)
        rounds = None
        if cfg.duration_s is not None:   # a backstop should this process die unseen
            rounds = math.ceil(round((cfg.duration_s + 30) * 1000 / self.period_ms, 6))
        cmd = D.command(exe, self.period_ms, None if idx == every else idx, rounds)
        dm = D.Dmon(cmd, clock=clock, gpus=idx,
                    first_row_s=max(D.FIRST_VALUE_S, 20 * self.period_ms / 1e3))
        try:
            self.dmon = dm.start()
        except OSError as e:
            self.why = f"dcgmi could not be started ({e.strerror or e}): NVML counters only"

    def stop(self, cpu: dict[str, float]) -> None:
        """Ended and reaped, whatever happened; its CPU time (and dcgmi's) into `cpu`."""
        if self.dmon is not None:
            self.dmon.stop()
            cpu["dcgm"] = self.dmon.cpu_s
            if self.dmon.child_cpu_s is not None:
                cpu["dcgmi"] = self.dmon.child_cpu_s

    def used(self) -> bool:
        return self.dmon is not None and self.dmon.n_values > 0

    def columns(self, index: int, ticks_us: list[int]) -> tuple[dict, int]:
        """GPU `index`'s DCGM fields on the ticks (a row older than two periods is None), and
        how many rows it had."""
        dm = self.dmon
        n = len(ticks_us)
        rows = dm.rows_of(index)
        max_age = 2 * self.period_ms * 1000
        cols: dict[str, tuple[float | None, ...]] = {}
        for k, (fid, name) in enumerate(DCGM_FIELDS.items()):
            vals = D.align_rows(ticks_us, [(t, v[k]) for t, v in rows], max_age)
            nd = 4 if fid in D.RATIO_FIELDS else 1    # a mean of 3-decimal ratios; bytes
            cols[name] = tuple(_r(v, nd) for v in vals[:n])
        return cols, len(rows)

    def source(self, series: list[GpuSeries], used: bool) -> WatchSource:
        """Which counter came from where, and what dcgmi did."""
        dm = self.dmon
        have = tuple(f for f in DCGM_SERIES if any(g.has(f) for g in series)) if used else ()
        return WatchSource(
            nvml=NVML_COUNTERS, dcgm=have,
            dcgm_unavailable=tuple(f for f in DCGM_SERIES if f not in have) if used else (),
            dcgm_command=tuple([Path(dm.cmd[0]).name] + dm.cmd[1:]) if dm else (),
            dcgm_period_ms=self.period_ms if dm else None,
            dcgm_rows=dm.n_rows if dm else 0, dcgm_skipped_lines=dm.skipped if dm else 0,
            dcgm_errors=tuple(dm.errors) if dm else (),
            dcgm_exit_code=dm.exit_code if dm else None)

    def why_not_used(self) -> str | None:
        """One line: why the record holds no DCGM counter."""
        dm = self.dmon
        if dm is None:
            return self.why
        if dm.why_stopped:
            return f"DCGM not used: {dm.why_stopped}"
        ended = ""
        if dm.ended_by_itself:
            code = "" if dm.exit_code is None else f" (exit code {dm.exit_code})"
            ended = f"; dcgmi ended{code}" + (f": {dm.errors[0]}" if dm.errors else "")
        if dm.n_rows:
            return f"DCGM not used: dcgmi gave only N/A{ended}"
        return f"DCGM not used: no dcgmi data row{ended}"

    def notes(self, series: list[GpuSeries], t0_us: int, end: int) -> list[str]:
        """Where DCGM's rows stopped before the watch did: dcgmi ended, a GPU stopped reporting."""
        dm = self.dmon
        out = []
        late = 2 * self.period_ms * 1000
        if dm.ended_by_itself and dm.ended_at_us is not None and dm.ended_at_us < end - late:
            code = "still running" if dm.exit_code is None else f"exit code {dm.exit_code}"
            out.append(f"dcgmi ended by itself at {max(0, dm.ended_at_us - t0_us) / 1e6:.1f}"
                       f" s ({code}): DCGM series end there")
        elif dm.why_stopped:
            out.append(f"DCGM stopped early: {dm.why_stopped}")
        for g in series:
            rows = dm.rows_of(g.index)
            if not rows:
                out.append(f"GPU {g.index}: no DCGM row")
            elif rows[-1][0] < end - late and not (dm.eof and rows[-1][0] >= dm.ended_at_us - late):
                out.append(f"GPU {g.index}: DCGM rows stopped at "
                           f"{max(0, rows[-1][0] - t0_us) / 1e6:.1f} s")
        if dm.parser.bad_cells:
            out.append(f"DCGM: {dm.parser.bad_cells} cells not a number in range (left None)")
        return out


# ---- the record -----------------------------------------------------------------------------

def gpu_series(g: _Gpu, t0_us: int, dcgm: DcgmSide | None = None) -> GpuSeries:
    """One GPU's series as the record holds them: NVML's per tick, the sample buffers aligned
    onto the ticks (else the instantaneous readings), DCGM's fields when it was used."""
    n = len(g.t_us)
    cols, n_rows = dcgm.columns(g.index, g.t_us) if dcgm is not None else ({}, 0)
    ub, mb = g.buffers["util"], g.buffers["mem"]
    util = ub.aligned(g.t_us, t0_us) if ub else g.util_inst
    mem = mb.aligned(g.t_us, t0_us) if mb else g.mem_inst
    if ub is not None:
        src = "sample_buffer"
    elif "utilization" in g.unsupported:
        src = "none"
    else:
        src = "instantaneous"
    period = ub.period() if ub else None
    return GpuSeries(
        index=g.index, name=g.name, uuid=g.uuid, pci_bus_id=g.pci,
        pcie_gen_max=g.gen_max, pcie_width_max=g.width_max,
        util_source=src, util_period_ms=None if period is None else round(period, 2),
        t_s=tuple(round((t - t0_us) / 1e6, 4) for t in g.t_us),
        util_pct=tuple(_r(v, 2) for v in util[:n]),
        mem_util_pct=tuple(_r(v, 2) for v in mem[:n]),
        power_w=tuple(_r(v, 2) for v in g.power),
        sm_mhz=tuple(g.sm),
        pcie_tx_gbps=tuple(_r(v, 5) for v in g.tx),
        pcie_rx_gbps=tuple(_r(v, 5) for v in g.rx),
        **cols, dcgm_rows=n_rows,
        processes=tuple(g.procs),
        lost_at_s=None if g.alive else round((g.lost_at_us - t0_us) / 1e6, 4),
        lost_reason=g.lost_reason,
        unsupported=dict(g.unsupported), errors=dict(g.errors))


# ---- the sampler ----------------------------------------------------------------------------

class Watch:
    """The sampler. `start()` runs it in threads; `step()`, `read_buffers()`, `read_pcie()` and
    `read_processes()` are its parts, callable directly (tests drive them with a fake clock).
    Its jobs: NVML calls (`NvmlReader`), the driver's sample buffers (`_Buffer`), `dcgmi dmon`
    beside it (`DcgmSide`), the record (`data`, `gpu_series`)."""

    def __init__(self, cfg: WatchConfig, nv: Any = None,
                 clock: Callable[[], float] = time.time,
                 on_save: Callable[[WatchData], None] | None = None) -> None:
        if not cfg.hz > 0:
            raise ValueError(f"watch rate must be > 0 Hz, got {cfg.hz}")
        self.cfg, self.clock, self.on_save = cfg, clock, on_save
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._done = threading.Event()
        self._first = threading.Event()
        self._threads: list[threading.Thread] = []
        self._cpu = {"sampling": 0.0, "pcie": 0.0, "writes": 0.0}
        self.nvml = NvmlReader(nv, self._lock, clock, lambda: self.t0_us)
        self.dcgm = DcgmSide()
        self.gpus: list[_Gpu] = []
        self.notes: list[str] = []
        self.t0_us = self.t_end_us = 0
        self.started_utc = ""
        self.ticks = self.late = 0
        self.buffer_every_s: float | None = None
        self.pcie_every_s: float | None = None

    # the NVML module and the DCGM side's state, as attributes of the watch
    nv = property(lambda self: self.nvml.nv, lambda self, v: setattr(self.nvml, "nv", v))
    dmon = property(lambda self: self.dcgm.dmon, lambda self, v: setattr(self.dcgm, "dmon", v))
    dcgm_period_ms = property(lambda self: self.dcgm.period_ms,
                              lambda self, v: setattr(self.dcgm, "period_ms", v))

    # --- setting up -------------------------------------------------------------------------
    def open(self) -> None:
        """Find the GPUs, read what is fixed (name, UUID, PCIe link), prime the sample buffers."""
        if self.nv is None:
            self.nv = nvml()
        if self.cfg.gpus is not None:
            idx, note = self.cfg.gpus, None
        else:
            idx, note = visible_indices(self.nv)
        if note:
            self.notes.append(note)
        self._rebase()
        spans = []
        for i in idx:
            g = _Gpu(i, None)
            self.gpus.append(g)
            if not self.nvml.describe(g):
                continue
            for kind, st in SAMPLING_TYPES:
                res = self.nvml.samples(g, kind, st, 0)
                if res is None:
                    continue                  # unsupported (recorded) or lost: instantaneous path
                b = _Buffer()
                span = b.prime(res, self.t0_us)
                if span is not None:
                    spans.append(span)
                g.buffers[kind] = b
        # the buffer is read every 0.8 of its span, between 2 s (a buffer not yet full after a
        # reset looks short; an overrun halves the gap anyway) and 10 s
        span = min(spans) if spans else 2 * BUFFER_READ_MAX_S
        self.buffer_every_s = max(BUFFER_READ_MIN_S,
                                  min(BUFFER_READ_MAX_S, BUFFER_READ_SHARE * span))
        self.pcie_every_s = self.cfg.pcie_every_s or max(2.0, len(self.gpus) / 2)

    # --- the parts of a tick ----------------------------------------------------------------
    def step(self, now: float | None = None) -> None:
        """One tick: power, SM clock, (instantaneous utilization), the PCIe reading taken since
        the last tick, for every GPU still there."""
        now = self.clock() if now is None else now
        t_us = round(now * 1e6)
        for g in self.gpus:
            if not g.alive:
                continue
            p, sm, util, mem = self.nvml.tick(g)
            with self._lock:
                pend, g.pcie_pending = g.pcie_pending, None
            if not g.alive:         # lost during this tick: its series stops before it
                continue
            g.t_us.append(t_us)
            g.power.append(None if p is None else p / 1e3)           # mW -> W
            g.sm.append(None if sm is None else float(sm))
            g.util_inst.append(util)
            g.mem_inst.append(mem)
            g.tx.append(None if pend is None else pend[0])
            g.rx.append(None if pend is None else pend[1])
        self.ticks += 1
        self.t_end_us = max(self.t_end_us, t_us)

    def read_buffers(self, now: float | None = None) -> None:
        """Every driver sample newer than the last one seen (lastSeenTimeStamp bookkeeping)."""
        now_us = round((self.clock() if now is None else now) * 1e6)
        for g in self.gpus:
            for kind, st in SAMPLING_TYPES:
                b = g.buffers[kind]
                if b is None or not g.alive:
                    continue
                res = self.nvml.samples(g, kind, st, b.last_seen_us)
                if res is None:
                    if f"{kind}_samples" in g.unsupported:   # stopped answering: go instantaneous
                        g.buffers[kind] = None
                        self.notes.append(f"GPU {g.index}: {kind} sample buffer stopped "
                                          "answering; instantaneous readings from then on")
                    continue
                if b.add(res, now_us):
                    self.notes.append(f"GPU {g.index}: {kind} sample buffer overran; "
                                      "the missing windows are left unknown")
                    self.buffer_every_s = max(1.0 / self.cfg.hz, self.buffer_every_s / 2)

    def read_pcie(self, g: _Gpu) -> None:
        """One PCIe TX+RX reading of one GPU (about 2 x 20 ms: the driver's counting window)."""
        tx, rx = self.nvml.pcie(g)
        if tx is None and rx is None:
            return
        with self._lock:
            g.pcie_pending = (None if tx is None else tx * NVML_KB / 1e9,
                              None if rx is None else rx * NVML_KB / 1e9)

    def read_processes(self, now: float | None = None) -> None:
        """The compute processes on each GPU, kept when the set of pids changes."""
        t_us = round((self.clock() if now is None else now) * 1e6)
        for g in self.gpus:
            ps = self.nvml.processes(g)
            if ps is None:
                continue
            pids = tuple(sorted(int(p.pid) for p in ps))
            if pids == g.last_pids:
                continue
            g.last_pids = pids
            g.procs.append(_snapshot(ps, max(0.0, (t_us - self.t0_us) / 1e6)))

    # --- threads ----------------------------------------------------------------------------
    def start(self) -> "Watch":
        if not self.gpus:
            self.open()
        self._rebase()
        self.start_dcgm()
        self._threads = [threading.Thread(target=self._tick_loop, name="ppscope-watch",
                                          daemon=True),
                         threading.Thread(target=self._pcie_loop, name="ppscope-watch-pcie",
                                          daemon=True)]
        for t in self._threads:
            t.start()
        self._first.wait(5.0)   # the first tick is taken before the caller's load begins
        return self

    def _rebase(self) -> None:
        """The watch starts now, not at open(): whatever ran in between (the file readers, a
        load's set-up) is not part of it. Driver windows that ended before now only seed the
        first ticks (`gpu_series`), so no extra buffer read is needed here."""
        now = self.clock()
        self.t0_us = self.t_end_us = round(now * 1e6)
        self.started_utc = _dt.datetime.fromtimestamp(now, _dt.timezone.utc).isoformat(
            timespec="milliseconds")

    def start_dcgm(self) -> None:
        """`dcgmi dmon` beside the NVML sampler, when the source allows it and dcgmi is here."""
        self.dcgm.start(self.cfg, self.nv, self.gpus, self.clock)

    def _tick_loop(self) -> None:
        cpu0 = time.thread_time()
        period = 1.0 / self.cfg.hz
        start = time.monotonic()
        nxt = start
        next_buf = start + self.buffer_every_s
        next_proc = start
        next_save = start + self.cfg.save_every_s
        try:
            while not self._stop.is_set():
                mono = time.monotonic()
                if self.cfg.duration_s is not None and mono - start >= self.cfg.duration_s:
                    break
                self.step()
                self._first.set()
                if mono >= next_proc:
                    self.read_processes()
                    next_proc = mono + self.cfg.processes_every_s
                if mono >= next_buf:
                    self.read_buffers()
                    next_buf = mono + self.buffer_every_s
                if self.on_save is not None and mono >= next_save:
                    self._cpu["sampling"] = time.thread_time() - cpu0 - self._cpu["writes"]
                    w0 = time.thread_time()
                    self.on_save(self.data())
                    self._cpu["writes"] += time.thread_time() - w0
                    # a write costs in proportion to what was sampled: doubling the gap keeps
                    # the writes' share of the sampler's CPU constant (a hard kill loses at most
                    # the second half; Ctrl-C and the end lose nothing)
                    next_save = mono + max(self.cfg.save_every_s, mono - start)
                nxt += period
                mono = time.monotonic()
                if mono > nxt + period:      # fell over a period behind: count it, don't burst
                    self.late += 1
                    nxt = mono
                self._stop.wait(max(0.0, nxt - mono))
            if self._stop.is_set():
                self.step()                  # stopped by the caller: a last tick after its load
            self.read_buffers()              # the windows that ended since the last read
            self.t_end_us = max(self.t_end_us, round(self.clock() * 1e6))
        finally:
            self._cpu["sampling"] = time.thread_time() - cpu0 - self._cpu["writes"]
            self._first.set()
            self._done.set()

    def _pcie_loop(self) -> None:
        cpu0 = time.thread_time()
        try:
            while not self._stop.is_set() and not self._done.is_set():
                alive = [g for g in self.gpus
                         if g.alive and not {"pcie_tx", "pcie_rx"} <= set(g.unsupported)]
                if not alive:
                    break
                gap = self.pcie_every_s / len(alive)
                for g in alive:
                    t = time.monotonic()
                    self.read_pcie(g)
                    self._cpu["pcie"] = time.thread_time() - cpu0
                    if self._stop.wait(max(0.0, gap - (time.monotonic() - t))) or \
                            self._done.is_set():
                        break
        finally:
            self._cpu["pcie"] = time.thread_time() - cpu0

    def wait(self, poll_s: float = 0.2) -> None:
        """Block until the watch's duration has passed (Ctrl-C reaches the caller)."""
        while not self._done.wait(poll_s):
            pass

    def stop(self) -> None:
        self._stop.set()
        try:
            for t in self._threads:
                t.join()
        finally:
            self.dcgm.stop(self._cpu)     # always ended and reaped, whatever happened

    # --- the record -------------------------------------------------------------------------
    def data(self) -> WatchData:
        """The payload of what was sampled so far."""
        dur = max(0.0, (self.t_end_us - self.t0_us) / 1e6)
        wall = dur if dur > 0 else None
        cpu = sum(self._cpu.values())
        use_dcgm = self.dcgm.used()
        with self._lock:
            series = [gpu_series(g, self.t0_us, self.dcgm if use_dcgm else None)
                      for g in self.gpus]
        period = 1.0 / self.cfg.hz
        notes = list(self.notes)
        if use_dcgm:
            notes += self.dcgm.notes(series, self.t0_us, self.t_end_us)
        return WatchData(
            source=self.dcgm.source(series, use_dcgm), requested_hz=self.cfg.hz,
            achieved_hz=None if wall is None else round(self.ticks / max(wall, period), 3),
            duration_s=round(dur, 3), ticks=self.ticks, late_ticks=self.late,
            started_utc=self.started_utc,
            cpu_pct_of_core=None if wall is None else round(100 * cpu / wall, 3),
            cpu_s={k: round(v, 4) for k, v in self._cpu.items()},
            call_us=self.nvml.call_us(),
            pcie_every_s=self.pcie_every_s, processes_every_s=self.cfg.processes_every_s,
            buffer_every_s=self.buffer_every_s, load=self.cfg.load,
            dcgm_note=None if use_dcgm else self.dcgm.why_not_used(),
            notes=tuple(dict.fromkeys(notes)), gpus=tuple(series))


def _value(v: Any, value_type: int) -> float:
    return float(getattr(v, VALUE_FIELD.get(value_type, "uiVal")))


def _r(v: float | None, nd: int) -> float | None:
    return None if v is None else round(v, nd)
