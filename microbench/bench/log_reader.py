"""Benchmark ppscope's SGLang server-log reader on a large generated log: MB/s and peak memory.

`python -m microbench.bench.log_reader [--mb 500] [--keep] [--file LOG] [--workers 1,default]`:
writes a log of about `--mb` MB to a temporary directory (or reads `--file`), then runs
`read_logs` on it in a separate interpreter, once per `--workers` entry (a number of worker
processes, 1 = this process alone, `default` = read_logs' own choice for this machine), and
prints wall seconds and MB/s, the CPU seconds spent, and (from a second run of each, sampling
/proc) the peak memory of the reader and its worker processes together (a figure that, unlike wall time, does not
depend on what else the machine is running); see bench_common.py for how they are measured.

The generated log is a worst case for the reader, not a pretty one: an 8-stage pipeline whose
every scheduler logs with SGLANG_LOG_MS (millisecond timestamps, so no two prefixes repeat),
about 70% `Decode batch` lines (a mix of current, early-2025 `Decode batch.` and trailing-comma
layouts, some with speculative-decoding fields), 10% `Prefill batch` lines and 20% HTTP access
lines, in the layouts SGLang writes (srt/managers/scheduler_components/metrics_reporter.py,
SGLang 0.5.23; older layouts as in sgl-project/sglang issues #3909 and #4407).
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from microbench.bench.common import measured, run_child

_OURS = ("import sys; from microbench.bench.log_reader import _child; "
         "_child(sys.argv[3:], int(sys.argv[1]) or None, sys.argv[2] == 'memory')")


def _child(files: list[str], workers: int | None, memory: bool) -> None:
    """In the measured interpreter: read the logs, print the figures as JSON."""
    import json

    from microbench.sglang import log
    out: dict = {}

    def run() -> None:
        s = log.read_logs(files, workers=workers)
        out.update(lines_total=s.log.lines_total, lines_batch=s.log.lines_batch)
    print(json.dumps({**measured(run, sample_s=0.05 if memory else None), **out}))


def make_log(dst: Path, mb: float, pp: int = 8, seed: int = 0) -> int:
    """Write about `mb` MB of SGLang server log to `dst`; returns its size in bytes."""
    rnd = random.Random(seed)
    target = int(mb * 1e6)
    t = 1_760_000_000.0
    size = 0
    with open(dst, "w", encoding="utf-8") as f:
        buf: list[str] = []
        while size < target:
            for _ in range(2000):
                t += rnd.random() * 0.02
                ms = int((t % 1) * 1000)
                stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + f".{ms:03d}"
                r = rnd.random()
                p = rnd.randrange(pp)
                if r < 0.70:
                    n = rnd.choice((0, 1, 2, 4, 8, 8, 16, 32))
                    graph = "True" if rnd.random() < 0.9 else "False"
                    style = rnd.random()
                    if style < 0.6:
                        line = (f"[{stamp} PP{p}] Decode batch, #running-req: {n}, #token: "
                                f"{rnd.randrange(100000)}, token usage: 0.{rnd.randrange(100):02d}, "
                                f"cuda graph: {graph}, gen throughput (token/s): "
                                f"{rnd.random() * 3000:.2f}, #queue-req: {rnd.randrange(8)}")
                    elif style < 0.8:
                        line = (f"[{stamp} PP{p}] Decode batch. #running-req: {n}, #token: "
                                f"{rnd.randrange(100000)}, token usage: 0.{rnd.randrange(100):02d}, "
                                f"cuda graph: {graph}, gen throughput (token/s): "
                                f"{rnd.random() * 3000:.2f}, #queue-req: {rnd.randrange(8)}, ")
                    else:
                        line = (f"[{stamp} PP{p}] Decode batch [{rnd.randrange(10**6)}], "
                                f"#running-req: {n}, #token: {rnd.randrange(100000)}, token usage: "
                                f"0.{rnd.randrange(100):02d}, #cached-token: {rnd.randrange(999)}, "
                                f"accept len: 3.{rnd.randrange(99):02d}, accept rate: 0.7{rnd.randrange(9)}, "
                                f"cuda graph: {graph}, gen throughput (token/s): "
                                f"{rnd.random() * 3000:.2f}, #queue-req: {rnd.randrange(8)}")
                elif r < 0.80:
                    line = (f"[{stamp} PP{p}] Prefill batch, #new-seq: {rnd.randrange(1, 9)}, "
                            f"#new-token: {rnd.randrange(8192)}, #cached-token: {rnd.randrange(999)}, "
                            f"token usage: 0.{rnd.randrange(100):02d}, #running-req: "
                            f"{rnd.randrange(64)}, #queue-req: {rnd.randrange(8)}, #pending-token: "
                            f"{rnd.randrange(9999)}, cuda graph: False, input throughput (token/s): "
                            f"{rnd.random() * 20000:.2f}")
                else:
                    line = (f"[{stamp}] INFO:     10.0.{rnd.randrange(256)}.{rnd.randrange(256)}:"
                            f"{rnd.randrange(65536)} - \"POST /v1/chat/completions HTTP/1.1\" 200 OK")
                buf.append(line)
            chunk = "\n".join(buf) + "\n"
            buf.clear()
            f.write(chunk)
            size += len(chunk)
    return dst.stat().st_size


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=500.0, help="size of the generated log (default 500)")
    p.add_argument("--file", nargs="+", help="read these logs instead of generating one")
    p.add_argument("--keep", action="store_true", help="keep the generated log in the current "
                   "directory and print its path")
    p.add_argument("--workers", default="1,default", help="comma-separated worker counts to run "
                   "(`default`: read_logs' own choice on this machine); default 1,default")
    a = p.parse_args(argv)
    try:
        counts = [0 if w.strip() == "default" else int(w) for w in a.workers.split(",")]
    except ValueError:
        raise SystemExit(f"--workers: numbers or `default`, got {a.workers!r}") from None
    if any(n < 0 for n in counts):
        raise SystemExit(f"--workers: numbers or `default`, got {a.workers!r}")
    if not 0 < a.mb <= 100_000:
        raise SystemExit(f"--mb must be in (0, 100000], got {a.mb}")
    with tempfile.TemporaryDirectory() as d:
        if a.file:
            files = a.file
        else:
            big = Path(d) / "server.log"
            t0 = time.perf_counter()
            make_log(big, a.mb)
            print(f"generated {big.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - t0:.0f} s")
            files = [str(big)]
        size = sum(os.path.getsize(f) for f in files)
        from microbench.sglang.log import worker_count
        for workers in counts:
            n = worker_count([Path(f) for f in files], workers or None)
            name = (f"default ({n} worker process{'es' if n > 1 else ''} here)" if not workers
                    else "one process" if workers == 1 else f"{workers} worker processes")
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
            m = run_child(_OURS, [str(workers), "time", *files])
            m["peak_mb"] = run_child(_OURS, [str(workers), "memory", *files])["peak_mb"]
            print(f"{name}: read {size / 1e6:.0f} MB in {m['wall_s']:.1f} s wall (interpreter "
                  f"start included): {size / 1e6 / m['wall_s']:.1f} MB/s; peak memory "
                  f"{m['peak_mb']:.0f} MB (reader and its workers together); {m['cpu_s']:.1f} CPU "
                  f"s ({size / 1e6 / m['cpu_s']:.1f} MB per CPU s); {m['lines_total']} lines, "
                  f"{m['lines_batch']} batch lines; load average before: {load:.1f}")
        if a.keep and not a.file:
            keep = Path(os.getcwd()) / "server.log"
            Path(files[0]).replace(keep)
            print(f"kept {keep}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
