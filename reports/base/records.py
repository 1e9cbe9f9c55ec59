"""The record every probe writes and the report reads.

One probe run = one JSON file in `results/` (e.g. `results/topology.json`). The envelope is the
same for every probe: `schema_version` (the version of that probe's payload), `probe`, `status`,
`reason`, `provenance` (who/where/what versions) and `data`, the probe's payload: one frozen
dataclass per probe in `reports/base/payloads/`, checked field by field when it is written and
when it is read (`reports/base/schema.py`). Units live in field names (`latency_us`,
`bandwidth_gbps` with GB = 1e9 bytes). JSON never holds NaN or inf: they become `null`.

The status rule, the same for every probe:
- `ok`: the run finished and measured what it set out to;
- `partial`: interrupted or cut short; `reason` says what was kept and why (written as a sweep
  goes, so Ctrl-C keeps what was measured);
- `waived`: cannot run on this machine; `reason` says why; `data` may be empty;
- `error`: the run failed; `reason` says why.
`save_record` is the one writer. Only an `ok` record may replace an `ok` (or `partial`) record:
any other status is written beside it as `<name>.<status>.json` and the good record stays. A
plan (a probe's `--plan`: floors or rules only, nothing measured) replaces another plan but never
a measured good record: it goes beside it as `<name>.plan.json`.

This module never imports torch: provenance reads torch's versions only if the probe already
imported it (`sys.modules`), so `reports/` stays CPU-only.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import errno
import json
import os
import platform
import re
import socket
import stat
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, Sequence

from reports.base.paths import parse_input_json, read_input
from reports.base.schema import SchemaError, from_json, to_json, validate

SCHEMA_VERSION = 1  # envelope default; each payload class states its own (`SCHEMA_VERSION`)
Status = Literal["ok", "partial", "waived", "error"]
STATUSES = ("ok", "partial", "waived", "error")
GOOD = ("ok", "partial")

# Environment variables that change what a probe measures; recorded when set.
RELEVANT_ENV_PREFIXES = ("NCCL_", "CUDA_", "SGLANG_", "TORCH_", "PYTORCH_", "NVSHMEM_", "OMP_")


class RecordError(Exception):
    """A record file that cannot be used; the message is one line and names the file."""


class PayloadError(RecordError):
    """A readable record whose payload has fields its probe's schema does not have, or lacks
    some it needs (another probe's data, another ppscope's): a reader of results/ skips it
    with a warning."""


@dataclass(frozen=True)
class Provenance:
    """Who, where and with what versions a record was produced. `origin`: how the record came
    to be when the run of `argv` did not write it as it stands (a tool's earlier output converted
    to a record: from what, of which date); None when it did."""
    argv: tuple[str, ...]
    host: str
    utc: str
    gpus: tuple[str, ...] = ()
    driver: str | None = None
    torch: str | None = None
    cuda: str | None = None
    nccl: str | None = None
    python: str = field(default_factory=platform.python_version)
    env: dict[str, str] = field(default_factory=dict)
    origin: str | None = None


@dataclass(frozen=True)
class Record:
    probe: str
    status: Status
    data: dict[str, Any]
    provenance: Provenance
    reason: str | None = None
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")
        if self.status != "ok" and not self.reason:
            raise ValueError(f"a {self.status} record needs a reason")

    @property
    def payload(self) -> Any:
        """The typed payload (`reports/base/payloads/`) of an ok or partial record; None for a
        waived/error record or a probe with no payload class. Checked when the record was read."""
        cls = payload_class(self.probe)
        if cls is None or (self.status not in GOOD and not self.data):
            return None
        return _typed(cls, self)


def _nvml_gpus() -> tuple[tuple[str, ...], str | None]:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return (), None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver / no GPU: provenance simply has no GPUs
        return (), None
    try:
        n = pynvml.nvmlDeviceGetCount()
        names = []
        for i in range(n):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            names.append(name.decode() if isinstance(name, bytes) else name)
        drv = pynvml.nvmlSystemGetDriverVersion()
        return tuple(names), drv.decode() if isinstance(drv, bytes) else drv
    finally:
        pynvml.nvmlShutdown()


def collect_provenance(argv: list[str] | None = None) -> Provenance:
    """Where and with what a record was produced. Cheap; safe on a machine with no GPU."""
    gpus, driver = _nvml_gpus()
    torch_v = cuda_v = nccl_v = None
    torch = sys.modules.get("torch")  # never import it here: reports/ must stay torch-free
    if torch is not None:
        torch_v = str(torch.__version__)
        cuda_v = getattr(torch.version, "cuda", None)
        try:
            if torch.cuda.is_available():
                v = torch.cuda.nccl.version()
                nccl_v = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception:
            nccl_v = None
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(RELEVANT_ENV_PREFIXES)}
    return Provenance(
        argv=tuple(argv if argv is not None else sys.argv),
        host=socket.gethostname(),
        utc=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        gpus=gpus,
        driver=driver,
        torch=torch_v,
        cuda=cuda_v,
        nccl=nccl_v,
        env=env,
    )


def payload_class(probe: str) -> type | None:
    from reports.base.payloads import PAYLOADS  # the payload modules import this one
    return PAYLOADS.get(probe)


_TYPED: dict[int, Any] = {}


def _typed(cls: type, rec: Record) -> Any:
    key = id(rec)
    hit = _TYPED.get(key)
    if hit is None or hit[0] is not rec:
        hit = (rec, from_json(cls, rec.data))
        if len(_TYPED) > 64:
            _TYPED.clear()
        _TYPED[key] = hit
    return hit[1]


def make_record(probe: str, data: Any, *, status: Status = "ok", reason: str | None = None,
                argv: list[str] | None = None, provenance: Provenance | None = None) -> Record:
    """Build a record from the probe's payload dataclass (checked against its definition), or
    from a dict for a probe without one. A waived/error record may carry no data."""
    cls = payload_class(probe)
    if cls is not None and data is not None and not isinstance(data, dict):
        if not isinstance(data, cls):
            raise TypeError(f"{probe} record data must be a {cls.__name__}")
        validate(data)
    payload = to_jsonable(data if data is not None else {})
    if not isinstance(payload, dict):
        raise TypeError("record data must be a dataclass or a dict")
    if cls is not None and payload and (status in GOOD or isinstance(data, cls)):
        try:
            from_json(cls, payload)
        except SchemaError as e:
            raise ValueError(f"{probe} record: {e}") from None
    version = getattr(cls, "SCHEMA_VERSION", SCHEMA_VERSION)
    return Record(probe=probe, status=status, reason=reason, data=payload,
                  provenance=provenance or collect_provenance(argv), schema_version=version)


def waived(probe: str, reason: str, data: Any = None, argv: list[str] | None = None) -> Record:
    return make_record(probe, data, status="waived", reason=reason, argv=argv)


to_jsonable = to_json  # one conversion to JSON: reports.base.schema.to_json


def write_atomic(path: str | os.PathLike, content: str | bytes) -> Path:
    """Write one file as `write_files` does (temp file + rename), so a crash or Ctrl-C never
    leaves half a file and a reader never sees one. Used for JSON, md, html and png."""
    return write_files([(path, content)])[0]


# A temp file of ours (`.NAME.XXXXXXXX.tmp`, tempfile.mkstemp's 8 random characters) this much
# older than now was left by a run killed mid-write (SIGKILL, a power cut): a write takes seconds.
STALE_TMP_S = 600


def write_files(files: Sequence[tuple[str | os.PathLike, str | bytes]]) -> list[Path]:
    """Write several files as one result: each file's bytes go to a temp file beside its
    target first (`.NAME.XXXXXXXX.tmp`, mode 0644 like a plain open(), text as UTF-8), and only
    when every one is written are they renamed over their targets. A full disk, an error or
    Ctrl-C on the way leaves the old set whole: the temps are removed, nothing is replaced
    (the renames allocate no space). Stale temps of a killed run are swept on the way.

    What a target may be: a regular file or a new name; a symbolic link to a regular file (its
    target is written, the link kept); standard output or a FIFO, a terminal, /dev/null
    (written through, after the renames, with a note on stderr). A directory, a dangling link,
    a socket or any other device are refused: OSError naming the path given. Returns the
    paths given."""
    plan = [(Path(p), _output_target(Path(p)), content) for p, content in files]
    staged: list[tuple[str, Path]] = []
    try:
        for path, (kind, target), content in plan:
            if kind == "file":
                staged.append((_stage(target, content), target))
        for tmp, target in staged:
            try:
                os.replace(tmp, target)
            except OSError as e:
                raise _write_error(target, e) from None
    except BaseException:
        for tmp, _ in staged:
            try:
                os.unlink(tmp)   # the ones already renamed are gone: ENOENT
            except OSError:
                pass
        raise
    for path, (kind, target), content in plan:
        if kind != "file":
            _write_through(path, kind, target, content)
    return [p for p, _, _ in plan]


def _stage(target: Path, content: str | bytes) -> str:
    """`content` written to a new temp file beside `target`; returns its name."""
    _sweep_stale(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as e:   # named by the path given, never by the temp file
        raise _write_error(target, e) from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            # a lone surrogate (a file name that is not UTF-8) is written as \udcff, not refused
            f.write(content if isinstance(content, bytes)
                    else content.encode("utf-8", "backslashreplace"))
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise _write_error(target, e) from None
        raise
    return tmp


def _sweep_stale(target: Path) -> None:
    """Remove temps of `target` (our naming only) older than STALE_TMP_S."""
    rx = re.compile(rf"\.{re.escape(target.name)}\.[a-z0-9_]{{8}}\.tmp")
    try:
        names = os.listdir(target.parent)
    except OSError:
        return
    now = time.time()
    for n in names:
        if rx.fullmatch(n):
            p = os.path.join(target.parent, n)
            try:
                st = os.lstat(p)
                if stat.S_ISREG(st.st_mode) and now - st.st_mtime > STALE_TMP_S:
                    os.unlink(p)
            except OSError:
                pass


def _own_fd(path: Path) -> int | None:
    """The descriptor of this process that `path` names (/dev/stdout, /dev/fd/1,
    /proc/self/fd/1, through any links), else None."""
    p = str(path)
    own = re.compile(rf"/(?:proc/(?:self|{os.getpid()})|dev)/fd/(\d+)")
    for _ in range(40):
        m = own.fullmatch(p)
        if m:
            return int(m.group(1))
        if not os.path.islink(p):
            return None
        try:
            p = os.path.normpath(os.path.join(os.path.dirname(p), os.readlink(p)))
        except OSError:
            return None
    return None


# Character devices written through: /dev/null, /dev/full (major 1, minors 3 and 7), terminals
# (majors 4 and 5, the pseudo-terminals 136-143). Anything else (a disk, /dev/mem) is refused.
_MEM_DEVICES = {(1, 3), (1, 7)}
_TTY_MAJORS = {4, 5, *range(136, 144)}


def _output_target(path: Path) -> tuple[str, Any]:
    """How to write `path`: ("file", the regular file to replace), ("fd", this process's
    descriptor) or ("device", path); OSError (one line, naming `path`) when it cannot be."""
    fd = _own_fd(path)
    if fd is not None:
        return "fd", fd
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise OSError(errno.ENOENT, f"a symbolic link to {os.readlink(path)}, which does not "
                          "exist (give a file to write, or make the link point at one)",
                          str(path)) from None
        return "file", path   # a new file
    except OSError as e:
        raise _write_error(path, e) from None
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        raise OSError(errno.EISDIR, "a directory, not a file to write (give a file path)",
                      str(path))
    if stat.S_ISREG(mode):   # through a link: its target is replaced, the link stays
        return "file", Path(os.path.realpath(path)) if os.path.islink(path) else path
    dev = (os.major(st.st_rdev), os.minor(st.st_rdev))
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) and (dev in _MEM_DEVICES
                                                      or dev[0] in _TTY_MAJORS):
        return "device", path
    kind = ("a socket" if stat.S_ISSOCK(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a character device" if stat.S_ISCHR(mode) else "not a regular file")
    raise OSError(errno.EINVAL, f"{kind}; refused as an output (ppscope writes regular files, "
                  "or through to a FIFO, a terminal or /dev/null)", str(path))


def _write_through(path: Path, kind: str, target: Any, content: str | bytes) -> None:
    """`content` written straight into standard output, a FIFO, a terminal or /dev/null (not
    atomic: there is no file to rename over), with a note on stderr saying so."""
    data = content if isinstance(content, bytes) else content.encode("utf-8", "backslashreplace")
    if kind == "fd":
        for s in (sys.stdout, sys.stderr):   # what was printed before stays before
            try:
                s.flush()
            except (OSError, ValueError):
                pass
        fd = target
    else:
        try:   # O_NONBLOCK: a FIFO nobody reads is an error, not a wait forever
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError as e:
            if e.errno == errno.ENXIO:
                raise OSError(e.errno, "a FIFO nobody is reading", str(path)) from None
            raise _write_error(path, e) from None
        os.set_blocking(fd, True)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as e:
        raise _write_error(path, e) from None
    finally:
        if kind != "fd":
            os.close(fd)
    print(f"note: {path} is not a regular file: written through, not atomically",
          file=sys.stderr)


def _write_error(path: Path, e: OSError) -> OSError:
    """An OSError of writing `path` that names `path` (not a temp file) and says why in words."""
    parent = path.parent
    if e.errno == errno.ELOOP or (parent.is_symlink() and not parent.exists()):
        why = f"{parent} is a symbolic-link loop or points nowhere"
    elif isinstance(e, FileExistsError) or e.errno == errno.ENOTDIR:
        why = f"{parent} is not a directory"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        why = f"cannot write into {parent} ({e.strerror})"
    elif e.errno == errno.EISDIR:
        why = "a directory, not a file to write (give a file path)"
    else:
        why = f"cannot write ({e.strerror or type(e).__name__})"
    return OSError(e.errno, why, str(path))


def _umask() -> int:
    m = os.umask(0o22)
    os.umask(m)
    return m


def json_text(obj: Any) -> str:
    """The text ppscope writes for `obj` (NaN/inf as null)."""
    return json.dumps(to_json(obj), indent=1, allow_nan=False) + "\n"


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    """JSON (NaN/inf as null) written atomically."""
    return write_atomic(path, json_text(obj))


@contextlib.contextmanager
def record_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on `path`'s folder while a record there is read, merged and
    written again (a read-modify-write): a second run doing the same waits for the first, so
    neither loses the other's part. flock on the folder itself, so no lock file is left
    behind; where the file system cannot lock (some network mounts) it goes on unlocked."""
    import fcntl
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError as e:
        raise _write_error(path, e) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)   # releases the lock


def beside(path: str | os.PathLike, status: str) -> Path:
    """Where a record of `status` goes when a good record holds `path`: `topology.waived.json`."""
    path = Path(path)
    return path.with_name(f"{path.stem}.{status}{path.suffix or '.json'}")


def is_plan(rec: Record) -> bool:
    """A probe's `--plan` record (its command line says so): nothing in it was measured."""
    return "--plan" in (rec.provenance.argv or ())


def save_record(record: Record, path: str | os.PathLike, *, plan: bool = False,
                with_files: Sequence[tuple[str | os.PathLike, str | bytes]] = ()
                ) -> tuple[Path, str | None]:
    """The one record writer, applying the status rule (module docstring; `plan`: `record`
    measured nothing): returns where the record went and, when it was written beside a good
    record, a one-line note saying so. `with_files` (path, content): the run's other files (a
    heatmap), committed with the record in one `write_files` when it goes to `path`, and not
    written when it goes beside a good record (whose own files stay)."""
    path = Path(path)
    if (record.status != "ok" or plan) and path.exists():
        try:
            old = read_record(path)
        except RecordError:
            old = None  # a corrupt file holds nothing worth keeping
        if old is not None and old.status in GOOD and not (
                record.status == "partial" and old.status == "partial") and not (
                plan and is_plan(old)):
            what = "plan" if plan and record.status == "ok" else record.status
            dest = beside(path, what)
            write_json_atomic(dest, record)
            return dest, (f"kept the {old.status} record {path} ({old.provenance.utc}); this "
                          f"{what} run went to {dest}")
    write_files([(path, json_text(record)), *with_files])
    if record.status == "ok":
        for st in STATUSES[1:]:  # a finished run supersedes notes left beside an older one
            stale = beside(path, st)
            if stale.exists():
                stale.unlink()
    return path, None


def write_record(record: Record, path: str | os.PathLike) -> Path:
    """`save_record` without the note (for callers that report the path only)."""
    return save_record(record, path)[0]


def record_from_dict(d: dict[str, Any], source: str = "<dict>") -> Record:
    try:
        prov = dict(d["provenance"])
        prov["argv"] = tuple(prov.get("argv", ()))
        prov["gpus"] = tuple(prov.get("gpus", ()))
        known = {f.name for f in dataclasses.fields(Provenance)}
        return Record(
            probe=d["probe"], status=d["status"], reason=d.get("reason"), data=d["data"],
            provenance=Provenance(**{k: v for k, v in prov.items() if k in known}),
            schema_version=int(d["schema_version"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise RecordError(f"{source}: not a ppscope record ({type(e).__name__}: {e})") from None


def check_payload(rec: Record, source: str) -> Record:
    """Validate a record's payload against its class; one-line RecordError naming the field."""
    cls = payload_class(rec.probe)
    if cls is None or rec.schema_version != getattr(cls, "SCHEMA_VERSION", SCHEMA_VERSION):
        return rec  # another version: the reader skips it and says so
    if rec.status in GOOD or rec.data:
        try:
            _typed(cls, rec)
        except (SchemaError, RecursionError) as e:
            msg = f"{source}: {str(e).splitlines()[0][:200]}"
            # fields this schema does not have, or lacks: another probe's or version's data
            # (skipped by a reader of results/); a field of the wrong type: a corrupt record
            if "unknown field" in msg or msg.endswith(": missing"):
                raise PayloadError(msg) from None
            raise RecordError(msg) from None
    return rec


MAX_RECORD_BYTES = 512 * 2**20  # records are a few MB; this bounds what a wrong path can cost


def read_record(path: str | os.PathLike) -> Record:
    """Read a record; raises RecordError with a one-line message naming the file."""
    path = Path(path)
    if not os.path.lexists(path):
        raise RecordError(f"{path}: no such record")
    raw = read_input(path, "ppscope record", MAX_RECORD_BYTES, RecordError)
    d = parse_input_json(raw, path, "ppscope record", RecordError)
    if not isinstance(d, dict):
        raise RecordError(f"{path}: corrupt record (top level is not an object)")
    return check_payload(record_from_dict(d, str(path)), str(path))
