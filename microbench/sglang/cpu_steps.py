"""Per-iteration view of one rank's trace when SGLang ran its forward on the CPU (no GPU events).

SGLang's CPU backend is a real deployment (`--device cpu`, gloo between the PP ranks): its
traces hold the scheduler's ranges, each forward's `step[DECODE bs=N]` / `step[EXTEND bs=N
toks=T]` span (srt/utils/profile_utils.py) and c10d's `gloo:send` / `gloo:recv` ranges, and no
GPU event. One thread does everything, so each loop iteration (from one `recv_requests` to the
next, SGLang's `event_loop_pp`) splits exactly into:

- **forward**: the `run_batch` range (the model runs inside it, synchronously); its micro-batch
  size and mode from the `step[...]` span inside it. Only decode forwards feed the curves.
- **waiting**: the CPU blocked in a `gloo:recv` range (c10d's receive: `irecv` then `wait()` at
  once, srt/utils/common.py `point_to_point_pyobj`, parallel_state `recv_tensor_dict`), by what
  it waited for: the request list inside `recv_requests` (`relay`: the previous rank's loop had
  not sent it yet), the hidden states before `run_batch` (`input`), the outputs inside
  `recv_res_dict_from_prev_stage` (`output`). Waiting is never called work: the pipeline model
  reproduces it from the other ranks' costs.
- **hidden-state send**: the `send_proxy_dict_to_next_stage` range (serialising and posting the
  hidden states; a blocking or delayed send shows here) - the sender's part of the hop.
- **result processing**: `process_batch_result` (the next slot's tokens), which SGLang runs
  after the forward and before the hidden-state send: it delays the next rank's input. It
  runs only when the next slot holds a batch, in an empty slot's visit too: its mean is over
  the visits that ran it, and an empty visit's own cost leaves it out (the model adds it
  wherever the next slot holds a batch).
- **host work**: the rest of the iteration (scheduling, the output exchange's own work,
  SGLang's unranged Python between ranges), before the forward.
- **the layers** (a window profiled with SGLang's defaults, `with_stack`): the Python tracer
  writes each module call as `nn.Module: <class>_<i>`; a decoder layer (`*DecoderLayer`, the
  class every SGLang model names its layers by: LlamaDecoderLayer, DeepseekV2DecoderLayer, ...)
  inside a decode forward is one of the rank's layers. Their count per forward is the rank's
  share of the layer split (SGLang logs it nowhere) and their mean time one layer's cost,
  which the layer split's what-if moves between ranks (reports/model/observed/layer_split.py).

`gloo:send` ranges are left out of every sum on purpose: SGLang sends with `isend` and waits one
phase later (`_pp_commit_comm_work`), so a send range opens at the post and closes when the send
completes; it covers the rank's ordinary work in between, not waiting (measured on SGLang 0.5.23
with torch 2.13 gloo: every `get_next_batch_to_run` inside one). The commit itself is waiting
when the send has not completed yet (a gloo send completes once the peer posted its receive):
the thread then runs nothing, no range and no op, until the send's range closes, and resumes at
once. So a gap in the thread's activity that a `gloo:send` closes (the next range or op starts
within `COMMIT_TAIL_US` of the send's end) is **waiting** (`commit`) from the gap's start to the
send's end, like a blocked receive; on the lab's PP2 server rank 0's empty visits are mostly
this (the request list's commit waiting for the next rank to finish its forward and post the
receive), which the pipeline model reproduces from the next rank's costs.

Cross-rank (`cpu_loop_profile`, one host: one clock): the hop r -> r+1 is the receiver's input
arriving after the sender posted it: receive end - max(sender's send range end, receive start);
the token hop last -> 0 likewise, from the last rank's `send_res_dict_to_next_stage` to rank 0's
`recv_res_dict_from_prev_stage`.
"""
from __future__ import annotations

import bisect
import math
import re
from statistics import median

from microbench.sglang import forward_window, window_blocks
from microbench.sglang.intervals import length, merge, overlap
from microbench.sglang.trace import STEP_RE, iter_events
# the thread resumes this soon after a committed send completes (SGLang 0.5.23 lab traces, PP2:
# the gap's tail after the send's end has p50 16-50 us, p90 under 100 us; the waits found are
# the same within 1% from 200 us to 3 ms); a gap that goes on longer after a send ended was
# not waiting for it
COMMIT_TAIL_US = 300.0
RANGES = ("recv_requests", "send_reqs_to_next_stage", "get_next_batch_to_run", "run_batch",
          "process_batch_result", "send_proxy_dict_to_next_stage", "send_res_dict_to_next_stage",
          "recv_res_dict_from_prev_stage", "scheduler.idle")
# the phases of `event_loop_pp` that run on every visit, whether the slot holds a batch or not
EVERY_VISIT = ("recv_requests", "send_reqs_to_next_stage", "get_next_batch_to_run")
# a decoder layer's module event, as torch's Python tracer names it (`nn.Module: <class>_<i>`)
LAYER_RE = re.compile(r"nn\.Module: \w*DecoderLayer_\d+$")


def idle_passes(starts: list[float], idle: list[tuple[float, float]]) -> tuple[int | None, set]:
    """SGLang marks a pass over all its slots that found nothing to run with one
    `scheduler.idle` range after the pass (`event_loop_pp`: `if server_is_idle: on_idle()`).
    Between two consecutive markers lie exactly `pp_loop_size` iterations, so the markers give
    the slot count (the most common such count) and which iterations belong to idle passes
    (the `slots` iterations before each marker): those are the server having no request at
    all (the client between waves), not empty slots of a running server."""
    if len(idle) < 2 or not starts:
        return None, set()
    marks = [s for s, _ in idle]
    counts: dict[int, int] = {}
    for a, b in zip(marks, marks[1:]):
        n = bisect.bisect_left(starts, b) - bisect.bisect_left(starts, a)
        if 1 <= n <= 256:
            counts[n] = counts.get(n, 0) + 1
    if not counts:
        return None, set()
    slots = max(counts, key=lambda n: (counts[n], -n))
    skip = set()
    for m in marks:
        j = bisect.bisect_left(starts, m)
        skip.update(range(max(0, j - slots), j))
    return slots, skip


def _mean(v):
    return float(sum(v) / len(v)) if v else None


def _p50(v):
    return float(median(v)) if v else None


def collect(path, shift_us: float = 0.0) -> dict:
    """The events the CPU view needs, from one trace file (streamed); `shift_us`: the rank's
    clock offset, taken off its timestamps (steps.read_loop)."""
    ranges: dict[str, list] = {k: [] for k in RANGES}
    steps, recvs, sends, busy, layers = [], [], [], [], []
    gpu = n = 0
    for ev in iter_events(path, shift_us=shift_us):
        n += 1
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        name, cat = ev.get("name"), ev.get("cat")
        try:
            ts, dur = float(ev["ts"]), float(ev["dur"])
        except (KeyError, TypeError, ValueError):
            continue
        if not (math.isfinite(ts) and math.isfinite(dur)) or dur < 0 or not isinstance(name, str):
            continue
        if cat in ("kernel", "Kernel", "gpu_memcpy", "gpu_memset"):
            gpu += 1
        elif cat == "python_function":
            if LAYER_RE.match(name):
                layers.append((ts, ts + dur))
            continue
        elif cat != "user_annotation":
            if cat == "cpu_op" and name.startswith("c10d::"):
                busy.append((ts, ts + dur))
            continue
        elif name.startswith("gloo:send"):
            sends.append((ts, ts + dur))
            continue
        busy.append((ts, ts + dur))
        if name in ranges:
            ranges[name].append((ts, ts + dur))
        elif name.startswith("gloo:recv"):
            recvs.append((ts, ts + dur))
        else:
            m = STEP_RE.match(name)
            if m:
                steps.append((ts, ts + dur, m.group(1), int(m.group(2))))
    for k, v in ranges.items():   # an event written twice is one event
        ranges[k] = sorted(set(v))
    return {"ranges": ranges, "steps": sorted(set(steps)), "recvs": merge(recvs),
            "commits": commit_waits(merge(busy), sorted(set(sends))), "gpu_events": gpu,
            "events": n, "layers": sorted(set(layers))}


def commit_waits(busy: list[tuple[float, float]], sends: list[tuple[float, float]]
                 ) -> list[tuple[float, float]]:
    """The thread blocked committing a send (module docstring): for each gap between merged
    activity intervals `busy`, (gap start, end of the last send that closed inside it) when the
    thread resumed within COMMIT_TAIL_US of that send's end."""
    ends = sorted(e for _, e in sends)
    out = []
    for (_, a), (b, _) in zip(busy, busy[1:]):
        j = bisect.bisect_right(ends, b) - 1
        if j >= 0 and ends[j] > a and b - ends[j] <= COMMIT_TAIL_US:
            out.append((a, ends[j]))
    return out


def is_cpu_trace(ev: dict) -> bool:
    """SGLang ran its forward on the CPU: run_batch ranges and no GPU event."""
    return not ev["gpu_events"] and bool(ev["ranges"]["run_batch"])


class _Sorted:
    """Intervals sorted by start, clipped to a window without scanning them all: bisect on the
    starts, then walk back while the running maximum of the ends still reaches the window
    (right for nested or overlapping intervals too). Each loop iteration asks for its own window,
    so a linear scan per iteration would make a long trace quadratic."""

    def __init__(self, ivs):
        self.ivs = sorted(ivs)
        self.starts = [a for a, _ in self.ivs]
        self.maxend, m = [], -math.inf
        for _, b in self.ivs:
            m = max(m, b)
            self.maxend.append(m)

    def clip(self, lo: float, hi: float) -> list[tuple[float, float]]:
        out = []
        k = bisect.bisect_left(self.starts, hi) - 1
        while k >= 0 and self.maxend[k] > lo:
            a, b = self.ivs[k]
            if b > lo:
                out.append((max(a, lo), min(b, hi)))
            k -= 1
        return out[::-1]


def full_rounds(visits: list[tuple[int, str | None]], slots: int | None) -> dict[str, int]:
    """Decode forwards by size in the rounds that held the window's most requests.

    A traced window of a short benchmark holds its ramp and its tail as well (the last wave's
    one or two requests left alone, `step[DECODE bs=1]`), and counted by forwards those sizes
    outweigh the steady ones: a server that ran C = 8 as 7 and 1 reads as 4 and 4. The round
    ending at a visit is that visit and the `slots - 1` before it (SGLang visits its
    `pp_loop_size` slots round-robin, each visit runs one slot's batch); the rounds whose sizes
    sum to the most seen are the server full. {} without the slot count, or with fewer such
    forwards than slots."""
    if not slots:
        return {}
    totals = []
    for v in range(len(visits)):
        win = visits[max(0, v - slots + 1):v + 1]
        ok = v >= slots - 1 and all(b >= 0 for b, _ in win)
        totals.append(sum(b for b, _ in win) if ok else -1)
    most = max(totals, default=-1)
    if most <= 0:
        return {}
    out: dict[str, int] = {}
    for (b, mode), t in zip(visits, totals):
        if t == most and mode == "DECODE" and b > 0:
            out[str(b)] = out.get(str(b), 0) + 1
    return dict(sorted(out.items(), key=lambda kv: int(kv[0]))) \
        if sum(out.values()) >= slots else {}


def layer_costs(dec: list[dict], layers: list[tuple[float, float]]) -> dict:
    """The rank's layers per decode forward (the most common count) and one layer's mean time
    by micro-batch size, from the decoder layers' module events inside each forward (module
    docstring); {} when the trace has none (a window profiled without stacks)."""
    if not layers:
        return {}
    starts = [a for a, _ in layers]
    counts: dict[int, int] = {}
    per: dict[int, list[float]] = {}
    for f in dec:
        inside = layers[bisect.bisect_left(starts, f["start"]):
                        bisect.bisect_left(starts, f["end"])]
        if inside:
            counts[len(inside)] = counts.get(len(inside), 0) + 1
            per.setdefault(f["batch"], []).append(sum(b - a for a, b in inside) / len(inside))
    if not counts:
        return {}
    return {"layers_per_forward": max(counts, key=lambda n: (counts[n], n)),
            "layer_us_by_batch": {str(b): _mean(v) for b, v in sorted(per.items())}}


def summarize(ev: dict, rank: int | None = None) -> dict:
    """One rank's loop profile from collect()'s events (the fields of LoopRank, plus `_fwds`
    and `_sends` for the cross-rank pass). Times in microseconds."""
    rg = ev["ranges"]
    starts = [s for s, _ in rg["recv_requests"]]
    out: dict = {"rank": rank, "device": "cpu", "events_without_dur": 0}
    if len(starts) < 2:
        out["reason"] = "fewer than two loop iterations (recv_requests ranges) in this trace"
        return out
    recvs = ev["recvs"]
    R = {k: _Sorted(v) for k, v in rg.items()}
    # waiting: blocked receives and blocked send commits (neither is the rank's own work)
    RECV_ONLY = _Sorted(recvs)
    COMMIT = _Sorted(ev.get("commits", []))
    RECV = _Sorted(merge(recvs + ev.get("commits", [])))
    steps = ev["steps"]
    step_starts = [s[0] for s in steps]
    rb = rg["run_batch"]
    rb_starts = [s for s, _ in rb]
    fwds, host_b, host_e = [], [], []
    every_b, every_e = [], []                 # the phases every visit runs (EVERY_VISIT)
    waits: dict[str, list] = {"relay": [], "input": [], "output": [], "commit": []}
    sends, procs, spans = [], [], []
    per_tensor: list[list[float]] = []        # each decode forward's input receives (#19582)
    meta: list[tuple[int, float]] = []        # per iteration: metadata receives, blocked us
    slots, idle = idle_passes(starts, rg["scheduler.idle"])
    visits: list[tuple[int, str | None]] = []   # per visit in order: (batch size, mode)
    # the model's inputs visit by visit, with the visit's start (window_blocks.py)
    samples: dict[str, list[tuple[float, float]]] = {}

    def sample(name: str, t: float, v: float) -> None:
        samples.setdefault(name, []).append((t, v))
    for i in range(len(starts) - 1):
        if i in idle:
            visits.append((-1, None))            # an idle pass breaks the round
            continue
        lo, hi = starts[i], starts[i + 1]
        span = hi - lo
        blocked = RECV.clip(lo, hi)
        b_total = length(merge(blocked))
        commit = length(merge(COMMIT.clip(lo, hi)))
        relay = overlap(merge(blocked), merge(R["recv_requests"].clip(lo, hi)))
        # metadata: the Python objects SGLang exchanges each iteration (request lists, the
        # output dicts: point_to_point_pyobj, a size then the bytes) -- their receives
        meta_iv = merge(R["recv_requests"].clip(lo, hi)
                        + R["recv_res_dict_from_prev_stage"].clip(lo, hi))
        meta_rx = [iv for iv in RECV_ONLY.clip(lo, hi) if overlap([iv], meta_iv)]
        output = overlap(merge(blocked), merge(R["recv_res_dict_from_prev_stage"].clip(lo, hi)))
        send = length(merge(R["send_proxy_dict_to_next_stage"].clip(lo, hi)))
        proc_iv = merge(R["process_batch_result"].clip(lo, hi))
        proc = length(proc_iv) - overlap(merge(blocked), proc_iv)
        j = bisect.bisect_left(rb_starts, lo)
        run = rb[j] if j < len(rb) and rb[j][0] < hi else None
        fwd_len = (min(run[1], hi) - run[0]) if run else 0.0
        host = max(0.0, span - fwd_len - b_total - send - proc)
        every_iv = merge([iv for k in EVERY_VISIT for iv in R[k].clip(lo, hi)])
        every = length(every_iv) - overlap(merge(blocked), every_iv)
        if run is None:
            # an empty slot's visit still processes the next slot's outputs when that slot
            # holds a batch (`process_batch_result` of `next_mb_id`): processing, not the
            # empty visit's own cost, so the model adds it once, as SGLang runs it
            host_e.append(host)
            every_e.append(every)
            sample("host_empty", lo, host)
            visits.append((0, None))
            if proc_iv:
                procs.append(proc)
                sample("process", lo, proc)
            waits["relay"].append(relay)
            waits["commit"].append(commit)
            continue
        k = bisect.bisect_left(step_starts, run[0])
        st = steps[k] if k < len(steps) and steps[k][0] < run[1] else None
        visits.append((st[3] if st else -1, st[2] if st else None))
        # the input receive: blocked before run_batch, outside recv_requests and outside the
        # output exchange (with async depth > 0 SGLang exchanges outputs before the forward)
        pre = merge(RECV_ONLY.clip(lo, run[0]))
        other = merge(R["recv_requests"].clip(lo, hi)
                      + R["recv_res_dict_from_prev_stage"].clip(lo, hi))
        pre_in = [(a, b) for a, b in pre if not overlap([(a, b)], other)]
        fwds.append({"start": run[0], "end": run[1], "mode": st[2] if st else None,
                     "batch": st[3] if st else None, "input": pre_in[-1] if pre_in else None,
                     "visit": i})
        if st and st[2] == "DECODE":
            host_b.append(host)
            every_b.append(every)
            sample("host", lo, host)
            sample("send", lo, send)
            if st[3]:
                sample(f"forward:{st[3]}", lo, min(run[1], hi) - run[0])
            if proc_iv:      # the next slot held a batch (else SGLang processes nothing)
                procs.append(proc)
                sample("process", lo, proc)
            spans.append(span)
            waits["relay"].append(relay)
            waits["output"].append(output)
            waits["input"].append(sum(b - a for a, b in pre_in))
            if pre_in:
                per_tensor.append([b - a for a, b in pre_in])
            meta.append((len(meta_rx), overlap(merge(meta_rx), meta_iv)))
            waits["commit"].append(commit)
            sends.append(send)
    dec = [f for f in fwds if f["mode"] == "DECODE" and f["batch"]]
    out.update(layer_costs(dec, ev.get("layers") or []))
    by_b: dict[int, list] = {}
    for f in dec:
        by_b.setdefault(f["batch"], []).append(f["end"] - f["start"])
    curve = {str(b): _mean(v) for b, v in sorted(by_b.items())}
    full = full_rounds(visits, slots)
    window = starts[-1] - starts[0]
    comp = length(merge([(f["start"], f["end"]) for f in fwds]))
    wait = length(merge(RECV.clip(starts[0], starts[-1])))
    send_all = length(merge(R["send_proxy_dict_to_next_stage"].clip(starts[0], starts[-1])))
    out.update({
        "forwards": len(dec), "graph_forwards": 0, "batch_source": "step spans",
        "prefill_forwards": sum(1 for f in fwds if f["mode"] == "EXTEND"),
        "forward_us_by_batch": {str(b): _p50(v) for b, v in sorted(by_b.items())},
        "forward_busy_us_by_batch": curve,          # no launch gaps on a CPU: busy = forward
        "forward_effective_us_by_batch": curve,
        "forward_count_by_batch": {str(b): len(v) for b, v in sorted(by_b.items())},
        "forward_count_full_by_batch": full,
        "forward_us_p50": _p50([f["end"] - f["start"] for f in dec]),
        "iterations": len(starts) - 1 - len([i for i in idle if i < len(starts) - 1]),
        "iterations_empty": len(host_e),
        "iterations_idle": len([i for i in idle if i < len(starts) - 1]),
        "slots": slots,
        "range_counts": {k: len(v) for k, v in rg.items() if v},
        "host_us_p50": _p50(host_b), "host_us_mean": _mean(host_b),
        "host_us_empty_p50": _p50(host_e), "host_us_empty_mean": _mean(host_e),
        "host_us_every_visit_mean": _mean(every_b),
        "host_us_every_visit_empty_mean": _mean(every_e),
        # waiting is the model's to reproduce, not a cost: none of it feeds the host time
        "relay_wait_us_mean": 0.0, "relay_wait_us_empty_mean": 0.0,
        "sync_wait_us_mean": 0.0, "send_wait_us_mean": 0.0, "foreign_queue_us_mean": 0.0,
        "send_us_mean": _mean(sends),
        "process_us_mean": _mean(procs),
        # one loop iteration with a decode forward, start to start: x slots = the decode step
        # the traced loop ran while every slot was busy (the model's steady state, observed)
        "iteration_us_mean": _mean(spans),
        "wait_us_mean": {k: _mean(v) for k, v in waits.items()},
        "input_recvs_per_forward": _mean([len(x) for x in per_tensor]),
        "input_wait_per_recv_us_mean": _mean([w for x in per_tensor for w in x]),
        "metadata_recvs_per_iteration": _mean([n for n, _ in meta]),
        "metadata_wait_us_per_iteration": _mean([w for _, w in meta]),
        "time_split": {"window_us": window, "compute_us": comp, "comm_transfer_us": send_all,
                       "comm_wait_us": wait, "comm_us": wait + send_all,
                       "other_us": max(0.0, window - comp - wait - send_all), "idle_us": 0.0},
    })
    out["_fwds"] = fwds
    out["_sends"] = {"proxy": rg["send_proxy_dict_to_next_stage"],
                     "output": rg["send_res_dict_to_next_stage"]}
    out["_out_recv"] = [(s, e) for s, e in rg["recv_res_dict_from_prev_stage"]]
    out["_recvs"] = recvs
    out["_samples"] = samples
    out["_rounds"] = (len(starts) - 1) // max(1, slots or 1)
    return out


def _hop(recv: tuple[float, float], sent_ends: list[float]) -> float | None:
    """Arrival after the post: receive end - max(latest send end before it, receive start)."""
    j = bisect.bisect_right(sent_ends, recv[1]) - 1
    if j < 0:
        return None
    return max(0.0, recv[1] - max(sent_ends[j], recv[0]))


def cpu_loop_profile(ranks: dict[int, dict]) -> dict:
    """Cross-rank pass over summarize() results of one run: the hops."""
    order = sorted(ranks)
    out: dict = {"ranks": {}, "hops": {}}
    for k, r in enumerate(order):
        d = ranks[r]
        up = order[k - 1]
        u = ranks[up]
        vals, times = [], []
        if k > 0:
            ends = sorted(e for _, e in u.get("_sends", {}).get("proxy", []))
            for f in d.get("_fwds", []):
                if f["mode"] == "DECODE" and f["input"] is not None:
                    h = _hop(f["input"], ends)
                    if h is not None:
                        vals.append(h)
                        times.append(f["start"])
        elif len(order) > 1:
            ends = sorted(e for _, e in u.get("_sends", {}).get("output", []))
            recvs = _Sorted(d.get("_recvs", []))
            for lo, hi in d.get("_out_recv", []):
                inner = recvs.clip(lo, hi)
                if inner:
                    h = _hop((inner[0][0], inner[-1][1]), ends)
                    if h is not None:
                        vals.append(h)
                        times.append(lo)
        if vals:
            out["hops"][f"{up}->{r}"] = {"p50_us": _p50(vals), "mean_us": _mean(vals),
                                         "n": len(vals), "_samples": list(zip(times, vals))}
    out["forwards"] = forward_window.keep({r: ranks[r].get("_fwds", []) for r in order})
    for r in order:
        d = dict(ranks[r])
        for key in ("_fwds", "_sends", "_out_recv", "_recvs"):
            d.pop(key, None)
        out["ranks"][str(r)] = d
    window_blocks.attach(out, min((ranks[r].get("_rounds", 0) for r in order), default=0))
    out["pathologies"] = pathologies(out)
    return out


def _ms(us: float) -> str:
    return f"{us / 1e3:.2f} ms"


def pathologies(loop: dict) -> list[str]:
    """The PP pathologies SGLang's issues report, as this loop profile times them:
    - the token return (the last rank's outputs to rank 0, hop `last->0`) against the slowest
      decode forward: named when it takes longer (sgl-project/sglang#10865: ~100 ms with decode
      CUDA graphs against ~3 ms without);
    - the input received one tensor at a time (#19582): receives per forward and the wait each;
    - the CPU metadata messages per iteration (#18715: they accumulate across the stages)."""
    ranks = {r: d for r, d in loop["ranks"].items() if not d.get("reason")}
    out = []
    if len(ranks) > 1:
        last = max(ranks, key=int)
        hop = (loop["hops"].get(f"{last}->0") or {}).get("mean_us")
        fw = [d["forward_us_p50"] for d in ranks.values() if d.get("forward_us_p50")]
        if hop is not None and fw and hop > max(fw):
            out.append(f"token return {last}->0 takes {_ms(hop)}, longer than the slowest decode "
                       f"forward ({_ms(max(fw))}): rank 0 waits on the last rank's outputs "
                       "(sgl-project/sglang#10865)")
    for r, d in sorted(ranks.items(), key=lambda kv: int(kv[0])):
        n, w = d.get("input_recvs_per_forward"), d.get("input_wait_per_recv_us_mean")
        if n is not None and n >= 2 and w is not None:
            out.append(f"rank {r} receives its input one tensor at a time: {n:.1f} receives per "
                       f"decode forward, {_ms(w)} waited each (sgl-project/sglang#19582)")
        n, w = d.get("metadata_recvs_per_iteration"), d.get("metadata_wait_us_per_iteration")
        if n and w is not None:
            out.append(f"rank {r}'s CPU metadata messages: {n:.1f} receives per iteration, "
                       f"{_ms(w)} blocked in them (sgl-project/sglang#18715)")
    return out
