"""Discrete-event model of SGLang's pipeline-parallel decode loop, rank by rank (steady state).

What it models: SGLang 0.5.23 managers/scheduler_pp_mixin.py, `event_loop_pp`, one iteration
per slot visit on every rank, in SGLang's order (`pp + async_depth` slots round-robin; slot `k`
holds `slot_sizes[k]` requests throughout, requests never move):

1. `recv_requests`: rank r > 0 blocks (gloo) on the request list rank r-1 sent at the start of
   the same iteration; rank r < last sends it on at once (async), empty slots included, after
   committing the previous one. Every commit of a send (`_pp_commit_comm_work`) waits for its
   gloo part, and a gloo send completes only once the peer has posted the receive (rendezvous;
   `chain_us` later): so neighbouring ranks' CPUs stay within about one iteration;
2. `get_next_batch_to_run`: CPU `host_us` (non-empty slot) or `empty_us` (the whole iteration of
   an empty slot);
3. rank r > 0, non-empty slot: the proxy (hidden states) receive blocks the CPU until rank r-1
   sent its metadata; the NCCL receive is queued on the schedule stream, which the forward
   waits on (`_pp_recv_proxy_tensors`, `_pp_wait_forward_dependencies`);
4. with `async_depth > 0` outputs are exchanged *before* the forward
   (`_pp_exchange_outputs_before_forward`; after it with depth 0), even ranks sending first,
   odd ranks receiving first (`_pp_send_recv_and_preprocess_output_tensors`):
   - send: the last rank sends the sampled tokens of the slot it ran `async_depth` iterations
     ago (it holds a queue of them; the NCCL send waits for that forward's end); every other
     rank forwards the outputs it received the iteration before (ring last -> 0 -> 1 -> ...);
   - the previous output send is committed on the schedule stream before anything else;
   - receive, when slot k+1 holds a batch: the CPU blocks on the metadata, the NCCL receive is
     queued on the schedule stream (so this rank's next forward waits for those tokens too),
     and a device-to-host event is recorded after everything on that stream;
5. launch: the previous proxy send is committed on the schedule stream first
   (`_pp_commit_proxy_send_work`: its NCCL send must have completed, `hop_us` after it left);
   CPU `launch_us`; the forward starts on the GPU once the CPU launched it, the GPU is free and
   the schedule stream is done (inputs, the tokens of slot k+1, the previous sends); the last
   rank queues this forward's outputs;
6. when slot k+1 holds a batch, every rank blocks the CPU on that device-to-host event (a sync:
   it waits for the returned tokens *and* for this rank's previous forward, whose proxy send
   sits on the same stream) and runs `process_batch_result` for slot k+1 (`process_us`);
7. rank r < last, non-empty slot: proxy metadata goes to rank r+1 (gloo, at once) and the NCCL
   send waits for this forward's end (`ready_event=launch_event`), arriving `hop_us` later.

So a rank's host work overlaps its upstream's GPU forward, and the CPU of every rank is held
one forward behind its GPU by the per-iteration sync.

SGLang's CPU backend (`cpu_forward=True`): the forward runs on the rank's own CPU, so its clock
stays at the forward's end (nothing overlaps it), and `send_us` (the CPU time of posting the
hidden states, `send_proxy_dict_to_next_stage`) passes before they leave.

`token_return=False` is the idealised loop the attribution starts from: the last rank sends a
slot's tokens to rank 0 as soon as its forward ends (not held, not queued behind other
receives), only rank 0 waits for them (before that slot's next forward, then processes them),
and no rank syncs on the next slot's outputs. Everything else is as above.

How to read it: `simulate()` runs full rounds on every rank (ranks run ahead by a few iterations
to feed the last ones) and measures the second half, once the loop is periodic; without spans
to draw it stops once the last rank has run the measured rounds.
`tok_per_s` = requests x rounds / elapsed time (last rank's forward ends), `tpot_ms` = one
round, `busy_frac[i]` = GPU `i` busy / round. With no host costs it reproduces DESIGN.md's
closed forms (`reports/model/sim/closed_form.py`) for one micro-batch, for depth 0 with no two
occupied slots adjacent, and for any placement with `token_return=False`; with depth > 0 and
evenly spaced micro-batches, `closed_form.period_held_us` (the held send waits behind a later
slot's hidden states). Adjacent occupied slots couple further (a forward waits for the next
slot's tokens and for the last proxy send): the tests work two such cases by hand. Pure Python,
no numpy; messages live in lists indexed by iteration, and a message already posted is read
without switching generators.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Sequence, Union

from reports.base.server_settings import slot_count

PerRank = Union[float, tuple]


@dataclass(frozen=True)
class LoopConfig:
    """Everything the simulator needs; times in microseconds, tables indexed by batch size.

    stage_us[i][b]: forward of rank i for a micro-batch of b requests (b = 0..bmax; [0] unused).
    hop_us[i][b]:   rank i -> rank i+1 hidden-state hop; hop_us[pp-1] is a sampled-token hop
                    (last -> first and the ring of outputs between ranks).
    CPU costs (`host_us`, `launch_us`, `process_us`, `empty_us`) are one number for every rank
    or a tuple with one per rank.
    """
    stage_us: tuple[tuple[float, ...], ...]
    hop_us: tuple[tuple[float, ...], ...]
    async_depth: int
    host_us: PerRank = 0.0       # get_next_batch_to_run, non-empty slot
    empty_us: PerRank = 0.0      # the whole iteration of an empty slot
    chain_us: float = 0.0        # one gloo message: request list, proxy or output metadata
    launch_us: PerRank = 0.0     # run_batch on the CPU (input prep, graph replay / launches)
    process_us: PerRank = 0.0    # process_batch_result of the next slot
    token_return: bool = True    # False: the idealised return (module docstring)
    # Observed host time on each rank's critical path per non-empty visit (a loop profile of
    # SGLang's own traces, reports/model/observed/deployment.py): that rank's run_batch CPU, replacing
    # `launch_us`. In SGLang's order every rank syncs on the next slot's outputs
    # (`token_return`).
    rank_host_us: tuple[float, ...] = ()
    # SGLang's CPU backend: the forward runs on the rank's CPU (no device to overlap with), so
    # the CPU clock stays at the forward's end; `send_us`: per rank, the CPU time of posting the
    # hidden-state send (`send_proxy_dict_to_next_stage`) before it leaves
    cpu_forward: bool = False
    send_us: tuple[float, ...] = ()

    @property
    def pp(self) -> int:
        return len(self.stage_us)

    @property
    def slots(self) -> int:
        return slot_count(self.pp, self.async_depth)

    def cpu(self, name: str, rank: int) -> float:
        if name == "launch_us" and self.rank_host_us:
            return float(self.rank_host_us[rank])
        v = getattr(self, name)
        return float(v[rank]) if isinstance(v, tuple) else float(v)

    def __post_init__(self) -> None:
        if len(self.hop_us) != len(self.stage_us):
            raise ValueError("hop_us needs one row per rank (the last is the token hop)")
        for row in (*self.stage_us, *self.hop_us):
            if any(v < 0 for v in row):
                raise ValueError("costs must be >= 0")
        for name in ("host_us", "empty_us", "launch_us", "process_us"):
            v = getattr(self, name)
            vals = v if isinstance(v, tuple) else (v,)
            if isinstance(v, tuple) and len(v) != self.pp:
                raise ValueError(f"{name}: one value per rank ({self.pp}), got {len(v)}")
            if any(x < 0 for x in vals):
                raise ValueError("costs must be >= 0")
        if self.chain_us < 0 or any(v < 0 for v in self.rank_host_us):
            raise ValueError("costs must be >= 0")
        if self.rank_host_us and len(self.rank_host_us) != self.pp:
            raise ValueError("rank_host_us needs one entry per rank")
        if self.send_us and (len(self.send_us) != self.pp or any(v < 0 for v in self.send_us)):
            raise ValueError("send_us needs one entry >= 0 per rank")


@dataclass(frozen=True)
class Span:
    """One forward on one rank's GPU (for the timeline trace)."""
    rank: int
    slot: int
    batch: int
    start_us: float
    end_us: float


@dataclass(frozen=True)
class SimResult:
    tok_per_s: float
    tpot_ms: float
    busy_frac: tuple[float, ...]
    slot_sizes: tuple[int, ...]
    spans: tuple[Span, ...] = ()


def _at(row: Sequence[float], b: int) -> float:
    if b >= len(row):
        raise ValueError(f"no cost for micro-batch size {b} (table goes to {len(row) - 1})")
    return row[b]


class _Deadlock(RuntimeError):
    pass


class _Wires:
    """Every message of one run, by kind and sending rank: a list indexed by the sender's
    iteration (request lists, proxies, their acks: the receiver's post of the receive) or by
    its output message number (outputs and their acks); None until posted. Each list has one
    reader, so a blocked rank waits on one (list, index)."""

    def __init__(self, pp: int, iters: int):
        def rows():
            return [[None] * iters for _ in range(pp)]
        self.req, self.req_ack = rows(), rows()
        self.proxy, self.proxy_ack = rows(), rows()
        self.out, self.out_ack = rows(), rows()
        self.tok = [None] * iters          # idealised return: iteration -> tokens at rank 0

    def of(self, r: int) -> tuple[list, ...]:
        """Rank r's sends and the acks of their receivers: request lists, proxies, outputs."""
        return (self.req[r], self.req_ack[r], self.proxy[r], self.proxy_ack[r], self.out[r],
                self.out_ack[r])


def _forward(t: float, gpu_free: float, sched: float, cost: float, on_cpu: bool,
             spans: list | None, r: int, k: int, n: int) -> tuple[float, float]:
    """One forward launched at CPU time t (its launch cost already added): it starts once the
    GPU is free and the schedule stream has reached it, and runs `cost`; a forward on the CPU
    holds the CPU until it ends. Returns (the CPU's time after the launch, the forward's end)."""
    start = gpu_free if gpu_free > t else t
    if sched > start:
        start = sched
    end = start + cost
    if spans is not None:
        spans.append(Span(r, k, n, start, end))
    return (end if on_cpu else t), end


def _arrived(t: float, sched: float, meta: float, data: float, chain: float
             ) -> tuple[float, float]:
    """A receive's metadata reaches the CPU (after the chain) and its data the schedule stream:
    (CPU time, schedule stream) once both wait for it."""
    meta += chain
    return (meta if meta > t else t), (data if data > sched else sched)


def _rank_loop(cfg: LoopConfig, r: int, sizes: list[int], iters: int, wires: _Wires,
               done_at: dict, spans: list | None, plan: "Plan | None" = None):
    """One rank's event loop as a generator: yields the (list, index) of each message it
    blocks on and is resumed with the message's value (reports/model/sim/pipeline_model.py
    module docstring); a message already posted is read without yielding. With a `plan`,
    iteration j runs the plan's batch j (a decode of n requests, or a prefill of its tokens)
    instead of the fixed slot sizes. `a if a > b else b` stands for max(b, a) throughout (the
    same float, without a call: this loop is the report's hot path)."""
    p, S, depth, last = cfg.pp, cfg.slots, cfg.async_depth, cfg.pp - 1
    host, empty = cfg.cpu("host_us", r), cfg.cpu("empty_us", r)
    launch, process = cfg.cpu("launch_us", r), cfg.cpu("process_us", r)
    chain, stage, hop, tok_hop = cfg.chain_us, cfg.stage_us[r], cfg.hop_us[r], cfg.hop_us[last]
    on_cpu, send_cpu = cfg.cpu_forward, (float(cfg.send_us[r]) if cfg.send_us else 0.0)
    prev = (r - 1) % p
    # this rank's inbox (rank r - 1's sends) and outbox, with the acks each side posts
    req_in, req_in_ack, proxy_in, proxy_in_ack, out_in, out_in_ack = wires.of(prev)
    req_out, req_out_ack, proxy_out, proxy_out_ack, out_out, out_out_ack = wires.of(r)
    tok = wires.tok
    t = gpu_free = sched = 0.0           # CPU clock, GPU free, schedule stream
    proxy_done = out_done = 0.0          # when this rank's last proxy / output send completed
    # gloo sends complete only once the peer posted its receive (rendezvous): the last send of
    # each kind not yet committed, as (index of the receiver's ack, time sent); -1: none
    req_j = proxy_j = out_j = -1
    req_t = proxy_t = out_t = 0.0
    mbs = [0] * S                        # this rank's batch size at its last visit of each slot
    held: deque = deque()                # last rank: (forward end, batch) not yet sent
    pp_out = None                        # outputs received last iteration: (ready, batch)
    sent = recvd = 0                     # output messages sent / received, in order
    for j in range(iters):
        k = j % S
        if plan is None:
            n = sizes[k]
            cost, hop_cost = (stage[n], hop[n]) if n else (0.0, 0.0)
        else:
            n, tokens = plan.batch(j)
            cost, hop_cost = plan.costs(r, n, tokens) if n else (0.0, 0.0)
        if r > 0:                                            # 1. recv_requests
            req_in_ack[j] = t
            v = req_in[j]
            if v is None:
                v = yield req_in, j
            v += chain
            if v > t:
                t = v
        if r < last:
            if req_j >= 0:                                   # commit the last request list
                v = req_out_ack[req_j]
                if v is None:
                    v = yield req_out_ack, req_j
                v = (req_t if req_t > v else v) + chain
                if v > t:
                    t = v
            req_out[j] = t
            req_j, req_t = j, t
        mbs[k] = n                                           # 2. get_next_batch_to_run
        t += host if n else empty
        if n and r > 0:                                      # 3. proxy receive
            proxy_in_ack[j] = t
            v = proxy_in[j]
            if v is None:
                v = yield proxy_in, j
            t, sched = _arrived(t, sched, v[0], v[1], chain)
        if not cfg.token_return:                             # idealised return
            if n and r == 0 and j >= S:
                v = tok[j - S]
                if v is None:
                    v = yield tok, j - S
                t = (v if v > t else t) + process
            if n:
                t, end = _forward(t + launch, gpu_free, sched, cost, on_cpu, spans, r, k, n)
                gpu_free = end
                if r == last:
                    done_at[j] = end
                    tok[j] = end + _at(tok_hop, n)
                else:
                    if end > sched:
                        sched = end
                    t += send_cpu
                    proxy_out[j] = (t, (t if t > sched else sched) + hop_cost)
            continue
        nxt = mbs[(k + 1) % S]
        new_out = d2h = end = None
        for launching in ((True, False) if depth == 0 else (False, True)):
            if launching:
                if proxy_done > sched:                       # commit the last proxy send
                    sched = proxy_done
                if proxy_j >= 0:
                    v = proxy_out_ack[proxy_j]
                    if v is None:
                        v = yield proxy_out_ack, proxy_j
                    v = (proxy_t if proxy_t > v else v) + chain
                    if v > t:
                        t = v
                    proxy_j = -1
                if n:                                        # 5. launch
                    t, end = _forward(t + launch, gpu_free, sched, cost, on_cpu, spans, r, k, n)
                    gpu_free = end
                    if r == last:
                        held.append((end, n))
                        done_at[j] = end
                continue
            if out_done > sched:                             # commit the last output send
                sched = out_done
            if out_j >= 0:
                v = out_out_ack[out_j]
                if v is None:
                    v = yield out_out_ack, out_j
                v = (out_t if out_t > v else v) + chain
                if v > t:
                    t = v
                out_j = -1
            for sending in ((True, False) if r % 2 == 0 else (False, True)):  # even ranks send first
                if sending:                                  # 4. exchange outputs
                    nn = None
                    if r == last:
                        if mbs[(k + p) % S]:
                            fe, nn = held.popleft()
                            if fe > sched:
                                sched = fe                   # NCCL send waits for that forward
                    elif pp_out is not None:
                        nn = pp_out[1]
                    if nn is not None:
                        out_done = (t if t > sched else sched) + _at(tok_hop, nn)
                        out_out[sent] = (t, out_done, nn)
                        out_j, out_t = sent, t
                        sent += 1
                elif nxt:
                    out_in_ack[recvd] = t
                    v = out_in[recvd]
                    if v is None:
                        v = yield out_in, recvd
                    recvd += 1
                    t, sched = _arrived(t, sched, v[0], v[1], chain)
                    d2h = sched                              # copy stream waits the schedule
                    new_out = (sched, v[2])                  # stream, then records the event
        if nxt:                                              # 6. d2h sync + process result
            t = (d2h if d2h > t else t) + process
            if r == 0 and plan is not None:                  # the client has those tokens
                plan.processed[j + 1 - S] = t
        if n and r < last:                                   # 7. proxy send
            if end > sched:
                sched = end                                  # waits on the launch event
            t += send_cpu
            proxy_done = (t if t > sched else sched) + hop_cost
            proxy_out[j] = (t, proxy_done)
            proxy_j, proxy_t = j, t
        pp_out = new_out


def simulate(cfg: LoopConfig, slot_sizes: Sequence[int], rounds: int | None = None,
             keep_spans: bool = False) -> SimResult:
    """Run the loop and measure its periodic regime. `slot_sizes` has one entry per slot
    (shorter lists are padded with empty slots). `rounds=None`: 6 rounds, measuring the last
    4, when they repeat with period 1 or 2 (some placements alternate two round lengths);
    else 16 rounds, measuring the last 8. A number: that many, the second half."""
    if rounds is not None:
        return _simulate(cfg, slot_sizes, rounds, keep_spans, check=False)
    res = _simulate(cfg, slot_sizes, 6, keep_spans, check=True)
    return res if res is not None else _simulate(cfg, slot_sizes, 16, keep_spans, check=False)


def _drive(cfg: LoopConfig, sizes: list[int], iters: int, spans: list | None,
           plan: "Plan | None" = None, last_iters: int | None = None) -> dict[int, float]:
    """Every rank's loop run for `iters` iterations (the last rank for `last_iters`, when
    given: the run then stops once the last rank is done), each blocked rank resumed once the
    message it waits on is posted; returns when the last rank's forward of each iteration
    ended. Messages are read as posted, so the order ranks are resumed in changes no time."""
    wires = _Wires(cfg.pp, iters)
    done_at: dict[int, float] = {}
    last = cfg.pp - 1
    gens = [_rank_loop(cfg, r, sizes, iters if r < last or last_iters is None else last_iters,
                       wires, done_at, spans, plan) for r in range(cfg.pp)]
    # each live rank's wait: (list, index) of the message it blocks on; (None, 0) to start
    waits: list = [(None, 0)] * cfg.pp
    moved = True
    while moved:
        moved = False
        for r, w in enumerate(waits):
            if w is None:
                continue
            box, i = w
            v = None if box is None else box[i]
            if box is not None and v is None:
                continue
            try:
                waits[r] = gens[r].send(v)
            except StopIteration:
                if r == last and last_iters is not None:
                    return done_at
                waits[r] = None
            moved = True
    return done_at


def _simulate(cfg: LoopConfig, slot_sizes: Sequence[int], rounds: int, keep_spans: bool,
              check: bool) -> SimResult | None:
    p, S = cfg.pp, cfg.slots
    sizes = list(slot_sizes) + [0] * (S - len(slot_sizes))
    if len(sizes) > S:
        raise ValueError(f"{len(sizes)} slot sizes for {S} slots")
    if any(n < 0 for n in sizes):
        raise ValueError("slot sizes must be >= 0")
    rows = (*cfg.stage_us, *cfg.hop_us)
    if any(max(sizes, default=0) >= len(row) for row in rows):    # name the first one missing
        for n in sizes:
            if n:
                for row in rows:
                    _at(row, n)
    total = sum(sizes)
    if total == 0:
        return SimResult(0.0, 0.0, tuple(0.0 for _ in range(p)), tuple(sizes))
    spans: list | None = [] if keep_spans else None
    need = rounds * S
    # the last rank's forwards up to `need` are all that is measured: without spans to draw,
    # the run stops there (the other ranks' later iterations would change no time before it)
    done_at = _drive(cfg, sizes, need + 2 * S + p, spans,
                     last_iters=None if keep_spans else need)
    per_round = sum(1 for n in sizes if n > 0)
    its = sorted(j for j in done_at if j < need)
    if len(its) < rounds * per_round:
        raise _Deadlock(f"loop stalled after {len(its)} forwards on the last rank "
                        f"(expected {rounds * per_round}): a message is never sent")
    ends = [done_at[its[(r + 1) * per_round - 1]] for r in range(rounds)]
    half = rounds - 4 if check else rounds // 2
    if check:
        d = [b - a for a, b in zip(ends[half - 1:], ends[half:])]
        tol = 1e-9 * max(d)
        if not (abs(d[0] - d[2]) <= tol and abs(d[1] - d[3]) <= tol):
            return None
    elapsed = ends[-1] - ends[half - 1]
    n_rounds = rounds - half
    if elapsed <= 0:
        raise ValueError("zero elapsed time: every cost is zero")
    period = elapsed / n_rounds
    busy = [sum(_at(cfg.stage_us[i], n) for n in sizes if n > 0) / period for i in range(p)]
    return SimResult(
        tok_per_s=total * n_rounds / elapsed * 1e6,
        tpot_ms=period / 1e3,
        busy_frac=tuple(busy),
        slot_sizes=tuple(sizes),
        spans=tuple(sorted(spans, key=lambda s: (s.start_us, s.rank))) if spans else (),
    )


@dataclass(frozen=True)
class Plan:
    """A run visit by visit instead of fixed slot sizes (a benchmark's start and end, prefill
    included): `batches[j]` = (requests, prefill tokens) of iteration j, in SGLang's order (slot
    j % slots); prefill tokens 0 is a decode of that many requests, (0, 0) an empty visit.
    `prefill_us(rank, tokens, requests)`: a prefill forward; its hidden states cost
    `hop_us[rank][tokens]` (the table's last step continued past its end, as the twin's hold
    does: a prefill sends one hidden row per token)."""
    cfg: LoopConfig
    batches: tuple[tuple[int, int], ...]
    prefill_us: object
    # filled by `simulate_plan`: iteration -> when rank 0 processed that batch's tokens
    # (`process_batch_result`: they then go to the detokenizer and the client)
    processed: dict = field(default_factory=dict, compare=False)

    def batch(self, j: int) -> tuple[int, int]:
        return self.batches[j] if j < len(self.batches) else (0, 0)

    def costs(self, r: int, n: int, tokens: int) -> tuple[float, float]:
        """(forward, hidden-state hop) of rank r for this batch."""
        if not tokens:
            return _at(self.cfg.stage_us[r], n), _at(self.cfg.hop_us[r], n)
        return float(self.prefill_us(r, tokens, n)), _extended(self.cfg.hop_us[r], tokens)


def _extended(row: Sequence[float], b: int) -> float:
    if b < len(row):
        return row[b]
    top = len(row) - 1
    step = row[top] - row[top - 1] if top > 1 else row[top]
    return row[top] + (b - top) * max(0.0, step)


def simulate_plan(plan: Plan) -> dict[int, float]:
    """When the last rank's forward of each non-empty iteration of `plan` ends (us from the
    run's start; `plan.processed` gets when rank 0 processed its tokens): the plan run through
    every rank's loop once, then empty visits until the pipeline drains."""
    cfg = plan.cfg
    p, S = cfg.pp, cfg.slots
    for n, tokens in plan.batches:
        if n < 0 or tokens < 0:
            raise ValueError("plan batches must be >= 0")
        if n and not tokens:
            _at(cfg.stage_us[0], n)
    done_at = _drive(cfg, [], len(plan.batches) + 2 * S + p, None, plan)
    want = sum(1 for n, _ in plan.batches if n)
    got = sum(1 for j in done_at if j < len(plan.batches))
    if got < want:
        raise _Deadlock(f"plan stalled after {got} of {want} forwards on the last rank")
    return done_at


def run_key(cfg: LoopConfig, slot_sizes: Sequence[int]) -> LoopConfig:
    """What `simulate(cfg, slot_sizes)` reads of `cfg`: its cost tables only at the batch sizes
    that run (in size order), every other field as it is. Two loops with the same key give the
    same result, so a caller memoising runs (reports/model/scenario/loop_builder.py) runs them once;
    loops that differ only at sizes no slot holds (another graph padding of an unused size, a
    table built to a larger size) are one run. `cfg` itself when a size has no cost."""
    used = sorted({n for n in slot_sizes if n})
    top = used[-1] if used else 0
    if any(top >= len(row) for row in (*cfg.stage_us, *cfg.hop_us)):
        return cfg

    def at_used(rows):
        return tuple(tuple(row[n] for n in used) for row in rows)
    return replace(cfg, stage_us=at_used(cfg.stage_us), hop_us=at_used(cfg.hop_us))


def uniform_loop(pp: int, async_depth: int, bmax: int, stage_us: Sequence[float] | float,
                 hop_us: float = 0.0, return_us: float | None = None, **kw) -> LoopConfig:
    """A loop whose stage and hop costs do not depend on batch size (tests, closed forms)."""
    per = [float(stage_us)] * pp if isinstance(stage_us, (int, float)) else list(stage_us)
    ret = hop_us if return_us is None else return_us
    hops = [hop_us] * (pp - 1) + [ret]
    return LoopConfig(
        stage_us=tuple(tuple([0.0] + [c] * bmax) for c in per),
        hop_us=tuple(tuple([0.0] + [h] * bmax) for h in hops),
        async_depth=async_depth, **kw,
    )
