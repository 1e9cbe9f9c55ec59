"""Benchmark ppscope's streaming trace reader against Holistic Trace Analysis on one large trace.

`python -m microbench.sglang.bench_trace_reader FILE [--repeat N] [--keep]`: builds a large trace by
repeating FILE's `traceEvents` N times, each copy shifted past the previous one in time and with
correlation ids offset (a long, valid single-rank trace), writes it gzipped to a temporary
directory, then times in separate subprocesses (so peak RSS is each reader's own, read from
`resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`):
- ppscope: `sglang_trace.read_trace` (busy/idle, idle split, NCCL receives, ...);
- HTA: `TraceAnalysis(trace_dir=...)` + `get_temporal_breakdown()`.
Prints wall seconds and peak RSS (MB) of each and the ratios. Needs HolisticTraceAnalysis.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_OURS = "from microbench.sglang import trace as t; import sys; t.read_trace(sys.argv[1])"
_HTA = ("import logging, sys; logging.disable(logging.WARNING);"
        "from hta.trace_analysis import TraceAnalysis;"
        "TraceAnalysis(trace_dir=sys.argv[1]).get_temporal_breakdown(visualize=False)")


def make_large(src: Path, dst: Path, repeat: int) -> int:
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    ev = doc["traceEvents"]
    ts = [e["ts"] + e.get("dur", 0) for e in ev if isinstance(e.get("ts"), (int, float))]
    t_min = min(e["ts"] for e in ev if isinstance(e.get("ts"), (int, float)))
    shift = max(ts) - t_min + 1000.0
    corr_max = max([int((e.get("args") or {}).get("correlation", 0)) for e in ev] +
                   [int(e.get("id", 0)) for e in ev if isinstance(e.get("id"), int)]) + 1
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    with gzip.open(dst, "wt", compresslevel=1) as f:
        f.write("{\n" + json.dumps(head)[1:-1] + ',\n"traceEvents": [\n')
        first = True
        for r in range(repeat):
            for e in ev:
                if not isinstance(e.get("ts"), (int, float)):
                    if r:
                        continue
                    e2 = e
                else:
                    e2 = dict(e, ts=e["ts"] + r * shift)
                    a = e2.get("args")
                    if a and "correlation" in a:
                        e2["args"] = dict(a, correlation=a["correlation"] + r * corr_max)
                    if isinstance(e2.get("id"), int):
                        e2["id"] = e2["id"] + r * corr_max
                f.write(("" if first else ",\n") + json.dumps(e2))
                first = False
        f.write("\n]}\n")
    with gzip.open(dst, "rb") as f:
        return sum(len(b) for b in iter(lambda: f.read(1 << 24), b""))


def _measure(code: str, arg: str) -> tuple[float, float]:
    t0 = time.perf_counter()
    # each reader in its own interpreter; ru_maxrss of the finished child is its peak RSS (kB)
    r = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[2])
    wall = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"reader failed: {r.stderr.strip().splitlines()[-1:]}")
    return wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file", help="a Kineto trace (.json or .json.gz) to repeat")
    p.add_argument("--repeat", type=int, default=300, help="copies of the events (default 300)")
    p.add_argument("--keep", action="store_true", help="keep the large trace and print its path")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        big = Path(d) / "large-rank0.json.gz"
        n = make_large(Path(a.file), big, a.repeat)
        print(f"large trace: {n / 1e6:.0f} MB uncompressed, {big.stat().st_size / 1e6:.0f} MB gz")
        # ours first: RUSAGE_CHILDREN's maxrss is the max over children so far, so the smaller
        # reader must run first for its figure to be its own
        w_ours, m_ours = _measure(_OURS, str(big))
        w_hta, m_hta = _measure(_HTA, d)
        print(f"ppscope: {w_ours:7.1f} s  peak RSS {m_ours:7.0f} MB")
        print(f"HTA:     {w_hta:7.1f} s  peak RSS {m_hta:7.0f} MB")
        print(f"ppscope is {w_hta / w_ours:.1f}x faster and uses {m_hta / m_ours:.1f}x less memory")
        if a.keep:
            keep = Path(os.getcwd()) / big.name
            big.replace(keep)
            print(f"kept {keep}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
