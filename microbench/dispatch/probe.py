"""`ppscope dispatch`: SGLang's PP scheduler loop on real GPUs, to measure the herd directly.

What is measured and why: the user's hypothesis is that SGLang's PP scheduler "dispatches in a
way that wastes batching potential" (a burst of requests lands in one or two of the
`pp + async_depth` slots and stays there). This probe runs that loop discipline
(microbench/dispatch/pp_loop.py, one process per GPU under torchrun, gloo for the pickled request list,
NCCL for hidden states and returned tokens) with admission policy `sglang` and `even`, and
records per stage: time blocked waiting for input, dispatch latency (input available on the GPU
-> first forward kernel starts), host time per iteration, GPU forward time by micro-batch size,
send time, busy fraction; per run: slot sizes, decode tok/s and TPOT.

How to run: `ppscope dispatch --pp 2 --work moe --concurrency 1,8,32 --policies sglang,even`
(see `--help`); `make dispatch PP=8`. Writes `results/dispatch.json` and a Chrome/Perfetto trace
`results/dispatch.trace.json` (open in ui.perfetto.dev: one process per stage, one per slot).

How to read it: `tok_per_s` per (policy, C); `even_vs_sglang` gives the throughput ratio and, when
`even` does not help, why (the per-micro-batch forward cost at b vs b/m: with MoE every
micro-batch re-reads the experts it touches). `busy_frac` < 1 on a stage is pipeline bubble;
a large `dispatch_latency_us` means the host, not the GPU, paces the loop.

Serve mode (`--serve [HOST:]PORT`): the same loop, fed by HTTP clients instead of a scripted
burst; rank 0 answers an OpenAI-compatible endpoint with SGLang's control routes
(microbench/dispatch/serve.py, microbench/dispatch/serve_http.py) until Ctrl-C / SIGTERM / `--seconds`. The session
is one point (arrival `served`, concurrency = the peak of running requests) in
`results/dispatch_serve.json`, so it never replaces the benchmark record the report reads.

`--device cpu` runs the same loop without a GPU, as SGLang's `--device cpu` does (gloo between
the ranks, the `busy` forward on the host; microbench/dispatch/pp_device.py): its traces and logs are then
checked against SGLang's own CPU recording (tests/test_pp_probe_vs_sglang.py).

Pure functions here (summaries, trace) run on CPU and are tested there; only `run` launches ranks.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from microbench.kit import launch
from microbench.kit.gpus import visible_gpus
from reports.base.payloads.dispatch import (DispatchData, DispatchSettings, HopInLoop, HopStat,
                                            PolicyComparison, PolicyRun, Quantiles, StageRun)
from reports.base.records import (Record, json_text, make_record, save_record,
                                  write_json_atomic)
from reports.base.server_settings import ServerSettings
from reports.base.sglang_defaults import MAX_PREFILL_TOKENS, MRR_MIN, default_decode_max_bs
from microbench.dispatch.rank_config import RankConfig, ServeAt, rank_config

PROBE = "dispatch"
ARRIVALS = ("burst", "staggered", "poisson")
WORKS = ("busy", "moe")
DEVICES = ("cuda", "cpu")   # cpu: as SGLang's --device cpu (microbench/dispatch/pp_device.py)


@dataclass(frozen=True)
class DispatchConfig:
    pp: int = 2
    async_depth: int | None = None          # None: = pp (the seed's PP8 uses 8)
    max_running_requests: int = MRR_MIN     # SGLang's derived default, at its floor (no KV pool)
    max_micro_batch: int | None = None      # None: max(max_running_requests // pp, 1)
    # prefill token budget per slot visit; SGLang 0.5.23's default for 90-160 GB GPUs (H200,
    # RTX PRO 6000: arg_groups/memory_hook.py); <= 0 turns chunked prefill off
    chunked_prefill_size: int | None = 8192
    max_prefill_tokens: int = MAX_PREFILL_TOKENS
    micro_batches: int | None = None        # `even` policy: None = pp
    work: str = "moe"
    moe_variant: str = "auto"               # pp_loop.MOE_VARIANTS: auto | triton | fast | plain
    layers_per_stage: int = 2
    cost_us: str = "1:800,8:900,32:1200"
    model: str = "kimi-k2"
    graphs: bool = True
    concurrency: tuple[int, ...] = (1, 8, 32)
    policies: tuple[str, ...] = ("sglang", "even")
    arrivals: tuple[str, ...] = ("burst",)
    prompt_len: int = 16
    stagger_ms: float = 2.0
    poisson_rate_per_s: float = 500.0
    seconds_per_point: float = 2.0
    max_iters_per_point: int = 20000
    seed: int = 0
    collective_timeout_s: float = 120.0
    timeout_s: float = 600.0
    profile_dir: str | None = None
    json_path: str = "results/dispatch.json"
    trace_path: str | None = None           # None: next to json_path, .trace.json
    trace_ms_per_point: float = 300.0
    torchrun_args: tuple[str, ...] = ()
    inject: tuple[str, ...] = ()            # fault switches, reports.base.inject specs
    serve: str | None = None                # "[HOST:]PORT": serve mode (microbench/dispatch/serve.py)
    serve_seconds: float | None = None      # serve mode: stop after this long (None: on a signal)
    device: str = "cuda"                    # "cpu": gloo only, the forward on the host (DEVICES)
    argv: tuple[str, ...] = field(default=(), compare=False)

    @property
    def server(self) -> ServerSettings:
        """The settings the loop runs with, as SGLang's (async depth None: = pp; the cap
        resolved, SGLang's default where not given; no CUDA graph on a CPU)."""
        s = ServerSettings(
            pp_size=self.pp, pp_async_batch_depth=self.pp if self.async_depth is None
            else self.async_depth, max_running_requests=self.max_running_requests,
            pp_max_micro_batch_size=self.max_micro_batch or None,
            chunked_prefill_size=self.chunked_prefill_size,
            max_prefill_tokens=self.max_prefill_tokens,
            disable_cuda_graph=not (self.graphs and self.device == "cuda"))
        return replace(s, pp_max_micro_batch_size=s.max_micro_batch)


def available(device: str = "cuda") -> str | None:
    """None if the probe can run here, else the reason."""
    try:
        import torch  # noqa: F401
        import torch.distributed as dist
    except ImportError:
        return "torch is not installed"
    if not dist.is_available():
        return "this torch build has no torch.distributed"
    if device == "cpu":
        return None if dist.is_gloo_available() else "this torch build has no gloo backend"
    n = visible_gpus()
    if n < 2:
        return f"needs at least 2 GPUs for a pipeline, {n} visible"
    return None


def resolve_pp(pp: str | int, n_gpus: int) -> int:
    """`auto` -> number of visible GPUs; a number is checked against it (one-line errors)."""
    if str(pp) == "auto":
        if n_gpus < 2:
            raise ValueError(f"--pp auto: needs at least 2 GPUs, {n_gpus} visible")
        return n_gpus
    try:
        v = int(pp)
    except ValueError:
        raise ValueError(f"--pp must be a number or 'auto', got {pp!r}") from None
    if v < 2:
        raise ValueError(f"--pp must be >= 2 (a pipeline), got {v}")
    if v > n_gpus:
        raise ValueError(f"--pp {v} needs {v} GPUs but only {n_gpus} are visible")
    return v


def loop_config(cfg: DispatchConfig) -> dict:
    """The JSON the ranks read (`RankConfig`'s wire form)."""
    return rank_config_of(cfg).to_wire()


def rank_config_of(cfg: DispatchConfig) -> RankConfig:
    """What every rank runs: the settings, dimensions from the model preset, the points.
    A bad config is a one-line ValueError before anything runs."""
    from reports.base.model_config import load_model

    m = load_model(cfg.model)
    if cfg.work == "moe" and not m.n_routed_experts:
        raise ValueError(f"--work moe needs a MoE model; {m.name} is dense")
    if cfg.device not in DEVICES:
        raise ValueError(f"--device must be one of {', '.join(DEVICES)}, got {cfg.device!r}")
    if cfg.device == "cpu" and cfg.work != "busy":
        raise ValueError("--device cpu runs --work busy only (the MoE stage needs a GPU)")
    from microbench.dispatch.pp_loop import parse_cost_curve
    pts = parse_cost_curve(cfg.cost_us) if cfg.work == "busy" else []
    from reports.base.inject import parse_inject
    parse_inject(cfg.inject, cfg.pp)  # one-line ValueError before anything runs
    points = [{"policy": p, "arrival": a, "concurrency": c, "inject": list(cfg.inject)}
              for a in cfg.arrivals for c in cfg.concurrency for p in cfg.policies]
    serve = None
    concurrency = list(cfg.concurrency)
    if cfg.serve:
        from microbench.dispatch.serve_http import parse_address
        host, port = parse_address(cfg.serve)
        if len(cfg.policies) != 1:
            raise ValueError("--serve runs one admission policy; give one with --policies")
        serve = ServeAt(host, port, cfg.policies[0], cfg.serve_seconds)
        # one point: the whole session (its concurrency is set to the peak running requests);
        # buffers and capture sizes are sized for max_running_requests, the captured decode
        # sizes stop at SGLang's default cuda_graph_max_bs for this GPU's memory (larger
        # batches run eager, as on the server)
        from microbench.kit.gpus import first_gpu_mem_mib
        points = [{"policy": cfg.policies[0], "arrival": "served", "concurrency": 1,
                   "inject": list(cfg.inject)}]
        concurrency = [min(cfg.max_running_requests, default_decode_max_bs(first_gpu_mem_mib()))]
    return RankConfig(
        server=cfg.server, work=cfg.work, moe_variant=cfg.moe_variant,
        layers_per_stage=cfg.layers_per_stage, cost_points=tuple(pts), model=m.name,
        hidden=m.hidden, moe_intermediate=m.moe_intermediate,
        n_routed_experts=m.n_routed_experts, top_k=m.top_k,
        n_shared_experts=m.n_shared_experts, device=cfg.device,
        micro_batches=cfg.micro_batches, concurrency=tuple(concurrency),
        prompt_len=cfg.prompt_len, stagger_ms=cfg.stagger_ms,
        poisson_rate_per_s=cfg.poisson_rate_per_s, seconds_per_point=cfg.seconds_per_point,
        max_iters_per_point=cfg.max_iters_per_point, seed=cfg.seed,
        collective_timeout_s=cfg.collective_timeout_s, profile_dir=cfg.profile_dir,
        inject=tuple(cfg.inject), serve=serve, points=tuple(points))


# ---------------------------------------------------------------------------------------------
# Summaries (pure; CPU-tested)

def _pct(v: list[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(v, dtype=float), q)) if v else None


def stage_summary(pt: dict) -> StageRun:
    """One rank's raw columns for one point -> the `stages[]` entry of dispatch.json.
    Only iterations in the measurement window (`measure`) count."""
    c = pt["columns"]
    idx = [i for i, m in enumerate(c["measure"]) if m]
    disp, wait, host, send, busy = [], [], [], [], 0.0
    host_empty, host_busy, commit_wait = [], [], []
    phase: dict[str, list[float]] = {"sched_us": [], "launch_us": [], "process_us": []}
    gpu_by_b: dict[int, list[float]] = {}
    for i in idx:
        wait.append(c["wait_us"][i])
        host.append((c["t_end"][i] - c["t_start"][i]) * 1e6 - c["wait_us"][i])
        (host_busy if c["rows"][i] else host_empty).append(host[-1])
        if "wait_commit_us" in c:
            commit_wait.append(c["wait_commit_us"][i])
        for k in phase:   # a probe with SGLang's phase split (microbench/dispatch/pp_loop.py)
            v = (c.get(k) or [None] * len(c["it"]))[i]
            if v is not None and (c["rows"][i] or k == "process_us"):
                phase[k].append(v)
        fs, fe = c["t_fs"][i], c["t_fe"][i]
        if fs is None or fe is None:
            continue
        busy += fe - fs
        gpu_by_b.setdefault(c["rows"][i], []).append((fe - fs) * 1e6)
        if c["t_in"][i] is not None:
            disp.append(max(0.0, (fs - c["t_in"][i]) * 1e6))
        if c["t_se"][i] is not None:
            send.append(max(0.0, (c["t_se"][i] - fe) * 1e6))
    fss = [c["t_fs"][i] for i in idx if c["t_fs"][i] is not None]
    fes = [c["t_fe"][i] for i in idx if c["t_fe"][i] is not None]
    span = (max(fes) - min(fss)) if fss and fes else 0.0
    return StageRun(
        rank=pt["rank"],
        busy_frac=busy / span if span > 0 else None,
        dispatch_latency_us=Quantiles(_pct(disp, 50), _pct(disp, 99), len(disp)),
        wait_us_p50=_pct(wait, 50),
        host_us_p50=_pct(host, 50),
        host_empty_us_p50=_pct(host_empty, 50),   # empty slot: request-list relay only
        host_busy_us_p50=_pct(host_busy, 50),
        sched_us_p50=_pct(phase["sched_us"], 50),
        launch_us_p50=_pct(phase["launch_us"], 50),
        process_us_p50=_pct(phase["process_us"], 50),
        commit_wait_us_p50=_pct(commit_wait, 50),
        gpu_us_p50={str(b): _pct(v, 50) for b, v in sorted(gpu_by_b.items())},
        send_us_p50=_pct(send, 50),
        iterations=len(idx),
        busy_frac_series=tuple(busy_series(pt)),
    )


def busy_series(pt: dict, bins: int = 20) -> list[dict]:
    """Busy fraction of the GPU forward over the whole point (warm-up included), `bins` bins."""
    c = pt["columns"]
    iv = [(fs, fe) for fs, fe in zip(c["t_fs"], c["t_fe"]) if fs is not None and fe is not None]
    if not iv:
        return []
    t0 = pt["t_point_start"]
    t1 = max(fe for _, fe in iv)
    if t1 <= t0:
        return []
    w = (t1 - t0) / bins
    out = []
    for k in range(bins):
        a, b = t0 + k * w, t0 + (k + 1) * w
        cov = sum(max(0.0, min(fe, b) - max(fs, a)) for fs, fe in iv)
        out.append({"t_ms": round((a - t0) * 1e3, 3), "busy_frac": round(cov / w, 4)})
    return out


def run_summary(points_by_rank: list[dict]) -> PolicyRun:
    """All ranks' results for one point -> one `runs[]` entry (throughput from rank 0)."""
    r0 = next(p for p in points_by_rank if p["rank"] == 0)
    c, S = r0["columns"], r0["slots"]
    idx = [i for i, m in enumerate(c["measure"]) if m]
    point = r0["point"]
    sizes = list(r0.get("slot_sizes") or [0] * S)   # rank 0's admission state at the end
    if "slot_sizes" not in r0:  # an older probe: count the prefills (no chunking then)
        for i, s in enumerate(c["slot"]):
            if c["kind"][i] == "prefill":
                sizes[s] += c["n"][i]
    tok, visits, span = 0, [0] * S, 0.0
    if len(idx) >= 2:
        # window: from the first measured iteration to the start of the last one
        span = c["t_start"][idx[-1]] - c["t_start"][idx[0]]
        for i in idx[:-1]:
            if c["kind"][i] == "decode":
                tok += c["n"][i]
                visits[c["slot"][i]] += 1
    tps = tok / span if span > 0 else None
    per_req = [span / visits[s] * 1e3 for s in range(S) for _ in range(sizes[s]) if visits[s]]
    return PolicyRun(
        policy=point["policy"], arrival=point["arrival"], concurrency=point["concurrency"],
        tok_per_s=tps,
        tpot_ms=float(np.mean(per_req)) if per_req else None,
        slot_sizes=tuple(sizes),
        admitted=r0.get("admitted"),
        window_s=span,
        decode_tokens=tok,
        stages=tuple(stage_summary(p) for p in sorted(points_by_rank, key=lambda p: p["rank"])),
        injected=tuple(point.get("inject") or ()),
    )


def hop_in_loop(points_by_rank: list[dict]) -> HopInLoop:
    """Per hop r -> r+1: sender's forward end -> receiver's input available, same iteration,
    only where the receiver's GPU was idle before (so the gap is the transfer, not a queue)."""
    by_rank = {p["rank"]: p["columns"] for p in points_by_rank}
    out: dict[str, HopStat] = {}
    allv = []
    for r in sorted(by_rank):
        if r + 1 not in by_rank:
            continue
        a, b = by_rank[r], by_rank[r + 1]
        bi = {it: i for i, it in enumerate(b["it"])}
        prev_fe_b, vals = None, []
        last_fe = {}
        for j, fe in enumerate(b["t_fe"]):
            last_fe[b["it"][j]] = prev_fe_b
            if fe is not None:
                prev_fe_b = fe
        for i, it in enumerate(a["it"]):
            j = bi.get(it)
            if j is None or a["t_fe"][i] is None or b["t_in"][j] is None:
                continue
            idle_before = last_fe.get(it)
            if idle_before is not None and idle_before > a["t_fe"][i]:
                continue  # receiver still busy when the data left: a queue, not a hop
            vals.append((b["t_in"][j] - a["t_fe"][i]) * 1e6)
        allv += vals
        out[f"{r}->{r + 1}"] = HopStat(_pct(vals, 50), _pct(vals, 10), len(vals))
    return HopInLoop(_pct(allv, 50), _pct(allv, 10), len(allv), by_hop=out)


def _p50_at(stages: tuple[StageRun, ...], b: int) -> float | None:
    """Slowest stage's p50 forward time for micro-batches of b requests, if measured."""
    v = [s.gpu_us_at(b) for s in stages]
    v = [x for x in v if x is not None]
    return max(v) if v else None


def compare_policies(runs: tuple[PolicyRun, ...], pp: int) -> tuple[PolicyComparison, ...]:
    """even/sglang throughput ratio per (arrival, C) and, if even does not help, why."""
    out = []
    for r in runs:
        if r.policy != "sglang":
            continue
        ev = next((e for e in runs if e.policy == "even" and e.arrival == r.arrival
                   and e.concurrency == r.concurrency), None)
        if ev is None or not r.tok_per_s or not ev.tok_per_s:
            continue
        ratio = ev.tok_per_s / r.tok_per_s
        out.append(PolicyComparison(
            arrival=r.arrival, concurrency=r.concurrency, ratio=ratio,
            sglang_tok_per_s=r.tok_per_s, even_tok_per_s=ev.tok_per_s,
            sglang_slot_sizes=r.slot_sizes, even_slot_sizes=ev.slot_sizes,
            why_not=why_even_does_not_help(r, ev, pp) if ratio < 1.02 else None))
    return tuple(out)


def why_even_does_not_help(sg: PolicyRun, ev: PolicyRun, pp: int) -> str:
    big = max(sg.slot_sizes)
    parts = [x for x in ev.slot_sizes if x]
    m = len(parts)
    if sg.concurrency <= 1 or m <= 1:
        return f"C={sg.concurrency}: one request cannot be split; both policies use one slot"
    small = max(parts)
    sg_used = sum(1 for x in sg.slot_sizes if x)
    t_big = _p50_at(sg.stages, big)
    t_small = _p50_at(ev.stages, small)
    msg = (f"C={sg.concurrency}: sglang runs {sg_used} micro-batch(es) of up to {big}, "
           f"even runs {m} of up to {small}")
    if t_big is not None and t_small is not None:
        msg += (f"; slowest stage forward {t_big:.0f} us at b={big} vs {t_small:.0f} us at "
                f"b={small}, so one round costs {m * t_small:.0f} us of stage time for even "
                f"vs {sg_used * t_big:.0f} us for sglang")
        if m * t_small >= sg_used * t_big * 0.98:
            msg += (" (a micro-batch costs nearly as much at b/m as at b: with MoE each "
                    "micro-batch re-reads the experts its tokens touch)")
    busy = [s.busy_frac for s in sg.stages if s.busy_frac is not None]
    if busy and min(busy) > 0.8:
        msg += f"; under sglang every stage is already {min(busy):.0%}+ busy, no bubble to fill"
    if m < pp:
        msg += f"; fewer micro-batches ({m}) than stages ({pp})"
    return msg


def moe_backend_of(info_by_rank: dict) -> str | None:
    """The MoE backend the stages ran: one name when every rank agrees, else the distinct
    names joined with ',' (sorted); None without MoE work."""
    names = sorted({i["moe_backend"] for i in info_by_rank.values() if i.get("moe_backend")})
    return ",".join(names) if names else None


def summarize(loop_cfg: RankConfig | dict, rank_results: list[dict],
              nccl_p2p_disabled: bool) -> DispatchData:
    """Per-rank JSONs -> the dispatch.json data payload (finished points only). `loop_cfg`:
    what the ranks ran (or its wire form)."""
    loop_cfg = rank_config(loop_cfg)
    npts = min((len(r["points"]) for r in rank_results), default=0)
    runs, hops = [], []
    for k in range(npts):
        pts = [r["points"][k] for r in rank_results]
        runs.append(run_summary(pts))
        hops.append(hop_in_loop(pts))
    runs = tuple(runs)
    allv = [h.p50_us for h in hops if h.p50_us is not None]
    info = {str(r["rank"]): r.get("info", {}) for r in rank_results}
    return DispatchData(
        config=settings_of(loop_cfg, nccl_p2p_disabled, info,
                           rank_results[0].get("capture_sizes") if rank_results else ()),
        runs=runs,
        even_vs_sglang=compare_policies(runs, loop_cfg.pp),
        hop_us_in_loop=float(np.median(allv)) if allv else None,
        hop_detail=tuple(hops),
        ranks=info,
        devices={str(r["rank"]): r.get("device") for r in rank_results},
        profile_dir=loop_cfg.profile_dir,
    )


def settings_of(loop_cfg: RankConfig, nccl_p2p_disabled: bool, info: dict | None = None,
                capture_sizes=()) -> DispatchSettings:
    """The loop's settings as run (the record's `config`)."""
    info = info or {}
    layers = [i.get("layers_used") for i in info.values() if i.get("layers_used") is not None]
    moe = loop_cfg.work == "moe"
    s = loop_cfg.server
    return DispatchSettings(
        pp=s.pp_size, async_depth=s.pp_async_batch_depth, slots=s.slots,
        max_micro_batch=s.max_micro_batch, micro_batches=loop_cfg.micro_batches,
        work=loop_cfg.work,
        # the layer actually run (microbench.kernels.layers backend/variant, as stage-cost);
        # ranks choose on their own: if they differ, all are named (per rank in `ranks`)
        moe_variant=loop_cfg.moe_variant, moe_backend=moe_backend_of(info),
        layers_per_stage=(min(layers) if layers else loop_cfg.layers_per_stage) if moe else 0,
        model=loop_cfg.model, dtype="bf16", graphs=s.graphs,
        nccl_p2p_disabled=nccl_p2p_disabled, prompt_len=loop_cfg.prompt_len,
        cost_points_us=loop_cfg.cost_points, capture_sizes=tuple(capture_sizes or ()),
        inject=loop_cfg.inject, max_running_requests=s.max_running_requests,
        chunked_prefill_size=s.chunked_prefill_size)


# ---------------------------------------------------------------------------------------------
# Chrome / Perfetto trace (pure)

def build_trace(rank_results: list[dict], trace_ms_per_point: float = 300.0) -> dict:
    """One process per stage (tracks: host loop, GPU forward, send) and one per slot
    (micro-batch passages, from rank 0's forward start to the last rank's forward end),
    plus slot-occupancy counters. Times in microseconds from the first point's start."""
    ev: list[dict] = []
    if not rank_results or not rank_results[0]["points"]:
        return {"traceEvents": ev, "displayTimeUnit": "ms"}
    origin = min(r["points"][0]["t_point_start"] for r in rank_results if r["points"])
    pp = len(rank_results)
    slots_pid = pp  # the "slots" process after the stages

    def us(t):
        return round((t - origin) * 1e6, 3)
    for r in rank_results:
        rk = r["rank"]
        ev.append({"ph": "M", "name": "process_name", "pid": rk, "args": {"name": f"stage {rk}"}})
        for tid, name in ((0, "host loop"), (1, "GPU forward"), (2, "send")):
            ev.append({"ph": "M", "name": "thread_name", "pid": rk, "tid": tid,
                       "args": {"name": name}})
    ev.append({"ph": "M", "name": "process_name", "pid": slots_pid, "args": {"name": "slots"}})
    npts = min(len(r["points"]) for r in rank_results)
    for k in range(npts):
        first = {}  # it -> (t of rank 0's fs)
        lastfe = {}
        label = None
        for r in rank_results:
            pt = r["points"][k]
            p = pt["point"]
            label = f"{p['policy']} {p['arrival']} C={p['concurrency']}"
            c = pt["columns"]
            t_lim = pt["t_point_start"] + trace_ms_per_point / 1e3
            for i, it in enumerate(c["it"]):
                if c["t_start"][i] > t_lim:
                    break
                a = {"it": it, "slot": c["slot"][i], "kind": c["kind"][i], "n": c["n"][i],
                     "point": label}
                ev.append({"ph": "X", "pid": r["rank"], "tid": 0, "name": c["kind"][i],
                           "ts": us(c["t_start"][i]),
                           "dur": round((c["t_end"][i] - c["t_start"][i]) * 1e6, 3), "args": a})
                fs, fe, se = c["t_fs"][i], c["t_fe"][i], c["t_se"][i]
                if fs is not None and fe is not None:
                    ev.append({"ph": "X", "pid": r["rank"], "tid": 1,
                               "name": f"slot {c['slot'][i]} b={c['rows'][i]}", "ts": us(fs),
                               "dur": round((fe - fs) * 1e6, 3), "args": a})
                    if r["rank"] == 0:
                        first[it] = (fs, c["slot"][i], c["kind"][i], c["n"][i])
                    if r["rank"] == pp - 1:
                        lastfe[it] = fe
                    if se is not None:
                        ev.append({"ph": "X", "pid": r["rank"], "tid": 2, "name": "send",
                                   "ts": us(fe), "dur": round(max(0.0, se - fe) * 1e6, 3)})
            if r["rank"] == 0:
                for t, sizes in pt.get("occupancy", []):
                    if t > t_lim:
                        break
                    ev.append({"ph": "C", "pid": slots_pid, "name": "requests per slot",
                               "ts": us(t), "args": {f"slot {s}": v for s, v in enumerate(sizes)}})
                ev.append({"ph": "i", "pid": slots_pid, "tid": 0, "s": "g", "name": label,
                           "ts": us(pt["t_point_start"])})
        for it, (fs, s, kind, n) in first.items():
            if it in lastfe:
                ev.append({"ph": "X", "pid": slots_pid, "tid": 100 + s,
                           "name": f"{kind} n={n}", "ts": us(fs),
                           "dur": round(max(0.0, lastfe[it] - fs) * 1e6, 3),
                           "args": {"it": it, "point": label}})
    slots = rank_results[0]["points"][0]["slots"]
    for s in range(slots):
        ev.append({"ph": "M", "name": "thread_name", "pid": slots_pid, "tid": 100 + s,
                   "args": {"name": f"slot {s}"}})
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


# ---------------------------------------------------------------------------------------------
# Launch

def _read_ranks(d: Path, pp: int) -> list[dict]:
    out = []
    for r in range(pp):
        p = d / f"rank{r}.json"
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return out


def _rank_errors(d: Path) -> list[str]:
    return [p.read_text().strip() for p in sorted(d.glob("rank*.error"))]


def trace_path_for(cfg: DispatchConfig) -> Path:
    if cfg.trace_path:
        return Path(cfg.trace_path)
    p = Path(cfg.json_path)
    return p.with_name(p.name[:-5] + ".trace.json" if p.name.endswith(".json")
                       else p.name + ".trace.json")


def torchrun_command(cfg: DispatchConfig, config_path: Path, out_dir: Path) -> list[str]:
    return launch.torchrun_command(cfg.pp, "microbench.dispatch.pp_loop",
                                   ["--config", str(config_path), "--out-dir", str(out_dir)],
                                   cfg.torchrun_args or ("--standalone",))


def run(cfg: DispatchConfig) -> tuple[Record, str | None]:
    """Launch the ranks, wait (with a timeout), merge what they wrote. Always returns a record
    (`ok`; `partial` when interrupted or timed out with points finished; `waived`; `error`) and
    the writer's note; `save_record`'s status rule keeps an existing good record from being
    replaced by a failed run. The config is checked (loop_config) before anything is written."""
    argv = list(cfg.argv) or None
    lcfg = rank_config_of(cfg)  # raises ValueError on a bad config: nothing written
    reason = available("cpu") if cfg.device == "cpu" else available()
    if reason:
        rec = make_record(PROBE, None, status="waived", reason=reason, argv=argv)
        return rec, save_record(rec, cfg.json_path)[1]
    p2p_off = os.environ.get("NCCL_P2P_DISABLE", "0") not in ("0", "")
    work = Path(tempfile.mkdtemp(prefix="ppscope-dispatch-"))
    cfg_path = work / "config.json"
    write_json_atomic(cfg_path, lcfg.to_wire())
    cmd = torchrun_command(cfg, cfg_path, work)
    status, why = "ok", None
    if cfg.serve:
        return _run_served(cfg, lcfg, cmd, work, p2p_off, argv)
    try:
        rc, timed_out = launch.run_group(cmd, launch.repo_env(), cfg.timeout_s, grace_s=30)
    except KeyboardInterrupt:
        _finish(cfg, lcfg, work, p2p_off, "partial", "interrupted (Ctrl-C); finished points kept",
                argv)
        raise
    if timed_out:
        status, why = "partial", f"timed out after {cfg.timeout_s:.0f} s (--timeout); finished points kept"
    elif rc != 0:
        errs = _rank_errors(work)
        status = "error"
        why = errs[0] if errs else f"torchrun exited with code {rc}"
    out = _finish(cfg, lcfg, work, p2p_off, status, why, argv)
    shutil.rmtree(work, ignore_errors=True)
    return out


def _run_served(cfg: DispatchConfig, lcfg: RankConfig, cmd: list[str], work: Path, p2p_off: bool,
                argv) -> tuple[Record, str | None]:
    """Serve mode: the ranks run until Ctrl-C / SIGTERM (or `--seconds`); rank 0 stops the
    loop at an iteration boundary, every rank writes its columns, and the record is written as
    for a benchmark run. A signal here is the normal end, not an interruption."""
    import signal
    import threading

    def term(signum, frame):
        raise KeyboardInterrupt
    main = threading.current_thread() is threading.main_thread()   # signals: main thread only
    old = signal.signal(signal.SIGTERM, term) if main else None
    how = None
    try:
        try:
            rc, timed_out = launch.run_group(cmd, launch.repo_env(), cfg.timeout_s, grace_s=60)
        except KeyboardInterrupt:
            rc, timed_out, how = None, False, "served until stopped (Ctrl-C / SIGTERM)"
    finally:
        if main:
            signal.signal(signal.SIGTERM, old)
    status, why = "ok", how
    if timed_out:
        status, why = "partial", f"stopped by --timeout after {cfg.timeout_s:.0f} s"
    elif rc not in (0, None):
        errs = _rank_errors(work)
        status, why = "error", errs[0] if errs else f"torchrun exited with code {rc}"
    out = _finish(cfg, lcfg, work, p2p_off, status, why, argv)
    shutil.rmtree(work, ignore_errors=True)
    return out


def _finish(cfg, lcfg, work: Path, p2p_off: bool, status, why, argv) -> tuple[Record, str | None]:
    ranks = _read_ranks(work, cfg.pp)
    data = summarize(lcfg, ranks, p2p_off) if len(ranks) == cfg.pp else None
    if data is None or not data.runs:
        if status in ("ok", "partial"):
            status, why = "error", (why + "; " if why else "") + "no point finished"
    notes = [n for i in (data.ranks if data else {}).values()
             for n in (i.get("note"), i.get("loop_note")) if n]
    if status == "ok" and notes:
        why = "; ".join(sorted(set(notes)) + ([why] if why else []))
    rec = make_record(PROBE, data, status=status, reason=why, argv=argv)
    # the trace goes with its record in one commit (never a new trace beside an old record);
    # a run kept beside a good record leaves that record's trace as it is
    trace = ([(trace_path_for(cfg), json_text(build_trace(ranks, cfg.trace_ms_per_point)))]
             if len(ranks) == cfg.pp else [])
    _, note = save_record(rec, cfg.json_path, with_files=trace)
    return rec, note
