"""Read SGLang server logs: every `Decode batch` / `Prefill batch` line, per pipeline rank.

What it measures: for each PP rank, how many decode/prefill lines were logged, the distribution
of `#running-req` (under PP this is the size of the one micro-batch slot just processed, so its
spread *is* the slot imbalance), the fraction of decode steps on the CUDA-graph path, generated
tokens/s over time and the queue length. Why: a user with a slow PP deployment already has this
log; it shows whether requests piled into a few slots (the "herd") and whether decode fell off
the graph path.

How to run: `ppscope sglang --log server.log [rank1.log.gz ...]`.

Formats handled (checked against SGLang's `scheduler_metrics_mixin.py` and `scheduler.py`):
- prefix `[YYYY-mm-dd HH:MM:SS{tags}]`, `.mmm` milliseconds with SGLANG_LOG_MS, tags in any
  order among ` DP{d}`, ` PP{p}`, ` TP{t}`, ` EP{e}`, ` ATTN_CP{c}`, ` MOE_DP{m}` (the order
  changed across versions);
- `Decode batch[ [N]], #running-req: N, #token: N, token usage: X, [#cached-token: N, ]
  [accept len: X, accept rate: X, ]cuda graph: B, gen throughput (token/s): X, #queue-req: N[, ]`
  (`cpu graph` / `npu graph` on other devices, hybrid models log `#full token` instead of
  `#token`; `[N]` appears with SGLANG_LOG_FORWARD_ITERS; older versions end with `, `);
- `Prefill batch[ [N]], #new-seq: N, #new-token: N, #cached-token: N, token usage: X,
  #running-req: N, #queue-req: N, ...`.
Several files: a line with a `PP{p}` tag belongs to rank p; a file whose lines carry no PP tag is
taken as rank <file index>. With TP > 1 only the lowest TP rank of each PP rank is counted (every
TP rank of a stage logs the same batch).

The scheduler's start-up line (`max_total_num_tokens=..., chunked_prefill_size=...,
max_prefill_tokens=..., max_running_requests=..., context_len=...`) is read into
`server_settings`: the values the server actually ran with (the report prefers them to defaults
it would otherwise derive).

How to read it: `lines_unrecognised` counts batch lines that could not be parsed (a line cut
mid-way, an unknown layout); `lines_other` counts everything else (HTTP access lines...). Neither
is fatal, neither is silently dropped; a file with no batch line at all is listed in
`files_without_batch_lines`. Unreadable files (truncated gzip, empty) and a set of files with no
batch line at all (not a server log, or logged below info level) raise a one-line CliError.

Slot-imbalance index (our definition): the log samples one decode step every
`--decode-log-interval` steps of a rank, each naming the size of the slot it ran. Over windows of
`window` consecutive decode lines of a rank (default 16 = PP8 + async depth 8; `pp + depth` is
the number of slots), we take max / mean of `#running-req` (1.0 = every sampled slot the same
size; `window` = all requests in one slot) and report the median over windows, plus the
coefficient of variation (population std / mean) of all sampled sizes. It is a sampled estimate:
with interval 40 and 16 slots the log visits only the slots 40·k mod 16 apart.
"""
from __future__ import annotations

import datetime as _dt
import gzip
import re
import statistics
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from reports.base.errors import CliError

_LINE_RE = re.compile(
    r"\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d{1,6})?)(?P<tags>(?: [A-Z_]*[A-Z]\d+)*)\] "
    r"(?P<kind>Decode|Prefill) batch(?: \[(?P<iter>\d+)\])?, (?P<rest>.*)$"
)
_TAG_RE = re.compile(r" ([A-Z_]*[A-Z])(\d+)")
# The scheduler's start-up line (SGLang 0.5.23 managers/scheduler.py, `Scheduler.__init__`):
# "max_total_num_tokens=N, chunked_prefill_size=N, max_prefill_tokens=N,
#  max_running_requests=N, context_len=N, available_gpu_mem=X GB"
_SETTINGS_RE = re.compile(r"\b(max_total_num_tokens|chunked_prefill_size|max_prefill_tokens|"
                          r"max_running_requests|context_len)=(-?\d+)")
_BATCH_HINT = re.compile(r"\] (?:Decode|Prefill) batch")
_GRAPH_KEYS = ("cuda graph", "cpu graph", "npu graph")
_REQUIRED = {
    "Decode": ("#running-req", "gen throughput (token/s)", "#queue-req"),
    "Prefill": ("#new-seq", "#new-token", "#running-req", "#queue-req"),
}


@dataclass(frozen=True)
class BatchLine:
    kind: str                 # "Decode" | "Prefill"
    t_s: float                # seconds since the epoch (log clock, local time read as UTC)
    pp: int | None
    tp: int | None
    dp: int | None
    iteration: int | None
    fields: dict = field(default_factory=dict)  # key -> int | float | bool | str
    source: int = 0           # index of the file it came from


def _value(v: str):
    v = v.strip()
    if v in ("True", "False"):
        return v == "True"
    try:
        return int(v)
    except ValueError:
        pass
    try:
        return float(v)
    except ValueError:
        return v


def parse_line(line: str, source: int = 0) -> BatchLine | None | str:
    """A BatchLine; None for a line that is not a batch line; "bad" for a batch line we cannot read."""
    m = _LINE_RE.search(line)
    if m is None:
        return "bad" if _BATCH_HINT.search(line) else None
    fields: dict = {}
    for part in m["rest"].split(", "):
        part = part.strip().rstrip(",")
        if not part:
            continue
        key, sep, val = part.partition(": ")
        if not sep:
            return "bad"
        fields[key.strip()] = _value(val)
    if any(k not in fields or isinstance(fields[k], str) for k in _REQUIRED[m["kind"]]):
        return "bad"
    tags = {k: int(v) for k, v in _TAG_RE.findall(m["tags"])}
    ts = m["ts"].replace(",", ".")
    fmt = "%Y-%m-%d %H:%M:%S.%f" if "." in ts else "%Y-%m-%d %H:%M:%S"
    try:
        t = _dt.datetime.strptime(ts, fmt).replace(tzinfo=_dt.timezone.utc).timestamp()
    except ValueError:  # e.g. a corrupted clock field
        return "bad"
    return BatchLine(kind=m["kind"], t_s=t, pp=tags.get("PP"), tp=tags.get("TP"),
                     dp=tags.get("DP"), iteration=int(m["iter"]) if m["iter"] else None,
                     fields=fields, source=source)


def _open_lines(path: Path) -> Iterator[str]:
    try:
        with open(path, "rb") as f:
            magic = f.read(2)
    except OSError as e:
        raise CliError(f"{path}: cannot read log ({e.strerror or e})") from None
    opener = gzip.open if magic == b"\x1f\x8b" else open
    n = 0
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            for line in f:
                n += 1
                yield line.rstrip("\n")
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise CliError(f"{path}: truncated or corrupt gzip after {n} lines ({e})") from None
    if n == 0:
        raise CliError(f"{path}: empty log file")


@dataclass(frozen=True)
class LogScan:
    lines: tuple[BatchLine, ...]
    lines_total: int
    lines_other: int
    lines_unrecognised: int
    files: tuple[str, ...]
    files_without_batch_lines: tuple[str, ...] = ()
    settings: dict = field(default_factory=dict)   # the start-up line's server settings


def scan_logs(paths: Iterable[str | Path]) -> LogScan:
    out: list[BatchLine] = []
    total = other = bad = 0
    files, empty = [], []
    settings: dict = {}
    for i, p in enumerate(paths):
        p = Path(p)
        files.append(str(p))
        before = len(out)
        for line in _open_lines(p):
            total += 1
            r = parse_line(line, source=i)
            if r is None:
                other += 1
                if "max_running_requests=" in line:   # the start-up line (every rank logs it)
                    settings.update((k, int(v)) for k, v in _SETTINGS_RE.findall(line))
            elif r == "bad":
                bad += 1
            else:
                out.append(r)
        if len(out) == before:
            empty.append(str(p))
    if not out:
        raise CliError(f"{files[0] if len(files) == 1 else ', '.join(files)}: no 'Decode batch' / "
                       f"'Prefill batch' lines in {total} lines ({bad} cut or unreadable); is it "
                       f"an SGLang server log at --log-level info?")
    return LogScan(tuple(out), total, other, bad, tuple(files), tuple(empty), settings)


def _q(vals: list[float]) -> dict:
    if not vals:
        return {"min": None, "median": None, "max": None}
    return {"min": min(vals), "median": statistics.median(vals), "max": max(vals)}


def slot_imbalance(sizes: list[int], window: int) -> dict:
    """max/mean of slot sizes per window of `window` consecutive decode lines (median over
    windows) and the coefficient of variation of all sizes. See the module docstring."""
    ratios = []
    for s in range(0, len(sizes) - window + 1, window):
        w = sizes[s:s + window]
        mean = sum(w) / len(w)
        if mean > 0:
            ratios.append(max(w) / mean)
    mean_all = sum(sizes) / len(sizes) if sizes else 0.0
    cv = statistics.pstdev(sizes) / mean_all if len(sizes) > 1 and mean_all > 0 else None
    return {"window": window, "windows": len(ratios),
            "max_over_mean_median": statistics.median(ratios) if ratios else None,
            "cv": cv}


def _throughput_series(dec: list[BatchLine], bin_s: float) -> list[dict]:
    if not dec:
        return []
    t0 = dec[0].t_s
    bins: dict[int, list[BatchLine]] = {}
    for d in dec:
        bins.setdefault(int((d.t_s - t0) // bin_s), []).append(d)
    rows = []
    for k in sorted(bins):
        b = bins[k]
        rows.append({"t_s": k * bin_s, "lines": len(b),
                     "gen_throughput_tok_s": statistics.fmean(
                         d.fields["gen throughput (token/s)"] for d in b),
                     "running_req_mean": statistics.fmean(d.fields["#running-req"] for d in b),
                     "queue_req_mean": statistics.fmean(d.fields["#queue-req"] for d in b)})
    return rows


def summarize(scan: LogScan, window: int = 16, bin_s: float = 10.0) -> dict:
    """The `ranks` / `slot_imbalance` part of sglang.json from a scan."""
    by_rank: dict[int, list[BatchLine]] = {}
    for bl in scan.lines:
        by_rank.setdefault(bl.pp if bl.pp is not None else bl.source, []).append(bl)
    ranks = {}
    sizes_by_rank: dict[str, list[int]] = {}
    skipped_tp = 0
    for r in sorted(by_rank):
        lines = by_rank[r]
        tps = {bl.tp for bl in lines if bl.tp is not None}
        if tps:  # every TP rank of a stage logs the same batch: keep the lowest one
            keep = min(tps)
            kept = [bl for bl in lines if bl.tp is None or bl.tp == keep]
            skipped_tp += len(lines) - len(kept)
            lines = kept
        lines.sort(key=lambda bl: bl.t_s)
        dec = [bl for bl in lines if bl.kind == "Decode"]
        pre = [bl for bl in lines if bl.kind == "Prefill"]
        sizes = [d.fields["#running-req"] for d in dec]
        sizes_by_rank[str(r)] = sizes
        graph = [d.fields[k] for d in dec for k in _GRAPH_KEYS if k in d.fields]
        ranks[str(r)] = {
            "decode_lines": len(dec),
            "prefill_lines": len(pre),
            "running_req": _q(sizes),
            "cuda_graph_frac": (sum(1 for g in graph if g is True) / len(graph)) if graph else None,
            "gen_throughput_tok_s": _q([d.fields["gen throughput (token/s)"] for d in dec]),
            "queue_req": _q([d.fields["#queue-req"] for d in dec]),
            "prefill_new_tokens": sum(p.fields["#new-token"] for p in pre),
            "dp_ranks": sorted({bl.dp for bl in lines if bl.dp is not None}),
            "span_s": (lines[-1].t_s - lines[0].t_s) if lines else 0.0,
            "slot_imbalance": slot_imbalance(sizes, window),
            "over_time": _throughput_series(dec, bin_s),
        }
    return {
        "log_files": list(scan.files),
        "lines_total": scan.lines_total,
        "lines_batch": len(scan.lines) - skipped_tp,
        "lines_other": scan.lines_other,
        "lines_unrecognised": scan.lines_unrecognised,
        "lines_other_tp": skipped_tp,
        "files_without_batch_lines": list(scan.files_without_batch_lines),
        # the server's own settings from its start-up line, when the log has it
        "server_settings": dict(scan.settings),
        "ranks": ranks,
        # Run-wide index: the rank with the most decode lines (every rank sees the same slots).
        "slot_imbalance": _run_imbalance(sizes_by_rank, window),
    }


def _run_imbalance(sizes_by_rank: dict[str, list[int]], window: int) -> dict | None:
    if not sizes_by_rank or not any(sizes_by_rank.values()):
        return None
    r = max(sizes_by_rank, key=lambda k: len(sizes_by_rank[k]))
    return {"rank": int(r), **slot_imbalance(sizes_by_rank[r], window)}


def read_logs(paths: Iterable[str | Path], window: int = 16, bin_s: float = 10.0) -> dict:
    return summarize(scan_logs(paths), window=window, bin_s=bin_s)
