"""What one pipeline hop costs: the hidden-state send between adjacent PP ranks.

What is measured, per directed pair of the pipeline (rank k -> k+1, and last -> first, which
carries the sampled tokens in SGLang) and per micro-batch size b (message: `tensors` bf16
tensors of [b, hidden], i.e. b * hidden * 2 bytes each):
- `nccl_us`: NCCL transport cost, one way. Ping-pong of isend/irecv + work.wait() on the NCCL
  process group, timed with CUDA events on the sender around each round trip, halved.
- `sendrecv_us` (= `hop_us`): what SGLang pays per micro-batch hop, one way. SGLang pickles the
  tensor metadata and sends it over a gloo (CPU) group - a size tensor, then the bytes - then
  sends each tensor with torch.distributed.isend on NCCL; the receiver blocks on the gloo
  receive, allocates, irecv()s each tensor and work.wait()s. Ping-pong of that, host-timed on
  the sender after a device synchronize, halved.
- `gloo_meta_us`: the gloo metadata message alone, one way.
Every received message is first checked against the sender's data (same seeded generator).

How to run: it is launched by `ppscope topology` through torchrun, one process per GPU:
    python -m torch.distributed.run --nproc-per-node N -m topology.hop --out hops.json
Rank 0 writes the JSON list after every pair (atomic), so an interrupted run keeps what it had.
Every collective carries a timeout (init_process_group's), and the parent kills the whole
process group when its own timeout passes, so a hung NCCL never hangs the tool.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import pickle
import sys

from microbench.timing import host_bench, summarize
from reports.records import write_json_atomic
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
    p.add_argument("--timeout-s", type=float, default=60.0)
    p.add_argument("--gpus", default=None,
                   help="physical GPU index of each rank, for the record (default: rank)")
    return p.parse_args(argv)


def _send_obj(dist, obj, dst: int, group) -> None:
    """SGLang's send_object: a size tensor, then the pickled bytes, over the gloo group."""
    import torch

    data = pickle.dumps(obj)
    dist.send(torch.tensor([len(data)], dtype=torch.long), dst=dst, group=group)
    dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), dst=dst, group=group)


def _recv_obj(dist, src: int, group):
    import torch

    size = torch.empty(1, dtype=torch.long)
    dist.recv(size, src=src, group=group)
    buf = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.recv(buf, src=src, group=group)
    return pickle.loads(buf.numpy().tobytes())


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

    # 3. SGLang-style: gloo metadata, then isend/irecv + work.wait() per tensor
    def sg_send(tensors):
        _send_obj(dist, meta, peer, gloo)
        for w in [dist.isend(t, peer) for t in tensors]:
            w.wait()

    def sg_recv():
        got = _recv_obj(dist, peer, gloo)
        out = []
        for _name, (_dev, _dtype, shape) in got:
            t = torch.empty(shape, dtype=torch.bfloat16, device=device)
            dist.irecv(t, peer).wait()
            out.append(t)
        return out

    def meta_only():
        if rank == src:
            _send_obj(dist, meta, peer, gloo)
            _recv_obj(dist, peer, gloo)
        else:
            _recv_obj(dist, peer, gloo)
            _send_obj(dist, meta, peer, gloo)

    if rank == src:
        sr = host_bench(lambda: (sg_send(xs), sg_recv()), reps=args.iters,
                        warmup=args.warmup, sync=torch.cuda.synchronize).scaled(2)
        gm = host_bench(meta_only, reps=args.iters, warmup=args.warmup).scaled(2)
    else:
        for _ in range(n):
            sg_send(sg_recv())
        torch.cuda.synchronize()
        for _ in range(n):
            meta_only()
        return None
    nbytes = args.tensors * batch * args.hidden * 2
    return {"batch": batch, "bytes": nbytes, "tensors": args.tensors,
            "nccl_us": nccl.median_us, "nccl_p20_us": nccl.p20_us, "nccl_p80_us": nccl.p80_us,
            "nccl_bandwidth_gbps": nbytes / nccl.median_us / 1e3,
            "sendrecv_us": sr.median_us, "sendrecv_p20_us": sr.p20_us,
            "sendrecv_p80_us": sr.p80_us, "gloo_meta_us": gm.median_us,
            "hop_us": sr.median_us}


def _nccl_version(torch) -> str:
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.distributed as dist

    args = parse_args(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    timeout = dt.timedelta(seconds=args.timeout_s)
    try:
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    except TypeError:  # torch without device_id
        dist.init_process_group("nccl", timeout=timeout)
    gloo = dist.new_group(backend="gloo", timeout=timeout)
    phys = [int(x) for x in args.gpus.split(",")] if args.gpus else list(range(world))
    batches = [int(b) for b in args.batches.split(",")]
    hops: list[dict] = []
    try:
        for src, dst in pipeline_pairs(list(range(world))):
            for b in batches:
                dist.barrier(group=gloo)
                res = measure_pair(dist, gloo, rank, src, dst, b, args, device) \
                    if rank in (src, dst) else None
                box = [res]
                dist.broadcast_object_list(box, src=src, group=gloo)
                if rank == 0:
                    hops.append({"src": phys[src], "dst": phys[dst], **box[0]})
                    write_json_atomic(args.out, {"hops": hops, "world": world,
                                                 "nccl": _nccl_version(torch)})
        dist.barrier(group=gloo)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
