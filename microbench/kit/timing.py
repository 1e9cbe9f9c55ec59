"""The one timing primitive every ppscope probe uses.

Modelled on Triton's `do_bench` / `do_bench_cudagraph` and nvbandwidth:
- GPU work is timed with CUDA events around *each* iteration, after a warm-up sized by a time
  budget (so module load, JIT and handle creation stay out), with one synchronize at the end.
- Raw samples are kept; the summary is the median with p20/p80 (never the mean alone).
- Copies are timed behind a blocking spin kernel (`SpinBlocker`): the stream is held by a kernel
  that waits on a host flag while the copies and events are queued, then released. Host enqueue
  cost therefore never shows up as copy time (nvbandwidth, p2pBandwidthLatencyTest do the same).
- Host clocks are used only where host time *is* the quantity (`host_bench`), always after an
  explicit synchronize.

Nothing here touches CUDA at import time: torch and cupy are imported inside the functions.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from microbench.kit.graph_capture import capture_graph


@dataclass(frozen=True)
class Timing:
    """Summary of repeated timings, microseconds. `samples_us` keeps every raw sample."""
    median_us: float
    p20_us: float
    p80_us: float
    min_us: float
    max_us: float
    n: int
    samples_us: tuple[float, ...] = ()

    def scaled(self, factor: float) -> "Timing":
        """The same statistics divided by `factor` (e.g. per-iteration from per-batch)."""
        return summarize([s / factor for s in self.samples_us])


def summarize(samples_us: Sequence[float], keep_samples: bool = True) -> Timing:
    """Median, p20, p80 (linear interpolation, numpy's default), min, max of raw samples."""
    a = np.asarray(list(samples_us), dtype=np.float64)
    if a.size == 0:
        raise ValueError("no samples to summarize")
    if not np.all(np.isfinite(a)):
        raise ValueError("non-finite timing sample")
    p20, med, p80 = np.percentile(a, [20, 50, 80])
    return Timing(median_us=float(med), p20_us=float(p20), p80_us=float(p80),
                  min_us=float(a.min()), max_us=float(a.max()), n=int(a.size),
                  samples_us=tuple(float(x) for x in a) if keep_samples else ())


def _reps_for_budget(est_us: float, budget_ms: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, budget_ms * 1e3 / max(est_us, 1e-3))))


def do_bench(fn: Callable[[], object], *, warmup_ms: float = 25.0, rep_ms: float = 100.0,
             min_reps: int = 10, max_reps: int = 5000, stream=None) -> Timing:
    """Time `fn` (which enqueues GPU work on the current torch stream) with CUDA events.

    One pair of events per iteration; all iterations are enqueued, then a single synchronize.
    """
    import torch

    stream = stream or torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        fn()  # first call: compile / allocate; never timed
        torch.cuda.synchronize()
        # estimate the cost of one call to size warm-up and repetitions
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(5):
            fn()
        e.record()
        torch.cuda.synchronize()
        est_us = max(s.elapsed_time(e) * 1e3 / 5, 1e-3)
        for _ in range(_reps_for_budget(est_us, warmup_ms, 1, max_reps)):
            fn()
        n = _reps_for_budget(est_us, rep_ms, min_reps, max_reps)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
    return summarize([a.elapsed_time(b) * 1e3 for a, b in zip(starts, ends)])


def do_bench_graph(fn: Callable[[], object], *, warmup_ms: float = 25.0, rep_ms: float = 100.0,
                   min_reps: int = 10, max_reps: int = 5000, copies: int = 1) -> Timing:
    """Capture `fn` into a CUDA graph (kit/graph_capture.py) and time its replays (launch
    gaps shrink to ~0). `copies` > 1: the graph holds that many calls back to back and the
    figures are per call, as a layer runs inside a served decode step's graph (the replay's
    own launch cost, paid once per step, is spread over the copies; see `graph_copies`)."""
    if copies < 1:
        raise ValueError("copies must be >= 1")
    body = fn if copies == 1 else (lambda: [fn() for _ in range(copies)][-1])
    graph, _ = capture_graph(body, warmup=3)
    t = do_bench(graph.replay, warmup_ms=warmup_ms, rep_ms=rep_ms,
                 min_reps=min_reps, max_reps=max_reps)
    return t if copies == 1 else t.scaled(copies)


GRAPH_COPIES = 4


def l2_bytes(device=None) -> int:
    """The GPU's L2 cache size in bytes; 0 where unknown (no CUDA, an older torch), which
    `graph_copies` reads as one call per timing graph."""
    import torch

    try:
        return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
    except (AssertionError, RuntimeError):
        return 0


def graph_copies(bytes_per_call: int, l2_bytes: int) -> int:
    """How many back-to-back calls of one layer a timing graph may hold: `GRAPH_COPIES` when
    a call streams at least twice the L2 cache (a call's first bytes were last read a whole
    call, >= 2 L2 sizes, ago: the copies add no cache hits a served step would not have;
    checked on an H200, where MLA at b = 1, 204 MB per call against a 60 MiB L2, gained the
    same ~2.5 us from 4 copies as at b = 128, 3 GB per call), else 1."""
    return GRAPH_COPIES if l2_bytes > 0 and bytes_per_call >= 2 * l2_bytes else 1


def host_bench(fn: Callable[[], object], *, reps: int = 50, warmup: int = 5,
               sync: Callable[[], object] | None = None) -> Timing:
    """Wall-clock time of `fn` on the host, for quantities that *are* host time (dispatch,
    launch cost). `sync` (e.g. torch.cuda.synchronize) runs before each start and after each
    stop so no earlier GPU work leaks into the sample."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        if sync:
            sync()
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        samples.append((time.perf_counter() - t0) * 1e6)
    return summarize(samples)


_SPIN_SRC = r"""
extern "C" __global__ void spin_until_released(volatile int *flag, unsigned long long timeout_ns) {
    // Hold the stream until the host writes 1 to *flag, or until timeout_ns passes,
    // so a forgotten release can never hang the GPU.
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    while (*flag == 0) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - start > timeout_ns) break;
    }
}
"""


class SpinBlocker:
    """Blocks a CUDA stream with a spin kernel until `release()` (nvbandwidth's trick).

    Usage (cupy streams; a torch stream can be wrapped with cupy.cuda.ExternalStream):

        blocker = SpinBlocker()
        blocker.block(stream)          # stream now waits on the host flag
        start.record(stream); <enqueue copies>; end.record(stream)
        blocker.release()              # everything runs back to back on the GPU
        end.synchronize()

    The flag lives in mapped, pinned host memory; with unified addressing (every 64-bit
    Linux CUDA system) its host pointer is valid on the device.
    """

    def __init__(self, timeout_s: float = 2.0):
        import cupy as cp

        self._cp = cp
        self._mem = cp.cuda.alloc_pinned_memory(4)
        self._flag = np.frombuffer(self._mem, dtype=np.int32, count=1)
        self._kernel = cp.RawKernel(_SPIN_SRC, "spin_until_released")
        self.timeout_ns = int(timeout_s * 1e9)

    def block(self, stream) -> None:
        self._flag[0] = 0
        self._kernel((1,), (1,), (np.uintp(self._mem.ptr), np.uint64(self.timeout_ns)),
                     stream=stream)

    def release(self) -> None:
        self._flag[0] = 1
