"""Benchmark ppscope's streaming trace reader against Holistic Trace Analysis on large traces.

`python -m microbench.bench.trace_reader FILE [FILE ...] [--repeat N] [--keep]`: builds
one large trace per FILE (one rank each) by repeating its `traceEvents` N times, each copy
shifted past the previous one in time and with correlation ids offset (a long, valid trace),
writes them gzipped to a temporary directory, then times in separate interpreters:
- ppscope, ranks one after the other (`read_traces(..., workers=1)`, how it read them before);
- ppscope, ranks in parallel processes (`read_traces`, the default);
- HTA: `TraceAnalysis(trace_dir=...)` + `get_temporal_breakdown()` (it parses ranks in parallel).
Prints wall seconds (interpreter start and imports included) and CPU seconds, then (from a
second run of each, sampling /proc) the peak memory of each reader and its worker processes
together (see bench_common.py), and the ratios. Needs HolisticTraceAnalysis.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
from pathlib import Path

from microbench.bench.common import run_child

_OURS = ("import sys, json; from microbench.sglang import trace as t; "
         "from microbench.bench.common import measured; "
         "print(json.dumps(measured(lambda: t.read_traces(sys.argv[1], workers=int(sys.argv[2])"
         " or None), sample_s=float(sys.argv[3]) or None)))")
_HTA = ("import logging, sys, json; logging.disable(logging.WARNING);"
        "from hta.trace_analysis import TraceAnalysis;"
        "from microbench.bench.common import measured; "
        "print(json.dumps(measured(lambda: TraceAnalysis(trace_dir=sys.argv[1])"
        ".get_temporal_breakdown(visualize=False), sample_s=float(sys.argv[2]) or None)))")


def _both(code: str, args: list[str]) -> dict:
    """Timed without memory sampling, then run again sampling memory."""
    m = run_child(code, args + ["0"])
    m["peak_mb"] = run_child(code, args + ["0.05"])["peak_mb"]
    return m


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", help="Kineto traces (.json or .json.gz), one per rank, "
                   "each repeated into one large rank trace")
    p.add_argument("--dir", help="time on the traces already in DIR (e.g. kept with --keep) "
                   "instead of building them")
    p.add_argument("--repeat", type=int, default=300, help="copies of the events (default 300)")
    p.add_argument("--keep", action="store_true", help="keep the large traces in the current "
                   "directory and print their paths")
    a = p.parse_args(argv)
    if not 1 <= a.repeat <= 100_000:
        raise SystemExit(f"--repeat must be 1..100000, got {a.repeat}")
    if not a.files and not a.dir:
        p.error("give trace FILEs to repeat, or --dir")
    with tempfile.TemporaryDirectory() as d:
        if a.dir:
            d = a.dir
        for r, f in enumerate([] if a.dir else a.files):
            big = Path(d) / f"large-rank{r}.json.gz"
            n = make_large(Path(f), big, a.repeat)
            print(f"rank {r}: {n / 1e6:.0f} MB uncompressed, {big.stat().st_size / 1e6:.0f} MB gz")
        seq = _both(_OURS, [d, "1"])
        par = _both(_OURS, [d, "0"])
        hta = _both(_HTA, [d])
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        for name, m in (("ppscope, ranks in turn", seq), ("ppscope, ranks in parallel", par),
                        ("HTA", hta)):
            print(f"{name:27s} {m['wall_s']:7.1f} s wall  {m['cpu_s']:7.1f} CPU s  peak "
                  f"{m['peak_mb']:6.0f} MB")
        print(f"HTA / ppscope wall: {hta['wall_s'] / par['wall_s']:.2f}x (ranks in turn: "
              f"{hta['wall_s'] / seq['wall_s']:.2f}x); parallel vs in turn: "
              f"{seq['wall_s'] / par['wall_s']:.2f}x; memory: HTA / ppscope "
              f"{hta['peak_mb'] / par['peak_mb']:.1f}x; load average after: {load:.1f}")
        if a.keep and not a.dir:
            for r in range(len(a.files)):
                keep = Path(os.getcwd()) / f"large-rank{r}.json.gz"
                (Path(d) / keep.name).replace(keep)
                print(f"kept {keep}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
