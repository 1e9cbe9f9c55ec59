"""One rank of a real pipeline-parallel decode loop with SGLang's discipline (run under torchrun).

What it measures: how the PP scheduler's loop itself costs time on real GPUs, separated from
kernels and from the model: per stage and per micro-batch, the time blocked waiting for input,
the *dispatch latency* (input available on the GPU -> first forward kernel starts), host time in
the loop body, GPU forward time and send time, plus slot occupancy and decode tok/s.

How (SGLang 0.5.23 managers/scheduler_pp_mixin.py, `event_loop_pp`): `pp + async_depth` slots
visited round-robin. Every iteration, on every rank, in SGLang's order (the functions of
microbench/dispatch/pp_comm.py):
1. `recv_requests`: rank 0 takes the requests that have arrived (none: an empty list); rank
   r > 0 blocks on the pickled list from rank r-1 (gloo, SGLang's `point_to_point_pyobj`); every
   rank but the last sends it on at once (async, `send_reqs_to_next_stage`), empty lists
   included, so each stage's loop is chained to the previous stage's. The list carries the raw
   requests, before any scheduling (scheduler.py `recv_requests` / `ingest_requests`).
2. `get_next_batch_to_run`, on every rank: its own admission of what it received, with
   `reports.base.slots.visit` (policy `sglang` or `even`: per-slot cap, request rows, prefill
   token budget, chunking; prefill first: a slot that admits runs that prefill in its visit).
   The ranks reach the same batches because they schedule the same lists at the same
   iterations; each pays its own scheduling time, as SGLang's ranks do.
3. A slot with a batch receives its hidden states (no range, as `_pp_recv_proxy_tensors`): the
   metadata over gloo blocks the CPU, then two tensors, `hidden_states` and `residual` (NCCL:
   the schedule stream waits; gloo on the CPU: the CPU waits).
4. Outputs are exchanged -- before the forward when async_depth > 0 -- even ranks sending first
   (`send_res_dict_to_next_stage`, `recv_res_dict_from_prev_stage`): the last rank sends the
   sampled tokens of the slot it ran `async_depth` iterations ago to rank 0, the other ranks
   pass on what they received (last -> 0 -> 1 -> ...).
5. `run_batch`: the forward on its own stream after the schedule stream, inside a
   `step[DECODE bs=N]` / `step[EXTEND bs=N toks=T]` span (srt/utils/profile_utils.py).
6. When slot s+1 holds a batch every rank blocks on the device-to-host copy of its outputs (a
   CPU sync, no range) and runs `process_batch_result` for it, where its log line is written.
7. The hidden states go to rank r+1 (`send_proxy_dict_to_next_stage`: metadata at once, the
   tensors after the forward's end event), padded to the captured size where the forward
   replayed a graph (SGLang's graph runner returns the padded rows).
SGLang's nested `scheduler.*` ranges (observability/scheduler_stage_metrics.py) are recorded
too, and `scheduler.idle` after a pass over all slots that ran nothing (`on_idle`).
Messages per hop as SGLang's: request list 2 (an empty one 1), hidden states 4, outputs 3.

Kept different from SGLang, on purpose:
- requests never finish in the benchmark (steady decode); the list also carries the run's own
  controls (`measure` when steady decode starts, `stop` after the window), as SGLang's carries
  its control requests; token ids stand for the whole output dict; the stage work does not
  read the residual it is sent (it only travels);
- each message kind has its own gloo tag (SGLang: tag 0, tensor dicts sorted by
  `__msg_type__` on arrival); same messages, same order per channel;
- serve mode (below): rank 0 schedules the HTTP requests (their finishes, the controls) and
  relays its decision (always two messages); ranks > 0 do not schedule there;
- log lines: `#token` is prompt + one per request, `token usage` 0 (no KV pool); times carry
  milliseconds (SGLANG_LOG_MS=1);
- `--device cpu`: no CUDA graphs (as the lab's `--disable-cuda-graph`), the hidden-state
  send's end is not timed, an injected hop delay holds the sender (one thread).
`KEPT_DIFFERENCES` says this in one line in every record.

Device (microbench/dispatch/pp_device.py): `cuda` (NCCL for tensors, CUDA streams and events) or `cpu`
(SGLang's `--device cpu`: gloo for everything, the forward on the loop's thread, streams and
events replaced by host stand-ins; the same code path). Only the CUDA path has run on GPUs.

Stage work (microbench/dispatch/pp_stage.py): `busy` (a `torch.cuda._sleep` kernel whose length follows
a cost-vs-batch curve, calibrated at start; on the CPU a spin of that length) or `moe` (real Kimi-K2-dims MoE layers in bf16: microbench.kernels.layers' MoE,
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
microbench/dispatch/serve.py) and whose relayed request list also carries control commands, applied on
every rank at the same iteration (profiler start/stop through `RankProfiler`, the micro-batch
cap); requests finish after `max_tokens` and leave their slot. Only iterations with work are
kept as columns (the latest `max_iters_per_point`).

Run it through `ppscope dispatch` (microbench/dispatch/probe.py writes the config file and merges the
per-rank outputs). Directly: `torchrun --nproc-per-node 2 -m microbench.dispatch.pp_loop --config CFG.json
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
from dataclasses import replace
from pathlib import Path

from reports.base.cuda_graphs import capture_sizes, padded  # SGLang's decode capture rule
from microbench.kit.launch import start_rank
from reports.base.records import write_json_atomic
from reports.base.inject import parse_inject
from reports.base.slots import AdmitState, SlotConfig, visit
from microbench.dispatch.pp_comm import (TAG_REQS, commit, drain_last_to_first, exchange_outputs,
                                gloo_one_way_us, isend_list, new_loop_state, recv_list,
                                recv_proxy, send_proxy, sync_outputs)
from microbench.dispatch.pp_device import device_api, is_host, spin_us
from microbench.dispatch.rank_config import RankConfig, rank_config
from microbench.dispatch.pp_stage import build_work, calibrate_injection, capture_graphs


KEPT_DIFFERENCES = ("differs from SGLang on purpose: requests never finish, one gloo tag per "
                    "message kind, serve mode relays rank 0's admission (microbench/dispatch/pp_loop.py)")


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
                     clock_offset_s: float = 0.0, device: str = "cuda") -> list[str]:
    """One rank's point as SGLang 0.5.23's scheduler log lines, one per batch result processed
    (`process_batch_result`, --decode-log-interval 1), stamped at that time (the loop's
    perf_counter + `clock_offset_s`, the wall clock), in the layout of
    managers/scheduler_components/metrics_reporter.py `report_decode_stats` /
    `report_prefill_stats`:
    `[time PPr] Decode batch, #running-req: N, #token: N, token usage: X, cuda graph: B, gen
    throughput (token/s): X, #queue-req: N` and `[time PPr] Prefill batch, #new-seq: N,
    #new-token: N, #cached-token: 0, token usage: X, #running-req: N, #queue-req: N,
    #pending-token: 0, cuda graph: False, input throughput (token/s): X` (`cpu graph` on the
    CPU). Times carry milliseconds, as SGLang writes them with SGLANG_LOG_MS=1. Under PP
    `#running-req` of a decode line is the size of the slot's batch; throughputs are this
    rank's tokens since its previous line of the same kind over the time since then (SGLang's
    `num_generated_tokens / gap_latency`). `#token` counts prompt + one token per request
    (the KV pool is not modelled; `token usage` is 0)."""
    r, rank = res["results"], res["rank"]
    label = "cpu graph" if device == "cpu" else "cuda graph"
    out = []
    last = {"decode": res["t_point_start"], "prefill": res["t_point_start"]}
    for t, kind, n, rows, running, queue in zip(r["t"], r["kind"], r["n"], r["rows"],
                                                r["running"], r["queue"]):
        if kind == "idle" or not n:
            continue
        ts = datetime.datetime.fromtimestamp(t + clock_offset_s).strftime(
            "%Y-%m-%d %H:%M:%S.%f")[:-3]
        gap, last[kind] = t - last[kind], t
        if kind == "prefill":
            out.append(f"[{ts} PP{rank}] Prefill batch, #new-seq: {n}, #new-token: {rows}, "
                       f"#cached-token: 0, token usage: 0.00, #running-req: {running or 0}, "
                       f"#queue-req: {queue}, #pending-token: 0, {label}: False, "
                       f"input throughput (token/s): {rows / gap if gap > 0 else 0.0:.2f}")
            continue
        graph = graphs_on and bool(capture) and padded(n, capture[-1]) is not None
        out.append(f"[{ts} PP{rank}] Decode batch, #running-req: {n}, #token: "
                   f"{n * (prompt_len + 1)}, token usage: 0.00, {label}: {graph}, "
                   f"gen throughput (token/s): {n / gap if gap > 0 else 0.0:.2f}, "
                   f"#queue-req: {queue}")
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

def _request(rid: int, prompt_len: int) -> dict:
    """One arrival as the request list carries it (SGLang relays its tokenized requests, the
    prompt's token ids included, pickled)."""
    return {"rid": str(rid), "input_ids": [1] * prompt_len}


def step_name(kind: str, n: int, rows: int) -> str:
    """SGLang's span per forward (srt/utils/profile_utils.py `build_step_span_name`): the raw
    batch size, and the extend tokens of a prefill."""
    return f"step[EXTEND bs={n} toks={rows}]" if kind == "prefill" else f"step[DECODE bs={n}]"


def run_point(torch, dist, ctx: dict, point: dict) -> dict:
    """One (policy, arrival, concurrency) point; returns this rank's raw columns.

    Each iteration follows SGLang's order (see the mechanics above): recv_requests (+ send them
    on at once), get_next_batch_to_run (every rank), proxy receive, output exchange (before the
    forward when async_depth > 0, after it when 0), run_batch, sync on slot s+1's outputs and
    process them (its log line), proxy send."""
    loop = PointLoop(torch, dist, ctx, point)
    while loop.iteration():
        pass
    return loop.finish()


COLUMNS = ("it", "slot", "kind", "n", "rows", "measure", "t_start", "t_end", "wait_us",
           "wait_req_us", "wait_proxy_us", "wait_out_us", "wait_sync_us", "wait_commit_us",
           "sched_us", "launch_us", "process_us", "ev")
RESULTS = ("t", "slot", "kind", "n", "rows", "running", "queue")


class _Step:
    """What one iteration carries from one of its steps to the next: its slot, the time waited
    in each blocking call, the batch it runs, its inputs and outputs, its GPU events."""

    def __init__(self, it: int, s: int) -> None:
        self.it, self.s = it, s
        self.t_start = time.perf_counter()
        self.ev: dict = {}
        self.w_req = self.w_proxy = self.w_out = self.w_sync = self.w_commit = 0.0
        self.kind, self.n, self.rows = "idle", 0, 0
        self.sched_us = self.launch_us = 0.0
        self.process_us: float | None = None
        self.pb: int | None = None     # the captured size the batch pads to (graph replay)
        self.g = self.gx = self.gy = None   # that graph and its static input/output buffers
        self.x = self.y = None
        self.got = None                # the outputs of slot s+1, once exchanged


class PointLoop:
    """One point of the loop on this rank (`run_point`): the state SGLang's scheduler keeps
    between iterations (its admission, the waiting queue, the slots' last batches, the measured
    window, the run's controls) and one method per step of `event_loop_pp`'s iteration, called
    in its order by `iteration`; `finish` turns the columns into this rank's result."""

    def __init__(self, torch, dist, ctx: dict, point: dict) -> None:
        self.torch, self.dist, self.ctx, self.point = torch, dist, ctx, point
        cfg, rank, pp = rank_config(ctx["cfg"]), ctx["rank"], ctx["pp"]
        self.cfg, self.rank, self.pp = cfg, rank, pp
        self.last, self.gloo, self.dev, self.H = pp - 1, ctx["gloo"], ctx["dev"], cfg.hidden
        self.api = api = ctx.get("api") or torch.cuda
        self.scfg = SlotConfig.of(cfg.server)
        self.S, self.depth = cfg.server.slots, cfg.async_depth
        # serve mode: (rank 0's ServeScheduler or None, RankSide)
        self.serve = serve = ctx.get("serve")

        def rf(name):   # SGLang's range names, while a profiler records (serve: it comes and goes)
            return torch.profiler.record_function(name) if ctx.get("profiler") is not None \
                else contextlib.nullcontext()
        self.rf = ctx["rf"] = rf
        self.graphs, self.sizes = ctx["graphs"], ctx["capture_sizes"]
        self.emb = ctx["emb"]  # rank 0's stand-in for the embedding output, [rows, H]
        self.C = C = point["concurrency"]

        # host-clock reference for GPU events
        dist.barrier(group=self.gloo)
        api.synchronize()
        t0 = time.perf_counter()
        self.ref = ref = api.Event(enable_timing=True)
        ref.record()
        ref.synchronize()
        t1 = time.perf_counter()
        self.t_ref, self.ref_err_us = (t0 + t1) / 2, (t1 - t0) / 2 * 1e6
        self.start = t1
        self.arrivals = arrival_times(point["arrival"], C, cfg.stagger_ms,
                                      cfg.poisson_rate_per_s, cfg.seed) \
            if rank == 0 and serve is None else []

        self.cols: dict[str, list] = {k: [] for k in COLUMNS}
        self.results: dict[str, list] = {k: [] for k in RESULTS}
        self.occupancy: list = []  # rank 0: (t, sizes) after admission
        # every rank's own admission state (SGLang: its scheduler)
        self.adm = AdmitState.empty(self.scfg)
        self.waiting: list[int] = []   # prompt lengths of requests received, not yet admitted
        self.lp = lp = new_loop_state(torch, cfg, pp, rank, api)
        ctx["side"] = api.Stream()
        self.late = api.Stream()
        inj = ctx["inject"]
        self.slow = inj["slow_stage"].get(rank, 0.0)
        self.host_delay_s = inj["host_delay_us"].get(rank, 0.0) / 1e6
        self.hop_delay_us = inj["hop_delay_us"]
        self.delay = ctx.get("delay") or \
            (lambda us: torch.cuda._sleep(max(1, int(us * ctx["cyc_per_us"]))))
        self.pulled = self.admitted = 0
        self.window = None  # rank 0: (first measured iteration, its time)
        self.measure = self.stop = False
        self.no_admit_rounds, self.it, self.pass_idle = 0, 0, True
        self.max_iters = cfg.max_iters_per_point
        self.seconds = cfg.seconds_per_point
        lp["rows_tail"] = {}   # it -> rows of the last few iterations (drain_last_to_first)
        self.setup_deadline = self.start + max(5.0, 3 * self.seconds)

    def pull(self) -> list:
        """Rank 0's recv_requests: the streams that have arrived since the last pull, and the
        run's own controls (SGLang relays control requests in the same list): `measure` once
        steady decode is reached, then `stop` after the measured window."""
        it, max_iters, C = self.it, self.max_iters, self.C
        now = time.perf_counter() - self.start
        out = []
        if self.window is None and not (it >= 4 * max_iters) and (
                (self.admitted == C and not self.adm.chunk_left and self.no_admit_rounds >= 2)
                or (self.no_admit_rounds >= 4 and all(a <= now for a in self.arrivals))
                or time.perf_counter() > self.setup_deadline):
            self.window = (it, now)  # steady decode from here on
            out.append({"ctl": "measure"})
        elif (self.window is not None and (now - self.window[1] >= self.seconds
                                           or it - self.window[0] >= max_iters)
              ) or it >= 4 * max_iters:
            out.append({"ctl": "stop"})
        while self.pulled < C and self.arrivals[self.pulled] <= now:
            out.append(_request(self.pulled, self.cfg.prompt_len))
            self.pulled += 1
        return out

    def iteration(self) -> bool:
        """One visit of slot it % S, SGLang's steps in order; False once the run stopped."""
        s = self.it % self.S
        if s == 0:
            self.pass_idle = True
        st = _Step(self.it, s)
        reqs = self.recv_requests(st)
        self.send_requests(st, reqs)
        if self.serve is not None:   # control commands: every rank, this same iteration
            for c in reqs["ctl"]:
                self.serve[1].apply(c, st.it)
        if self.stop:   # the outputs the next rank still expects, then stop
            exchange_outputs(self.torch, self.dist, self.ctx, self.lp, s, drain=True)
            return False
        self.get_next_batch(st)
        self.inputs(st)
        for phase in (("exchange", "launch") if self.depth > 0 else ("launch", "exchange")):
            if phase == "exchange":
                self.exchange(st)
            else:
                self.launch(st)
        self.process_result(st)
        self.send_hidden(st)
        if s == self.S - 1 and self.pass_idle:   # SGLang's on_idle after a pass that ran nothing
            with self.rf("scheduler.idle"):
                pass
        self.it += 1
        self.record(st)
        return True

    # ---- 1. recv_requests: rank 0 pulls arrivals; the others get rank r-1's list and send it
    # on at once (empty lists included: every rank's loop is chained to the last)
    def recv_requests(self, st: _Step):
        rf, serve = self.rf, self.serve
        with rf("recv_requests"):
            with rf("scheduler.recv_requests"):
                if self.rank == 0:
                    reqs = serve[0].visit(st.it, st.s) if serve is not None else self.pull()
                else:
                    tw = time.perf_counter()
                    reqs = recv_list(self.torch, self.dist, self.rank - 1, self.gloo, TAG_REQS)
                    st.w_req = (time.perf_counter() - tw) * 1e6
            with rf("scheduler.process_input_requests"):
                if serve is not None:   # serve mode relays rank 0's decision (docstring)
                    self.stop, st.kind, st.n, st.rows, self.measure = (
                        reqs["stop"], reqs["kind"], reqs["n"], reqs["rows"], reqs["measure"])
                    if self.window is None and self.measure:
                        self.window = (st.it, 0.0)
                for r in ([] if serve is not None else reqs):
                    if "ctl" in r:
                        self.stop = self.stop or r["ctl"] == "stop"
                        self.measure = self.measure or r["ctl"] == "measure"
                    else:
                        self.waiting.append(len(r["input_ids"]))
        return reqs

    def send_requests(self, st: _Step, reqs) -> None:
        """`send_reqs_to_next_stage`, after the previous send to rank r+1 was committed."""
        if self.rank < self.last:
            st.w_commit += commit(self.lp["req_work"])
            with self.rf("send_reqs_to_next_stage"):
                self.lp["req_work"] = isend_list(self.torch, self.dist, reqs, self.rank + 1,
                                                 self.gloo, TAG_REQS)

    # ---- 2. get_next_batch_to_run: every rank runs its own admission on what it received
    def get_next_batch(self, st: _Step) -> None:
        s, adm, lp = st.s, self.adm, self.lp
        t_sched = time.perf_counter()
        with self.rf("get_next_batch_to_run"), self.rf("scheduler.get_next_batch_to_run"):
            running = sum(adm.sizes)
            if self.serve is None:
                vis = visit(adm, self.waiting, s, self.scfg, self.point["policy"],
                            self.cfg.micro_batches)
                del self.waiting[:vis.taken]
                self.admitted += vis.taken
                if vis.batch:   # prefill first: this slot's visit runs the prefill
                    st.kind, st.n, st.rows, self.no_admit_rounds = "prefill", vis.batch, \
                        vis.tokens, 0
                else:
                    st.n = adm.sizes[s]
                    st.kind, st.rows = ("decode", st.n) if st.n else ("idle", 0)
                    if s == self.S - 1:
                        self.no_admit_rounds += 1
                # sizes change on admission
                if self.rank == 0 and (vis.batch or not self.occupancy):
                    self.occupancy.append((time.perf_counter(), list(adm.sizes)))
            # --inject host-delay: more CPU work per visit with a batch
            if self.host_delay_s and st.rows:
                t_spin = time.perf_counter() + self.host_delay_s
                while time.perf_counter() < t_spin:
                    pass
            lp["mbs"][s] = st.rows
            lp["ran"][s] = (st.kind, st.n, st.rows, running)
            lp["rows_tail"][st.it] = st.rows
            lp["rows_tail"].pop(st.it - 2 * self.S - self.pp, None)
        st.sched_us = (time.perf_counter() - t_sched) * 1e6

    # ---- 3. inputs: hidden states from rank-1 (rank 0: its embedding stand-in)
    def inputs(self, st: _Step) -> None:
        rows, sizes = st.rows, self.sizes
        use_graph = self.cfg.graphs and st.kind == "decode"
        st.pb = padded(rows, sizes[-1]) if rows and use_graph and sizes else None
        if not rows:
            return
        self.pass_idle = False
        if st.pb is not None:
            st.g, st.gx, st.gy = self.graphs[st.pb]
        if self.rank == 0:
            st.x = self.emb[:rows] if rows <= self.emb.shape[0] else \
                self.torch.randn(rows, self.H, device=self.dev, dtype=self.torch.bfloat16)
        else:  # fresh buffers, as SGLang's recv_tensor_dict; copied into the graph later
            st.w_proxy, proxy = recv_proxy(self.torch, self.dist, self.ctx, self.lp)
            st.x = proxy["hidden_states"][:rows]   # padded rows where rank-1 replayed a graph
            e = self.api.Event(enable_timing=True)
            e.record(self.lp["sched"])
            st.ev["in"] = e

    def exchange(self, st: _Step) -> None:
        """The output exchange (last -> 0 -> 1 ...); rank 0's input event is its arrival."""
        st.w_out, st.got = exchange_outputs(self.torch, self.dist, self.ctx, self.lp, st.s)
        if self.rank == 0 and st.got is not None:
            e = self.api.Event(enable_timing=True)
            e.record(self.lp["sched"])
            st.ev["in"] = e

    def launch(self, st: _Step) -> None:
        """`run_batch`: the forward on its stream (graph replay or eager) between two events;
        the last rank holds the sampled token ids behind SGLang's launch event."""
        api, lp, rf = self.api, self.lp, self.rf
        # the next forward waits until NCCL read the last send
        st.w_commit += commit(lp["proxy_work"])
        if not st.rows:
            return
        rows, n, ev = st.rows, st.n, st.ev
        tl = time.perf_counter()
        with rf("run_batch"), rf("scheduler.run_batch"):
            fwd = lp["fwd"]
            fwd.wait_stream(lp["sched"])
            with api.stream(fwd), rf(step_name(st.kind, n, rows)):
                e = api.Event(enable_timing=True)
                e.record(fwd)
                ev["fs"] = e
                if st.pb is not None:
                    st.gx[:rows].copy_(st.x)     # inputs into the graph's static buffer
                    st.g.replay()
                    st.y = st.gy[:rows]
                else:
                    st.y = self.ctx["fwd"](st.x)
                if self.slow:  # --inject slow-stage: the forward takes FACTOR times as long
                    self.delay((self.slow - 1.0) * self.ctx["fwd_us"](st.pb or rows))
                e = api.Event(enable_timing=True)
                e.record(fwd)
                ev["fe"] = e
                if self.rank == self.last:  # sampled token ids of the batch's requests, held
                    tok = st.y[:rows][-n:, :64].argmax(-1)
                    done = api.Event()
                    done.record(fwd)          # SGLang's launch event: after sampling
                    lp["held"].append((done, tok))
        st.launch_us = (time.perf_counter() - tl) * 1e6

    # ---- 4. process_batch_result of slot s+1, after a CPU sync on its outputs (no range)
    def process_result(self, st: _Step) -> None:
        got, lp, results = st.got, self.lp, self.results
        if got is None:
            lp["pp_out"] = None
            return
        st.w_sync, _tokens = sync_outputs(got)
        with self.rf("process_batch_result"), self.rf("scheduler.process_batch_result"):
            tp0 = time.perf_counter()
            lp["pp_out"] = got[2] if self.rank < self.last else None
            nxt = (st.s + 1) % self.S
            if self.rank == 0 and self.serve is not None:   # one token per request of slot s+1
                self.serve[0].outputs(nxt, tp0)
            for k, v in zip(("kind", "n", "rows", "running"), lp["ran"][nxt]):
                results[k].append(v)   # its log line, stamped now (result time)
            results["t"].append(tp0)
            results["slot"].append(nxt)
            results["queue"].append(len(self.waiting))
            st.process_us = (time.perf_counter() - tp0) * 1e6

    # ---- 5. proxy send to rank+1: hidden states and residual (padded: the graph's rows)
    def send_hidden(self, st: _Step) -> None:
        if st.rows and self.rank < self.last:
            pb = st.pb
            send = {"hidden_states": st.gy[:pb] if pb is not None else st.y,
                    "residual": st.gx[:pb] if pb is not None else st.x}
            with self.rf("send_proxy_dict_to_next_stage"):
                st.ev["se"] = send_proxy(self.torch, self.dist, self.ctx, self.lp, send,
                                         st.ev["fe"], self.late, self.hop_delay_us)

    def record(self, st: _Step) -> None:
        """The iteration's column (serve mode: only turns with work, the latest max_iters)."""
        cols, serve, max_iters = self.cols, self.serve, self.max_iters
        if serve is not None and not (self.measure or st.rows):
            return   # serve mode keeps no column for an idle pipeline's turn
        if serve is not None and len(cols["it"]) >= 2 * max_iters:
            for v in list(cols.values()) + list(self.results.values()):
                del v[:max(0, len(v) - max_iters)]   # keep the latest max_iters iterations
        cols["it"].append(st.it)
        cols["slot"].append(st.s)
        cols["kind"].append(st.kind)
        cols["n"].append(st.n)
        cols["rows"].append(st.rows)
        cols["measure"].append(bool(self.measure))
        cols["t_start"].append(st.t_start)
        cols["t_end"].append(time.perf_counter())
        cols["wait_us"].append(st.w_req + st.w_proxy + st.w_out + st.w_sync + st.w_commit)
        cols["wait_req_us"].append(st.w_req)
        cols["wait_proxy_us"].append(st.w_proxy)
        cols["wait_out_us"].append(st.w_out)
        cols["wait_sync_us"].append(st.w_sync)
        cols["wait_commit_us"].append(st.w_commit)
        cols["sched_us"].append(st.sched_us)
        cols["launch_us"].append(st.launch_us)
        cols["process_us"].append(st.process_us)
        cols["ev"].append(st.ev)

    def finish(self) -> dict:
        """Drain what the first rank still expects, place the GPU events on the host clock, and
        return this rank's result for the point."""
        drain_last_to_first(self.torch, self.dist, self.ctx, self.lp, self.it,
                            self.lp["rows_tail"])
        self.api.synchronize()
        t_ref, ref = self.t_ref, self.ref

        def at(e):   # GPU events -> host clock (seconds)
            return t_ref + ref.elapsed_time(e) / 1e3
        cols = self.cols
        gpu = {k: [] for k in ("in", "fs", "fe", "se")}
        for ev in cols.pop("ev"):
            for k in gpu:
                gpu[k].append(at(ev[k]) if ev.get(k) is not None else None)
        cols.update({f"t_{k}": v for k, v in gpu.items()})
        window = self.window
        out = {"point": self.point, "rank": self.rank, "slots": self.S,
               "ref_err_us": self.ref_err_us, "t_point_start": self.start, "columns": cols,
               "results": self.results, "complete": True}
        # serve mode: the session, sizes at the peak of running requests
        if self.rank == 0 and self.serve is not None:
            sc = self.serve[0]
            out["point"] = dict(self.point, concurrency=max(1, sc.peak))
            out.update(arrivals_s=[], admitted=sc.admitted, occupancy=list(sc.occupancy),
                       slot_sizes=list(sc.peak_sizes),
                       window_start_it=window[0] if window else None)
        elif self.rank == 0:
            out["arrivals_s"] = self.arrivals
            out["admitted"] = self.admitted
            out["occupancy"] = self.occupancy
            # requests per slot (a chunked one where it ended)
            out["slot_sizes"] = list(self.adm.sizes)
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
    """torch.profiler for serve mode's /start_profile (microbench/dispatch/serve.py RankSide's
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


def loop_capture_sizes(cfg: RankConfig) -> list[int]:
    """The decode batch sizes the loop captures: SGLang's sizes up to the one the largest
    micro-batch pads to."""
    max_b = max(1, min(cfg.max_micro_batch, max(cfg.concurrency)))
    full = capture_sizes(max(512, 2 * max_b))  # capture up to the size max_b pads to
    return capture_sizes(padded(max_b, full[-1]))


def start_serving(cfg: RankConfig | dict):
    """Rank 0 in serve mode: bind the HTTP front-end before the stages are built (GET /health
    answers 503 until the loop runs). Returns (ServeState, server)."""
    from microbench.dispatch import serve as SV
    from microbench.dispatch import serve_http as SH
    cfg = rank_config(cfg)
    s = cfg.server
    args = SV.ServerArgs.of(replace(
        s, chunked_prefill_size=s.chunk_budget,
        cuda_graph_max_bs=loop_capture_sizes(cfg)[-1] if s.graphs else None),
        model_path=cfg.model, policy=cfg.serve.policy)
    state = SV.ServeState(args)
    server = SH.make_server(state, cfg.serve.host, cfg.serve.port)
    SH.start(server)
    print(f"rank 0: serving http://{cfg.serve.host}:{server.server_address[1]} "
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
    HTTP clients and control commands applied on every rank; microbench/dispatch/serve.py)."""
    from microbench.dispatch import serve as SV
    cfg, rank = rank_config(ctx["cfg"]), ctx["rank"]
    sched = None
    if rank == 0:
        secs = cfg.serve.seconds
        sched = SV.ServeScheduler(state, SlotConfig.of(cfg.server), cfg.serve.policy,
                                  cfg.micro_batches,
                                  stop_at=None if secs is None else time.perf_counter() + secs,
                                  profile_dir=cfg.profile_dir or ".")
    side = SV.RankSide(rank, sched, profiler=lambda acts: RankProfiler(torch, ctx, acts),
                       barrier=lambda: dist.barrier(group=ctx["gloo"]))
    ctx["serve"] = (sched, side)
    if state is not None:
        state.mark_ready()
    try:
        return run_point(torch, dist, ctx, cfg.points[0])
    finally:
        if sched is not None:
            sched.close(state.stop_requested or "the loop ended")


def _profile_ctx(torch, cfg: RankConfig, rank, point):
    """torch.profiler around one point; trace named like SGLang's: {id}-TP-0-PP-{rank}."""
    if not cfg.profile_dir:
        return None, None
    A = torch.profiler.ProfilerActivity
    prof = torch.profiler.profile(activities=[A.CPU] if cfg.device == "cpu"
                                  else [A.CPU, A.CUDA])
    pid = f"dispatch-{point['policy']}-{point['arrival']}-c{point['concurrency']}"
    return prof, Path(cfg.profile_dir) / f"{pid}-TP-0-PP-{rank}.trace.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="JSON written by microbench.dispatch.probe")
    ap.add_argument("--out-dir", required=True, help="per-rank results go here")
    a = ap.parse_args(argv)
    cfg = RankConfig.from_wire(json.loads(Path(a.config).read_text()))
    out_dir = Path(a.out_dir)
    rank = int(os.environ.get("RANK", "0"))
    try:
        return _main(cfg, out_dir, rank)
    except BaseException as e:  # leave the rank's error where the launcher finds it
        msg = str(e).splitlines()[0] if str(e) else ""
        (out_dir / f"rank{rank}.error").write_text(f"rank {rank}: {type(e).__name__}: {msg}\n")
        raise


def _main(cfg: RankConfig, out_dir: Path, rank: int) -> int:
    import torch
    import torch.distributed as dist

    state = server = None
    if cfg.serve is not None:
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


def _run_rank(torch, dist, cfg: RankConfig, out_dir: Path, rank: int, state) -> int:
    rc = start_rank(cfg.collective_timeout_s, expect_world=cfg.pp, device=cfg.device)
    pp, dev, gloo = rc.world, rc.device, rc.gloo
    api = device_api(torch, dev)
    H = cfg.hidden
    fwd, info = build_work(torch, cfg, rank, dev)
    sizes = loop_capture_sizes(cfg)
    graphs = capture_graphs(torch, fwd, sizes, H, dev) if cfg.graphs and not is_host(api) \
        else {}
    emb_rows = max(cfg.concurrency) * cfg.prompt_len
    ctx = {"cfg": cfg, "rank": rank, "pp": pp, "gloo": gloo, "dev": dev, "fwd": fwd,
           "api": api, "graphs": graphs, "capture_sizes": sizes if graphs else [],
           "emb": torch.randn(emb_rows, H, device=dev, dtype=torch.bfloat16),
           "inject": parse_inject(list(cfg.inject), pp)}
    ctx.update(calibrate_injection(torch, ctx, sizes, H, dev))
    cyc = ctx["cyc_per_us"]
    ctx["delay"] = spin_us if is_host(api) else \
        (lambda us: torch.cuda._sleep(max(1, int(us * cyc))))
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
    api.synchronize()
    info["gloo_one_way_us"] = gloo_one_way_us(torch, dist, rank, pp, gloo)

    name = "cpu" if is_host(api) else torch.cuda.get_device_name(dev)
    info["loop_note"] = KEPT_DIFFERENCES
    result = {"rank": rank, "pp": pp, "device": name,
              "torch": torch.__version__, "info": info, "capture_sizes": ctx["capture_sizes"],
              "points": []}
    path = out_dir / f"rank{rank}.json"
    write_json_atomic(path, result)
    bar = None
    if rank == 0 and cfg.serve is None:
        try:
            from tqdm import tqdm
            bar = tqdm(total=len(cfg.points), desc="dispatch", unit="point", file=sys.stderr)
        except ImportError:
            bar = None
    if cfg.serve is not None:   # one point: the whole session
        result["points"].append(serve_point(torch, dist, ctx, state))
        write_json_atomic(path, result)
    for point in ([] if cfg.serve is not None else cfg.points):
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
                res, cfg.prompt_len, bool(graphs), ctx["capture_sizes"],
                time.time() - time.perf_counter(), dev.type)) + "\n")
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
