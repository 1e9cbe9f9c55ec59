"""Serve mode of the PP-loop probe: the loop's requests come from HTTP clients, not a script.

What it is for: `ppscope dispatch --serve [HOST:]PORT` runs the same PP loop as the benchmark
(microbench/dispatch/pp_loop.py, one process per GPU under torchrun) while rank 0 answers an
OpenAI-compatible endpoint with SGLang's control routes (microbench/dispatch/serve_http.py). The live path
a user takes against a real server -- `ppscope sglang --url ... --profile`, a
`pp_max_micro_batch_size` sweep through `/set_internal_state`, `/metrics` -- then runs end to end
against a loop whose every cost is known.

This module is the part that touches no torch (so it runs and is tested on CPU):
- `ServeState`: the thread-safe bridge between the HTTP threads and rank 0's loop. HTTP threads
  `submit` a request (and get a `Stream` of its tokens) or send a control command and wait for
  its reply; the loop takes them at the top of an iteration. Its `ServeMetrics` keep
  SGLang's metrics.
- `ServeScheduler`: what rank 0 does at a slot visit in serve mode. Finished requests leave the
  slot, newly arrived ones wait FIFO and are admitted with `reports.base.slots.visit`, exactly as
  the benchmark admits (policy, per-slot cap, request rows, prefill token budget, chunking);
  accepted control commands are put into the request list the loop already relays to the other
  ranks over gloo (SGLang relays its request list, control requests included, the same way:
  managers/scheduler_pp_mixin.py, `event_loop_pp`), so every rank applies them at the same
  iteration. When rank 0 processes the outputs of a slot, every request of that slot's batch gets
  one token; a request that has `max_tokens` finishes and leaves its slot at the slot's next visit.
- `RankSide`: what every rank does with a relayed control command (set the micro-batch cap,
  start / stop its profiler and write its trace under SGLang's file name).
- `run_cpu_loop`: a single-process stand-in for the ranks (a fixed step time per forward, the
  request list pickled from rank to rank): the same scheduler, relay and controls, for tests and
  for trying the endpoint on a machine without GPUs.

SGLang behaviour copied (SGLang 0.5.23): the first token comes from the prefill, one more per
decode (managers/scheduler.py); `/set_internal_state` accepts `pp_max_micro_batch_size` in
[1, max_running_requests // pp_size] and answers a list of booleans, one per scheduler
(managers/scheduler_components/internal_state.py, managers/tokenizer_control_mixin.py);
`/start_profile` with `num_steps` stops on its own once `num_steps + 1` forwards have run since
it started, `output_dir` defaults to `SGLANG_TORCH_PROFILER_DIR`, `activities` to CPU and GPU, a
second start while profiling and a stop while not profiling are refused, and each rank writes
`{profile_id}-TP-{tp}-PP-{pp}.trace.json.gz` with `profile_id` = the start time in seconds
(managers/scheduler_components/profiler_manager.py, managers/tokenizer_control_mixin.py); the
metric names, labels and histogram buckets are those of observability/metrics_collector.py.

Prompt length: the probe has no tokenizer. A prompt given as token ids counts exactly; text
counts as ceil(UTF-8 bytes / 4), at least 1 (about 4 bytes per token for English text under the
BPE vocabularies of current models; a chat request counts the text of every message). Generated
tokens are words from a fixed list; the probe never stops early (no EOS), so every request runs
to `max_tokens`.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import os
import pickle
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from reports.base.server_flags import BY_SETTING, CAP
from reports.base.server_settings import ServerSettings
from reports.base.slots import AdmitState, SlotConfig, visit

MAX_WAITING = 4096          # requests queued before admission; more is HTTP 503
MAX_TOKENS_LIMIT = 1 << 20  # max_tokens above this is refused (the live probe's own bound)
DEFAULT_MAX_TOKENS = 16     # OpenAI's (and SGLang's CompletionRequest's) default max_tokens
IDLE_WAIT_S = 1e-3          # SGLang's loop spins when idle; the probe waits this long instead
TOKEN_WORDS = (" the", " loop", " runs", " one", " slot", " at", " a", " time", ",", " and",
               " every", " stage", " waits", " for", " its", " input", ".")

# observability/metrics_collector.py (SGLang 0.5.23), TokenizerMetricsCollector's buckets
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = TTFT_BUCKETS + (600, 1200, 1800, 2400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
               0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)


def prompt_tokens_of_text(text: str) -> int:
    """ceil(UTF-8 bytes / 4), at least 1 (see the module docstring)."""
    return max(1, math.ceil(len(text.encode("utf-8")) / 4))


def token_text(k: int) -> str:
    """The text of generated token k (0-based) of a request."""
    return TOKEN_WORDS[k % len(TOKEN_WORDS)]


class ServeClosed(Exception):
    """The loop is not running (stopped, or failed): the request cannot be served."""


class QueueFull(Exception):
    """More than MAX_WAITING requests wait for admission."""


@dataclass(frozen=True, kw_only=True)
class ServerArgs(ServerSettings):
    """What `/get_server_info` reports, under SGLang's server_args.py names: the loop's
    server settings (`max_running_requests` and the cap resolved, chunked prefill None when
    off), the model path and the admission policy."""
    model_path: str
    policy: str = "sglang"

    @classmethod
    def of(cls, settings: ServerSettings, *, model_path: str,
           policy: str = "sglang") -> "ServerArgs":
        return cls(model_path=model_path, policy=policy,
                   **{f.name: getattr(settings, f.name)
                      for f in dataclasses.fields(ServerSettings)})

    @property
    def served_model_name(self) -> str:
        return self.model_path   # SGLang's default: the model path

    def as_dict(self) -> dict:
        d = {_server_arg(k): getattr(self, k) for k in _INFO_KEYS}
        d["served_model_name"] = self.served_model_name
        d["chunked_prefill_size"] = -1 if self.chunked_prefill_size is None \
            else self.chunked_prefill_size
        d["enable_metrics"] = True
        return d


def _server_arg(name: str) -> str:
    """SGLang's server_args name of a setting (reports/base/server_flags.py), else the name."""
    f = BY_SETTING.get(name)
    return f.server_arg if f is not None else name


# the settings `/get_server_info` answers with, in its order
_INFO_KEYS = ("model_path", "pp_size", "max_running_requests", "pp_max_micro_batch_size",
              "pp_async_batch_depth", "chunked_prefill_size", "max_prefill_tokens",
              "cuda_graph_max_bs", "disable_cuda_graph", "policy", "tp_size", "page_size")


@dataclass
class Request:
    """One client request as the loop sees it."""
    rid: str
    prompt_tokens: int
    max_tokens: int
    streaming: bool
    t_arrive: float
    emitted: int = 0
    t_first: float | None = None
    t_last: float | None = None
    done: bool = False          # finished, aborted or cancelled: leaves its slot at next visit
    events: collections.deque = field(default_factory=collections.deque)


class Stream:
    """The HTTP side of one request: its tokens as they are produced."""

    def __init__(self, req: Request, state: "ServeState"):
        self.req, self._state = req, state

    def next(self, timeout: float) -> tuple | None:
        """("token", k, last) or ("end", reason); None when nothing came within `timeout`."""
        return self._state._next_event(self.req, timeout)

    def cancel(self) -> None:
        """The client went away: the request stops getting tokens and leaves its slot."""
        self._state._cancel(self.req)


class Hist:
    """A Prometheus histogram: cumulative bucket counts, sum, count."""

    def __init__(self, buckets):
        self.bounds = tuple(float(b) for b in buckets)
        self.counts = [0] * (len(self.bounds) + 1)   # last: +Inf
        self.sum, self.count = 0.0, 0

    def observe(self, v: float) -> None:
        i = next((k for k, b in enumerate(self.bounds) if v <= b), len(self.bounds))
        self.counts[i] += 1
        self.sum += v
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, cum = [], 0
        for b, c in zip(self.bounds + (math.inf,), self.counts):
            cum += c
            le = "+Inf" if b == math.inf else repr(b)
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {float(cum)}')
        out.append(f"{name}_sum{{{labels}}} {self.sum!r}")
        out.append(f"{name}_count{{{labels}}} {float(self.count)}")
        return out


@dataclass
class Control:
    """A control command from an HTTP thread, waiting for the loop's reply."""
    cid: int
    kind: str
    args: dict
    done: threading.Event = field(default_factory=threading.Event)
    reply: tuple[int, Any] | None = None


class ServeMetrics:
    """SGLang's metrics of the served requests (observability/metrics_collector.py, 0.5.23):
    the request counters and the TTFT / TPOT / E2E / ITL histograms of the tokenizer's
    collector, and the tokens of the last second (the scheduler's `gen_throughput`). Holds no
    lock: `ServeState` calls it under its own."""

    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.recent: collections.deque = collections.deque()   # token times of the last second
        self.counters: dict[str, float] = collections.defaultdict(float)
        self.hist = {"ttft": {}, "tpot": {}, "e2e": {}, "itl": Hist(ITL_BUCKETS)}

    def tput(self) -> float:
        """`gen_throughput`: tokens produced in the last second (SGLang logs tokens over the
        time since its last decode log line; a scrape has no such interval)."""
        now = self.clock()
        while self.recent and self.recent[0] < now - 1.0:
            self.recent.popleft()
        return float(len(self.recent))   # tokens in the last second

    def token(self, req: Request, t: float) -> int:
        """One token of `req` at loop time `t`: its TTFT or inter-token latency, the last
        second's tokens; returns the token's index in the request."""
        k = req.emitted
        req.emitted += 1
        s = "true" if req.streaming else "false"
        if req.t_first is None:
            req.t_first = t
            self.hist["ttft"].setdefault(s, Hist(TTFT_BUCKETS)).observe(t - req.t_arrive)
        else:
            self.hist["itl"].observe(t - req.t_last)
        req.t_last = t
        self.recent.append(t)
        while self.recent[0] < t - 1.0:   # bounded: the last second only
            self.recent.popleft()
        return k

    def finished(self, req: Request, t: float) -> None:
        """A request that produced its last token at `t`: the counters, E2E and TPOT."""
        s = "true" if req.streaming else "false"
        n = req.emitted
        self.counters[f"prompt_{s}"] += req.prompt_tokens
        self.counters[f"generation_{s}"] += n
        self.counters[f"requests_{s}"] += 1
        self.hist["e2e"].setdefault(s, Hist(E2E_BUCKETS)).observe(t - req.t_arrive)
        if n > 1:
            self.hist["tpot"].setdefault(s, Hist(ITL_BUCKETS)).observe(
                (t - req.t_first) / (n - 1))

    def text(self, model_name: str, running: int, queued: int) -> str:
        """Prometheus text, SGLang's names: scheduler gauges labelled as the scheduler's
        (pp_rank 0: rank 0 admits and counts for the pipeline), request counters and
        histograms as the tokenizer's (no pp_rank)."""
        name = model_name.replace("\\", "\\\\").replace('"', '\\"')
        sched = f'engine_type="unified",model_name="{name}",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
        tok = f'engine_type="unified",model_name="{name}"'
        out = []
        for metric, v, doc in (
                ("num_running_reqs", running, "The number of running requests."),
                ("num_queue_reqs", queued, "The number of requests in the waiting queue."),
                ("gen_throughput", self.tput(), "The generation throughput (token/s).")):
            out += [f"# HELP sglang:{metric} {doc}", f"# TYPE sglang:{metric} gauge",
                    f"sglang:{metric}{{{sched}}} {float(v)}"]
        for metric, key in (("prompt_tokens_total", "prompt"),
                            ("generation_tokens_total", "generation"),
                            ("num_requests_total", "requests")):
            out.append(f"# TYPE sglang:{metric} counter")
            for s in ("false", "true"):
                out.append(f'sglang:{metric}{{{tok},is_streaming="{s}"}} '
                           f"{float(self.counters[f'{key}_{s}'])}")
        out += ["# TYPE sglang:num_aborted_requests_total counter",
                f"sglang:num_aborted_requests_total{{{tok}}} "
                f"{float(self.counters['aborted'])}"]
        for metric, key in (("time_to_first_token_seconds", "ttft"),
                            ("request_time_per_output_token_seconds", "tpot"),
                            ("e2e_request_latency_seconds", "e2e")):
            out.append(f"# TYPE sglang:{metric} histogram")
            for s, h in sorted(self.hist[key].items()):
                out += h.lines(f"sglang:{metric}", f'{tok},is_streaming="{s}"')
        out.append("# TYPE sglang:inter_token_latency_seconds histogram")
        out += self.hist["itl"].lines("sglang:inter_token_latency_seconds", tok)
        return "\n".join(out) + "\n"


class ServeState:
    """Thread-safe bridge: HTTP threads on one side, rank 0's loop on the other; its
    `metrics` (`ServeMetrics`) are kept under the same lock."""

    def __init__(self, args: ServerArgs, clock: Callable[[], float] = time.perf_counter):
        self.args, self.clock = args, clock
        self._cv = threading.Condition()
        self._new: collections.deque[Request] = collections.deque()
        self._controls: collections.deque[Control] = collections.deque()
        self._pending: dict[int, Control] = {}
        self._ids = itertools.count(1)
        self.ready = False
        self.closed: str | None = None
        self.stop_requested: str | None = None   # set from a signal handler: no lock taken
        self.mmb = args.pp_max_micro_batch_size
        self.profiling = False
        self.running = self.queued = 0
        self.metrics = ServeMetrics(clock)
        self.started = time.time()

    @property
    def counters(self) -> dict[str, float]:
        return self.metrics.counters

    # ---- HTTP side
    def submit(self, prompt_tokens: int, max_tokens: int, streaming: bool) -> Stream:
        with self._cv:
            if self.closed:
                raise ServeClosed(f"the loop is not running ({self.closed})")
            if len(self._new) >= MAX_WAITING:
                raise QueueFull(f"more than {MAX_WAITING} requests waiting")
            req = Request(f"{next(self._ids):x}{int(self.started * 1e3):x}", prompt_tokens,
                          max_tokens, streaming, self.clock())
            self._new.append(req)
            self._cv.notify_all()
        return Stream(req, self)

    def control(self, kind: str, args: dict, timeout: float) -> tuple[int, Any]:
        """Send a control command to the loop; (HTTP status, body) once the loop applied it."""
        with self._cv:
            if self.closed:
                raise ServeClosed(f"the loop is not running ({self.closed})")
            c = Control(next(self._ids), kind, dict(args))
            self._controls.append(c)
            self._pending[c.cid] = c
            self._cv.notify_all()
        if not c.done.wait(timeout):
            with self._cv:
                self._pending.pop(c.cid, None)
                try:
                    self._controls.remove(c)
                except ValueError:
                    pass
            return 504, f"the loop did not apply {kind} within {timeout:g} s"
        return c.reply

    def _next_event(self, req: Request, timeout: float):
        deadline = time.monotonic() + timeout
        with self._cv:
            while not req.events:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cv.wait(left)
            return req.events.popleft()

    def _cancel(self, req: Request) -> None:
        with self._cv:
            if not req.done:
                req.done = True
                self.metrics.counters["aborted"] += 1
            self._cv.notify_all()

    def healthy(self) -> bool:
        return self.ready and not self.closed

    def internal_state(self) -> dict:
        """What SGLang returns per scheduler in `internal_states` (the settings as they are now)."""
        with self._cv:
            d = self.args.as_dict()
            d.update({CAP.server_arg: self.mmb, "last_gen_throughput": self.metrics.tput(),
                      "profiling": self.profiling})
            return d

    def metrics_text(self) -> str:
        """/metrics: Prometheus text in SGLang's names (`ServeMetrics.text`)."""
        with self._cv:
            return self.metrics.text(self.args.served_model_name, self.running, self.queued)

    # ---- loop side (rank 0)
    def request_stop(self, reason: str) -> None:
        """Safe in a signal handler (takes no lock): the loop stops at its next visit."""
        self.stop_requested = reason

    def mark_ready(self) -> None:
        with self._cv:
            self.ready = True

    def take(self) -> tuple[list[Request], list[Control]]:
        with self._cv:
            new, ctl = list(self._new), list(self._controls)
            self._new.clear()
            self._controls.clear()
            return new, ctl

    def wait_work(self, timeout: float) -> None:
        with self._cv:
            if not self._new and not self._controls and not self.closed:
                self._cv.wait(timeout)

    def answer(self, cid: int | None, status: int, body: Any) -> None:
        if cid is None:
            return
        with self._cv:
            c = self._pending.pop(cid, None)
        if c is not None:
            c.reply = (status, body)
            c.done.set()

    def set_gauges(self, running: int, queued: int, mmb: int, profiling: bool) -> None:
        with self._cv:
            self.running, self.queued, self.mmb, self.profiling = running, queued, mmb, profiling

    def token(self, req: Request, t: float) -> None:
        """One token of `req` produced at loop time `t` (host clock)."""
        with self._cv:
            if req.done:
                return
            k = self.metrics.token(req, t)
            last = req.emitted >= req.max_tokens
            req.events.append(("token", k, last))
            if last:
                req.done = True
                self.metrics.finished(req, t)
                req.events.append(("end", "length"))
            self._cv.notify_all()

    def abort(self, reqs, reason: str) -> None:
        with self._cv:
            for r in reqs:
                if not r.done:
                    r.done = True
                    self.metrics.counters["aborted"] += 1
                    r.events.append(("end", reason))
                elif not r.events or r.events[-1][0] != "end":
                    r.events.append(("end", reason))
            self._cv.notify_all()

    def close(self, reason: str) -> None:
        """No more requests or controls; those waiting get `reason` (idempotent)."""
        with self._cv:
            if self.closed:
                return
            self.closed = reason
            new, ctl = list(self._new), list(self._pending.values())
            self._new.clear()
            self._controls.clear()
            self._pending.clear()
            self._cv.notify_all()
        self.abort(new, reason)
        for c in ctl:
            c.reply = (503, f"the loop stopped ({reason})")
            c.done.set()


class ServeScheduler:
    """Rank 0's admission and output processing in serve mode (see the module docstring)."""

    def __init__(self, state: ServeState, scfg: SlotConfig, policy: str = "sglang",
                 micro_batches: int | None = None, stop_at: float | None = None,
                 profile_dir: str = "."):
        self.state, self.scfg, self.policy, self.micro_batches = state, scfg, policy, micro_batches
        self.stop_at, self.profile_dir = stop_at, profile_dir
        S = scfg.slots
        self.adm = AdmitState.empty(scfg)
        self.waiting: list[Request] = []
        self.chunked: Request | None = None
        self.members: list[list[Request]] = [[] for _ in range(S)]
        self.batch: list[list[Request]] = [[] for _ in range(S)]   # who ran at the last visit
        self.forward_ct = 0
        self.profile_target: int | None = None   # stop profiling when forward_ct reaches it
        self.profiling = False
        self.admitted = 0
        self.peak, self.peak_sizes = 0, [0] * S
        self.occupancy: collections.deque = collections.deque(maxlen=10000)

    def set_cap(self, n: int) -> None:
        self.scfg = dataclasses.replace(self.scfg, max_micro_batch=int(n))

    def _accept(self, c: Control, now_wall: float) -> dict | None:
        """Check a control command before it is relayed; a refused one is answered here and
        never reaches the ranks. Returns the relayed form, or None."""
        st = self.state
        if c.kind == "set_internal_state":
            a = c.args
            upper = st.args.max_micro_batch_upper
            if set(a) != {CAP.server_arg} or not 1 <= a[CAP.server_arg] <= upper:
                st.answer(c.cid, 200, [False])   # SGLang: updated=False, HTTP 200
                return None
            return {"id": c.cid, "kind": c.kind, "args": {CAP.server_arg: int(a[CAP.server_arg])}}
        if c.kind == "start_profile":
            if self.profiling:
                st.answer(c.cid, 400, "Profiling is already in progress. Call /stop_profile "
                                      "first.")
                return None
            a = c.args
            steps = a.get("num_steps")
            self.profiling = True
            self.profile_target = self.forward_ct + steps + 1 if steps else None
            out_dir = a.get("output_dir") or os.environ.get("SGLANG_TORCH_PROFILER_DIR") \
                or self.profile_dir
            return {"id": c.cid, "kind": c.kind,
                    "args": {"output_dir": str(out_dir),
                             "activities": list(a.get("activities") or ["CPU", "GPU"]),
                             "profile_id": str(a.get("profile_id") or now_wall)}}
        if c.kind == "stop_profile":
            if not self.profiling:
                st.answer(c.cid, 400, "Profiling is not in progress. Call /start_profile first.")
                return None
            self.profiling, self.profile_target = False, None
            return {"id": c.cid, "kind": c.kind, "args": {}}
        st.answer(c.cid, 400, f"unknown control {c.kind!r}")
        return None

    def _idle(self) -> bool:
        return not (self.waiting or self.chunked or any(self.members) or any(self.batch))

    def visit(self, it: int, s: int) -> dict:
        """Rank 0 at the visit of slot `s` (iteration `it`): the request list to relay."""
        st = self.state
        if self._idle():
            st.wait_work(IDLE_WAIT_S)
        new, controls = st.take()
        now = st.clock()
        stop = bool(st.closed or st.stop_requested) or (self.stop_at is not None
                                                         and now >= self.stop_at)
        # finished (or cancelled) requests leave the slot at its next visit
        self.members[s] = [r for r in self.members[s] if not r.done]
        self.adm.sizes[s] = len(self.members[s])
        self.waiting = [r for r in self.waiting + new if not r.done]
        ctl = []
        wall = time.time()
        for c in controls:
            m = self._accept(c, wall)
            if m is not None:
                ctl.append(m)
        if self.profile_target is not None and self.forward_ct >= self.profile_target:
            self.profiling, self.profile_target = False, None   # num_steps reached
            ctl.append({"id": None, "kind": "stop_profile", "args": {}})
        if stop and self.profiling:   # a profile still running is written before the end
            self.profiling, self.profile_target = False, None
            ctl.append({"id": None, "kind": "stop_profile", "args": {}})
        if stop:
            st.set_gauges(sum(self.adm.sizes), len(self.waiting), self.scfg.max_micro_batch,
                          self.profiling)
            return {"stop": True, "it": it, "slot": s, "kind": "idle", "n": 0, "rows": 0,
                    "measure": False, "ctl": ctl}
        had = self.chunked
        vis = visit(self.adm, [r.prompt_tokens for r in self.waiting], s, self.scfg,
                    self.policy, self.micro_batches)
        joining = self.waiting[:vis.taken]
        del self.waiting[:vis.taken]
        if had is not None and (self.adm.chunk_left == 0 or vis.taken):
            joining.insert(0, had)      # its last chunk ran in this visit
            self.chunked = None
        if self.adm.chunk_left and vis.taken:
            self.chunked = joining.pop()   # the last one taken is chunked: rest next visits
        self.admitted += vis.taken
        self.members[s] += joining
        if vis.batch:   # prefill first: the newly joined run their prefill in this visit
            kind, n, rows = "prefill", vis.batch, vis.tokens
            self.batch[s] = joining
            self.occupancy.append((now, list(self.adm.sizes)))
        else:
            n = len(self.members[s])
            kind, rows = ("decode", n) if n else ("idle", 0)
            self.batch[s] = list(self.members[s])
        if rows:
            self.forward_ct += 1
        running = sum(self.adm.sizes)
        if running > self.peak:
            self.peak, self.peak_sizes = running, list(self.adm.sizes)
        st.set_gauges(running, len(self.waiting) + (1 if self.chunked else 0),
                      self.scfg.max_micro_batch, self.profiling)
        return {"stop": False, "it": it, "slot": s, "kind": kind, "n": n, "rows": rows,
                "measure": bool(rows or running), "ctl": ctl}

    def outputs(self, slot: int, t: float) -> None:
        """Rank 0 processed the outputs of `slot`'s last batch: one token per request in it."""
        for r in self.batch[slot]:
            self.state.token(r, t)
        self.batch[slot] = []

    def close(self, reason: str) -> None:
        """The loop ended: every request still held or waiting ends with `reason`."""
        self.state.close(reason)
        held = [r for m in self.members for r in m] + self.waiting + \
            ([self.chunked] if self.chunked else [])
        self.state.abort(held, reason)


def trace_name(profile_id: str, rank: int) -> str:
    """SGLang's per-rank trace file name (TP 1, PP > 1, no DP/EP)."""
    return f"{profile_id}-TP-0-PP-{rank}.trace.json.gz"


class RankSide:
    """One rank's handling of relayed control commands. `profiler(activities)` returns an object
    with start(), stop() and export(path); `barrier()` waits for every rank (after a trace is
    written, so that rank 0 answers /stop_profile once every rank's trace is on disk). Rank 0 is
    given the scheduler: it applies the cap to admission and answers the HTTP thread."""

    def __init__(self, rank: int, sched: ServeScheduler | None = None,
                 profiler: Callable[[list[str]], Any] | None = None,
                 barrier: Callable[[], None] | None = None):
        self.rank, self.sched, self.profiler, self.barrier = rank, sched, profiler, barrier
        self.mmb: int | None = None
        self.prof = None
        self.trace_path: Path | None = None
        self.applied: list[tuple[int, str, dict]] = []   # (iteration, kind, args)
        self.written: list[str] = []

    def _answer(self, cid, status, body) -> None:
        if self.sched is not None:
            self.sched.state.answer(cid, status, body)

    def apply(self, ctl: dict, it: int) -> None:
        kind, args, cid = ctl["kind"], ctl["args"], ctl.get("id")
        self.applied.append((it, kind, dict(args)))
        if kind == "set_internal_state":
            self.mmb = args[CAP.server_arg]
            if self.sched is not None:
                self.sched.set_cap(self.mmb)
            self._answer(cid, 200, [True])
        elif kind == "start_profile":
            if self.profiler is None:
                self._answer(cid, 400, "this loop has no profiler")
                return
            self.prof = self.profiler(args["activities"])
            self.prof.start()
            self.trace_path = Path(args["output_dir"]) / trace_name(args["profile_id"],
                                                                   self.rank)
            self._answer(cid, 200, "Start profiling.\n")
        elif kind == "stop_profile":
            err = None
            try:
                if self.prof is not None:
                    self.prof.stop()
                    self.trace_path.parent.mkdir(parents=True, exist_ok=True)
                    self.prof.export(self.trace_path)
                    self.written.append(self.trace_path.name)
            except OSError as e:
                err = f"rank {self.rank}: cannot write {self.trace_path}: {e.strerror or e}"
            finally:
                self.prof = None
                if self.barrier is not None:
                    self.barrier()
            if err:
                self._answer(cid, 500, err)
            else:
                self._answer(cid, 200, "Stop profiling. This will take some time.\n")


def relay(meta: dict) -> dict:
    """The request list as the next rank receives it (pickled, as over gloo)."""
    return pickle.loads(pickle.dumps(meta))


def run_cpu_loop(state: ServeState, scfg: SlotConfig, *, step_s: float = 2e-3,
                 policy: str = "sglang", seconds: float | None = None,
                 profiler: Callable[[list[str]], Any] | None = None,
                 profile_dir: str = ".") -> tuple[ServeScheduler, list[RankSide]]:
    """The serve loop on CPU, one process, `scfg.pp` simulated ranks: each iteration rank 0's
    scheduler makes the request list, every rank gets its pickled copy and applies its control
    commands, a visit with a batch costs `step_s` (the forward), and rank 0 processes the
    outputs of slot s + 1 from its last visit (the real loop's order). Runs until
    `state.close()` or `seconds`. Returns the scheduler and the ranks (tests read them)."""
    stop_at = None if seconds is None else state.clock() + seconds
    sched = ServeScheduler(state, scfg, policy, stop_at=stop_at, profile_dir=profile_dir)
    sides = [RankSide(r, sched if r == 0 else None, profiler) for r in range(scfg.pp)]
    S, mbs, it = scfg.slots, [0] * scfg.slots, 0
    state.mark_ready()
    try:
        while True:
            s = it % S
            meta = sched.visit(it, s)
            for r, side in enumerate(sides):
                m = meta if r == 0 else relay(meta)
                for c in m["ctl"]:
                    side.apply(c, it)
            if meta["stop"]:
                break
            mbs[s] = meta["rows"]
            if meta["rows"]:
                time.sleep(step_s)
            if mbs[(s + 1) % S]:
                sched.outputs((s + 1) % S, state.clock())
            it += 1
    finally:
        sched.close(state.closed or state.stop_requested or "server stopped")
    return sched, sides
