"""The deployment the evidence describes: SGLang's own artefacts -> the pipeline model's inputs.

When `results/sglang.json` holds a loop profile (per-rank traces read by `ppscope sglang
--traces`, microbench/sglang/steps.py), the report models *that* server, not the scenario:

| input | from (observed) | else |
|---|---|---|
| pipeline size | traced ranks | given (scenario / flags) |
| forward time per rank by micro-batch size | GPU time of each `run_batch` (first kernel start to last kernel end) + GPU queueing behind work the trace does not show, mean by size | - |
| forward without launch gaps | union of that forward's kernels (+ the same queueing) | - |
| host work per visit with a batch | ready (input, previous forward, CPU free) -> first launch, minus blocked time, mean | - |
| request-list relay and waits on the GPU | CPU blocked in gloo sends / CUDA synchronisations inside that window, mean | - |
| hop per link | input on the GPU - upstream forward end, mean; plus the sender's wait for its send | - |
| slots and occupancy | iterations / forwards on rank 0, and C / mean micro-batch | given async depth |
| micro-batch sizes | the benchmark's first burst of C arrivals in the log (its prefill waves on the slot loop, reports/model/observed/bursts.py), else hidden-state receive sizes (traces; on the CPU the rounds that held the most requests) or `#running-req` (log) | - |
| graph share | forwards launched through `cudaGraphLaunch` | - |
| tok/s | bench_serving / live probe / `--observed` | - |

SGLang's CPU backend (traces without GPU events, microbench/sglang/cpu_steps.py): the forward is
each `run_batch` range, sized by its `step[DECODE bs=N]` span; host work is the iteration minus
the forward, the blocked gloo receives, `process_batch_result` (modelled after the forward, as
SGLang runs it) and the hidden-state send (part of the hop); waiting is never an input (the
model reproduces it); the slot count comes from SGLang's idle-pass markers.

Means, not medians, feed the model: throughput is total time over count, so a heavy tail
(contention, a starved CPU) counts in full. Sizes the trace never ran (needed when the herd is spread out) are interpolated between
observed sizes, else the nearest observed size scaled by the served model's own shape (a MoE
model's roofline bytes ratio; a model the evidence does not name: held flat), never the
scenario's model (labelled `estimated`). Empty visits are costed per rank (SGLang 0.5.23
managers/scheduler_pp_mixin.py `event_loop_pp` runs the whole visit on an empty slot too). Nothing is fitted to the
observed tok/s: `unexplained` is what the model of the observed loop does not reproduce.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median_low

from reports.model.observed.bursts import BURST_SOURCE, wave_slot_sizes, first_burst
from reports.model.causes import CAUSES as CAUSES_BY_NAME, OBSERVED
from reports.base.payloads.sglang import LoopProfile
from reports.base.schema import to_json
from reports.model.observed.resample import WindowBlocks, blocks_of
from reports.model.sim.pipeline_model import LoopConfig, SimResult, simulate
from reports.base.server_settings import slot_count
from reports.base.slots import herd_off_sizes


@dataclass(frozen=True)
class Deployment:
    """The observed loop, ready to simulate. Times in microseconds."""
    pp: int
    slots: int
    sizes: tuple[int, ...]                        # requests per slot, one entry per slot
    forward: tuple[dict[int, float], ...]          # per rank: batch -> forward us (span)
    forward_busy: tuple[dict[int, float], ...]     # per rank: batch -> kernels only
    host_us: tuple[float, ...]                     # per rank, CPU work per visit with a batch
    relay_us: tuple[float, ...]                    # per rank, blocked in the request-list relay
    sync_wait_us: tuple[float, ...]                # per rank, blocked waiting for the GPU (comm)
    # per rank: CPU work / relay wait per empty visit. SGLang 0.5.23 runs the whole visit on
    # an empty slot too, on every rank (managers/scheduler_pp_mixin.py `event_loop_pp`:
    # recv_requests, get_next_batch_to_run, the output exchange), so a host delay in
    # get_next_batch_to_run is spent on empty visits of that rank as well
    empty_us: tuple[float, ...]
    empty_relay_us: tuple[float, ...]
    hop_us: tuple[float, ...]                      # hop r -> r+1; last entry: last -> rank 0
    send_wait_us: tuple[float, ...]                # per rank: next forward waits for its send
    graph_share: float | None
    concurrency: int
    observed_tok_per_s: float | None
    sources: dict[str, str] = field(default_factory=dict)   # input -> observed|given|estimated
    notes: tuple[str, ...] = ()
    time_split: dict[str, dict[str, float | None]] = field(default_factory=dict)
    # SGLang's CPU backend (microbench/sglang/cpu_steps.py): forwards run on each rank's CPU;
    # send_us: per rank, the CPU time of the hidden-state send (part of the hop)
    device: str = "gpu"
    send_us: tuple[float, ...] = ()
    process_us: tuple[float, ...] = ()     # per rank, after the forward (CPU view only)
    # requests the traced window ran per round of the slot loop (window_load); None: unknown
    window_concurrency: float | None = None
    # each rank's decoder layers per forward: counted in a window profiled with stacks (CPU
    # view), else SGLang's partition rule over the model's layers (`layers_from` says which);
    # ()`: unknown. `layer_us`: one layer's time by micro-batch size, the mean over the ranks,
    # where the stacks time it (CPU view); {}: not timed, a layer's cost is then estimated from
    # each rank's forward (reports/model/observed/layer_split.py moves layers between ranks)
    layers: tuple[int, ...] = ()
    layer_us: dict[int, float] = field(default_factory=dict)
    layers_from: str | None = None
    # the traced window's blocks (reports/model/observed/resample.py): the intervals' source;
    # None: the reader kept none (a short window, an older sglang.json)
    blocks: WindowBlocks | None = None

    @property
    def occupied(self) -> int:
        return sum(1 for n in self.sizes if n)


class NoLoopEvidence(ValueError):
    """The evidence does not hold a loop profile the model can use (the message says why)."""


def at_size(curve: dict[int, float], b: int, shape=None) -> float:
    """Forward time at size b: observed where it was, else interpolated in log(b) between
    observed sizes, else the nearest observed size scaled by `shape(b) / shape(b_obs)` (a
    roofline-shaped extrapolation), else flat."""
    if b in curve:
        return curve[b]
    if not curve:
        raise ValueError("empty forward curve")
    pts = sorted(curve.items())
    lo = [p for p in pts if p[0] < b]
    hi = [p for p in pts if p[0] > b]
    if lo and hi:
        (b0, v0), (b1, v1) = lo[-1], hi[0]
        w = (math.log(b) - math.log(b0)) / (math.log(b1) - math.log(b0))
        return v0 + w * (v1 - v0)
    b0, v0 = (lo[-1] if lo else hi[0])
    if shape is not None:
        s0 = shape(b0)
        if s0 > 0:
            return v0 * shape(b) / s0
    return v0


# the traced window's load is not the benchmark's when its requests in flight differ from C by
# more than this (a window of a warm-up, a tail or another C)
WINDOW_OFF = 0.25


def window_load(x, slots: int) -> float | None:
    """Requests the traced window ran per round of the slot loop on one rank: the mean decode
    micro-batch x the decode forwards per round (slots x decode forwards / iterations; SGLang
    visits every slot once per round, managers/scheduler_pp_mixin.py `event_loop_pp`)."""
    counts = x.curve("forward_count_by_batch", None)
    n = sum(counts.values())
    if not (n and x.iterations):
        return None
    return sum(b * c for b, c in counts.items()) / n * slots * x.forwards / x.iterations


def window_differs(w: float | None, C: int, batches) -> str | None:
    """Why the traced window (`w` requests in flight, decode micro-batch sizes `batches`) is not
    the benchmark's load at C, in words, or None when it is."""
    if w is None or not C or abs(w - C) <= WINDOW_OFF * C:
        return None
    sizes = "/".join(str(k) for k in sorted(int(b) for b in batches))
    return (f"the traced window is not the benchmark's load: it ran about {w:.0f} request(s) "
            f"in flight (decode micro-batches of {sizes}) against the benchmark's C={C} (a "
            f"warm-up, a tail or another C); profile again once the load has reached C")


def _sizes(counts: dict[int, float], concurrency: int, slots: int) -> tuple[int, ...]:
    """The observed distribution of micro-batch sizes over m = C / mean size occupied slots,
    their total fixed to C, evenly spaced over the slot loop."""
    n_mean = sum(b * c for b, c in counts.items()) / sum(counts.values())
    m = max(1, min(slots, round(concurrency / n_mean)))
    total = sum(counts.values())
    sizes: list[int] = []
    for b, c in sorted(counts.items(), key=lambda kv: -kv[1]):
        sizes += [b] * int(round(m * c / total))
    sizes = sorted(sizes, reverse=True)[:m] or [max(1, round(n_mean))]
    while len(sizes) < m:
        sizes.append(sizes[-1])
    k = 0
    while sum(sizes) != concurrency and k < 10 * concurrency:
        i = k % len(sizes)
        sizes[i] += 1 if sum(sizes) < concurrency else (-1 if sizes[i] > 1 else 0)
        k += 1
    out = [0] * slots
    for k, n in enumerate(sizes):
        out[(k * slots) // len(sizes)] = n
    return tuple(out)


def from_evidence(loop: LoopProfile | None, *, concurrency: int | None, observed: float | None,
                  async_depth: int | None = None, shape=None,
                  depth_stated: bool = False) -> Deployment:
    """Build the observed deployment from an sglang record's loop profile
    (`SglangData.loop`). `concurrency`: the client's streams while it was traced.
    `depth_stated`: `async_depth` is the server's own setting (its start-up arguments), so
    the slot count is pp + async_depth, not inferred from the traces."""
    ranks = loop.ranks if loop is not None else {}
    if len(ranks) < 2:
        raise NoLoopEvidence("no loop profile of two or more ranks in sglang.json "
                             "(read the per-rank traces with `ppscope sglang --traces DIR`)")
    order = sorted(ranks, key=int)
    rk = [ranks[r] for r in order]
    pp = len(order)
    notes: list[str] = []
    src: dict[str, str] = {"pp": "observed"}
    # effective forward: first kernel to last, plus the GPU queueing behind work the trace does
    # not show (another process); busy (kernels only, + that queueing): the launch-gap reference
    fw = [x.curve("forward_effective_us_by_batch", concurrency)
          or x.curve("forward_us_by_batch", concurrency) for x in rk]
    fb = [{b: v + (x.foreign_queue_us_mean or 0.0)
           for b, v in x.curve("forward_busy_us_by_batch", concurrency).items()} or dict(f)
          for x, f in zip(rk, fw)]
    if not all(fw):
        raise NoLoopEvidence("a traced rank ran no decode forward the profile could size")
    # the sizes of the rounds that held the most requests where the reader gives them (the
    # window's ramp and tail left out), else every decode forward's
    counts = {b: float(c) for b, c in (rk[0].curve("forward_count_full_by_batch", concurrency)
                                        or rk[0].curve("forward_count_by_batch", concurrency)
                                        ).items()}
    if not (counts and concurrency):
        raise NoLoopEvidence("no micro-batch sizes in the traces, or no client concurrency "
                             "(pass --model and --concurrency to `ppscope sglang`)")
    n_mean = sum(b * c for b, c in counts.items()) / sum(counts.values())
    # slots: occupied micro-batches m = C / mean size; slots = m x iterations per forward
    slots = None
    marked = [x.slots for x in rk if x.slots]
    if depth_stated and async_depth is not None:
        slots, src["slots"] = slot_count(pp, async_depth), "observed (server setting)"
    elif marked:        # SGLang's own idle-pass markers: pp_loop_size iterations per pass
        slots = max(pp, max(set(marked), key=marked.count))
        src["slots"] = "observed"
    elif rk[0].forwards and rk[0].iterations:
        m = max(1, round(concurrency / n_mean))
        slots = max(pp, round(m * rk[0].iterations / rk[0].forwards))
        src["slots"] = "observed"
    elif async_depth is not None:
        slots, src["slots"] = slot_count(pp, async_depth), "given"
    if slots is None:
        raise NoLoopEvidence("cannot tell the slot count: no loop iterations in the traces "
                             "and no --async-depth")
    if async_depth is not None and slot_count(pp, async_depth) != slots:
        notes.append(f"the traces show {slots} slots; the given async depth {async_depth} "
                     f"implies {slot_count(pp, async_depth)}: the traces are used")
    sizes = _sizes(counts, concurrency, slots)
    src["sizes"] = "observed"
    # the benchmark's own micro-batches where the log shows its first burst of C arrivals: the
    # traced window is a run of its own, with its own burst (reports/model/observed/bursts.py)
    burst = first_burst(loop.bursts, concurrency)
    bench = wave_slot_sizes(burst.waves, slots) if burst is not None else None
    if bench is not None and sum(bench) == concurrency:
        if bench != sizes:
            notes.append(f"micro-batches {'-'.join(map(str, bench))}: the benchmark's first "
                         f"burst in the server's log, not the traced window's "
                         f"{'-'.join(map(str, sizes))}")
        sizes, src["sizes"] = bench, BURST_SOURCE

    def per_rank(name: str) -> tuple[float, ...]:
        return tuple(float(getattr(x, name) or 0.0) for x in rk)
    empty = empty_visit_us(rk, order, 0 in sizes, notes)
    if empty is not None:
        src["empty visits"] = "estimated"
    hop = []
    for k, r in enumerate(order):
        nxt = order[(k + 1) % pp]
        h = loop.hops.get(f"{r}->{nxt}")
        hop.append(h.mean_us if h is not None and h.mean_us is not None else 0.0)
        if h is None:
            notes.append(f"hop {r}->{nxt}: not seen in the traces; taken as 0")
    f = sum(x.forwards for x in rk)
    on_cpu = loop.device == "cpu" or any(x.device == "cpu" for x in rk)
    if on_cpu:
        src["device"] = "observed"
    return Deployment(
        pp=pp, slots=slots, sizes=sizes, forward=tuple(fw), forward_busy=tuple(fb),
        host_us=per_rank("host_us_mean"), relay_us=per_rank("relay_wait_us_mean"),
        sync_wait_us=per_rank("sync_wait_us_mean"),
        empty_us=empty if empty is not None else per_rank("host_us_empty_mean"),
        empty_relay_us=per_rank("relay_wait_us_empty_mean"), hop_us=tuple(hop),
        send_wait_us=per_rank("send_wait_us_mean"),
        graph_share=sum(x.graph_forwards for x in rk) / f if f else None,
        concurrency=int(concurrency), observed_tok_per_s=observed,
        sources={**src, "forward": "observed", "host": "observed", "hop": "observed"},
        notes=tuple(notes),
        time_split={r: to_json(x.time_split) or {} for r, x in zip(order, rk)},
        device="cpu" if on_cpu else "gpu",
        send_us=per_rank("send_us_mean") if on_cpu else (),
        process_us=per_rank("process_us_mean") if on_cpu else (),
        # rounds of the server's own slot count where its setting is known: a slot count
        # inferred from the traces assumes the window ran C
        window_concurrency=window_load(rk[0], slot_count(pp, async_depth)
                                       if async_depth is not None else slots),
        blocks=blocks_of(loop, order), **_layers(rk, loop, on_cpu))


def empty_visit_us(rk, order, needed: bool, notes: list[str]) -> tuple[float, ...] | None:
    """Each rank's CPU per empty visit where the traced window saw none (every slot held a
    batch), else None (the observed means are used). SGLang runs the whole visit on an empty
    slot too (`event_loop_pp`), so a rank's host work in `recv_requests`, the request relay
    and `get_next_batch_to_run` (its scheduler's own delay included) is spent there as well;
    what the empty visit skips is the batch's own preparation. Estimated as the midpoint of
    its two bounds seen on the visits with a batch: those phases alone (below) and the whole
    visit's host work (above). `needed`: the modelled loop has an empty slot, so the estimate
    matters (said in a note)."""
    if any(x.iterations_empty for x in rk):
        return None
    lo = [x.host_us_every_visit_mean for x in rk]
    hi = [x.host_us_mean for x in rk]
    if any(v is None for v in lo + hi):
        if needed:
            notes.append("empty visits: the traced window saw none and its reader measured no "
                         "phase every visit runs; taken as no CPU work")
        return None
    est = tuple((a + b) / 2 for a, b in zip(lo, hi))
    if needed:
        notes.append("empty visits: the traced window saw none (every slot held a batch); "
                     "each rank's CPU per empty visit estimated from its visits with a batch, "
                     "between the phases every visit runs and the whole visit's host work: "
                     + ", ".join(f"rank {r} {e:.0f} us ({a:.0f}-{b:.0f})"
                                 for r, e, a, b in zip(order, est, lo, hi)))
    return est


def _layers(rk, loop: LoopProfile, on_cpu: bool) -> dict:
    """Deployment's `layers`, `layer_us` and `layers_from`: the layers counted and timed where
    a window with stacks times every rank's decoder layers on the CPU (on a GPU the module
    events time the launches, not the device's work); else the layers SGLang's own rule gives
    each rank (SGLang 0.5.23 srt/distributed/utils.py `get_pp_indices`: SGLANG_PP_LAYER_PARTITION
    where set, else the even split, the last ranks one layer more; reports/base/partition.py)
    over the model's layer count, where the evidence has it; else nothing."""
    curves = [x.curve("layer_us_by_batch", None) for x in rk]
    if on_cpu and all(x.layers_per_forward for x in rk) and all(curves):
        sizes = sorted(set().union(*curves))
        return {"layers": tuple(int(x.layers_per_forward) for x in rk),
                "layer_us": {b: sum(at_size(c, b) for c in curves) / len(curves)
                             for b in sizes},
                "layers_from": "counted in the traces (module events, a window with stacks)"}
    total = loop.num_layers or _preset_layers(loop.model)
    if not total:
        return {}
    from reports.base.partition import layer_counts
    try:
        counts = layer_counts(total, len(rk), loop.layer_partition)
    except ValueError:
        return {}
    how = (f"SGLANG_PP_LAYER_PARTITION={loop.layer_partition} (as given)"
           if loop.layer_partition else
           f"SGLang's even split of the model's {total} layers (get_pp_indices; "
           "SGLANG_PP_LAYER_PARTITION not given)")
    return {"layers": tuple(counts), "layers_from": how}


def _preset_layers(model: str | None) -> int | None:
    """The layer count of the model `ppscope sglang --model` named, for a record written before
    it kept the count itself; None where it cannot be read here."""
    if not model:
        return None
    from reports.base.model_config import load_model
    try:
        return load_model(model).num_layers
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------ switches and the model

OBSERVED_CAUSES = OBSERVED   # reports/model/causes.py: one vocabulary with the scenario model
LABELS = {c: CAUSES_BY_NAME[c].label for c in OBSERVED_CAUSES}
REFERENCE = {
    "slow_stage": "every rank at the lower median rank's forward time",
    "host": "no host work on the critical path",
    "relay": "the request list relayed without blocking",
    "herd": CAUSES_BY_NAME["herd"].reference,
    "launch_gaps": "each forward as long as its kernels (no gaps between launches)",
    "hop": "hops cost nothing, nothing waits on communication",
}


def loop_config(dep: Deployment, on: frozenset, shape=None) -> tuple[LoopConfig, list[int]]:
    """The observed loop with the causes in `on` as observed and the others at REFERENCE, in
    SGLang's loop order (reports/model/sim/pipeline_model.py: every rank syncs on the returned
    tokens, the last rank holds them `depth` iterations). A loop that does not hold them (the
    PP-loop probe before it followed SGLang here) is modelled slower than it ran when its hops
    are slow: the held send then queues behind a late receive the real loop never waited on."""
    sizes = list(dep.sizes)
    if "herd" not in on:
        sizes = list(herd_off_sizes(sizes, dep.pp))
    bmax = max(sizes)
    # forward = busy (kernels + queueing behind foreign work) + launch gaps; a slow stage is a
    # rank whose busy time is above the others', launch gaps are their own cause
    busy = [[0.0] + [at_size(c, b, shape) for b in range(1, bmax + 1)] for c in dep.forward_busy]
    gaps = [[0.0] + [max(0.0, at_size(f, b, shape) - at_size(c, b, shape))
                     for b in range(1, bmax + 1)]
            for f, c in zip(dep.forward, dep.forward_busy)]
    if "slow_stage" not in on:
        ref = [median_low([row[b] for row in busy]) for b in range(bmax + 1)]
        busy = [[min(row[b], ref[b]) for b in range(bmax + 1)] for row in busy]
    if "launch_gaps" not in on:
        gaps = [[0.0] * (bmax + 1) for _ in gaps]
    sw = dep.send_wait_us if "hop" in on else tuple(0.0 for _ in dep.send_wait_us)
    table = [[0.0] + [bu[b] + ga[b] + w for b in range(1, bmax + 1)]
             for bu, ga, w in zip(busy, gaps, sw)]
    hop = [tuple([0.0] + [h if "hop" in on else 0.0] * bmax) for h in dep.hop_us]
    host = tuple((h if "host" in on else 0.0) + (r if "relay" in on else 0.0)
                 + (w if "hop" in on else 0.0)
                 for h, r, w in zip(dep.host_us, dep.relay_us, dep.sync_wait_us))
    cfg = LoopConfig(stage_us=tuple(tuple(r) for r in table), hop_us=tuple(hop),
                     async_depth=dep.slots - dep.pp, host_us=0.0,
                     empty_us=tuple((e if "host" in on else 0.0)
                                    + (er if "relay" in on else 0.0)
                                    for e, er in zip(dep.empty_us, dep.empty_relay_us)),
                     rank_host_us=host, cpu_forward=dep.device == "cpu",
                     send_us=tuple(v if "hop" in on else 0.0 for v in dep.send_us),
                     process_us=tuple(v if "host" in on else 0.0 for v in dep.process_us)
                     if dep.process_us else 0.0)
    return cfg, sizes


def curve_shape(pts: list[tuple[int, float]]):
    """b -> a measured cost curve, piecewise linear in log(b), flat beyond its ends."""
    pts = sorted(pts)

    def f(b: float) -> float:
        if b <= pts[0][0]:
            return pts[0][1]
        if b >= pts[-1][0]:
            return pts[-1][1]  # flat: never extrapolate a slope
        for (b0, v0), (b1, v1) in zip(pts, pts[1:]):
            if b0 <= b <= b1:
                w = (math.log(b) - math.log(b0)) / (math.log(b1) - math.log(b0))
                return v0 + w * (v1 - v0)
        return pts[-1][1]
    return f


def moe_shape(model):
    """b -> bytes one MoE layer of `model` reads for b tokens (distinct experts touched + the
    fixed part): the shape used to carry an observed forward time to an unobserved size."""
    from reports.base.roofline import BYTES_ONLY_GPU, layer_floor
    if not getattr(model, "is_moe", False):
        return None
    return lambda b: layer_floor(model, "moe", max(1, int(b)), BYTES_ONLY_GPU).weight_bytes


def run(dep: Deployment, on: frozenset, shape=None, keep_spans: bool = False) -> SimResult:
    cfg, sizes = loop_config(dep, on, shape)
    return simulate(cfg, sizes, keep_spans=keep_spans)
