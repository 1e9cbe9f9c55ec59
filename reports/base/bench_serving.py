"""Read `sglang.bench_serving` results: the JSONL it appends (`--output-file`, one run per line,
any version's keys) or the printed "Serving Benchmark Result" block(s) copied from a terminal.

What it gives: for each run, the observed output tok/s, TTFT, TPOT and ITL at its concurrency,
keyed and sorted by the concurrency cap the user set (`max_concurrency`; the measured mean,
bench_serving's `concurrency`, is kept as `mean_concurrency` and is the sort key only for an
uncapped run, marked `concurrency_from: "measured"`). Pure parsing (no torch, no probe code), so
both `ppscope sglang --bench` (into sglang.json) and `ppscope report --bench` read files here.

`observed_points` is the one rule that turns runs into the report's observed tok/s per C: only a
capped run is a point for a concurrency (an uncapped run's mean in-flight count is not the C the
model is asked about, so it is left out with a note), and the last run per C wins, as in the file.
Unreadable input (missing, a directory, binary, over 64 MB) raises a one-line CliError; lines
that are not runs (no numeric output throughput) are counted, not fatal; a field of a run that is
not a finite number >= 0 (a string, a list, NaN...) is None.
"""
from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from pathlib import Path

from reports.base.errors import CliError

# printed label -> JSON key (labels as sglang/bench_serving.py prints them)
_LABELS = {
    "Backend": "backend",
    "Traffic request rate": "request_rate",
    "Max request concurrency": "max_concurrency",
    "Maximum request concurrency": "max_concurrency",
    "Successful requests": "completed",
    "Benchmark duration (s)": "duration",
    "Total input tokens": "total_input_tokens",
    "Total generated tokens": "total_output_tokens",
    "Request throughput (req/s)": "request_throughput",
    "Input token throughput (tok/s)": "input_throughput",
    "Output token throughput (tok/s)": "output_throughput",
    "Total token throughput (tok/s)": "total_throughput",
    "Total Token throughput (tok/s)": "total_throughput",
    "Total throughput (tok/s)": "total_throughput",
    "Concurrency": "concurrency",
    "Mean E2E Latency (ms)": "mean_e2e_latency_ms",
    "Median E2E Latency (ms)": "median_e2e_latency_ms",
    "Mean TTFT (ms)": "mean_ttft_ms",
    "Median TTFT (ms)": "median_ttft_ms",
    "P99 TTFT (ms)": "p99_ttft_ms",
    "Mean TPOT (ms)": "mean_tpot_ms",
    "Median TPOT (ms)": "median_tpot_ms",
    "P99 TPOT (ms)": "p99_tpot_ms",
    "Mean ITL (ms)": "mean_itl_ms",
    "Median ITL (ms)": "median_itl_ms",
    "P95 ITL (ms)": "p95_itl_ms",
    "P99 ITL (ms)": "p99_itl_ms",
    "Max ITL (ms)": "max_itl_ms",
}
_KEEP = ("max_concurrency", "concurrency", "completed", "duration", "output_throughput",
         "total_throughput", "request_throughput", "mean_ttft_ms", "median_ttft_ms",
         "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
         "median_itl_ms", "p95_itl_ms", "p99_itl_ms", "max_itl_ms", "mean_e2e_latency_ms",
         "median_e2e_latency_ms", "request_rate", "backend", "total_output_tokens")
# older / other versions' spellings
_ALIASES = {"output_token_throughput": "output_throughput", "num_prompts_completed": "completed",
            "benchmark_duration": "duration", "max_concurrent_requests": "max_concurrency"}
_LINE = re.compile(r"^\s*([A-Za-z0-9 ()/]+?):\s+(\S+)\s*$")


MAX_BYTES = 64 << 20    # a bench file with thousands of runs is a few MB
_MAX_VALUE = 1e15       # beyond any rate, latency or count: a corrupted field


def _num(v):
    """A finite number >= 0 as int or float; None for anything else (a string, a list, a bool,
    NaN, inf, a negative or absurd value): records hold None, never NaN or a wrong type."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        f = float(v) if abs(v) < 1e300 else math.inf
        s = None
    elif isinstance(v, str):
        try:
            f = float(v)
        except ValueError:
            return None
        s = v
    else:
        return None
    if not (math.isfinite(f) and 0 <= f < _MAX_VALUE):
        return None
    if isinstance(v, int):
        return v
    return int(f) if s is not None and f.is_integer() and "." not in s and "e" not in s.lower() \
        else f


def _normalise(d: dict) -> dict:
    d = {_ALIASES.get(k, k): v for k, v in d.items()}
    run = {k: _num(d.get(k)) for k in _KEEP}
    backend = d.get("backend")
    run["backend"] = backend if isinstance(backend, str) else None
    rate = d.get("request_rate")   # bench_serving prints "inf" for all requests at once
    if isinstance(rate, (str, float)) and str(rate).strip().lower() in ("inf", "infinity"):
        run["request_rate"] = "inf"
    # bench_serving's own `concurrency` is the measured mean number of requests in flight
    # (e.g. 7.98 under --max-concurrency 8); keep it, and key the run by the cap the user chose
    # (`--max-concurrency`), falling back to the measured mean for an uncapped run
    run["mean_concurrency"] = run.pop("concurrency")
    cap = run["max_concurrency"]
    run["concurrency"] = cap if cap is not None else run["mean_concurrency"]
    run["concurrency_from"] = "max_concurrency" if cap is not None else (
        "measured" if run["mean_concurrency"] is not None else None)
    return run


def _read_text(path: Path) -> str:
    """The file's text, at most MAX_BYTES (after gunzip): /dev/zero or a gzip bomb is refused,
    not read forever; binary data is refused."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
            if raw[:2] == b"\x1f\x8b":
                f.seek(0)
                try:
                    with gzip.GzipFile(fileobj=f) as g:
                        raw = g.read(MAX_BYTES + 1)
                except (EOFError, OSError, zlib.error) as e:
                    raise CliError(f"{path}: truncated or corrupt gzip ({e})") from None
    except OSError as e:
        raise CliError(f"{path}: cannot read bench file ({e.strerror or e})") from None
    if len(raw) > MAX_BYTES:
        raise CliError(f"{path}: larger than {MAX_BYTES >> 20} MB; not a bench_serving output")
    if b"\x00" in raw:
        raise CliError(f"{path}: binary data, not a bench_serving output")
    text = raw.decode("utf-8", errors="replace")
    if not text.strip():
        raise CliError(f"{path}: empty bench file")
    return text


def read_bench(path: str | Path) -> dict:
    """{"runs": [...], "lines_unrecognised": n, "source": "jsonl" | "printed"}."""
    path = Path(path)
    text = _read_text(path)
    runs, bad = [], 0
    if text.lstrip().startswith("{"):
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                bad += 1
                continue
            out = d.get("output_throughput", d.get("output_token_throughput")) \
                if isinstance(d, dict) else None
            if _num(out) is not None:   # a run, with the one number every run has
                runs.append(_normalise(d))
            else:
                bad += 1
        source = "jsonl"
    else:
        cur: dict | None = None
        pending: dict = {}   # settings printed before the block (older clients print
        for line in text.splitlines():   # "Maximum request concurrency: 32" above it)
            if "Serving Benchmark Result" in line:
                if cur:
                    runs.append(_normalise(cur))
                cur, pending = dict(pending), {}
                continue
            if cur is None:
                m = _LINE.match(line)
                if m and _LABELS.get(m.group(1)) in ("max_concurrency", "request_rate"):
                    pending[_LABELS[m.group(1)]] = m.group(2)
                continue
            m = _LINE.match(line)
            if m and m.group(1) in _LABELS:
                cur[_LABELS[m.group(1)]] = m.group(2)
            elif line.startswith("=" * 10) and cur:
                runs.append(_normalise(cur))
                cur = None
        if cur:
            runs.append(_normalise(cur))
        source = "printed"
    if not runs:
        raise CliError(f"{path}: no bench_serving results found (neither JSONL runs nor a "
                       f"'Serving Benchmark Result' block)")
    runs.sort(key=lambda r: (r["concurrency"] is None, r["concurrency"] or 0))
    return {"file": str(path), "source": source, "runs": runs, "lines_unrecognised": bad}


def observed_points(runs, label: str) -> tuple[dict[int, float], list[str]]:
    """Runs (dicts as `read_bench` gives them, or sglang.json's typed `BenchRun`s) ->
    ({max_concurrency: output tok/s}, notes). Observed numbers only: nothing here feeds the
    model."""
    out: dict[int, float] = {}
    notes: list[str] = []
    for b in runs:
        get = b.get if isinstance(b, dict) else (lambda k, b=b: getattr(b, k))
        c, tput = get("max_concurrency"), get("output_throughput")
        if tput is None:
            continue
        if c is None:
            notes.append(f"{label}: bench run without --max-concurrency (mean concurrency "
                         f"{get('mean_concurrency')}, {float(tput):.1f} tok/s) not used as "
                         "an observed point")
            continue
        out[int(c)] = float(tput)
    return out, notes
