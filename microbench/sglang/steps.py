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
- **host time per loop iteration**: the scheduler's CPU ranges (`recv_requests`,
  `get_next_batch_to_run`, `run_batch`, `process_batch_result`, `send_*`) minus the time blocked
  in them (a receive of the request list on ranks > 0: `recv_requests`; a CUDA synchronisation
  such as `tokens.tolist()`'s copy: the `cudaStreamSynchronize` / `cudaMemcpy*` runtime calls),
  per iteration with a batch and per empty iteration.
- **time split** of the GPU over the window, exclusive: `compute` (union of compute kernels),
  `comm_transfer` (NCCL receive time explained by its bytes over `link_gbps`), `comm_wait` (NCCL
  time beyond that: a receive waiting for its sender; never called busy) and `idle`.
- **occupancy**: iterations of the loop (the count of its most frequent scheduler range) and
  forwards among them: forwards / iterations = occupied slots / slots.

Why: these are the inputs of the pipeline model for the *observed* deployment
(`reports/model/deployment.py`): per-rank forward cost by micro-batch size, host time per
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

from microbench.sglang.trace import (_COMM_RE, _DTYPE_BYTES, _GPU_CATS, _NOT_COMPUTE_RE,
                                     _RECV_RE, SCHEDULER_RANGES, iter_events)

_SYNC_RE = re.compile(r"cuda(StreamSynchronize|DeviceSynchronize|EventSynchronize|Memcpy(?!Async)"
                      r"|MemcpyAsync)")
_BLOCKING_RANGES = ("recv_requests",)


def _merge(iv):
    out = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return out


def _len(merged) -> float:
    return sum(e - s for s, e in merged)


def _overlap(merged_a, merged_b) -> float:
    """Total overlap of two merged interval lists."""
    i = j = 0
    tot = 0.0
    while i < len(merged_a) and j < len(merged_b):
        s = max(merged_a[i][0], merged_b[j][0])
        e = min(merged_a[i][1], merged_b[j][1])
        if e > s:
            tot += e - s
        if merged_a[i][1] < merged_b[j][1]:
            i += 1
        else:
            j += 1
    return tot


def _p50(v):
    return float(median(v)) if v else None


def read_steps(path: str | Path, *, hidden: int | None = None, link_gbps: float | None = None,
               rank: int | None = None) -> dict:
    """One rank's per-iteration summary (see the module docstring). Times in microseconds."""
    kernels = []        # (ts, end, corr, is_compute, is_comm)
    recvs = []          # (ts, end, bytes, nelems)
    rt = {}             # correlation -> (ts, is_graph)
    syncs = []          # (ts, end) blocking runtime calls
    ranges: dict[str, list[tuple[float, float]]] = {}
    no_dur = 0
    for ev in iter_events(path):
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
            if cat in _GPU_CATS or (cat != "gpu_user_annotation" and "stream" in args
                                    and cat not in ("cuda_runtime", "cuda_driver")):
                comm = bool(_COMM_RE.match(name))
                compute = not _NOT_COMPUTE_RE.match(name)
                kernels.append((ts, ts + dur, int(args.get("correlation", -1)), compute, comm))
                if comm and _RECV_RE.search(name) and args.get("Collective name", "recv") == "recv":
                    nel = int(args.get("In msg nelems") or args.get("Out msg nelems") or 0)
                    recvs.append((ts, ts + dur, nel * _DTYPE_BYTES.get(args.get("dtype"), 2), nel))
            elif cat in ("cuda_runtime", "cuda_driver"):
                c = args.get("correlation")
                if c is not None:
                    rt[int(c)] = (ts, "GraphLaunch" in name)
                if _SYNC_RE.match(name):
                    syncs.append((ts, ts + dur))
            elif cat == "user_annotation" and name in SCHEDULER_RANGES:
                ranges.setdefault(name, []).append((ts, ts + dur))
        except (KeyError, TypeError, ValueError):
            continue
    return summarize_steps(kernels, recvs, rt, syncs, ranges, hidden=hidden,
                           link_gbps=link_gbps, rank=rank, no_dur=no_dur)


def summarize_steps(kernels, recvs, rt, syncs, ranges, *, hidden=None, link_gbps=None,
                    rank=None, no_dur: int = 0) -> dict:
    """The pure part of read_steps (CPU-tested on hand-made events)."""
    out: dict = {"rank": rank, "events_without_dur": no_dur}
    if not kernels:
        out["reason"] = "no GPU kernels in this trace"
        return out
    t0 = min(k[0] for k in kernels)
    t1 = max(k[1] for k in kernels)
    window = t1 - t0
    # -- exclusive time split
    comp = _merge([(k[0], k[1]) for k in kernels if k[3]])
    allk = _merge([(k[0], k[1]) for k in kernels])
    comm = _merge([(k[0], k[1]) for k in kernels if k[4]])
    comm_only = _len(comm) - _overlap(comm, comp)
    recv_total = sum(e - s for s, e, _, _ in recvs)
    transfer_total = (sum(min(e - s, b / (link_gbps * 1e3)) for s, e, b, _ in recvs)
                      if link_gbps else None)
    frac_transfer = (transfer_total / recv_total) if transfer_total is not None and recv_total \
        else None
    split = {
        "window_us": window,
        "compute_us": _len(comp),
        "comm_transfer_us": None if frac_transfer is None else comm_only * frac_transfer,
        "comm_wait_us": None if frac_transfer is None else comm_only * (1 - frac_transfer),
        "comm_us": comm_only,
        "other_us": max(0.0, _len(allk) - _len(comp) - comm_only),
        "idle_us": window - _len(allk),
    }
    out["time_split"] = split
    # -- forwards: compute kernels launched inside each run_batch range
    rb = sorted(ranges.get("run_batch", []))
    starts = [s for s, _ in rb]
    per_fwd: list[list] = [[] for _ in rb]
    graph_fwd = [False] * len(rb)
    for ts, end, corr, compute, _ in kernels:
        if not compute:
            continue
        launch = rt.get(corr)
        if launch is None:
            continue
        j = bisect.bisect_right(starts, launch[0]) - 1
        if j >= 0 and launch[0] <= rb[j][1]:
            per_fwd[j].append((ts, end))
            graph_fwd[j] = graph_fwd[j] or launch[1]
    recv_ends = sorted((e, nel) for _, e, _, nel in recvs)
    re_ends = [e for e, _ in recv_ends]
    fwds = []
    for j, ks in enumerate(per_fwd):
        if not ks:
            continue
        fs, fe = min(k[0] for k in ks), max(k[1] for k in ks)
        i = bisect.bisect_right(re_ends, fs) - 1  # the receive that fed this forward
        nel = recv_ends[i][1] if i >= 0 else 0
        b = None
        if nel:
            if rank == 0:
                b = nel
            elif hidden and nel % hidden == 0:
                b = nel // hidden
        fwds.append({"start": fs, "end": fe, "busy": _len(_merge(ks)), "graph": graph_fwd[j],
                     "batch": b, "input_at": re_ends[i] if i >= 0 else None,
                     "cpu_start": rb[j][0]})
    out["forwards"] = len(fwds)
    out["graph_forwards"] = sum(1 for f in fwds if f["graph"])
    by_b: dict[int, list] = {}
    busy_b: dict[int, list] = {}
    for f in fwds:
        key = f["batch"] if f["batch"] is not None else 0
        by_b.setdefault(key, []).append(f["end"] - f["start"])
        busy_b.setdefault(key, []).append(f["busy"])
    out["forward_us_by_batch"] = {str(b): _p50(v) for b, v in sorted(by_b.items())}
    out["forward_busy_us_by_batch"] = {str(b): _p50(v) for b, v in sorted(busy_b.items())}
    out["forward_count_by_batch"] = {str(b): len(v) for b, v in sorted(by_b.items())}
    out["forward_us_p50"] = _p50([f["end"] - f["start"] for f in fwds])
    # GPU idle before a forward while the input was already there: the host was late
    gaps = []
    prev_end = None
    for f in sorted(fwds, key=lambda f: f["start"]):
        ready = max(x for x in (f["input_at"], prev_end, t0) if x is not None)
        gaps.append(max(0.0, f["start"] - ready))
        prev_end = f["end"]
    out["host_gap_us_p50"] = _p50(gaps)
    # -- iterations and host time per iteration (CPU ranges minus blocked time)
    counts = {k: len(v) for k, v in ranges.items()}
    iters = max(counts.values()) if counts else 0
    out["iterations"] = iters
    out["range_counts"] = counts
    blocked_iv = _merge([iv for k in _BLOCKING_RANGES for iv in ranges.get(k, [])] + list(syncs))
    cpu_iv = _merge([iv for v in ranges.values() for iv in v])
    cpu = _len(cpu_iv)
    blocked = _overlap(cpu_iv, blocked_iv)
    out["host_us_total"] = cpu - blocked
    out["blocked_us_total"] = blocked
    out["host_us_per_iteration"] = (cpu - blocked) / iters if iters else None
    # host per iteration with a batch vs without: the CPU of an iteration is the ranges between
    # one iteration start and the next (the most frequent range marks iterations)
    anchor = max(counts, key=counts.get) if counts else None
    if anchor:
        marks = sorted(s for s, _ in ranges[anchor])
        host_busy, host_empty = [], []
        rb_s = sorted(starts)
        for k, m in enumerate(marks):
            nxt = marks[k + 1] if k + 1 < len(marks) else math.inf
            seg = [(max(s, m), min(e, nxt)) for s, e in cpu_iv if e > m and s < nxt]
            blk = _overlap(_merge(seg), blocked_iv)
            h = _len(seg) - blk
            has = bisect.bisect_left(rb_s, m) < len(rb_s) and rb_s[bisect.bisect_left(rb_s, m)] < nxt
            (host_busy if has else host_empty).append(h)
        out["host_us_busy_p50"] = _p50(host_busy)
        out["host_us_empty_p50"] = _p50(host_empty)
        out["iterations_with_batch"] = len(host_busy)
    out["recv_bytes_p50"] = _p50([b for _, _, b, _ in recvs])
    # kept for the cross-rank pass (loop_profile), dropped before the record is written
    out["_fwds"] = sorted(fwds, key=lambda f: f["start"])
    out["_recvs"] = sorted((s_, e_) for s_, e_, _, _ in recvs)
    return out


def loop_profile(ranks: dict[int, dict]) -> dict:
    """Cross-rank pass over read_steps() results of one run (one host: one clock).

    For each forward on rank r, its input is the receive that ended last before it started,
    and that receive carries what the upstream rank (r-1; pp-1 for rank 0: the sampled tokens)
    finished last before the receive ended (`u`). Then, per forward:
    - `late_host` = receive start - u, when positive: the receiver had not even posted its
      receive when the data was ready (its CPU was busy elsewhere);
    - `hop` = receive end - max(u, receive start): the transfer plus NCCL latency;
    - `host_gap` = forward start - max(receive end, previous forward end on r): the GPU idle
      with its input there, waiting for the launch.
    The host time on a rank's critical path per visit is `late_host + host_gap` (p50), the
    hop per link the p50 of `hop`. Rank summaries lose their raw lists here.
    """
    order = sorted(ranks)
    ends = {r: sorted(f["end"] for f in ranks[r].get("_fwds", [])) for r in order}
    out = {"ranks": {}, "hops": {}}
    for k, r in enumerate(order):
        d = ranks[r]
        up = order[k - 1]  # k = 0 -> the last rank (tokens come back from it)
        up_ends = ends[up] if len(order) > 1 else []
        recvs = d.get("_recvs", [])
        r_ends = [e for _, e in recvs]
        late, hop, crit = [], [], []
        prev_end = None
        for f in d.get("_fwds", []):
            ready = max(x for x in (f["input_at"], prev_end) if x is not None) \
                if (f["input_at"] is not None or prev_end is not None) else f["start"]
            gap = max(0.0, f["start"] - ready)
            prev_end = f["end"]
            lh = 0.0
            if f["input_at"] is not None and up_ends:
                i = bisect.bisect_right(r_ends, f["input_at"]) - 1
                if i >= 0:
                    rs, re_ = recvs[i]
                    j = bisect.bisect_right(up_ends, re_) - 1
                    if j >= 0:
                        u = up_ends[j]
                        lh = max(0.0, rs - u)
                        late.append(lh)
                        hop.append(max(0.0, re_ - max(u, rs)))
            crit.append(lh + gap)
        out["ranks"][str(r)] = d
        d["late_host_us_p50"] = _p50(late)
        d["host_critical_us_p50"] = _p50(crit)
        if hop:
            out["hops"][f"{up}->{r}"] = {"p50_us": _p50(hop), "n": len(hop)}
    for d in out["ranks"].values():
        d.pop("_fwds", None)
        d.pop("_recvs", None)
    return out


def read_loop(paths: dict[int, str | Path], *, hidden: int | None = None,
              link_gbps: float | None = None) -> dict:
    """read_steps for every rank, then loop_profile."""
    return loop_profile({r: read_steps(p, hidden=hidden, link_gbps=link_gbps, rank=r)
                         for r, p in sorted(paths.items())})
