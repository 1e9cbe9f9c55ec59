"""What one pipeline hop costs: the hidden-state send between adjacent PP ranks.

What is measured, per directed pair of the pipeline (rank k -> k+1, and last -> first, which
carries the sampled tokens in SGLang) and per micro-batch size b (message: `tensors` bf16
tensors of [b, hidden], i.e. b * hidden * 2 bytes each):
- `nccl_us`: what one unpipelined torch send costs, one way. Ping-pong of isend/irecv +
  work.wait() per tensor on the NCCL process group (each op its own NCCL launch), timed with
  CUDA events on the sender around each round trip, halved.
- `nccl_transport_us`: the NCCL transport itself, comparable with nccl-tests `sendrecv_perf`:
  both ranks of the pair send their tensors to each other at once in one
  `batch_isend_irecv` group, iterations back to back on the stream, CUDA events around blocks
  of `iters` iterations after a warm-up; per-iteration time. `nccl_busbw_gbps` = bytes / time
  (for SendRecv busbw = algbw: nccl-tests doc/PERFORMANCE.md).
- `hop_us` (= `sendrecv_us`): what SGLang pays per micro-batch hop, one way. SGLang pickles the
  tensor metadata and sends it over a gloo (CPU) group - a size tensor, then the bytes - then
  sends each tensor with torch.distributed.isend on NCCL; the receiver blocks on the gloo
  receive, allocates, irecv()s each tensor and work.wait()s. Ping-pong of that, host-timed on
  the sender after a device synchronize, halved.
- its parts: `gloo_meta_us` (the gloo metadata message alone, one way: two gloo sends),
  `gloo_send_us` (one 8-byte gloo send, one way), `pickle_us` (pickle.dumps + loads of the
  metadata), and `overhead_us` = hop_us - gloo_meta_us - nccl_us (allocation, Python, the
  synchronize; negative when the parts overlap). Every ping-pong has a warm-up (gloo's and
  NCCL's first-use costs stay out) and nothing in the loops sleeps or polls.
And once for all ranks (`transport`): the nccl-tests `sendrecv_perf` pattern itself - every
rank sends `bytes` to the next rank and receives from the previous at once, back to back -
over power-of-two sizes (8 B .. 128 MB with --sizes all), `nccl_transport_us`,
`nccl_busbw_gbps` per size. Compare it with `sendrecv_perf -b 8 -e 128M -f 2 -g N`.
Every received message is first checked against the sender's data (same seeded generator).

How to run: it is launched by `ppscope topology` through torchrun, one process per GPU:
    python -m torch.distributed.run --nproc-per-node N -m topology.hop --out hops.json
Rank 0 writes the JSON after every step (atomic), so an interrupted run keeps what it had.
Every collective carries a timeout (init_process_group's), and the parent kills the whole
process group when its own timeout passes, so a hung NCCL never hangs the tool.
"""
from __future__ import annotations

import argparse
import pickle
import sys
import time

from microbench.kit.launch import recv_pyobj, send_pyobj, start_rank
from microbench.kit.timing import host_bench, summarize
from reports.base.records import write_json_atomic
from topology.links import pipeline_pairs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="topology.hop", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON file rank 0 writes the hop list to")
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--tensors", type=int, default=2,
                   help="tensors per hop (DeepSeek-style models send hidden_states + residual)")
    p.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--blocks", type=int, default=5,
                   help="timed blocks of --iters back-to-back iterations (transport figures)")
    p.add_argument("--sizes", default="8,128,2048,32768,524288,8388608,134217728",
                   help="bytes per rank for the sendrecv sweep, or 'all' (8 B .. 128 MB, x2), "
                        "or 'none'")
    p.add_argument("--timeout-s", type=float, default=60.0)
    p.add_argument("--gpus", default=None,
                   help="physical GPU index of each rank, for the record (default: rank)")
    return p.parse_args(argv)


ALL_SIZES = tuple(8 << k for k in range(25))   # 8 B .. 128 MiB, x2: sendrecv_perf -b 8 -e 128M


def parse_sizes(spec: str) -> list[int]:
    """'all' -> 8 B..128 MiB in powers of two; 'none' -> []; else comma-separated bytes, each a
    positive multiple of 4 (int32 elements)."""
    if spec == "all":
        return list(ALL_SIZES)
    if spec in ("none", ""):
        return []
    sizes = [int(x) for x in spec.split(",")]
    bad = [x for x in sizes if x <= 0 or x % 4]
    if bad:
        raise ValueError(f"--sizes: {bad[0]} is not a positive multiple of 4 bytes")
    return sizes


def _pattern(nbytes: int, seed: int, device):
    """Deterministic non-zero int32 data of nbytes (a multiplicative hash of the index), the
    same on every GPU model - unlike torch's device RNG, whose stream depends on the grid."""
    import torch

    i = torch.arange(nbytes // 4, dtype=torch.int64, device=device)
    return ((i * 2654435761 + seed * 40503 + 12345) % 2147483647 + 1).to(torch.int32)


def timed_exchange(dist, sends, recvs, peer_send: int, peer_recv: int, warmup: int, iters: int,
                   blocks: int):
    """Back-to-back batched exchanges (send `sends` to peer_send, receive `recvs` from
    peer_recv in one batch_isend_irecv group per iteration), as nccl-tests sendrecv_perf does;
    CUDA events around each block of `iters` iterations. Returns the Timing of one iteration.
    Every rank taking part must call it with the same warmup/iters/blocks."""
    import torch

    def one():
        ops = [dist.P2POp(dist.isend, t, peer_send) for t in sends] + \
              [dist.P2POp(dist.irecv, t, peer_recv) for t in recvs]
        for w in dist.batch_isend_irecv(ops):
            w.wait()  # NCCL: the current stream waits; the host does not block

    for _ in range(warmup):
        one()
    torch.cuda.synchronize()
    # torch's batch_isend_irecv costs tens of microseconds of host time per call, more than a
    # small message takes on the wire; timed as is, the GPU would idle between launches and
    # we would measure the host. So (STYLE rule 3) the stream is held by a sleep kernel while
    # every timed iteration is enqueued, sized from the host's own enqueue time, and the GPU
    # then runs them back to back as nccl-tests' C loop does.
    t0 = time.perf_counter()
    one()
    enqueue_s = (time.perf_counter() - t0) * iters * blocks
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(blocks)]
    if iters * blocks > 1:
        # cycles at <= 2 GHz: a slower clock only holds the stream longer; capped at 0.5 s
        torch.cuda._sleep(int(min(2.0 * enqueue_s + 1e-3, 0.5) * 2e9))
    for s, e in ev:
        s.record()
        for _ in range(iters):
            one()
        e.record()
    torch.cuda.synchronize()
    return summarize([s.elapsed_time(e) * 1e3 / iters for s, e in ev])


def transport_sweep(dist, gloo, rank: int, world: int, sizes: list[int], args,
                    device) -> list[dict]:
    """nccl-tests sendrecv_perf on all ranks: rank r sends to r+1 and receives from r-1 (mod
    world). Data checked first; the reported time is the slowest rank's median."""
    import torch

    nxt, prv = (rank + 1) % world, (rank - 1) % world
    out: list[dict] = []
    for nbytes in sizes:
        send = _pattern(nbytes, 1000 + rank, device)
        recv = torch.zeros_like(send)
        timed_exchange(dist, [send], [recv], nxt, prv, 0, 1, 1)
        ok = bool(torch.equal(recv, _pattern(nbytes, 1000 + prv, device)))
        t = timed_exchange(dist, [send], [recv], nxt, prv, args.warmup, args.iters, args.blocks)
        box: list = [None] * world
        dist.all_gather_object(box, (ok, t.median_us, t.p20_us, t.p80_us), group=gloo)
        if not all(b[0] for b in box):
            bad = [r for r, b in enumerate(box) if not b[0]]
            raise RuntimeError(f"sendrecv {nbytes} B: rank {bad[0]} received wrong data")
        slow = max(box, key=lambda b: b[1])
        out.append({"bytes": nbytes, "nccl_transport_us": slow[1],
                    "nccl_transport_p20_us": slow[2], "nccl_transport_p80_us": slow[3],
                    "nccl_busbw_gbps": nbytes / slow[1] / 1e3,  # SendRecv: busbw = algbw
                    "per_rank_us": [b[1] for b in box]})
        del send, recv
    return out


def _reference(batch: int, hidden: int, tensors: int, seed: int, device):
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, hidden, generator=g).to(torch.bfloat16).to(device)
            for _ in range(tensors)]


def measure_pair(dist, gloo, rank: int, src: int, dst: int, batch: int, args,
                 device) -> dict | None:
    """Run on both ranks of the pair; returns the result on `src`, None on `dst`."""
    import torch

    peer = dst if rank == src else src
    meta = [(f"t{k}", ("cuda", "torch.bfloat16", (batch, args.hidden)))
            for k in range(args.tensors)]
    xs = _reference(batch, args.hidden, args.tensors, 7919 * src + 31 * dst + batch, device)
    bufs = [torch.empty_like(x) for x in xs]

    # 1. check: src sends its reference, dst compares with its own copy of it
    if rank == src:
        for w in [dist.isend(x, peer) for x in xs]:
            w.wait()
        torch.cuda.synchronize()
    else:
        for w in [dist.irecv(b, peer) for b in bufs]:
            w.wait()
        torch.cuda.synchronize()
        if not all(torch.equal(a, b) for a, b in zip(bufs, xs)):
            raise RuntimeError(f"hop {src}->{dst} b={batch}: received data differs from sent")

    # 2. NCCL ping-pong, CUDA events on src around each round trip
    def nccl_round(first_send: bool):
        ops = (dist.isend, dist.irecv) if first_send else (dist.irecv, dist.isend)
        for w in [ops[0](t, peer) for t in (xs if first_send else bufs)]:
            w.wait()
        for w in [ops[1](t, peer) for t in bufs]:
            w.wait()

    n = args.warmup + args.iters
    if rank == src:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for k in range(n):
            starts[k].record()
            nccl_round(True)
            ends[k].record()
        torch.cuda.synchronize()
        nccl = summarize([s.elapsed_time(e) * 1e3 / 2 for s, e in
                          zip(starts[args.warmup:], ends[args.warmup:])])
    else:
        for _ in range(n):
            nccl_round(False)
        torch.cuda.synchronize()

    # 3. NCCL transport: both ranks exchange the message at once, back to back (sendrecv_perf)
    for b in bufs:
        b.zero_()  # so the check below sees this exchange's data, not the ping-pong's
    tr = timed_exchange(dist, xs, bufs, peer, peer, args.warmup, args.iters, args.blocks)
    if not all(torch.equal(a, b) for a, b in zip(bufs, xs)):
        raise RuntimeError(f"hop {src}->{dst} b={batch}: batched exchange returned wrong data")

    # 4. SGLang-style: gloo metadata, then isend/irecv + work.wait() per tensor
    def sg_send(tensors):
        send_pyobj(dist, meta, peer, gloo)
        for w in [dist.isend(t, peer) for t in tensors]:
            w.wait()

    def sg_recv():
        got = recv_pyobj(dist, peer, gloo)
        out = []
        for _name, (_dev, _dtype, shape) in got:
            t = torch.empty(shape, dtype=torch.bfloat16, device=device)
            dist.irecv(t, peer).wait()
            out.append(t)
        return out

    def meta_only():
        if rank == src:
            send_pyobj(dist, meta, peer, gloo)
            recv_pyobj(dist, peer, gloo)
        else:
            recv_pyobj(dist, peer, gloo)
            send_pyobj(dist, meta, peer, gloo)

    one = torch.zeros(1, dtype=torch.long)

    def gloo_once():  # one 8-byte gloo message each way
        if rank == src:
            dist.send(one, peer, group=gloo)
            dist.recv(one, peer, group=gloo)
        else:
            dist.recv(one, peer, group=gloo)
            dist.send(one, peer, group=gloo)

    if rank == src:
        sr = host_bench(lambda: (sg_send(xs), sg_recv()), reps=args.iters,
                        warmup=args.warmup, sync=torch.cuda.synchronize).scaled(2)
        gm = host_bench(meta_only, reps=args.iters, warmup=args.warmup).scaled(2)
        g1 = host_bench(gloo_once, reps=args.iters, warmup=args.warmup).scaled(2)
    else:
        for _ in range(n):
            sg_send(sg_recv())
        torch.cuda.synchronize()
        for _ in range(n):
            meta_only()
        for _ in range(n):
            gloo_once()
        return None
    pk = host_bench(lambda: pickle.loads(pickle.dumps(meta)), reps=args.iters,
                    warmup=args.warmup)
    return hop_entry(batch, args.tensors * batch * args.hidden * 2, args.tensors, nccl=nccl,
                     transport=tr, sendrecv=sr, gloo_meta=gm, gloo_send=g1, pickle_t=pk)


def hop_entry(batch: int, nbytes: int, tensors: int, *, nccl, transport, sendrecv, gloo_meta,
              gloo_send, pickle_t) -> dict:
    """One hop record from the Timings (all one way, microseconds)."""
    return {"batch": batch, "bytes": nbytes, "tensors": tensors,
            "nccl_us": nccl.median_us, "nccl_p20_us": nccl.p20_us, "nccl_p80_us": nccl.p80_us,
            "nccl_bandwidth_gbps": nbytes / nccl.median_us / 1e3,
            "nccl_transport_us": transport.median_us,
            "nccl_transport_p20_us": transport.p20_us,
            "nccl_transport_p80_us": transport.p80_us,
            "nccl_busbw_gbps": nbytes / transport.median_us / 1e3,
            "sendrecv_us": sendrecv.median_us, "sendrecv_p20_us": sendrecv.p20_us,
            "sendrecv_p80_us": sendrecv.p80_us,
            "gloo_meta_us": gloo_meta.median_us, "gloo_send_us": gloo_send.median_us,
            "pickle_us": pickle_t.median_us,
            "overhead_us": sendrecv.median_us - gloo_meta.median_us - nccl.median_us,
            "hop_us": sendrecv.median_us}


def _nccl_version(torch) -> str:
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.distributed as dist

    args = parse_args(argv)
    sizes = parse_sizes(args.sizes)
    rc = start_rank(args.timeout_s)
    rank, world, device, gloo = rc.rank, rc.world, rc.device, rc.gloo
    phys = [int(x) for x in args.gpus.split(",")] if args.gpus else list(range(world))
    batches = [int(b) for b in args.batches.split(",")]
    hops: list[dict] = []
    transport: list[dict] = []
    phase_s: dict[str, float] = {}

    def save():
        if rank == 0:
            write_json_atomic(args.out, {"hops": hops, "transport": transport, "world": world,
                                         "phase_s": phase_s,
                                         "nccl": _nccl_version(torch),
                                         "transport_pattern": "sendrecv_perf: each rank sends "
                                         "to the next and receives from the previous at once"})
    try:
        # first, with every rank taking part (batch_isend_irecv's first call must be
        # collective): the sendrecv_perf sweep
        t0 = time.perf_counter()
        transport.extend(transport_sweep(dist, gloo, rank, world, sizes or [8], args, device))
        if not sizes:
            transport.clear()  # the 8-byte exchange only opened the batched path
        phase_s["sweep"] = time.perf_counter() - t0
        save()
        t0 = time.perf_counter()
        for src, dst in pipeline_pairs(list(range(world))):
            for b in batches:
                dist.barrier(group=gloo)
                res = measure_pair(dist, gloo, rank, src, dst, b, args, device) \
                    if rank in (src, dst) else None
                box = [res]
                dist.broadcast_object_list(box, src=src, group=gloo)
                if rank == 0:
                    hops.append({"src": phys[src], "dst": phys[dst], **box[0]})
                phase_s["hops"] = time.perf_counter() - t0
                save()
        dist.barrier(group=gloo)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
