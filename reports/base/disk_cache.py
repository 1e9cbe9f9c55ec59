"""An on-disk cache of what `ppscope report` computes from its inputs: the model's runs and the
figures drawn from them, so that a second report of the same inputs takes well under a second.

What is cached: a value computed by a pure function of its inputs (the pipeline model's runs:
reports/report_run.py; a PNG drawn from report numbers: reports/render/render_html.py).

The key (why a stale entry can never change a number): sha256 of
  - the code version: every `*.py` under reports/ and every file under configs/, by content
    (`code_version`), plus the Python version; any edit to the model, the renderers, a preset
    or a scenario gives new keys;
  - the entry's kind and `repr` of all its inputs (frozen dataclasses and plain values: their
    repr holds every field; `key_of` refuses a repr that shows an object address, which would
    never match again).
A hit is read back as written (JSON or PNG bytes); an unreadable entry is recomputed and
rewritten, never trusted. Entries are written atomically (temp file + rename), so two reports
at once at worst both compute.

Where: $PPSCOPE_CACHE (a folder; `off` turns the cache off), else $XDG_CACHE_HOME/ppscope, else
~/.cache/ppscope. At most MAX_ENTRIES files are kept (the least recently used go first).
`ppscope report --no-cache` computes everything afresh and writes nothing here.
"""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Callable, TypeVar

from reports.base.paths import CONFIGS

ENV = "PPSCOPE_CACHE"
MAX_ENTRIES = 256
_PACKAGE = Path(__file__).resolve().parents[1]     # reports/
T = TypeVar("T")


def cache_dir() -> Path | None:
    """The cache folder, or None when $PPSCOPE_CACHE is `off` (or empty)."""
    v = os.environ.get(ENV)
    if v is not None:
        return None if v.strip().lower() in ("", "off", "0", "no") else Path(v)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ppscope"


@lru_cache(maxsize=1)
def code_version() -> str:
    """sha256 over the content of every reports/**/*.py and configs/** file (path and bytes)."""
    h = hashlib.sha256(sys.version.encode())
    for top, pattern in ((_PACKAGE, "*.py"), (CONFIGS, "*")):
        for p in sorted(q for q in top.rglob(pattern) if q.is_file()):
            h.update(p.relative_to(top.parent).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def key_of(kind: str, *inputs: object) -> str:
    """The entry's key: code version, kind and the repr of every input."""
    r = repr(inputs)
    if " at 0x" in r:   # an object without a value repr: its key would never match again
        raise ValueError(f"{kind}: an input has no value repr (cannot be a cache key)")
    h = hashlib.sha256(code_version().encode())
    h.update(kind.encode() + b"\0" + r.encode())
    return f"{kind}-{h.hexdigest()[:40]}"


def cached(kind: str, inputs: tuple, compute: Callable[[], bytes], ext: str,
           decode: Callable[[bytes], T] = bytes, enabled: bool = True) -> T:
    """decode(compute()), from the cache when an entry of the same key exists and decodes
    (an entry that does not decode is recomputed and replaced)."""
    d = cache_dir() if enabled else None
    try:
        path = None if d is None else d / f"{key_of(kind, *inputs)}.{ext}"
    except ValueError:     # inputs that cannot be a key: computed every time
        path = None
    if path is None:
        return decode(compute())
    try:
        out = decode(path.read_bytes())
        os.utime(path)                # least recently used goes first
        return out
    except (OSError, ValueError, KeyError, TypeError):
        pass
    data = compute()
    _store(d, path, data)
    return decode(data)


def _store(d: Path, path: Path, data: bytes) -> None:
    """Atomic write; a cache that cannot be written (read-only home, full disk) is skipped."""
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=d)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        entries = sorted(d.glob("*-*.*"), key=lambda p: p.stat().st_mtime)
        for old in entries[:-MAX_ENTRIES]:
            old.unlink(missing_ok=True)
    except OSError:
        pass
