"""SGLang's pipeline-parallel slot and admission discipline, as pure functions (no torch).

What it models (SGLang 0.5.23 managers/scheduler_pp_mixin.py, `event_loop_pp`, and
managers/scheduler.py, `get_next_batch_to_run` / `_get_new_batch_prefill_raw` /
`get_num_allocatable_reqs`, with managers/schedule_policy.py, `PrefillAdder`):
- `pp_size + pp_async_batch_depth` micro-batch *slots*, visited round-robin;
- a slot visit admits waiting requests (FIFO) while all of these hold:
  - the per-slot cap `pp_max_micro_batch_size` (default `max(max_running_requests // pp_size,
    1)`: divided by the number of stages, not of slots; reports/base/server_settings.py)
    minus the requests running in the slot;
  - free request rows: `max_running_requests` minus the requests running in every slot;
  - the prefill token budget of one visit: `chunked_prefill_size` (the default depends on GPU
    memory, reports/base/sglang_defaults.py) and `max_prefill_tokens` (16384). A prompt that
    does not fit the rest of the chunk budget is *chunked*: its first part runs in this visit,
    the rest in the next visits (whichever slot they are), and it joins the slot of its last
    chunk (SGLang's one global `chunked_req`). With 1000-token prompts and the 8192 budget, a
    burst of 32 splits 8 / 8 / 8 / 8 whatever the cap is.
- a slot that prefills (admits, or continues the chunked request) runs that prefill in its
  visit instead of its decode ("prefill first");
- requests never move between slots; a finished request leaves its slot at the slot's next
  visit, and the client's next request joins whichever slot is being visited when it arrives
  (REISSUE_VISITS): with lengths that differ, occupancy drifts away from the first split.

`run_loop` is the one closed-loop run (arrival waves, bench_serving's successor rule, a
round-time callback): the scenario model's drift (`closed_loop`, reports/model/scenario/loop_builder.py)
and the observed what-ifs (reports/model/observed/bench_run.py `bench_run`) both run it; the
PP-loop probe admits with `visit` at each of its visits.

Two admission policies:
- `sglang`: what SGLang does (above).
- `even`: ppscope's counterfactual (arrival pacing): spread the requests over `micro_batches`
  slots (default `pp`, about one micro-batch per stage in flight, ~C/pp requests each), chosen
  evenly spaced in the round-robin; whole requests only, within the same rows and token budget
  (a paced client sends a slot no more than fits). `micro_batches` is a choice: with MoE every
  micro-batch re-reads the experts its tokens touch, so more micro-batches than stages costs
  weight bandwidth. If the cap cannot hold everything in `micro_batches` slots, more are used.

Simplified on purpose: KV-cache token capacity is not a limit (the pool is assumed large
enough), a slot's `batch_is_full` flag is recomputed every visit (SGLang keeps it until a
request leaves that slot), pages are 1 token unless `page_size` says otherwise.

The PP-loop probe (`microbench/dispatch/pp_loop.py`, on real GPUs), the report's pipeline model
and the observed what-ifs use these functions, so they admit requests identically.
"""
from __future__ import annotations

import heapq
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

from reports.base.server_settings import ServerSettings, chunk_budget, slot_count
from reports.base.sglang_defaults import MAX_PREFILL_TOKENS

POLICIES = ("sglang", "even")


@dataclass(frozen=True)
class SlotConfig:
    """`pp` stages, `async_depth` extra slots, per-slot cap `max_micro_batch` (requests);
    `max_running_requests` request rows (None: no limit), prefill token budget per visit
    `chunked_prefill_size` (None: chunked prefill off) and `max_prefill_tokens`."""
    pp: int
    async_depth: int
    max_micro_batch: int
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int = MAX_PREFILL_TOKENS
    page_size: int = 1

    def __post_init__(self) -> None:
        if self.pp < 1:
            raise ValueError(f"pp must be >= 1, got {self.pp}")
        if self.async_depth < 0:
            raise ValueError(f"async_depth must be >= 0, got {self.async_depth}")
        if self.max_micro_batch < 1:
            raise ValueError(f"max_micro_batch must be >= 1, got {self.max_micro_batch}")
        if self.max_running_requests is not None and self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got "
                             f"{self.max_running_requests}")
        if self.max_prefill_tokens < 1 or self.page_size < 1:
            raise ValueError("max_prefill_tokens and page_size must be >= 1")

    @classmethod
    def of(cls, settings: ServerSettings) -> "SlotConfig":
        """The admission settings of a server (its cap resolved: `ServerSettings.max_micro_batch`)."""
        cap = settings.max_micro_batch
        if cap is None:
            raise ValueError("the per-slot cap needs pp_max_micro_batch_size or "
                             "max_running_requests")
        return cls(settings.pp_size, settings.pp_async_batch_depth, cap,
                   settings.max_running_requests, settings.chunked_prefill_size,
                   settings.max_prefill_tokens, settings.page_size)

    @property
    def slots(self) -> int:
        """SGLang's `pp_loop_size` (reports/base/server_settings.py `slot_count`)."""
        return slot_count(self.pp, self.async_depth)

    @property
    def chunk_budget(self) -> int | None:
        """Token budget of one visit with chunked prefill on; None when it is off (-1/0)."""
        return chunk_budget(self.chunked_prefill_size)


@dataclass
class AdmitState:
    """What admission remembers between visits: requests running per slot and the tokens still
    to prefill of the request being chunked (SGLang's `chunked_req`; 0 = none)."""
    sizes: list[int]
    chunk_left: int = 0

    @classmethod
    def empty(cls, cfg: SlotConfig) -> "AdmitState":
        return cls([0] * cfg.slots)

    @property
    def rows_used(self) -> int:
        """Request rows held: every running request plus the one being chunked."""
        return sum(self.sizes) + (1 if self.chunk_left else 0)


@dataclass(frozen=True)
class Visit:
    """One slot visit's admission. `joined`: requests whose prefill completed in this visit
    (they run in this slot from now on); `taken`: requests taken from the waiting queue (a
    request chunked in this visit included); `batch`: requests in this visit's prefill (0: no
    prefill, the slot decodes); `tokens`: prefill tokens (rows of the prefill forward)."""
    joined: int = 0
    taken: int = 0
    batch: int = 0
    tokens: int = 0

    @property
    def kind(self) -> str:
        return "prefill" if self.batch else "decode"


def _check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise ValueError(f"unknown admission policy {policy!r}; choose from {', '.join(POLICIES)}")


def spaced(slots: int, micro_batches: int) -> tuple[int, ...]:
    """`micro_batches` of `slots` slots, evenly spaced in the round-robin (4 slots, 2
    micro-batches -> (0, 2)), so the micro-batches sit one stage apart."""
    m = max(1, min(int(micro_batches), slots))
    return tuple((i * slots) // m for i in range(m))


def even_slots(cfg: SlotConfig, micro_batches: int) -> tuple[int, ...]:
    """The `micro_batches` slots the `even` policy fills (`spaced` over the slot count)."""
    return spaced(cfg.slots, micro_batches)


def herd_off_sizes(sizes: Sequence[int], pp: int) -> tuple[int, ...]:
    """The herd switched off, the one rule of both model pipelines (the scenario's and the
    observed server's): the same requests in equal micro-batches, evenly spaced over the slots.
    `sizes`: requests per slot, one entry per slot. The micro-batches are as many as the slots
    the requests occupied, at least one per stage (`min(requests, pp)`), at most the slots.
    SGLang visits every one of its `pp + depth` slots each round and requests never move
    between slots (0.5.23 managers/scheduler_pp_mixin.py, `event_loop_pp`: `for mb_id in
    range(self.pp_loop_size)`, each slot's own `running_mbs[mb_id]`): fewer micro-batches than
    the occupied slots would idle a slot that ran requests, and would make a split that is
    already even (2/2/2/2/2 at pp 4, depth 1) differ from itself."""
    slots = len(sizes)
    total = sum(int(n) for n in sizes)
    occupied = sum(1 for n in sizes if n)
    m = max(1, min(max(occupied, min(total, int(pp))), slots))
    out = [0] * slots
    for k, at in enumerate(spaced(slots, m)):
        out[at] = total // m + (1 if k < total % m else 0)
    return tuple(out)


def even_micro_batches(total: int, cfg: SlotConfig, micro_batches: int | None = None) -> int:
    """How many slots `even` uses for `total` requests: `micro_batches` (default pp), raised
    until the cap holds everyone, never more than the slot count."""
    m = cfg.pp if micro_batches is None else int(micro_batches)
    if m < 1:
        raise ValueError(f"micro_batches must be >= 1, got {m}")
    need = -(-int(total) // cfg.max_micro_batch)  # ceil
    return max(1, min(max(m, need), cfg.slots))


def _paged(n: int, cfg: SlotConfig) -> int:
    return -(-n // cfg.page_size) * cfg.page_size


def _free_rows(state: AdmitState, cfg: SlotConfig) -> float:
    if cfg.max_running_requests is None:
        return float("inf")
    return cfg.max_running_requests - state.rows_used


def _sglang_visit(state: AdmitState, waiting: Sequence[int], slot: int,
                  cfg: SlotConfig) -> Visit:
    running = state.sizes[slot]
    rem_chunk = cfg.chunk_budget
    rem_input = cfg.max_prefill_tokens
    tokens = batch = joined = taken = 0
    held = 0   # rows held by requests in this batch before it runs (the continuing chunk)
    if state.chunk_left:  # `add_chunked_req`: the chunk continues whatever the cap
        t = state.chunk_left if rem_chunk is None else min(state.chunk_left, rem_chunk)
        state.chunk_left -= t
        tokens += t
        rem_input -= t
        if rem_chunk is not None:
            rem_chunk -= t
        batch = held = 1
        if state.chunk_left == 0:
            joined = 1
    elif not waiting or min(cfg.max_micro_batch - running, _free_rows(state, cfg)) <= 0:
        return Visit()
    free = _free_rows(state, cfg) + held
    new = 0
    for length in waiting:
        if rem_input <= 0 or (rem_chunk is not None and rem_chunk <= 0):
            break   # `budget_state`: OTHER
        if batch >= min(cfg.max_micro_batch - running, free):
            break   # `get_num_allocatable_reqs`: pp budget and request rows
        need = _paged(int(length), cfg)
        if rem_chunk is not None and need > rem_chunk:
            part = rem_chunk // cfg.page_size * cfg.page_size
            if part <= 0:
                break
            state.chunk_left = int(length) - part   # chunked: rest in the next visits
            tokens += part
            taken += 1
            batch += 1
            break
        if rem_chunk is None and batch and need >= rem_input:
            break   # without chunking only the first request may exceed the input cap
        tokens += int(length)
        rem_input -= need
        if rem_chunk is not None:
            rem_chunk -= need
        new += 1
        taken += 1
        batch += 1
    state.sizes[slot] += joined + new
    return Visit(joined + new, taken, batch, tokens)


def _even_visit(state: AdmitState, waiting: Sequence[int], slot: int, cfg: SlotConfig,
                micro_batches: int | None) -> Visit:
    if not waiting:
        return Visit()
    sizes = state.sizes
    total = sum(sizes) + len(waiting)
    chosen = even_slots(cfg, even_micro_batches(total, cfg, micro_batches))
    if slot not in chosen:
        return Visit()
    k, m = chosen.index(slot), len(chosen)
    share = min(total // m + (1 if k < total % m else 0), cfg.max_micro_batch)
    want = max(0, min(len(waiting), share - sizes[slot], _free_rows(state, cfg)))
    budget = cfg.chunk_budget or cfg.max_prefill_tokens
    n = tokens = 0
    for length in waiting[:int(want)]:
        if n and tokens + int(length) > budget:
            break   # whole requests only: the rest waits for this slot's next visit
        tokens += int(length)
        n += 1
    sizes[slot] += n
    return Visit(n, n, n, tokens)


def visit(state: AdmitState, waiting: Sequence[int], slot: int, cfg: SlotConfig,
          policy: str = "sglang", micro_batches: int | None = None) -> Visit:
    """Admission at one visit of `slot`: `waiting` = prompt lengths (tokens) of the waiting
    requests, in arrival order. Updates `state` (slot sizes, chunked request)."""
    _check_policy(policy)
    if len(state.sizes) != cfg.slots:
        raise ValueError(f"slot_sizes has {len(state.sizes)} entries, expected {cfg.slots}")
    if not 0 <= slot < cfg.slots:
        raise ValueError(f"slot {slot} out of range 0..{cfg.slots - 1}")
    if policy == "even":
        return _even_visit(state, waiting, slot, cfg, micro_batches)
    return _sglang_visit(state, waiting, slot, cfg)


def admit(waiting: int, slot_sizes: Sequence[int], slot: int, cfg: SlotConfig,
          policy: str = "sglang", micro_batches: int | None = None, prompt_len: int = 1) -> int:
    """How many of `waiting` requests (FIFO, `prompt_len` tokens each, no chunk pending) join
    slot `slot` now; `slot_sizes[s]` = requests already running in slot s."""
    st = AdmitState(list(slot_sizes))
    return visit(st, [prompt_len] * max(0, int(waiting)), slot, cfg, policy,
                 micro_batches).joined


def slot_action(admitted: int, running: int) -> str:
    """What a slot runs on its turn: `prefill` if it admitted (prefill first), else `decode`
    if it holds requests, else `idle` (an empty slot still costs each rank a loop turn)."""
    if admitted > 0:
        return "prefill"
    return "decode" if running > 0 else "idle"


def initial_assignment(arrival_times: Sequence[float], cfg: SlotConfig, policy: str = "sglang",
                       visit_times: Sequence[float] = (), micro_batches: int | None = None,
                       prompt_lens: Sequence[int] | int = 1) -> list[int | None]:
    """Slot of each request, given arrival times and the times rank 0 visits slots.

    Visit `i` schedules slot `i % cfg.slots` at `visit_times[i]`; requests with arrival time
    <= that time are waiting, admitted in arrival order (ties: request index). A chunked
    request belongs to the slot of its last chunk. Requests never leave (a decode benchmark's
    streams run throughout). A request not placed by the last visit gets None. Deterministic.
    """
    _check_policy(policy)
    lens = [prompt_lens] * len(arrival_times) if isinstance(prompt_lens, int) else \
        list(prompt_lens)
    order = sorted(range(len(arrival_times)), key=lambda i: (arrival_times[i], i))
    out: list[int | None] = [None] * len(arrival_times)
    st = AdmitState.empty(cfg)
    nxt = 0            # index into `order` of the first request not yet taken
    chunked = None     # request being chunked
    n_slots = cfg.slots
    # SGLang's admission reads at most a micro-batch of the queue (`_sglang_visit`); `even`
    # counts all of it
    look = cfg.max_micro_batch + 1 if policy == "sglang" else len(order)
    idle = 0           # visits in a row that changed nothing, every request arrived
    arrived, last_t = 0, float("-inf")
    for v, t in enumerate(visit_times):
        slot = v % n_slots
        arrived = max(arrived, nxt) if t >= last_t else nxt   # times in order: scan on
        last_t = t
        while arrived < len(order) and arrival_times[order[arrived]] <= t:
            arrived += 1
        had_chunk = chunked
        before = (st.chunk_left, st.sizes[slot])
        vis = visit(st, [lens[i] for i in order[nxt:min(arrived, nxt + look)]], slot, cfg,
                    policy, micro_batches)
        # a visit depends only on the state, the queue and its slot: once a whole round of
        # slots has changed nothing with every request arrived, every later round is the same
        # (requests never leave), so the rest of the visits place no one (bounds the work of
        # a burst far above the request rows to O(slots) visits, not O(slots x C))
        still = (not vis.taken and before == (st.chunk_left, st.sizes[slot])
                 and arrived == len(order))
        idle = idle + 1 if still else 0
        if idle >= n_slots:
            break
        taken = order[nxt:nxt + vis.taken]
        placed = list(taken)
        if had_chunk is not None and (st.chunk_left == 0 or vis.taken):
            out[had_chunk] = slot                # its last chunk ran here (a new chunk
            chunked = None                       # implies the old one finished)
        if st.chunk_left and vis.taken:
            chunked = placed.pop()               # the last one taken is the new chunk
        for r in placed:
            out[r] = slot
        nxt += vis.taken
        if nxt == len(order) and chunked is None or _admits_nothing(st, cfg, policy):
            break      # every request placed, or (requests never leave) no slot has room
    return out


def slot_sizes_of(assignment: Sequence[int | None], cfg: SlotConfig) -> list[int]:
    """Requests per slot from `initial_assignment`'s output (unplaced ones left out)."""
    sizes = [0] * cfg.slots
    for s in assignment:
        if s is not None:
            sizes[s] += 1
    return sizes


def burst_sizes(C: int, cfg: SlotConfig, prompt_len: int, policy: str = "sglang",
                micro_batches: int | None = None) -> list[int]:
    """Slot sizes after a burst of C requests of `prompt_len` tokens (all waiting at the
    first visit), once every request is placed."""
    visits = [0.0] * (cfg.slots * (C + 2) + 2 * C * max(1, prompt_len // max(
        1, cfg.chunk_budget or cfg.max_prefill_tokens)))
    return slot_sizes_of(initial_assignment([0.0] * C, cfg, policy, visits, micro_batches,
                                            prompt_len), cfg)


# ---------------------------------------------------------------------------------------------
# Occupancy drift: a closed-loop benchmark (C clients, each sends its next request when the
# previous one finishes), visit by visit.

@dataclass(frozen=True)
class Occupancy:
    """Slot sizes at the end of each round of the measured window, in order."""
    series: tuple[tuple[int, ...], ...]

    @property
    def rounds(self) -> int:
        return len(self.series)

    @property
    def snapshots(self) -> tuple[tuple[tuple[int, ...], int], ...]:
        """(slot sizes, rounds seen), most frequent first."""
        return tuple(Counter(self.series).most_common())

    def top(self, k: int) -> list[tuple[tuple[int, ...], int]]:
        return list(self.snapshots[:k])

    def sample(self, k: int) -> list[tuple[int, ...]]:
        """k snapshots evenly spaced in time (a time-representative sample)."""
        n = len(self.series)
        if n == 0:
            return []
        return [self.series[(i * n) // k + (n // k) // 2 if k <= n else i % n]
                for i in range(min(k, n))]


def output_lengths(n: int, mean_len: int, range_ratio: float, seed: int = 0) -> list[int]:
    """Output lengths as `sglang.bench_serving --dataset-name random` draws them: uniform
    integers in [max(int(len * range_ratio), 1), len] (SGLang 0.5.23 benchmark/datasets/
    random.py; `--random-range-ratio`, default 0.0 in benchmark/serving.py)."""
    draw = _length_draw(mean_len, range_ratio, seed)
    return [draw() for _ in range(n)]


def _length_draw(mean_len: int, range_ratio: float, seed: int):
    lo = max(int(mean_len * range_ratio), 1)
    rng = random.Random(seed)
    return (lambda: mean_len) if lo >= mean_len else (lambda: rng.randint(lo, mean_len))


# When bench_serving's next prompt reaches the scheduler, counted in visits of rank 0 after the
# visit that processed the finished request's last token. SGLang 0.5.23: rank 0 processes slot
# k+1's result at the end of its visit of slot k (managers/scheduler_pp_mixin.py,
# `event_loop_pp`: `_pp_process_batch_result` after the launch), so a token decoded at visit v
# is processed at v + S - 1; its output then goes through the detokenizer and the tokenizer
# manager to the client, whose semaphore (`--max-concurrency`) sends the next prompt, which
# the tokenizer hands back to the scheduler. The next visit's `recv_requests`
# (`ingest_requests`) starts right after that processing, before any of this can happen, so
# the prompt is admitted two visits after the processing at the earliest. The lab's logs
# (tests/fixtures/sglang_lab/: bench_serving's last prompts, `POST /generate` logged between
# the processing of the finished slot and of the next) show it admitted there: into an empty
# slot (`#running-req: 0`), not into the next slot while that slot still runs.
REISSUE_VISITS = 2


@dataclass(frozen=True)
class Wave:
    """`n` prompts that reach the scheduler together: waiting from visit `visit` on (counted
    from the run's first visit) and not before `at_us` (the run's clock)."""
    n: int
    visit: int = 0
    at_us: float = 0.0


@dataclass(frozen=True)
class Successor:
    """bench_serving's next prompt when one finishes (`--max-concurrency` is a semaphore):
    `prompts` in all (None: without end); prompt i is sent no earlier than i x `interval_us`
    (`--request-rate`, its Poisson mean; 0: at once). It reaches the scheduler
    REISSUE_VISITS visits after the finished prompt's last token was processed."""
    prompts: int | None = None
    interval_us: float = 0.0


@dataclass(frozen=True)
class LoopRun:
    """A closed-loop run. `series`: requests decoding per slot at the end of each round after
    the warm-up; `held`: (slot sizes, time) of each sizes seen, most held first (a rotation of
    sizes seen before counts as those: the round-robin makes them the same loop); `end_us`: the
    last processed token's time; `latency_us`: summed over completed prompts, from sent to
    last token; times in microseconds with a round-time callback, else in visits; `prefills`:
    (#new-seq, #running-req) of each prefill, as SGLang's `Prefill batch` log line says them."""
    series: tuple[tuple[int, ...], ...]
    held: tuple[tuple[tuple[int, ...], float], ...]
    end_us: float
    latency_us: float
    completed: int
    prefills: tuple[tuple[int, int], ...]

    @property
    def prefill_visits(self) -> int:
        return len(self.prefills)


@dataclass
class RunRecord:
    """What a run did, visit by visit, for a pipeline run over it (reports/model/
    pipeline_model.py `Plan`): `batches[v]` = (requests, prefill tokens) of visit v (tokens 0:
    a decode; (0, 0): an empty visit); `requests`: (first-token visit, last-token visit, output
    tokens) of each completed prompt."""
    batches: list = field(default_factory=list)
    requests: list = field(default_factory=list)


def _admits_nothing(state: AdmitState, cfg: SlotConfig, policy: str) -> bool:
    """No slot admits a waiting prompt at its visit, whatever waits: SGLang's rule with no
    chunk pending (`_sglang_visit`) when the per-slot cap or the request rows leave no room
    in any slot; until a request leaves, that stays so."""
    if policy != "sglang" or state.chunk_left:
        return False
    # min(cap - running, free rows) <= 0 at every slot
    return _free_rows(state, cfg) <= 0 or min(state.sizes) >= cfg.max_micro_batch


class _ClosedLoop:
    """The state of one `run_loop` run and its steps, visit by visit (`run_loop`'s rules)."""

    def __init__(self, cfg: SlotConfig, round_us, record: RunRecord | None, prompt_len,
                 output_len, policy: str, micro_batches: int | None) -> None:
        self.cfg, self.S, self.round_us, self.record = cfg, cfg.slots, round_us, record
        self.output_len, self.policy, self.micro_batches = output_len, policy, micro_batches
        S = self.S
        self.st = AdmitState.empty(cfg)
        # per slot: (finish at decode #, client) of each request decoding
        self.heaps: list[list[tuple[int, int]]] = [[] for _ in range(S)]
        self.decoded = [0] * S            # decodes slot s has run
        self.leaving = [0] * S            # finished, holding their row until the slot's next visit
        # (visit rank 0 processes the last token, client)
        self.processed: list[tuple[int, int]] = []
        self.ready: list[tuple[int, float, int]] = []   # (visit, not before, client)
        self.timed: list[tuple[float, int]] = []        # (not before, client): visit reached
        self.queue: list[int] = []        # clients waiting, in arrival order
        self.sent: dict[int, float] = {}
        self.chunked: int | None = None
        self.seen: list[tuple[int, ...]] = []
        self.held: dict[tuple[int, ...], float] = {}
        self.t = self.end_us = self.latency = 0.0
        self.completed = 0
        self.prefills: list[tuple[int, int]] = []
        self.memo: dict[tuple[int, ...], float] = {}
        self.canon: dict[tuple[int, ...], tuple[int, ...]] = {}
        self.began: dict[int, tuple[int, int]] = {}   # client -> (first-token visit, output tokens)
        # the waiting prompts' lengths at a visit: one length for all, or each client's own
        self.waiting = ((lambda q: [prompt_len(c) for c in q]) if callable(prompt_len) else
                        (lambda q, n=prompt_len: [n] * len(q)))

    def send(self, waves: Sequence[Wave]) -> None:
        for w in waves:
            for _ in range(w.n):
                c = len(self.sent)
                self.sent[c] = w.at_us
                heapq.heappush(self.ready, (w.visit, w.at_us, c))

    def hold(self, sizes: tuple[int, ...], d: float) -> None:
        if sizes not in self.canon:
            rot = (sizes[k:] + sizes[:k] for k in range(self.S))
            self.canon[sizes] = next((r for r in rot if r in self.held), sizes)
        key = self.canon[sizes]
        self.held[key] = self.held.get(key, 0.0) + d

    def visit_us(self, sizes: tuple[int, ...]) -> float:
        if self.round_us is None:
            return 1.0
        if sizes not in self.memo:
            self.memo[sizes] = self.round_us(sizes) / self.S
        return self.memo[sizes]

    def finish(self, s: int, v: int, c: int) -> None:
        self.leaving[s] += 1
        heapq.heappush(self.processed, (v + self.S - 1, c))
        if self.record is not None:
            f, n = self.began.pop(c)
            self.record.requests.append((f, v, n))

    def arrive(self, v: int, s: int) -> None:
        """Slot s's finished requests leave; the prompts that reached the scheduler wait."""
        st = self.st
        if self.leaving[s]:
            st.sizes[s] -= self.leaving[s]
            self.leaving[s] = 0
        while self.ready and self.ready[0][0] <= v:
            _, at, c = heapq.heappop(self.ready)
            heapq.heappush(self.timed, (at, c))
        if not self.queue and not st.chunk_left and not any(self.heaps) and not self.processed \
                and self.timed and self.timed[0][0] > self.t:
            self.t = self.timed[0][0]      # the server idles until the next prompt
        while self.timed and self.timed[0][0] <= self.t:
            self.queue.append(heapq.heappop(self.timed)[1])

    def admit(self, v: int, s: int) -> Visit:
        """The visit's admission (`visit`); the prompts whose prefill completes join slot s."""
        st, queue = self.st, self.queue
        if not (queue or st.chunk_left):
            return Visit()
        had = self.chunked
        vis = visit(st, self.waiting(queue), s, self.cfg, self.policy, self.micro_batches)
        joining = queue[:vis.taken]
        del queue[:vis.taken]
        if had is not None and (st.chunk_left == 0 or vis.taken):
            joining.insert(0, had)
            self.chunked = None
        if st.chunk_left and vis.taken:
            self.chunked = joining.pop()
        for c in joining:  # prefill makes the first token
            left = self.output_len() - 1
            self.began[c] = (v, left + 1)
            if left > 0:
                heapq.heappush(self.heaps[s], (self.decoded[s] + left, c))
            else:
                self.finish(s, v, c)
        return vis

    def run(self, v: int, s: int, vis: Visit, running: int) -> None:
        """Slot s prefills (prefill first) or decodes one token of each request; the clock
        moves on by one visit."""
        heaps = self.heaps
        sizes = tuple(map(len, heaps))
        d = self.visit_us(sizes)
        self.hold(sizes, d)
        if self.record is not None:
            self.record.batches.append((vis.batch, vis.tokens) if vis.batch else (sizes[s], 0))
        if vis.batch:
            self.prefills.append((vis.batch, running))
        elif heaps[s]:
            self.decoded[s] += 1
            h = heaps[s]
            while h and h[0][0] <= self.decoded[s]:
                self.finish(s, v, heapq.heappop(h)[1])
        self.t += d

    def deliver(self, v: int, total: int | None, successor: Successor) -> None:
        """The clients that have their last token; their successors are sent."""
        while self.processed and self.processed[0][0] <= v:
            c = heapq.heappop(self.processed)[1]
            self.completed += 1
            self.end_us = self.t
            self.latency += self.t - self.sent.pop(c)
            if total is None or len(self.sent) + self.completed < total:
                n = len(self.sent) + self.completed             # the next prompt's index
                at = max(self.t, n * successor.interval_us)
                self.sent[c] = at
                heapq.heappush(self.ready, (v + REISSUE_VISITS, at, c))

    def next_visit(self, v: int, end: int | None, limit: int, warmup_rounds: int) -> int:
        """The next visit where anything can change: nothing is admitted while the queue is
        empty, or (times in visits, so a skipped stretch adds up exactly) while every slot is
        full, and a slot only decodes until its next request finishes. The skipped visits are
        decoded and their snapshots taken."""
        S, heaps, st = self.S, self.heaps, self.st
        nxt = v + 1
        if st.chunk_left or self.timed or (
                self.queue and not (self.round_us is None
                                    and _admits_nothing(st, self.cfg, self.policy))):
            return nxt
        nxt = min(limit, self.ready[0][0] if self.ready else limit,
                  self.processed[0][0] if self.processed else limit)
        if end is not None:
            nxt = min(nxt, end)
        for q in range(S):
            first = v + 1 + (q - v - 1) % S          # the next visit of slot q
            if self.leaving[q]:
                nxt = min(nxt, first)
            elif heaps[q]:
                nxt = min(nxt, first + (heaps[q][0][0] - self.decoded[q] - 1) * S)
        nxt = max(nxt, v + 1)
        if nxt > v + 1:   # decode the skipped visits, take the skipped snapshots
            if self.record is not None:
                self.record.batches.extend((len(heaps[u % S]), 0) for u in range(v + 1, nxt))
            for q in range(S):
                if heaps[q]:
                    first = v + 1 + (q - v - 1) % S
                    if first < nxt:
                        self.decoded[q] += (nxt - 1 - first) // S + 1
            snap = tuple(map(len, heaps))
            d = self.visit_us(snap) * (nxt - v - 1)
            self.hold(snap, d)
            self.t += d
            r0, r1 = (v + 1) // S, nxt // S      # rounds whose last visit is skipped
            for r in range(max(r0, warmup_rounds), r1):
                if r * S + S - 1 < nxt and r * S + S - 1 > v:
                    self.seen.append(snap)
        return nxt

    def result(self) -> LoopRun:
        return LoopRun(tuple(self.seen), tuple(sorted(self.held.items(), key=lambda x: -x[1])),
                       self.end_us, self.latency, self.completed, tuple(self.prefills))


def run_loop(cfg: SlotConfig, waves: Sequence[Wave], successor: Successor = Successor(),
             round_us=None, *, prompt_len: int | Callable[[int], int] = 1,
             output_len=lambda: 1,
             policy: str = "sglang", micro_batches: int | None = None,
             rounds: int | None = None, warmup_rounds: int = 0,
             record: RunRecord | None = None) -> LoopRun:
    """The one admission run: bench_serving's closed loop over SGLang's slot loop, visit by
    visit (the module docstring's rules, `visit` at each one).

    `waves`: the first prompts; `successor`: the prompts sent as others finish; `round_us(sizes)`:
    the time of one round for slot sizes (requests running per slot), each visit a slot-count-th
    of it (None: a visit lasts 1); `output_len()`: the next prompt's output length in tokens;
    `prompt_len`: the tokens a prompt needs prefilled, or a function of its client number (the
    prompts in order, from 0: a prompt whose prefix SGLang's radix cache holds needs only its
    uncached tokens, `PrefillAdder` counting `extend_input_len`).
    Visit v schedules slot v % S (`event_loop_pp`): the slot's finished requests leave
    (`filter_batch` in `get_next_batch_to_run`), waiting prompts are admitted (`visit`:
    `get_num_allocatable_reqs`, `PrefillAdder` with its one chunked request), then the slot
    prefills (prefill first) or every request in it decodes one token (the prefill makes the
    first). Rank 0 processes a token S - 1 visits after its forward; then the request's client
    has it and the finished request's successor follows (REISSUE_VISITS). Runs `rounds` rounds,
    or until `successor.prompts` completed (ValueError if admission stalls). Idle, the server
    waits for the next prompt.
    """
    S = cfg.slots
    loop = _ClosedLoop(cfg, round_us, record, prompt_len, output_len, policy, micro_batches)
    loop.send(waves)
    total = successor.prompts
    if total is not None and total <= len(loop.sent):
        total = len(loop.sent)
    end = rounds * S if rounds is not None else None
    limit = end if end is not None else 200000 * S
    v = 0
    while end is None or v < end:
        if total is not None and loop.completed >= total:
            break
        if v >= limit:
            raise ValueError("the modelled run did not finish (a setting admits nothing)")
        s = v % S
        loop.arrive(v, s)
        running = loop.st.sizes[s]
        vis = loop.admit(v, s)
        loop.run(v, s, vis, running)
        loop.deliver(v, total, successor)
        if s == S - 1 and v // S >= warmup_rounds:
            loop.seen.append(tuple(map(len, loop.heaps)))
        v = loop.next_visit(v, end, limit, warmup_rounds)
    return loop.result()


def closed_loop(cfg: SlotConfig, C: int, prompt_len: int, output_len: int,
                range_ratio: float = 1.0, *, policy: str = "sglang",
                micro_batches: int | None = None, rounds: int = 400,
                warmup_rounds: int | None = None, seed: int = 0) -> Occupancy:
    """Slot occupancy of a closed-loop benchmark with C clients, starting from a burst
    (`run_loop`, output lengths drawn as bench_serving draws them). Snapshots (requests still
    decoding per slot) are taken at the end of each round after the warm-up (default: the
    first half)."""
    warm = rounds // 2 if warmup_rounds is None else warmup_rounds
    run = run_loop(cfg, [Wave(C)], Successor(), prompt_len=prompt_len,
                   output_len=_length_draw(output_len, range_ratio, seed), policy=policy,
                   micro_batches=micro_batches, rounds=rounds, warmup_rounds=warm)
    return Occupancy(run.series)
