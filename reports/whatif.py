"""What-ifs: re-run the pipeline model with one change and report predicted tok/s and gain.

Knobs: `pp_max_micro_batch_size` (micro-batch count is a choice: with MoE more micro-batches
than stages re-read experts, so the best cap is searched, not assumed), `SGLANG_PP_LAYER_PARTITION`
(local search moving one layer at a time between neighbours to lower the slowest stage),
`--pp-async-batch-depth`, arrival pacing (requests spread by the `even` policy over min(C, pp)
slots), `--cuda-graph-max-bs`, and PP vs TP of the same GPUs (estimated: every GPU reads 1/pp of
each layer, plus two all-reduces per layer at the hop's fixed cost). Everything else stays as
modelled.
"""
from __future__ import annotations

from dataclasses import dataclass

from reports import loop_builder as lb
from reports.partition import layer_counts
from reports.scenario import Inputs


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


def what_ifs(inp: Inputs) -> list[WhatIf]:
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
            mb = lb.capture_sizes(4096)
            need = next(s for s in mb if s >= max(sizes))
            out.append(_row("--cuda-graph-max-bs", str(need), C, base,
                            lb.run(inp, C, graph_max_bs=need).tok_per_s))
        else:
            out.append(_row("--cuda-graph-max-bs", str(inp.graph_max_bs), C, base, base,
                            "every slot already fits a captured graph"))
        out.append(_row("TP instead of PP (estimated)", f"tp={inp.pp}", C, base,
                        _tp_tok_s(inp, C), "one batch of C; 2 all-reduces per layer"))
    return out


def _tp_tok_s(inp: Inputs, C: int) -> float:
    costs = lb.stage_cost_us(inp, lb.ALL_ON, C)
    step_us = sum(costs) / inp.pp  # each GPU reads 1/pp of every layer
    allreduce = 2 * inp.model.num_layers * lb.hop_us(inp, C)
    return C / (step_us + allreduce + inp.host_us) * 1e6
