"""Copy-engine bandwidth and latency between GPUs, and between each GPU and pinned host memory.

What is measured (GB = 1e9 bytes), mirroring cuda-samples' p2pBandwidthLatencyTest so the two
can be compared number for number:
- per ordered pair i->j: unidirectional bandwidth of P2P writes (copy issued on i's stream,
  i's buffer -> j's buffer) and P2P reads (issued on i's stream, j's buffer -> i's buffer) with
  peer access enabled; the same write with peer access disabled (the driver stages it through
  host memory); bidirectional bandwidth (i->j and j->i at once, on one stream per GPU) with
  P2P enabled and disabled. Buffer 40,000,000 ints (160 MB), 5 copies per timed sample, like
  the sample; we take several samples and report the median (p20/p80 kept).
- latency: a 16-byte copy repeated 100 times per sample, time per copy, both directions, with
  P2P enabled and disabled (the sample's method).
- pinned host<->device bandwidth per GPU (exposes which NUMA node a GPU hangs off).
- the ring: every pipeline pair i->i+1 and last->first copying at the same time. On some hosts
  concurrent writes collapse while any single pair looks fine.

How: cupy's CUDA runtime bindings. Peer access is switched on and off per pair in one process
(`deviceEnablePeerAccess` / `deviceDisablePeerAccess`), copies are `cudaMemcpyPeerAsync` (copy
engines), and each sample is queued behind `microbench.kit.timing.SpinBlocker` so host enqueue
time stays out of the CUDA-event interval. Every copy path is first checked on random data.

Read it: `bandwidth_gbps` is the median over samples; a `waived` entry says why it was not
measured (e.g. NVML/CUDA report no P2P between that pair: host-staged numbers are still given).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

from microbench.kit.timing import summarize

CUDA_SAMPLES_ELEMS = 40_000_000     # p2pBandwidthLatencyTest's numElems (ints)


@dataclass(frozen=True)
class P2PConfig:
    nbytes: int = CUDA_SAMPLES_ELEMS * 4
    repeat: int = 5                  # copies per timed sample (cuda-samples: 5)
    samples: int = 3
    latency_bytes: int = 16          # one int4, like the sample
    latency_repeat: int = 100
    # The spin kernel gives up after this long. cuda-samples' delay kernel waits ~10M clocks
    # (a few ms); 50 ms leaves room for slow enqueues (host-staged copies can block the host)
    # while bounding what such a block costs per sample.
    spin_timeout_s: float = 0.05
    # Warm-up before the timed samples: repeat the whole sample's copies until this much host
    # time has passed (at least once), so clocks, staging buffers and peer mappings settle.
    warmup_ms: float = 30.0
    # Host-staged copies (peer access off) are paced by the host, so one sample is noisier
    # than a copy-engine one; take at least this many.
    staged_min_samples: int = 3
    bidirectional: bool = True
    reads: bool = True
    ring: bool = True
    host: bool = True


def _cupy():
    import cupy as cp
    return cp, cp.cuda.runtime


def _is(err: Exception, name: str) -> bool:
    return name in str(err)


@contextlib.contextmanager
def peer_access(pairs: list[tuple[int, int]], on: bool):
    """Enable (on=True) or make sure of disabled (on=False) peer access both ways for pairs;
    whatever was enabled here is disabled again on exit."""
    cp, rt = _cupy()
    enabled: list[tuple[int, int]] = []
    try:
        for i, j in pairs:
            for a, b in ((i, j), (j, i)):
                with cp.cuda.Device(a):
                    if on:
                        try:
                            rt.deviceEnablePeerAccess(b)
                            enabled.append((a, b))
                        except rt.CUDARuntimeError as e:
                            if not _is(e, "AlreadyEnabled"):
                                raise
                    else:
                        try:
                            rt.deviceDisablePeerAccess(b)
                        except rt.CUDARuntimeError as e:
                            if not _is(e, "NotEnabled"):
                                raise
        yield
    finally:
        for a, b in enabled:
            with cp.cuda.Device(a):
                try:
                    rt.deviceDisablePeerAccess(b)
                except rt.CUDARuntimeError:
                    pass


class Buffers:
    """Two device buffers per GPU (`src`, `dst`) so simultaneous copies never share memory."""

    def __init__(self, devices: list[int], nbytes: int):
        cp, _ = _cupy()
        self.nbytes = nbytes
        self.mem: dict[int, tuple] = {}
        for d in devices:
            with cp.cuda.Device(d):
                self.mem[d] = (cp.cuda.Memory(nbytes), cp.cuda.Memory(nbytes))

    def src(self, d: int) -> int:
        return self.mem[d][0].ptr

    def dst(self, d: int) -> int:
        return self.mem[d][1].ptr


def check_copy(bufs: Buffers, dst_dev: int, src_dev: int, stream, stream_dev: int) -> None:
    """Copy random ints src_dev->dst_dev with the same call the timing uses (on `stream`, which
    belongs to `stream_dev`); compare on the host."""
    cp, rt = _cupy()
    n = min(bufs.nbytes, 1 << 20) // 4
    ref = np.random.default_rng(1000 * src_dev + dst_dev).integers(
        1, 2**31 - 1, size=n, dtype=np.int32)
    out = np.zeros_like(ref)
    rt.memcpy(bufs.src(src_dev), ref.ctypes.data, n * 4, rt.memcpyDefault)
    with cp.cuda.Device(stream_dev):
        rt.memcpyPeerAsync(bufs.dst(dst_dev), dst_dev, bufs.src(src_dev), src_dev, n * 4,
                           stream.ptr)
        stream.synchronize()
    rt.memcpy(out.ctypes.data, bufs.dst(dst_dev), n * 4, rt.memcpyDefault)
    if not np.array_equal(out, ref):
        raise RuntimeError(f"copy GPU{src_dev}->GPU{dst_dev} returned wrong data")


class Bench:
    """Per-process state: one non-blocking stream, start/stop events and buffers per GPU."""

    def __init__(self, devices: list[int], cfg: P2PConfig):
        from microbench.kit.timing import SpinBlocker

        cp, _ = _cupy()
        self.cp, self.cfg = cp, cfg
        self.blocker = SpinBlocker(timeout_s=cfg.spin_timeout_s)
        self.streams, self.side, self.ev = {}, {}, {}
        for d in devices:
            with cp.cuda.Device(d):
                self.streams[d] = cp.cuda.Stream(non_blocking=True)
                self.side[d] = cp.cuda.Stream(non_blocking=True)
                self.ev[d] = (cp.cuda.Event(), cp.cuda.Event(), cp.cuda.Event())
        self.slow_enqueues = 0
        self.big = Buffers(devices, cfg.nbytes)
        self.small = Buffers(devices, max(cfg.latency_bytes, 16))

    def _sample(self, dev: int, enqueue: Callable[[], None], block: bool = True) -> float:
        """Milliseconds between events around `enqueue()` on `dev`'s stream, queued behind
        the spin kernel (the sample's `delay` kernel) when `block`.

        Host-staged copies (peer access off) are not blocked: the driver's staged
        cudaMemcpyPeerAsync does not return until the stream reaches it, so behind a spin
        kernel the first call just waits for the spin's timeout (on 2x H200 every staged
        sample took > 50 ms to enqueue) and the copies then run host-paced anyway. The
        interval is the same either way; not blocking saves the timeout per sample."""
        import time

        cp = self.cp
        s = self.streams[dev]
        start, stop, _ = self.ev[dev]
        with cp.cuda.Device(dev):
            s.synchronize()
            if block:
                self.blocker.block(s)
            t0 = time.perf_counter()
            start.record(s)
            enqueue()
            stop.record(s)
            if block and time.perf_counter() - t0 > self.cfg.spin_timeout_s:
                self.slow_enqueues += 1  # the copies started before all were queued
            if block:
                self.blocker.release()
            stop.synchronize()
            return cp.cuda.get_elapsed_time(start, stop)

    def _warmup(self, dev: int, enqueue: Callable[[], None]) -> int:
        """Run the sample's copies until cfg.warmup_ms of host time has passed (at least once,
        at most 20 times); the first copies after a peer-access change are never timed."""
        import time

        t0, n = time.perf_counter(), 0
        while n < 20 and (n == 0 or (time.perf_counter() - t0) * 1e3 < self.cfg.warmup_ms):
            enqueue()
            with self.cp.cuda.Device(dev):
                self.streams[dev].synchronize()
                self.side[dev].synchronize()
            n += 1
        return n

    def _timed(self, dev: int, enqueue: Callable[[], None], reps: int, nbytes: int,
               samples: int, staged: bool = False) -> dict:
        self._warmup(dev, enqueue)
        slow = self.slow_enqueues
        if staged:
            samples = max(samples, self.cfg.staged_min_samples)
        per_copy_us = [self._sample(dev, enqueue, block=not staged) * 1e3 / reps
                       for _ in range(samples)]
        t = summarize(per_copy_us)
        extra = {"slow_enqueue_samples": self.slow_enqueues - slow} \
            if self.slow_enqueues > slow else {}
        return {"bytes": nbytes, "time_us": t.median_us, "time_p20_us": t.p20_us,
                "time_p80_us": t.p80_us, "bandwidth_gbps": nbytes / t.median_us / 1e3,
                "bandwidth_p20_gbps": nbytes / t.p80_us / 1e3,
                "bandwidth_p80_gbps": nbytes / t.p20_us / 1e3, "samples": t.n,
                "time_samples_us": list(t.samples_us), "spin_blocked": not staged, **extra}

    def _copies(self, bufs: Buffers, dst: int, src: int, stream_dev: int, stream, reps: int,
                nbytes: int):
        rt = self.cp.cuda.runtime

        def enqueue():
            with self.cp.cuda.Device(stream_dev):
                for _ in range(reps):
                    rt.memcpyPeerAsync(bufs.dst(dst), dst, bufs.src(src), src, nbytes,
                                       stream.ptr)
        return enqueue

    def unidirectional(self, i: int, j: int, read: bool = False, staged: bool = False) -> dict:
        """P2P write i->j (or read: i pulls from j), issued on i's stream. `staged`: peer
        access is off, so the driver stages the copy through host memory."""
        c = self.cfg
        src, dst = (j, i) if read else (i, j)
        check_copy(self.big, dst, src, self.streams[i], i)
        return self._timed(i, self._copies(self.big, dst, src, i, self.streams[i], c.repeat,
                                           c.nbytes), c.repeat, c.nbytes, c.samples, staged)

    def latency(self, i: int, j: int, staged: bool = False) -> dict:
        c = self.cfg
        r = self._timed(i, self._copies(self.small, j, i, i, self.streams[i], c.latency_repeat,
                                        c.latency_bytes), c.latency_repeat, c.latency_bytes,
                        c.samples, staged)
        return {"bytes": c.latency_bytes, "latency_us": r["time_us"],
                "latency_p20_us": r["time_p20_us"], "latency_p80_us": r["time_p80_us"]}

    def bidirectional(self, i: int, j: int, staged: bool = False) -> dict:
        """i->j on i's stream and j->i on a stream of j that starts when i's start event fires;
        i's stream waits for j's to finish; 2 x bytes over the interval (the sample's method)."""
        cp, c = self.cp, self.cfg
        rt = cp.cuda.runtime
        s0, s1 = self.streams[i], self.side[j]
        start, _, _ = self.ev[i]
        _, _, done_j = self.ev[j]
        check_copy(self.big, j, i, s0, i)
        check_copy(self.big, i, j, s1, j)

        def enqueue():
            with cp.cuda.Device(j):
                s1.wait_event(start)
                for _ in range(c.repeat):
                    rt.memcpyPeerAsync(self.big.dst(i), i, self.big.src(j), j, c.nbytes, s1.ptr)
                done_j.record(s1)
            with cp.cuda.Device(i):
                for _ in range(c.repeat):
                    rt.memcpyPeerAsync(self.big.dst(j), j, self.big.src(i), i, c.nbytes, s0.ptr)
                s0.wait_event(done_j)
        # _sample records `start` on s0 before enqueue() runs, so s1 waits on this sample's start.
        return self._timed(i, enqueue, c.repeat, 2 * c.nbytes, c.samples, staged)

    def host(self, d: int) -> list[dict]:
        """Pinned host <-> device bandwidth of GPU d."""
        cp, c = self.cp, self.cfg
        rt = cp.cuda.runtime
        pinned = cp.cuda.alloc_pinned_memory(c.nbytes)
        # check both directions on random data before timing
        n = min(c.nbytes, 1 << 20) // 4
        host = np.frombuffer(pinned, dtype=np.int32, count=n)
        host[:] = np.random.default_rng(d).integers(1, 2**31 - 1, size=n, dtype=np.int32)
        ref = host.copy()
        rt.memcpy(self.big.src(d), pinned.ptr, n * 4, rt.memcpyHostToDevice)
        host[:] = 0
        rt.memcpy(pinned.ptr, self.big.src(d), n * 4, rt.memcpyDeviceToHost)
        if not np.array_equal(host, ref):
            raise RuntimeError(f"host<->GPU{d} copy returned wrong data")
        out = []
        for direction, kind in (("h2d", rt.memcpyHostToDevice), ("d2h", rt.memcpyDeviceToHost)):
            dst, src = ((self.big.dst(d), pinned.ptr) if direction == "h2d"
                        else (pinned.ptr, self.big.src(d)))
            s = self.streams[d]

            def enqueue(dst=dst, src=src, kind=kind):
                with cp.cuda.Device(d):
                    for _ in range(c.repeat):
                        rt.memcpyAsync(dst, src, c.nbytes, kind, s.ptr)
            out.append({"gpu": d, "direction": direction, "status": "ok",
                        **self._timed(d, enqueue, c.repeat, c.nbytes, c.samples)})
        return out

    def ring(self, pairs: list[tuple[int, int]]) -> list[dict]:
        """All pairs copy at once (writes, issued on each source's own stream). Each pair is
        timed with its own events, as events on different GPUs cannot be subtracted."""
        cp, c = self.cp, self.cfg
        rt = cp.cuda.runtime
        for src, dst in pairs:
            check_copy(self.big, dst, src, self.streams[src], src)
        srcs = [s for s, _ in pairs]
        samples: dict[tuple[int, int], list[float]] = {p: [] for p in pairs}
        for _ in range(c.samples + 1):  # the first round is the warm-up
            for s in srcs:
                with cp.cuda.Device(s):
                    self.streams[s].synchronize()
                    self.blocker.block(self.streams[s])  # one flag releases every stream
            for src, dst in pairs:
                start, stop, _ = self.ev[src]
                st = self.streams[src]
                with cp.cuda.Device(src):
                    start.record(st)
                    for _ in range(c.repeat):
                        rt.memcpyPeerAsync(self.big.dst(dst), dst, self.big.src(src), src,
                                           c.nbytes, st.ptr)
                    stop.record(st)
            self.blocker.release()
            for src, dst in pairs:
                start, stop, _ = self.ev[src]
                with cp.cuda.Device(src):
                    stop.synchronize()
                    samples[(src, dst)].append(cp.cuda.get_elapsed_time(start, stop) * 1e3
                                               / c.repeat)
        out = []
        for (src, dst), us in samples.items():
            t = summarize(us[1:])
            out.append({"src": src, "dst": dst, "bytes": c.nbytes, "time_us": t.median_us,
                        "bandwidth_gbps": c.nbytes / t.median_us / 1e3})
        return out


def can_access_peer(i: int, j: int) -> bool:
    _, rt = _cupy()
    return bool(rt.deviceCanAccessPeer(i, j)) and bool(rt.deviceCanAccessPeer(j, i))


def device_bus_ids(n: int) -> list[str]:
    """CUDA's PCI bus id of each ordinal (to prove CUDA order == NVML order)."""
    cp, rt = _cupy()
    return [rt.deviceGetPCIBusId(d).lower() for d in range(n)]


def device_count() -> int:
    _, rt = _cupy()
    return rt.getDeviceCount()
