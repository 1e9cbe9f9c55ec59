"""What one setting change does to the observed server, predicted from its own evidence alone.

The model of the observed loop (reports/model/observed/deployment.py: per-rank forward by micro-batch
size, host work, result processing, hops, slots, all from the server's traces) gives the time of
one round of the slot loop for any slot sizes. A benchmark is more than a steady round: this
module runs bench_serving's whole closed-loop run over that loop, round by round, with SGLang's
admission rule deciding where each arriving request goes, and compares the run's tok/s before
and after the change. Nothing is fitted to a measured tok/s.

The run (`bench_run`) is SGLang's admission written once (reports/base/slots.py `run_loop`:
the per-slot cap, request rows, the prefill budget with PrefillAdder's one chunked request,
prefill first, finished requests leaving at their slot's next visit) with bench_serving's
closed loop: a finished prompt's successor reaches the scheduler two visits after rank 0
processed its last token (`slots.REISSUE_VISITS`; the lab's logs admit bench_serving's last
prompts into an emptied slot, and at depth 0 the second generation decodes the first's groups
again). This module gives it the round time and the first prompts:
- the first C prompts arrive as the benchmark's own first burst did, where the server's log
  shows it (microbench/sglang/arrival_bursts.py: the prefill waves, each with the size of the
  slot it joined): wave i is admitted at the visit it was on the observed server, counted in
  visits from the burst's start, so the observed server gets back exactly its groups (1 into
  an empty slot, then 7 into the slot holding 1: SGLang's 8-and-0 herd), and a server with
  another slot count gets the same waves at the same visit numbers; another setting then
  applies its own rule (a prefill budget or a cap sends the rest to the next slot with room).
  Without that burst in the log, the first C prompts arrive as the traced micro-batches were
  (one group per observed slot, each just before that slot's visit); with another slot count
  the same share of the slots holds a group, C split evenly over them; with `--request-rate`
  R prompt i is sent at i/R (the Poisson mean) and joins the next visit. The traced window is
  a run of its own, with its own burst (the lab's: 14 and 2 where the benchmark ran 7 and 9),
  so the log's burst comes first;
- a round lasts what the model of the observed loop gives for its slot sizes
  (deployment.run with every cause as observed), a prefill visit as long as a decode visit, an
  empty round as long as a one-request round.

tok/s = prompts x output_len / (last token - first arrival), as bench_serving counts it. Stated
simplifications: equal prompt and output lengths (the lab's `--random-range-ratio 1`); a
prefill visit costs a decode visit; no KV-cache limit.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from reports.model.observed.bursts import first_burst, wave_visits
from reports.model.observed.deployment import OBSERVED_CAUSES, Deployment, run
from reports.base.server_settings import ServerSettings, default_max_micro_batch
from reports.base.slots import SlotConfig, Successor, Wave, run_loop
from reports.model.settings_change import LAYER_PARTITION, REQUEST_RATE, Change, check
from reports.model.settings_change import apply as apply_changes

ALL = frozenset(OBSERVED_CAUSES)


def observed_settings(pp: int, depth: int = 0, cap: int | None = None, rows: int | None = None,
                      chunk: int | None = None) -> ServerSettings:
    """The observed server's settings adapter: what its log names, under SGLang's names. The cap
    is kept only where it is not SGLang's default for the rows (set explicitly), or where no
    row count says what the default would be."""
    given = bool(cap and (not rows or cap != default_max_micro_batch(rows, pp)))
    return ServerSettings(pp, depth, rows or None, cap if given else None, chunk)


def cap_now(server: ServerSettings) -> int:
    """The per-slot cap the server admits with (no cap and no rows: no per-slot limit)."""
    return server.max_micro_batch or 1 << 30


@dataclass(frozen=True)
class Load:
    """bench_serving's run: C streams, N prompts, lengths in tokens, arrivals."""
    concurrency: int
    prompts: int
    output_len: int
    prompt_len: int = 0
    rate: float | None = None       # --request-rate (None: all at once)
    # the benchmark's first burst of C prompts as the log shows it: (#new-seq, #running-req of
    # the slot joined) per prefill (reports/base/payloads/sglang.py ArrivalBurst)
    waves: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Run:
    tok_per_s: float
    seconds: float
    mean_in_flight: float            # bench_serving's `concurrency`: latency total / duration
    steady_sizes: tuple[int, ...]    # the slot sizes held longest
    prefill_visits: int


def apply(server: ServerSettings, load: Load, change: Change) -> tuple[ServerSettings, Load]:
    """The server and load after one change: a server flag (settings_change.apply), or
    bench_serving's `--request-rate`."""
    if change.flag == REQUEST_RATE:
        return server, replace(load, rate=float(change.value) if change.value else None)
    if not check(change).server:
        raise ValueError(f"{change.flag} is not a setting of the observed server")
    return apply_changes(server, (change,)), load


def groups(dep: Deployment) -> list[tuple[int, int]]:
    """(slot, size) of each observed micro-batch: how the server's arrivals grouped."""
    return [(k, n) for k, n in enumerate(dep.sizes) if n]


class _Rounds:
    """Round time by slot sizes: the model of the observed loop, memoised."""

    def __init__(self, dep: Deployment, slots: int):
        self.dep, self.slots, self.memo = dep, slots, {}

    def __call__(self, sizes: tuple[int, ...]) -> float:
        if sizes not in self.memo:
            if not any(sizes):
                self.memo[sizes] = 0.0
            else:
                d = replace(self.dep, sizes=sizes, slots=self.slots)
                self.memo[sizes] = run(d, ALL).tpot_ms * 1e3
        return self.memo[sizes]


def replayed_visits(dep: Deployment, load: Load) -> list[int] | None:
    """The visit of each wave of the log's first burst, where the burst is replayed: its
    waves fit the observed loop and admit the run's first C prompts; else None."""
    if not load.waves or sum(n for n, _ in load.waves) != min(load.concurrency, load.prompts):
        return None
    return wave_visits(load.waves, dep.slots)


def waves_text(waves) -> str:
    """A burst's waves as the report and `ppscope sglang` say them: "1, 2, 6 (joining 1)"."""
    return ", ".join(f"{n}" + (f" (joining {r})" if r else "") for n, r in waves)


def arrival_text(dep: Deployment, load: Load) -> str:
    """Where the modelled run's first C prompts came from, in one sentence (_first_arrivals)."""
    if load.rate:
        return f"paced at {load.rate:g} requests/s (bench_serving's --request-rate)"
    if replayed_visits(dep, load) is not None:
        return ("as the benchmark's first burst was admitted in the server's log: "
                + waves_text(load.waves))
    return ("as the traced window's micro-batches (the log shows no burst of "
            f"{load.concurrency} requests outside the window that fits this loop)")


def _first_waves(dep: Deployment, server: ServerSettings, load: Load) -> list[Wave]:
    """The first C prompts as waves reaching the scheduler (module docstring)."""
    C, S = min(load.concurrency, load.prompts), server.slots
    if load.rate:
        # paced: prompt i sent at its Poisson mean time i / rate
        return [Wave(1, 0, i / load.rate * 1e6) for i in range(C)]
    visits = replayed_visits(dep, load)
    if visits is not None:
        # each wave at the visit it was admitted at on the observed server, in the log's order
        return [Wave(n, v) for (n, _), v in zip(load.waves, visits)]
    obs = groups(dep)
    total = sum(n for _, n in obs)
    sizes = [max(1, round(n * C / total)) for _, n in obs]
    if S != dep.slots:
        # another slot count: the same share of slots occupied (straggling successors spread
        # a group over consecutive visits, so every slot a group can reach holds one), C split
        # evenly over them
        m = max(1, min(C, round(len(obs) * S / dep.slots)))
        sizes = [C // m + (1 if k < C % m else 0) for k in range(m)]
    while sum(sizes) > C:
        sizes[sizes.index(max(sizes))] -= 1
    while sum(sizes) < C:
        sizes[sizes.index(min(sizes))] += 1
    m = len(sizes)
    # the observed groups, evenly spaced over this server's slot loop as they were on the
    # observed one (deployment._sizes), each just before its slot's first visit; more groups
    # than slots share slots
    pos = [(j * S) // m for j in range(m)] if m <= S else [j % S for j in range(m)]
    return [Wave(n, p) for p, n in zip(pos, sizes)]


def slot_config(server: ServerSettings) -> SlotConfig:
    """The server's admission settings (no cap and no rows: no per-slot limit)."""
    return SlotConfig(server.pp_size, server.pp_async_batch_depth, cap_now(server),
                      server.max_running_requests, server.chunked_prefill_size)


def bench_run(dep: Deployment, server: ServerSettings, load: Load) -> Run:
    """bench_serving's closed-loop run over the observed loop: SGLang's admission
    (reports/base/slots.py `run_loop`) with the observed loop's round time."""
    S, L = server.slots, max(1, load.output_len)
    rounds = _Rounds(dep, S)
    empty = rounds(tuple([1] + [0] * (S - 1)))   # an empty round costs a 1-request one

    def round_us(sizes: tuple[int, ...]) -> float:
        return rounds(sizes) if any(sizes) else empty

    nxt = Successor(load.prompts, 1e6 / load.rate if load.rate else 0.0)
    res = run_loop(slot_config(server), _first_waves(dep, server, load), nxt, round_us,
                   prompt_len=load.prompt_len, output_len=lambda: L)
    seconds = res.end_us / 1e6
    steady = res.held[0][0] if res.held else ()
    return Run(load.prompts * L / seconds, seconds, res.latency_us / 1e6 / seconds, steady,
               res.prefill_visits)


@dataclass(frozen=True)
class Prediction:
    knob: str
    value: str
    before: Run
    after: Run

    @property
    def change_pct(self) -> float:
        return 100.0 * (self.after.tok_per_s / self.before.tok_per_s - 1.0)


def predict(dep: Deployment, server: ServerSettings, load: Load, knob: str, value
            ) -> Prediction:
    """The run before and after one change, both from the before evidence (`dep`). A layer
    split changes the observed loop itself (reports/model/observed/layer_split.py)."""
    before = bench_run(dep, server, load)
    if knob == LAYER_PARTITION:
        from reports.model.observed.layer_split import resplit
        return Prediction(knob, str(value), before, bench_run(resplit(dep, value), server, load))
    s2, l2 = apply(server, load, Change(knob, value))
    return Prediction(knob, str(value), before, bench_run(dep, s2, l2))


def steady_tok_per_s(dep: Deployment) -> float:
    """The model of the observed loop in its steady state (every slot as traced)."""
    return run(dep, ALL).tok_per_s


def _setting(obs: dict, key: str):
    e = (obs or {}).get(key)
    return e["value"] if e else None


def from_sglang(sg) -> tuple[Deployment, ServerSettings, Load, float | None]:
    """The observed loop, the settings and bench_serving's run of one `sglang.json` record
    (SglangData), and bench_serving's mean tok/s over its runs (None without one)."""
    from reports.model.observed.deployment import from_evidence
    from reports.model.observed.server import observed_server
    obs = observed_server(sg) or {}
    runs = [b for b in sg.bench if b.output_throughput]
    C = sg.loop.concurrency if sg.loop is not None else None
    C = C or (runs[0].max_concurrency if runs else None)
    tok = [b.output_throughput for b in runs if b.max_concurrency in (None, C)]
    measured = sum(tok) / len(tok) if tok else None
    depth = _setting(obs, "pp_async_batch_depth")
    # the slot count is the server's setting (pp + depth) where it states one: a short traced
    # window may hold no idle pass to count slots from
    dep = from_evidence(sg.loop, concurrency=C, observed=measured,
                        async_depth=int(depth) if depth is not None else None,
                        depth_stated=depth is not None)
    pp = dep.pp
    rows = _setting(obs, "max_running_requests")
    cap = _setting(obs, "pp_max_micro_batch_size")
    server = observed_settings(pp, dep.slots - pp, cap, rows,
                               _setting(obs, "chunked_prefill_size"))
    b = runs[0] if runs else None
    rate = b.request_rate if b is not None else None
    rate = float(rate) if isinstance(rate, (int, float)) and rate != float("inf") else None
    # the benchmark's first burst of C requests (the log's, outside the traced window)
    first = first_burst(sg.loop.bursts if sg.loop is not None else (), C)
    load = Load(concurrency=int(C), prompts=int(b.completed) if b and b.completed else 2 * C + 2,
                output_len=int(round(b.mean_output_len)) if b and b.mean_output_len else 128,
                prompt_len=int(round(b.mean_input_len)) if b and b.mean_input_len else 0,
                rate=rate, waves=first.waves if first else ())
    return dep, server, load, measured

