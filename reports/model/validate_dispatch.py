"""Model vs the dispatch probe: rebuild the pipeline model for exactly the probe's configuration.

Inputs come only from dispatch.json, never from its tok/s: pp, async depth, slot cap; per-rank
forward time by micro-batch size (`stages[].gpu_us_p50`, pooled over runs, median); rank 0's
host time per non-empty visit by slot size (`dispatch_latency_us.p50`: returned tokens
available on its stream -> forward starts, pooled by the run's largest slot); the other ranks'
host time (`host_us_p50`, median); rank 0's empty-visit cost (`host_empty_us_p50` where the
probe wrote it, else 0); hop (`hop_us_in_loop`, else `send_us_p50`). Each run's own
`slot_sizes` are the slots.

The mechanism that matters (found on 2x H200, PP2, 4 slots): rank 0 reads the returned tokens
with `tolist()`, a host sync on its compute stream, so its host work for the next slot starts
only when its GPU is idle (`result_sync`). With one occupied slot (`sglang` burst) that time is
on the round trip anyway; with two (`even`) it lands between rank 0's two forwards, and a
model without it over-predicted `even` by 24% at C=8 and 11% at C=32 (rank 0 measured 81%
busy, not 100%).

Output: modelled vs measured tok/s per policy x arrival x C, the % difference and, outside the
10% target, the reason; `micro_batch_choices()` re-runs the same inputs with the requests spread
over 1, pp or all slots (the micro-batch-count what-if; batch sizes not measured in the record
are interpolated, said so).
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from reports.base.errors import CliError
from reports.model.pipeline_model import LoopConfig, simulate
from reports.base.records import Record
from reports.base.interp import interp_log
from reports.base.slots import SlotConfig, even_slots

TARGET_PCT = 10.0


@dataclass(frozen=True)
class Check:
    policy: str
    arrival: str
    concurrency: int
    slot_sizes: tuple[int, ...]
    measured_tok_per_s: float
    modelled_tok_per_s: float
    diff_pct: float
    note: str = ""              # why it is outside the target, "" when within


@dataclass(frozen=True)
class MicroBatchChoice:
    concurrency: int
    micro_batches: int
    slot_sizes: tuple[int, ...]
    modelled_tok_per_s: float
    measured_tok_per_s: float | None   # a run of the record with exactly these slot sizes
    interpolated: bool                 # a slot size the record has no forward time for


@dataclass(frozen=True)
class ProbeInputs:
    pp: int
    depth: int
    curves: tuple[tuple[tuple[int, float], ...], ...]   # per rank: (batch, forward us)
    first_host: tuple[tuple[int, float], ...]           # rank 0: (slot size, host us)
    host_us: float
    empty_us: float
    hop_us: float


def _med(vals: list[float]) -> float:
    return float(median(vals)) if vals else 0.0


def probe_inputs(rec: Record) -> ProbeInputs:
    d = rec.payload
    if d is None:
        raise CliError(f"dispatch.json: status {rec.status}; nothing to model")
    pp, depth = d.config.pp, d.config.async_depth
    gpu: dict[int, dict[int, list[float]]] = {}
    host: list[float] = []
    empty: list[float] = []
    first: dict[int, list[float]] = {}
    send: list[float] = []
    for r in d.runs:
        big = max(r.slot_sizes, default=0)
        for s in r.stages:
            for b, us in s.gpu_us_p50.items():
                if us is not None:
                    gpu.setdefault(s.rank, {}).setdefault(int(b), []).append(us)
            if s.rank == 0:
                if s.dispatch_latency_us.p50 is not None and big > 0:
                    first.setdefault(big, []).append(s.dispatch_latency_us.p50)
                if s.host_empty_us_p50 is not None:
                    empty.append(s.host_empty_us_p50)
            elif s.host_us_p50 is not None:
                host.append(s.host_us_p50)
            if s.send_us_p50 is not None:
                send.append(s.send_us_p50)
    if len(gpu) < pp:
        raise CliError(f"dispatch.json: gpu_us_p50 for {len(gpu)} of {pp} ranks; cannot model")
    hop = d.hop_us_in_loop if d.hop_us_in_loop is not None else _med(send)
    curves = tuple(tuple(sorted((b, _med(v)) for b, v in gpu[i].items())) for i in range(pp))
    return ProbeInputs(pp, depth, curves,
                       tuple(sorted((b, _med(v)) for b, v in first.items())),
                       _med(host), _med(empty), hop)


def loop_for(pi: ProbeInputs, bmax: int) -> LoopConfig:
    stage = tuple(tuple([0.0] + [interp_log(list(c), b) for b in range(1, bmax + 1)])
                  for c in pi.curves)
    first = tuple([0.0] + [interp_log(list(pi.first_host), b) for b in range(1, bmax + 1)]) \
        if pi.first_host else ()
    hop_row = tuple([0.0] + [pi.hop_us] * bmax)
    return LoopConfig(stage_us=stage, hop_us=tuple([hop_row] * pi.pp), async_depth=pi.depth,
                      host_us=pi.host_us, empty_us=pi.empty_us, chain_us=0.0,
                      first_host_us=first, result_sync=True)


def _note(diff_pct: float, sizes: list[int], pi: ProbeInputs) -> str:
    if abs(diff_pct) <= TARGET_PCT:
        return ""
    occupied = sum(1 for n in sizes if n)
    why = "over-predicts" if diff_pct > 0 else "under-predicts"
    if not pi.first_host:
        return f"model {why}: the record has no rank-0 dispatch latency (old probe)"
    if occupied == 1:
        return (f"model {why} with one occupied slot: the round trip (forwards + hops + rank-0 "
                "host) is the whole story here, so a forward time measured under other slot "
                "sizes (pooled median) is the likely culprit")
    return (f"model {why} with {occupied} micro-batches: effect not in the model (e.g. the "
            "gloo request-list chain waiting on the next rank, or NCCL kernels sharing the GPU "
            "with a forward)")


def validate(rec: Record) -> list[Check]:
    pi = probe_inputs(rec)
    out = []
    for r in rec.payload.runs:
        sizes = list(r.slot_sizes)
        if not sizes or not sum(sizes) or r.tok_per_s is None:
            continue
        lc = loop_for(pi, max(sizes))
        sim = simulate(lc, sizes[:lc.slots])
        meas = r.tok_per_s
        diff = (sim.tok_per_s / meas - 1) * 100 if meas else 0.0
        out.append(Check(r.policy, r.arrival, r.concurrency, tuple(sizes), meas,
                         sim.tok_per_s, diff, _note(diff, sizes, pi)))
    return out


def micro_batch_choices(rec: Record) -> list[MicroBatchChoice]:
    """For each C the record ran: the model's tok/s with the C requests spread evenly over
    m = 1, pp and all slots (the `--micro-batches` knob of `even`), next to a measured run
    with the same slot sizes where the record has one."""
    pi = probe_inputs(rec)
    S = SlotConfig(pi.pp, pi.depth, 1).slots
    runs = [r for r in rec.payload.runs if r.tok_per_s is not None]
    measured = {r.slot_sizes: r.tok_per_s for r in runs}
    have = {b for c in pi.curves for b, _ in c}
    out = []
    for C in sorted({r.concurrency for r in runs}):
        for m in sorted({1, pi.pp, S}):
            if m > C:
                continue
            sizes = [0] * S
            chosen = even_slots(SlotConfig(pi.pp, pi.depth, max(C, 1)), m)
            for j in range(C):  # C requests over the m chosen slots, as `even` fills them
                sizes[chosen[j % m]] += 1
            lc = loop_for(pi, max(sizes))
            sim = simulate(lc, sizes)
            out.append(MicroBatchChoice(C, m, tuple(sizes), sim.tok_per_s,
                                        measured.get(tuple(sizes)),
                                        any(n and n not in have for n in sizes)))
    return out
