"""Model inputs + on/off switches -> one pipeline-model run.

Each switch turns one named effect on (as measured/estimated) or off (ideal):

| switch | off (ideal) | on |
|---|---|---|
| slow_stage | every stage costs the mean stage | the real layer split + extras |
| kernel_efficiency | the roofline floor | floor / efficiency |
| launch_gaps | no graph padding, no eager launches | padding to the captured size; eager above graph max bs |
| hop | hops cost nothing | hop cost by batch |
| host | no CPU time, no gloo latency | CPU per slot visit (schedule, launch, result, empty visit) + the relay's gloo messages |
| token_return | tokens straight back to rank 0 | SGLang's return: held `depth` iterations on the last rank, queued on the schedule stream, every rank synced on the next slot's outputs |
| herd | the same requests in equal micro-batches, evenly spaced (`slots.herd_off_sizes`) | the admission rule's sizes |
| routing_skew | uniform routing | Zipf skew from the scenario |

The names are the causes of reports/model/causes.py, shared with the observed diagnosis.

All off = `ideal`; all on = `modelled`. Slot sizes come from SGLang's admission rule
(reports/base/slots.py: per-slot cap, request rows, prefill token budget) for a burst of C
requests of the scenario's prompt length; with lengths that differ (`range_ratio` < 1), from the
occupancy a closed-loop benchmark drifts to (`slots.closed_loop`), the loop run for slot-size
snapshots evenly spaced in time and combined by time (tokens and time add up). `run()` memoises on the built loop, so
Shapley's 2^9 subsets are cheap where switches change nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from reports.base.cuda_graphs import padded
from reports.base.partition import pp_partition
from reports.model.sim.pipeline_model import LoopConfig, SimResult, run_key, simulate
from reports.base.roofline import stage_floor
from reports.base.interp import interp_log
from reports.model.causes import SCENARIO
from reports.model.scenario.inputs import Inputs
from reports.model.settings_change import (GRAPH_MAX_BS, LAYER_PARTITION, PACING, Change,
                                           apply, value_of)
from reports.base.server_settings import ServerSettings
from reports.base.slots import (SlotConfig, burst_sizes, closed_loop, herd_off_sizes,
                                initial_assignment, slot_sizes_of)

SWITCHES = SCENARIO
ALL_ON = frozenset(SWITCHES)
# Drift: the closed-loop benchmark is followed for DRIFT_ROUNDS rounds (the second half kept)
# and the loop is run for DRIFT_SNAPSHOTS slot-size snapshots evenly spaced in that window.
DRIFT_SNAPSHOTS = 6
DRIFT_ROUNDS = 2000


@lru_cache(maxsize=20000)
def _floor(model, stage, b, gpu, ctx, zipf) -> float:
    return stage_floor(model, stage, b, gpu, context_len=ctx, zipf_s=zipf).floor_us


STAGE_SWITCHES = frozenset({"slow_stage", "kernel_efficiency", "launch_gaps", "routing_skew"})
_STAGE: dict = {}


def stage_cost_us(inp: Inputs, on: frozenset, b: int, partition: str | None = None,
                  graph_max_bs: int | None = None, mrr: int | None = None) -> list[float]:
    """Forward time of each stage for a micro-batch of b requests under the switches."""
    key = (id(inp), on & STAGE_SWITCHES, b, partition, graph_max_bs, mrr)
    if key not in _STAGE:
        if len(_STAGE) > 100000:
            _STAGE.clear()
        _STAGE[key] = (inp, _stage_cost_us(inp, on, b, partition, graph_max_bs, mrr))
    return list(_STAGE[key][1])


def _stage_cost_us(inp: Inputs, on: frozenset, b: int, partition: str | None,
                   graph_max_bs: int | None, mrr: int | None) -> list[float]:
    stages = pp_partition(inp.model.num_layers, inp.pp,
                          partition if partition is not None else inp.layer_partition)
    max_bs = graph_max_bs or inp.graph_max_bs
    launch = "launch_gaps" in on
    pad = padded(b, max_bs, mrr or inp.max_running_requests) if inp.graphs else None
    b_run = pad if (launch and pad is not None) else b
    eager = launch and pad is None
    zipf = inp.zipf_s if "routing_skew" in on else 0.0
    out = []
    for st in stages:
        floor = _floor(inp.model, st, b_run, inp.gpu, inp.mean_context_tokens, zipf)
        if "kernel_efficiency" in on:
            curve = inp.stage_eff[st.index] if inp.stage_eff else inp.eff_curve
            floor /= max(1e-3, interp_log(curve, b_run))
        if eager:
            floor += st.num_layers * interp_log(inp.eager_curve, b)
        out.append(floor)
    if "slow_stage" not in on:
        out = [sum(out) / len(out)] * len(out)
    return out


def hop_us(inp: Inputs, b: int) -> float:
    if inp.hop_curve:
        return interp_log(inp.hop_curve, b)
    nbytes = b * 4 * inp.model.hidden  # hidden states + residual, bf16
    return inp.hop_fixed_us + nbytes / (inp.gpu.link_gbps * 1e9) * 1e6


@dataclass(frozen=True)
class Changed:
    """The scenario simulator's adapter for a list of `Change`s: the server settings with the
    server flags applied, and the knobs that are not server settings (None: as deployed)."""
    server: ServerSettings
    arrival: str | None = None
    partition: str | None = None
    graph_max_bs: int | None = None

    @classmethod
    def of(cls, inp: Inputs, changes: Sequence[Change] = (), arrival: str | None = None
           ) -> "Changed":
        paced = value_of(changes, PACING)
        gmb = value_of(changes, GRAPH_MAX_BS)
        return cls(apply(inp.server, changes), paced if paced is not None else arrival,
                   value_of(changes, LAYER_PARTITION), None if gmb is None else int(gmb))

    @property
    def slot_config(self) -> SlotConfig:
        return SlotConfig.of(self.server)

    @property
    def depth(self) -> int:
        return self.server.pp_async_batch_depth


def _policy(inp: Inputs, arrival: str | None) -> str:
    """`even`: ppscope's even split (a what-if); `trickle`: SGLang's admission with one request
    reaching the scheduler per slot visit; else SGLang's admission of a burst."""
    a = arrival or inp.arrival
    return a if a in ("even", "trickle") else "sglang"


def occupancy(inp: Inputs, C: int, changes: Sequence[Change] = (), arrival: str | None = None
              ) -> list[tuple[tuple[int, ...], float]]:
    """(slot sizes, weight) the loop runs with: the burst split, or with `range_ratio` < 1 the
    closed-loop drift's snapshots evenly spaced in time (equal weights)."""
    ch = Changed.of(inp, changes, arrival)
    cfg = ch.slot_config
    policy = _policy(inp, ch.arrival)
    if policy == "trickle":
        return [(_trickle(cfg, C, inp.prompt_len), 1.0)]
    if inp.range_ratio >= 1 or policy == "even":
        return [(_burst(cfg, C, inp.prompt_len, policy), 1.0)]
    snaps = [s for s in _drift(cfg, C, inp.prompt_len, inp.output_len, inp.range_ratio)
             if sum(s)]
    return [(s, 1.0 / len(snaps)) for s in snaps] or [(_burst(cfg, C, inp.prompt_len,
                                                              policy), 1.0)]


@lru_cache(maxsize=4096)
def _burst(cfg: SlotConfig, C: int, prompt_len: int, policy: str) -> tuple[int, ...]:
    return tuple(burst_sizes(C, cfg, prompt_len, policy))


@lru_cache(maxsize=4096)
def _trickle(cfg: SlotConfig, C: int, prompt_len: int) -> tuple[int, ...]:
    """The C requests reach the scheduler one per slot visit (a client that opens its streams
    one after another, or a tokenizer handing a burst over one by one): SGLang's admission then
    puts them in consecutive slots."""
    visits = [float(v) for v in range(cfg.slots * (C + 2) + 2 * C)]
    return tuple(slot_sizes_of(initial_assignment([float(i) for i in range(C)], cfg, "sglang",
                                                  visits, prompt_lens=prompt_len), cfg))


@lru_cache(maxsize=256)
def _drift(cfg: SlotConfig, C: int, prompt_len: int, output_len: int,
           range_ratio: float) -> tuple[tuple[int, ...], ...]:
    occ = closed_loop(cfg, C, prompt_len, output_len, range_ratio, rounds=DRIFT_ROUNDS)
    return tuple(occ.sample(DRIFT_SNAPSHOTS))


def admitted_sizes(inp: Inputs, C: int, changes: Sequence[Change] = (),
                   arrival: str | None = None) -> list[int]:
    """Slot sizes the admission rule produces (the most frequent ones under drift); the same
    rule as the dispatch probe (reports/base/slots.py)."""
    return list(occupancy(inp, C, changes, arrival)[0][0])


def switched_sizes(actual: Sequence[int], on: frozenset, pp: int) -> list[int]:
    """Slot sizes under the herd switch: as admitted, or (off) the same requests in equal
    micro-batches, evenly spaced over the slots (`slots.herd_off_sizes`, the observed
    diagnosis's rule too)."""
    return list(actual) if "herd" in on else list(herd_off_sizes(actual, pp))


def loop_config(inp: Inputs, on: frozenset, bmax: int, *, depth: int | None = None,
                partition: str | None = None, graph_max_bs: int | None = None,
                mrr: int | None = None) -> LoopConfig:
    depth = inp.async_depth if depth is None else depth
    table = [[0.0] * inp.pp] + [stage_cost_us(inp, on, b, partition, graph_max_bs, mrr)
                                for b in range(1, bmax + 1)]
    stage = tuple(tuple(row[i] for row in table) for i in range(inp.pp))
    if "hop" in on:
        hop_row = tuple([0.0] + [hop_us(inp, b) for b in range(1, bmax + 1)])
        ret_row = tuple([0.0] + [hop_us(inp, 1)] * bmax)  # sampled token ids: tiny
    else:
        hop_row = ret_row = tuple([0.0] * (bmax + 1))
    host = "host" in on
    return LoopConfig(stage_us=stage, hop_us=tuple([hop_row] * (inp.pp - 1) + [ret_row]),
                      async_depth=depth, host_us=inp.host_us if host else 0.0,
                      empty_us=inp.empty_us if host else 0.0,
                      chain_us=inp.chain_us if host else 0.0,
                      launch_us=inp.launch_us if host else 0.0,
                      process_us=inp.process_us if host else 0.0,
                      token_return="token_return" in on)


def build(inp: Inputs, C: int, on: frozenset = ALL_ON, *, changes: Sequence[Change] = (),
          arrival: str | None = None) -> list[tuple[LoopConfig, list[int], float]]:
    """(loop, slot sizes, weight) per occupancy snapshot (one without drift)."""
    ch = Changed.of(inp, changes, arrival)
    out = []
    for sizes, w in occupancy(inp, C, changes, arrival):
        sz = switched_sizes(sizes, on, inp.pp)
        cfg = loop_config(inp, on, max(sz), depth=ch.depth, partition=ch.partition,
                          graph_max_bs=ch.graph_max_bs, mrr=ch.server.max_running_requests)
        out.append((cfg, sz, w))
    return out


_SIMS: dict = {}


def _sim(cfg: LoopConfig, sizes: tuple[int, ...], keep_spans: bool) -> SimResult:
    # one run per loop as the simulator reads it (pipeline_model.run_key): Shapley's subsets
    # and the what-ifs build many loops that differ only at batch sizes no slot holds
    key = (run_key(cfg, sizes), sizes, keep_spans)
    if key not in _SIMS:
        if len(_SIMS) > 20000:
            _SIMS.clear()
        _SIMS[key] = simulate(cfg, sizes, keep_spans=keep_spans)
    return _SIMS[key]


def combine(parts: list[tuple[SimResult, float]]) -> SimResult:
    """Snapshots weighted by the rounds they were seen: tokens and time add up."""
    if len(parts) == 1:
        return parts[0][0]
    time = sum(w * r.tpot_ms for r, w in parts)
    toks = sum(w * sum(r.slot_sizes) for r, w in parts)
    top = max(parts, key=lambda x: x[1])[0]
    busy = tuple(sum(w * r.tpot_ms * r.busy_frac[i] for r, w in parts) / time
                 for i in range(len(top.busy_frac)))
    return SimResult(toks / time * 1e3, time / sum(w for _, w in parts), busy, top.slot_sizes,
                     top.spans)


# Keyed on id(inp) (Inputs holds lists, so it is not hashable); each entry keeps its `inp`
# alive so that id cannot be reused by another Inputs while the entry exists.
_CACHE: dict = {}


def run(inp: Inputs, C: int, on: frozenset = ALL_ON, keep_spans: bool = False, *,
        changes: Sequence[Change] = (), arrival: str | None = None) -> SimResult:
    """The loop at C under the switches `on`, with `changes` (reports/model/settings_change.py)
    applied and the clients arriving as `arrival` (None: the scenario's)."""
    changes = tuple(changes)
    key = (id(inp), C, on, keep_spans, changes, arrival)
    if key not in _CACHE:
        if len(_CACHE) > 50000:
            _CACHE.clear()
        parts = [(_sim(cfg, tuple(sizes), keep_spans), w)
                 for cfg, sizes, w in build(inp, C, on, changes=changes, arrival=arrival)]
        _CACHE[key] = (inp, combine(parts))
    return _CACHE[key][1]
