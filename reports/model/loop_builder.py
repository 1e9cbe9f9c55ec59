"""Model inputs + on/off switches -> one pipeline-model run.

Each switch turns one named effect on (as measured/estimated) or off (ideal):

| switch | off (ideal) | on |
|---|---|---|
| stage_imbalance | every stage costs the mean stage | the real layer split + extras |
| kernel_efficiency | the roofline floor | floor / efficiency |
| launch_overhead | no graph padding, no eager launches | padding to the captured size; eager above graph max bs |
| p2p_hops | hops cost nothing | hop cost by batch |
| host_dispatch | no CPU time, no chaining | CPU per slot visit + request-list relay |
| slot_imbalance | occupied slots evenly filled | the admission policy's sizes |
| too_few_microbatches | at least min(C, pp) micro-batches | as admitted |
| routing_skew | uniform routing | Zipf skew from the scenario |

All off = `ideal`; all on = `modelled`. `run()` memoises, so Shapley's 2^8 subsets are cheap.
"""
from __future__ import annotations

from functools import lru_cache

from reports.base.cuda_graphs import padded
from reports.base.partition import pp_partition
from reports.model.pipeline_model import LoopConfig, SimResult, simulate
from reports.base.roofline import stage_floor
from reports.base.interp import interp_log
from reports.model.scenario import Inputs
from reports.base.slots import SlotConfig, even_slots, initial_assignment, slot_sizes_of

SWITCHES = ("stage_imbalance", "kernel_efficiency", "launch_overhead", "p2p_hops",
            "host_dispatch", "slot_imbalance", "too_few_microbatches", "routing_skew")
ALL_ON = frozenset(SWITCHES)

@lru_cache(maxsize=20000)
def _floor(model, stage, b, gpu, ctx, zipf) -> float:
    return stage_floor(model, stage, b, gpu, context_len=ctx, zipf_s=zipf).floor_us


def stage_cost_us(inp: Inputs, on: frozenset, b: int, partition: str | None = None,
                  graph_max_bs: int | None = None) -> list[float]:
    """Forward time of each stage for a micro-batch of b requests under the switches."""
    stages = pp_partition(inp.model.num_layers, inp.pp,
                          partition if partition is not None else inp.layer_partition)
    max_bs = graph_max_bs or inp.graph_max_bs
    launch = "launch_overhead" in on
    pad = padded(b, max_bs) if inp.graphs else None
    b_run = pad if (launch and pad is not None) else b
    eager = launch and pad is None
    zipf = inp.zipf_s if "routing_skew" in on else 0.0
    out = []
    for st in stages:
        floor = _floor(inp.model, st, b_run, inp.gpu, inp.context_len, zipf)
        if "kernel_efficiency" in on:
            curve = inp.stage_eff[st.index] if inp.stage_eff else inp.eff_curve
            floor /= max(1e-3, interp_log(curve, b_run))
        if eager:
            floor += st.num_layers * interp_log(inp.eager_curve, b)
        out.append(floor)
    if "stage_imbalance" not in on:
        out = [sum(out) / len(out)] * len(out)
    return out


def hop_us(inp: Inputs, b: int) -> float:
    if inp.hop_curve:
        return interp_log(inp.hop_curve, b)
    nbytes = b * 4 * inp.model.hidden  # hidden states + residual, bf16
    return inp.hop_fixed_us + nbytes / (inp.gpu.link_gbps * 1e9) * 1e6


def _split_largest(sizes: list[int], m: int) -> list[int]:
    out = sorted((s for s in sizes if s > 0), reverse=True)
    while len(out) < m and out and out[0] > 1:
        big = out.pop(0)
        out += [-(-big // 2), big // 2]
        out.sort(reverse=True)
    return out


def _place(sizes: list[int], n_slots: int, pp: int, depth: int) -> list[int]:
    """Put micro-batches in evenly spaced slots of the round-robin."""
    cfg = SlotConfig(pp, depth, max(1, max(sizes) if sizes else 1))
    pos = even_slots(cfg, len(sizes))
    out = [0] * n_slots
    for p, s in zip(pos, sizes):
        out[p] = s
    return out


def admitted_sizes(inp: Inputs, C: int, cap: int | None = None, depth: int | None = None,
                   arrival: str | None = None) -> list[int]:
    """Slot sizes the admission policy produces (reports/base/slots.py, same as the dispatch probe)."""
    depth = inp.async_depth if depth is None else depth
    cfg = SlotConfig(inp.pp, depth, cap or inp.max_micro_batch)
    arrival = arrival or inp.arrival
    policy = "even" if arrival == "even" else "sglang"
    visits = [0.0] * (cfg.slots * (C + 1))  # burst: everyone is waiting at the first visit
    return slot_sizes_of(initial_assignment([0.0] * C, cfg, policy, visits), cfg)


def slot_sizes(inp: Inputs, C: int, on: frozenset, cap: int | None = None,
               depth: int | None = None, arrival: str | None = None) -> list[int]:
    depth = inp.async_depth if depth is None else depth
    n_slots = inp.pp + depth
    actual = admitted_sizes(inp, C, cap, depth, arrival)
    if "slot_imbalance" in on and "too_few_microbatches" in on:
        return actual
    occupied = [s for s in actual if s > 0]
    total = sum(occupied)
    m = len(occupied)
    if "too_few_microbatches" not in on:
        m = min(max(m, min(total, inp.pp)), n_slots)
    if "slot_imbalance" in on:
        sizes = _split_largest(occupied, m)
    else:
        sizes = [total // m + (1 if k < total % m else 0) for k in range(m)]
    return _place(sizes, n_slots, inp.pp, depth)


def build(inp: Inputs, C: int, on: frozenset = ALL_ON, *, cap: int | None = None,
          depth: int | None = None, arrival: str | None = None, partition: str | None = None,
          graph_max_bs: int | None = None) -> tuple[LoopConfig, list[int]]:
    depth = inp.async_depth if depth is None else depth
    sizes = slot_sizes(inp, C, on, cap, depth, arrival)
    bmax = max(sizes)
    table = [[0.0] * inp.pp] + [stage_cost_us(inp, on, b, partition, graph_max_bs)
                                for b in range(1, bmax + 1)]
    stage = tuple(tuple(row[i] for row in table) for i in range(inp.pp))
    if "p2p_hops" in on:
        hop_row = tuple([0.0] + [hop_us(inp, b) for b in range(1, bmax + 1)])
        ret_row = tuple([0.0] + [hop_us(inp, 1)] * bmax)  # sampled token ids: tiny
    else:
        hop_row = ret_row = tuple([0.0] * (bmax + 1))
    host = "host_dispatch" in on
    cfg = LoopConfig(stage_us=stage, hop_us=tuple([hop_row] * (inp.pp - 1) + [ret_row]),
                     async_depth=depth, host_us=inp.host_us if host else 0.0,
                     empty_us=inp.empty_us if host else 0.0,
                     chain_us=inp.chain_us if host else 0.0)
    return cfg, sizes


# Keyed on id(inp) (Inputs holds lists, so it is not hashable); each entry keeps its `inp`
# alive so that id cannot be reused by another Inputs while the entry exists.
_CACHE: dict = {}


def run(inp: Inputs, C: int, on: frozenset = ALL_ON, keep_spans: bool = False,
        **overrides) -> SimResult:
    key = (id(inp), C, on, keep_spans, tuple(sorted(overrides.items())))
    if key not in _CACHE:
        if len(_CACHE) > 50000:
            _CACHE.clear()
        cfg, sizes = build(inp, C, on, **overrides)
        _CACHE[key] = (inp, simulate(cfg, sizes, keep_spans=keep_spans))
    return _CACHE[key][1]
