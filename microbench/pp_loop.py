"""One rank of a real pipeline-parallel decode loop with SGLang's discipline (run under torchrun).

What it measures: how the PP scheduler's loop itself costs time on real GPUs, separated from
kernels and from the model: per stage and per micro-batch, the time blocked waiting for input,
the *dispatch latency* (input available on the GPU -> first forward kernel starts), host time in
the loop body, GPU forward time and send time, plus slot occupancy and decode tok/s.

How (SGLang 0.5.23 managers/scheduler_pp_mixin.py, `event_loop_pp`): `pp + async_depth` slots
visited round-robin; rank 0 admits arrivals with `reports.base.slots.visit` (policy `sglang` or
`even`: per-slot cap, request rows, prefill token budget), a slot that admits runs that prefill
in its visit. Every iteration, on every rank, in SGLang's order (the functions under "Loop-order
mechanics"): rank r > 0 blocks on the pickled request list from rank r-1 (gloo) and sends it on
at once (async), empty slots included; a slot with a batch receives its hidden states (metadata
over gloo blocks the CPU, the tensor over NCCL makes the schedule stream wait); outputs are
exchanged -- before the forward when async_depth > 0 -- even ranks sending first: the last rank
sends the sampled tokens of the slot it ran `async_depth` iterations ago to rank 0, the other
ranks pass on what they received (last -> 0 -> 1 -> ...); the forward runs on its own stream
after the schedule stream; when slot s+1 holds a batch every rank blocks on the device-to-host
copy of its outputs (a CPU sync) before processing them; then the hidden states go to rank r+1
(metadata at once, the NCCL send after the forward's end event). Simplifications, on purpose:
requests never finish (steady decode); token ids stand for the whole output dict.

Stage work: `busy` (a `torch.cuda._sleep` kernel whose length follows a cost-vs-batch curve,
calibrated at start) or `moe` (real Kimi-K2-dims MoE layers in bf16: microbench.kernels.layers' MoE,
the layer stage-cost times, checked against its float32 per-expert reference first). MoE
backend as stage-cost picks it (`--moe-variant auto`, `moe_candidates`): the fused Triton
decode kernel (microbench/kernels/moe_triton.py; fixed-size index tensors, no host syncs, so it is
captured like the rest) where triton imports on a CUDA device and passes its check at every
block-size configuration the loop reaches, else torch `fast`, else the per-expert `loop`;
`triton|fast|plain` force one. The backend, the candidates tried and why any was dropped are
recorded per rank. With graphs on, the decode forward is
captured per SGLang capture size and batches are padded up; the next forward waits until NCCL
has finished reading the previous send (SGLang commits it on the schedule stream first).

Timing: host `perf_counter` (CLOCK_MONOTONIC, shared by the processes of one host) for host
quantities; CUDA events for GPU quantities, placed on the host clock through one reference event
per point (recorded then synchronized; error about +/- `ref_err_us`, written out).

Serve mode (config key `serve`): rank 0 binds the HTTP front-end before the stages are built,
the session is one point whose admission comes from HTTP clients (`serve_point`,
microbench/serve.py) and whose relayed request list also carries control commands, applied on
every rank at the same iteration (profiler start/stop through `RankProfiler`, the micro-batch
cap); requests finish after `max_tokens` and leave their slot. Only iterations with work are
kept as columns (the latest `max_iters_per_point`).

Run it through `ppscope dispatch` (microbench/dispatch.py writes the config file and merges the
per-rank outputs). Directly: `torchrun --nproc-per-node 2 -m microbench.pp_loop --config CFG.json
--out-dir DIR`; multi-node: the usual torchrun flags (`--nnodes`, `--node-rank`,
`--rdzv-endpoint`) with the same config on every node (host clocks then differ between nodes).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gzip
import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path

from reports.base.cuda_graphs import capture_sizes, padded  # SGLang's decode capture rule
from reports.base.interp import interp_linear
from microbench.kit.graph_capture import capture_graph
from microbench.kit.launch import recv_pyobj, send_pyobj, start_rank
from reports.base.records import write_json_atomic
from reports.base.sglang_defaults import MAX_PREFILL_TOKENS
from reports.base.slots import AdmitState, SlotConfig, Visit, visit


def parse_cost_curve(text: str) -> list[tuple[int, float]]:
    """'1:800,8:900,32:1200' -> [(1, 800.0), (8, 900.0), (32, 1200.0)] (batch: microseconds)."""
    pts = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        b, sep, us = part.partition(":")
        try:
            if not sep:
                raise ValueError
            bi, usf = int(b), float(us)
        except ValueError:
            raise ValueError(f"bad cost point {part!r}: expected BATCH:MICROSECONDS") from None
        if bi < 1 or not usf > 0 or not math.isfinite(usf):
            raise ValueError(f"bad cost point {part!r}: batch >= 1 and time > 0 required")
        pts.append((bi, usf))
    if not pts:
        raise ValueError("empty cost curve")
    pts.sort()
    if len({b for b, _ in pts}) != len(pts):
        raise ValueError("cost curve repeats a batch size")
    return pts


INJECT_KINDS = ("slow-stage", "host-delay", "hop-delay")


def parse_inject(specs, pp: int) -> dict:
    """`--inject` specs -> {"slow_stage": {rank: factor}, "host_delay_us": {rank: us},
    "hop_delay_us": us}. Forms: `slow-stage=RANK:FACTOR` (that rank's forward takes FACTOR
    times as long: an extra calibrated sleep kernel after it, inside `run_batch`),
    `host-delay=RANK:US` (that rank's host spins US microseconds per loop iteration, inside
    `get_next_batch_to_run` on ranks > 0; per visit with a batch), `hop-delay=US` (every hidden-state send leaves US later: a sleep
    kernel on a side stream the send waits on, so the sender's forward is not slowed)."""
    out = {"slow_stage": {}, "host_delay_us": {}, "hop_delay_us": 0.0}
    for spec in specs or ():
        kind, sep, val = str(spec).partition("=")
        if kind not in INJECT_KINDS or not sep:
            raise ValueError(f"--inject {spec!r}: expected one of slow-stage=RANK:FACTOR, "
                             "host-delay=RANK:US, hop-delay=US")
        try:
            if kind == "hop-delay":
                us = float(val)
                if not 0 <= us <= 1e6:
                    raise ValueError
                out["hop_delay_us"] = us
                continue
            r, sep2, x = val.partition(":")
            rank, v = int(r), float(x)
            if not sep2 or not 0 <= rank < pp:
                raise ValueError
        except ValueError:
            raise ValueError(f"--inject {spec!r}: bad value (rank 0..{pp - 1}, finite numbers)"
                             ) from None
        if kind == "slow-stage":
            if not 1.0 <= v <= 100.0:
                raise ValueError(f"--inject {spec!r}: FACTOR must be between 1 and 100")
            out["slow_stage"][rank] = v
        else:
            if not 0 <= v <= 1e6:
                raise ValueError(f"--inject {spec!r}: US must be between 0 and 1e6")
            out["host_delay_us"][rank] = v
    return out


def sglang_log_lines(res: dict, prompt_len: int, graphs_on: bool, capture: list[int],
                     clock_offset_s: float = 0.0) -> list[str]:
    """One rank's point as SGLang 0.5.x scheduler log lines (one per slot visit with a batch):
    `[time PPr] Decode batch, #running-req: N, #token: N, token usage: X, cuda graph: B, gen
    throughput (token/s): X, #queue-req: N, ` and `Prefill batch, #new-seq: N, #new-token: N,
    #cached-token: 0, token usage: X, #running-req: N, #queue-req: N, ` (layout of SGLang
    0.5.x `scheduler_metrics_mixin.py` log_decode_stats / log_prefill_stats, with
    SGLANG_LOG_MS-style milliseconds; logged at every visit, i.e. --decode-log-interval 1, so
    each line names the size of the slot just run). Throughput: decode tokens of this rank over
    the last slot-loop turn. Times are the loop's perf_counter + `clock_offset_s` (wall clock)."""
    c, rank, S = res["columns"], res["rank"], res["slots"]
    out, hist = [], []
    running = 0
    for i in range(len(c["it"])):
        n, kind, t = c["n"][i], c["kind"][i], c["t_end"][i]
        if kind == "idle" or not n:
            continue
        ts = datetime.datetime.fromtimestamp(t + clock_offset_s).strftime(
            "%Y-%m-%d %H:%M:%S.%f")[:-3]
        if kind == "prefill":
            out.append(f"[{ts} PP{rank}] Prefill batch, #new-seq: {n}, #new-token: "
                       f"{c['rows'][i]}, #cached-token: 0, token usage: 0.00, "
                       f"#running-req: {running}, #queue-req: 0, ")
            running += n
            continue
        hist.append((t, n))
        hist = hist[-S:]
        dt = hist[-1][0] - hist[0][0]
        tput = sum(x for _, x in hist[1:]) / dt if dt > 0 else 0.0
        graph = graphs_on and bool(capture) and padded(n, capture[-1]) is not None
        out.append(f"[{ts} PP{rank}] Decode batch, #running-req: {n}, #token: "
                   f"{n * (prompt_len + 1)}, token usage: 0.00, cuda graph: {graph}, "
                   f"gen throughput (token/s): {tput:.2f}, #queue-req: 0, ")
    return out


def interp_cost(pts: list[tuple[int, float]], b: float) -> float:
    """Linear interpolation in batch size; constant below the first point, linear
    extrapolation (last segment's slope) above the last."""
    return interp_linear(pts, b)


def arrival_times(arrival: str, n: int, stagger_ms: float, rate_per_s: float, seed: int
                  ) -> list[float]:
    """Seconds after the point starts at which each of the n streams arrives."""
    if arrival == "burst":  # bench clients start all streams at once
        return [0.0] * n
    if arrival == "staggered":
        return [i * stagger_ms / 1e3 for i in range(n)]
    if arrival == "poisson":
        rng, t, out = random.Random(seed), 0.0, []
        for i in range(n):
            out.append(t)
            t += rng.expovariate(rate_per_s)
        return out
    raise ValueError(f"unknown arrival pattern {arrival!r}")


# ---------------------------------------------------------------------------------------------
# Stage work (GPU). Everything below imports torch lazily; it runs only inside torchrun ranks.

def stage_forward(L, weights: list, experts):
    """fwd(x) for a stack of MoE layers: x [b, H] bf16 -> x + MoE(x), layer after layer.
    `fwd.weights` / `fwd.experts` expose the layers so a check can compare each one with its
    reference on the same routed ids."""
    def fwd(x):
        for w in weights:
            ids, tw = L.moe_route(w, x)          # [b, k] expert ids, fp32 weights
            x = x + experts(w, x, ids, tw)
        return x
    fwd.weights, fwd.experts = weights, experts
    return fwd


MOE_VARIANTS = ("auto", "triton", "fast", "plain")


def moe_candidates(requested: str, *, on_cuda: bool, triton_reason: str | None,
                   grouped_mm_reason: str | None) -> list[str]:
    """The MoE backends to try, in order, for `--moe-variant requested` (the first that builds
    and passes its float32 reference check runs). `auto` = stage-cost's pick on an H200: our
    fused Triton decode kernel where this is a CUDA device and triton imports (its check
    decides), else torch `fast` where `torch._grouped_mm` runs, else the per-expert `loop`
    (correct everywhere, not graph-capturable). A forced name is tried alone: it runs as asked
    or the rank fails with the reason, never a silent substitute."""
    if requested == "auto":
        out = ["triton"] if on_cuda and triton_reason is None else []
        return out + (["fast"] if grouped_mm_reason is None else ["loop"])
    if requested in ("fast", "plain"):
        if grouped_mm_reason is not None:
            raise RuntimeError(f"--moe-variant {requested}: {grouped_mm_reason}")
        return [requested]
    if requested == "triton":
        if triton_reason is not None:
            raise RuntimeError(f"--moe-variant triton: {triton_reason}")
        return ["triton"]
    raise ValueError(f"unknown --moe-variant {requested!r}; known: {', '.join(MOE_VARIANTS)}")


def _backend_of(name: str) -> tuple[str, str]:
    """candidate name -> (layers.build_moe backend, variant)."""
    return ("triton", "fast") if name == "triton" else ("torch", name)


def loop_max_rows(cfg: dict) -> int:
    """Most rows one forward of the loop sees: a prefill of every stream at once within the
    prefill token budget of a visit (chunked prefill; without it max_prefill_tokens, or one
    whole prompt beyond it), or the largest decode micro-batch padded to its capture size."""
    c = max(cfg.get("concurrency") or [1])
    max_b = max(1, min(cfg.get("max_micro_batch") or c, c))
    full = capture_sizes(max(512, 2 * max_b))
    plen = cfg.get("prompt_len", 1)
    chunk = cfg.get("chunked_prefill_size")
    budget = chunk if chunk and chunk > 0 else max(cfg.get("max_prefill_tokens") or
                                                   MAX_PREFILL_TOKENS, plen)
    return max(min(c * plen, budget), padded(max_b, full[-1]) or max_b)


def triton_check_batches(max_rows: int) -> list[int]:
    """One micro-batch size per block-size row of moe_triton.CONFIGS that the loop can reach
    (the smallest size of each row), so every kernel configuration the loop will run is checked
    (and JIT-compiled) before timing."""
    from microbench.kernels import moe_triton as MT

    out, lo = [], 1
    for bound, _ in MT.CONFIGS:
        if lo <= max_rows:
            out.append(lo)
        lo = bound + 1
    return out


def _check_rows(L, w, experts, b: int, dev, seed: int) -> float:
    """Run `experts` on b fresh random rows; compare the first (up to) 5 rows with the float32
    per-expert reference (rows are independent, so this checks the kernel config used at b)."""
    x = L.randn((b, w.router.shape[1]), 1.0, L.gen(dev, seed), dev)
    ids, tw = L.moe_route(w, x)
    y = experts(w, x, ids, tw)[:5]
    return L.assert_close(f"moe experts at b={b}", y, L.moe_reference(w, x[:5], ids[:5],
                                                                       tw[:5]))


def _first_layer(torch, L, m, name: str, cfg: dict, rank: int, dev) -> tuple:
    """Build layer 0 with backend `name` and check it before timing (fresh random input vs the
    float32 per-expert loop; for triton at every block-size row the loop reaches).
    Returns (weights, experts fn, backend string, max relative error, checked batches)."""
    backend, variant = _backend_of(name)
    # built for 5 tokens so that its check runs on 5 (it checks min(b, 5))
    built = L.build_moe(m, 5, dev, backend=backend, variant=variant, seed=1000 * rank)
    if built.backend != f"{backend}/{variant}":  # layers fell back on its own: not what we asked
        raise RuntimeError(f"asked for {backend}/{variant}, layers built {built.backend}")
    err, checked = built.check(), [5]  # raises layers.CheckFailed
    w = built.info.pop("weights")
    if name == "triton":
        from microbench.kernels import moe_triton as MT

        def experts(w_, x, ids, tw):
            return MT.moe_experts(w_, x, ids, tw)
        for b in triton_check_batches(loop_max_rows(cfg)):
            err = max(err, _check_rows(L, w, experts, b, dev, seed=77 + b))
            checked.append(b)
    else:
        experts = {"fast": L.moe_experts_fast, "plain": L.moe_experts_plain,
                   "loop": L.moe_experts_loop}[name]
    return w, experts, built.backend, err, sorted(set(checked))


def build_moe_stage(torch, cfg: dict, rank: int, dev, model=None, free_bytes: int | None = None):
    """`layers_per_stage` MoE layers from microbench.kernels.layers, the layer stage-cost times (same
    weights layout and router), as many as fit in 85% of free memory (`free_bytes`, default:
    what the GPU reports). Backend: `cfg["moe_variant"]` through `moe_candidates` (auto: triton
    if it passes its check here, else torch fast, else loop); a candidate that fails to build
    or check is recorded in `moe_fallbacks` and the next one is tried. Returns
    (fwd(x) -> x + MoE(x) per layer, info). `model` overrides the preset (tests: small dims)."""
    from microbench.kernels import layers as L
    from microbench.kernels import moe_triton as MT
    from reports.base.model_config import load_model

    m = (model or load_model(cfg["model"])).all_formats("bf16")  # INT4/FP8 not executed
    per_layer = L.moe_weight_bytes(m)
    free = torch.cuda.mem_get_info(dev)[0] if free_bytes is None else free_bytes
    n = min(cfg["layers_per_stage"], int(0.85 * free // per_layer))
    if n < 1:
        raise RuntimeError(f"rank {rank}: one MoE layer needs {per_layer / 1e9:.1f} GB, "
                           f"{free / 1e9:.1f} GB free; use --work busy")
    requested = cfg.get("moe_variant", "auto")
    names = moe_candidates(requested, on_cuda=torch.device(dev).type == "cuda",
                           triton_reason=MT.available(),
                           grouped_mm_reason=L.grouped_mm_available(dev))
    fallbacks, first = {}, None
    for k, name in enumerate(names):
        try:
            first = _first_layer(torch, L, m, name, cfg, rank, dev)
            break
        except Exception as e:  # noqa: BLE001 - failed build/check: next candidate, reason kept
            if k == len(names) - 1:
                raise RuntimeError(f"rank {rank}: MoE backend {name}: "
                                   f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
                                   + (f" (earlier: {fallbacks})" if fallbacks else "")) from e
            fallbacks[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        # here the failed candidate's exception (and the weights its frames held) is gone
        if torch.device(dev).type == "cuda":
            torch.cuda.empty_cache()
    w0, experts, backend, err, checked = first
    name = names[len(fallbacks)]
    if cfg["graphs"] and name == "loop":
        raise RuntimeError(f"rank {rank}: MoE backend {backend} syncs the host and cannot be "
                           "captured in a CUDA graph; run with --no-graphs")
    weights = [w0]
    bk, var = _backend_of(name)
    for i in range(1, n):  # same backend; checked once on layer 0 (same code, other weights)
        built = L.build_moe(m, 1, dev, backend=bk, variant=var, seed=1000 * rank + i)
        weights.append(built.info.pop("weights"))
        del built
    fwd = stage_forward(L, weights, experts)
    note = None if n == cfg["layers_per_stage"] else \
        f"only {n} of {cfg['layers_per_stage']} layers fit in GPU memory"
    return fwd, {"layers_used": n, "moe_backend": backend, "moe_variant_requested": requested,
                 "moe_candidates": names, "moe_fallbacks": fallbacks,
                 "moe_check_rel_err": err, "moe_checked_batches": checked,
                 "layer_bytes": per_layer, "note": note}


def build_work(torch, cfg: dict, rank: int, dev):
    """Returns (fwd(x) -> y, info). `fwd` enqueues the stage forward on the current stream."""
    H = cfg["hidden"]
    if cfg["work"] == "busy":
        pts = [tuple(p) for p in cfg["cost_points"]]
        # calibrate cycles per microsecond of torch.cuda._sleep with the shared timer
        from microbench.kit.timing import do_bench
        cyc = 1_000_000
        t = do_bench(lambda: torch.cuda._sleep(cyc), warmup_ms=5, rep_ms=30).median_us
        cyc_per_us = cyc / t

        def fwd(x):
            torch.cuda._sleep(max(1, int(interp_cost(pts, x.shape[0]) * cyc_per_us)))
            return x + 1.0

        checks = []
        for b in sorted({pts[0][0], pts[-1][0]}):  # check the calibration before timing
            x = torch.randn(b, H, device=dev, dtype=torch.bfloat16)
            got = do_bench(lambda: fwd(x), warmup_ms=5, rep_ms=30).median_us
            want = interp_cost(pts, b)
            checks.append({"batch": b, "target_us": want, "measured_us": got})
            if abs(got - want) > 0.15 * want + 20:
                raise RuntimeError(f"rank {rank}: busy kernel calibration off at b={b}: "
                                   f"{got:.0f} us measured vs {want:.0f} us wanted")
        return fwd, {"busy_cycles_per_us": cyc_per_us, "busy_check": checks,
                     "layers_used": 0}
    return build_moe_stage(torch, cfg, rank, dev)


def calibrate_injection(torch, ctx: dict, sizes: list[int], H: int, dev) -> dict:
    """What --inject needs, measured once before the loop: sleep-kernel cycles per microsecond
    and, for slow-stage, this rank's forward time per batch size (graph replay where the loop
    replays, eager otherwise), so the extra sleep is (FACTOR - 1) x the forward."""
    inj = ctx["inject"]
    if not (inj["slow_stage"] or inj["hop_delay_us"]):
        return {"cyc_per_us": 0.0, "fwd_us": lambda b: 0.0}
    from microbench.kit.timing import do_bench
    cyc = 1_000_000
    cyc_per_us = cyc / do_bench(lambda: torch.cuda._sleep(cyc), warmup_ms=5, rep_ms=30).median_us
    table: dict[int, float] = {}
    if ctx["rank"] in inj["slow_stage"]:
        for b in (sizes or [1, 8, 32]):
            if ctx["graphs"] and b in ctx["graphs"]:
                g = ctx["graphs"][b][0]
                table[b] = do_bench(g.replay, warmup_ms=5, rep_ms=20).median_us
            else:
                x = torch.randn(b, H, device=dev, dtype=torch.bfloat16)
                table[b] = do_bench(lambda: ctx["fwd"](x), warmup_ms=5, rep_ms=20).median_us
    pts = sorted(table.items())
    return {"cyc_per_us": cyc_per_us, "fwd_us_table": pts,
            "fwd_us": (lambda b: interp_cost(pts, b)) if pts else (lambda b: 0.0)}


def capture_graphs(torch, fwd, sizes: list[int], H: int, dev):
    """One CUDA graph per size, largest first, sharing one memory pool (as SGLang does)."""
    graphs, pool = {}, torch.cuda.graph_pool_handle()
    for b in sorted(sizes, reverse=True):
        x = torch.randn(b, H, device=dev, dtype=torch.bfloat16)
        g, y = capture_graph(lambda: fwd(x), warmup=2, pool=pool)
        graphs[b] = (g, x, y)
    return graphs


# ---------------------------------------------------------------------------------------------
# Loop-order mechanics (SGLang 0.5.23 managers/scheduler_pp_mixin.py, `event_loop_pp`): how a
# rank exchanges requests, hidden states and sampled tokens, on which stream, in which order.
# Kept apart from the loop body so that what the loop measures stays easy to read.

TAG_REQS, TAG_PROXY, TAG_OUT = 0, 1, 2  # gloo tags: one channel per message kind


def isend_pyobj(torch, dist, obj, dst: int, group, tag: int) -> list:
    """`send_pyobj` without blocking (SGLang's `point_to_point_pyobj(async_send=True)`): the
    pickled size, then the bytes. Returns (work, tensor) pairs to commit later."""
    import pickle
    data = pickle.dumps(obj)
    size = torch.tensor([len(data)], dtype=torch.long)
    body = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return [(dist.isend(size, dst=dst, group=group, tag=tag), size),
            (dist.isend(body, dst=dst, group=group, tag=tag), body)]


def recv_pyobj_tag(torch, dist, src: int, group, tag: int):
    """The receiving side of `isend_pyobj` (blocks the CPU, as SGLang's `recv_object`)."""
    import pickle
    size = torch.empty(1, dtype=torch.long)
    dist.irecv(size, src=src, group=group, tag=tag).wait()
    buf = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.irecv(buf, src=src, group=group, tag=tag).wait()
    return pickle.loads(buf.numpy().tobytes())


def commit(works: list) -> float:
    """SGLang's `_pp_commit_comm_work`: wait for earlier async sends. For NCCL this makes the
    current (schedule) stream wait for them; for gloo (the metadata) it blocks the CPU until
    the peer has posted its receive (gloo sends are rendezvous). Returns the microseconds the
    CPU was blocked: waiting for the peer, not host work (the model's `chain`)."""
    tw = time.perf_counter()
    for w, _ in works:
        w.wait()
    works.clear()
    return (time.perf_counter() - tw) * 1e6


def new_loop_state(torch, cfg: dict, pp: int, rank: int) -> dict:
    """Per-rank state of SGLang's PP loop: the schedule stream (current while the loop runs),
    the forward and copy streams, what each slot ran at this rank's last visit (`mbs`), the
    last rank's held outputs, the outputs received last iteration, the async sends in flight."""
    S = pp + cfg["async_depth"]
    return {"sched": torch.cuda.current_stream(), "fwd": torch.cuda.Stream(),
            "copy": torch.cuda.Stream(), "mbs": [0] * S, "held": [], "pp_out": None,
            "req_work": [], "proxy_work": [], "out_work": []}


def recv_proxy(torch, dist, ctx: dict, lp: dict, x) -> float:
    """`_pp_recv_proxy_tensors`: block on the metadata (gloo), then receive the hidden states
    into `x` over NCCL with `work.wait()`: the schedule stream waits, the CPU does not.
    Returns microseconds the CPU waited."""
    tw = time.perf_counter()
    recv_pyobj_tag(torch, dist, ctx["rank"] - 1, ctx["gloo"], TAG_PROXY)
    waited = (time.perf_counter() - tw) * 1e6
    dist.irecv(x, src=ctx["rank"] - 1).wait()
    return waited


def exchange_outputs(torch, dist, ctx: dict, lp: dict, s: int, tokens_of, drain: bool = False
                     ) -> tuple[float, object]:
    """`_pp_commit_send_output_work_and_preprocess_output_tensors`: commit the last output send;
    then, even ranks sending first and odd ranks receiving first:
    - send: the last rank sends the tokens of the slot it ran `async_depth` iterations ago
      (slot s + pp; the NCCL send waits for that forward's end event), every other rank
      forwards the outputs it received last iteration (ring last -> 0 -> 1 -> ...);
    - receive, when slot s + 1 ran a batch here: metadata (gloo, blocking), tokens over NCCL
      on the schedule stream, then a device-to-host copy on the copy stream after it.
    `drain`: the final iteration, sends only (so every receive posted so far is matched).
    Returns (microseconds the CPU waited, (d2h event, host buffer, tokens) or None)."""
    rank, pp, gloo = ctx["rank"], ctx["pp"], ctx["gloo"]
    last, S = pp - 1, len(lp["mbs"])
    waited, got = 0.0, None
    if not drain:   # gloo sends complete only once received: at the end, commit after draining
        waited += commit(lp["out_work"])

    def send():
        if rank == last:   # (at the end rank 0 expects nothing more: what is held is dropped)
            if not drain and lp["mbs"][(s + pp) % S]:
                ev, tok = lp["held"].pop(0)
                lp["sched"].wait_event(ev)           # ready_event = that forward's end
                lp["out_work"] += isend_pyobj(torch, dist, tok.numel(), 0, gloo, TAG_OUT)
                lp["out_work"].append((dist.isend(tok, dst=0), tok))
        elif lp["pp_out"] is not None:
            tok = lp["pp_out"]
            lp["out_work"] += isend_pyobj(torch, dist, tok.numel(), rank + 1, gloo, TAG_OUT)
            lp["out_work"].append((dist.isend(tok, dst=rank + 1), tok))

    def recv():
        nonlocal waited, got
        if drain or not lp["mbs"][(s + 1) % S]:
            return
        tw = time.perf_counter()
        n = recv_pyobj_tag(torch, dist, (rank - 1) % pp, gloo, TAG_OUT)
        waited += (time.perf_counter() - tw) * 1e6
        buf = torch.empty(n, dtype=torch.long, device=ctx["dev"])
        dist.irecv(buf, src=(rank - 1) % pp).wait()
        lp["copy"].wait_stream(lp["sched"])
        with torch.cuda.stream(lp["copy"]):
            host = buf.to("cpu", non_blocking=True)
            d2h = torch.cuda.Event()
            d2h.record(lp["copy"])
        got = (d2h, host, buf)

    for op in ((send, recv) if rank % 2 == 0 else (recv, send)):
        op()
    return waited, got


def sync_outputs(got) -> tuple[float, list]:
    """`d2h_event.synchronize()` before `process_batch_result` of slot s + 1: the CPU waits for
    the returned tokens and for everything queued before them on the schedule stream."""
    d2h, host, _ = got
    tw = time.perf_counter()
    d2h.synchronize()
    waited = (time.perf_counter() - tw) * 1e6
    return waited, host.tolist()


def send_proxy(torch, dist, ctx: dict, lp: dict, y, launch_ev, rows: int, late=None,
               delay_cyc: int = 0):
    """`_pp_send_proxy_to_next_stage`: metadata (gloo, at once), then the hidden states over
    NCCL once the forward's end event fired (`ready_event=launch_event`). The next launch
    commits it first (`_pp_commit_proxy_send_work`), so the next forward waits until NCCL has
    read these buffers. `delay_cyc` (--inject hop-delay): the send leaves that much later, on
    `late`, without slowing the sender's forward. Returns the send-complete event."""
    rank = ctx["rank"]
    lp["proxy_work"] += isend_pyobj(torch, dist, rows, rank + 1, ctx["gloo"], TAG_PROXY)
    lp["sched"].wait_event(launch_ev)
    out = y.contiguous()
    if delay_cyc:
        late.wait_stream(lp["sched"])
        with torch.cuda.stream(late):
            torch.cuda._sleep(delay_cyc)
            w = dist.isend(out, dst=rank + 1)
    else:
        w = dist.isend(out, dst=rank + 1)
    lp["proxy_work"].append((w, out))
    side = ctx["side"]
    side.wait_stream(lp["sched"])
    with torch.cuda.stream(side):
        w.wait()  # a side stream waits on NCCL to time the send's end
        e = torch.cuda.Event(enable_timing=True)
        e.record(side)
    return e


def gloo_one_way_us(torch, dist, rank: int, pp: int, gloo, reps: int = 20) -> float | None:
    """One gloo message between neighbours (the request list, the metadata): half the median
    round trip of a small pickled object, pair by pair (rank r measures r <-> r+1). None on the
    last rank. The pipeline model's `chain_us`."""
    out = None
    for a in range(pp - 1):
        if rank not in (a, a + 1):
            continue
        rtts = []
        for _ in range(reps):
            if rank == a:
                t = time.perf_counter()
                send_pyobj(dist, {"ping": 1}, a + 1, gloo)
                recv_pyobj(dist, a + 1, gloo)
                rtts.append((time.perf_counter() - t) * 1e6)
            else:
                recv_pyobj(dist, a, gloo)
                send_pyobj(dist, {"pong": 1}, a, gloo)
        if rank == a:
            rtts.sort()
            out = rtts[len(rtts) // 2] / 2
    return out


def drain_last_to_first(torch, dist, ctx: dict, lp: dict, stop: int, rows_by_it: dict) -> None:
    """After the last iteration (`stop` = the iteration that stopped): rank 0 receives (and
    drops) the tokens the last rank sent for slots rank 0 stopped before visiting -- those of
    the last rank's iterations stop-pp+1 .. stop-1 whose slot ran a batch `async_depth`
    iterations earlier (rank 0 knows every slot's rows: `rows_by_it`, it -> rows, the last
    iterations at least) -- so that every send completes; then every rank commits its sends."""
    rank, pp, gloo = ctx["rank"], ctx["pp"], ctx["gloo"]
    if rank == 0:
        depth = len(lp["mbs"]) - pp
        for j in range(max(0, stop - pp + 1), stop):
            if j - depth >= 0 and rows_by_it.get(j - depth):
                n = recv_pyobj_tag(torch, dist, pp - 1, gloo, TAG_OUT)
                buf = torch.empty(n, dtype=torch.long, device=ctx["dev"])
                dist.irecv(buf, src=pp - 1).wait()
    for key in ("req_work", "proxy_work", "out_work"):
        commit(lp[key])


# ---------------------------------------------------------------------------------------------
# The loop.

def run_point(torch, dist, ctx: dict, point: dict) -> dict:
    """One (policy, arrival, concurrency) point; returns this rank's raw columns.

    Each iteration follows SGLang's order (see the mechanics above): recv_requests (+ send them
    on at once), get_next_batch_to_run, proxy receive, output exchange (before the forward when
    async_depth > 0, after it when 0), run_batch, sync on slot s+1's outputs and process them,
    proxy send."""
    cfg, rank, pp = ctx["cfg"], ctx["rank"], ctx["pp"]
    last, gloo, dev, H = pp - 1, ctx["gloo"], ctx["dev"], cfg["hidden"]
    scfg = SlotConfig(pp, cfg["async_depth"], cfg["max_micro_batch"],
                      cfg.get("max_running_requests"), cfg.get("chunked_prefill_size"),
                      cfg.get("max_prefill_tokens") or MAX_PREFILL_TOKENS)
    S, depth = scfg.slots, cfg["async_depth"]
    serve = ctx.get("serve")   # serve mode: (rank 0's ServeScheduler or None, RankSide)

    def rf(name):   # SGLang's range names, while a profiler records (serve: it comes and goes)
        return torch.profiler.record_function(name) if ctx.get("profiler") is not None \
            else contextlib.nullcontext()
    graphs, sizes = ctx["graphs"], ctx["capture_sizes"]
    emb = ctx["emb"]  # rank 0's stand-in for the embedding output, [rows, H]
    C = point["concurrency"]

    # host-clock reference for GPU events
    dist.barrier(group=gloo)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    ref = torch.cuda.Event(enable_timing=True)
    ref.record()
    ref.synchronize()
    t1 = time.perf_counter()
    t_ref, ref_err_us = (t0 + t1) / 2, (t1 - t0) / 2 * 1e6
    start = t1
    arrivals = arrival_times(point["arrival"], C, cfg["stagger_ms"], cfg["poisson_rate_per_s"],
                             cfg["seed"]) if rank == 0 and serve is None else []

    cols = {k: [] for k in ("it", "slot", "kind", "n", "rows", "measure", "t_start", "t_end",
                            "wait_us", "wait_req_us", "wait_proxy_us", "wait_out_us",
                            "wait_sync_us", "wait_commit_us", "sched_us", "launch_us",
                            "process_us", "ev")}
    occupancy = []  # rank 0: (t, sizes) after admission
    adm = AdmitState.empty(scfg)
    lp = new_loop_state(torch, cfg, pp, rank)
    ctx["side"] = torch.cuda.Stream()
    late = torch.cuda.Stream()
    inj = ctx["inject"]
    slow = inj["slow_stage"].get(rank, 0.0)
    host_delay_s = inj["host_delay_us"].get(rank, 0.0) / 1e6
    hop_delay_cyc = int(inj["hop_delay_us"] * ctx["cyc_per_us"]) if inj["hop_delay_us"] else 0
    admitted, window = 0, None  # window: [first measured iteration, ...]
    no_admit_rounds, it = 0, 0
    max_iters = cfg["max_iters_per_point"]
    seconds = cfg["seconds_per_point"]
    lp["rows_tail"] = {}   # it -> rows of the last few iterations (drain_last_to_first)
    setup_deadline = start + max(5.0, 3 * seconds)

    while True:
        s = it % S
        t_start = time.perf_counter()
        ev = {}
        w_req = w_proxy = w_out = w_sync = w_commit = 0.0
        # ---- 1. recv_requests: rank 0 admits; the others get the request list from rank-1
        if rank == 0 and serve is not None:   # requests from HTTP clients (microbench/serve.py)
            with rf("get_next_batch_to_run"):
                meta = serve[0].visit(it, s)
            stop, kind, n, rows, measure = (meta["stop"], meta["kind"], meta["n"],
                                            meta["rows"], meta["measure"])
            if window is None and measure:
                window = (it, 0.0)
        elif rank == 0:
            now = time.perf_counter() - start
            with rf("get_next_batch_to_run"):
                stop = (window is not None and (now - window[1] >= seconds
                                                or it - window[0] >= max_iters)) \
                    or it >= 4 * max_iters
                waiting = sum(1 for a in arrivals[admitted:] if a <= now)
                vis = Visit() if stop else visit(adm, [cfg["prompt_len"]] * waiting, s, scfg,
                                                 point["policy"], cfg.get("micro_batches"))
                admitted += vis.taken
                if vis.batch:   # prefill first: this slot's visit runs the prefill
                    kind, n, rows, no_admit_rounds = "prefill", vis.batch, vis.tokens, 0
                else:
                    n = adm.sizes[s]
                    kind, rows = ("decode", n) if n else ("idle", 0)
                    if s == S - 1:
                        no_admit_rounds += 1
                if vis.batch or not occupancy:  # sizes change only on admission
                    occupancy.append((time.perf_counter(), list(adm.sizes)))
                if window is None and not stop and (
                        (admitted == C and not adm.chunk_left and no_admit_rounds >= 2)
                        or (no_admit_rounds >= 4 and all(a <= now for a in arrivals))
                        or time.perf_counter() > setup_deadline):
                    window = (it, now)  # steady decode from here on
                measure = window is not None
            meta = {"stop": stop, "it": it, "slot": s, "kind": kind, "n": n, "rows": rows,
                    "measure": measure}
        else:
            tw = time.perf_counter()
            with rf("recv_requests"):
                meta = recv_pyobj(dist, rank - 1, gloo)
            w_req = (time.perf_counter() - tw) * 1e6
            stop, kind, n, rows, measure = (meta["stop"], meta["kind"], meta["n"],
                                            meta["rows"], meta["measure"])
            assert meta["it"] == it and meta["slot"] == s, "ranks out of step"
        if rank < last:
            with rf("send_reqs_to_next_stage"):
                w_commit += commit(lp["req_work"])
                lp["req_work"] = isend_pyobj(torch, dist, meta, rank + 1, gloo, TAG_REQS)
        if serve is not None:   # control commands: every rank, this same iteration
            for c in meta["ctl"]:
                serve[1].apply(c, it)
        if stop:   # the outputs the next rank still expects, then stop
            exchange_outputs(torch, dist, ctx, lp, s, None, drain=True)
            break
        t_sched = time.perf_counter()
        if host_delay_s and rows:  # --inject host-delay: more CPU work per visit with a batch
            with rf("get_next_batch_to_run") if rank else contextlib.nullcontext():
                t_spin = time.perf_counter() + host_delay_s
                while time.perf_counter() < t_spin:
                    pass
        lp["mbs"][s] = rows
        lp["rows_tail"][it] = rows
        lp["rows_tail"].pop(it - 2 * S - pp, None)
        sched_us = (time.perf_counter() - t_sched) * 1e6
        # ---- 2. inputs: hidden states from rank-1 (rank 0: its embedding stand-in)
        use_graph = cfg["graphs"] and kind == "decode"
        pb = padded(rows, sizes[-1]) if rows and use_graph and sizes else None
        x = y = None
        if rows:
            if pb is not None:
                g, gx, gy = graphs[pb]
            if rank == 0:
                x = emb[:rows] if rows <= emb.shape[0] else \
                    torch.randn(rows, H, device=dev, dtype=torch.bfloat16)
            else:  # a fresh buffer, as SGLang's recv_tensor_dict; copied into the graph later
                x = torch.empty(rows, H, device=dev, dtype=torch.bfloat16)
            if rank > 0:
                with rf("recv_proxy"):
                    w_proxy = recv_proxy(torch, dist, ctx, lp, x)
                e = torch.cuda.Event(enable_timing=True)
                e.record(lp["sched"])
                ev["in"] = e
        got = None
        launch_us = 0.0
        for phase in (("exchange", "launch") if depth > 0 else ("launch", "exchange")):
            if phase == "exchange":
                with rf("exchange_outputs"):
                    w_out, got = exchange_outputs(torch, dist, ctx, lp, s, None)
                if rank == 0 and got is not None:
                    e = torch.cuda.Event(enable_timing=True)
                    e.record(lp["sched"])
                    ev["in"] = e
                continue
            # the next forward waits until NCCL read the last send
            w_commit += commit(lp["proxy_work"])
            if not rows:
                continue
            tl = time.perf_counter()
            with rf("run_batch"):
                fwd = lp["fwd"]
                fwd.wait_stream(lp["sched"])
                with torch.cuda.stream(fwd):
                    e = torch.cuda.Event(enable_timing=True)
                    e.record(fwd)
                    ev["fs"] = e
                    if pb is not None:
                        gx[:rows].copy_(x)     # inputs into the graph's static buffer
                        g.replay()
                        y = gy[:rows]
                    else:
                        y = ctx["fwd"](x)
                    if slow:  # --inject slow-stage: the forward takes FACTOR times as long
                        torch.cuda._sleep(max(1, int((slow - 1.0) * ctx["fwd_us"](pb or rows)
                                                     * ctx["cyc_per_us"])))
                    e = torch.cuda.Event(enable_timing=True)
                    e.record(fwd)
                    ev["fe"] = e
                    if rank == last:  # sampled token ids of the batch's requests, held
                        tok = y[:rows][-n:, :64].argmax(-1)
                        done = torch.cuda.Event()
                        done.record(fwd)          # SGLang's launch event: after sampling
                        lp["held"].append((done, tok))
            launch_us = (time.perf_counter() - tl) * 1e6
        # ---- 3. process_batch_result of slot s+1, after a CPU sync on its outputs
        process_us = None
        if got is not None:
            with rf("process_batch_result"):
                w_sync, _tokens = sync_outputs(got)
                tp0 = time.perf_counter()
                lp["pp_out"] = got[2] if rank < last else None
                if rank == 0 and serve is not None:   # one token per request of slot s+1
                    serve[0].outputs((s + 1) % S, tp0)
                process_us = (time.perf_counter() - tp0) * 1e6
        else:
            lp["pp_out"] = None
        # ---- 4. proxy send to rank+1
        if rows and rank < last:
            with rf("send_proxy_dict_to_next_stage"):
                ev["se"] = send_proxy(torch, dist, ctx, lp, y, ev["fe"], rows, late,
                                      hop_delay_cyc)
        it += 1
        if serve is not None and not (measure or rows):
            continue   # serve mode keeps no column for an idle pipeline's turn
        if serve is not None and len(cols["it"]) >= 2 * max_iters:
            for v in cols.values():   # keep the latest max_iters iterations
                del v[:len(v) - max_iters]
        cols["it"].append(it - 1)
        cols["slot"].append(s)
        cols["kind"].append(kind)
        cols["n"].append(n)
        cols["rows"].append(rows)
        cols["measure"].append(bool(measure))
        cols["t_start"].append(t_start)
        cols["t_end"].append(time.perf_counter())
        cols["wait_us"].append(w_req + w_proxy + w_out + w_sync + w_commit)
        cols["wait_req_us"].append(w_req)
        cols["wait_proxy_us"].append(w_proxy)
        cols["wait_out_us"].append(w_out)
        cols["wait_sync_us"].append(w_sync)
        cols["wait_commit_us"].append(w_commit)
        cols["sched_us"].append(sched_us)
        cols["launch_us"].append(launch_us)
        cols["process_us"].append(process_us)
        cols["ev"].append(ev)
    drain_last_to_first(torch, dist, ctx, lp, it, lp["rows_tail"])
    torch.cuda.synchronize()
    # GPU events -> host clock (seconds)
    def at(e):
        return t_ref + ref.elapsed_time(e) / 1e3
    gpu = {k: [] for k in ("in", "fs", "fe", "se")}
    for ev in cols.pop("ev"):
        for k in gpu:
            gpu[k].append(at(ev[k]) if k in ev else None)
    cols.update({f"t_{k}": v for k, v in gpu.items()})
    out = {"point": point, "rank": rank, "slots": S, "ref_err_us": ref_err_us,
           "t_point_start": start, "columns": cols, "complete": True}
    if rank == 0 and serve is not None:   # the session: sizes at the peak of running requests
        sc = serve[0]
        out["point"] = dict(point, concurrency=max(1, sc.peak))
        out.update(arrivals_s=[], admitted=sc.admitted, occupancy=list(sc.occupancy),
                   slot_sizes=list(sc.peak_sizes), window_start_it=window[0] if window else None)
    elif rank == 0:
        out["arrivals_s"] = arrivals
        out["admitted"] = admitted
        out["occupancy"] = occupancy
        out["slot_sizes"] = list(adm.sizes)   # requests per slot (a chunked one where it ended)
        out["window_start_it"] = window[0] if window else None
    return out


def export_trace(prof, path: Path) -> None:
    """Write a torch.profiler trace as SGLang does: Chrome JSON, gzipped, at `path` (.gz)."""
    raw = path.with_name(path.name[:-3]) if path.name.endswith(".gz") else path
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as f, gzip.open(path, "wb") as g:
        shutil.copyfileobj(f, g)
    raw.unlink()


class RankProfiler:
    """torch.profiler for serve mode's /start_profile (microbench/serve.py RankSide's
    `profiler`): CPU and/or GPU activities as asked; while it records, the loop marks SGLang's
    ranges (record_function). Neither stacks nor shapes are recorded (SGLang records both by
    default; they make traces much larger and the readers use neither)."""

    def __init__(self, torch, ctx: dict, activities: list[str]):
        A = torch.profiler.ProfilerActivity
        acts = ([A.CPU] if "CPU" in activities else []) + ([A.CUDA] if "GPU" in activities
                                                           else [])
        self.ctx, self.prof = ctx, torch.profiler.profile(activities=acts or [A.CPU])

    def start(self) -> None:
        self.prof.start()
        self.ctx["profiler"] = self.prof

    def stop(self) -> None:
        self.ctx["profiler"] = None
        self.prof.stop()

    def export(self, path: Path) -> None:
        export_trace(self.prof, path)


def loop_capture_sizes(cfg: dict) -> list[int]:
    """The decode batch sizes the loop captures: SGLang's sizes up to the one the largest
    micro-batch pads to."""
    max_b = max(1, min(cfg["max_micro_batch"], max(cfg["concurrency"])))
    full = capture_sizes(max(512, 2 * max_b))  # capture up to the size max_b pads to
    return capture_sizes(padded(max_b, full[-1]))


def start_serving(cfg: dict):
    """Rank 0 in serve mode: bind the HTTP front-end before the stages are built (GET /health
    answers 503 until the loop runs). Returns (ServeState, server)."""
    from microbench import serve as SV
    from microbench import serve_http as SH
    chunk = cfg.get("chunked_prefill_size")
    args = SV.ServerArgs(
        model_path=cfg["model"], pp_size=cfg["pp"],
        max_running_requests=cfg["max_running_requests"],
        pp_max_micro_batch_size=cfg["max_micro_batch"], pp_async_batch_depth=cfg["async_depth"],
        chunked_prefill_size=chunk if chunk and chunk > 0 else None,
        max_prefill_tokens=cfg.get("max_prefill_tokens") or MAX_PREFILL_TOKENS,
        cuda_graph_max_bs=loop_capture_sizes(cfg)[-1] if cfg["graphs"] else None,
        disable_cuda_graph=not cfg["graphs"], policy=cfg["serve"]["policy"])
    state = SV.ServeState(args)
    server = SH.make_server(state, cfg["serve"]["host"], cfg["serve"]["port"])
    SH.start(server)
    print(f"rank 0: serving http://{cfg['serve']['host']}:{server.server_address[1]} "
          "(OpenAI-compatible, SGLang's control routes); building the stages", file=sys.stderr,
          flush=True)
    return state, server


def serve_signals(state) -> None:
    """Serve mode: SIGINT / SIGTERM on rank 0 stop the loop at its next visit (the request list
    then tells every rank to stop); the other ranks ignore them and stop with rank 0."""
    import signal

    def stop(signum, frame):
        state.request_stop(f"stopped by {signal.Signals(signum).name}")
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop if state is not None else signal.SIG_IGN)


def serve_point(torch, dist, ctx: dict, state) -> dict:
    """The whole served session as one point (run_point with rank 0's admission taken from
    HTTP clients and control commands applied on every rank; microbench/serve.py)."""
    from microbench import serve as SV
    cfg, rank = ctx["cfg"], ctx["rank"]
    sched = None
    if rank == 0:
        scfg = SlotConfig(cfg["pp"], cfg["async_depth"], cfg["max_micro_batch"],
                          cfg.get("max_running_requests"), cfg.get("chunked_prefill_size"),
                          cfg.get("max_prefill_tokens") or MAX_PREFILL_TOKENS)
        secs = cfg["serve"].get("seconds")
        sched = SV.ServeScheduler(state, scfg, cfg["serve"]["policy"], cfg.get("micro_batches"),
                                  stop_at=None if secs is None else time.perf_counter() + secs,
                                  profile_dir=cfg.get("profile_dir") or ".")
    side = SV.RankSide(rank, sched, profiler=lambda acts: RankProfiler(torch, ctx, acts),
                       barrier=lambda: dist.barrier(group=ctx["gloo"]))
    ctx["serve"] = (sched, side)
    if state is not None:
        state.mark_ready()
    try:
        return run_point(torch, dist, ctx, cfg["points"][0])
    finally:
        if sched is not None:
            sched.close(state.stop_requested or "the loop ended")


def _profile_ctx(torch, cfg, rank, point):
    """torch.profiler around one point; trace named like SGLang's: {id}-TP-0-PP-{rank}."""
    if not cfg.get("profile_dir"):
        return None, None
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                              torch.profiler.ProfilerActivity.CUDA])
    pid = f"dispatch-{point['policy']}-{point['arrival']}-c{point['concurrency']}"
    return prof, Path(cfg["profile_dir"]) / f"{pid}-TP-0-PP-{rank}.trace.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="JSON written by microbench.dispatch")
    ap.add_argument("--out-dir", required=True, help="per-rank results go here")
    a = ap.parse_args(argv)
    cfg = json.loads(Path(a.config).read_text())
    out_dir = Path(a.out_dir)
    rank = int(os.environ.get("RANK", "0"))
    try:
        return _main(cfg, out_dir, rank)
    except BaseException as e:  # leave the rank's error where the launcher finds it
        msg = str(e).splitlines()[0] if str(e) else ""
        (out_dir / f"rank{rank}.error").write_text(f"rank {rank}: {type(e).__name__}: {msg}\n")
        raise


def _main(cfg: dict, out_dir: Path, rank: int) -> int:
    import torch
    import torch.distributed as dist

    state = server = None
    if cfg.get("serve"):
        if rank == 0:
            state, server = start_serving(cfg)
        serve_signals(state)
    try:
        return _run_rank(torch, dist, cfg, out_dir, rank, state)
    finally:
        if state is not None:
            state.close("the loop ended")
            server.shutdown()
            server.server_close()


def _run_rank(torch, dist, cfg: dict, out_dir: Path, rank: int, state) -> int:
    rc = start_rank(cfg["collective_timeout_s"], expect_world=cfg["pp"])
    pp, dev, gloo = rc.world, rc.device, rc.gloo
    H = cfg["hidden"]
    fwd, info = build_work(torch, cfg, rank, dev)
    sizes = loop_capture_sizes(cfg)
    graphs = capture_graphs(torch, fwd, sizes, H, dev) if cfg["graphs"] else {}
    emb_rows = max(cfg["concurrency"]) * cfg["prompt_len"]
    ctx = {"cfg": cfg, "rank": rank, "pp": pp, "gloo": gloo, "dev": dev, "fwd": fwd,
           "graphs": graphs, "capture_sizes": sizes if cfg["graphs"] else [],
           "emb": torch.randn(emb_rows, H, device=dev, dtype=torch.bfloat16),
           "inject": parse_inject(cfg.get("inject"), pp)}
    ctx.update(calibrate_injection(torch, ctx, sizes, H, dev))
    if ctx.get("fwd_us_table"):
        info["inject_fwd_us_by_batch"] = ctx["fwd_us_table"]
    # warm up every NCCL pair the loop uses, in the loop's order (hidden r->r+1, tokens last->0)
    x = torch.randn(4, H, device=dev, dtype=torch.bfloat16)
    if rank > 0:
        dist.recv(x, src=rank - 1)
    if rank < pp - 1:
        dist.send(x, dst=rank + 1)
    t = torch.zeros(4, dtype=torch.long, device=dev)
    if rank == pp - 1:
        dist.send(t, dst=0)
    if rank == 0:
        dist.recv(t, src=pp - 1)
    torch.cuda.synchronize()
    info["gloo_one_way_us"] = gloo_one_way_us(torch, dist, rank, pp, gloo)

    result = {"rank": rank, "pp": pp, "device": torch.cuda.get_device_name(dev),
              "torch": torch.__version__, "info": info, "capture_sizes": ctx["capture_sizes"],
              "points": []}
    path = out_dir / f"rank{rank}.json"
    write_json_atomic(path, result)
    bar = None
    if rank == 0 and not cfg.get("serve"):
        try:
            from tqdm import tqdm
            bar = tqdm(total=len(cfg["points"]), desc="dispatch", unit="point", file=sys.stderr)
        except ImportError:
            bar = None
    if cfg.get("serve"):   # one point: the whole session
        result["points"].append(serve_point(torch, dist, ctx, state))
        write_json_atomic(path, result)
    for point in ([] if cfg.get("serve") else cfg["points"]):
        prof, trace_path = _profile_ctx(torch, cfg, rank, point)
        if bar is not None:
            bar.set_postfix_str(f"{point['policy']} {point['arrival']} C={point['concurrency']}")
        with (prof if prof is not None else contextlib.nullcontext()):
            ctx["profiler"] = prof
            res = run_point(torch, dist, ctx, point)
        if prof is not None:
            trace_path.parent.mkdir(parents=True, exist_ok=True)
            export_trace(prof, Path(f"{trace_path}.gz"))
            # SGLang-format scheduler log beside the trace: the whole evidence path of a server
            log_path = Path(str(trace_path).replace(".trace.json", ".log"))
            log_path.write_text("\n".join(sglang_log_lines(
                res, cfg["prompt_len"], cfg["graphs"], ctx["capture_sizes"],
                time.time() - time.perf_counter())) + "\n")
        result["points"].append(res)
        write_json_atomic(path, result)  # write as you go: Ctrl-C keeps finished points
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    dist.barrier(group=gloo)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
