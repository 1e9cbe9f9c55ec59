"""What each setting the report can recommend does to the observed server, from its own loop.

The scenario's what-ifs (reports/model/scenario/whatifs.py) describe the scenario's deployment; for a
server that was traced (`ppscope sglang` with its traces, log and bench_serving runs) this module
tries the same settings on the model of that server's own loop: bench_serving's whole run over
the observed loop, before and after one change, with SGLang's admission rule
(reports/model/observed/bench_run.py). The figures are the model's change of bench_serving's tok/s;
docs/BENCHMARKS.md section 15 sets them beside SGLang's own server measured before and after.

The candidates, each one change from the server's settings:
- `--pp-async-batch-depth` 0, 1 and pp (one more slot per step: another micro-batch in flight,
  and one more visit's host work per round on every rank);
- `--pp-max-micro-batch-size` ceil(C / pp) where the cap lets a burst sit in fewer slots (SGLang
  pins a burst to the slot visited first, up to the cap: `get_num_allocatable_reqs`);
- `--max-running-requests` C where the server's rows are fewer than C (the rest queue);
- `--chunked-prefill-size` the next power of two that holds C prompts, where the budget holds
  fewer (a wave's prompts then share one prefill visit instead of one visit each);
- arrival pacing: bench_serving `--request-rate` at the rate the server finished requests in
  the modelled run before the change, where the run was a burst;
- `SGLANG_PP_LAYER_PARTITION` (an environment variable of SGLang's, not a flag): the split a
  local search reaches one layer at a time from the server's own, where the layers each rank
  runs are known: counted by a window profiled with stacks, else SGLang's own rule over the
  model's layers (reports/model/observed/layer_split.py says how a layer's cost is estimated).

Only where the run model was checked: on SGLang's own server on the CPU (the lab). On a GPU a
prefill visit of long prompts costs far more than a decode visit, which the run charges alike
(observed_whatif's stated simplification), so there the report says it did not model them.
"""
from __future__ import annotations

from dataclasses import dataclass

from reports.base.server_flags import BY_FLAG
from reports.base.server_settings import ServerSettings
from reports.model.observed import layer_split
from reports.model.observed.deployment import Deployment
from reports.model.observed import bench_run as ow
from reports.model.settings_change import (LAYER_PARTITION, REQUEST_RATE, Candidate, Change,
                                           WhatIf, effect)

NO_CHANGE_PCT = 2.0     # below this, the change is within what the model can tell apart


@dataclass(frozen=True)
class ServerWhatIfs:
    """report.json's `server_whatifs`: `status` "ok" with `rows` best first, or "not modelled"
    with the `reason`."""
    status: str
    reason: str | None = None
    concurrency: int | None = None
    prompts: int | None = None
    before_tok_per_s: float | None = None
    no_change_pct: float = NO_CHANGE_PCT
    rows: tuple[WhatIf, ...] = ()        # side "observed server"
    arrivals: str | None = None          # where the first C prompts came from (observed_whatif)

    @property
    def best(self) -> WhatIf | None:
        """The row worth recommending: the largest gain beyond NO_CHANGE_PCT, else None."""
        good = [r for r in self.rows if r.change_pct > self.no_change_pct]
        return good[0] if good else None


def _command(change: Change) -> str:
    """The change as it is made: an environment variable of the server, bench_serving's
    pacing, or the server's flag (reports/base/server_flags.py)."""
    if change.flag == LAYER_PARTITION:
        return f"{change.flag}={change.value} in the server's environment"
    if change.flag == REQUEST_RATE:
        return f"bench_serving {REQUEST_RATE} {change.value}"
    return f"{BY_FLAG[change.flag].flag} {change.value}"


def candidates(server: ServerSettings, load: ow.Load, before: ow.Run,
               dep: Deployment | None = None) -> list[Candidate]:
    """Each change worth trying on this server (module docstring)."""
    C, pp, depth = load.concurrency, server.pp_size, server.pp_async_batch_depth
    rows, chunk = server.max_running_requests, server.chunked_prefill_size
    out: list[Candidate] = []
    for d in sorted({0, 1, pp} - {depth}):
        out.append(Candidate.one("--pp-async-batch-depth", d,
                                 f"{pp + d} slots instead of {server.slots}"))
    spread = -(-C // pp)
    if C > 1 and spread < min(C, ow.cap_now(server)):
        out.append(Candidate.one("--pp-max-micro-batch-size", spread,
                                 f"a burst of {C} split over {pp} slots instead of pinned to "
                                 "the first"))
    if rows and rows < C:
        out.append(Candidate.one("--max-running-requests", C,
                                 f"room for all {C} streams ({rows} rows: the rest queue)"))
    if chunk and chunk > 0 and load.prompt_len and chunk < C * load.prompt_len:
        fit = 1 << (C * load.prompt_len - 1).bit_length()
        out.append(Candidate.one("--chunked-prefill-size", fit,
                                 f"{C} prompts of {load.prompt_len} tokens in one prefill visit "
                                 f"(the budget of {chunk} holds {max(1, chunk // load.prompt_len)})"))
    if load.rate is None and C > 1 and before.seconds > 0:
        rate = round(load.prompts / before.seconds, 1)
        if rate > 0:
            out.append(Candidate.one(REQUEST_RATE, rate,
                                     f"prompts paced at the rate the server finished them "
                                     f"({rate}/s) instead of a burst"))
    best = layer_split.best_split(dep) if dep is not None else None
    if best is not None:
        out.append(Candidate.one(LAYER_PARTITION, layer_split.text(best),
                                 f"layers {layer_split.text(best)} over the ranks instead of "
                                 f"{layer_split.text(dep.layers)} "
                                 f"({layer_split.cost_note(dep, max(dep.sizes))})"))
    return out


def _row(c: Candidate, C: int, before: ow.Run, after: ow.Run) -> WhatIf:
    e = effect(C, before.tok_per_s, after.tok_per_s)
    return WhatIf(c.knob, c.shown, (e,), None, e.gain, e.gain, c.changes[0].server, c.note,
                  side="observed server", command=_command(c.changes[0]),
                  sizes_before=tuple(before.steady_sizes), sizes_after=tuple(after.steady_sizes),
                  changes=c.changes)


def _not(reason: str) -> ServerWhatIfs:
    return ServerWhatIfs("not modelled", reason=reason)


def server_whatifs(sg) -> ServerWhatIfs:
    """The observed server's what-ifs, each candidate tried on the model of its own loop."""
    if sg is None or sg.loop is None or not sg.loop.ranks:
        return _not("no loop profile in the server's evidence")
    if not [b for b in sg.bench if b.output_throughput]:
        return _not("no bench_serving run in the evidence (ppscope sglang --bench): the load "
                    "the settings are tried under is bench_serving's")
    try:
        dep, server, load, _ = ow.from_sglang(sg)
    except (ValueError, TypeError) as e:
        return _not(str(e))
    if dep.device != "cpu":
        return _not(f"the run model is checked on SGLang's own server on the CPU only; on "
                    f"{dep.device} a prefill visit costs more than the decode visit it charges")
    try:
        before = ow.bench_run(dep, server, load)
        rows = []
        for cand in candidates(server, load, before, dep):
            if cand.knob == LAYER_PARTITION:
                after = ow.bench_run(layer_split.resplit(dep, cand.value), server, load)
            else:
                after = ow.bench_run(dep, *ow.apply(server, load, cand.changes[0]))
            rows.append(_row(cand, load.concurrency, before, after))
    except ValueError as e:
        return _not(str(e))
    rows.sort(key=lambda r: -r.change_pct)
    return ServerWhatIfs("ok", concurrency=load.concurrency, prompts=load.prompts,
                         before_tok_per_s=before.tok_per_s, rows=tuple(rows),
                         arrivals=ow.arrival_text(dep, load))
