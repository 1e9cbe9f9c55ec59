"""One settings change: an SGLang flag and a value, the vocabulary both what-if sides share.

A change to the server is a flag under SGLang's own name (SGLang 0.5.23 server_args.py,
arg_groups/fields/) and a value, applied to `ServerSettings` (`apply`). The knobs that are not
server settings are listed apart (`OTHER_KNOBS`): the layer partition (an environment variable),
arrival pacing (the clients, not the server), the CUDA-graph capture size (SGLang's
`--cuda-graph-max-bs-decode`: a stage-cost input of the scenario model, not an admission
setting) and TP instead of PP (another deployment). The
scenario's what-ifs (reports/model/scenario/whatifs.py) and the observed server's
(reports/model/observed/whatifs.py) draw their candidates from `KNOBS` and hand them to the
simulator as `Change`s.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Sequence, Union

from reports.base.schema import if_set
from reports.base.server_flags import GRAPH_MAX_BS_FLAG, LOOP_FLAGS, flag_of
from reports.base.server_settings import ServerSettings

# The server flags a what-if changes, as the ServerSettings field each sets (one table of
# SGLang's names: reports/base/server_flags.py).
SERVER_FLAGS = {f.flag: f.setting for f in LOOP_FLAGS}
LAYER_PARTITION = "SGLANG_PP_LAYER_PARTITION"
GRAPH_MAX_BS = GRAPH_MAX_BS_FLAG.flag               # --cuda-graph-max-bs-decode
PACING = "arrival pacing"                    # the scenario's clients paced evenly over the slots
REQUEST_RATE = "--request-rate"              # the observed run's bench_serving pacing
TP_KNOB = "TP instead of PP (estimated)"
OTHER_KNOBS = (LAYER_PARTITION, GRAPH_MAX_BS, PACING, REQUEST_RATE, TP_KNOB)
# Every knob, in the tie-break order between settings of the same effect: the most direct
# flag first.
KNOBS = tuple(flag_of(f) for f in ("pp_max_micro_batch_size", "pp_async_batch_depth",
                                   "chunked_prefill_size", "max_running_requests")) + OTHER_KNOBS


def knob_rank(knob: str) -> int:
    return KNOBS.index(knob) if knob in KNOBS else len(KNOBS)


@dataclass(frozen=True)
class Change:
    """One knob set to one value (a flag of SERVER_FLAGS or one of OTHER_KNOBS)."""
    flag: str
    value: Union[int, float, str]

    @property
    def server(self) -> bool:
        return self.flag in SERVER_FLAGS


def check(change: Change) -> Change:
    if change.flag not in KNOBS:
        raise ValueError(f"unknown setting {change.flag!r}; one of {', '.join(KNOBS[:-1])}")
    return change


def apply(settings: ServerSettings, changes: Sequence[Change]) -> ServerSettings:
    """`settings` with each server flag of `changes` set (the other knobs are left to the
    simulator's adapter). A new `--max-running-requests` moves SGLang's default cap with it
    unless the cap was set (`ServerSettings.max_micro_batch`)."""
    out = settings
    for c in changes:
        if check(c).server:
            out = replace(out, **{SERVER_FLAGS[c.flag]: int(c.value)})
    return out


def value_of(changes: Sequence[Change], flag: str):
    """The value `changes` set `flag` to, None when they do not set it (the last one wins)."""
    vals = [c.value for c in changes if c.flag == flag]
    return vals[-1] if vals else None


@dataclass(frozen=True)
class Candidate:
    """A setting a what-if tries: its changes, the value as shown, and why it is tried. Both
    sides' candidate lists are lists of these."""
    changes: tuple[Change, ...]
    shown: str
    note: str

    @classmethod
    def one(cls, flag: str, value, note: str, shown: str | None = None) -> "Candidate":
        return cls((check(Change(flag, value)),), str(value) if shown is None else shown, note)

    @property
    def knob(self) -> str:
        return " + ".join(c.flag for c in self.changes)

    @property
    def value(self):
        return self.changes[0].value


@dataclass(frozen=True)
class Effect:
    concurrency: int
    baseline_tok_per_s: float
    predicted_tok_per_s: float
    gain: float


@dataclass(frozen=True)
class WhatIf:
    """One setting tried on one side: the scenario's (reports/model/scenario/whatifs.py: every measured
    concurrency in `effects`, the mixed load, the range where it holds) or the observed
    server's (reports/model/observed/whatifs.py: bench_serving's run at its concurrency, one
    effect, with the command to change and the slot sizes held longest before and after).
    `knob` and `setting` are the row as shown ("a + b" for two settings together); `changes`
    are what the model applied, the setting itself (empty for TP instead of PP, another
    deployment rather than a change of this one, and in a report written before they were
    kept)."""
    knob: str
    setting: str
    effects: tuple[Effect, ...]
    mixed: Effect | None
    gain: float                 # the objective: geometric-mean tok/s ratio - 1
    worst_gain: float           # the lowest gain at any measured concurrency
    eligible: bool              # loses <= MAX_LOSS everywhere and is a server setting
    note: str = ""
    # the concurrency range where it holds (`holds_range`): None until checked; `holds_up_to`
    # the largest C of RANGE_CS (up to the largest checked) with no loss over MAX_LOSS at or
    # below it, `loses_at` the first checked C beyond that, with its effect
    holds_up_to: int | None = None
    loses_at: Effect | None = None
    checked_up_to: int | None = None
    # what the twin measured for this setting on SGLang's own scheduler (reports/model/
    # twin_check.py), None where the twin never ran it
    twin: str | None = None
    # whether the twin supports the model's figure (twin_check's AGREES, DIFFERS, LOSES or
    # NO_BETTER), None where the twin never ran it
    twin_verdict: str | None = None
    side: Literal["scenario", "observed server"] = "scenario"
    command: str | None = if_set()
    sizes_before: tuple[int, ...] | None = if_set()
    sizes_after: tuple[int, ...] | None = if_set()
    changes: tuple[Change, ...] = ()

    @property
    def before_tok_per_s(self) -> float:
        return self.effects[0].baseline_tok_per_s

    @property
    def after_tok_per_s(self) -> float:
        return self.effects[0].predicted_tok_per_s

    @property
    def change_pct(self) -> float:
        """The change of tok/s in percent (one effect: the observed server's)."""
        return 100.0 * (self.after_tok_per_s / self.before_tok_per_s - 1.0)


def effect(C: int, base: float, pred: float) -> Effect:
    return Effect(C, base, pred, pred / base - 1 if base else 0.0)
