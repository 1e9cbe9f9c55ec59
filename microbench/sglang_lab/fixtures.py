"""Turn lab cases into small test fixtures (`tests/fixtures/sglang_lab/<case>/`).

A lab case holds seconds of SGLang's real artefacts (traces of several MB). A fixture keeps
their real format and a short steady window of them:
- each trace: its metadata (`distributedInfo`, `deviceProperties`, ...) and the events that
  start inside `iterations` consecutive loop iterations (from one `recv_requests` to the next),
  the stretch with the most forwards: SGLang's ranges, step spans, c10d's gloo ranges and ops.
  The first `FULL_ITERATIONS` of them keep every event as the profiler wrote it (every CPU op
  and, for the with-stacks window, the Python tracer's frames), so the readers still meet the
  whole format; after them the events no reader takes (`unread`: CPU ops other than c10d's, the
  Python tracer's frames other than modules'; 98% of a CPU trace's bytes) are left out
  (`slim`);
- the server log: the start-up lines, then the case's lines up to `log_lines` batch lines, and
  the `BEFORE_WINDOW` batch lines before the profiled window and every one of it and after it
  (between SGLang's `Profiling starts` and `Profiling done` lines: the profiler's own slowdown
  is read from them against the same run's pace before, microbench/sglang/profiler_cost.py);
- a case without a profiled window (a what-if's after case): bench.jsonl and case.json only;
- bench.jsonl and case.json as they are (`--bench-info-once`: bench_serving's `server_info`
  kept in the first line only, where ppscope reads it); metrics.txt (130 kB) for the clean
  C = 8 case only; a case scraped at its start and end (metrics-start.txt, metrics.txt): both
  pages cut to the series the /metrics window reads (`trim_window`).
Absolute paths of the machine the lab ran on become relative names (`.lab/...`, the model's
folder name), so nothing of the recording machine is committed.

    python -m microbench.sglang_lab.fixtures [--iterations N] [--bench-info-once] \
        results/lab tests/fixtures/sglang_lab [CASE ...]
    python -m microbench.sglang_lab.fixtures --slim tests/fixtures/sglang_lab [--full N]  # in place
"""
from __future__ import annotations

import gzip
import json
import re
import shutil
import sys
from pathlib import Path

ITERATIONS = 60
FULL_ITERATIONS = 3
LOG_LINES = 400
_ABS = re.compile(r"(/[A-Za-z0-9_.+-]+)+/(\.lab|site-packages|results/lab[A-Za-z0-9_-]*)/")


def scrub(text: str) -> str:
    """Absolute paths up to a known folder -> that folder's relative name."""
    text = _ABS.sub(lambda m: m.group(2) + "/", text)
    return re.sub(r"(['\"])/(?:[A-Za-z0-9_.+-]+/)+(model-llama-\d+l)", r"\1\2", text)


def _events(src: Path) -> dict:
    return json.loads(gzip.open(src, "rt").read())


def busy_window(doc: dict, iterations: int = ITERATIONS) -> tuple[float, float] | None:
    """The stretch of `iterations` loop passes with the most forwards (the server busy)."""
    import bisect
    ev = doc.get("traceEvents") or []
    marks = sorted(e["ts"] for e in ev if e.get("name") == "recv_requests" and e.get("ph") == "X")
    runs = sorted(e["ts"] for e in ev if e.get("name") == "run_batch" and e.get("ph") == "X")
    if len(marks) <= iterations + 2:
        return None
    best = max(range(len(marks) - iterations), key=lambda i: (
        bisect.bisect_left(runs, marks[i + iterations]) - bisect.bisect_left(runs, marks[i]),
        -abs(i - len(marks) // 2)))
    return marks[best], marks[best + iterations]


def unread(ev: dict) -> bool:
    """An event no reader of ppscope takes: a CPU op other than c10d's (microbench/sglang/
    trace.py `_take` and cpu_steps.py `collect` read SGLang's ranges, c10d's ops and the
    device's events) or a frame of the Python tracer other than a module's (`nn.Module: ...`,
    the layers cpu_steps.py times)."""
    return (ev.get("ph") == "X" and ev.get("cat") in ("cpu_op", "python_function")
            and not str(ev.get("name", "")).startswith(("c10d::", "ProfilerStep#",
                                                         "nn.Module: ")))


def slim(ev: list, full_iterations: int = FULL_ITERATIONS) -> list:
    """`ev` without its `unread` events after the first `full_iterations` loop passes."""
    marks = sorted(float(e["ts"]) for e in ev
                   if e.get("name") == "recv_requests" and e.get("ph") == "X")
    if len(marks) <= full_iterations:
        return ev
    cut = marks[full_iterations]
    return [e for e in ev if not (unread(e) and float(e.get("ts", -1)) >= cut)]


def trim_trace(doc: dict, dst: Path, window: tuple[float, float] | None) -> int:
    """Keep metadata and the events that start inside `window` (one clock for every rank of
    one host, so the same window cuts every rank's trace), `slim`med."""
    ev = doc.get("traceEvents") or []
    if window is not None:
        lo, hi = window
        ev = [e for e in ev if e.get("ph") != "X" or lo <= float(e.get("ts", -1)) < hi]
    return _write(doc, slim(ev), dst)


def _write(doc: dict, ev: list, dst: Path) -> int:
    doc = {**doc, "traceEvents": ev}
    dst.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(dst, "wt", compresslevel=9) as f:
        f.write(scrub(json.dumps(doc, separators=(",", ":"))))
    return len(ev)


BEFORE_WINDOW = 600


def trim_log(src: Path, dst: Path, log_lines: int = LOG_LINES,
             before_window: int = BEFORE_WINDOW) -> None:
    lines = src.read_text(errors="replace").splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if "] Profiling starts" in ln), None)
    keep_from = len(lines)       # the batch lines just before the window: the same run's pace
    if start is not None:
        k, keep_from = 0, start
        while keep_from > 0 and k < before_window:
            keep_from -= 1
            k += "Decode batch" in lines[keep_from] or "Prefill batch" in lines[keep_from]
    out, n, profiling = [], 0, set()
    for i, ln in enumerate(lines):
        m = re.search(r" (PP\d+)\] Profiling (starts|done)", ln)
        if m:
            (profiling.add if m.group(2) == "starts" else profiling.discard)(m.group(1))
        if "Decode batch" in ln or "Prefill batch" in ln:
            n += 1
            tag = re.search(r" (PP\d+)\] ", ln)
            if n > log_lines and not (tag and tag.group(1) in profiling) and i < keep_from:
                continue
        out.append(ln)
    dst.write_text(scrub("".join(out)))


def bench_info_once(text: str) -> str:
    """bench.jsonl with `server_info` in its first line only (every line repeats it)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    out = []
    for k, ln in enumerate(lines):
        row = json.loads(ln)
        if k:
            row.pop("server_info", None)
        out.append(json.dumps(row))
    return "\n".join(out) + "\n"


def make(case_dir: Path, dst: Path, iterations: int = ITERATIONS,
         info_once: bool = False) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for sub in ("traces", "traces-stacks"):
        files = sorted((case_dir / sub).glob("*.trace.json.gz"))
        docs = [_events(p) for p in files]
        if not docs:
            continue
        # the window is chosen on rank 0's trace (the first by name) and cuts every rank
        win = busy_window(docs[0], iterations if sub == "traces" else iterations // 3)
        if win is not None:   # a margin of a few ms: the other ranks' passes straddle its edges
            win = (win[0] - 5e3, win[1] + 5e3)
        for p, doc in zip(files, docs):
            trim_trace(doc, dst / sub / p.name, win)
    if (dst / "traces").is_dir():      # a case that was only measured needs its bench runs
        trim_log(case_dir / "server.log", dst / "server.log")
    if (case_dir / "metrics-start.txt").exists():   # a window: both scrapes, trimmed
        trim_window(case_dir, dst)
    for name in ("bench.jsonl", "metrics.txt", "case.json"):
        if name == "metrics.txt" and (case_dir.name != "clean-c8"
                                      or (case_dir / "metrics-start.txt").exists()):
            continue
        if (case_dir / name).exists():
            text = scrub((case_dir / name).read_text())
            if name == "bench.jsonl" and info_once:
                text = bench_info_once(text)
            (dst / name).write_text(text)


# the /metrics series the window reads (microbench/sglang/metrics_window.py): a case scraped at
# its start and end keeps these only, both pages, with their HELP/TYPE lines
METRICS_SERIES = ("sglang:scheduler_stage_seconds_total", "sglang:scheduler_idle_seconds_total",
                  "sglang:cuda_graph_passes_total", "sglang:fwd_occupancy",
                  "sglang:is_cuda_graph", "sglang:graph_memory_usage_gb",
                  "sglang:startup_cuda_graph_time_seconds")


def trim_metrics(text: str) -> str:
    """A /metrics page cut to METRICS_SERIES (their samples and HELP/TYPE lines)."""
    keep = []
    for line in text.splitlines():
        name = line.split()[2] if line.startswith("# ") and len(line.split()) > 2 else \
            line.split("{")[0].split()[0] if line.strip() else ""
        if name in METRICS_SERIES:
            keep.append(line)
    return "\n".join(keep) + "\n"


def trim_window(case_dir: Path, dst: Path) -> None:
    """A case's two scrapes (metrics-start.txt, metrics.txt), trimmed (`trim_metrics`)."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("metrics-start.txt", "metrics.txt"):
        (dst / name).write_text(trim_metrics(scrub((case_dir / name).read_text())))


def slim_in_place(root: Path, full_iterations: int = FULL_ITERATIONS) -> int:
    """Every trace under `root` `slim`med where it lies (`full_iterations` passes kept whole);
    returns the bytes saved."""
    saved = 0
    for p in sorted(root.rglob("*.trace.json.gz")):
        before, doc = p.stat().st_size, _events(p)
        ev = doc.get("traceEvents") or []
        kept = slim(ev, full_iterations)
        if len(kept) == len(ev):
            continue
        _write(doc, kept, p)
        saved += before - p.stat().st_size
    return saved


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--slim"] and len(argv) in (2, 4) and argv[2:3] in ([], ["--full"]):
        full = int(argv[3]) if len(argv) == 4 else FULL_ITERATIONS
        print(f"{slim_in_place(Path(argv[1]), full) >> 10} KiB saved")
        return 0
    iterations, info_once = ITERATIONS, "--bench-info-once" in argv
    argv = [a for a in argv if a != "--bench-info-once"]
    if "--iterations" in argv:
        i = argv.index("--iterations")
        iterations = int(argv[i + 1])
        del argv[i:i + 2]
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    src, dst, names = Path(argv[0]), Path(argv[1]), argv[2:]
    cases = [d for d in sorted(src.iterdir()) if (d / "case.json").exists()
             and (not names or d.name in names)]
    for d in cases:
        make(d, dst / d.name, iterations, info_once)
        print(f"{d.name}: {sum(p.stat().st_size for p in (dst / d.name).rglob('*') if p.is_file()) >> 10} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
