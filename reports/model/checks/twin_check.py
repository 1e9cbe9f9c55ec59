"""What the twin measured, for the report: each what-if setting's change on SGLang's own scheduler.

`ppscope twin` (microbench/sglang_lab/twin/run.py) writes `results/twin.json` (its data:
reports/base/payloads/twin.py `TwinData`): per server setting
(its SGLang flags) and concurrency, the twin's decode TPOT and tok/s, undilated. Here a what-if
row of the report (a knob and its value, or a pair of them) is matched to the twin's server whose
flags differ from the default server's by exactly that change, and the change the twin measured
(decode tok/s = C / TPOT, against the default at the same C) is set beside the model's. The
twin's TPOT is its steady decode where the record has one (microbench/sglang_lab/twin/steady.py:
one round of the loop with every request decoding, read from SGLang's log), the quantity the
model's steady loop predicts; records without it use bench_serving's median TPOT, whose short
runs include the later prompts' prefills.

A twin record of another deployment (scenario name or pipeline size) is not used, and the
report says so. Every figure is checked on read: k a dilation the twin uses (`K_RANGE`, as
`ppscope twin --k` takes), every TPOT and tok/s a finite positive number, every change between
two settings within `MAX_RATIO` either way, each concurrency one the model runs; a record that
breaks one, is not JSON or has not the twin's shape is a one-line CliError naming the file and
the field. A record of a run that stopped early (`ppscope twin` keeps one as `twin.partial.json`:
status `partial`, `complete: false`) is used for the runs it finished, and the report says so
beside each figure and in a warning; a failed one (any other status) is not used, and the
report says so.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from reports.base.errors import CliError
from reports.base.payloads.twin import TwinData, TwinRow
from reports.base.schema import SchemaError, from_json
from reports.model.scenario.file import MAX_CONCURRENCY, MAX_PP

TWIN_FILE = "twin.json"
MAX_BYTES = 16 << 20
# the dilations `ppscope twin` runs at: its --k and --max-k (microbench/sglang_lab/twin/cli.py),
# and a calibrated k is at least 1 (microbench/sglang_lab/twin/run.py `calibrated_k`)
K_RANGE = (1.0, 1000.0)
# a server setting changes decode tok/s by less than this factor either way (-99% to +9900%);
# beyond it a figure is not one a run gives, and is refused before it is printed
MAX_RATIO = 100.0
MAX_FIGURE = 1e9           # TPOT in ms, tok/s: a bound far above any run, below overflow
# TwinRecord.state: every run done; stopped early (its finished runs used, said); failed (not
# used, said)
COMPLETE, PARTIAL, FAILED = "complete", "partial", "failed"
# the model's change agrees with the twin's when within 25% of it, or within 5 points of it
# where both are that small (the twin's runs spread by several percent)
TOLERANCE = 0.25
FLOOR = 0.05
LOSS = 0.02                # a loss beyond this on the twin withdraws a setting (as MAX_LOSS)
# WhatIf.twin_verdict: the model's figure held on the twin at every C it ran; it did not (the
# twin's figure is the one to expect); the twin lost over LOSS at some C (not recommended);
# a pair that gained no more on the twin than the single setting it extends
AGREES, DIFFERS, LOSES, NO_BETTER = "agrees", "differs", "loses", "no better than one setting"
# TwinChange.basis
STEADY, BENCH = "steady", "bench"


@dataclass(frozen=True)
class TwinChange:
    """One setting's change at one concurrency: measured on the twin, predicted by the model.
    With repetitions, each is set against the default's run of the same repetition; `twin` is
    their median, `lo` and `hi` the range."""
    concurrency: int
    twin: float            # relative change of decode tok/s on the twin (median over runs)
    model: float           # the model's relative change of tok/s, in the same run's record
    lo: float = 0.0
    hi: float = 0.0
    runs: int = 1
    basis: str = "bench"   # STEADY: from the twin's steady decode; BENCH: bench_serving's TPOT


@dataclass(frozen=True)
class TwinRecord:
    scenario: str
    pp: int
    k: float
    changes: dict          # frozenset of (flag, value) -> tuple[TwinChange, ...]
    source: str
    shipped: bool = False  # the scenario's own record in configs/records, not this user's run
    stream_order: bool = True   # made with the hold that orders PP messages on SGLang's stream
    state: str = COMPLETE       # COMPLETE, PARTIAL (the runs it finished) or FAILED (not used)
    reason: str = ""            # a failed record's own reason, if it gives one


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


def _state(doc: dict, data: dict) -> str:
    """COMPLETE, PARTIAL or FAILED, from the record's status and `complete` flag (records
    without a status are the twin's own data, complete unless they say otherwise)."""
    status = doc.get("status", "ok")
    if status == "partial" or (status == "ok" and data.get("complete") is False):
        return PARTIAL
    return COMPLETE if status == "ok" else FAILED


def _bad(path: Path, field: str, value, want: str) -> CliError:
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return CliError(f"{path}: {field} = {shown}, not {want}: not a twin record ppscope wrote")


def _number(path: Path, field: str, value, lo: float, hi: float, want: str) -> float:
    """`value` as a float in [lo, hi] (finite, not a bool), else a one-line CliError."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or not lo <= value <= hi):
        raise _bad(path, field, value, want)
    return float(value)


def _figure(path: Path, field: str, value) -> float:
    """A TPOT (ms) or a tok/s: finite, positive, below MAX_FIGURE."""
    return _number(path, field, value, 1e-9, MAX_FIGURE, f"a positive number below {MAX_FIGURE:g}")


def _integer(path: Path, field: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _bad(path, field, value, f"an integer from {lo} to {hi}")
    return value


def _check_rows(path: Path, rows) -> None:
    """Every row's concurrency, repetition and figures checked before any is used: a TPOT
    (`*_ms`) or tok/s that is there is finite and positive (None: not measured); the two the
    change is taken from are there."""
    if not isinstance(rows, list):
        raise _bad(path, "rows", rows, "a list of runs")
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise _bad(path, f"rows[{i}]", r, "a run (an object)")
        _integer(path, f"rows[{i}].concurrency", r.get("concurrency"), 1, MAX_CONCURRENCY)
        _integer(path, f"rows[{i}].rep", r.get("rep", 1), 1, 1000)
        if not isinstance(r.get("setting"), str):
            raise _bad(path, f"rows[{i}].setting", r.get("setting"), "a setting's name")
        for key in ("twin_decode_tok_per_s", "model_tok_per_s"):
            _figure(path, f"rows[{i}].{key}", r.get(key))
        for key, v in r.items():
            if v is not None and (key.endswith("_ms") or key.endswith("_tok_per_s")):
                _figure(path, f"rows[{i}].{key}", v)


def _change(path: Path, ratio: float, what: str, C: int) -> float:
    """A ratio of two settings' decode tok/s as a relative change, within `MAX_RATIO`."""
    if not 1 / MAX_RATIO <= ratio <= MAX_RATIO:
        raise CliError(f"{path}: {what} changes decode tok/s {ratio:.3g}x at C={C}, beyond "
                       f"{1 / MAX_RATIO:g}x to {MAX_RATIO:g}x: not a twin record ppscope wrote")
    return ratio - 1


def _read(path: Path, source: str) -> TwinRecord:
    try:
        if path.stat().st_size > MAX_BYTES:
            raise CliError(f"{path}: larger than {MAX_BYTES >> 20} MB; not a twin record")
        doc = json.loads(path.read_text(encoding="utf-8"))
        data = doc["data"]
        if doc.get("probe", "twin") != "twin":
            raise CliError(f"{path}: a {str(doc['probe'])[:40]!r} record, not a twin record")
        state = _state(doc, data)
        scenario = str(data["scenario"])
        pp = _integer(path, "pp", data["pp"], 1, MAX_PP)
        if state == FAILED:      # not used: its figures are neither read nor checked
            return TwinRecord(scenario, pp, 0.0, {}, source, state=FAILED,
                              reason=f"status {str(doc.get('status'))[:20]}"
                                     + (f": {str(doc['reason'])[:120]}" if doc.get("reason")
                                        else ""))
        k = _number(path, "calibration.k", data["calibration"]["k"], *K_RANGE,
                    f"a dilation from {K_RANGE[0]:g} to {K_RANGE[1]:g} (ppscope twin --k)")
        _check_rows(path, data["rows"])
        typed = _typed(path, data)
        runs: dict = {}          # (change, C) -> [(setting's row, default's row), ...]
        for r, b in typed.with_default():
            base_flags = _pairs(b.flags)
            diff = frozenset((f, v) for f, v in _pairs(r.flags).items()
                             if base_flags.get(f) != v)
            runs.setdefault((diff, r.concurrency), []).append((r, b))
        changes: dict = {}
        for (diff, C), got in sorted(runs.items(), key=lambda kv: kv[0][1]):
            basis, twin = twin_changes(got)
            what = " + ".join(f"{f} {v}" for f, v in sorted(diff)) or "the default again"
            twin = [_change(path, 1 + x, f"the twin's {what}", C) for x in twin]
            r0, b0 = got[0]
            model = _change(path, r0.model_tok_per_s / b0.model_tok_per_s,
                            f"the model's {what}", C)
            changes[diff] = changes.get(diff, ()) + (TwinChange(
                C, statistics.median(twin), model, min(twin), max(twin), len(twin), basis),)
        return TwinRecord(scenario, pp, k, changes, source,
                          stream_order=_stream_order(typed), state=state)
    except CliError:
        raise
    except (OSError, ValueError, KeyError, TypeError, IndexError, ZeroDivisionError,
            AttributeError) as e:
        raise CliError(f"{path}: not a twin record ppscope wrote ({type(e).__name__})") from None


def _typed(path: Path, data: dict) -> TwinData:
    """The record's data as its payload (reports/base/payloads/twin.py), every field checked
    (its figures were checked above, in the words the report uses)."""
    try:
        return from_json(TwinData, data, "data")
    except SchemaError as e:
        raise CliError(f"{path}: {e}: not a twin record ppscope wrote") from None


def twin_changes(pairs: list[tuple[TwinRow, TwinRow]]) -> tuple[str, list[float]]:
    """The change of decode tok/s each setting's run measured against the default's run of its
    repetition, on one basis for all: STEADY (the twin's steady decode, SGLang's log: every
    request decoding, the quantity the model's figure is) where every run of both has one, else
    BENCH (bench_serving's median TPOT, the later prompts' prefills included)."""
    if all(r.twin_steady_tpot_ms and b.twin_steady_tpot_ms for r, b in pairs):
        return STEADY, [b.twin_steady_tpot_ms / r.twin_steady_tpot_ms - 1 for r, b in pairs]
    return BENCH, [r.twin_decode_tok_per_s / b.twin_decode_tok_per_s - 1 for r, b in pairs]


def _stream_order(data: TwinData) -> bool:
    """Whether the twin's hold ordered the PP sends and receives on SGLang's schedule stream
    (`hold: "stream"` in the record; records of the first such ppscope say so only in their
    `emulated` text). The hold before it let a relay leave before the relaying forward ended
    and ran chunk 2048 at C = 8 about 10% fast."""
    return data.hold == "stream" or data.mode == "sync" or "schedule stream" in (data.emulated or "")


def change_of(knob: str, setting: str) -> frozenset:
    """A row's change as (flag, value) pairs from its shown strings ("--a + --b", "1 + 2"):
    a what-if of a report written before what-ifs kept their changes."""
    return frozenset(zip((k.strip() for k in knob.split(" + ")),
                         (s.strip() for s in setting.split(" + "))))


def key_of(w) -> frozenset:
    """A what-if's change as the twin's record keys it: (flag, value) pairs, from the changes
    the model applied (`WhatIf.changes`), else from the row's shown strings."""
    changes = getattr(w, "changes", None)
    if changes:
        return frozenset((c.flag, str(c.value)) for c in changes)
    return change_of(w.knob, w.setting)


def twin_text(rec: TwinRecord, w) -> str | None:
    """'on SGLang's scheduler (twin): +38% at C=8 (model +76%)', or None when not run."""
    got = rec.changes.get(key_of(w))
    if not got:
        return None
    parts = ", ".join(f"{c.twin:+.0%} at C={c.concurrency} ({_spread(c)}model {c.model:+.0%})"
                      for c in got)
    where = (", shipped with ppscope" if rec.shipped else "") + (
        ", a run stopped early" if rec.state == PARTIAL else "")
    basis = ("steady decode" if all(c.basis == STEADY for c in got) else
             "bench_serving's TPOT" if all(c.basis == BENCH for c in got) else
             "steady decode where its log had one")
    return f"on SGLang's scheduler (twin, k = {rec.k:g}{where}; {basis}): {parts}"


def agrees(c: TwinChange) -> bool:
    """The model's change within TOLERANCE of the twin's (or FLOOR, for small changes)."""
    return abs(c.model - c.twin) <= max(TOLERANCE * abs(c.twin), FLOOR)


def verdict(rec: TwinRecord, w) -> str | None:
    """AGREES, DIFFERS or LOSES for a what-if the twin ran; None when it did not run it."""
    got = rec.changes.get(key_of(w))
    if not got:
        return None
    if any(c.twin < -LOSS for c in got):
        return LOSES
    return AGREES if all(agrees(c) for c in got) else DIFFERS


def no_better(rec: TwinRecord, pair, single) -> bool:
    """The pair gained no more than the single setting on the twin at every C both ran (by the
    twin's own spread: the pair's median within the single's range, or below it)."""
    p = {c.concurrency: c for c in rec.changes.get(key_of(pair), ())}
    s = {c.concurrency: c for c in rec.changes.get(key_of(single), ())}
    both = sorted(set(p) & set(s))
    return bool(both) and all(p[C].twin <= s[C].hi for C in both)


def verdict_clause(w, single=None) -> str:
    """What the twin's verdict means for acting on `w` (a clause, '' when it agrees or never
    ran); `single`: the setting a pair extends."""
    v = w.twin_verdict
    if v == DIFFERS:
        return "; the model's figure is not what SGLang's scheduler gave: expect the twin's"
    if v == LOSES:
        return "; it lost on SGLang's scheduler: not recommended"
    if v == NO_BETTER:
        alone = f"{single.knob} {single.setting} alone" if single else "the single setting"
        return f"; on SGLang's scheduler it gained no more than {alone}: not recommended"
    return ""


def _spread(c: TwinChange) -> str:
    """'median of 3 runs, +45% to +58%; ' with repetitions, else ''."""
    return (f"median of {c.runs} runs, {c.lo:+.0%} to {c.hi:+.0%}; " if c.runs > 1 else "")


def matches(rec: TwinRecord, name: str, pp: int) -> str | None:
    """None when the twin describes this deployment; else why it is not used."""
    if rec.pp != pp or rec.scenario != name:
        return (f"{rec.source} describes {rec.scenario} (PP{rec.pp}), the report {name} "
                f"(PP{pp}): not used")
    return None


def apply_twin(rep, rec: TwinRecord | None):
    """The report with each what-if the twin ran saying what it measured (`WhatIf.twin`) and
    whether that supports the model's figure (`WhatIf.twin_verdict`: the best pair NO_BETTER
    when the twin gave it no more than the single setting), and a
    warning when the user's twin describes another deployment (a shipped record of another
    deployment is left out silently: it was never this user's), stopped early (its finished
    runs used) or failed (not used). Rows the twin did not run keep None."""
    if rec is None:
        return rep
    if rec.state == FAILED:
        return replace(rep, warnings=tuple(rep.warnings) + (
            f"{rec.source} is a failed twin run ({rec.reason}): not used; run `ppscope twin` "
            "again",))
    why = matches(rec, rep.scenario, rep.deployment.pp)
    if why:
        return rep if rec.shipped else replace(rep, warnings=tuple(rep.warnings) + (why,))
    if not rec.stream_order and not rec.shipped:
        rep = replace(rep, warnings=tuple(rep.warnings) + (
            f"{rec.source} was recorded by an earlier ppscope twin, whose hold did not order "
            "the PP messages on SGLang's schedule stream (it ran chunk 2048 at C=8 about 10% "
            "fast): run `ppscope twin` again",))
    if rec.state == PARTIAL:
        rep = replace(rep, warnings=tuple(rep.warnings) + (
            f"{rec.source} is the record of a twin run that stopped early: the runs it finished "
            "are used (each such figure says so), the settings and concurrencies it did not "
            "reach were not checked on SGLang's scheduler",))

    def one(w):
        return None if w is None else replace(w, twin=twin_text(rec, w),
                                              twin_verdict=verdict(rec, w))
    pair, single = one(rep.best_pair), one(rep.recommendation)
    if (pair is not None and single is not None and pair.twin_verdict != LOSES
            and no_better(rec, pair, single)):
        pair = replace(pair, twin_verdict=NO_BETTER)
    return replace(rep, what_ifs=tuple(one(w) for w in rep.what_ifs),
                   recommendation=single, best_pair=pair)
