"""Loop-order mechanics of SGLang's PP decode loop (SGLang 0.5.23 managers/scheduler_pp_mixin.py,
`event_loop_pp`): how a rank exchanges requests, hidden states and sampled tokens, on which
stream, in which order. Kept apart from the loop body (microbench/pp_loop.py `run_point`) so
that what the loop measures stays easy to read."""
from __future__ import annotations

import time

from microbench.kit.launch import recv_pyobj, send_pyobj

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
