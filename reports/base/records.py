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

import dataclasses
import datetime as _dt
import errno
import json
import os
import platform
import socket
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

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
    """Write a file via temp file + rename (mode 0644 like a plain open()), so a crash or Ctrl-C
    never leaves half a file and a reader never sees one. Used for JSON, md, html and png."""
    path = Path(path)
    if path.is_dir():
        raise OSError(errno.EISDIR, "a directory, not a file to write (give a file path)",
                      str(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:   # named by the path given, never by the temp file
        raise _write_error(path, e) from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb" if isinstance(content, bytes) else "w") as f:
            f.write(content)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise _write_error(path, e) from None
        raise
    return path


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


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    """JSON (NaN/inf as null) written atomically."""
    return write_atomic(path, json.dumps(to_json(obj), indent=1, allow_nan=False) + "\n")


def beside(path: str | os.PathLike, status: str) -> Path:
    """Where a record of `status` goes when a good record holds `path`: `topology.waived.json`."""
    path = Path(path)
    return path.with_name(f"{path.stem}.{status}{path.suffix or '.json'}")


def is_plan(rec: Record) -> bool:
    """A probe's `--plan` record (its command line says so): nothing in it was measured."""
    return "--plan" in (rec.provenance.argv or ())


def save_record(record: Record, path: str | os.PathLike, *,
                plan: bool = False) -> tuple[Path, str | None]:
    """The one record writer, applying the status rule (module docstring; `plan`: `record`
    measured nothing): returns where the record went and, when it was written beside a good
    record, a one-line note saying so."""
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
    write_json_atomic(path, record)
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
