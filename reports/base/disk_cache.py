"""An on-disk cache of what `ppscope report` computes from its inputs: the model's runs and the
figures drawn from them, so that a second report of the same inputs takes well under a second.
A cache may make the report faster; it never changes what the report says, and it never
deletes or replaces a file it did not write.

What is cached: a value computed by a pure function of its inputs (the pipeline model's runs:
reports/report_run.py; a PNG drawn from report numbers: reports/render/render_html.py).

The key (why a stale entry can never change a number): sha256 of
  - the code version: every `*.py` under reports/ and every file under configs/, by content
    (`code_version`), plus the Python version; any edit to the model, the renderers, a preset
    or a scenario gives new keys;
  - the entry's kind and `repr` of all its inputs (frozen dataclasses and plain values: their
    repr holds every field; `key_of` refuses a repr that shows an object address, which would
    never match again).

An entry is the file `ppscope-<kind>-<key: 64 hex digits>.<json|png|uri>`: one header line
`ppscope-cache <format> <kind> <key> <sha256 of the payload>`, then the payload (JSON or PNG
bytes). A hit is an entry that is a regular file (opened without following a link and without
waiting on a FIFO; at most MAX_ENTRY_BYTES) whose header names this format, kind and key and
whose payload has that checksum, and that the caller's decode accepts (report.json read back
strictly; figures checked as PNGs: reports/render/png_data.py). Anything else is a miss: the
value is recomputed, and the entry rewritten only where it is a regular file or absent (a link,
a FIFO or a folder under an entry's name is left as it is). Entries are written atomically
(temp file + rename; a failed write removes its temp file), so two reports at once at worst
both compute.

Which folder is the cache's: one holding its marker file, `ppscope-cache.json`, which the cache
writes when it finds the folder absent or empty. A folder that holds other files and no marker
is not the cache's: nothing is read or written there, and the report says so on one line of
stderr (the cache is off for that run; point $PPSCOPE_CACHE to an empty or new folder). In its
own folder the cache deletes only its own files: regular files named exactly as an entry,
beyond the MAX_ENTRIES most recently used, and its temp files (`.<entry name>.<random>.tmp`)
older than STALE_TMP_S, left by a report that was killed mid-write.

Where: $PPSCOPE_CACHE (a folder; `off` turns the cache off), else $XDG_CACHE_HOME/ppscope/report,
else ~/.cache/ppscope/report. `ppscope report --no-cache` computes everything afresh and reads
and writes nothing here.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import sys
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import Callable, TypeVar

from reports.base.paths import CONFIGS

ENV = "PPSCOPE_CACHE"
FORMAT = 2                       # the entry layout (header line + payload)
MAX_ENTRIES = 256
MAX_ENTRY_BYTES = 64 << 20       # a model run is about 100 kB, a figure under 100 kB
STALE_TMP_S = 600                # a temp file this old is a write that died
MARKER = "ppscope-cache.json"
MARKER_NAME = "ppscope report cache"
EXTS = ("json", "png", "uri")
_KIND = re.compile(r"[a-z0-9_-]+")
_ENTRY = re.compile(r"ppscope-[a-z0-9_-]+-[0-9a-f]{64}\.(?:json|png|uri)")
_TMP = re.compile(r"\.ppscope-[a-z0-9_-]+-[0-9a-f]{64}\.(?:json|png|uri)\.[a-z0-9_]+\.tmp")
_PACKAGE = Path(__file__).resolve().parents[1]     # reports/
_warned: set[Path] = set()       # folders refused, said once per process
T = TypeVar("T")


def cache_dir() -> Path | None:
    """The cache folder, or None when $PPSCOPE_CACHE is `off` (or empty)."""
    v = os.environ.get(ENV)
    if v is not None:
        return None if v.strip().lower() in ("", "off", "0", "no") else Path(v)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ppscope" / "report"


@lru_cache(maxsize=1)
def code_version() -> str:
    """sha256 over the content of every reports/**/*.py and configs/** file (path and bytes)."""
    h = hashlib.sha256(sys.version.encode())
    for top, pattern in ((_PACKAGE, "*.py"), (CONFIGS, "*")):
        for p in sorted(q for q in top.rglob(pattern) if q.is_file()):
            h.update(p.relative_to(top.parent).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def key_of(kind: str, *inputs: object) -> str:
    """The entry's key (64 hex digits): sha256 of the code version, kind and every input's repr."""
    if not _KIND.fullmatch(kind):
        raise ValueError(f"{kind!r}: not a cache kind (lower-case letters, digits, - and _)")
    r = repr(inputs)
    if " at 0x" in r:   # an object without a value repr: its key would never match again
        raise ValueError(f"{kind}: an input has no value repr (cannot be a cache key)")
    h = hashlib.sha256(code_version().encode())
    h.update(kind.encode() + b"\0" + r.encode())
    return h.hexdigest()


def entry_name(kind: str, key: str, ext: str) -> str:
    return f"ppscope-{kind}-{key}.{ext}"


def cached(kind: str, inputs: tuple, compute: Callable[[], bytes], ext: str,
           decode: Callable[[bytes], T] = bytes, enabled: bool = True) -> T:
    """decode(compute()), from the cache when an entry of this kind and key holds a payload
    with its checksum that decodes. decode also checks what compute() gives, before it is
    stored: a value it refuses raises and is never cached."""
    assert ext in EXTS, ext
    d = cache_dir() if enabled else None
    try:
        key = None if d is None else key_of(kind, *inputs)
    except ValueError:     # inputs that cannot be a key: computed every time
        key = None
    if key is None or not _owned(d):
        return decode(compute())
    path = d / entry_name(kind, key, ext)
    payload = _payload(_read_entry(path, MAX_ENTRY_BYTES), kind, key)
    if payload is not None:
        try:
            out = decode(payload)
        except (ValueError, KeyError, TypeError):
            pass
        else:
            try:
                os.utime(path, follow_symlinks=False)   # least recently used goes first
            except OSError:
                pass
            return out
    payload = compute()
    out = decode(payload)
    _store(d, path, _header(kind, key, payload) + payload)
    return out


def _read_entry(path: Path, max_bytes: int) -> bytes | None:
    """The bytes of path when it is a regular file of at most max_bytes; None for anything else
    (absent, a link, a FIFO, a folder, a device, too big, unreadable). Never blocks."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
        return data if len(data) <= max_bytes else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _header(kind: str, key: str, payload: bytes) -> bytes:
    return f"ppscope-cache {FORMAT} {kind} {key} {hashlib.sha256(payload).hexdigest()}\n".encode()


def _payload(data: bytes | None, kind: str, key: str) -> bytes | None:
    """The payload of an entry whose header is this format's, kind's and key's, with the
    payload's own checksum; None otherwise."""
    if data is None:
        return None
    head, sep, payload = data.partition(b"\n")
    return payload if sep and head + sep == _header(kind, key, payload) else None


def _owned(d: Path) -> bool:
    """Whether d is the cache's folder: it holds the marker, or it was absent or empty and now
    holds it. A folder with other files is refused (once per process, one line on stderr)."""
    if _is_marker(d / MARKER):
        return True
    try:
        d.mkdir(parents=True, exist_ok=True)
        with os.scandir(d) as it:
            empty = next(it, None) is None
        if empty:
            fd = os.open(d / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "w") as f:
                json.dump({"cache": MARKER_NAME, "format": FORMAT,
                           "owns": "this folder's ppscope-*.json/png/uri entries"}, f)
            return True
        why = f"holds files that are not ppscope's cache (it has no {MARKER})"
    except FileExistsError:     # a file, not a folder; or a report beside this one marked it
        if _is_marker(d / MARKER):
            return True
        why = "is not a folder"
    except OSError:             # read-only or full: the cache is skipped, as a failed write is
        return False
    if d not in _warned:
        _warned.add(d)
        print(f"warning: cache off: {d} {why}; set {ENV} to an empty or new folder "
              "(or use --no-cache)", file=sys.stderr)
    return False


def _is_marker(path: Path) -> bool:
    try:
        return json.loads(_read_entry(path, 4096))["cache"] == MARKER_NAME
    except (TypeError, ValueError, KeyError):
        return False


def _store(d: Path, path: Path, data: bytes) -> None:
    """Write the entry atomically, over nothing or over the cache's own regular file, then evict.
    A cache that cannot be written (read-only, full disk) is skipped, leaving no temp file."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return               # a link, FIFO or folder under an entry's name is not ours
    except FileNotFoundError:
        pass
    except OSError:
        return
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=d)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        tmp = None
        _evict(d)
    except OSError:
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _evict(d: Path) -> None:
    """Keep the MAX_ENTRIES most recently used entries and sweep stale temp files: only regular
    files named exactly as the cache names its own are ever considered."""
    entries, now = [], time.time()
    with os.scandir(d) as it:
        for e in it:
            try:
                if not e.is_file(follow_symlinks=False):
                    continue
                if _ENTRY.fullmatch(e.name):
                    entries.append((e.stat(follow_symlinks=False).st_mtime, e.name))
                elif (_TMP.fullmatch(e.name)
                      and now - e.stat(follow_symlinks=False).st_mtime > STALE_TMP_S):
                    os.unlink(d / e.name)
            except OSError:
                continue
    entries.sort()
    for _, name in entries[:-MAX_ENTRIES]:
        try:
            os.unlink(d / name)
        except OSError:
            pass
