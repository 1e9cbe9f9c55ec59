"""What the reader benchmarks share: run code in a fresh interpreter and measure it there.

`measured(fn)` runs `fn()` while a thread samples, every 50 ms, the memory of this process and
all its descendants (worker processes included) from /proc: the proportional set size, so pages
forked workers share are counted once (the resident set size where /proc has no smaps_rollup).
It returns the wall seconds, that peak in MB and the CPU seconds of the process and its waited-
for children. `run_child(code, args)` runs `code` in a new interpreter from the repository root
and returns the JSON object it printed last (see bench_log_reader.py, bench_trace_reader.py).
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable


def process_tree_kb(pid: int) -> int:
    """Memory of a process and all its descendants (kB): PSS, else RSS, from /proc."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            try:
                with open(f"/proc/{p}/smaps_rollup") as f:
                    total += next(int(x.split()[1]) for x in f if x.startswith("Pss:"))
            except (OSError, StopIteration):
                with open(f"/proc/{p}/status") as f:
                    total += next((int(x.split()[1]) for x in f if x.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return total


def measured(fn: Callable[[], object], sample_s: float | None = 0.05) -> dict:
    """See the module docstring. `sample_s=None`: no memory sampling (reading /proc costs CPU
    and competes with the reader; time with it off, measure memory in a second run)."""
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], process_tree_kb(os.getpid()))
            done.wait(sample_s)

    th = threading.Thread(target=sample, daemon=True)
    if sample_s:
        th.start()
    t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    done.set()
    if sample_s:
        th.join()
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"read_s": wall, "peak_mb": max(peak[0], me.ru_maxrss) / 1024 if sample_s else None,
            "cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime}


def run_child(code: str, args: list[str]) -> dict:
    """Run `code` (which prints a JSON object last) in a new interpreter; add its wall time."""
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[2])
    wall = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"reader failed: {r.stderr.strip().splitlines()[-1:]}")
    return {"wall_s": wall, **json.loads(r.stdout.strip().splitlines()[-1])}
