"""The round per slot pattern in a traced window of SGLang's CPU server, against the model of it.

A lab window (or any `ppscope sglang` record of SGLang's CPU traces) often holds several phases:
the benchmark's full rounds, then its tail. Each phase has its own slot pattern (requests per
slot, in visit order) and its own round. This reads both from rank 0's trace: every loop
iteration (`recv_requests` to the next) is one visit, sized by the `step[DECODE bs=N]` span it
holds (0 for an empty slot); `slots` consecutive visits are one round (SGLang 0.5.23
managers/scheduler_pp_mixin.py, `event_loop_pp`: `pp_loop_size` slots visited round-robin).
Rounds with the same pattern in a row are one phase; its traced round is the median over them.

Beside it, the model of the same record (reports/model/observed/deployment.py, the costs the report
uses, which are means over the whole window) run with that phase's pattern. The model's miss
per phase says whether the loop's mechanics or the costs are off: a phase modelled fast and
another slow from the same costs means the costs differ by phase (two shared cores, a busier
machine in the full rounds), not a missing step of the loop.

    python -m microbench.sglang_lab.rounds OUT/<case> [...]     # case folders with
                                                                 # traces/ and sglang.json

This module is the analysis; the command (microbench/sglang_lab/rounds.py) reads rank 0's trace
with microbench/sglang's reader (`cpu_steps.collect`) and hands its events here.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from statistics import median

MIN_ROUNDS = 3      # a phase shorter than this is a transition, not a phase


@dataclass(frozen=True)
class Phase:
    pattern: tuple[int, ...]     # requests per slot, in the order the window visited them
    rounds: int
    round_ms: float              # traced, median over the phase's rounds


def visits_of(ev: dict) -> list[tuple[float, int]]:
    """(start us, decode batch size or 0) per loop iteration of one rank's trace, from its
    events as microbench/sglang/cpu_steps.py `collect` reads them."""
    starts = [s for s, _ in ev["ranges"]["recv_requests"]]
    steps = [(s, b) for s, _, mode, b in ev["steps"] if mode == "DECODE"]
    out, j = [], 0
    for lo, hi in zip(starts, starts[1:]):
        while j < len(steps) and steps[j][0] < lo:
            j += 1
        out.append((lo, steps[j][1] if j < len(steps) and steps[j][0] < hi else 0))
    return out


def phases(vs: list[tuple[float, int]], slots: int) -> list[Phase]:
    """Consecutive rounds with the same pattern (and at least one request), MIN_ROUNDS or more."""
    runs: list[tuple[tuple[int, ...], list[float]]] = []
    for k in range(0, len(vs) - slots, slots):
        pat = tuple(n for _, n in vs[k:k + slots])
        dt = (vs[k + slots][0] - vs[k][0]) / 1e3
        if runs and runs[-1][0] == pat:
            runs[-1][1].append(dt)
        else:
            runs.append((pat, [dt]))
    return [Phase(p, len(d), median(d)) for p, d in runs if any(p) and len(d) >= MIN_ROUNDS]


def case_record(case: Path):
    """The case's `ppscope sglang` record (its payload), with the traced window's own loop: the
    log's first burst, which would replace the traced sizes, is left out (each phase's sizes are
    set by `phase_rows`)."""
    from reports.base.records import read_record
    rec = read_record(case / "sglang.json")
    if rec.probe != "sglang" or rec.payload is None:
        raise ValueError(f"{case / 'sglang.json'}: a {rec.probe} record ({rec.status}), not "
                         "`ppscope sglang`'s: read the case's traces into it (ppscope sglang "
                         f"--traces {case / 'traces'} --json {case / 'sglang.json'})")
    sg = rec.payload
    return replace(sg, loop=replace(sg.loop, bursts=())) if sg.loop is not None else sg


def rank0_trace(case: Path) -> Path:
    traces = sorted((case / "traces").glob("*PP-0*"))
    if not traces:
        raise ValueError(f"{case}: no rank-0 trace in traces/")
    return traces[0]


def phase_rows(case: Path, sg, trace: Path, ev: dict) -> list[dict]:
    """Each phase of the case's traced window (rank 0's `trace`, its events `ev`): traced round,
    modelled round, the difference."""
    from reports.model.observed import bench_run as ow
    from reports.model.observed.deployment import OBSERVED_CAUSES, run
    dep, server, _, _ = ow.from_sglang(sg)
    _same_run(case, sg, trace, len(ev["ranges"]["recv_requests"]), ev["events"])
    rows = []
    for ph in phases(visits_of(ev), dep.slots):
        m = run(replace(dep, sizes=ph.pattern), frozenset(OBSERVED_CAUSES)).tpot_ms
        rows.append({"case": case.name, "depth": server.pp_async_batch_depth,
                     "pattern": "-".join(map(str, ph.pattern)), "rounds": ph.rounds,
                     "traced_round_ms": ph.round_ms, "modelled_round_ms": m,
                     "diff_pct": 100 * (m / ph.round_ms - 1)})
    return rows


def _same_run(case: Path, sg, trace: Path, loops: int, events: int) -> None:
    """The record's model and the trace's rounds must be of one run: the record read this very
    file (its name holds SGLang's profile id) and counted as many events and loop iterations
    in it."""
    rec = case / "sglang.json"
    r0 = (sg.traces.ranks.get("0") if sg.traces is not None else None)
    if r0 is None or sg.loop is None:
        raise ValueError(f"{rec}: no rank-0 trace read into it (ppscope sglang --traces "
                         f"{case / 'traces'} --json {rec})")
    if r0.file != trace.name:
        raise ValueError(f"{trace}: not the rank-0 trace {rec} was read from ({r0.file}): "
                         "another run's; read this run's traces into it")
    counted = ((r0.scheduler_ranges_us or {}).get("recv_requests") or {}).get("count")
    if (counted is not None and counted != loops) or (r0.events and r0.events != events):
        raise ValueError(f"{trace.name}: {events} events and {loops} loop iterations, but "
                         f"{rec.name} counted {r0.events} and {counted} in its {r0.file}: "
                         "another run's trace under the same name")


def render(rows: list[dict]) -> str:
    from tabulate import tabulate
    return tabulate([[r["case"], r["depth"], r["pattern"], r["rounds"], r["traced_round_ms"],
                      r["modelled_round_ms"], r["diff_pct"]] for r in rows],
                    headers=["case", "depth", "slot pattern", "rounds", "traced round ms",
                             "modelled ms", "model vs trace %"], floatfmt=".1f")
