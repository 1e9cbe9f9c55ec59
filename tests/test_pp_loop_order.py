"""The PP-loop probe's message protocol on the CPU: every rank of microbench/dispatch/pp_loop.py's
`run_point` in its own process, gloo for everything (NCCL's place too), CUDA streams and events
replaced by no-ops. What it checks is the order of sends and receives (SGLang's loop order: held
outputs, the ring of outputs, the stop/drain handshake): that no rank waits for a message that
never comes, at depth 0 and > 0, with chunked prefills, and that the columns add up. Timing is
not checked here (the GPU tier does that)."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import time
import types

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


class _Event:
    def __init__(self, enable_timing: bool = False):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def query(self):
        return True

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


class _Stream:
    def wait_stream(self, other):
        pass

    def wait_event(self, ev):
        pass


class _Ctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _fake_cuda():
    """torch.cuda as the loop uses it, on the CPU."""
    return types.SimpleNamespace(
        Stream=_Stream, Event=_Event, current_stream=lambda *a: _Stream(),
        stream=lambda s: _Ctx(), synchronize=lambda *a: None, _sleep=lambda cyc: None)


class _Work:
    """NCCL's `work.wait()` only adds a stream dependency and may be called again (the probe
    waits a send once on a side stream to time it, once when committing it); gloo's second
    wait() blocks forever, so the stand-in waits once."""
    def __init__(self, w):
        self.w, self.done = w, False

    def wait(self):
        if not self.done:
            self.w.wait()
            self.done = True
        return True


def _dist_once():
    d = types.SimpleNamespace(**{k: getattr(dist, k) for k in dir(dist) if not k.startswith("__")})
    d.isend = lambda *a, **k: _Work(dist.isend(*a, **k))
    d.irecv = lambda *a, **k: _Work(dist.irecv(*a, **k))
    return d


def _worker(rank: int, world: int, port: int, cfg: dict, points: list, out_dir: str):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    gloo = dist.new_group(backend="gloo")
    torch.cuda = _fake_cuda()  # this process only (forked)
    from microbench.dispatch import pp_loop
    ctx = {"cfg": cfg, "rank": rank, "pp": world, "gloo": gloo, "dev": torch.device("cpu"),
           "fwd": lambda x: x + 1, "graphs": {}, "capture_sizes": [],
           "emb": torch.randn(max(cfg["concurrency"]) * cfg["prompt_len"], cfg["hidden"],
                              dtype=torch.bfloat16),
           "inject": pp_loop.parse_inject([], world), "cyc_per_us": 0.0,
           "fwd_us": lambda b: 0.0}
    res = [pp_loop.run_point(torch, _dist_once(), ctx, p) for p in points]
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tmp_path, pp: int, depth: int, points: list, prompt_len: int = 4,
         chunk: int | None = None, cap: int = 64) -> list[list[dict]]:
    cfg = {"pp": pp, "async_depth": depth, "max_micro_batch": cap, "micro_batches": None,
           "max_running_requests": 1024, "chunked_prefill_size": chunk,
           "max_prefill_tokens": 16384, "hidden": 16, "graphs": False,
           "concurrency": [p["concurrency"] for p in points], "prompt_len": prompt_len,
           "stagger_ms": 0.0, "poisson_rate_per_s": 1.0, "seconds_per_point": 0.05,
           "max_iters_per_point": 60, "seed": 0}
    ctx = mp.get_context("fork")
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, pp, port, cfg, points, str(tmp_path)))
             for r in range(pp)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 90
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, "a rank is still waiting: a message of the loop is never sent"
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(pp)]


def _pt(policy, C):
    return {"policy": policy, "arrival": "burst", "concurrency": C}


@pytest.mark.parametrize("pp,depth", [(2, 2), (3, 1), (2, 0), (4, 4)])
def test_loop_order_terminates_and_ranks_agree(tmp_path, pp, depth):
    pts = [_pt("sglang", 1), _pt("sglang", 8), _pt("even", 8)]
    res = _run(tmp_path, pp, depth, pts)
    for k, p in enumerate(pts):
        cols = [r[k]["columns"] for r in res]
        n_it = {len(c["it"]) for c in cols}
        assert len(n_it) == 1                       # every rank ran the same iterations
        for c in cols:
            assert c["kind"] == cols[0]["kind"] and c["n"] == cols[0]["n"]
            fwd = [i for i, rows in enumerate(c["rows"]) if rows]
            assert all(c["launch_us"][i] >= 0 for i in fwd)
        r0 = res[0][k]
        assert sum(r0["slot_sizes"]) == p["concurrency"]
        # every rank processes the outputs of each slot it ran, once per visit (sync count)
        synced = [sum(1 for v in c["process_us"] if v is not None) for c in cols]
        assert len(set(synced)) == 1 and synced[0] > 0


def test_chunked_prefill_splits_the_burst_in_the_probe(tmp_path):
    # prompts of 10 tokens, budget 25 per visit: 2 whole + 5 tokens of a third per visit
    res = _run(tmp_path, 2, 2, [_pt("sglang", 6)], prompt_len=10, chunk=25)
    r0 = res[0][0]
    assert r0["slot_sizes"] == [2, 3, 1, 0]
    c = r0["columns"]
    pre = [(c["slot"][i], c["n"][i], c["rows"][i]) for i, k in enumerate(c["kind"])
           if k == "prefill"]
    assert pre[:3] == [(0, 3, 25), (1, 3, 25), (2, 1, 10)]
