"""Loop-order mechanics of SGLang's PP decode loop (SGLang 0.5.23 managers/scheduler_pp_mixin.py,
`event_loop_pp`): how a rank exchanges requests, hidden states and sampled tokens, on which
stream, in which order, in how many messages. Kept apart from the loop body
(microbench/dispatch/pp_loop.py `run_point`) so that what the loop measures stays easy to read.

Messages per hop, as SGLang sends them (utils/common.py `point_to_point_pyobj`,
distributed/parallel_state.py `send_object` / `send_tensor_dict`):
- the request list: its pickled size, then the bytes; an empty list is the size 0 alone (one
  message);
- a tensor dict (the hidden states, the outputs): the pickled metadata (size, then bytes: always
  two messages) listing each tensor's shape and dtype, then one message per tensor, received one
  at a time into a tensor allocated from the metadata. The hidden-state dict holds two tensors,
  `hidden_states` and `residual`; the output dict one, `next_token_ids`.
Pickled objects travel over gloo; tensors over NCCL on a GPU, over gloo on the CPU (SGLang sends
a CPU tensor over its CPU group). Kept on purpose: each message kind has its own gloo tag, where
SGLang sends all on tag 0 and sorts tensor dicts by their `__msg_type__` on arrival
(`_pp_recv_typed_dict`); the number and order of messages per channel are the same.

`api` is `torch.cuda` on a GPU, microbench/dispatch/pp_device.py's host stand-ins on the CPU."""
from __future__ import annotations

import contextlib
import pickle
import time

from microbench.kit.launch import recv_pyobj, send_pyobj
from microbench.dispatch.pp_device import is_host, spin_us
from microbench.dispatch.rank_config import RankConfig, rank_config
from reports.base.server_settings import slot_count

TAG_REQS, TAG_PROXY, TAG_OUT = 0, 1, 2  # gloo tags: one channel per message kind


def _api(torch, ctx: dict):
    return ctx.get("api") or torch.cuda


def _rf(ctx: dict, name: str):
    rf = ctx.get("rf")
    return rf(name) if rf is not None else contextlib.nullcontext()


def isend_pyobj(torch, dist, obj, dst: int, group, tag: int) -> list:
    """SGLang's `send_object(async_send=True)`: the pickled size, then the bytes (two messages,
    whatever the object). Returns (work, tensor) pairs to commit later."""
    data = pickle.dumps(obj)
    size = torch.tensor([len(data)], dtype=torch.long)
    body = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return [(dist.isend(size, dst=dst, group=group, tag=tag), size),
            (dist.isend(body, dst=dst, group=group, tag=tag), body)]


def isend_list(torch, dist, items: list, dst: int, group, tag: int) -> list:
    """SGLang's `point_to_point_pyobj(async_send=True)` for the request list: an empty list is
    one message (its size, 0), any other the size and the pickled bytes."""
    if not items:
        size = torch.tensor([0], dtype=torch.long)
        return [(dist.isend(size, dst=dst, group=group, tag=tag), size)]
    return isend_pyobj(torch, dist, items, dst, group, tag)


def recv_pyobj_tag(torch, dist, src: int, group, tag: int):
    """The receiving side of `isend_pyobj` (blocks the CPU, as SGLang's `recv_object`)."""
    size = torch.empty(1, dtype=torch.long)
    dist.irecv(size, src=src, group=group, tag=tag).wait()
    buf = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.irecv(buf, src=src, group=group, tag=tag).wait()
    return pickle.loads(buf.numpy().tobytes())


def recv_list(torch, dist, src: int, group, tag: int) -> list:
    """The receiving side of `isend_list` (`point_to_point_pyobj` on the receiver: a size of 0
    is the empty list, no second message)."""
    size = torch.zeros(1, dtype=torch.long)
    dist.irecv(size, src=src, group=group, tag=tag).wait()
    if int(size.item()) == 0:
        return []
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


def new_loop_state(torch, cfg: RankConfig | dict, pp: int, rank: int, api=None) -> dict:
    """Per-rank state of SGLang's PP loop: the schedule stream (current while the loop runs),
    the forward and copy streams, what each slot ran at this rank's last visit (`mbs`: rows,
    `ran`: (kind, requests, rows, running before)), the last rank's held outputs, the outputs
    received last iteration, the async sends in flight."""
    api = api or torch.cuda
    S = slot_count(pp, rank_config(cfg).async_depth)
    return {"sched": api.current_stream(), "fwd": api.Stream(), "copy": api.Stream(),
            "mbs": [0] * S, "ran": [None] * S, "held": [], "pp_out": None,
            "req_work": [], "proxy_work": [], "out_work": []}


def _meta(tensors: dict, msg_type: str) -> list:
    """`_split_tensor_dict`'s metadata list: (key, (device type, dtype, shape)) per tensor, and
    the message type SGLang adds (`__msg_type__`)."""
    return [(k, (t.device.type, str(t.dtype), tuple(t.shape))) for k, t in tensors.items()] \
        + [("__msg_type__", msg_type)]


def _recv_dict(torch, dist, src: int, gloo, tag: int, dev) -> dict:
    """`recv_tensor_dict`: block on the metadata (gloo), then receive each tensor into a fresh
    buffer with `work.wait()` (NCCL: the schedule stream waits, the CPU does not; gloo: the
    CPU waits)."""
    out = {}
    for key, spec in recv_pyobj_tag(torch, dist, src, gloo, tag):
        if key == "__msg_type__":
            continue
        _, dtype, shape = spec
        t = torch.empty(shape, dtype=getattr(torch, dtype.split(".")[-1]), device=dev)
        dist.irecv(t, src=src).wait()
        out[key] = t
    return out


def recv_proxy(torch, dist, ctx: dict, lp: dict) -> tuple[float, dict]:
    """`_pp_recv_proxy_tensors` (no profiler range in SGLang): the hidden-state dict from
    rank - 1, `hidden_states` and `residual` (padded rows where the sender replayed a graph).
    Returns (microseconds the CPU waited, the tensors)."""
    tw = time.perf_counter()
    got = _recv_dict(torch, dist, ctx["rank"] - 1, ctx["gloo"], TAG_PROXY, ctx["dev"])
    return (time.perf_counter() - tw) * 1e6, got


def exchange_outputs(torch, dist, ctx: dict, lp: dict, s: int, drain: bool = False
                     ) -> tuple[float, object]:
    """`_pp_commit_send_output_work_and_preprocess_output_tensors`: commit the last output send;
    then, even ranks sending first and odd ranks receiving first:
    - send (`send_res_dict_to_next_stage`): the last rank sends the tokens of the slot it ran
      `async_depth` iterations ago (slot s + pp; the NCCL send waits for that forward's end
      event), every other rank forwards the outputs it received last iteration (ring last ->
      0 -> 1 -> ...);
    - receive (`recv_res_dict_from_prev_stage`), when slot s + 1 ran a batch here: the output
      dict (metadata over gloo, blocking; tokens over NCCL on the schedule stream), then a
      device-to-host copy on the copy stream after it.
    `drain`: the final iteration, sends only (so every receive posted so far is matched).
    Returns (microseconds the CPU waited, (d2h event, host buffer, tokens) or None)."""
    rank, pp, gloo = ctx["rank"], ctx["pp"], ctx["gloo"]
    api = _api(torch, ctx)
    last, S = pp - 1, len(lp["mbs"])
    waited, got = 0.0, None
    if not drain:   # gloo sends complete only once received: at the end, commit after draining
        waited += commit(lp["out_work"])

    def send_dict(tok, dst):
        with _rf(ctx, "send_res_dict_to_next_stage"):
            lp["out_work"] += isend_pyobj(torch, dist, _meta({"next_token_ids": tok}, "output"),
                                          dst, gloo, TAG_OUT)
            lp["out_work"].append((dist.isend(tok, dst=dst), tok))

    def send():
        if rank == last:   # (at the end rank 0 expects nothing more: what is held is dropped)
            if not drain and lp["mbs"][(s + pp) % S]:
                ev, tok = lp["held"].pop(0)
                lp["sched"].wait_event(ev)           # ready_event = that forward's end
                send_dict(tok, 0)
        elif lp["pp_out"] is not None:
            send_dict(lp["pp_out"], rank + 1)

    def recv():
        nonlocal waited, got
        if drain or not lp["mbs"][(s + 1) % S]:
            return
        tw = time.perf_counter()
        with _rf(ctx, "recv_res_dict_from_prev_stage"):
            buf = _recv_dict(torch, dist, (rank - 1) % pp, gloo, TAG_OUT,
                             ctx["dev"])["next_token_ids"]
        waited += (time.perf_counter() - tw) * 1e6
        lp["copy"].wait_stream(lp["sched"])
        with api.stream(lp["copy"]):
            host = buf.to("cpu", non_blocking=True)
            d2h = api.Event()
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


def send_proxy(torch, dist, ctx: dict, lp: dict, tensors: dict, launch_ev, late=None,
               delay_us: float = 0.0):
    """`_pp_send_proxy_to_next_stage`: the hidden-state dict (`hidden_states`, `residual`):
    metadata (gloo, at once), then each tensor once the forward's end event fired
    (`ready_event=launch_event`). The next launch commits it first
    (`_pp_commit_proxy_send_work`), so the next forward waits until NCCL has read these
    buffers. `delay_us` (--inject hop-delay): on a GPU the sends leave that much later, on
    `late`, without slowing the sender's forward; on the CPU (one thread) the sender spins
    first, as a delayed send in SGLang's CPU loop does. Returns the send-complete event (GPU),
    None on the CPU (the send's end is not timed there)."""
    rank, api = ctx["rank"], _api(torch, ctx)
    lp["proxy_work"] += isend_pyobj(torch, dist, _meta(tensors, "proxy"), rank + 1,
                                    ctx["gloo"], TAG_PROXY)
    lp["sched"].wait_event(launch_ev)
    outs = [t.contiguous() for t in tensors.values()]
    if is_host(api):
        if delay_us:
            spin_us(delay_us)
        for out in outs:
            lp["proxy_work"].append((dist.isend(out, dst=rank + 1), out))
        return None
    if delay_us:
        late.wait_stream(lp["sched"])
        with api.stream(late):
            torch.cuda._sleep(int(delay_us * ctx["cyc_per_us"]))
            ws = [dist.isend(out, dst=rank + 1) for out in outs]
    else:
        ws = [dist.isend(out, dst=rank + 1) for out in outs]
    lp["proxy_work"] += list(zip(ws, outs))
    side = ctx["side"]
    side.wait_stream(lp["sched"])
    with api.stream(side):
        ws[-1].wait()  # a side stream waits on NCCL to time the send's end
        e = api.Event(enable_timing=True)
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
                _recv_dict(torch, dist, pp - 1, gloo, TAG_OUT, ctx["dev"])
    for key in ("req_work", "proxy_work", "out_work"):
        commit(lp[key])
