"""Where the time goes: ideal -> modelled gap split over named causes by exact Shapley values.

`value(S)` is the pipeline model with the switches in S on (reports/model/scenario/loop_builder.py). A cause's
Shapley value is the average, over all orders of turning the switches on, of the change it
makes: sum over subsets S not holding it of |S|!(n-|S|-1)!/n! * (v(S+i) - v(S)). The rows add
up to v(all) - v(none) exactly and do not depend on any order. We compute it twice: on the time
per decode step (TPOT, ms: every running request advances one token) and on tok/s.

`unexplained` = observed - modelled (not part of the Shapley split): what the model does not
account for. A negative value there means the system ran faster than the model says.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from reports.model.scenario import loop_builder as lb
from reports.model.causes import label
from reports.base.shapley import shapley
from reports.model.scenario.inputs import Inputs

# which model input each cause draws on (for evidence + measured/estimated)
INPUT_OF = {
    "slow_stage": "kernel_efficiency", "kernel_efficiency": "kernel_efficiency",
    "launch_gaps": "eager_us_per_layer", "hop": "hop_us", "host": "host_us",
    "token_return": "async_depth", "herd": "max_micro_batch",
    "routing_skew": "zipf_s",
}


# Causes whose size is SGLang's own loop mechanics run on the inputs, not an input's value:
# labelled `modelled`, with the mechanism and the input it runs on as evidence.
MODELLED = {
    "token_return": "SGLang 0.5.23's PP loop (managers/scheduler_pp_mixin.py, event_loop_pp: "
                    "outputs held async-depth iterations) at the scenario's async depth",
    "herd": "SGLang 0.5.23's admission (reports/base/slots.py, after schedule_policy.py "
            "PrefillAdder) on the scenario's arrival",
}


@dataclass(frozen=True)
class Row:
    cause: str
    label: str
    ms_per_step: float
    tok_per_s: float
    share: float | None
    evidence: str
    source: str


@dataclass(frozen=True)
class Attribution:
    concurrency: int
    ideal_tok_per_s: float
    modelled_tok_per_s: float
    observed_tok_per_s: float | None
    ideal_tpot_ms: float
    modelled_tpot_ms: float
    rows: tuple[Row, ...]          # the causes, then `unexplained` when observed exists


def _switches_nothing(inp: Inputs, C: int, p: str, players: Sequence[str]) -> bool:
    """A switch that builds the same loop with it on or off, from nothing and from everything
    else on: a null player (Shapley value 0), left out of the 2^n subsets. The switches act on
    separate parts of the loop (stage costs, hops, CPU, slot sizes), so the two ends decide."""
    full = frozenset(players)
    return all(lb.build(inp, C, s | {p}) == lb.build(inp, C, s - {p})
               for s in (frozenset(), full))


def attribute(inp: Inputs, C: int, players: Sequence[str] = lb.SWITCHES) -> Attribution:
    live = [p for p in players if not _switches_nothing(inp, C, p, players)]
    tpot = {p: 0.0 for p in players}
    tput = dict(tpot)
    tpot.update(shapley(live, lambda s: lb.run(inp, C, s).tpot_ms))
    tput.update(shapley(live, lambda s: lb.run(inp, C, s).tok_per_s))
    ideal, full = lb.run(inp, C, frozenset()), lb.run(inp, C, frozenset(players))
    gap = full.tpot_ms - ideal.tpot_ms
    rows = []
    for p in players:
        src, ev = inp.src(INPUT_OF[p])
        if p in MODELLED:
            src, ev = "modelled", f"{MODELLED[p]} ({inp.src(INPUT_OF[p])[1]})"
        rows.append(Row(p, label(p), tpot[p], tput[p],
                        tpot[p] / gap if abs(gap) > 1e-12 else None, ev, src))
    obs = dict(inp.observed).get(C)
    if obs:
        obs_tpot = C / obs * 1e3
        rows.append(Row("unexplained", "modelled -> observed (not in the model)",
                        obs_tpot - full.tpot_ms, obs - full.tok_per_s, None,
                        inp.src("observed_tok_per_s")[1], "observed"))
    return Attribution(C, ideal.tok_per_s, full.tok_per_s, obs, ideal.tpot_ms, full.tpot_ms,
                       tuple(rows))
