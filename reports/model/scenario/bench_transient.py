"""A finite benchmark run modelled from its first prompt to its last token, prefill included.

The pipeline model's figures are a steady state: every slot decodes, nobody prefills. A short
benchmark is not one: with 32 output tokens and 1000-token prompts, the prefills of the later
prompts run between the earlier prompts' decodes for much of the run, and a setting that changes
how prompts are chunked changes that transient as well as the steady state. This module runs the
one admission engine (reports/base/slots.py `run_loop`, which records the run visit by visit)
and then the pipeline model over exactly those visits (reports/model/sim/pipeline_model.py `Plan`):
each visit a decode of the requests in its slot, a prefill of the tokens admitted there
(SGLang's prefill first), or an empty visit, with the same stage, hop and host costs as the
steady-state model and prefill at the twin's own estimate (reports/model/scenario/twin_costs.py).

Per prompt, TPOT is (last token - first token) / (output tokens - 1), as bench_serving computes
it from the client's side; both tokens reach the client through the same return, so the return's
time cancels. The run's TPOT is the median over prompts, as bench_serving reports it.
"""
from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass
from typing import Sequence

from reports.base.slots import RunRecord, Successor, Wave, run_loop
from reports.model.scenario import loop_builder as lb
from reports.model.sim.pipeline_model import Plan, simulate_plan
from reports.model.settings_change import Change
from reports.model.scenario.inputs import Inputs


@dataclass(frozen=True)
class BenchModel:
    tpot_ms: float              # median over prompts
    prefill_visits: tuple[tuple[int, int], ...]   # (#new-seq, #running-req) per prefill


def waves_of(new_seqs: Sequence[int], C: int) -> list[Wave]:
    """Arrival waves that give SGLang's logged first admission: the first `Prefill batch`'s
    prompts at the first visit, the rest of the C at the next (a burst whose first prompts
    reached the scheduler one visit before the others, as bench_serving's burst did on the
    twin)."""
    first = min(C, max(1, int(new_seqs[0]))) if new_seqs else C
    return [Wave(first, 0)] + ([Wave(C - first, 1)] if C > first else [])


def _prefill_fn(table):
    """The prefill forward of each rank from the twin's cost table (`TwinCosts`, interpolated
    over tokens, lm_head once per sequence), as the twin's hold module computes it."""
    ranks = table.ranks

    def us(r: int, tokens: int, n: int) -> float:
        row = ranks[r]
        xs, ys = row.prefill_tokens, row.prefill_us
        if tokens <= xs[0]:
            body = ys[0] * tokens / xs[0]
        else:
            i = min(bisect.bisect_left(xs, tokens), len(xs) - 1)
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
            body = y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)
        return body + row.lm_head_seq_us * n
    return us


def model_bench(inp: Inputs, C: int, prompts: int, output_len: int,
                waves: Sequence[Wave] | None = None, changes: Sequence[Change] = (),
                cached_prompts: int = 0) -> BenchModel:
    """bench_serving at concurrency C, `prompts` prompts of the scenario's prompt length and
    `output_len` tokens, over the deployment with the settings `changes`. The first
    `cached_prompts` prompts need one token prefilled: bench_serving's warm-up request is the
    run's first prompt (SGLang 0.5.23 sglang/benchmark/serving.py `benchmark` warms up with
    input_requests[0], and flushes the prefix cache after it only with `--flush-cache`), so
    SGLang's radix cache holds all but its last token when the run sends it again (the twin's
    logs: `#cached-token: 999` of 1000)."""
    from reports.model.scenario.twin_costs import costs
    ch = lb.Changed.of(inp, changes)
    cfg, depth, partition = ch.slot_config, ch.depth, ch.partition
    rec = RunRecord()
    run = run_loop(cfg, list(waves) if waves else [Wave(C)], Successor(prompts),
                   prompt_len=lambda c: 1 if c < cached_prompts else inp.prompt_len,
                   output_len=lambda: output_len, record=rec)
    bmax = max([n for n, _ in rec.batches] + [1])
    loop = lb.loop_config(inp, lb.ALL_ON, bmax, depth=depth, partition=partition,
                          graph_max_bs=ch.graph_max_bs, mrr=ch.server.max_running_requests)
    table = costs(inp, bmax, partition=partition)
    plan = Plan(loop, tuple(rec.batches), _prefill_fn(table))
    simulate_plan(plan)
    got = plan.processed
    tpots = [(got[last] - got[first]) / (n - 1) / 1e3
             for first, last, n in rec.requests if n > 1]
    if not tpots:
        raise ValueError("no prompt decoded more than one token")
    return BenchModel(statistics.median(tpots), run.prefills)
