"""What-ifs: re-run the pipeline model with one change and report predicted tok/s and gain.

Knobs: `pp_max_micro_batch_size` (micro-batch count is a choice: with MoE more micro-batches
than stages re-read experts, so the best cap is searched, not assumed), `SGLANG_PP_LAYER_PARTITION`
(local search moving one layer at a time between neighbours to lower the slowest stage),
`--pp-async-batch-depth`, arrival pacing (requests spread by the `even` policy over min(C, pp)
slots), `--cuda-graph-max-bs`, and PP vs TP of the same GPUs (estimated: every GPU reads 1/pp of
each layer, plus two ring all-reduces of the hidden state per layer, costed from the measured
NCCL transport time per message size when topology.json has it, else from a stated PCIe
estimate). Everything else stays as modelled. `what_ifs` rows are sorted by gain, best first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from reports.model import loop_builder as lb
from reports.base.cuda_graphs import capture_sizes
from reports.base.interp import interp_linear
from reports.base.partition import layer_counts
from reports.base.payloads.topology import HopCost, TopologyData, TransportPoint
from reports.model.scenario import Inputs

# Stated estimate when no NCCL transport was measured: fixed cost of one ring step (one
# NCCL send/recv of a small message between neighbours; ~6.7 us measured on H200 NVLink by
# topology's sendrecv_perf-style sweep, PCIe P2P is of the same order).
RING_STEP_LATENCY_US = 7.0


@dataclass(frozen=True)
class WhatIf:
    knob: str
    setting: str
    concurrency: int
    baseline_tok_per_s: float
    predicted_tok_per_s: float
    gain: float
    note: str = ""


def _row(knob, setting, C, base, pred, note="") -> WhatIf:
    return WhatIf(knob, setting, C, base, pred, pred / base - 1 if base else 0.0, note)


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


def what_ifs(inp: Inputs, transport: Sequence[tuple[float, float]] | None = None
             ) -> list[WhatIf]:
    """One row per (knob, C); `transport` = measured NCCL (bytes, us) points for the TP row.

    Sorted by gain (best first), then C and knob, so the first row is the best single change."""
    out = []
    for C in inp.concurrency:
        base = lb.run(inp, C).tok_per_s
        caps = sorted({max(1, -(-C // m)) for m in range(1, min(C, inp.pp + inp.async_depth) + 1)})
        res = {cap: lb.run(inp, C, cap=cap).tok_per_s for cap in caps}
        cap = max(res, key=lambda k: (round(res[k], 6), k == inp.max_micro_batch, k))
        out.append(_row("pp_max_micro_batch_size", str(cap), C, base, res[cap],
                        f"{-(-C // cap)} micro-batch(es) of <= {cap}"))
        sizes = [s for s in lb.admitted_sizes(inp, C) if s]
        part = best_partition(inp, max(sizes))
        pred = lb.run(inp, C, partition=part).tok_per_s
        if pred <= base * (1 + 1e-9):
            cur = ",".join(map(str, layer_counts(inp.model.num_layers, inp.pp,
                                                 inp.layer_partition)))
            out.append(_row("SGLANG_PP_LAYER_PARTITION", cur, C, base, base,
                            f"no gain (best max-stage split {part} does not shorten the loop)"))
        else:
            out.append(_row("SGLANG_PP_LAYER_PARTITION", part, C, base, pred))
        res = {d: lb.run(inp, C, depth=d).tok_per_s for d in (0, 1, 2, 4, 8, 16)}
        d = max(res, key=lambda k: (round(res[k], 6), k == inp.async_depth, -k))
        out.append(_row("--pp-async-batch-depth", str(d), C, base, res[d]))
        out.append(_row("arrival pacing", f"even over {min(C, inp.pp)} slots", C, base,
                        lb.run(inp, C, arrival="even").tok_per_s,
                        "requests spread one micro-batch per stage"))
        if max(sizes) > inp.graph_max_bs:
            mb = capture_sizes(4096)
            need = next(s for s in mb if s >= max(sizes))
            out.append(_row("--cuda-graph-max-bs", str(need), C, base,
                            lb.run(inp, C, graph_max_bs=need).tok_per_s))
        else:
            out.append(_row("--cuda-graph-max-bs", str(inp.graph_max_bs), C, base, base,
                            "every slot already fits a captured graph"))
        tok, ar_us, how = _tp_tok_s(inp, C, transport)
        out.append(_row("TP instead of PP (estimated)", f"tp={inp.pp}", C, base, tok,
                        f"one batch of {C}; 2 ring all-reduces per layer, {ar_us:.0f} us each "
                        f"({how})"))
    return sorted(out, key=lambda w: (-w.gain, w.concurrency, w.knob))


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
