"""Read SGLang server logs: every `Decode batch` / `Prefill batch` line, per pipeline rank.

What it measures: for each PP rank, how many decode/prefill lines were logged, the distribution
of `#running-req` (under PP this is the size of the one micro-batch slot just processed, so its
spread *is* the slot imbalance), the fraction of decode steps on the graph path (and which
device's label, `graph_device`: SGLang writes `cpu graph:` on CPU, `cuda graph:` on CUDA),
generated tokens/s over time, the queue length, and the prefill waves: `#new-seq` of each
prefill, i.e. how a burst of arrivals was admitted (8 requests as 6 then 2). From the start-up
lines, the server arguments that shape PP batching and graph use (`server_args`) and whether
decode graphs are off BY SETTING (`graph_setting`, with SGLang's reasons: then eager decode is
the setting, never a fallback); from anywhere in the log, settings changed at run time
(`config_overrides`, POST /set_internal_state). Why: a user with a slow PP deployment already
has this log; it shows whether requests piled into a few slots (the "herd") and whether decode
fell off the graph path.

How to run: `ppscope sglang --log server.log [rank1.log.gz ...]`.

Formats handled (checked against SGLang 0.5.23's srt/managers/scheduler_components/
metrics_reporter.py and scheduler.py `configure_scheduler_process`, and the 0.4.3 / 0.4.6 / 0.5.2
releases' scheduler.py / scheduler_metrics_mixin.py):
- prefix `[YYYY-mm-dd HH:MM:SS{tags}]`, `.mmm` milliseconds with SGLANG_LOG_MS, tags in any
  order among ` DP{d}`, ` PP{p}`, ` TP{t}`, ` EP{e}`, ` ATTN_CP{c}`, ` MOE_DP{m}` (the order
  changed across versions); 2024 releases printed `[HH:MM:SS TP0]` without the date (read as
  seconds of day, a wrap past midnight adds a day); anything before the bracket (a Ray actor's
  `(pid=…)`, a progress bar) is ignored;
- a custom logging format (SGLANG_LOGGING_CONFIG_PATH replaces SGLang's format, prefix and rank
  tags included), e.g. `INFO 1234 [metrics_reporter.py:1070] Decode batch, …`: the line is
  read; its time is taken from a `YYYY-mm-dd HH:MM:SS[,mmm]` anywhere before `Decode`, else it
  has none (no span, no time series), and without rank tags the file's index is its rank;
- `Decode batch[ [N]], #running-req: N, #token: N, token usage: X, [#cached-token: N, ]
  [accept len: X, accept rate: X, ]cuda graph: B, gen throughput (token/s): X, #queue-req: N[, ]`
  (`cpu graph` / `npu graph` / `musa graph` on other devices, hybrid models log `#full token`
  instead of `#token`; `[N]` appears with SGLANG_LOG_FORWARD_ITERS); early-2025 releases write
  `Decode batch.` and end with `, ` (sgl-project/sglang#3909, #4407), some with fields between
  `gen throughput` and `#queue-req`; the fields in any other order are read too;
- `Prefill batch[ [N]][,.] #new-seq: N, #new-token: N, #cached-token: N, token usage: X,
  #running-req: N, #queue-req: N, …`; a prefill server of a disaggregated deployment logs no
  `#running-req` (`#unbootstrapped-req`, `#transferring-req` instead) and is read without it;
  NPU builds write `npu graph`.
Several files: a line with a `PP{p}` tag belongs to rank p; a file whose lines carry no PP tag is
taken as rank <file index>.
Start-up lines (the first SETTINGS_BYTES of each file): the settings line (`server_settings`:
max_running_requests, chunked_prefill_size, ...), which MoE kernel the server picked and how
its Triton config was found (`moe_kernel`, `startup_moe_kernel`), which attention backend
decodes (`attention_backend`, `startup_attention_backend`), the `server_args=` line
(`server_args`, `ServerArgs`) and the lines saying graphs are disabled (`graph_setting`).
Checked on a real log: SGLang 0.5.23's own server, PP2 on CPU (tests/fixtures/sglang_lab/).

Which lines are the same batch and which are different batches (SGLang 0.5.23 logs only from
schedulers with attention-TP rank 0 and attention-CP rank 0, `is_stats_logging_rank`; older
releases logged from every TP rank): within one PP rank, each DP rank (`DP{d}`) runs its own
scheduler and its own batches, so every DP rank's lines count (data-parallel attention: all 8
DP ranks of a TP8/DP8 deployment log their own batch). The TP and attention-CP ranks of one
(PP, DP) scheduler log the same batch, so only the lowest (ATTN_CP, TP) rank's lines are kept;
the others are counted in `lines_other_tp`. Per PP rank, `by_dp` gives each DP rank's own
numbers; the rank's own numbers pool all its DP ranks' lines (slot windows never mix two DP
ranks).

How to read it: `lines_unrecognised` counts batch lines that could not be parsed (a line cut
mid-way, an unknown layout); `lines_other` counts everything else (HTTP access lines...). Neither
is fatal, neither is silently dropped; a file with no batch line at all is listed in
`files_without_batch_lines`. Unreadable files (missing, a directory, truncated gzip, empty,
binary, a "line" over 1 MB such as /dev/zero) and a set of files with no batch line at all (not a
server log, or logged below info level) raise a one-line CliError.

Streaming: files are read in 8 MB blocks and each batch line is reduced to a few numbers in
numpy arrays, so memory grows with the number of batch lines (~30 bytes each), not with the file.
A block is read with whole-block operations (split, regular expressions over all its decode
lines at once, fixed-width numpy decoding of the standard `[date time tags]` prefix); lines
those do not fit (another layout, a custom prefix, a cut line) are read one by one, in their
place. Large plain files are split into byte ranges read by worker processes when the machine
has cores to spare. See microbench/bench/log_reader.py and docs/BENCHMARKS.md for MB/s
and peak memory.

Slot-imbalance index (our definition): the log samples one decode step every
`--decode-log-interval` steps of a rank, each naming the size of the slot it ran. Over windows of
`window` consecutive decode lines of one scheduler (default 16 = PP8 + async depth 8; `pp +
depth` is the number of slots), we take max / mean of `#running-req` (1.0 = every sampled slot
the same size; `window` = all requests in one slot) and report the median over windows, plus the
coefficient of variation (population std / mean) of all sampled sizes. With several DP ranks the
windows of all of them are pooled and `cv` is the median of their cvs. It is a sampled
estimate: with interval 40 and 16 slots the log visits only the slots 40·k mod 16 apart.
"""
from __future__ import annotations

import ast
import calendar
import gc
import gzip
import math
import os
import re
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from reports.base.errors import CliError
from reports.base.paths import open_input

CHUNK_BYTES = 8 << 20
# a worker's byte range of a plain file: smaller than a block read in-process, so that the
# workers' transient lines and match lists, summed, stay small (4 workers on a 300 MB log:
# 8 MB ranges peaked at 319 MB, 2 MB at 180 MB, as fast; docs/BENCHMARKS.md section 10)
RANGE_BYTES = 2 << 20
MAX_LINE_BYTES = 1 << 20     # no SGLang line comes near this; /dev/zero has no newline at all
PARALLEL_MIN_BYTES = 32 << 20   # below this, starting worker processes costs more than it saves
MAX_WORKERS = 4
SUB_LINES = 512              # lines re-tried together when a block's fast read does not fit
_MAX_COUNT = 2 ** 31 - 1     # a count or token/s beyond this is a corrupted field, not a value
_BATCH_RE = re.compile(rb"(Decode|Prefill) batch(?: \[(\d+)\])?[.,] ?([^\n\r]*)")
_STAMP_RE = re.compile(
    rb"(?:(\d{4})-(\d\d)-(\d\d)[ T])?(\d\d):(\d\d):(\d\d)(?:[.,](\d{1,6}))?"
    rb"((?: [A-Z][A-Z_]*[A-Z]\d+)*)\]?")
_TAG_RE = re.compile(rb" ([A-Z][A-Z_]*[A-Z])(\d+)")
_TAGS_FULL = re.compile(rb"(?: [A-Z][A-Z_]*[A-Z]\d{1,6})*")
# Decode and prefill lines in SGLang's field order (every release since 2024), read from a
# block's joined lines by expressions that each start with a literal (the engine then jumps
# from one occurrence to the next) and match once per line; a block whose counts differ from
# its number of lines is read again in smaller pieces, down to field by field.
_DEC_SIZE = re.compile(rb"Decode batch(?: \[\d+\])?[.,] #running-req: (\d{1,9}), ")
_DEC_GEN = re.compile(rb"gen throughput \(token/s\): (\d{1,9}(?:\.\d{1,9})?), "
                      rb"(?:[^,\n]+, )?#queue-req: (\d{1,9})")
_DEC_GRAPH = re.compile(rb" graph: (True|False), gen throughput")   # its place in every release
# prefill: #new-seq, #new-token, #cached-token, #running-req (absent on a disaggregated prefill
# server), #queue-req; an absent optional field is an empty group
_PRE_FAST = re.compile(
    rb"Prefill batch(?: \[\d+\])?[.,] #new-seq: (\d{1,9}), #new-token: (\d{1,9}), "
    rb"(?:#cached-token: (\d{1,9}), )?(?:(?!#running-req|#queue-req)[^,\n]+, )*"
    rb"(?:#running-req: (\d{1,9}), )?(?:(?!#queue-req)[^,\n]+, )*#queue-req: (\d{1,9})")
# `{label}: B`, the label by device (SGLang 0.5.23 metrics_reporter.py `_graph_backend_label`:
# cpu -> "cpu graph", npu -> "npu graph", musa -> "musa graph", anything else "cuda graph")
_GRAPH_KEYS = ("cuda graph", "cpu graph", "npu graph", "musa graph", "hpu graph", "xpu graph")
_GRAPH_KEYS_B = tuple(k.encode() + b": " for k in _GRAPH_KEYS)
_DEC_LABEL = re.compile(rb"(" + b"|".join(k.split()[0].encode() for k in _GRAPH_KEYS)
                        + rb") graph: (?:True|False), gen throughput")
_REQUIRED = {
    "Decode": ("#running-req", "gen throughput (token/s)", "#queue-req"),
    "Prefill": ("#new-seq", "#new-token", "#queue-req"),
}
# bytes of a line read as its prefix (a multiple of 8); holds the longest SGLang writes,
# `[YYYY-mm-dd HH:MM:SS.mmm DP10 PP10 ATTN_CP10 MOE_DP10 TP10 EP10] `
_PREFIX_W = 72


@dataclass(frozen=True)
class BatchLine:
    kind: str                 # "Decode" | "Prefill"
    t_s: float | None         # seconds since the epoch (log clock, local time read as UTC)
    pp: int | None
    tp: int | None
    dp: int | None
    iteration: int | None
    fields: dict = field(default_factory=dict)  # key -> int | float | bool | str
    source: int = 0           # index of the file it came from
    attn_cp: int | None = None


def _value(v: str):
    v = v.strip()
    if v in ("True", "False"):
        return v == "True"
    try:
        return int(v)
    except ValueError:
        pass
    try:
        f = float(v)
    except ValueError:
        return v
    return f if math.isfinite(f) else v


def _fields(rest: str) -> dict | None:
    """Every `key: value` of a batch line's tail; None when a part has no `: `."""
    out: dict = {}
    for part in rest.split(", "):
        part = part.strip().rstrip(",").strip()
        if not part:
            continue
        key, sep, val = part.partition(": ")
        if not sep:
            return None
        out[key.strip()] = _value(val)
    return out


def _ok(kind: str, f: dict) -> bool:
    return all(isinstance(f.get(k), (int, float)) and not isinstance(f.get(k), bool)
               and 0 <= f[k] < _MAX_COUNT for k in _REQUIRED[kind])


def _epoch(y, mo, d, h, mi, s) -> float | None:
    """Seconds since the epoch of a log clock (read as UTC); None for an impossible date. A
    date-less clock (2024 releases) is read as a time of 1970-01-01."""
    yy, mm, dd = (int(y), int(mo), int(d)) if y is not None else (1970, 1, 1)
    hh, mi_, ss = int(h), int(mi), int(s)
    if not (1 <= mm <= 12 and 1 <= dd <= 31 and hh < 24 and mi_ < 60 and ss < 61):
        return None
    return float(calendar.timegm((yy, mm, dd, hh, mi_, ss)))


_TAG_CACHE: dict[bytes, tuple] = {}


def _tags(raw: bytes) -> tuple:
    """(pp, dp, tp, attn_cp) from ` DP0 PP1 TP0 ...`."""
    r = _TAG_CACHE.get(raw)
    if r is None:
        tags = {k: int(v) for k, v in _TAG_RE.findall(raw)}
        r = (tags.get(b"PP"), tags.get(b"DP"), tags.get(b"TP"), tags.get(b"ATTN_CP"))
        if len(_TAG_CACHE) > 10_000:
            _TAG_CACHE.clear()
        _TAG_CACHE[raw] = r
    return r


_NO_TAGS = (None, None, None, None)


def _prefix(pre: bytes) -> tuple:
    """(t_s | None | False, tags) from the text before `Decode/Prefill batch`; t_s is False for
    a time that cannot be (a corrupted clock field), None when there is no clock."""
    # SGLang's own bracket is the last `[` before the batch words; a container runtime's prefix
    # (docker / k8s: `2026-11-30T10:00:00.123456789Z stdout F `) puts another clock before it
    k = pre.rfind(b"[")
    m = _STAMP_RE.match(pre, k + 1) if k >= 0 else None
    if m is None:
        m = _STAMP_RE.search(pre)
    if m is None:
        return None, _NO_TAGS
    y, mo, d, h, mi, s, frac, tags = m.groups()
    t = _epoch(y, mo, d, h, mi, s)
    if t is None:
        return False, _NO_TAGS
    if frac:
        t += int(frac) / 10 ** len(frac)
    return t, (_tags(tags) if tags else _NO_TAGS)


def parse_line(line: str, source: int = 0) -> BatchLine | None | str:
    """A BatchLine; None for a line that is not a batch line; "bad" for a batch line we cannot read."""
    raw = line.encode("utf-8", errors="replace")
    m = _BATCH_RE.search(raw)
    if m is None:
        return None
    kind = m.group(1).decode()
    f = _fields(m.group(3).decode("utf-8", errors="replace"))
    if f is None or not _ok(kind, f):
        return "bad"
    t, (pp, dp, tp, cp) = _prefix(raw[:m.start()])
    if t is False:
        return "bad"
    return BatchLine(kind=kind, t_s=t, pp=pp, tp=tp, dp=dp,
                     iteration=int(m.group(2)) if m.group(2) else None, fields=f, source=source,
                     attn_cp=cp)


def _open_blocks(path: Path) -> Iterator[bytes]:
    """The file's bytes in blocks (gzip or plain; a pipe is read once, never reopened)."""
    f = open_input(path, "log")
    with f:
        try:
            magic = f.peek(2)[:2]
        except OSError as e:
            raise CliError(f"{path}: cannot read log ({e.strerror or e})") from None
        src = gzip.GzipFile(fileobj=f, mode="rb") if magic == b"\x1f\x8b" else f
        while True:
            b = src.read(CHUNK_BYTES)
            if not b:
                return
            yield b


def _unwrap_days(t: np.ndarray) -> np.ndarray:
    """Date-less clocks (2024 releases print `[HH:MM:SS]`): in one scheduler's lines, a step
    back of more than 12 h is a wrap past midnight and adds a day."""
    if len(t) > 1 and (t[~np.isnan(t)] < 86400 * 2).all():
        return t + 86400.0 * np.concatenate(([0], np.cumsum(np.diff(t) < -43200.0)))
    return t


def _cat1(parts: list, dtype) -> np.ndarray:
    if not parts:
        return np.zeros(0, dtype=dtype)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _time_order(cols: list) -> tuple:
    """Columns reordered by their first (times, NaN where none), stably, when the times go
    back (lines of several files, or DP ranks, of one rank): clock order, lines without a
    clock first."""
    t = cols[0]
    if len(t) > 1:
        known = np.where(np.isnan(t), -np.inf, t)
        if (np.diff(known[~np.isnan(t)]) < 0).any():
            order = np.argsort(known, kind="stable")
            cols = [c[order] for c in cols]
    return tuple(cols)


class _Group:
    """One scheduler's lines (a (rank, DP, ATTN_CP, TP) key): numpy arrays, one per block, and
    the device words of the `{device} graph: B` field its decode lines logged."""
    __slots__ = ("t", "size", "gen", "queue", "graph",
                 "pre_t", "pre_seq", "pre_tok", "pre_cached", "pre_running", "pre_queue",
                 "labels")
    _COLS = ("t", "size", "gen", "queue", "graph",
             "pre_t", "pre_seq", "pre_tok", "pre_cached", "pre_running", "pre_queue")
    _TYPES = (np.float64, np.int32, np.float64, np.int32, np.int8,
              np.float64, np.int32, np.int64, np.int64, np.int32, np.int32)

    def __init__(self) -> None:
        self.t: list = []       # decode lines' times, NaN when a line has none
        self.size: list = []    # #running-req
        self.gen: list = []     # gen throughput (token/s)
        self.queue: list = []   # #queue-req
        self.graph: list = []   # 1 `{device} graph: True`, 0 False, -1 not logged
        self.pre_t: list = []   # prefill lines' times
        self.pre_seq: list = []      # prefill #new-seq: requests admitted by that prefill
        self.pre_tok: list = []      # #new-token
        self.pre_cached: list = []   # #cached-token, -1 not logged
        self.pre_running: list = []  # #running-req, -1 not logged (disaggregated prefill)
        self.pre_queue: list = []    # #queue-req
        self.labels: set = set()     # "cuda" / "cpu" / "npu" / ... of `{device} graph: B`

    def _parts(self) -> tuple:
        return tuple(getattr(self, c) for c in self._COLS)

    def export(self) -> tuple:
        """The group as one array per field, then its graph labels (also what a worker process
        sends back)."""
        return tuple(_cat1(x, dt) for x, dt in zip(self._parts(), self._TYPES)) \
            + (tuple(sorted(self.labels)),)

    def merge(self, e: tuple) -> None:
        for parts, arr in zip(self._parts(), e[:len(self._COLS)]):
            if len(arr):
                parts.append(arr)
        self.labels.update(e[len(self._COLS)])

    def _joined(self) -> list:
        """Every field as one array (kept so, so a second call does not concatenate again)."""
        cat = list(self.export()[:len(self._COLS)])
        for c, arr in zip(self._COLS, cat):
            setattr(self, c, [arr] if len(arr) else [])
        return cat

    def decode(self) -> tuple:
        """(t, size, gen, queue, graph) of the decode lines in time order, and the time span of
        all the group's lines (None without clocks)."""
        cat = self._joined()
        t = cat[0] = _unwrap_days(cat[0])
        cat[:5] = _time_order(cat[:5])      # several files of one rank
        both = np.concatenate((t, _unwrap_days(cat[5])))
        both = both[~np.isnan(both)]
        span = (float(both.min()), float(both.max())) if len(both) else None
        return tuple(cat[:5]) + (span,)

    def prefill(self) -> tuple:
        """(t, new_seq, new_token, cached_token, running_req, queue_req) of the prefill lines,
        in time order (`_time_order`)."""
        cat = self._joined()[5:]
        cat[0] = _unwrap_days(cat[0])
        return _time_order(cat)

    @property
    def new_tokens(self) -> int:
        return int(sum(int(x.sum()) for x in self.pre_tok))

    @property
    def decode_lines(self) -> int:
        return sum(len(x) for x in self.size)

    @property
    def prefills(self) -> int:
        return sum(len(x) for x in self.pre_t)

    @property
    def lines(self) -> int:
        return self.decode_lines + self.prefills


def _group(groups: dict, key) -> _Group:
    g = groups.get(key)
    if g is None:
        g = groups[key] = _Group()
    return g


def _fast_prefix(lines: list[bytes]) -> tuple[np.ndarray, np.ndarray, list, np.ndarray]:
    """Standard `[YYYY-mm-dd HH:MM:SS[.mmm]{tags}] ` prefixes decoded as fixed-width bytes:
    (t, key index per line, tags per key index (tuple, or None when not rank tags), ok mask).
    Rows not in that layout have ok False."""
    n = len(lines)
    m = np.array(lines, dtype=f"S{_PREFIX_W}").view(np.uint8).reshape(n, _PREFIX_W)
    d8 = m[:, :24] - np.uint8(48)       # digits 0..9; anything else wraps to >= 10
    digit = d8 <= 9
    d = d8.astype(np.int32)
    ok = ((m[:, 0] == 91) & (m[:, 5] == 45) & (m[:, 8] == 45) & (m[:, 11] == 32)
          & (m[:, 14] == 58) & (m[:, 17] == 58)
          & digit[:, [1, 2, 3, 4, 6, 7, 9, 10, 12, 13, 15, 16, 18, 19]].all(axis=1))
    y = d[:, 1] * 1000 + d[:, 2] * 100 + d[:, 3] * 10 + d[:, 4]
    mo, dd = d[:, 6] * 10 + d[:, 7], d[:, 9] * 10 + d[:, 10]
    hh, mi, ss = d[:, 12] * 10 + d[:, 13], d[:, 15] * 10 + d[:, 16], d[:, 18] * 10 + d[:, 19]
    ok &= (mo >= 1) & (mo <= 12) & (dd >= 1) & (dd <= 31) & (hh < 24) & (mi < 60) & (ss < 61)
    ms = ((m[:, 20] == 46) | (m[:, 20] == 44)) & digit[:, 21:24].all(axis=1)  # SGLANG_LOG_MS
    end = np.where(ms, 24, 20)
    # days from the civil date (H. Hinnant's days_from_civil), proleptic Gregorian as timegm
    yy = (y - (mo <= 2)).astype(np.int64)
    era = yy // 400
    yoe = yy - era * 400
    doy = (153 * (mo + np.where(mo > 2, -3, 9)) + 2) // 5 + dd - 1
    days = era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468
    t = (days * 86400 + hh * 3600 + mi * 60 + ss).astype(np.float64)
    t += np.where(ms, d[:, 21] * 100 + d[:, 22] * 10 + d[:, 23], 0) / 1000.0
    # the rank tags run from the end of the clock to the first "]"
    close = np.argmax(m == 93, axis=1)
    ok &= (m[np.arange(n), close] == 93) & (close >= end)
    # only the columns where tags can be (from the clock's end to the last "]"), padded to whole
    # 8-byte words for the hash below
    lo = 20
    hi = lo + -(-(max(int(close.max()), lo + 1) - lo) // 8) * 8
    cols = np.arange(lo, hi)
    sub = m[:, lo:hi] if hi <= _PREFIX_W else np.pad(m[:, lo:], ((0, 0), (0, hi - _PREFIX_W)))
    region = np.where((cols >= end[:, None]) & (cols < close[:, None]), sub, np.uint8(0))
    # group equal tag regions: a hash of each row, checked byte for byte afterwards
    words = np.ascontiguousarray(region).view(np.uint64)
    h = (words * np.arange(1, words.shape[1] * 2, 2, dtype=np.uint64)[None, :]).sum(axis=1)
    uh, first, inv = np.unique(h, return_index=True, return_inverse=True)
    inv = inv.ravel()
    if not (region == region[first][inv]).all():   # a hash collision: group by the bytes
        _, first, inv = np.unique(np.ascontiguousarray(region).view(f"S{hi - lo}").ravel(),
                                  return_index=True, return_inverse=True)
        inv = inv.ravel()
    keys = []
    for i in first:
        raw = region[i].tobytes().replace(b"\x00", b"")
        keys.append(_tags(raw) if raw and _TAGS_FULL.fullmatch(raw) else
                    _NO_TAGS if not raw else None)
    ok &= ~np.array([k is None for k in keys])[inv]
    return t, inv, keys, ok


def _prefixes(lines: list[bytes], kind: bytes) -> tuple[np.ndarray, np.ndarray, list]:
    """t (NaN where none, -inf where the clock is impossible), key index per line, and the
    rank tags of each key index."""
    t, inv, keys, ok = _fast_prefix(lines)
    if not ok.all():
        where = {k: i for i, k in enumerate(keys) if k is not None}
        for i in np.flatnonzero(~ok):
            line = lines[i]
            tt, tg = _prefix(line[:line.find(kind)])
            t[i] = math.nan if tt is None else (-math.inf if tt is False else tt)
            j = where.get(tg)
            if j is None:
                j = where[tg] = len(keys)
                keys.append(tg)
            inv[i] = j
    return t, inv, keys


def _count_or(f: dict, key: str) -> int:
    """An optional count field of a batch line; -1 when not logged or not a count."""
    v = f.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _MAX_COUNT else -1


def _slow(lines: list[bytes], kind: str) -> tuple[list, int]:
    """Field-by-field read of lines the fast expression does not fit: (rows, unreadable)."""
    rows, bad = [], 0
    for line in lines:
        m = _BATCH_RE.search(line)
        if m is None:
            continue   # "Decode batch size ..." in some other message: not a batch line
        f = _fields(m.group(3).decode("utf-8", errors="replace"))
        if m.group(1).decode() != kind or f is None or not _ok(kind, f):
            bad += 1
            continue
        if kind == "Decode":
            key = next((k for k in _GRAPH_KEYS if isinstance(f.get(k), bool)), None)
            rows.append((line, f["#running-req"], float(f["gen throughput (token/s)"]),
                         f["#queue-req"], -1 if key is None else int(f[key]),
                         None if key is None else key.split()[0]))
        else:
            rows.append((line, f["#new-seq"], f["#new-token"], _count_or(f, "#cached-token"),
                         _count_or(f, "#running-req"), f["#queue-req"]))
    return rows, bad


def _graph_labels(blob: bytes, n: int) -> str | list | None:
    """The device word of the `{device} graph: B` field of each of `n` decode lines that all
    log it: one word when every line has the same (the usual case: one count per label), else
    one per line; None when they do not all fit."""
    for k, kb in zip(_GRAPH_KEYS, _GRAPH_KEYS_B):
        if blob.count(kb) == n:
            return k.split()[0]
    found = _DEC_LABEL.findall(blob)
    return [x.decode() for x in found] if len(found) == n else None


def _store(groups: dict, source: int, lines: list[bytes], kind: str, cols: tuple) -> int:
    """Put read lines (and their value columns) into their schedulers' groups; returns the
    number of lines whose clock is impossible (they are dropped, counted unreadable). Decode
    columns: size, gen, queue, graph, graph label(s) (see _graph_labels); prefill: new-seq,
    new-token, cached-token, running-req, queue-req."""
    t, inv, keys = _prefixes(lines, kind.encode() + b" batch")
    bad = np.isneginf(t)
    for j in np.unique(inv[~bad]):
        tg = keys[j]
        g = _group(groups, (tg[0] if tg[0] is not None else source, tg[1], tg[3], tg[2]))
        sel = np.flatnonzero((inv == j) & ~bad)
        if kind == "Decode":
            size, gen, queue, graph, label = cols
            g.t.append(t[sel])
            g.size.append(size[sel].astype(np.int32))
            g.gen.append(gen[sel])
            g.queue.append(queue[sel].astype(np.int32))
            g.graph.append(graph[sel])
            if isinstance(label, str):
                g.labels.add(label)
            elif label is not None:
                g.labels.update(label[i] for i in sel if label[i] is not None)
        else:
            seq, tok, cached, running, queue = cols
            g.pre_t.append(t[sel])
            g.pre_seq.append(seq[sel].astype(np.int32))
            g.pre_tok.append(tok[sel])
            g.pre_cached.append(cached[sel])
            g.pre_running.append(running[sel].astype(np.int32))
            g.pre_queue.append(queue[sel].astype(np.int32))
    return int(bad.sum())


def _read_lines(groups: dict, source: int, lines: list[bytes], kind: str) -> tuple[int, int]:
    """(read, unreadable) batch lines of one kind, in order, into `groups`."""
    if not lines:
        return 0, 0
    n = len(lines)
    blob = b"\n".join(lines)
    cols = None
    if kind == "Decode":
        size, gen, graph = _DEC_SIZE.findall(blob), _DEC_GEN.findall(blob), []
        if len(size) == len(gen) == n:
            graph = _DEC_GRAPH.findall(blob)
            if len(graph) in (0, n):
                g = np.array(gen, dtype="S24").reshape(n, 2)
                cols = (np.array(size, dtype="S12").astype(np.int64), g[:, 0].astype(np.float64),
                        g[:, 1].astype(np.int64),
                        (np.array(graph) == b"True").astype(np.int8) if graph else
                        np.full(n, -1, dtype=np.int8),
                        _graph_labels(blob, n) if graph else None)
    else:
        found = _PRE_FAST.findall(blob)
        if len(found) == n:
            a = np.array(found, dtype="S12").reshape(n, 5)
            a = np.where(a == b"", b"-1", a).astype(np.int64)   # an optional field not logged
            cols = tuple(a[:, i] for i in range(5))
    if cols is not None:
        bad = _store(groups, source, lines, kind, cols)
        return n - bad, bad
    if len(lines) > SUB_LINES:   # find the lines that do not fit, keep the others fast
        good = bad = 0
        for s in range(0, len(lines), SUB_LINES):
            g, b = _read_lines(groups, source, lines[s:s + SUB_LINES], kind)
            good += g
            bad += b
        return good, bad
    rows, bad = _slow(lines, kind)
    if rows:
        if kind == "Decode":
            cols = (np.array([r[1] for r in rows], dtype=np.int64),
                    np.array([r[2] for r in rows], dtype=np.float64),
                    np.array([r[3] for r in rows], dtype=np.int64),
                    np.array([r[4] for r in rows], dtype=np.int8),
                    [r[5] for r in rows])
        else:
            cols = tuple(np.array([r[i] for r in rows], dtype=np.int64) for i in range(1, 6))
        b2 = _store(groups, source, [r[0] for r in rows], kind, cols)
        return len(rows) - b2, bad + b2
    return 0, bad


# A runtime change of the schedulers' settings (SGLang 0.5.23 managers/scheduler_components/
# internal_state.py `set_internal_state`, after a POST /set_internal_state, e.g. by `ppscope
# sglang --mmb-sweep`): "Config updated via context override: {'pp_max_micro_batch_size': 4}",
# logged by every scheduler that applies it.
_OVERRIDE_WORD = b"Config updated via context override: "


def _clock(pre: bytes) -> str | None:
    """The log clock as written (`2026-12-01 21:45:00`, `.mmm` kept), without the rank tags."""
    m = _STAMP_RE.search(pre)
    if m is None:
        return None
    start = m.start(1) if m.group(1) else m.start(4)
    end = m.end(7) if m.group(7) else m.end(6)
    return pre[start:end].decode()


def _overrides_in(lines: list[bytes], source: int) -> list[tuple]:
    """(t_s | None, clock | None, rank, the dict as logged) of each override line."""
    out = []
    for line in lines:
        i = line.find(_OVERRIDE_WORD)
        if i < 0:
            continue
        t, tags = _prefix(line[:i])
        out.append((None if t is None or t is False else t, _clock(line[:i]),
                    tags[0] if tags[0] is not None else source,
                    line[i + len(_OVERRIDE_WORD):].strip().decode("utf-8", errors="replace")))
    return out


def _scan_block(text: bytes, source: int, groups: dict, events: list) -> tuple[int, int]:
    """Batch lines of whole lines `text` into `groups`, override lines onto `events`: (read,
    unreadable) batch lines."""
    lines = text.split(b"\n")
    dec: list[bytes] = []
    pre: list[bytes] = []
    to_dec, to_pre = dec.append, pre.append
    for ln in lines:   # one pass; `in` is a plain byte search, cheaper than a regex call
        if b"Decode batch" in ln:
            to_dec(ln)
        elif b"Prefill batch" in ln:
            to_pre(ln)
    g1, b1 = _read_lines(groups, source, dec, "Decode")
    g2, b2 = _read_lines(groups, source, pre, "Prefill")
    if _OVERRIDE_WORD in text:
        events += _overrides_in(lines, source)
    return g1 + g2, b1 + b2


class _Lines:
    """Line count of the file being read (kept by _texts for its messages and the total)."""
    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


def _clean(block: bytes) -> bytes:
    """NUL bytes dropped (a log copied out of some containers, or cut by logrotate's
    copytruncate, holds runs of them) and CRLF line ends made LF."""
    if b"\x00" in block:
        block = block.replace(b"\x00", b"")
    if b"\r" in block:
        block = block.replace(b"\r\n", b"\n")
    return block


# control bytes no text log holds (NUL, tab, newlines, CR and ESC of ANSI colours excepted)
_CONTROL = bytes([*range(1, 9), *range(14, 27), *range(28, 32)])


def _binary(head: bytes) -> bool:
    """More than 1% control bytes in the first block: binary data, not a log (NUL bytes, which
    some copied logs hold in runs, are not counted)."""
    return len(head) - len(head.translate(None, _CONTROL)) > len(head) // 100


def _texts(path: Path, count: _Lines) -> Iterator[bytes]:
    """The file as blocks of whole lines, with the caps that keep a wrong file from being read
    forever: binary data, or a line over MAX_LINE_BYTES, is a one-line CliError."""
    carry = b""
    first = True
    try:
        for block in _open_blocks(path):
            if first:
                first = False
                if _binary(block[:65536]):
                    raise CliError(f"{path}: binary data, not a text log")
            cut = block.rfind(b"\n")
            if cut < 0:
                carry += block
                if len(carry) > MAX_LINE_BYTES:
                    raise CliError(f"{path}: line {count.n + 1} is longer than "
                                   f"{MAX_LINE_BYTES >> 20} MB: not a text log")
                continue
            text = carry + block[:cut + 1] if carry else block[:cut + 1]
            carry = block[cut + 1:]
            count.n += text.count(b"\n")
            if len(carry) > MAX_LINE_BYTES:
                raise CliError(f"{path}: line {count.n + 1} is longer than "
                               f"{MAX_LINE_BYTES >> 20} MB: not a text log")
            yield _clean(text)
        if carry:
            count.n += 1
            yield _clean(carry)
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise CliError(f"{path}: truncated or corrupt gzip after {count.n} lines ({e})") from None
    except OSError as e:
        raise CliError(f"{path}: cannot read log after {count.n} lines ({e.strerror or e})") \
            from None
    if count.n == 0:
        raise CliError(f"{path}: empty log file")


def _block_job(text: bytes, source: int) -> tuple[dict, int, int, int, list]:
    """One block read in a worker process: its groups as plain arrays, (read, unreadable,
    lines), its override lines."""
    groups: dict = {}
    events: list = []
    good, bad = _scan_block(text, source, groups, events)
    return {k: g.export() for k, g in groups.items()}, good, bad, 0, events


def _range_job(path: Path, start: int, end: int, source: int) -> tuple[dict, int, int, int,
                                                                      list]:
    """The lines that start in bytes [start, end) of a plain file, read by a worker process
    itself (nothing crosses a pipe but the numbers): as _block_job, with the line count."""
    def to_newline(f) -> bytes:
        """Bytes up to and including the next newline (all that is left if none)."""
        out = b""
        while True:
            piece = f.read(65536)
            nl = piece.find(b"\n")
            if nl >= 0:
                return out + piece[:nl + 1]
            out += piece
            if not piece:
                return out
            if len(out) > MAX_LINE_BYTES:
                raise CliError(f"{path}: a line near byte {f.tell()} is longer than "
                               f"{MAX_LINE_BYTES >> 20} MB: not a text log")

    with open(path, "rb") as f:
        begin = 0
        if start:   # the line running through `start` belongs to the range before
            f.seek(start - 1)
            begin = start - 1 + len(to_newline(f))
            if begin >= end:
                return {}, 0, 0, 0, []
        f.seek(begin)
        text = f.read(end - begin)
        if text and not text.endswith(b"\n"):   # finish the last line, however far it goes
            text += to_newline(f)
    lines = text.count(b"\n") + (1 if text and not text.endswith(b"\n") else 0)
    parts, good, bad, _, events = _block_job(_clean(text), source)
    return parts, good, bad, lines, events


def _plain_size(path: Path) -> int:
    """Size of a regular, uncompressed, text file worth splitting into byte ranges; else 0 (the
    blocks are then read by _texts, with its checks)."""
    try:
        if not path.is_file():
            return 0
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(65536)
    except OSError as e:
        raise CliError(f"{path}: cannot read log ({e.strerror or e})") from None
    if head[:2] == b"\x1f\x8b" or size <= CHUNK_BYTES:
        return 0
    if _binary(head):
        raise CliError(f"{path}: binary data, not a text log")
    return size


def worker_count(paths: list[Path], workers: int | None) -> int:
    if workers is not None:
        return max(1, int(workers))
    try:
        size = sum(p.stat().st_size for p in paths if p.is_file())
    except OSError:
        return 1
    # a spare core per worker: on a 2-core machine shared with other work, two workers and
    # this process fought for the cores and read slower than one process (docs/BENCHMARKS.md)
    return max(1, min(MAX_WORKERS, (os.cpu_count() or 1) - 1)) if size >= PARALLEL_MIN_BYTES \
        else 1


@dataclass(frozen=True)
class LogScan:
    groups: dict                 # (rank, dp, attn_cp, tp) -> _Group
    lines_total: int
    lines_other: int
    lines_unrecognised: int
    files: tuple[str, ...]
    files_without_batch_lines: tuple[str, ...] = ()
    overrides: tuple[tuple, ...] = ()   # (t_s, clock, rank, dict text) per line, file order

    @property
    def lines_batch(self) -> int:
        return sum(g.lines for g in self.groups.values())


def scan_logs(paths: Iterable[str | Path], workers: int | None = None) -> LogScan:
    """Read every file. `workers`: processes reading blocks in parallel (default: one per core
    but one, up to MAX_WORKERS, when the files hold 32 MB or more; else this process alone);
    results are merged in block order, so the answer does not depend on it."""
    # the regular-expression results are millions of short-lived tuples and no cycles: the
    # cyclic garbage collector would only scan them over and over (~15% of the time)
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _scan_logs([Path(p) for p in paths], workers)
    finally:
        if enabled:
            gc.enable()


def _block_job_nogc(*args) -> tuple:
    gc.disable()
    return (_range_job if len(args) == 4 else _block_job)(*args)


def _scan_logs(paths: list[Path], workers: int | None) -> LogScan:
    if not paths:
        raise CliError("no log files given")
    groups: dict = {}
    events: list = []
    total = good = bad = 0
    files, empty = [], []
    n_workers = worker_count(paths, workers)
    pool = None
    if n_workers > 1:
        import concurrent.futures as cf
        import multiprocessing as mp
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
        pool = cf.ProcessPoolExecutor(max_workers=n_workers, mp_context=ctx)
    try:
        for i, p in enumerate(paths):
            files.append(str(p))
            count = _Lines()
            g_file = b_file = 0
            if pool is None:
                for text in _texts(p, count):
                    g, b = _scan_block(text, i, groups, events)
                    g_file += g
                    b_file += b
            else:
                pending: list = []   # futures in block order; at most 2 per worker in flight

                def merge(fut) -> None:
                    nonlocal g_file, b_file
                    parts, g, b, n, ev = fut.result()
                    for k, arrays in parts.items():
                        _group(groups, k).merge(arrays)
                    events.extend(ev)
                    g_file += g
                    b_file += b
                    count.n += n
                size = _plain_size(p)
                # a plain file: workers read their own byte ranges; else (gzip, a pipe) this
                # process reads and sends the blocks
                jobs = ((_block_job_nogc, p, s, min(s + RANGE_BYTES, size), i)
                        for s in range(0, size, RANGE_BYTES)) if size else \
                    ((_block_job_nogc, text, i) for text in _texts(p, count))
                for job in jobs:
                    pending.append(pool.submit(*job))
                    while len(pending) >= 2 * n_workers:
                        merge(pending.pop(0))
                while pending:
                    merge(pending.pop(0))
                if size and count.n == 0:
                    raise CliError(f"{p}: empty log file")
            total += count.n
            good += g_file
            bad += b_file
            if g_file == 0:
                empty.append(str(p))
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    if good == 0:
        raise CliError(f"{files[0] if len(files) == 1 else ', '.join(files)}: no 'Decode batch' / "
                       f"'Prefill batch' lines in {total} lines ({bad} cut or unreadable); is it "
                       f"an SGLang server log at --log-level info?")
    return LogScan(groups, total, total - good - bad, bad, tuple(files), tuple(empty),
                   tuple(events))


def _num(x):
    """A numpy scalar as a plain int or float for JSON."""
    return x.item() if hasattr(x, "item") else x


def _q(vals: np.ndarray) -> dict:
    if not len(vals):
        return {"min": None, "median": None, "max": None}
    return {"min": _num(vals.min()), "median": float(np.median(vals)), "max": _num(vals.max())}


def _windows(sizes: np.ndarray, window: int) -> np.ndarray:
    k = len(sizes) // window
    if k == 0:
        return np.zeros(0)
    w = sizes[:k * window].reshape(k, window).astype(np.float64)
    mean = w.mean(axis=1)
    keep = mean > 0
    return w.max(axis=1)[keep] / mean[keep]


def _cv(sizes: np.ndarray) -> float | None:
    mean = float(sizes.mean()) if len(sizes) else 0.0
    return float(sizes.astype(np.float64).std() / mean) if len(sizes) > 1 and mean > 0 else None


def slot_imbalance(sizes, window: int) -> dict:
    """max/mean of slot sizes per window of `window` consecutive decode lines (median over
    windows) and the coefficient of variation of all sizes. See the module docstring."""
    sizes = np.asarray(sizes)
    ratios = _windows(sizes, window)
    return {"window": window, "windows": len(ratios),
            "max_over_mean_median": float(np.median(ratios)) if len(ratios) else None,
            "cv": _cv(sizes)}


def _cat(arrays: list[np.ndarray]) -> np.ndarray:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _throughput_series(dec: list[tuple], bin_s: float) -> list[dict]:
    t = _cat([d[0] for d in dec])
    known = ~np.isnan(t)
    if not known.any():
        return []
    t = t[known]
    gen = _cat([d[2] for d in dec])[known]
    size = _cat([d[1] for d in dec])[known].astype(np.float64)
    queue = _cat([d[3] for d in dec])[known].astype(np.float64)
    b = np.floor((t - t.min()) / bin_s).astype(np.int64)
    bins, inv, n = np.unique(b, return_inverse=True, return_counts=True)
    inv = inv.ravel()
    sums = [np.bincount(inv, weights=w, minlength=len(bins)) for w in (gen, size, queue)]
    return [{"t_s": float(k * bin_s), "lines": int(c),
             "gen_throughput_tok_s": float(sums[0][j] / c),
             "running_req_mean": float(sums[1][j] / c), "queue_req_mean": float(sums[2][j] / c)}
            for j, (k, c) in enumerate(zip(bins, n))]


PREFILL_WAVES = 64    # prefill lines kept one by one per rank (the first ones, in time order)


def _waves(groups: list[_Group]) -> dict:
    """What the prefill lines of one PP rank (all its DP ranks, in clock order) say about
    admission: each prefill batch admits `#new-seq` waiting requests, so the sequence of
    #new-seq is how arrivals were split (8 requests sent at once, admitted as 6 then 2: two
    prefills, and under PP two micro-batch slots of 6 and 2)."""
    cols = [np.concatenate(c) for c in zip(*(g.prefill() for g in groups))]
    t, seq, tok, cached, running, queue = _time_order(cols) if len(groups) > 1 else cols
    vals, counts = np.unique(seq, return_counts=True)
    k = min(len(seq), PREFILL_WAVES)
    return {
        "prefill_new_seq_total": int(seq.sum()),
        "prefill_cached_tokens": int(cached[cached >= 0].sum()),
        "prefill_new_seq_hist": {str(v): int(c) for v, c in zip(vals, counts)},
        "prefill_waves": [
            {"t_s": None if math.isnan(t[i]) else float(t[i]), "new_seq": int(seq[i]),
             "new_token": int(tok[i]), "cached_token": None if cached[i] < 0 else int(cached[i]),
             "running_req": None if running[i] < 0 else int(running[i]),
             "queue_req": int(queue[i])} for i in range(k)],
    }


def _summary(groups: list[_Group], dec: list[tuple], window: int) -> dict:
    sizes = _cat([d[1] for d in dec])
    graph = _cat([d[4] for d in dec])
    logged = graph >= 0
    if len(dec) == 1:
        imb = slot_imbalance(dec[0][1], window)
    else:   # windows within each DP rank's scheduler, pooled; cv per scheduler, median
        ratios = np.concatenate([_windows(d[1], window) for d in dec])
        cvs = [c for c in (_cv(d[1]) for d in dec) if c is not None]
        imb = {"window": window, "windows": len(ratios),
               "max_over_mean_median": float(np.median(ratios)) if len(ratios) else None,
               "cv": float(np.median(cvs)) if cvs else None}
    spans = [d[5] for d in dec if d[5] is not None]
    return {
        "decode_lines": len(sizes),
        "prefill_lines": sum(g.prefills for g in groups),
        "running_req": _q(sizes),
        "cuda_graph_frac": float((graph[logged] == 1).mean()) if logged.any() else None,
        # which `{device} graph: B` field the decode lines logged ("cuda", "cpu", ...: SGLang
        # names it by device); the share above is of that device's graph path
        "graph_device": ",".join(sorted(set().union(*(g.labels for g in groups)))) or None,
        "gen_throughput_tok_s": _q(_cat([d[2] for d in dec])),
        "queue_req": _q(_cat([d[3] for d in dec])),
        "prefill_new_tokens": sum(g.new_tokens for g in groups),
        **_waves(groups),
        "span_s": (max(b for _, b in spans) - min(a for a, _ in spans)) if spans else None,
        "slot_imbalance": imb,
    }


OVERRIDE_SAME_S = 5.0   # one POST reaches every scheduler within moments: one change


def _override_dict(text: str) -> dict:
    """The logged overrides as {key: value} (values JSON can hold; others as their repr);
    empty when the text is not a dict literal (it is kept as logged beside it)."""
    try:
        d = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return {}
    if not isinstance(d, dict):
        return {}
    ok = (str, int, bool, type(None))
    return {str(k): v if isinstance(v, ok) or isinstance(v, float) and math.isfinite(v)
            else repr(v) for k, v in d.items()}


def config_overrides(events: Iterable[tuple]) -> list[dict]:
    """Runtime setting changes (see _OVERRIDE_WORD) in clock order: `t_s` (log clock, seconds
    since the epoch read as UTC, None without a clock), `clock` (as logged), `ranks` (the PP
    ranks whose scheduler logged it; file index without PP tags), `overrides` (the settings and
    their new values), `text` (the dict as logged). The same change logged by several
    schedulers within OVERRIDE_SAME_S seconds is one."""
    out: list[dict] = []
    for t, clock, rank, text in sorted(events, key=lambda e: (e[0] is None, e[0] or 0.0)):
        same = next((e for e in reversed(out) if e["text"] == text and (
            e["t_s"] is None and t is None
            or e["t_s"] is not None and t is not None and t - e["t_s"] <= OVERRIDE_SAME_S)),
            None)
        if same is None:
            out.append({"t_s": t, "clock": clock, "ranks": [rank],
                        "overrides": _override_dict(text), "text": text})
        elif rank not in same["ranks"]:
            same["ranks"] = sorted(same["ranks"] + [rank])
    return out


def summarize(scan: LogScan, window: int = 16, bin_s: float = 10.0) -> dict:
    """The `ranks` / `slot_imbalance` part of sglang.json from a scan."""
    # rank -> dp -> the (attn_cp, tp) groups of that scheduler; keep the lowest (same batch)
    by_rank: dict[int, dict] = {}
    for (rank, dp, cp, tp), g in scan.groups.items():
        by_rank.setdefault(rank, {}).setdefault(dp, []).append(((cp or 0, tp or 0), g))
    ranks = {}
    skipped = 0
    best = None    # (decode lines, rank, dp, decode arrays) of the scheduler with most lines
    for r in sorted(by_rank):
        kept: dict = {}
        for dp, gs in by_rank[r].items():
            gs.sort(key=lambda x: x[0])
            kept[dp] = gs[0][1]
            skipped += sum(g.lines for _, g in gs[1:])
        dps = sorted(kept, key=lambda d: -1 if d is None else d)
        dec = {x: kept[x].decode() for x in dps}
        d = _summary([kept[x] for x in dps], [dec[x] for x in dps], window)
        d["dp_ranks"] = [x for x in dps if x is not None]
        d["over_time"] = _throughput_series([dec[x] for x in dps], bin_s)
        if dps != [None]:
            d["by_dp"] = {str(x): _summary([kept[x]], [dec[x]], window)
                          for x in dps if x is not None}
        ranks[str(r)] = d
        for x in dps:
            n = len(dec[x][1])
            if best is None or n > best[0]:
                best = (n, r, x, dec[x])
    run = None
    if best is not None and best[0] > 0:
        # run-wide index: the scheduler with the most decode lines (every rank sees the same
        # slots)
        run = {"rank": best[1], "dp": best[2], **slot_imbalance(best[3][1], window)}
    return {
        "log_files": list(scan.files),
        "lines_total": scan.lines_total,
        "lines_batch": scan.lines_batch - skipped,
        "lines_other": scan.lines_other,
        "lines_unrecognised": scan.lines_unrecognised,
        "lines_other_tp": skipped,
        "files_without_batch_lines": list(scan.files_without_batch_lines),
        "ranks": ranks,
        "slot_imbalance": run,
        "config_overrides": config_overrides(scan.overrides),
    }


# The scheduler's start-up line (SGLang 0.5.23 managers/scheduler.py, `Scheduler.__init__`):
# "max_total_num_tokens=N, chunked_prefill_size=N, max_prefill_tokens=N,
#  max_running_requests=N, context_len=N, available_gpu_mem=X GB"
_SETTINGS_RE = re.compile(rb"\b(max_total_num_tokens|chunked_prefill_size|max_prefill_tokens|"
                          rb"max_running_requests|context_len)=(-?\d{1,12})\b")
SETTINGS_BYTES = 8 << 20     # the start-up line is among a log's first lines: read no further


def _startup_blocks(path: Path) -> Iterator[bytes]:
    """The first SETTINGS_BYTES of a log as blocks of whole lines (a line cut by a block edge is
    completed by the next blocks: the server_args line alone is ~20 kB); nothing for a file the
    scan already found unreadable."""
    seen = 0
    tail = b""
    try:
        for block in _open_blocks(path):
            seen += len(block)
            cut = block.rfind(b"\n")
            if cut < 0:      # no line ends in this block: the line goes on in the next
                tail = tail + block if len(tail) + len(block) <= MAX_LINE_BYTES else b""
            else:
                block, tail = tail + block[:cut + 1], block[cut + 1:]
                if len(tail) > MAX_LINE_BYTES:
                    tail = b""
                yield _clean(block)
            if seen >= SETTINGS_BYTES:
                return
        if tail:
            yield _clean(tail)
    except (EOFError, OSError, zlib.error):  # the scan already said what is wrong with it
        return


def _settings_in(block: bytes) -> dict[str, int] | None:
    if b"max_running_requests=" not in block:
        return None
    for line in block.splitlines():
        if b"max_running_requests=" in line:
            return {k.decode(): int(v) for k, v in _SETTINGS_RE.findall(line)}
    return None


# Which MoE kernel the server runs, from its start-up lines (SGLang 0.5.23):
# - layers/quantization/compressed_tensors/compressed_tensors.py logs the scheme it picks for a
#   compressed-tensors MoE once, `Using CompressedTensorsWNA16MarlinMoEMethod` (INT4 W4A16 on
#   CUDA by default: Marlin) or `Using CompressedTensorsWNA16TritonMoE (<reason>)` (Triton:
#   `--moe-runner-backend triton`, SM100/SM103 by default, ROCm), `Using
#   CompressedTensorsW8A8Fp8MoE`, ...;
# - layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py, when the Triton fused MoE
#   loads its block config: `Using MoE kernel config from <file>.` (tuned for this GPU and
#   shape), a warning `Config file not found at <file>. Fallback to triton version <v> and use
#   MoE kernel config from <file>. ...`, or `Using default MoE kernel config. Performance might
#   be sub-optimal! Config file not found at <file>, ...` (untuned).
_MOE_SCHEME_RE = re.compile(rb"\bUsing ([A-Za-z0-9_]*Mo[Ee](?:Method)?)\b(?: \(([^)\n]{0,80})\))?")
_CFG_FILE = rb"(\S{1,400}?\.json|\S{1,400}?)"          # the file names hold commas and dots
_MOE_TUNED_RE = re.compile(rb"Using MoE kernel config from " + _CFG_FILE + rb"\.?\s*$")
_MOE_FALLBACK_RE = re.compile(rb"Fallback to triton version (\S{1,40}) and use MoE kernel config "
                              rb"from " + _CFG_FILE + rb"\.(?:\s|$)")
_MOE_DEFAULT_RE = re.compile(rb"Using default MoE kernel config\.(?:.*?Config file not found at "
                             + _CFG_FILE + rb"[,.]?(?:\s|$))?")


def _moe_kind(scheme: str) -> str:
    s = scheme.lower()
    return "marlin" if "marlin" in s else "triton" if "triton" in s else "other"


def _moe_in(block: bytes, out: dict[str, str]) -> None:
    """Fill `out` (see `startup_moe_kernel`) from the MoE lines of `block`; first line wins."""
    if b"MoE" not in block and b"Moe" not in block:
        return
    for line in block.splitlines():
        if b"Mo" not in line:
            continue
        line = line.rstrip()
        m = _MOE_SCHEME_RE.search(line)
        if m and "scheme" not in out and m.group(1) != b"MoE":   # not "Using MoE kernel..."
            out["scheme"] = m.group(1).decode()
            out["kernel"] = _moe_kind(out["scheme"])
            if m.group(2):
                out["reason"] = m.group(2).decode(errors="replace")
        if "triton_config" in out:
            continue
        if (m := _MOE_FALLBACK_RE.search(line)):
            out["triton_config"] = "fallback"
            out["config_file"] = m.group(2).decode(errors="replace")
        elif (m := _MOE_DEFAULT_RE.search(line)):
            out["triton_config"] = "default"
            if m.group(1):
                out["config_file"] = m.group(1).decode(errors="replace")
        elif (m := _MOE_TUNED_RE.search(line)):
            out["triton_config"] = "tuned"
            out["config_file"] = m.group(1).decode(errors="replace")


# The resolved server arguments, logged once by the launching process (SGLang 0.5.23
# srt/entrypoints/engine.py: "server_args={'model_path': ..., 'pp_size': 2, ...}", a dict repr;
# "server_args=ServerArgs(model_path=..., pp_size=2, ...)" in releases before the argument
# groups). The few that decide how a PP deployment batches, and whether decode may run on
# graphs, are kept (`ServerArgs`); the dict is read with ast.literal_eval, each key by a regular
# expression where that fails (a value whose repr is not a literal) and in the old form.
_SERVER_ARGS_WORD = b"server_args="


@dataclass(frozen=True)
class ServerArgs:
    """What the `server_args=` line says (None: not in it, or not that type). `None` for
    max_running_requests / pp_max_micro_batch_size / chunked_prefill_size means SGLang chose the
    value at start-up (the scheduler line, `server_settings`, has what it chose)."""
    form: str                                  # "dict" (0.5.23) | "ServerArgs(...)" (older)
    pp_size: int | None = None
    tp_size: int | None = None
    device: str | None = None
    attention_backend: str | None = None
    disable_cuda_graph: bool | None = None
    # 0.5.23 resolves graph use per phase: cuda_graph_config['decode']['backend'] ("disabled"
    # when --disable-cuda-graph, --cuda-graph-backend-decode=disabled or an auto-disable rule)
    decode_graph_backend: str | None = None
    cuda_graph_max_bs: int | None = None       # the largest decode batch captured
    enable_torch_compile: bool | None = None   # on CPU, the only way to a CPU graph
    pp_async_batch_depth: int | None = None
    pp_max_micro_batch_size: int | None = None
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None


_SA_SCALAR = rb"(None|True|False|-?\d{1,12}(?:\.\d{1,12})?|'[^'\n]{0,200}')"


def _sa_key(text: bytes, key: str):
    """One `'key': value` / `key=value` of the line as a Python value (not found: ...)."""
    m = re.search(rb"(?<![A-Za-z0-9_])'?" + key.encode() + rb"'?(?:=|: )" + _SA_SCALAR, text)
    if m is None:
        return ...
    try:
        return ast.literal_eval(m.group(1).decode())
    except (ValueError, SyntaxError):
        return ...


def _typed(v, tp: type):
    """v when it is a `tp` (an int is not a bool here, nor a bool an int), else None."""
    if tp is int and isinstance(v, bool):
        return None
    return v if isinstance(v, tp) else None


def _server_args_in(block: bytes) -> ServerArgs | None:
    i = block.find(_SERVER_ARGS_WORD)
    if i < 0:
        return None
    end = block.find(b"\n", i)
    text = block[i + len(_SERVER_ARGS_WORD):end if end >= 0 else len(block)].strip()
    d = None
    if text.startswith(b"{"):
        try:
            d = ast.literal_eval(text.decode("utf-8", errors="replace"))
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            d = None
    elif not text.startswith(b"ServerArgs("):
        return None
    get = (lambda k: d.get(k, ...)) if isinstance(d, dict) else (lambda k: _sa_key(text, k))
    graph = get("cuda_graph_config")
    dec = graph.get("decode") if isinstance(graph, dict) else None
    if not isinstance(dec, dict):   # the regular-expression read, or no such argument
        m = re.search(rb"'cuda_graph_config': \{'decode': \{([^{}]{0,400})", text)
        dec = {k: _sa_key(m.group(1), k) for k in ("backend", "max_bs")} if m else {}
    max_bs = next((v for v in (dec.get("max_bs"), get("cuda_graph_max_bs_decode"),
                               get("cuda_graph_max_bs")) if _typed(v, int) is not None), None)
    backend = dec.get("backend")
    if _typed(backend, str) is None:
        backend = get("cuda_graph_backend_decode")
    ints = ("pp_size", "tp_size", "pp_async_batch_depth", "pp_max_micro_batch_size",
            "max_running_requests", "chunked_prefill_size", "max_prefill_tokens")
    return ServerArgs(
        form="dict" if text.startswith(b"{") else "ServerArgs(...)",
        device=_typed(get("device"), str), attention_backend=_typed(get("attention_backend"), str),
        disable_cuda_graph=_typed(get("disable_cuda_graph"), bool),
        decode_graph_backend=_typed(backend, str), cuda_graph_max_bs=max_bs,
        enable_torch_compile=_typed(get("enable_torch_compile"), bool),
        **{k: _typed(get(k), int) for k in ints})


# Start-up lines that say decode graphs are off by a setting (SGLang 0.5.23 srt/arg_groups/):
# "Cuda graph is disabled because of using torch native attention backend" (attention_hook.py;
# also flex attention, deepep_mode=`normal` in moe_hook.py, "CUDA graph is disabled because
# --enable-mis is set.", "Cuda graph is disabled for diffusion LLM inference on AMD GPUs"), and
# argparse_actions.py's warning that the flag was given, "'--disable-cuda-graph' is deprecated
# and will be removed ..." (printed between ANSI colour codes).
_GRAPH_OFF_RE = re.compile(rb"(?i)\bcuda graph is disabled\b[^\n\x1b]{0,200}")
_GRAPH_FLAG_RE = re.compile(rb"'--disable-cuda-graph' is deprecated")


def _graph_notes_in(block: bytes, out: list[str]) -> None:
    """Append (once each) the lines of `block` that say decode graphs are off by a setting."""
    if b"raph is disabled" not in block and b"--disable-cuda-graph" not in block:
        return
    for m in _GRAPH_OFF_RE.finditer(block):
        note = m.group(0).decode("utf-8", errors="replace").strip()
        if note not in out:
            out.append(note)
    flag = "--disable-cuda-graph given (SGLang's deprecation warning for it)"
    if _GRAPH_FLAG_RE.search(block) and flag not in out:
        out.append(flag)


def graph_setting(sa: ServerArgs | None, notes: Iterable[str]) -> dict:
    """Whether decode graphs are off BY SETTING, and why: `off_by_setting` True (with
    `reasons`), False (the server arguments leave them on: a decode line with `graph: False`
    then is a real fallback), None (the log says neither). SGLang 0.5.23 decides it in
    model_runner_components/cuda_graph_setup.py `capture_decode_graph`: on CPU a graph is
    captured only with --enable-torch-compile (the CUDA switches are not read there); on other
    devices not when cuda_graph_config's decode backend is "disabled", which
    --disable-cuda-graph and the auto-disable rules of the notes above set."""
    notes = list(notes)
    reasons: list[str] = []
    if sa is not None and sa.device == "cpu":
        if sa.enable_torch_compile:
            return {"off_by_setting": False, "reasons": []}
        reasons.append("device cpu without --enable-torch-compile: SGLang captures no CPU graph")
    if sa is not None and sa.disable_cuda_graph:
        reasons.append("server_args disable_cuda_graph=True")
    if sa is not None and sa.decode_graph_backend == "disabled":
        reasons.append("server_args cuda_graph_config decode backend 'disabled'")
    reasons += [n if n.startswith("--") else f"SGLang: {n}" for n in notes]
    if reasons:
        return {"off_by_setting": True, "reasons": reasons}
    said = sa is not None and (sa.decode_graph_backend, sa.disable_cuda_graph) != (None, None)
    return {"off_by_setting": False if said else None, "reasons": []}


@dataclass(frozen=True)
class Startup:
    """What a log's start-up lines say (see `startup`)."""
    settings: dict
    moe_kernel: dict
    attention_backend: dict
    server_args: ServerArgs | None
    graph_notes: tuple[str, ...]


def startup(paths: Iterable[str | Path]) -> Startup:
    """The start-up lines, one read of at most SETTINGS_BYTES per file: the settings of the
    first file that has the line (every rank logs the same), the MoE lines of the first file
    that has any, the attention backend of the first file that names one, the server arguments
    of the first file that has them, and every graph note (once each)."""
    settings: dict[str, int] = {}
    moe: dict[str, str] = {}
    attn: dict[str, str] = {}
    sa: ServerArgs | None = None
    notes: list[str] = []
    for p in paths:
        file_moe: dict[str, str] = {}
        file_attn: dict[str, str] = {}
        for block in _startup_blocks(Path(p)):
            if not settings:
                settings = _settings_in(block) or {}
            if not moe:
                _moe_in(block, file_moe)
            if not attn:
                _attn_in(block, file_attn)
            if sa is None:
                sa = _server_args_in(block)
            _graph_notes_in(block, notes)
            if settings and (moe or ("scheme" in file_moe and "triton_config" in file_moe)) \
                    and (attn or file_attn.get("source", "").startswith("--")) and sa is not None:
                break
        moe = moe or file_moe
        attn = attn or file_attn
        if settings and moe and attn and sa is not None:
            break
    return Startup(settings, moe, attn, sa, tuple(notes))


# Which attention backend decodes (SGLang 0.5.23): with none given, srt/arg_groups/overrides.py
# `_attention_backend_default` logs "Attention backend not specified. Use <backend> backend by
# default." (for MLA models: fa3 on Hopper, flashinfer on SM100, triton on other CUDA GPUs,
# `get_default_attn_backend`); the engine logs the resolved arguments once, "server_args={...,
# 'attention_backend': 'triton', ..., 'decode_attention_backend': None, ...}" (a dict since the
# argument groups; "ServerArgs(..., attention_backend='triton', ...)" in older releases). A
# decode backend given apart (--decode-attention-backend) is the one decode runs.
_ATTN_DEFAULT_RE = re.compile(rb"Attention backend not specified\. Use ([A-Za-z0-9_]{1,40}) "
                              rb"backend by default")
_ATTN_ARG_RE = re.compile(rb"(?<![A-Za-z0-9_])'?(decode_attention_backend|attention_backend)'?"
                          rb"(?:=|: )'([A-Za-z0-9_]{1,40})'")


def _attn_in(block: bytes, out: dict[str, str]) -> None:
    """Fill `out` (see `startup_attention_backend`) from `block`: a decode backend given apart
    wins over the backend for both, which wins over the default SGLang says it picked."""
    if b"ttention backend" not in block and b"attention_backend" not in block:
        return
    rank = {"--decode-attention-backend": 3, "--attention-backend": 2, "default": 1}
    for line in block.splitlines():
        found = []
        if (m := _ATTN_DEFAULT_RE.search(line)):
            found.append(("default", m.group(1)))
        if b"server_args" in line or b"ServerArgs(" in line:
            for k, v in _ATTN_ARG_RE.findall(line):
                found.append(("--decode-attention-backend" if k.startswith(b"decode")
                              else "--attention-backend", v))
        for src, v in found:
            if rank[src] > rank.get(out.get("source", ""), 0):
                out["backend"], out["source"] = v.decode(), src


def startup_settings(paths: Iterable[str | Path]) -> dict[str, int]:
    """The values the server ran with, from its start-up line (`startup`)."""
    return startup(paths).settings


def startup_moe_kernel(paths: Iterable[str | Path]) -> dict[str, str]:
    """What the log says about the server's MoE kernel (the lines above), from at most
    SETTINGS_BYTES of each file: `scheme` (the quantisation scheme SGLang picked), `kernel`
    (marlin / triton / other), `reason` (why Triton, when SGLang says), `triton_config` (tuned /
    fallback / default: the Triton fused MoE's block config), `config_file`. Empty when the log
    has none of them (a bf16 model, or logged below info level)."""
    return startup(paths).moe_kernel


def startup_attention_backend(paths: Iterable[str | Path]) -> dict[str, str]:
    """Which attention backend decodes, from the start-up lines (above): `backend` (as SGLang
    names it: triton, fa3, flashinfer, flashmla, trtllm_mla, ...) and `source`
    (--decode-attention-backend / --attention-backend: the resolved arguments; default: SGLang's
    line saying it picked its default). Empty when the log names none."""
    return startup(paths).attention_backend


def read_logs(paths: Iterable[str | Path], window: int = 16, bin_s: float = 10.0,
              workers: int | None = None) -> dict:
    paths = list(paths)
    out = summarize(scan_logs(paths, workers=workers), window=window, bin_s=bin_s)
    st = startup(paths)
    out["server_settings"], out["moe_kernel"], out["attention_backend"] = \
        st.settings, st.moe_kernel, st.attention_backend
    out["server_args"] = None if st.server_args is None else asdict(st.server_args)
    out["graph_setting"] = graph_setting(st.server_args, st.graph_notes)
    return out
