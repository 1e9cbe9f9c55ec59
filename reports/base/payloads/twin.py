"""The twin's files (`ppscope twin`, microbench/sglang_lab/twin/): its cost file and its record.

The cost file (`twin-costs.json`, `TwinCosts`) is what the hold inside SGLang's processes reads
(microbench/sglang_lab/boot/inject/ppscope_twin_hold.py): per rank, the decode time by
micro-batch size (`decode_us`, index = size), the prefill time over tokens (`prefill_tokens`,
`prefill_us`, interpolated), the last rank's lm_head per sequence, and the host work of a visit
(`host_us`, `empty_us`), of a forward's launch (`launch_us`) and of a result (`process_us`); the
hidden states' hop by micro-batch size (`hop_us`); the mode (`async`: a GPU's device time, the
CPU runs ahead of the forward; `sync`: SGLang's CPU backend, the forward holds its rank's CPU),
and the dilation k every time is multiplied by (0: nothing emulated, the calibration). Two
builders make the times, from the model's figures (reports/model/scenario/twin_costs.py) or
from an observed server's traced forwards (reports/model/observed/twin_costs.py); k is the twin
run's and enters in one place, `write_costs`, the file's one writer.

The record (`twin.json`, `TwinData` as its `data`): per setting (its SGLang flags),
concurrency and repetition, a `TwinRow`: the twin's figures, undilated, beside the model's.
Older records lack the fields added since (the repetition, the steady decode, the model of the
run, the hold's name): each has the default that says so. The report's own checks of a record
(reports/model/checks/twin_check.py) come first and name the figure in their own words; the
shape here is the rest.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Iterator, Literal

from reports.base.schema import Json, ge, gt, if_set, to_json

MODES = ("async", "sync")


@dataclass(frozen=True)
class RankCosts:
    """One rank's emulated times in microseconds, before the dilation k."""
    decode_us: tuple[float, ...] = ge(0)          # index = micro-batch size
    prefill_tokens: tuple[int, ...] = ge(1)       # the prefill table's tokens ...
    prefill_us: tuple[float, ...] = ge(0)         # ... and its times
    lm_head_seq_us: float = ge(0)                 # the last rank's lm_head, per sequence
    host_us: float = ge(0)                        # a visit with a batch
    empty_us: float = ge(0)                       # a visit without one
    launch_us: float = ge(0)                      # the CPU's launch of a forward
    process_us: float = ge(0)                     # a result's processing
    layers: int | None = if_set()                 # the rank's layers (the scenario's twin)


@dataclass(frozen=True)
class TwinCosts:
    """The hold's cost file (module docstring)."""
    mode: Literal["async", "sync"]
    ranks: tuple[RankCosts, ...]
    hop_us: tuple[float, ...] = ge(0)             # index = micro-batch size
    layer_split: tuple[int, ...] = ge(0)
    sources: dict[str, str]
    k: float = ge(0, default=0.0)                 # set by `write_costs` only
    forward_scale: float | None = if_set()        # the observed twin: 1 / profiler slowdown


def write_costs(path: str | os.PathLike, costs: TwinCosts, k: float) -> TwinCosts:
    """The cost file at dilation `k` (0: nothing emulated), written atomically: the hold
    re-reads it by its modification time and never sees half a file. Returns what was written."""
    from reports.base.records import write_json_atomic
    at_k = replace(costs, k=float(k))
    write_json_atomic(path, to_json(at_k))
    return at_k


@dataclass(frozen=True)
class Calibration:
    """How k was chosen: bench_serving at C = 1 with nothing emulated, this machine's own
    step against the model's (microbench/sglang_lab/twin/run.py `calibrated_k`), or given."""
    k: float = gt(0)
    given: bool | None = if_set()                 # `--k`: no calibration run
    host_tpot_ms: float | None = if_set()
    model_tpot_ms_c1: float | None = if_set()
    host_share: float | None = if_set()           # this machine's step over the emulated one
    target_share: float | None = if_set()
    max_k: float | None = if_set()


@dataclass(frozen=True)
class TwinRow:
    """One bench_serving run of one setting at one concurrency; times undilated (divided by k).
    None: not in this record (an older twin's) or not measured (no steady window)."""
    setting: str
    flags: tuple[str, ...]
    concurrency: int = ge(1)
    twin_decode_tok_per_s: float = gt(0)          # C / bench_serving's median TPOT
    model_tok_per_s: float = gt(0)                # the model's steady loop
    twin_tpot_ms: float | None = gt(0, default=None)
    twin_output_tok_per_s: float | None = gt(0, default=None)
    twin_ttft_ms: float | None = gt(0, default=None)
    completed: int | None = ge(0, default=None)
    # bench_serving's tokens re-counted from the text beside those SGLang made
    bench_text_tokens: int | None = ge(0, default=None)
    bench_output_tokens: int | None = ge(0, default=None)
    waves: tuple[int, ...] = ge(0, default=())    # SGLang's admitted waves (its log)
    model_tpot_ms: float | None = gt(0, default=None)
    model_cpu_forward_tpot_ms: float | None = gt(0, default=None)
    model_slots: tuple[int, ...] = ge(0, default=())
    run_model_tpot_ms: float | None = gt(0, default=None)   # the model of this very run
    twin_steady_tpot_ms: float | None = gt(0, default=None)  # the steady decode (SGLang's log)
    steady_cycles: int = ge(0, default=0)
    steady_slots: tuple[int, ...] = ge(0, default=())
    rep: int = ge(1, default=1)

    @property
    def steady_decode_tok_per_s(self) -> float | None:
        """C / the steady decode TPOT; None without a steady window."""
        t = self.twin_steady_tpot_ms
        return self.concurrency * 1000.0 / t if t else None


@dataclass(frozen=True)
class TwinData:
    """`twin.json`'s data (module docstring)."""
    scenario: str
    pp: int = ge(1)
    calibration: Calibration | None = None
    rows: tuple[TwinRow, ...] = ()
    output_len: int | None = ge(1, default=None)
    prompt_len: int | None = ge(1, default=None)
    costs: TwinCosts | None = None
    complete: bool = True                         # False: a run that stopped early
    mode: Literal["async", "sync"] = "async"
    reps: int = ge(1, default=1)
    flush_cache: bool = False
    hold: str | None = None       # "stream": the hold orders PP messages on SGLang's stream
    emulated: str | None = None   # what was emulated, in words
    observed: tuple[tuple[int, float], ...] = ()  # the user's (C, tok/s)
    server: Json = None           # the lab's choices for its servers (server.py)

    def with_default(self) -> Iterator[tuple[TwinRow, TwinRow]]:
        """Each row of a setting with the default's row of the same concurrency and
        repetition; rows with no such default are left out."""
        base = {(r.concurrency, r.rep): r for r in self.rows if r.setting == "default"}
        for r in self.rows:
            b = base.get((r.concurrency, r.rep))
            if r.setting != "default" and b is not None:
                yield r, b
