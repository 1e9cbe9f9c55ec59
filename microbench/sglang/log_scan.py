"""SGLang's server log, scanned: its batch lines (Decode / Prefill, every release's layout) into
per-rank columns, block by block, in worker processes for big logs (microbench/sglang/log.py
describes the formats and the whole reader)."""
from __future__ import annotations

import calendar
import gc
import gzip
import math
import os
import re
import zlib
from dataclasses import dataclass, field
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


def open_blocks(path: Path) -> Iterator[bytes]:
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


def time_order(cols: list) -> tuple:
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


class RankGroup:
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
        cat[:5] = time_order(cat[:5])      # several files of one rank
        both = np.concatenate((t, _unwrap_days(cat[5])))
        both = both[~np.isnan(both)]
        span = (float(both.min()), float(both.max())) if len(both) else None
        return tuple(cat[:5]) + (span,)

    def prefill(self) -> tuple:
        """(t, new_seq, new_token, cached_token, running_req, queue_req) of the prefill lines,
        in time order (`time_order`)."""
        cat = self._joined()[5:]
        cat[0] = _unwrap_days(cat[0])
        return time_order(cat)

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


def _group(groups: dict, key) -> RankGroup:
    g = groups.get(key)
    if g is None:
        g = groups[key] = RankGroup()
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
OVERRIDE_WORD = b"Config updated via context override: "


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
        i = line.find(OVERRIDE_WORD)
        if i < 0:
            continue
        t, tags = _prefix(line[:i])
        out.append((None if t is None or t is False else t, _clock(line[:i]),
                    tags[0] if tags[0] is not None else source,
                    line[i + len(OVERRIDE_WORD):].strip().decode("utf-8", errors="replace")))
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
    if OVERRIDE_WORD in text:
        events += _overrides_in(lines, source)
    return g1 + g2, b1 + b2


class _Lines:
    """Line count of the file being read (kept by _texts for its messages and the total)."""
    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


def clean_block(block: bytes) -> bytes:
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
        for block in open_blocks(path):
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
            yield clean_block(text)
        if carry:
            count.n += 1
            yield clean_block(carry)
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
    parts, good, bad, _, events = _block_job(clean_block(text), source)
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
    groups: dict                 # (rank, dp, attn_cp, tp) -> RankGroup
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
