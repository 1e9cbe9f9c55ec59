"""The GPU watch's own cost and rate, on a GPU machine: sample every visible GPU for N seconds
with the real sampler (microbench/watch/sampler.py) and print the ticks achieved per second, the
sampler's CPU time in % of one core (sampling, PCIe thread, record writes), the mean wall time
of each NVML call, and each GPU's utilization source and driver sample period.

    python -m microbench.bench.watch --seconds 20              # idle GPUs
    python -m microbench.bench.watch --seconds 20 --load wave  # known wave: lag = --slot-s
    python -m microbench.bench.watch --seconds 10 --load h2d   # PCIe RX under copies

`--load wave` runs bf16 matmuls on one GPU at a time, GPU i during [i, i+1) x slot of every
n x slot, so the summary must find GPU i following GPU i-1 by `--slot-s` and one GPU busy at a
time; `--load h2d` copies pinned host memory to every GPU without pause, so each GPU's PCIe RX
should read near its link's practical rate. The load runs in this process (torch), in threads of
its own: the sampler's CPU figure is the CPU time of the sampler's threads only.

`--out DIR` keeps the record (DIR/watch.json, DIR/watch.trace.json).
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path


def _wave(dev: int, n: int, slot_s: float, t0: float, stop: threading.Event) -> None:
    import torch
    torch.cuda.set_device(dev)
    a = torch.randn(8192, 8192, device=f"cuda:{dev}", dtype=torch.bfloat16)
    while not stop.is_set():
        phase = ((time.time() - t0) / slot_s) % n
        if dev <= phase < dev + 1:
            for _ in range(4):   # ~4 x 1.4 ms on an H200: short enough to leave the slot on time
                a @ a
            torch.cuda.synchronize(dev)
        else:
            stop.wait(min(0.005, slot_s / 20))


def _h2d(dev: int, stop: threading.Event, moved: dict) -> None:
    """Pinned host -> GPU copies without pause; `moved[dev]` = (bytes, seconds) from the second
    copy on, the rate NVML's PCIe RX should read (it settles whether NVML's KB is 1000 or 1024)."""
    import torch
    torch.cuda.set_device(dev)
    x = torch.empty(1 << 28, dtype=torch.uint8, pin_memory=True)
    y = torch.empty_like(x, device=f"cuda:{dev}")
    y.copy_(x)
    torch.cuda.synchronize(dev)
    n, t0 = 0, time.perf_counter()
    while not stop.is_set():
        y.copy_(x, non_blocking=True)
        torch.cuda.synchronize(dev)
        n += 1
        moved[dev] = (n * x.numel(), time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    from microbench.watch import cli as WC
    from microbench.watch import sampler as W
    from reports.base.schema import to_json
    from reports.model.observed.watch_summary import summarize
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--hz", type=float, default=10.0)
    p.add_argument("--pcie-every", type=float, default=None,
                   help="each GPU's PCIe read, s (default max(2, GPUs / 2))")
    p.add_argument("--load", choices=("none", "wave", "h2d"), default="none")
    p.add_argument("--slot-s", type=float, default=1.0, help="--load wave: seconds per GPU")
    p.add_argument("--out", default=None, help="directory for watch.json + watch.trace.json")
    a = p.parse_args(argv)
    why = W.available()
    if why:
        print(f"bench_watch: {why}", file=sys.stderr)
        return 2
    stop = threading.Event()
    moved: dict[int, tuple[int, float]] = {}
    w = W.Watch(W.WatchConfig(hz=a.hz, duration_s=a.seconds, pcie_every_s=a.pcie_every,
                              load=None if a.load == "none" else f"bench_watch --load {a.load}"))
    w.open()
    n = len(w.gpus)
    loads = []
    if a.load != "none":
        import torch  # noqa: F401 - the load needs it; the sampler does not
        t0 = time.time()
        for i in range(n):
            args = (i, n, a.slot_s, t0, stop) if a.load == "wave" else (i, stop, moved)
            loads.append(threading.Thread(target=_wave if a.load == "wave" else _h2d,
                                          args=args, daemon=True))
        for t in loads:
            t.start()
        time.sleep(1.0)   # allocations and the first kernels out of the window
    try:
        w.start()
        w.wait()
    finally:
        w.stop()
        stop.set()
        for t in loads:
            t.join()
    d = w.data()
    print(f"GPUs: {n} ({', '.join(sorted({g.name for g in d.gpus}))}); watched {d.duration_s:.2f} s")
    print(f"rate: {d.achieved_hz:.2f} Hz achieved of {d.requested_hz:g} requested "
          f"({d.ticks} ticks, {d.late_ticks} over a period late)")
    print(f"sampler CPU: {d.cpu_pct_of_core:.3f}% of one core  (" + ", ".join(
        f"{k} {v:.3f} s" for k, v in d.cpu_s.items()) + ")")
    print("NVML call, mean wall us: " + ", ".join(f"{k} {v:.0f}" for k, v in d.call_us.items()))
    print(f"driver buffer read every {d.buffer_every_s:.2f} s; PCIe each GPU every "
          f"{d.pcie_every_s:g} s")
    for g in d.gpus:
        print(f"  GPU {g.index}: util {g.util_source}, driver period {g.util_period_ms} ms, "
              f"unsupported {sorted(g.unsupported) or '-'}, errors {g.errors or '-'}")
    if d.dcgm_note:
        print(d.dcgm_note)
    print()
    print(WC.render(d))
    s = summarize(d)
    if a.load == "wave" and s.lags:
        print(f"\nwave check: expected lag {a.slot_s:g} s per neighbour; got " + ", ".join(
            f"{x.src}->{x.dst} {x.lag_s} s (r {x.r})" for x in s.lags))
    if a.load == "h2d":
        print("\nPCIe check, GB/s (1e9 B/s): NVML RX mean (KB = 1024 B) vs copied bytes / time: "
              + ", ".join(f"GPU {g.index} {to_json(g.pcie_rx_gbps)['mean']:.2f} vs "
                          f"{moved[g.index][0] / moved[g.index][1] / 1e9:.2f}"
                          for g in s.gpus if g.index in moved and g.pcie_rx_gbps.n))
    if a.out:
        dest, note = WC.save(d, Path(a.out) / "watch.json", argv=["bench_watch", *sys.argv[1:]])
        print(f"\n{note or f'wrote {dest}'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
