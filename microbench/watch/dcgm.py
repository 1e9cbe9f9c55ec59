"""DCGM's profiling fields for the GPU watch, read from `dcgmi dmon` (no DCGM Python bindings):
SM active, SM occupancy, DRAM active, PCIe and NVLink bytes per second, per GPU.

    dcgmi dmon -e 1002,1003,1005,1009,1010,1011,1012 -d 100 [-i 0,1] [-c N]

runs as a subprocess beside the NVML sampler (microbench/watch/sampler.py); its text output is
read line by line in a thread and each data row is stamped with the host clock when it arrives.
What the numbers mean is in reports/base/payloads/watch.py.

Tested only against a fake `dcgmi` that prints the format below (tests/test_watch_dcgm.py), never
against a real DCGM host engine: the layout is taken from DCGM's source code, not from a capture.

The `dcgmi dmon` layout, and where each detail comes from (NVIDIA/DCGM at 4.6.0 unless said):
- field ids 1002 SM active, 1003 SM occupancy, 1005 DRAM active, 1009/1010 PCIe TX/RX bytes,
  1011/1012 NVLink TX/RX bytes: dcgmlib/dcgm_fields.h (4.6 renames the macros, e.g.
  DCGM_FI_PROF_SM_UTIL_RATIO, and keeps the old names as aliases; the ids are unchanged).
- column short names SMACT SMOCC DRAMA PCITX PCIRX NVLTX NVLRX, an empty unit for each, ratios
  printed as doubles and byte fields as 64-bit integers: dcgmlib/src/dcgm_fields.cpp.
- bytes are per second: dcgm-exporter's etc/dcp-metrics-included.csv (PCIe TX/RX "in bytes per
  second"); for NVLink, dcgmproftester's load generator (common/CudaWorker/FieldWorkers.hpp)
  sets its PCIe and NVLink targets the same way, bytes copied over seconds.
- the header: a line starting `#Entity` then the short names, then a units line starting `ID`
  (dcgmi/DeviceMonitor.cpp, SetHeaderForOutput); DCGM 2.x printed `# Entity` and `Id`, and an
  empty line before each repeated header (the same file in DCGM's first public commit). The
  header is printed again every 14 sample rounds (MAX_PRINT_HEADER_COUNT).
- a row: `GPU <id>` then one cell per field in the order of `-e`; a double with 3 decimals, an
  integer as is, `N/A` for a blank value; a cell longer than its column is cut and ends in
  `...` (DeviceMonitor.cpp, ListFieldValues, PrintMetricsRow and FixedSizeString). A GPU
  missing from a round prints nothing (the row is skipped), so a GPU can stop reporting.
- errors: `Error setting watches. Result: <code>: <text>` when the watch cannot be set, e.g.
  -36 "Profiling is not supported for this group of GPUs or GPU", -34 "... resource is in use"
  (another client holds the profiling module), -33 "... module of DCGM that is not currently
  loaded" (dcgmlib/src/dcgm_errors.c); also `Error getting values information.`, `No data
  returned from the hostengine.`, `Error: Unable to connect to host engine.` (dcgmi/Command.cpp).
  They go to stderr in 4.x and went to stdout in 2.x: stderr is read with stdout here.
- `-d` is milliseconds, at least 1 (default 1000); `-c` the number of rounds, default forever;
  `-i` a comma-separated list of GPU ids (dcgmi/CommandLineParser.cpp, dmon). DCGM numbers the
  GPUs in NVML's enumeration order (dcgmlib/src/DcgmCacheManager.cpp), so a GPU id here is taken
  as the NVML index.

Bounded: a line is read up to `LINE_CAP` bytes (the rest of a longer line is dropped and the
line counted as skipped), at most `TOTAL_CAP` bytes in all, after which dcgmi is stopped; no
data row within `first_row_s` stops it too. `stop()` ends it (SIGTERM to its process group, then
SIGKILL) and reaps it, so no zombie is left; should this process die first, dcgmi's next write
to the closed pipe ends it, and `-c` bounds a watch of known length.
"""
from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import threading
import time
from typing import Callable

from reports.base.payloads.watch import DCGM_FIELDS

FIELD_IDS = tuple(DCGM_FIELDS)
RATIO_FIELDS = (1002, 1003, 1005)
LINE_CAP = 4096                 # bytes per line; a dmon row of 7 fields is ~150
TOTAL_CAP = 64 * 2**20          # bytes in all: ~8 GPUs x 10 rows/s x 150 B for 15 hours
FIRST_VALUE_S = 10.0            # no value by then: dcgmi is stopped (at least 20 periods)
MIN_PERIOD_MS = 100             # dmon -d floor: DCGM averages each field over this period
MAX_ERRORS_KEPT = 5
ERROR_CHARS = 200
ERROR_STARTS = ("Error", "Unable to", "No data returned", "Failed", "Invalid")


def dcgmi_path() -> str | None:
    return shutil.which("dcgmi")


def period_ms(hz: float) -> int:
    """dmon's -d: the watch's tick, but no shorter than MIN_PERIOD_MS."""
    return max(MIN_PERIOD_MS, round(1000 / hz))


def command(exe: str, period: int, gpus: tuple[int, ...] | None = None,
            rounds: int | None = None) -> list[str]:
    cmd = [exe, "dmon", "-e", ",".join(map(str, FIELD_IDS)), "-d", str(period)]
    if gpus is not None:
        cmd += ["-i", ",".join(map(str, gpus))]
    if rounds is not None:
        cmd += ["-c", str(rounds)]
    return cmd


class Parser:
    """One dmon line at a time -> ("header" | "units" | "row" | "error" | "blank" | "skip", ...).
    A row is ("row", gpu id, values in FIELD_IDS order, None for N/A); the header fixes which
    column holds which field (by position: dmon prints them in the order of -e)."""

    def __init__(self) -> None:
        self.columns: tuple[str, ...] | None = None
        self.bad_cells = 0

    def feed(self, line: str) -> tuple:
        s = line.strip()
        if not s:
            return ("blank",)
        tok = s.split()
        if s.startswith("#"):
            rest = s[1:].split()
            if rest and rest[0] == "Entity":
                self.columns = tuple(rest[1:])
                return ("header", self.columns)
            return ("skip", s)
        if tok[0] in ("ID", "Id") and len(tok) <= 1 + len(FIELD_IDS):
            return ("units",)
        if s.startswith(ERROR_STARTS):
            return ("error", s[:ERROR_CHARS])
        if tok[0] == "GPU" and len(tok) == 2 + len(FIELD_IDS) and tok[1].isdigit():
            if self.columns is None or len(self.columns) != len(FIELD_IDS):
                return ("skip", s)          # no header seen, or one for other fields
            vals = tuple(self._cell(f, c) for f, c in zip(FIELD_IDS, tok[2:]))
            return ("row", int(tok[1]), vals)
        return ("skip", s)

    def _cell(self, field: int, c: str) -> float | None:
        if c == "N/A":
            return None
        try:
            v = float(c)                      # a cut cell ("12345...") fails here
        except ValueError:
            self.bad_cells += 1
            return None
        if not math.isfinite(v) or v < 0:
            self.bad_cells += 1
            return None
        if field in RATIO_FIELDS and v > 1:
            if v > 1.001:                      # beyond rounding of the 3-decimal print
                self.bad_cells += 1
                return None
            v = 1.0
        return v


class Dmon:
    """`dcgmi dmon` as a subprocess, its rows kept per GPU as (host time us, values)."""

    def __init__(self, cmd: list[str], clock: Callable[[], float] = time.time,
                 gpus: tuple[int, ...] | None = None, first_row_s: float | None = None,
                 line_cap: int | None = None, total_cap: int | None = None) -> None:
        self.cmd, self.clock, self.gpus = cmd, clock, gpus
        self.first_row_s = FIRST_VALUE_S if first_row_s is None else first_row_s
        self.line_cap = LINE_CAP if line_cap is None else line_cap
        self.total_cap = TOTAL_CAP if total_cap is None else total_cap
        self.parser = Parser()
        self.rows: dict[int, list[tuple[int, tuple[float | None, ...]]]] = {}
        self.n_rows = self.n_values = self.skipped = self.bytes_read = 0
        self.errors: list[str] = []
        self.why_stopped: str | None = None   # set when we stopped it before the end
        self.exit_code: int | None = None
        self.ended_at_us: int | None = None   # dcgmi ended (or was stopped) at this host time
        self.ended_by_itself = False          # its output ended before we stopped it
        self.cpu_s = 0.0                      # reader thread
        self.child_cpu_s: float | None = None  # dcgmi itself (from wait4)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None
        self._timer: threading.Timer | None = None
        self._stopping = False
        self._reaped = threading.Event()
        self._eof = threading.Event()

    # --- parsing, callable directly (tests feed recorded lines with a fake clock) ----------------
    def feed(self, line: str, t_us: int | None = None) -> None:
        t_us = round(self.clock() * 1e6) if t_us is None else t_us
        ev = self.parser.feed(line)
        kind = ev[0]
        if kind == "row":
            gpu, vals = ev[1], ev[2]
            if self.gpus is not None and gpu not in self.gpus:
                return
            with self._lock:
                self.rows.setdefault(gpu, []).append((t_us, vals))
                self.n_rows += 1
                self.n_values += sum(v is not None for v in vals)
            if self._timer is not None and self.n_values:
                self._timer.cancel()
        elif kind == "error":
            if len(self.errors) < MAX_ERRORS_KEPT:
                self.errors.append(ev[1])
            if not self.n_values:           # dmon gives up after such a line: no need to wait
                self._stop_early(f"dcgmi: {ev[1]}")
        elif kind == "skip":
            self.skipped += 1

    # --- the subprocess ------------------------------------------------------------------------
    def start(self) -> "Dmon":
        # its own process group, so stop() reaches anything it started; no shell
        self._proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        self._thread = threading.Thread(target=self._read, name="ppscope-watch-dcgm",
                                        daemon=True)
        self._thread.start()
        # a deadline for the first value: a dcgmi that hangs (host engine not answering) or
        # prints only N/A is stopped and the watch goes on with NVML
        self._timer = threading.Timer(self.first_row_s, self._no_value_in_time)
        self._timer.daemon = True
        self._timer.start()
        return self

    def _no_value_in_time(self) -> None:
        if not self.n_values:
            what = "only N/A" if self.n_rows else "no data row"
            self._stop_early(f"dcgmi gave {what} within {self.first_row_s:g} s")

    def _read(self) -> None:
        cpu0 = time.thread_time()
        out = self._proc.stdout
        try:
            while True:
                chunk = out.readline(self.line_cap)
                if not chunk:
                    break
                self.bytes_read += len(chunk)
                if not chunk.endswith(b"\n"):
                    # longer than the cap: drop the rest of this line, counting what it costs
                    while chunk and not chunk.endswith(b"\n") and \
                            self.bytes_read <= self.total_cap:
                        chunk = out.readline(self.line_cap)
                        self.bytes_read += len(chunk)
                    self.skipped += 1
                else:
                    self.feed(chunk.decode("utf-8", "replace"))
                if self.bytes_read > self.total_cap:
                    self._stop_early(f"dcgmi printed over {self.total_cap} bytes; stopped")
                    break
        except (OSError, ValueError):   # the pipe closed under us by stop()
            pass
        finally:
            self.cpu_s = time.thread_time() - cpu0
            if self.ended_at_us is None:
                self.ended_at_us = round(self.clock() * 1e6)
            self.ended_by_itself = not self._stopping and self.why_stopped is None
            self._eof.set()

    def _stop_early(self, why: str) -> None:
        if self.why_stopped is None and not self._stopping:
            self.why_stopped = why
            threading.Thread(target=self.stop, name="ppscope-watch-dcgm-stop",
                             daemon=True).start()

    def stop(self, grace_s: float = 1.0) -> None:
        """End dcgmi (SIGTERM to its group, SIGKILL after `grace_s`), reap it, join the reader.
        Safe to call from several threads and more than once."""
        if self._timer is not None:
            self._timer.cancel()
        p = self._proc
        if p is None:
            return
        with self._lock:
            first, self._stopping = not self._stopping, True
        if first:
            # Popen.wait/poll are not used: os.wait4 reaps it and gives its CPU time
            _signal_group(p, signal.SIGTERM)
            status = ru = None
            deadline = time.monotonic() + grace_s
            while status is None and time.monotonic() < deadline:
                status, ru = _wait4(p.pid, os.WNOHANG)
                if status is None:
                    time.sleep(0.01)
            _signal_group(p, signal.SIGKILL)     # it, or anything it left in its group
            if status is None:
                status, ru = _wait4(p.pid, 0)
            if status is not None:
                p.returncode = os.waitstatus_to_exitcode(status)
                self.child_cpu_s = None if ru is None else round(ru.ru_utime + ru.ru_stime, 4)
            self.exit_code = p.returncode
            if self.ended_at_us is None:
                self.ended_at_us = round(self.clock() * 1e6)
            self._reaped.set()
        else:
            self._reaped.wait(grace_s + 5)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(grace_s + 5)
        try:
            p.stdout.close()
        except (OSError, ValueError):
            pass

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def eof(self) -> bool:
        """dcgmi closed its output (it ended, by itself or stopped)."""
        return self._eof.is_set()

    def rows_of(self, gpu: int) -> list[tuple[int, tuple[float | None, ...]]]:
        with self._lock:
            return list(self.rows.get(gpu, ()))


def _wait4(pid: int, flags: int):
    """(wait status, rusage) of the reaped child, or (None, None) when it has not ended yet
    (WNOHANG) or was reaped already."""
    try:
        got, status, ru = os.wait4(pid, flags)
    except ChildProcessError:
        return None, None
    return (status, ru) if got == pid else (None, None)


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def align_rows(ticks_us: list[int], rows: list[tuple[int, float | None]],
               max_age_us: int) -> list[float | None]:
    """DCGM rows onto the sampler's ticks: at tick t the mean of the values that arrived in
    (previous tick, t]; with none, the last value if it arrived at most `max_age_us` before t
    (dmon prints every period; a GPU that stops reporting goes to None after that), else None.
    An N/A row in the window with no value beside it gives None (DCGM said it has none)."""
    out: list[float | None] = []
    j = 0
    last_t, last_v = None, None
    for t in ticks_us:
        acc, na = [], False
        while j < len(rows) and rows[j][0] <= t:
            if rows[j][1] is None:
                na = True
            else:
                acc.append(rows[j][1])
            last_t, last_v = rows[j][0], rows[j][1]
            j += 1
        if acc:
            out.append(sum(acc) / len(acc))
        elif na:
            out.append(None)
        elif last_t is not None and t - last_t <= max_age_us:
            out.append(last_v)
        else:
            out.append(None)
    return out
