"""Read per-rank Kineto traces (SGLang `/start_profile`, or any PyTorch profiler trace), streaming.

What it measures, per rank (one trace file = one rank):
- GPU busy / idle: the union of every GPU event interval (kernels, memcpy, memset: every event
  with a CUDA stream) from the first one's start to the last one's end, overall and in time bins.
  This is Holistic Trace Analysis's "temporal breakdown" (idle = span - merged busy time;
  compute = merged compute kernels; non-compute = the rest).
- Idle split per stream as HTA's idle-time breakdown does (summed over streams it can exceed
  the GPU's idle time, since one stream idles while another runs; read the compute stream's,
  `idle_split_compute_stream_us`): a gap before a kernel is `host_wait`
  when the kernel's launch call (its correlated cuda_runtime event) started after the previous
  kernel on that stream ended (the CPU was late); else `kernel_wait` when the gap is under
  `kernel_wait_us` (HTA's consecutive_kernel_delay, default 30 in trace units = us); else `other`.
- NCCL receive kernels apart: a stage waiting for its input shows up as one long
  `ncclDevKernel_SendRecv` / `...Recv` kernel, which HTA counts as busy "non-compute" time. We
  split each receive into transfer = bytes / link bandwidth (`link_gbps`, GB = 1e9 B; bytes from
  the kernel's `In msg nelems` x dtype size) and waiting = the rest.
- Dispatch latency (GPU view): from the end of a receive kernel (input arrived) to the start of
  the next compute kernel on that rank (forward started). CPU view, when SGLang's scheduler
  annotations are present: time in `recv_requests`, `get_next_batch_to_run`, `run_batch`,
  `process_batch_result`, `send_proxy_dict_to_next_stage` (and any other user annotation), and
  `cpu_dispatch_latency_us`: end of `recv_requests` to the start of `run_batch` in the same loop
  iteration (iterations of empty slots have no run_batch and are left out).
- Kernels launched from CUDA graphs (correlated to `cudaGraphLaunch`) vs one by one.

Rules, chosen on purpose and written into each rank's record (`rules`, RULES_DEFAULT):
- cuda_sync events (Context / Stream / Event Sync, Stream Wait Event) are never busy and never
  widen the span: CUPTI records them while something waits, they are not GPU work. HTA leaves
  out only those on stream -1 and counts the others busy, so a wait outside the kernels widens
  its span and a Stream Sync adds busy time; `sync_events_excluded` / `sync_excluded_us` say how
  much we left out.
- Kernels with no launch event (launched before the profiler started, or from a thread the
  profiler did not trace) are kept: they ran on the GPU inside the window. HTA keeps only kernels
  whose launch is in the trace when there are two or more ProfilerSteps, which can leave out a
  large share of the busy time; `gpu_events_without_launch` counts them.
- With two or more ProfilerSteps, work launched in the last (often incomplete) step is left out,
  as HTA does (`gpu_events_last_step_dropped`).
- An event without `dur`, or with a NaN, infinite, negative or over-a-day duration or an
  impossible timestamp, is skipped and counted (`events_without_dur`, `events_bad_time`, and a
  line in `warnings`, also logged): never taken as zero-long, never as a busy % below 0.
- `hta_compatible=True` (`ppscope sglang --hta-compatible`) applies HTA's rules and its rounding
  (every interval inward to whole microseconds) instead (RULES_HTA); busy, idle, compute and
  non-compute time then equal HTA's exactly on HTA's sample traces, the PP traces and a trace
  built to exercise both rules (tests/test_sglang_trace.py). The default differs from HTA by
  < 2 us per event from the rounding, plus the sync time it leaves out.

Why streaming: a few seconds of a busy server give traces of hundreds of MB. We never load the
document: the gzip (or plain) text is read in chunks, the `traceEvents` array is walked with the
stdlib C JSON decoder one event at a time (`raw_decode`), and only numbers we need are kept, in
compact arrays. `python -m microbench.bench.trace_reader FILE` compares wall time and peak memory
with HTA.

How to run: `ppscope sglang --traces DIR [--hta-compatible]` (files `*.trace.json[.gz]`,
`*.json[.gz]`). Rank: `distributedInfo.rank`, else `-PP-{r}` / `rank{r}` in the file name.
Ranks are read in parallel processes (one per rank, bounded by the cores), as HTA does.
"""
from __future__ import annotations

import bisect
import gzip
import io
import json
import math
import os
import re
import zlib
from array import array
from pathlib import Path
from typing import Iterator

from microbench.sglang.intervals import length, merge
from reports.base.errors import CliError
from reports.base.paths import open_input
from reports.base.payloads.sglang import Traces
from reports.base.schema import from_json

CHUNK_CHARS = 1 << 21
MAX_EVENT_CHARS = 64 << 20
MAX_DUR_US = 86400e6     # a GPU event or range longer than a day is a corrupted field
MAX_TS_US = 1e17         # ~3000 years of microseconds: beyond any clock Kineto uses
PARALLEL_MIN_BYTES = 4 << 20
MAX_WORKERS = 8
SCHEDULER_RANGES = ("recv_requests", "send_reqs_to_next_stage", "get_next_batch_to_run",
                    "run_batch", "process_batch_result", "send_proxy_dict_to_next_stage",
                    "send_res_dict_to_next_stage", "recv_res_dict_from_prev_stage")
# SGLang's span per forward (srt/utils/profile_utils.py): step[DECODE bs=N], step[EXTEND bs=N toks=T]
STEP_RE = re.compile(r"^step\[(DECODE|EXTEND|MIXED|IDLE)\s+bs=(\d+)")
GPU_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}
DTYPE_BYTES = {"BFloat16": 2, "Half": 2, "Float": 4, "Double": 8, "Int": 4, "Long": 8,
                "Char": 1, "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1}
_WS = re.compile(r"[\s,]*")
# HTA's kernel classes (hta/utils/utils.py, same regular expressions so the numbers agree):
# communication = `^nccl.*Kernel`; computation = anything not NCCL, memcpy/memset or a sync.
COMM_RE = re.compile(r"^nccl.*Kernel")
NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
_IDLE_CATS = {"kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy"}
RECV_RE = re.compile(r"nccl\w*(SendRecv|Recv)", re.I)


class TraceError(CliError):
    pass


class TruncatedTrace(TraceError):
    """The file ends before the trace does: cut short, or still being written."""


def _open_text(path: Path) -> io.TextIOBase:
    f = open_input(path, "Kineto trace", TraceError)
    try:
        magic = f.peek(2)[:2]
    except OSError as e:
        f.close()
        raise TraceError(f"{path}: cannot read trace ({e.strerror or e})") from None
    if magic == b"\x1f\x8b":
        g = gzip.GzipFile(fileobj=f, mode="rb")
        g.myfileobj = f   # closed with it, as gzip.open(path) does
        return io.TextIOWrapper(g, encoding="utf-8", errors="replace")
    return io.TextIOWrapper(f, encoding="utf-8", errors="replace")


def _meta_value(text: str, key: str):
    i = text.find(f'"{key}"')
    if i < 0:
        return None
    j = text.find(":", i)
    try:
        return json.JSONDecoder().raw_decode(text, _WS.match(text, j + 1).end() - 0)[0] \
            if text[j + 1:j + 2] != "" else None
    except (json.JSONDecodeError, ValueError):
        return None


def iter_events(path: str | Path, meta: dict | None = None, shift_us: float = 0.0
                ) -> Iterator[dict]:
    """Yield each event of the trace's `traceEvents` array without loading the file whole.

    `meta`, if given, receives `distributedInfo` and other top-level keys found around the array.
    `shift_us`: subtracted from each event's numeric `ts` (a rank's clock offset, corrected).
    Raises TraceError (one line) on a truncated / corrupt / non-trace file.
    """
    path = Path(path)
    # the decoder's scanner without raw_decode's wrapper (one call per event matters at ~1e7
    # events); it raises StopIteration where raw_decode raises JSONDecodeError
    raw = json.JSONDecoder().scan_once
    f = _open_text(path)
    try:
        try:
            buf = f.read(CHUNK_CHARS)
            while '"traceEvents"' not in buf:
                more = f.read(CHUNK_CHARS)
                if not more or len(buf) > MAX_EVENT_CHARS:
                    if not buf.strip():
                        raise TraceError(f"{path}: empty trace file")
                    raise TraceError(f"{path}: not a Kineto trace (no traceEvents)")
                buf += more
            k = buf.index('"traceEvents"')
            head = buf[:k]
            lb = buf.find("[", k)
            while lb < 0:
                more = f.read(CHUNK_CHARS)
                if not more:
                    raise TruncatedTrace(f"{path}: truncated trace (cut before the events)")
                buf += more
                lb = buf.find("[", k)
            pos, eof, n = lb + 1, False, 0
            find = buf.find
            while True:
                # the next event: usually "{" after ",\n"; two C calls, not a regex match
                j = find("{", pos, pos + 64)
                if j >= 0 and not buf[pos:j].strip(" \t\r\n,"):
                    pos = j
                else:
                    pos = _WS.match(buf, pos).end()
                if pos >= len(buf):
                    if eof:
                        raise TruncatedTrace(f"{path}: truncated trace (cut after {n} events)")
                    more = f.read(CHUNK_CHARS)
                    eof = not more
                    buf, pos = buf[pos:] + more, 0
                    find = buf.find
                    continue
                if buf[pos] == "]":
                    break
                try:
                    ev, end = raw(buf, pos)
                except RecursionError:
                    raise TraceError(f"{path}: corrupt trace (event {n + 1} nests deeper than "
                                     "any trace event)") from None
                except (json.JSONDecodeError, StopIteration):
                    if eof:
                        raise TruncatedTrace(f"{path}: truncated or corrupt trace "
                                         f"(event {n + 1} cannot be read)") from None
                    if len(buf) - pos > MAX_EVENT_CHARS:
                        raise TraceError(f"{path}: corrupt trace (event {n + 1} is not JSON)") \
                            from None
                    more = f.read(CHUNK_CHARS)
                    eof = not more
                    buf, pos = buf[pos:] + more, 0
                    find = buf.find
                    continue
                n += 1
                pos = end
                if shift_us and isinstance(ev, dict) and type(ev.get("ts")) in (int, float):
                    ev["ts"] -= shift_us
                yield ev
            if meta is not None:
                tail = buf[pos + 1:] + (f.read() if not eof else "")
                for key in ("distributedInfo", "displayTimeUnit", "baseTimeNanoseconds",
                            "deviceProperties"):
                    v = _meta_value(head, key)
                    if v is None:
                        v = _meta_value(tail, key)
                    if v is not None:
                        meta[key] = v
        except (EOFError, zlib.error, gzip.BadGzipFile, OSError) as e:
            raise TruncatedTrace(f"{path}: truncated or corrupt gzip ({e})") from None
    finally:
        f.close()


class _Acc:
    """Compact per-rank accumulators (arrays of doubles / longs, not event dicts)."""
    def __init__(self) -> None:
        self.ts, self.end = array("d"), array("d")
        # kind: 0 computation, 1 communication, 2 other (memcpy/memset/sync), as HTA classes them
        self.stream, self.corr, self.kind = array("q"), array("q"), array("b")
        self.in_idle = array("b")  # kernel/memcpy/memset (HTA's idle breakdown leaves out syncs)
        self.sync = array("b")     # cuda_sync events: 1 on stream -1 (device-wide), 2 on a stream
        self.steps = array("d")    # ProfilerStep#N start times
        self.recv = []          # (index of the GPU event, bytes)
        self.rt_corr, self.rt_ts = array("q"), array("d")
        self.graph_corr: set[int] = set()
        self.ranges: dict[str, list[float]] = {}   # name -> [count, total_us]
        self.range_iv: dict[str, list[tuple[float, float]]] = {}
        self.events = 0
        self.unrecognised = 0
        self.no_dur = 0         # duration events without "dur": skipped, counted
        self.bad_time = 0       # NaN / inf / negative / over-a-day durations, absurd timestamps
        self.not_objects = 0    # array entries that are not JSON objects
        self.bad_args = 0       # GPU events whose `stream` / `correlation` is not an integer
        self.nccl_bad = 0       # NCCL receives whose message size cannot be read (kept, 0 bytes)
        self.duplicates = 0     # events seen twice (a trace merged or copied twice): one kept
        self.range_seen: set[int] = set()
        self.t_lo, self.t_hi = math.inf, -math.inf    # the traced window (trace clock, us)
        # point-to-point messages by transport, for the clock offset between ranks
        # (microbench/sglang/clock_offset.py): {"gloo"|"nccl": {"send"|"recv": [(ts, end)]}}
        self.comm: dict[str, dict[str, list[tuple[float, float]]]] = {}


_KIND_CACHE: dict[str, int] = {}


def _kind(name: str) -> int:
    k = _KIND_CACHE.get(name)
    if k is None:
        k = 1 if COMM_RE.match(name) else 2 if NOT_COMPUTE_RE.match(name) else 0
        if len(_KIND_CACHE) < 100_000:
            _KIND_CACHE[name] = k
    return k


class _Skip(Exception):
    pass


def _interval(a: _Acc, ev: dict) -> tuple[float, float]:
    """(ts, dur) of a duration event, or _Skip (counted) when it has no usable duration: no
    `dur` at all, or a time that cannot be (NaN, inf, negative or over a day, a timestamp
    beyond any clock). Such an event is never taken as zero-long or as hugely long."""
    ts = float(ev["ts"])
    d = ev.get("dur")
    if d is None:
        a.no_dur += 1
        raise _Skip
    dur = float(d)
    if not (math.isfinite(ts) and abs(ts) < MAX_TS_US and 0.0 <= dur <= MAX_DUR_US):
        a.bad_time += 1
        raise _Skip
    if ts < a.t_lo:
        a.t_lo = ts
    if ts + dur > a.t_hi:
        a.t_hi = ts + dur
    return ts, dur


_P2P = {"gloo:send": ("gloo", "send"), "gloo:recv": ("gloo", "recv"),
        "nccl:send": ("nccl", "send"), "nccl:recv": ("nccl", "recv")}


def _p2p(a: _Acc, name: str, ts: float, dur: float) -> None:
    """A point-to-point message's range (c10d's `gloo:send`, the GPU's `nccl:recv 1<-0`)."""
    k = _P2P.get(name[:9])
    if k is not None:
        a.comm.setdefault(k[0], {}).setdefault(k[1], []).append((ts, ts + dur))


def _scan(path: Path, meta: dict) -> _Acc:
    a = _Acc()
    for ev in iter_events(path, meta):
        a.events += 1
        if not isinstance(ev, dict):
            a.not_objects += 1
            a.unrecognised += 1
            continue
        try:
            _take(a, ev)
        except _Skip:
            pass
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
            a.unrecognised += 1   # a duration event without numeric ts/dur, say
    _dedupe(a)
    return a


def _int_arg(args: dict, key: str, default: int) -> int:
    """An integer field of an event's args (`stream`, `correlation`); a string, float or bool
    there is a malformed event (_BadArg), never read as a number."""
    v = args.get(key, default)
    if type(v) is not int:
        raise _BadArg
    return v


class _BadArg(Exception):
    pass


def _dedupe(a: _Acc) -> None:
    """Drop GPU events that are exact repeats (same start, end, stream, correlation and class):
    a trace merged twice or an exporter that wrote an event twice would otherwise count the
    same kernel twice (busy time, NCCL receive time). Counted in `a.duplicates`."""
    import numpy as np
    n = len(a.ts)
    if n < 2:
        return
    cols = [np.frombuffer(x, dtype=d) for x, d in ((a.ts, np.float64), (a.end, np.float64),
                                                    (a.stream, np.int64), (a.corr, np.int64),
                                                    (a.kind, np.int8))]
    order = np.lexsort(cols[::-1])
    same = np.ones(n - 1, dtype=bool)
    for c in cols:
        sc = c[order]
        same &= sc[1:] == sc[:-1]
    if not same.any():
        return
    drop = np.zeros(n, dtype=bool)
    drop[order[1:][same]] = True
    keep = np.flatnonzero(~drop)
    a.duplicates += int(drop.sum())
    new_index = np.full(n, -1, dtype=np.int64)
    new_index[keep] = np.arange(len(keep))
    for name in ("ts", "end", "stream", "corr", "kind", "in_idle", "sync"):
        old = getattr(a, name)
        setattr(a, name, array(old.typecode,
                               np.frombuffer(old, dtype=old.typecode)[keep].tobytes()))
    a.recv = [(int(new_index[i]), b) for i, b in a.recv if not drop[i]]


def _take(a: _Acc, ev: dict) -> None:
    """Keep what we need of one event; every value is converted before anything is appended, so
    a malformed event raises without leaving the arrays out of step."""
    if ev.get("ph") != "X":
        return
    cat = ev.get("cat")
    args = ev.get("args") or {}
    name = ev.get("name", "")
    if not isinstance(args, dict):
        raise TypeError("args is not an object")
    if cat in GPU_CATS or (cat != "gpu_user_annotation" and "stream" in args
                            and cat not in ("cuda_runtime", "cuda_driver")):
        ts, dur = _interval(a, ev)
        try:
            stream, corr = _int_arg(args, "stream", -1), _int_arg(args, "correlation", -1)
        except _BadArg:
            a.bad_args += 1
            raise _Skip from None
        k = _kind(name)
        recv = None
        if k == 1 and (RECV_RE.search(name) and args.get("Collective name", "recv") == "recv"):
            nel = args.get("In msg nelems") or args.get("Out msg nelems") or 0
            if type(nel) is not int or nel < 0:   # the kernel ran: kept, its size unknown
                a.nccl_bad += 1
                nel = 0
            recv = nel * DTYPE_BYTES.get(args.get("dtype"), 2)
        a.ts.append(ts); a.end.append(ts + dur)
        a.stream.append(stream); a.corr.append(corr)
        a.kind.append(k); a.in_idle.append(cat in _IDLE_CATS)
        # device-wide syncs are on stream -1, written as 4294967295 (uint32) by some Kineto
        # versions; HTA leaves out only the literal -1 (and any other event on it)
        a.sync.append(0 if cat != "cuda_sync" else 1 if stream == -1 else
                      3 if not 0 <= stream < 1 << 31 else 2)
        if recv is not None:
            a.recv.append((len(a.ts) - 1, recv))
    elif cat in ("cuda_runtime", "cuda_driver"):
        c = args.get("correlation")
        if c is not None:
            c, ts = int(c), float(ev["ts"])
            if not (math.isfinite(ts) and abs(ts) < MAX_TS_US):
                a.bad_time += 1
                return
            a.rt_corr.append(c); a.rt_ts.append(ts)
            if "GraphLaunch" in name:
                a.graph_corr.add(c)
    elif cat == "user_annotation" or name.startswith("ProfilerStep#"):
        ts, dur = _interval(a, ev)
        key = hash((name, ts, dur, ev.get("tid")))
        if key in a.range_seen:   # the same range twice: counted once
            a.duplicates += 1
            return
        a.range_seen.add(key)
        if name.startswith("ProfilerStep#"):
            a.steps.append(ts)
        r = a.ranges.setdefault(name, [0, 0.0])
        r[0] += 1; r[1] += dur
        if name in ("recv_requests", "run_batch"):
            a.range_iv.setdefault(name, []).append((ts, ts + dur))
        elif name.startswith("gloo:"):
            _p2p(a, name, ts, dur)
    elif cat == "gpu_user_annotation" and name.startswith("nccl:"):
        ts, dur = _interval(a, ev)
        _p2p(a, name, ts, dur)


def _pct(vals: list[float], q: float) -> float | None:
    if not vals:
        return None
    v = sorted(vals)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


RULES_DEFAULT = {
    "mode": "default",
    "busy": "union of kernel, memcpy and memset intervals (HTA's temporal breakdown)",
    "sync_events": "cuda_sync events (Context/Stream/Event Sync, Stream Wait Event) are not "
                   "busy and do not widen the span: they record a wait, not GPU work "
                   "(HTA leaves out only those on stream -1)",
    "kernels_without_launch": "kept: GPU work in the window whose launch call was not traced "
                              "(launched before the profiler started, or from an untraced "
                              "thread) is still GPU work (HTA drops them when the trace has "
                              "two or more ProfilerSteps)",
    "last_profiler_step": "with two or more ProfilerSteps, GPU work launched in the last "
                          "(often incomplete) step is left out (as HTA)",
    "rounding": "none: sub-microsecond timestamps kept",
    "bad_events": "events without dur, or with a NaN, negative or over-a-day duration, are "
                  "skipped and counted (never taken as zero)",
}
RULES_HTA = {
    **RULES_DEFAULT,
    "mode": "hta_compatible",
    "sync_events": "as HTA: cuda_sync events on stream -1 left out, the others (on a stream, "
                   "or on stream 4294967295 as some Kineto versions write -1) counted busy",
    "kernels_without_launch": "as HTA: dropped when the trace has two or more ProfilerSteps, "
                              "kept otherwise",
    "rounding": "as HTA: each interval rounded inward to whole microseconds (start up, end "
                "down; one under 1 us then ends before it starts and, as in HTA, takes up to "
                "1 us off the busy time; totals floored at 0)",
}


def _select(a: _Acc, hta_rounding: bool, trim_last_step: bool,
            hta_compatible: bool = False) -> _Acc:
    """The GPU events to analyse, by the rules in RULES_DEFAULT / RULES_HTA (see there and the
    module docstring); optionally round each interval inward to whole microseconds (HTA: ts =
    ceil(ts), end = floor(end)) to compare with it exactly."""
    order = sorted(zip(a.rt_corr, a.rt_ts))
    rt_c = [c for c, _ in order]
    rt_t = [t for _, t in order]

    def runtime_ts(c: int) -> float | None:
        i = bisect.bisect_left(rt_c, c)
        return rt_t[i] if i < len(rt_c) and rt_c[i] == c else None

    steps = len(a.steps) >= 2
    cutoff = max(a.steps) if (trim_last_step and steps) else None
    drop_launchless = hta_compatible and steps
    b = _Acc()
    b.__dict__.update({k: v for k, v in a.__dict__.items()
                       if k not in ("ts", "end", "stream", "corr", "kind", "in_idle", "recv",
                                    "sync")})
    b.runtime_ts = runtime_ts
    b.trimmed = b.sync_n = b.launchless = b.launchless_dropped = 0
    b.sync_us = 0.0
    kept: dict[int, int] = {}
    for i in range(len(a.ts)):
        sync = a.sync[i]
        if sync and (sync == 1 or not hta_compatible):
            b.sync_n += 1
            b.sync_us += a.end[i] - a.ts[i]
            continue
        if hta_compatible and a.stream[i] == -1:
            continue   # HTA: only events with a stream are GPU events
        r = runtime_ts(a.corr[i])
        if r is None and not sync:
            b.launchless += 1
            if drop_launchless:
                b.launchless_dropped += 1
                continue
        if cutoff is not None and (r if r is not None else a.ts[i]) >= cutoff:
            b.trimmed += 1
            continue
        ts, end = a.ts[i], a.end[i]
        if hta_rounding:
            # an interval under 1 us can round to end < start; HTA keeps it so (it then takes
            # up to 1 us off the busy time), and so do we, to give HTA's numbers
            ts, end = float(math.ceil(ts)), float(math.floor(end))
        kept[i] = len(b.ts)
        b.ts.append(ts); b.end.append(end); b.stream.append(a.stream[i]); b.corr.append(a.corr[i])
        b.kind.append(a.kind[i]); b.in_idle.append(a.in_idle[i])
    b.recv = [(a.ts[i], a.end[i], nb) for i, nb in a.recv if i in kept]
    return b


def _warnings(a: _Acc) -> list[str]:
    out = []
    if a.no_dur:
        out.append(f"{a.no_dur} duration event(s) without dur skipped (not taken as zero-long)")
    if a.bad_time:
        out.append(f"{a.bad_time} event(s) with a NaN, infinite, negative or over-a-day "
                   "duration or an impossible timestamp skipped")
    if a.unrecognised - a.not_objects:
        out.append(f"{a.unrecognised - a.not_objects} event(s) not readable as trace events "
                   "skipped")
    if a.not_objects:
        out.append(f"{a.not_objects} traceEvents entries that are not JSON objects skipped")
    if a.bad_args:
        out.append(f"{a.bad_args} GPU event(s) whose stream or correlation is not an integer "
                   "skipped")
    if a.nccl_bad:
        out.append(f"{a.nccl_bad} NCCL receive(s) whose message size (In msg nelems) cannot be "
                   "read kept as busy time with 0 bytes: their receive wait is an upper bound")
    if a.duplicates:
        out.append(f"{a.duplicates} duplicated GPU event(s) or range(s) (the same event twice) "
                   "counted once")
    return out


def analyze_rank(a: _Acc, link_gbps: float | None = None, kernel_wait_us: float = 30.0,
                 bins: int = 20, hta_rounding: bool = False, trim_last_step: bool = True,
                 hta_compatible: bool = False) -> dict:
    """One rank's numbers (see the module docstring). `hta_compatible`: HTA's rules and
    rounding (RULES_HTA) instead of ours (RULES_DEFAULT); `hta_rounding` alone only rounds."""
    a = _select(a, hta_rounding or hta_compatible, trim_last_step, hta_compatible)
    n = len(a.ts)
    counts = {
        "rules": dict(RULES_HTA if hta_compatible else RULES_DEFAULT),
        "sync_events_excluded": a.sync_n,
        "sync_excluded_us": a.sync_us,
        "gpu_events_without_launch": a.launchless,
        "gpu_events_without_launch_dropped": a.launchless_dropped,
        "events_without_dur": a.no_dur,
        "events_bad_time": a.bad_time,
        "events_duplicate": a.duplicates,
        "events_malformed": a.not_objects + a.bad_args,
        "nccl_recv_size_unknown": a.nccl_bad,
        "warnings": _warnings(a),
    }
    if n == 0:
        return {"gpu_events": 0, "events": a.events, "events_unrecognised": a.unrecognised,
                "span_us": 0.0, "busy_us": 0.0,
                "idle_us": 0.0, "busy_frac": None, "reason": "no GPU events in this trace",
                **counts}
    allv = merge(list(zip(a.ts, a.end)))
    # floored at 0: only HTA's rounding (intervals under 1 us turned inside out) can take them
    # below, on a trace of almost nothing but such intervals
    span = max(0.0, allv[-1][1] - allv[0][0])
    busy = min(span, max(0.0, length(allv)))
    comp = min(busy, max(0.0, length(merge([(a.ts[i], a.end[i]) for i in range(n)
                                            if a.kind[i] == 0]))))
    comm = min(busy, max(0.0, length(merge([(a.ts[i], a.end[i]) for i in range(n)
                                            if a.kind[i] == 1]))))
    # time bins: busy fraction over time
    t0, width = allv[0][0], span / bins if span > 0 else 1.0
    busy_bins = [0.0] * bins
    for s, e in allv:
        b = int((s - t0) // width)
        while s < e and b < bins:
            hi = min(e, t0 + (b + 1) * width)
            busy_bins[b] += hi - s
            s, b = hi, b + 1
    # idle split per stream as HTA does
    runtime_ts = a.runtime_ts
    rnd = math.ceil if hta_rounding else float
    split = {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
    streams: dict[int, list[int]] = {}
    for i in range(n):
        if a.in_idle[i]:
            streams.setdefault(a.stream[i], []).append(i)
    per_stream = {}
    for s, idx in streams.items():
        idx.sort(key=lambda i: a.ts[i])
        ss = {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
        for p, i in zip(idx, idx[1:]):
            gap = max(0.0, a.ts[i] - a.end[p])   # overlapping events on a stream: no gap
            rts = runtime_ts(a.corr[i])
            if rts is not None and rnd(rts) > a.end[p]:
                cat = "host_wait"
            elif gap < kernel_wait_us:
                cat = "kernel_wait"
            else:
                cat = "other"
            ss[cat] += gap
        per_stream[str(s)] = {k + "_us": v for k, v in ss.items()}
        for k in split:
            split[k] += ss[k]
    # graph vs one-by-one
    g = [i for i in range(n) if a.corr[i] in a.graph_corr]
    graph_us = sum(a.end[i] - a.ts[i] for i in g)
    # NCCL receives: transfer vs waiting
    recv_total = sum(e - s for s, e, _ in a.recv)
    recv_bytes = sum(b for _, _, b in a.recv)
    transfer = None
    if link_gbps:
        transfer = sum(min(e - s, b / (link_gbps * 1e3)) for s, e, b in a.recv)  # GB/s -> B/us
    # dispatch latency (GPU): receive end -> next compute kernel start
    comp_starts = sorted(a.ts[i] for i in range(n) if a.kind[i] == 0)
    lat = []
    for _, e, _ in a.recv:
        j = bisect.bisect_left(comp_starts, e)
        if j < len(comp_starts):
            lat.append(comp_starts[j] - e)
    # dispatch latency (CPU): recv_requests end -> run_batch start in the same loop iteration.
    # SGLang's PP loop calls recv_requests every iteration, empty slots included, and run_batch
    # only when the slot has a batch: a run_batch after the next recv_requests is not this one's.
    cpu_lat = []
    rb = sorted(s for s, _ in a.range_iv.get("run_batch", []))
    rr = sorted(a.range_iv.get("recv_requests", []))
    for k, (_, e) in enumerate(rr):
        j = bisect.bisect_left(rb, e)
        nxt = rr[k + 1][0] if k + 1 < len(rr) else math.inf
        if j < len(rb) and rb[j] < nxt:
            cpu_lat.append(rb[j] - e)
    # the compute stream (most compute-kernel time): its idle split is the one that says why
    # the forward was not running; other streams (NCCL) idle while compute runs, by design
    comp_by_stream: dict[int, float] = {}
    for i in range(n):
        if a.kind[i] == 0:
            comp_by_stream[a.stream[i]] = comp_by_stream.get(a.stream[i], 0.0) + a.end[i] - a.ts[i]
    main = max(comp_by_stream, key=comp_by_stream.get) if comp_by_stream else None
    main_split = (dict(stream=main, **per_stream[str(main)]) if str(main) in per_stream else None)
    return {
        "events": a.events,
        "events_unrecognised": a.unrecognised,
        "gpu_events": n,
        "gpu_events_last_step_dropped": a.trimmed,
        "span_us": span,
        "busy_us": busy,
        "idle_us": span - busy,
        "busy_frac": busy / span if span > 0 else None,
        "compute_us": comp,
        "non_compute_us": busy - comp,
        "comm_us": comm,
        # timestamps are ~1e12 us, so bin edges carry ~1e-3 us of float error: clamp to [0, 1]
        "busy_frac_over_time": [round(min(1.0, b / width), 6) for b in busy_bins] if span > 0 else [],
        "bin_us": width,
        "idle_split_us": split,
        "idle_split_by_stream": per_stream,
        "idle_split_compute_stream_us": main_split,
        "kernel_wait_threshold_us": kernel_wait_us,
        "graph_kernels": len(g),
        "graph_kernel_us": graph_us,
        "eager_kernels": n - len(g),
        "graph_launches": len(a.graph_corr),
        "nccl_recv": {"kernels": len(a.recv), "total_us": recv_total, "bytes": recv_bytes,
                      "link_gbps": link_gbps, "transfer_us": transfer,
                      "wait_us": None if transfer is None else recv_total - transfer},
        "dispatch_latency_us": {"n": len(lat), "p50": _pct(lat, 0.5), "p99": _pct(lat, 0.99)},
        "cpu_dispatch_latency_us": {"n": len(cpu_lat), "p50": _pct(cpu_lat, 0.5),
                                    "p99": _pct(cpu_lat, 0.99)},
        "scheduler_ranges_us": {k: {"count": int(v[0]), "total_us": v[1]}
                                for k, v in a.ranges.items() if k in SCHEDULER_RANGES},
        "user_annotations_us": {k: {"count": int(v[0]), "total_us": v[1]}
                                for k, v in sorted(a.ranges.items(), key=lambda kv: -kv[1][1])[:20]},
        **counts,
    }


_RANK_RES = (re.compile(r"-PP-(\d+)"), re.compile(r"rank[-_]?(\d+)", re.I))


def read_trace(path: str | Path, **kw) -> tuple[int | None, dict]:
    path = Path(path)
    meta: dict = {}
    a = _scan(path, meta)
    rank = None
    di = meta.get("distributedInfo")
    for rx in _RANK_RES[:1]:
        m = rx.search(path.name)
        if m:
            rank = int(m.group(1))
    if rank is None and isinstance(di, dict) and type(di.get("rank")) is int:
        rank = di["rank"]
        if not 0 <= rank < 1 << 16:
            raise TraceError(f"{path}: distributedInfo.rank is {rank}; a rank is 0 or more")
    if rank is None:
        m = _RANK_RES[1].search(path.name)
        rank = int(m.group(1)) if m else None
    out = analyze_rank(a, **kw)
    bad = a.not_objects + a.bad_args
    if not out["gpu_events"] and bad:   # never an `ok` record of nothing from a broken file
        raise TraceError(f"{path}: no usable GPU event: {bad} of its {a.events} events are "
                         "malformed (not JSON objects, or a stream / correlation that is not "
                         "an integer)")
    out["file"] = path.name
    out.update(_identity(a, meta, path.name))
    return rank, out


def _identity(a: _Acc, meta: dict, name: str) -> dict:
    """What says which server, rank and time a trace is of (microbench/sglang/evidence.py
    checks the ranks against each other): the window on the host's clock (Kineto's
    `baseTimeNanoseconds` + ts), the device, `distributedInfo`'s rank and PP group; and the
    point-to-point messages (`_comm`, not kept in the record) for the clock offset."""
    base = meta.get("baseTimeNanoseconds")
    base_us = base / 1e3 if type(base) is int and 0 <= base < 1 << 63 else 0.0
    dev = meta.get("deviceProperties")
    dev = dev[0].get("name") if isinstance(dev, list) and dev and isinstance(dev[0], dict) \
        else None
    di = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    rank = di.get("rank") if type(di.get("rank")) is int else None
    ws = di.get("world_size") if type(di.get("world_size")) is int else None
    pp_group = None      # SGLang 0.5.23 names its PP group "pp" (distributed/parallel_state.py)
    for g in di.get("pg_config") or ():
        if (isinstance(g, dict) and str(g.get("pg_desc", "")).startswith("pp:")
                and isinstance(g.get("ranks"), list) and rank in g["ranks"]):
            pp_group = [r for r in g["ranks"] if type(r) is int]
            break
    m = _NAME_RE.search(name)
    return {"window_unix_s": ([(base_us + a.t_lo) / 1e6, (base_us + a.t_hi) / 1e6]
                              if a.t_hi >= a.t_lo else []),
            "device": dev if isinstance(dev, str) else None,
            "dist_rank": rank, "world_size": ws, "pp_group": pp_group,
            "name_tp": int(m.group("tp")) if m else None,
            "_comm": {t: {k: sorted(v) for k, v in d.items()} for t, d in a.comm.items()}}


def find_traces(src) -> list[Path]:
    """Trace files from a directory, a file, or a list of either (in that order, deduplicated)."""
    out: list[Path] = []
    for d in ([src] if isinstance(src, (str, Path)) else list(src)):
        d = Path(d)
        if d.is_file():
            files = [d]
        elif d.is_dir():
            files = sorted(p for p in d.iterdir()
                           if p.is_file() and re.search(r"\.json(\.gz)?$", p.name))
            if not files:
                raise TraceError(f"{d}: no *.json / *.json.gz traces in it")
        elif os.path.lexists(d):   # a FIFO, a device, a symbolic-link loop: said as such
            open_input(d, "Kineto trace", TraceError).close()
            raise TraceError(f"{d}: not a trace directory or file")
        else:
            raise TraceError(f"{d}: no such trace directory or file")
        out += [f for f in files if f not in out]
    return out


_NAME_RE = re.compile(r"-TP-(?P<tp>\d+)(?:-DP-\d+)?(?:-PP-(?P<pp>\d+))?(?:-EP-\d+)?"
                      r"(?:-(?P<stage>EXTEND|DECODE))?\.trace\.json")


def select_rank_files(files: list[Path]) -> tuple[list[Path], list[str]]:
    """One file per PP rank, by SGLang's names (srt/utils/profile_utils.py:
    `[prefix-]{id}-TP-{t}[-DP-{d}][-PP-{p}][-EP-{e}][-EXTEND|-DECODE].trace.json.gz`): with TP > 1
    every TP rank writes its own trace, whose scheduler loop is the same; TP 0's is read. With
    `profile_by_stage` a rank writes one file per stage; the decode one is read. A
    `merged-{id}` file (`merge_profiles`) mixes every rank and is left out beside per-rank
    files. Returns (files to read, one line per file left out)."""
    merged = [p for p in files if p.name.startswith("merged-")]
    rest = [p for p in files if p not in merged]
    if merged and not rest:
        # SGLang 0.5.23 merges on PP rank 0 when it stops (managers/scheduler_components/
        # profiler_manager.py `_merge_profile_traces`), before the other ranks have written
        # theirs: under PP the merged file can hold rank 0 alone (sgl-project/sglang#17567)
        raise TraceError(f"{merged[0].name}: a merged trace alone: under PP SGLang's "
                         "merge_profiles keeps only rank 0's events (sgl-project/sglang#17567); "
                         "profile again without merge_profiles and pass the per-rank "
                         "*-TP-*-PP-* files")
    skipped = [f"{p.name}: merged trace of every rank (per-rank files read)" for p in merged]
    best: dict[str, tuple[tuple, Path]] = {}
    keep: list[Path] = []
    for p in rest:
        m = _NAME_RE.search(p.name)
        if not m or m.group("pp") is None:
            keep.append(p)
            continue
        key = m.group("pp")
        rank = (int(m.group("tp")), {"DECODE": 0, None: 1, "EXTEND": 2}[m.group("stage")])
        if key in best and best[key][0] == rank:   # the same TP rank and stage twice
            raise TraceError(f"{p.parent}: {p.name} is a second trace for PP rank {key} (TP "
                             f"{rank[0]}), beside {best[key][1].name}: two profiles' files? "
                             "pass one profile's traces")
        if key in best:
            old_rank, old = best[key]
            loser = p if rank >= old_rank else old
            why = "another TP rank" if rank[0] != old_rank[0] else "the prefill-stage file"
            skipped.append(f"{loser.name}: {why} of PP rank {key}")
            if rank >= old_rank:
                continue
        best[key] = (rank, p)
    return keep + [p for _, p in best.values()], skipped


def _read_one(path: Path, kw: dict) -> tuple[int | None, dict]:
    return read_trace(path, **kw)


def _worker_count(files: list[Path], workers: int | None) -> int:
    if workers is not None:
        return max(1, min(int(workers), len(files)))
    try:
        size = sum(p.stat().st_size for p in files)
    except OSError:
        return 1
    # one process per rank, as HTA parses ranks; not for small traces (starting costs more)
    return min(len(files), os.cpu_count() or 1, MAX_WORKERS) if size >= PARALLEL_MIN_BYTES else 1


def read_traces(src, workers: int | None = None, **kw) -> Traces:
    """`traces` part of sglang.json, typed (reports/base/payloads/sglang.py `Traces`). `src`: a directory (one
    profile's per-rank traces), a file, or a list of them. Two traces of the same rank (say two
    profiles in one directory) are an error, not a guess; a file whose rank cannot be told is
    keyed by its position. Ranks are read in parallel processes (`workers`, default one per
    rank up to the cores and MAX_WORKERS when the files hold 4 MB or more); the record does not
    depend on it. Keyword arguments go to analyze_rank (link_gbps, hta_compatible, ...)."""
    files, skipped = select_rank_files(find_traces(src))
    n = _worker_count(files, workers)
    if n > 1:
        import concurrent.futures as cf
        import multiprocessing as mp
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
        with cf.ProcessPoolExecutor(max_workers=n, mp_context=ctx) as ex:
            results = list(ex.map(_read_one, files, [kw] * len(files)))
    else:
        results = [read_trace(p, **kw) for p in files]
    ranks: dict[str, dict] = {}
    for i, (p, (r, out)) in enumerate(zip(files, results)):
        key = str(r if r is not None else i)
        if key in ranks:
            raise TraceError(f"{p}: a second trace for rank {key} (first: {ranks[key]['file']}); "
                             f"pass one profile's traces (files or a directory)")
        ranks[key] = out       # its `warnings` are said by the caller once the run is kept
    from microbench.sglang.evidence import check_trace_ranks
    clock = check_trace_ranks(ranks, {str(r if r is not None else i): p for i, (p, (r, _))
                                      in enumerate(zip(files, results))})
    out = {"dir": ", ".join(str(x) for x in ([src] if isinstance(src, (str, Path)) else src)),
           "ranks": ranks}
    if clock:
        out["clock"] = clock
    if skipped:
        out["files_skipped"] = skipped
    return from_json(Traces, out, "traces")
