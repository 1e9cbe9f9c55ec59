"""Where ppscope finds its shipped configs and writes its results; how it opens the user's
files (regular files only, bounded, every error one line naming the path given)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS = REPO_ROOT / "configs"


def results_dir() -> Path:
    """`results/` in the current directory unless PPSCOPE_RESULTS says otherwise."""
    return Path(os.environ.get("PPSCOPE_RESULTS", "results"))


def default_record_path(probe: str) -> Path:
    return results_dir() / f"{probe}.json"


def json_path(given: str | os.PathLike | None, default: str | os.PathLike) -> Path:
    """Where `--json` writes: the path given, `default` when none; a folder (a path ending in
    '/', or a directory already there) holds the record under the default's name, so
    `--json out/` writes out/sglang.json, never a file named `out`. Every sub-command that
    takes --json reads it here."""
    if given is None or os.fspath(given) == "":
        return Path(default)
    s = os.fspath(given)
    if s.endswith(("/", os.sep)) or os.path.isdir(s):
        return Path(s) / Path(default).name
    return Path(s)


def folder_error(path: str | os.PathLike, what: str) -> str | None:
    """Why `path` given as `what` (a folder) cannot be read as one, in one line; None where it
    is a folder or is not there at all (the caller says what a missing folder means)."""
    import errno
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return f"{what} {path}: a symbolic-link loop, not a folder"
        if e.errno == errno.ENOENT and os.path.islink(path):
            return f"{what} {path}: a symbolic link to {os.readlink(path)}, which is not there"
        if e.errno != errno.ENOENT:
            return f"{what} {path}: cannot be read ({e.strerror or type(e).__name__})"
        return None
    return None if os.path.isdir(path) else f"{what} {path}: not a directory"


# ---- the user's input files -------------------------------------------------------------------
# Every file a user names (a log, a trace, a bench output, a `topo -m` paste, a scenario, a model
# config, a record in results/) is opened here: regular files only (a FIFO would block forever,
# /dev/zero never ends, a directory is not a file), a size cap per kind, JSON nested no deeper
# than MAX_JSON_DEPTH, and every error one line naming the path as the user gave it.

MAX_JSON_DEPTH = 64   # a record nests ~8 deep, a Kineto event's args ~3; 1000+ hits recursion


def _input_error(path: str | os.PathLike, what: str, e: OSError) -> str:
    import errno
    why = {errno.ELOOP: "a symbolic-link loop", errno.ENOENT: "no such file",
           errno.EACCES: "permission denied", errno.EISDIR: "a directory, not a file",
           errno.ENOTDIR: "a path through something that is not a directory"}.get(
        e.errno, e.strerror or type(e).__name__)
    return f"{path}: cannot read {what} ({why})"


def open_input(path: str | os.PathLike, what: str, error: type[Exception] | None = None):
    """The user's file `path` opened for binary reading; raises `error` (default CliError) with
    one line naming `path` and `what` it should be when it is not a readable regular file."""
    import stat
    from reports.base.errors import CliError
    err = error or CliError
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; the fstat below refuses it
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise err(_input_error(path, what, e)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)"
                    if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
                    else "a block device" if stat.S_ISBLK(mode) else "a socket"
                    if stat.S_ISSOCK(mode) else "not a regular file")
            raise err(f"{path}: {kind}, not a {what} file (give a saved file)")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(path: str | os.PathLike, what: str, max_bytes: int,
               error: type[Exception] | None = None) -> bytes:
    """The bytes of the user's regular file `path`, refused (one line) above `max_bytes`."""
    from reports.base.errors import CliError
    err = error or CliError
    with open_input(path, what, err) as f:
        try:
            raw = f.read(max_bytes + 1)
        except OSError as e:
            raise err(_input_error(path, what, e)) from None
    if len(raw) > max_bytes:
        raise err(f"{path}: larger than {_size(max_bytes)}; not a {what} (is it the right file?)")
    return raw


def _size(n: int) -> str:
    return f"{n >> 20} MB" if n >= 1 << 20 else f"{n >> 10} kB"


def parse_input_json(raw: bytes | str, path: str | os.PathLike, what: str,
                     error: type[Exception] | None = None,
                     max_depth: int = MAX_JSON_DEPTH) -> Any:
    """JSON text of the user's file -> the object; one-line `error` for text that is not JSON,
    not UTF-8, holds NaN / Infinity (JSON has neither) or nests deeper than `max_depth`."""
    import json
    from reports.base.errors import CliError
    err = error or CliError

    def no_constant(c: str):
        raise ValueError(f"{c} is not a JSON number")
    try:
        obj = json.loads(raw, parse_constant=no_constant)
    except RecursionError:
        raise err(f"{path}: {what} nested too deeply (limit {max_depth} levels)") from None
    except UnicodeDecodeError:
        raise err(f"{path}: {what} is not UTF-8 text") from None
    except ValueError as e:   # JSONDecodeError and NaN / Infinity
        raise err(f"{path}: not valid JSON for a {what} (invalid JSON: "
                  f"{str(e).splitlines()[0][:120]})") from None
    if json_depth(obj) > max_depth:
        raise err(f"{path}: {what} nested too deeply (limit {max_depth} levels)")
    return obj


def json_depth(obj: Any) -> int:
    """How deep lists and objects nest in `obj` (a scalar: 0), without recursion."""
    deepest, todo = 0, [(obj, 1)]
    while todo:
        o, d = todo.pop()
        kids = o.values() if isinstance(o, dict) else o if isinstance(o, list) else None
        if kids is None:
            continue
        deepest = max(deepest, d)
        todo.extend((k, d + 1) for k in kids if isinstance(k, (dict, list)))
    return deepest


def read_input_json(path: str | os.PathLike, what: str, max_bytes: int = 64 << 20,
                    error: type[Exception] | None = None) -> Any:
    """The user's JSON file, read through `read_input` and `parse_input_json`."""
    return parse_input_json(read_input(path, what, max_bytes, error), path, what, error)
