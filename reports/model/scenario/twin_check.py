"""What the twin measured, for the report: each what-if setting's change on SGLang's own scheduler.

`ppscope twin` (microbench/sglang_lab/twin.py) writes `results/twin.json`: per server setting
(its SGLang flags) and concurrency, the twin's decode TPOT and tok/s, undilated. Here a what-if
row of the report (a knob and its value, or a pair of them) is matched to the twin's server whose
flags differ from the default server's by exactly that change, and the change the twin measured
(decode tok/s = C / TPOT, against the default at the same C) is set beside the model's.

A twin record of another deployment (scenario name or pipeline size) is not used, and the
report says so. A record that is not JSON or has not the twin's shape is a one-line CliError.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from reports.base.errors import CliError

TWIN_FILE = "twin.json"
MAX_BYTES = 16 << 20


@dataclass(frozen=True)
class TwinChange:
    """One setting's change at one concurrency: measured on the twin, predicted by the model."""
    concurrency: int
    twin: float            # relative change of decode tok/s on the twin
    model: float           # the model's relative change of tok/s, in the same run's record


@dataclass(frozen=True)
class TwinRecord:
    scenario: str
    pp: int
    k: float
    changes: dict          # frozenset of (flag, value) -> tuple[TwinChange, ...]
    source: str
    shipped: bool = False  # the scenario's own record in configs/records, not this user's run


def _pairs(flags) -> dict[str, str]:
    flags = [str(f) for f in flags]
    return {flags[i]: flags[i + 1] for i in range(0, len(flags) - 1, 2)}


def read_twin(results: Path) -> TwinRecord | None:
    """results/twin.json (`ppscope twin`), or None when there is none."""
    path = Path(results) / TWIN_FILE
    return _read(path, path.name) if path.is_file() else None


def shipped_twin(name: str, sc_file: str) -> TwinRecord:
    """The scenario's `twin_record`: a twin run of that deployment shipped in configs/records."""
    from reports.base.paths import CONFIGS
    path = CONFIGS / "records" / name
    if not path.is_file():
        raise CliError(f"{sc_file}: twin_record {name!r}: no such file in configs/records")
    return replace(_read(path, f"configs/records/{name}"), shipped=True)


def _read(path: Path, source: str) -> TwinRecord:
    try:
        if path.stat().st_size > MAX_BYTES:
            raise CliError(f"{path}: larger than {MAX_BYTES >> 20} MB; not a twin record")
        doc = json.loads(path.read_text(encoding="utf-8"))
        data = doc["data"]
        rows = data["rows"]
        default = {r["concurrency"]: r for r in rows if r["setting"] == "default"}
        base_flags = _pairs(next(iter(default.values()))["flags"]) if default else {}
        changes: dict = {}
        for r in rows:
            b = default.get(r["concurrency"])
            if r["setting"] == "default" or b is None:
                continue
            diff = frozenset((f, v) for f, v in _pairs(r["flags"]).items()
                             if base_flags.get(f) != v)
            ch = TwinChange(int(r["concurrency"]),
                            float(r["twin_decode_tok_per_s"]) / float(b["twin_decode_tok_per_s"]) - 1,
                            float(r["model_tok_per_s"]) / float(b["model_tok_per_s"]) - 1)
            changes[diff] = tuple(sorted(changes.get(diff, ()) + (ch,),
                                         key=lambda c: c.concurrency))
        return TwinRecord(str(data["scenario"]), int(data["pp"]),
                          float(data["calibration"]["k"]), changes, source)
    except CliError:
        raise
    except (OSError, ValueError, KeyError, TypeError, IndexError, ZeroDivisionError,
            StopIteration) as e:
        raise CliError(f"{path}: not a twin record ppscope wrote ({type(e).__name__})") from None


def change_of(knob: str, setting: str) -> frozenset:
    """A what-if row's change as (flag, value) pairs: "--a + --b", "1 + 2" for a pair."""
    return frozenset(zip((k.strip() for k in knob.split(" + ")),
                         (s.strip() for s in setting.split(" + "))))


def twin_text(rec: TwinRecord, knob: str, setting: str) -> str | None:
    """'on SGLang's scheduler (twin): +38% at C=8 (model +76%)', or None when not run."""
    got = rec.changes.get(change_of(knob, setting))
    if not got:
        return None
    parts = ", ".join(f"{c.twin:+.0%} at C={c.concurrency} (model {c.model:+.0%})" for c in got)
    where = ", shipped with ppscope" if rec.shipped else ""
    return f"on SGLang's scheduler (twin, k = {rec.k:g}{where}): {parts}"


def matches(rec: TwinRecord, name: str, pp: int) -> str | None:
    """None when the twin describes this deployment; else why it is not used."""
    if rec.pp != pp or rec.scenario != name:
        return (f"{rec.source} describes {rec.scenario} (PP{rec.pp}), the report {name} "
                f"(PP{pp}): not used")
    return None


def apply_twin(rep, rec: TwinRecord | None):
    """The report with each what-if the twin ran saying what it measured (`WhatIf.twin`), and a
    warning when the user's twin describes another deployment (a shipped record of another
    deployment is left out silently: it was never this user's). Rows the twin did not run keep
    None."""
    if rec is None:
        return rep
    why = matches(rec, rep.scenario, rep.deployment.pp)
    if why:
        return rep if rec.shipped else replace(rep, warnings=tuple(rep.warnings) + (why,))

    def one(w):
        return None if w is None else replace(w, twin=twin_text(rec, w.knob, w.setting))
    return replace(rep, what_ifs=tuple(one(w) for w in rep.what_ifs),
                   recommendation=one(rep.recommendation), best_pair=one(rep.best_pair))
