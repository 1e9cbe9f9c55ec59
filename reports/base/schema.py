"""Typed record payloads: frozen dataclasses that are the one definition of each record's shape.

A probe builds its payload as one of these (`reports/base/payloads/`), the record writer turns it
into JSON with `to_json`, and every reader gets it back with `from_json`, which checks each field's
type and range and fails with one line naming the field (`data.runs[2].tok_per_s: expected a
number >= 0, got 'abc'`); `read_record` adds the file name. No reader walks raw dicts.

What a field may hold comes from its annotation: `int`, `float` (an int is accepted), `str`,
`bool`, `None`, unions with `None`, `Literal[...]`, `tuple[X, ...]`, `dict[str, X]`, a nested
payload dataclass, or `Json` (free-form detail kept for display, never computed on). Ranges come
from `field(metadata=...)`, built with `ge(0)`, `gt(0)`, `between(0, 1)`. Unknown keys are an
error: the writer and the reader share the definition, so an unknown key means another version
(a reader of files another version may have written, such as report.json, passes `lax=True`:
unknown keys are skipped, at every depth).
NaN and inf are not numbers here; JSON `null` stands for "not measured".
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import field
from functools import lru_cache
from typing import Any, Literal, Union

Json = Any  # free-form JSON detail: kept and rendered, never used in a computation


class SchemaError(ValueError):
    """A payload that does not match its definition; the message names the field."""


def ge(lo: float, **kw) -> Any:
    """A field whose number (or each number of a tuple/dict) must be >= lo."""
    return field(metadata={"ge": lo}, **kw)


def gt(lo: float, **kw) -> Any:
    return field(metadata={"gt": lo}, **kw)


def between(lo: float, hi: float, **kw) -> Any:
    return field(metadata={"ge": lo, "le": hi}, **kw)


def if_set(sibling: str | None = None) -> Any:
    """A field (default None) that `to_json` leaves out while it is None, or, given `sibling`,
    while that field is None: a part a file has only when its evidence exists."""
    return field(default=None, metadata={"if_set": sibling or True})


def _written(obj: Any, f: dataclasses.Field) -> bool:
    m = f.metadata.get("if_set")
    return m is None or getattr(obj, f.name if m is True else m) is not None


@lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    # each field's annotation read in the module of the class that declares it (a base may
    # live in another module: report_type's ServerDiagnosis and diagnose's DiagnosisFigures)
    return typing.get_type_hints(cls)


def _describe(tp: Any) -> str:
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if tp is bool:
        return "true or false"
    if dataclasses.is_dataclass(tp):
        return "an object"
    origin = typing.get_origin(tp)
    if origin in (tuple, list):
        return "a list"
    if origin is dict:
        return "an object"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    return str(tp)


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _bounds(meta: dict) -> str:
    """The range a number must lie in, as the messages say it: " >= 0", " >= 0 and <= 1"."""
    parts = [f"{op} {meta[k]}" for k, op in (("ge", ">="), ("gt", ">"), ("le", "<="))
             if k in meta]
    return (" " + " and ".join(parts)) if parts else ""


def _check_range(v: float, meta: dict, path: str) -> None:
    if "ge" in meta and not v >= meta["ge"]:
        raise SchemaError(f"{path}: expected a number >= {meta['ge']}, got {_short(v)}")
    if "gt" in meta and not v > meta["gt"]:
        raise SchemaError(f"{path}: expected a number > {meta['gt']}, got {_short(v)}")
    if "le" in meta and not v <= meta["le"]:
        raise SchemaError(f"{path}: expected a number <= {meta['le']}, got {_short(v)}")


def _tag_fits(tp: Any, v: Any) -> bool:
    """False when a `Literal` field of payload `tp` (its tag, e.g. `status: Literal["ok"]`)
    rules the object `v` out: a union of tagged payloads is read as the one its tag names."""
    if not (dataclasses.is_dataclass(tp) and isinstance(v, dict)):
        return True
    return all(v[k] in typing.get_args(h) for k, h in _hints(tp).items()
               if typing.get_origin(h) is Literal and k in v)


def _load(tp: Any, v: Any, path: str, meta: dict, lax: bool = False) -> Any:
    if tp is Any:
        return v
    if tp is type(None):
        if v is not None:
            raise SchemaError(f"{path}: expected null, got {_short(v)}")
        return None
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if v is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        tagged = [a for a in rest if _tag_fits(a, v)]
        if len(rest) == 1 or len(tagged) == 1:  # one alternative: its own error names the field
            return _load((tagged or rest)[0], v, path, meta, lax)
        for a in rest:  # first alternative that fits
            try:
                return _load(a, v, path, meta, lax)
            except SchemaError:
                continue
        raise SchemaError(f"{path}: expected {' or '.join(_describe(a) for a in rest)}, "
                          f"got {_short(v)}")
    if tp is bool:
        if not isinstance(v, bool):
            raise SchemaError(f"{path}: expected true or false, got {_short(v)}")
        return v
    if tp is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise SchemaError(f"{path}: expected an integer{_bounds(meta)}, got {_short(v)}")
        _check_range(v, meta, path)
        return v
    if tp is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise SchemaError(f"{path}: expected a number{_bounds(meta)}, got {_short(v)}")
        _check_range(v, meta, path)
        return float(v)
    if tp is str:
        if not isinstance(v, str):
            raise SchemaError(f"{path}: expected a string, got {_short(v)}")
        return v
    if origin is Literal:
        if v not in typing.get_args(tp):
            raise SchemaError(f"{path}: expected {_describe(tp)}, got {_short(v)}")
        return v
    if origin in (tuple, list):
        if not isinstance(v, list):
            raise SchemaError(f"{path}: expected a list, got {_short(v)}")
        args = typing.get_args(tp)
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):  # fixed tuple
            if len(v) != len(args):
                raise SchemaError(f"{path}: expected {len(args)} items, got {len(v)}")
            return tuple(_load(a, x, f"{path}[{i}]", meta, lax) for i, (a, x) in
                         enumerate(zip(args, v)))
        item = args[0] if args else Any
        return tuple(_load(item, x, f"{path}[{i}]", meta, lax) for i, x in enumerate(v))
    if origin is dict:
        if not isinstance(v, dict):
            raise SchemaError(f"{path}: expected an object, got {_short(v)}")
        _, val = typing.get_args(tp) or (str, Any)
        return {str(k): _load(val, x, f"{path}.{k}", meta, lax) for k, x in v.items()}
    if dataclasses.is_dataclass(tp):
        return from_json(tp, v, path, lax=lax)
    raise TypeError(f"schema: unsupported annotation {tp!r} at {path}")


def from_json(cls: type, d: Any, path: str = "data", *, lax: bool = False) -> Any:
    """Build the payload dataclass `cls` from parsed JSON, checking every field; `lax`: skip
    keys `cls` does not define (a file another version wrote) instead of failing on them."""
    if not isinstance(d, dict):
        raise SchemaError(f"{path}: expected an object, got {_short(d)}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in d if k not in fields]
    if unknown and not lax:
        raise SchemaError(f"{path}.{unknown[0]}: unknown field (written by another ppscope "
                          "version?)")
    kw = {}
    for name, f in fields.items():
        if name not in d:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SchemaError(f"{path}.{name}: missing")
            continue
        kw[name] = _load(hints[name], d[name], f"{path}.{name}", dict(f.metadata), lax)
    return cls(**kw)


def to_json(obj: Any) -> Any:
    """Dataclasses -> dicts (an `if_set` field left out while unset), tuples -> lists, NaN/inf
    -> None, recursively (JSON-ready)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if _written(obj, f)}
    if isinstance(obj, dict):
        return {str(k): to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return to_json(obj.item())
    if hasattr(obj, "__fspath__"):
        return str(obj)
    return obj


def validate(obj: Any, path: str = "data") -> Any:
    """Round-trip a payload through JSON checks: the writer calls this so a probe can never
    write a record its own readers would reject."""
    return from_json(type(obj), to_json(obj), path)
