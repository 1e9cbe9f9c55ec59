"""Per-iteration view of one rank's Kineto trace: what each pass of SGLang's PP loop cost.

What it measures, per rank (one trace = one rank), over the traced window:
- **forwards**: one per `run_batch` range (the scheduler's CPU range for a slot with a batch).
  Its GPU forward is the compute kernels launched inside the range (matched through the
  runtime call's correlation id, so CUDA-graph kernels count via their `cudaGraphLaunch`):
  `forward_us` = first kernel start to last kernel end (what the next stage waits for),
  `forward_busy_us` = the union of those kernels (the gap between the two is launch overhead:
  large when the forward runs eager), graph or eager. The micro-batch size of a forward is read
  from the NCCL receive that fed it (`In msg nelems`: hidden-state rows x hidden on ranks > 0,
  one token id per request on rank 0), else left unknown.
- **each forward's wait, split by whose fault it is** (cross-rank, in `loop_profile`): the
  forward could start at `ready` = max(its input on the GPU, the rank's previous forward end,
  the CPU free of blocking waits in this iteration). From there, `host` = until the first launch
  call (the CPU was still working: scheduling, processing results); `queue` = from the launch
  (or the input, if later) to the first kernel, split into `send_wait` (the rank's own NCCL send
  still running: CUDA graphs' static buffers make the next forward wait for it) and `foreign`
  (the GPU was busy with something this trace does not show: another process on the GPU).
  Input on the GPU = the receive's end, or, when the receiver posted its receive only after the
  upstream forward had ended, that end plus the receive's own length (the lateness is host).
- **host time per empty loop iteration**: the scheduler's CPU ranges (`recv_requests`,
  `get_next_batch_to_run`, `process_batch_result`, `send_*`) minus the time blocked in them
  (the request-list receive on ranks > 0; CUDA synchronisations such as `tokens.tolist()`'s
  copy), per iteration without a batch.
- **time split** of the GPU over the window, exclusive: `compute` (union of compute kernels),
  `comm_transfer` (NCCL receive time explained by its bytes over `link_gbps`), `comm_wait` (NCCL
  time beyond that: a receive waiting for its sender; never called busy) and `idle`.
- **occupancy**: iterations of the loop (the count of its most frequent scheduler range) and
  forwards among them: forwards / iterations = occupied slots / slots.

Why: these are the inputs of the pipeline model for the *observed* deployment
(`reports/model/observed/deployment.py`): per-rank forward cost by micro-batch size, host time per
visit, hop latency, slot occupancy and graph share, each taken from the server's own evidence.
Cross-rank quantities (the hop: sender's forward end -> receiver's input ready) are computed
in `hops()` from two ranks' summaries (one host: the traces share a clock).
"""
from __future__ import annotations

import bisect
import math
import re
from pathlib import Path
from statistics import median

from microbench.sglang import forward_window, window_blocks
from microbench.sglang.intervals import length, merge, overlap
from microbench.sglang.trace import (COMM_RE, DTYPE_BYTES, GPU_CATS, NOT_COMPUTE_RE,
                                     RECV_RE, SCHEDULER_RANGES, STEP_RE, iter_events)
from reports.base.payloads.sglang import LoopProfile
from reports.base.schema import from_json

_SYNC_RE = re.compile(r"cuda(StreamSynchronize|DeviceSynchronize|EventSynchronize|Memcpy(?!Async)"
                      r"|MemcpyAsync)")
_BLOCKING_RANGES = ("recv_requests",)
NO_KERNELS = "no GPU kernels in this trace"


def _p50(v):
    return float(median(v)) if v else None


def _mean(v):
    """The model's inputs are means: throughput is total time over count, so a heavy tail
    (contention, a busy CPU) counts in full; medians are shown beside them."""
    return float(sum(v) / len(v)) if v else None


def read_steps(path: str | Path, *, hidden: int | None = None, link_gbps: float | None = None,
               rank: int | None = None, shift_us: float = 0.0) -> dict:
    """One rank's per-iteration summary (see the module docstring). Times in microseconds."""
    kernels = []        # (ts, end, corr, is_compute, is_comm, is_recv)
    recvs = []          # (ts, end, bytes, nelems)
    rt = {}             # correlation -> (ts, is_graph)
    syncs = []          # (ts, end) blocking runtime calls
    ranges: dict[str, list[tuple[float, float]]] = {}
    relay = []          # (ts, end) gloo receives (blocking: the request-list relay, metadata)
    step_spans = []     # (ts, end, mode, bs) SGLang's step[DECODE bs=N] spans
    no_dur = 0
    for ev in iter_events(path, shift_us=shift_us):
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        try:
            cat, name = ev.get("cat"), str(ev.get("name", ""))
            args = ev.get("args") or {}
            if "dur" not in ev:
                no_dur += 1
            ts, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
            if not (math.isfinite(ts) and math.isfinite(dur)) or dur < 0:
                continue
            if cat in GPU_CATS or (cat != "gpu_user_annotation" and "stream" in args
                                    and cat not in ("cuda_runtime", "cuda_driver")):
                comm = bool(COMM_RE.match(name))
                compute = not NOT_COMPUTE_RE.match(name)
                is_recv = comm and bool(RECV_RE.search(name)) and \
                    args.get("Collective name", "recv") == "recv"
                corr = args.get("correlation", -1)
                if type(corr) is not int or type(args.get("stream", -1)) is not int:
                    continue   # malformed: skipped, as the trace reader does (and counts)
                kernels.append((ts, ts + dur, corr, compute, comm, is_recv))
                if is_recv:
                    nel = args.get("In msg nelems") or args.get("Out msg nelems") or 0
                    if type(nel) is not int or nel < 0:
                        nel = 0   # size unreadable: the kernel is kept (the trace reader says)
                    dt = args.get("dtype")
                    # an integer receive is sampled token ids (the output ring), not hidden
                    # states: with async depth > 0 it is the last receive before a forward
                    recvs.append((ts, ts + dur, nel * DTYPE_BYTES.get(dt, 2), nel,
                                  dt in ("Long", "Int", "Int64", "Int32")))
            elif cat in ("cuda_runtime", "cuda_driver"):
                c = args.get("correlation")
                if c is not None:
                    rt[int(c)] = (ts, "GraphLaunch" in name)
                if _SYNC_RE.match(name):
                    syncs.append((ts, ts + dur))
            elif cat == "user_annotation" and name in SCHEDULER_RANGES:
                ranges.setdefault(name, []).append((ts, ts + dur))
            elif cat == "user_annotation" and name.startswith("gloo:recv"):
                # c10d's gloo receive: SGLang waits on it at once, so its range is blocked time.
                # `gloo:send` is left out: SGLang posts it with isend and waits a phase later,
                # so its range covers the rank's ordinary work (microbench/sglang/cpu_steps.py)
                relay.append((ts, ts + dur))
            elif cat == "user_annotation" and name.startswith("step["):
                m = STEP_RE.match(name)
                if m:
                    step_spans.append((ts, ts + dur, m.group(1), int(m.group(2))))
        except (KeyError, TypeError, ValueError):
            continue
    # an event written twice is one event (the trace reader counts them: events_duplicate)
    kernels, recvs, syncs, relay, step_spans = (list(dict.fromkeys(x)) for x in (
        kernels, recvs, syncs, relay, step_spans))
    ranges = {k: list(dict.fromkeys(v)) for k, v in ranges.items()}
    return summarize_steps(kernels, recvs, rt, syncs, ranges, hidden=hidden,
                           link_gbps=link_gbps, rank=rank, no_dur=no_dur, relay=relay,
                           steps=step_spans)


def _latest_le(sorted_starts: list[float], t: float) -> int:
    return bisect.bisect_right(sorted_starts, t) - 1


def summarize_steps(kernels, recvs, rt, syncs, ranges, *, hidden=None, link_gbps=None,
                    rank=None, no_dur: int = 0, relay=(), steps=()) -> dict:
    """The per-rank part of read_steps (CPU-tested on hand-made events). `recvs`: (ts, end,
    bytes, nelems[, is_token_ids]); `steps`: SGLang's step[MODE bs=N] spans (ts, end, mode, bs)."""
    out: dict = {"rank": rank, "events_without_dur": no_dur}
    recvs = [tuple(r) + (False,) * (5 - len(r)) for r in recvs]
    if not kernels:
        out["reason"] = NO_KERNELS
        return out
    t0 = min(k[0] for k in kernels)
    t1 = max(k[1] for k in kernels)
    window = t1 - t0
    # -- exclusive time split of the GPU
    comp = merge([(k[0], k[1]) for k in kernels if k[3]])
    allk = merge([(k[0], k[1]) for k in kernels])
    comm = merge([(k[0], k[1]) for k in kernels if k[4]])
    comm_only = length(comm) - overlap(comm, comp)
    recv_total = sum(r[1] - r[0] for r in recvs)
    transfer_total = (sum(min(r[1] - r[0], r[2] / (link_gbps * 1e3)) for r in recvs)
                      if link_gbps else None)
    frac = (transfer_total / recv_total) if transfer_total is not None and recv_total else None
    out["time_split"] = {
        "window_us": window,
        "compute_us": length(comp),
        "comm_transfer_us": None if frac is None else comm_only * frac,
        "comm_wait_us": None if frac is None else comm_only * (1 - frac),
        "comm_us": comm_only,
        "other_us": max(0.0, length(allk) - length(comp) - comm_only),
        "idle_us": window - length(allk),
    }
    # -- forwards: compute kernels launched inside each run_batch range
    rb = sorted(ranges.get("run_batch", []))
    starts = [s for s, _ in rb]
    per_fwd: list[list] = [[] for _ in rb]
    launch_at: list[float] = [math.inf] * len(rb)
    graph_fwd = [False] * len(rb)
    for ts, end, corr, compute, _, _ in kernels:
        if not compute:
            continue
        launch = rt.get(corr)
        if launch is None:
            continue
        j = _latest_le(starts, launch[0])
        if j >= 0 and launch[0] <= rb[j][1]:
            per_fwd[j].append((ts, end))
            graph_fwd[j] = graph_fwd[j] or launch[1]
            launch_at[j] = min(launch_at[j], launch[0])
    # the iteration a run_batch belongs to starts at the earliest per-iteration range before it
    counts = {k: len(v) for k, v in ranges.items()}
    iters = max(counts.values()) if counts else 0
    full = [sorted(s for s, _ in v) for k, v in ranges.items() if len(v) == iters and k != "run_batch"]
    blocking = sorted(iv for k in _BLOCKING_RANGES for iv in ranges.get(k, []))
    b_starts = [s for s, _ in blocking]
    # what feeds a forward: on ranks > 0 the hidden states (an integer receive there is the
    # output ring's token ids); on rank 0 the sampled tokens themselves
    recv_s = sorted(r for r in recvs if rank == 0 or not r[4])
    r_ends = [r[1] for r in recv_s]
    steps = sorted(steps)
    st_starts = [x[0] for x in steps]
    sends = merge([(k[0], k[1]) for k in kernels if k[4] and not k[5]])
    fwds = []
    for j, ks in enumerate(per_fwd):
        if not ks:
            continue
        fs, fe = min(k[0] for k in ks), max(k[1] for k in ks)
        i = bisect.bisect_right(r_ends, fs) - 1  # the receive that fed this forward
        rcv = recv_s[i] if i >= 0 else None
        b = b_nccl = None
        if rcv and rcv[3]:
            if rank == 0:
                b_nccl = rcv[3]
            elif hidden and rcv[3] % hidden == 0:
                b_nccl = rcv[3] // hidden
        k = bisect.bisect_left(st_starts, rb[j][0])
        st = steps[k] if k < len(steps) and steps[k][0] <= rb[j][1] else None
        if st is not None:      # SGLang's own step[MODE bs=N]: the raw size, on every rank
            b = st[3] if st[2] == "DECODE" else None
            mode = st[2]
        else:                   # older traces: the hidden-state receive's rows (padded on ranks > 0)
            b, mode = b_nccl, None
        it_start = min((v[k] for v in full if (k := _latest_le(v, rb[j][0])) >= 0),
                       default=rb[j][0])
        kb = _latest_le(b_starts, rb[j][0])
        cpu_ready = max(it_start, blocking[kb][1] if kb >= 0 and blocking[kb][0] >= it_start
                        else it_start)
        # the loop iteration: how many iterations (by a range every iteration has) began
        # before this run_batch
        visit = _latest_le(full[0], rb[j][0]) if full else None
        fwds.append({"start": fs, "end": fe, "busy": length(merge(ks)), "graph": graph_fwd[j],
                     "visit": visit if visit is not None and visit >= 0 else None,
                     "batch": b, "batch_nccl": b_nccl, "mode": mode,
                     "recv": (rcv[0], rcv[1]) if rcv else None,
                     "launch": launch_at[j], "cpu_ready": cpu_ready})
    fwds.sort(key=lambda f: f["start"])
    prev = None
    for f in fwds:
        f["prev_end"] = prev
        prev = f["end"]
        lo = max(x for x in (f["launch"], f["recv"][1] if f["recv"] else None, f["prev_end"])
                 if x is not None)
        f["queue"] = max(0.0, f["start"] - lo)
        f["send_wait"] = overlap(merge([(lo, f["start"])]), sends) if f["queue"] > 0 else 0.0
    out["forwards"] = len(fwds)
    out["graph_forwards"] = sum(1 for f in fwds if f["graph"])
    out["prefill_forwards"] = sum(1 for f in fwds if f["mode"] == "EXTEND")
    # the step spans' size against the NCCL receive's rows (padded to the graph size on ranks > 0)
    both = [f for f in fwds if f["batch"] is not None and f["batch_nccl"] is not None]
    out["batch_source"] = ("step spans" if any(f["mode"] for f in fwds) else
                           "NCCL receive sizes" if any(f["batch"] for f in fwds) else None)
    out["batch_nccl_disagree"] = sum(1 for f in both if f["batch_nccl"] < f["batch"])
    by_b: dict[int, list] = {}
    busy_b: dict[int, list] = {}
    for f in fwds:
        key = f["batch"] if f["batch"] is not None else 0
        by_b.setdefault(key, []).append(f["end"] - f["start"])
        busy_b.setdefault(key, []).append(f["busy"])
    out["forward_us_by_batch"] = {str(b): _p50(v) for b, v in sorted(by_b.items())}
    out["forward_busy_us_by_batch"] = {str(b): _mean(v) for b, v in sorted(busy_b.items())}
    out["forward_count_by_batch"] = {str(b): len(v) for b, v in sorted(by_b.items())}
    out["forward_us_p50"] = _p50([f["end"] - f["start"] for f in fwds])
    out["iterations"] = iters
    out["range_counts"] = counts
    # host per empty iteration: CPU ranges minus blocked time, iterations without run_batch
    blocked_iv = merge(blocking + list(syncs) + list(relay))
    cpu_iv = merge([iv for v in ranges.values() for iv in v])
    if full:
        marks = min(full, key=lambda v: v[0] if v else math.inf)
        empty, empty_relay = [], []
        relay_iv = merge(list(relay))
        for k, m in enumerate(marks):
            nxt = marks[k + 1] if k + 1 < len(marks) else math.inf
            r = bisect.bisect_left(starts, m)
            if r < len(starts) and starts[r] < nxt:
                continue
            seg = merge([(max(s, m), min(e, nxt)) for s, e in cpu_iv if e > m and s < nxt])
            empty.append(length(seg) - overlap(seg, blocked_iv))
            empty_relay.append(overlap(seg, relay_iv) - overlap(
                merge([(max(a, m), min(b, nxt)) for a, b in relay_iv if b > m and a < nxt]),
                merge(list(syncs))))
        out["host_us_empty_p50"], out["host_us_empty_mean"] = _p50(empty), _mean(empty)
        out["relay_wait_us_empty_mean"] = _mean(empty_relay)
        out["iterations_empty"] = len(empty)
    out["recv_bytes_p50"] = _p50([r[2] for r in recvs])
    out["_fwds"] = fwds          # for the cross-rank pass; dropped before the record is written
    out["_syncs"] = merge(list(syncs))
    out["_relay"] = merge(list(relay))
    return out


def loop_profile(ranks: dict[int, dict]) -> dict:
    """Cross-rank pass over read_steps() results of one run (one host: one clock).

    A forward's input is the receive that ended last before it started; that receive carries
    what the upstream rank (r-1; the last rank for rank 0: the sampled tokens) finished last
    before it ended (`u`). Input on the GPU = the receive's end, or u + the receive's length when
    the receive was posted only after u (the receiver was late: that lateness counts as host).
    Per forward, with `ready` = max(input, previous forward end, CPU free of blocking waits):
    `host` = first launch - ready (>= 0), `queue` = first kernel - max(launch, receive end,
    previous end), split into `send_wait` and `foreign` (module docstring), `hop` = input - u.
    Inside `host`, time the CPU spent blocked is taken out: `sync_wait` (a CUDA synchronisation,
    e.g. the returned tokens' copy queued behind communication) and `relay_wait` (the gloo
    request-list relay to the next rank: SGLang chains every rank's loop to the previous one's).
    """
    order = sorted(ranks)
    ends = {r: sorted(f["end"] for f in ranks[r].get("_fwds", [])) for r in order}
    out = {"ranks": {}, "hops": {}}
    for k, r in enumerate(order):
        d = ranks[r]
        up = order[k - 1]  # k = 0 -> the last rank (tokens come back from it)
        up_ends = ends[up] if len(order) > 1 else []
        host, hop, foreign, send_wait, eff = [], [], [], [], {}
        sync_wait, relay_wait = [], []
        # the model's inputs forward by forward, with the forward's start (window_blocks.py)
        smp: dict[str, list[tuple[float, float]]] = {}
        hop_t: list[tuple[float, float]] = []
        for f in d.get("_fwds", []):
            data_at = f["recv"][1] if f["recv"] else None
            if f["recv"] and up_ends:
                j = bisect.bisect_right(up_ends, f["recv"][1]) - 1
                if j >= 0:
                    u = up_ends[j]
                    rs, re_ = f["recv"]
                    data_at = re_ if rs <= u else u + (re_ - rs)
                    hop.append(max(0.0, data_at - u))
                    hop_t.append((f["start"], hop[-1]))
            ready = max(x for x in (data_at, f["prev_end"], f["cpu_ready"]) if x is not None)
            launch = min(f["launch"], f["start"])
            win = [(ready, launch)] if launch > ready else []
            # time the CPU spent blocked, not working: in a CUDA synchronisation (the returned
            # tokens' copy, queued behind communication) or in the gloo request-list relay
            sync_w = overlap(win, d.get("_syncs", []))
            relay_w = overlap(win, d.get("_relay", [])) - overlap(
                merge([(max(a, ready), min(b, launch)) for a, b in d.get("_syncs", [])
                        if b > ready and a < launch]), d.get("_relay", []))
            host.append(max(0.0, launch - ready - sync_w - relay_w) if win else 0.0)
            sync_wait.append(sync_w)
            relay_wait.append(max(0.0, relay_w))
            fq = max(0.0, f["queue"] - f["send_wait"])
            foreign.append(fq)
            send_wait.append(f["send_wait"])
            key = f["batch"] if f["batch"] is not None else 0
            eff.setdefault(key, []).append(f["end"] - f["start"] + fq)
            for name, v in (("host", host[-1]), ("sync_wait", sync_w),
                            ("relay_wait", relay_wait[-1]), ("foreign", fq),
                            ("send_wait", f["send_wait"]), (f"forward:{key}", eff[key][-1]),
                            (f"forward_busy:{key}", f["busy"])):
                smp.setdefault(name, []).append((f["start"], v))
        d["_samples"] = smp
        d["_rounds"] = len(d.get("_fwds", [])) // max(1, len(order))
        d["host_us_p50"], d["host_us_mean"] = _p50(host), _mean(host)
        d["foreign_queue_us_mean"] = _mean(foreign)
        d["send_wait_us_mean"] = _mean(send_wait)
        d["sync_wait_us_mean"] = _mean(sync_wait)
        d["relay_wait_us_mean"] = _mean(relay_wait)
        d["forward_effective_us_by_batch"] = {str(b): _mean(v) for b, v in sorted(eff.items())}
        out["ranks"][str(r)] = d
        if hop:
            out["hops"][f"{up}->{r}"] = {"p50_us": _p50(hop), "mean_us": _mean(hop), "n": len(hop),
                                         "_samples": hop_t}
    out["forwards"] = forward_window.keep({r: ranks[r].get("_fwds", []) for r in order})
    for d in out["ranks"].values():
        for k in ("_fwds", "_syncs", "_relay"):
            d.pop(k, None)
    window_blocks.attach(out, min((d.get("_rounds", 0) for d in out["ranks"].values()),
                                  default=0))
    return out


def read_loop(paths: dict[int, str | Path], *, hidden: int | None = None,
              link_gbps: float | None = None, no_gpu_events: bool = False,
              offsets: dict[int, float] | None = None) -> LoopProfile:
    """The `loop` part of sglang.json, typed (reports/base/payloads/sglang.py `LoopProfile`):
    read_steps for every rank, then loop_profile; traces of SGLang's CPU backend (no GPU
    event, `run_batch` ranges) go through microbench/sglang/cpu_steps.py instead.
    `no_gpu_events`: the caller already knows (trace.py's pass): the GPU reader is skipped.
    `offsets`: rank -> its clock against the first rank's, us (microbench/sglang/evidence.py),
    taken off its timestamps so that the ranks are compared on one clock."""
    off = offsets or {}
    ranks = ({r: {"reason": NO_KERNELS} for r in paths} if no_gpu_events else
             {r: read_steps(p, hidden=hidden, link_gbps=link_gbps, rank=r,
                            shift_us=off.get(r, 0.0))
              for r, p in sorted(paths.items())})
    if ranks and all(d.get("reason") == NO_KERNELS for d in ranks.values()):
        from microbench.sglang import cpu_steps      # (imports nothing of this module)
        evs = {r: cpu_steps.collect(p, shift_us=off.get(r, 0.0))
               for r, p in sorted(paths.items())}
        if all(cpu_steps.is_cpu_trace(e) for e in evs.values()):
            out = cpu_steps.cpu_loop_profile({r: cpu_steps.summarize(e, rank=r)
                                              for r, e in evs.items()})
            out["device"] = "cpu"
            return from_json(LoopProfile, out, "loop")
        if no_gpu_events:      # no GPU event and no run_batch: what the GPU reader says
            ranks = {r: read_steps(p, hidden=hidden, link_gbps=link_gbps, rank=r,
                                   shift_us=off.get(r, 0.0))
                     for r, p in sorted(paths.items())}
    from microbench.sglang.cpu_steps import pathologies
    out = loop_profile(ranks)
    return from_json(LoopProfile, {**out, "pathologies": pathologies(out)}, "loop")
