"""The record every probe writes and the report reads.

One probe run = one JSON file in `results/` (e.g. `results/topology.json`). The envelope is the
same for every probe: `schema_version`, `probe`, `status` (`ok` / `waived` / `error`), `reason`,
`provenance` (who/where/what versions) and `data` (the probe's own payload, built from its frozen
dataclasses). Units live in key names (`latency_us`, `bandwidth_gbps` with GB = 1e9 bytes).
JSON never holds NaN or inf: they become `null`.

This module never imports torch: provenance reads torch's versions only if the probe already
imported it (`sys.modules`), so `reports/` stays CPU-only.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import socket
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

SCHEMA_VERSION = 1
Status = Literal["ok", "waived", "error"]
STATUSES = ("ok", "waived", "error")

# Environment variables that change what a probe measures; recorded when set.
RELEVANT_ENV_PREFIXES = ("NCCL_", "CUDA_", "SGLANG_", "TORCH_", "PYTORCH_", "NVSHMEM_", "OMP_")


class RecordError(Exception):
    """A record file that cannot be used; the message is one line and names the file."""


@dataclass(frozen=True)
class Provenance:
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


def make_record(probe: str, data: Any, *, status: Status = "ok", reason: str | None = None,
                argv: list[str] | None = None, provenance: Provenance | None = None) -> Record:
    """Build a record; `data` may be a dataclass instance or a dict."""
    payload = to_jsonable(data)
    if not isinstance(payload, dict):
        raise TypeError("record data must be a dataclass or a dict")
    return Record(probe=probe, status=status, reason=reason, data=payload,
                  provenance=provenance or collect_provenance(argv))


def waived(probe: str, reason: str, data: Any = None, argv: list[str] | None = None) -> Record:
    return make_record(probe, data or {}, status="waived", reason=reason, argv=argv)


def to_jsonable(obj: Any) -> Any:
    """Dataclasses → dicts, tuples → lists, NaN/inf → None, recursively."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return to_jsonable(obj.item())
    if isinstance(obj, Path):
        return str(obj)
    return obj


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    """Write JSON via temp file + rename, so a crash or Ctrl-C never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(to_jsonable(obj), f, indent=1, allow_nan=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def write_record(record: Record, path: str | os.PathLike) -> Path:
    return write_json_atomic(path, record)


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


def read_record(path: str | os.PathLike) -> Record:
    """Read a record; raises RecordError with a one-line message naming the file."""
    path = Path(path)
    try:
        with open(path) as f:
            d = json.load(f)
    except FileNotFoundError:
        raise RecordError(f"{path}: no such record") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RecordError(f"{path}: corrupt record (invalid JSON: {e})") from None
    if not isinstance(d, dict):
        raise RecordError(f"{path}: corrupt record (top level is not an object)")
    return record_from_dict(d, str(path))
