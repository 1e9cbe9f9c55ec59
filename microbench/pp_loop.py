"""One rank of a real pipeline-parallel decode loop with SGLang's discipline (run under torchrun).

What it measures: how the PP scheduler's loop itself costs time on real GPUs, separated from
kernels and from the model: per stage and per micro-batch, the time blocked waiting for input,
the *dispatch latency* (input available on the GPU -> first forward kernel starts), host time in
the loop body, GPU forward time and send time, plus slot occupancy and decode tok/s.

How (SGLang 0.5.23 managers/scheduler_pp_mixin.py, `event_loop_pp`): `pp + async_depth` slots
visited round-robin; rank 0 admits arrivals with `reports.base.slots.visit` (policy `sglang` or
`even`: per-slot cap, request rows, prefill token budget), a slot that admits runs that prefill
in its visit. Every iteration, on every rank, in SGLang's order (the functions of
microbench/pp_comm.py): rank r > 0 blocks on the pickled request list from rank r-1 (gloo)
and sends it on at once (async), empty slots included; a slot with a batch receives its hidden states (metadata
over gloo blocks the CPU, the tensor over NCCL makes the schedule stream wait); outputs are
exchanged -- before the forward when async_depth > 0 -- even ranks sending first: the last rank
sends the sampled tokens of the slot it ran `async_depth` iterations ago to rank 0, the other
ranks pass on what they received (last -> 0 -> 1 -> ...); the forward runs on its own stream
after the schedule stream; when slot s+1 holds a batch every rank blocks on the device-to-host
copy of its outputs (a CPU sync) before processing them; then the hidden states go to rank r+1
(metadata at once, the NCCL send after the forward's end event). Simplifications, on purpose:
requests never finish (steady decode); token ids stand for the whole output dict.

Stage work (microbench/pp_stage.py): `busy` (a `torch.cuda._sleep` kernel whose length follows
a cost-vs-batch curve, calibrated at start) or `moe` (real Kimi-K2-dims MoE layers in bf16: microbench.kernels.layers' MoE,
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
from microbench.kit.launch import recv_pyobj, start_rank
from reports.base.records import write_json_atomic
from reports.base.sglang_defaults import MAX_PREFILL_TOKENS
from reports.base.inject import parse_inject
from reports.base.slots import AdmitState, SlotConfig, Visit, visit
from microbench.pp_comm import (TAG_REQS, commit, drain_last_to_first, exchange_outputs,
                                gloo_one_way_us, isend_pyobj, new_loop_state, recv_proxy,
                                send_proxy, sync_outputs)
from microbench.pp_stage import build_work, calibrate_injection, capture_graphs


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
