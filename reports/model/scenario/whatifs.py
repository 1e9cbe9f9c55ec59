"""What-ifs as server settings: each setting a user could launch with, judged at every concurrency.

A user changes one launch flag for all traffic, so every candidate setting is run through the
pipeline model at every concurrency the user measured (the scenario's list when nothing was
measured) and at a stated mixed-load case (`MIXED`: the largest of those concurrencies with
request lengths drawn as sglang.bench_serving draws them by default, `--random-range-ratio 0`,
so occupancy drifts; shown, not part of the objective).

Objective (stated): the geometric mean over those concurrencies of predicted tok/s, relative to
the deployment as modelled. The recommended setting is the one with the highest objective gain
among those that lose no more than `MAX_LOSS` (2%) at any measured concurrency; it is shown with
its effect at each. No row restates the current setting, and a setting the model cannot tell
apart from the current one at any concurrency is left out (counted in the knob's note).

Knobs (SGLang 0.5.23 server arguments, arg_groups/fields/*.py):
- `--pp-max-micro-batch-size`: the per-slot cap; candidates are the caps that split each
  measured concurrency into 1 .. slots micro-batches;
- `--max-running-requests`: request rows; moves the default cap (`// pp`) with it;
- `--chunked-prefill-size`: the prefill token budget of one visit (2048 .. 16384), which splits
  a burst of prompts over slots;
- `--pp-async-batch-depth`: 0, 1, 2, 4, 8, 16 (slots = pp + depth; depth 0 exchanges outputs
  after the forward);
- `SGLANG_PP_LAYER_PARTITION`: a local search moving one layer at a time between neighbours to
  lower the slowest stage at the largest slot;
- arrival pacing (a client-side change, not a flag, so never the recommended setting): requests
  spread one micro-batch per stage;
- `--cuda-graph-max-bs-decode`, only when some slot runs eager;
- TP instead of PP of the same GPUs (estimated: every GPU reads 1/pp of each layer, plus two ring
  all-reduces of the hidden state per layer, costed from the measured NCCL transport time per
  message size when topology.json has it, else from a stated PCIe estimate). A deployment
  change, so never the recommended setting.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

from reports.model.scenario import loop_builder as lb
from reports.base.cuda_graphs import capture_sizes
from reports.base.interp import interp_linear
from reports.base.partition import layer_counts
from reports.base.payloads.topology import HopCost, TopologyData, TransportPoint
from reports.model.scenario.inputs import Inputs
from reports.base.server_settings import slot_count
from reports.model.settings_change import (GRAPH_MAX_BS, LAYER_PARTITION, PACING, TP_KNOB,
                                           Candidate, Change, WhatIf, apply,
                                           effect as _effect, knob_rank)

# Stated estimate when no NCCL transport was measured: fixed cost of one ring step (one
# NCCL send/recv of a small message between neighbours; ~6.7 us measured on H200 NVLink by
# topology's sendrecv_perf-style sweep, PCIe P2P is of the same order).
RING_STEP_LATENCY_US = 7.0
MAX_LOSS = 0.02          # a recommended setting loses at most 2% at any measured concurrency
MIXED_RANGE_RATIO = 0.0  # the mixed-load case: bench_serving's default length spread
OBJECTIVE = ("geometric mean of predicted tok/s over the measured concurrencies, no more than "
             f"{MAX_LOSS:.0%} lost at any of them")


def measured_concurrency(inp: Inputs) -> tuple[int, ...]:
    obs = tuple(C for C, _ in inp.observed)
    return obs or inp.concurrency


def best_partition(inp: Inputs, b: int) -> str:
    counts = layer_counts(inp.model.num_layers, inp.pp, inp.layer_partition)

    def worst(c):
        return max(lb.stage_cost_us(inp, lb.ALL_ON, b, ",".join(map(str, c))))

    best = worst(counts)
    for _ in range(4 * inp.pp):
        cand = None
        for i in range(inp.pp - 1):
            for a, z in ((i, i + 1), (i + 1, i)):
                if counts[a] > 1:
                    c = list(counts)
                    c[a] -= 1
                    c[z] += 1
                    w = worst(c)
                    if w < best - 1e-9:
                        best, cand = w, c
        if cand is None:
            break
        counts = cand
    return ",".join(map(str, counts))


def candidates(inp: Inputs) -> list[Candidate]:
    """Every setting tried, none equal to the current one."""
    Cs = measured_concurrency(inp)
    S = inp.slots
    out: list[Candidate] = []
    caps = sorted({max(1, -(-C // m)) for C in Cs for m in range(1, min(C, S) + 1)}
                  - {inp.max_micro_batch})
    for cap in caps:
        out.append(Candidate.one("--pp-max-micro-batch-size", cap,
                                 f"at most {cap} request(s) per slot"))
    mrrs = sorted({inp.pp * c for c in caps if inp.pp * c >= max(Cs)} | {max(Cs)}
                  - {inp.max_running_requests})
    for m in mrrs:
        cand = Candidate.one("--max-running-requests", m, "")
        cap = apply(inp.server, cand.changes).max_micro_batch
        out.append(replace(cand, note=f"{m} request rows; default cap {cap} per slot"))
    for ch in (2048, 4096, 8192, 16384):
        if ch != inp.chunked_prefill_size:
            out.append(Candidate.one("--chunked-prefill-size", ch,
                                     f"prefill budget {ch} tokens per slot visit"))
    for d in (0, 1, 2, 4, 8, 16):
        if d != inp.async_depth:
            out.append(Candidate.one("--pp-async-batch-depth", d, f"{slot_count(inp.pp, d)} slots"
                                     + ("; outputs exchanged after the forward" if d == 0 else "")))
    sizes = [s for s in lb.admitted_sizes(inp, max(Cs)) if s]
    part = best_partition(inp, max(sizes))
    cur = ",".join(map(str, layer_counts(inp.model.num_layers, inp.pp, inp.layer_partition)))
    if part != cur:
        out.append(Candidate.one(LAYER_PARTITION, part,
                                 f"lowers the slowest stage at b={max(sizes)} (now {cur})"))
    if inp.arrival != "even":
        out.append(Candidate.one(PACING, "even", "clients paced so that each stage holds one "
                                 "micro-batch (~C/pp requests)", f"even over {inp.pp} slots"))
    big = max(max(s for s in lb.admitted_sizes(inp, C) if s) for C in Cs)
    if inp.graphs and big > inp.graph_max_bs:
        need = next(s for s in capture_sizes(4096) if s >= big)
        out.append(Candidate.one(GRAPH_MAX_BS, need,
                                 f"the largest slot ({big}) replays a graph instead of running eager"))
    return out


def what_ifs(inp: Inputs, transport: Sequence[tuple[float, float]] | None = None
             ) -> list[WhatIf]:
    """One row per setting; eligible rows first, then by objective gain (best first)."""
    Cs = measured_concurrency(inp)
    base = {C: lb.run(inp, C).tok_per_s for C in Cs}
    mixed_inp = replace(inp, range_ratio=MIXED_RANGE_RATIO)
    Cm = max(Cs)
    base_mixed = lb.run(mixed_inp, Cm).tok_per_s
    out: list[WhatIf] = []
    dropped: dict[str, int] = {}
    for cand in candidates(inp):
        knob, ov = cand.knob, cand.changes
        eff = tuple(_effect(C, base[C], lb.run(inp, C, changes=ov).tok_per_s) for C in Cs)
        if all(abs(e.gain) < 1e-9 for e in eff):
            dropped[knob] = dropped.get(knob, 0) + 1
            continue
        mixed = _effect(Cm, base_mixed, lb.run(mixed_inp, Cm, changes=ov).tok_per_s)
        out.append(_row(knob, cand.shown, eff, mixed, cand.note, server=knob != PACING,
                        changes=ov))
    for knob, n in dropped.items():
        out = [replace(w, note=w.note + f" ({n} other setting(s) of this knob change nothing)")
               if w.knob == knob else w for w in out]
    eff, notes = [], []
    for C in Cs:
        tok, ar_us, how = _tp_tok_s(inp, C, transport)
        eff.append(_effect(C, base[C], tok))
        notes.append(f"C={C}: 2 ring all-reduces per layer, {ar_us:.0f} us each ({how})")
    out.append(_row(TP_KNOB, f"tp={inp.pp}", tuple(eff), None,
                    "one batch of C; " + "; ".join(notes), server=False))
    out = sorted(out, key=lambda w: (not w.eligible, -round(w.gain, 9), _rank(w.knob),
                                     w.setting))
    top = [w for w in out if w.eligible][:TOP_CHECKED]
    checked = {id(w): holds_range(inp, w) for w in top}
    return [checked.get(id(w), w) for w in out]


_rank = knob_rank   # tie-break between settings of the same effect (settings_change.KNOBS)


def _row(knob, shown, eff, mixed, note, server: bool, changes: tuple[Change, ...] = ()
         ) -> WhatIf:
    geo = math.exp(sum(math.log(max(e.predicted_tok_per_s, 1e-12) /
                                max(e.baseline_tok_per_s, 1e-12)) for e in eff) / len(eff))
    worst = min(e.gain for e in eff)
    mixed_ok = mixed is None or mixed.gain >= -MAX_LOSS   # the mixed load is inside the rule
    return WhatIf(knob, shown, eff, mixed, geo - 1, worst,
                  server and worst >= -MAX_LOSS and mixed_ok, note, changes=changes)


# The range a setting is checked over: powers of two up to RANGE_FACTOR x the largest measured
# concurrency (a cap that splits C=32 well can cap the server below a heavier load).
RANGE_FACTOR = 4
TIE = 0.005       # objective gains within this are a tie, broken by `_tie_key`
TOP_CHECKED = 4   # eligible rows whose range is checked (the recommendation is among them)


def range_cs(inp: Inputs) -> list[int]:
    top = RANGE_FACTOR * max(measured_concurrency(inp))
    return sorted({2 ** k for k in range(0, top.bit_length()) if 2 ** k <= top}
                  | set(measured_concurrency(inp)))


def holds_range(inp: Inputs, w: WhatIf) -> WhatIf:
    """`w` with the concurrency range where it loses no more than MAX_LOSS (`range_cs`)."""
    Cs, ov = range_cs(inp), w.changes
    up_to, lost = None, None
    for C in Cs:
        e = _effect(C, lb.run(inp, C).tok_per_s, lb.run(inp, C, changes=ov).tok_per_s)
        if e.gain < -MAX_LOSS:
            lost = e
            break
        up_to = C
    return replace(w, holds_up_to=up_to, loses_at=lost, checked_up_to=Cs[-1])


def _tie_key(w: WhatIf) -> tuple:
    """Between settings within TIE of the best objective: the one that holds over the widest
    range of load first (never one that caps the server below its load), then the better
    mixed load, then the most direct flag."""
    reach = float("inf") if w.loses_at is None else (w.holds_up_to or 0)
    return (-reach, -(w.mixed.gain if w.mixed else 0.0), _rank(w.knob), w.setting)


def recommendation(rows: Sequence[WhatIf]) -> WhatIf | None:
    """The eligible server setting with the highest objective gain, if it gains at all; a tie
    (within TIE) broken by `_tie_key`."""
    ok = [w for w in rows if w.eligible and w.gain > 0.005]
    if not ok:
        return None
    best = max(w.gain for w in ok)
    return min((w for w in ok if w.gain >= best - TIE), key=_tie_key)


def best_pair(inp: Inputs, rows: Sequence[WhatIf]) -> WhatIf | None:
    """The best two server settings of different knobs applied together, among each server
    knob's best row; judged by the same objective and rule as one setting. Each row brings its
    own changes."""
    Cs = measured_concurrency(inp)
    base = {C: lb.run(inp, C).tok_per_s for C in Cs}
    mixed_inp = replace(inp, range_ratio=MIXED_RANGE_RATIO)
    base_mixed = lb.run(mixed_inp, max(Cs)).tok_per_s
    per_knob: dict[str, list[WhatIf]] = {}
    for w in rows:
        if w.knob not in (TP_KNOB, PACING) and w.gain > 0 and w.knob not in per_knob:
            per_knob.setdefault(w.knob, []).append(w)
    cands = [w for ws in per_knob.values() for w in ws]
    out: list[WhatIf] = []
    for i, a in enumerate(cands):
        for b in cands[i + 1:]:
            if a.knob == b.knob:
                continue
            ov = a.changes + b.changes
            eff = tuple(_effect(C, base[C], lb.run(inp, C, changes=ov).tok_per_s) for C in Cs)
            mixed = _effect(max(Cs), base_mixed, lb.run(mixed_inp, max(Cs), changes=ov).tok_per_s)
            w = _row(f"{a.knob} + {b.knob}", f"{a.setting} + {b.setting}", eff, mixed,
                     "two settings together", server=True, changes=ov)
            out.append(holds_range(inp, w) if w.eligible else w)
    return recommendation(out)


def transport_points(topology: TopologyData | None) -> list[tuple[float, float]]:
    """Measured NCCL transport time by message size from topology.json: the `nccl_transport`
    sweep (bytes, nccl_transport_us), else each hop's own (bytes, nccl_transport_us). Points
    with the same size are averaged; [] when none."""
    if topology is None:
        return []
    rows: tuple[TransportPoint | HopCost, ...] = topology.nccl_transport
    if not any(r.nccl_transport_us is not None for r in rows):
        rows = topology.hops
    by: dict[float, list[float]] = {}
    for r in rows:
        if r.bytes is not None and r.nccl_transport_us is not None:
            by.setdefault(float(r.bytes), []).append(r.nccl_transport_us)
    return sorted((b, sum(v) / len(v)) for b, v in by.items())


def transport_us(points: Sequence[tuple[float, float]], nbytes: float) -> float:
    """NCCL transport time of one message: linear in bytes between measured sizes (exact for
    the usual latency + bytes/bandwidth shape), flat below the smallest size, the last
    segment's slope beyond the largest (flat with a single point)."""
    return interp_linear(points, nbytes)


def allreduce_us(inp: Inputs, C: int, points: Sequence[tuple[float, float]] | None = None
                 ) -> tuple[float, str]:
    """One ring all-reduce of the hidden state of C tokens across p = inp.pp GPUs.

    size S = C x hidden x 2 bytes (bf16). A ring all-reduce is a reduce-scatter plus an
    all-gather: 2(p-1) steps, each moving S/p bytes to the next GPU (nccl-tests
    doc/PERFORMANCE.md: busbw = algbw x 2(n-1)/n). Each step costs the measured NCCL transport
    time of an S/p-byte message (topology.json), else RING_STEP_LATENCY_US + (S/p) / link
    bandwidth (PCIe from the GPU spec, NVLink where it has one). Under CUDA-graph replay the
    all-reduce kernels are in the graph, so no host cost is added per all-reduce.
    """
    p = inp.pp
    if p < 2:
        return 0.0, "one GPU: no all-reduce"
    chunk = C * inp.model.hidden * 2 / p
    if points:
        step = transport_us(points, chunk)
        how = "measured NCCL transport per step, topology.json"
    else:
        bw = inp.gpu.link_gbps
        step = RING_STEP_LATENCY_US + chunk / (bw * 1e9) * 1e6
        how = f"estimated {RING_STEP_LATENCY_US:g} us + bytes/{bw:.0f} GB/s per step"
    return 2 * (p - 1) * step, f"{2 * (p - 1)} steps of {chunk:.0f} B, {how}"


def _tp_tok_s(inp: Inputs, C: int, points: Sequence[tuple[float, float]] | None = None
              ) -> tuple[float, float, str]:
    """(tok/s, us per all-reduce, how it was costed) for TP=pp on the same GPUs, one batch of C.

    step = sum_i stage_i(C) / p   (each GPU reads 1/p of every layer's weights)
         + 2 x layers x allreduce_us(C)
         + host_us                (one graph launch per step)"""
    costs = lb.stage_cost_us(inp, lb.ALL_ON, C)
    step_us = sum(costs) / inp.pp
    ar, how = allreduce_us(inp, C, points)
    return C / (step_us + 2 * inp.model.num_layers * ar + inp.host_us) * 1e6, ar, how
