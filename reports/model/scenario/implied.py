"""What the observed tok/s says about the kernels: the efficiency that would explain it.

When the model misses an observed point by more than `MISS_PCT`, one candidate explanation is
that the server's kernels run at another fraction of their roofline floor than the one fed in
(measured by stage-cost on some GPU with ppscope's kernels, transferred, or estimated). This
finds the one factor `scale` on every stage's efficiency curve at which the model meets the
observed tok/s at that concurrency (bisection; the model's tok/s rises with efficiency), the
efficiency that implies at micro-batch size 1, and whether that is physically possible (no
kernel beats its floor: an implied efficiency above 1 means something else is off: the floor's
bytes, the GPU's bandwidth, or a part of the step the model has and the server does not).

It is an estimate, labelled so: it says which input would have to change to explain the gap,
not that it did. Other inputs (host time, hops) could explain part of it; the report shows this
next to the unexplained row, never instead of it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from reports.base.interp import interp_log
from reports.model.scenario import loop_builder as lb
from reports.model.scenario.inputs import Inputs

MISS_PCT = 10.0
SCALE_LO, SCALE_HI = 0.05, 20.0


@dataclass(frozen=True)
class ImpliedEfficiency:
    concurrency: int
    observed_tok_per_s: float
    modelled_tok_per_s: float
    scale: float | None          # factor on every efficiency curve that meets the observation
    efficiency_b1: float         # fed in, at micro-batch 1 (mean over stages)
    implied_b1: float | None     # efficiency_b1 x scale
    possible: bool               # implied efficiency <= 1 everywhere
    text: str


def _scaled(inp: Inputs, s: float) -> Inputs:
    def sc(curve):
        return tuple((b, e * s) for b, e in curve)
    return replace(inp, eff_curve=sc(inp.eff_curve),
                   stage_eff=tuple(sc(c) for c in inp.stage_eff))


def _eff_b1(inp: Inputs) -> float:
    curves = inp.stage_eff or (inp.eff_curve,)
    return sum(interp_log(list(c), 1) for c in curves) / len(curves)


def _max_eff(inp: Inputs, C: int) -> float:
    """The highest efficiency fed in at the micro-batch sizes the loop runs at C."""
    sizes = {n for occ, _ in lb.occupancy(inp, C) for n in occ if n} or {1}
    return max(interp_log(list(c), b) for c in (inp.stage_eff or (inp.eff_curve,))
               for b in sizes)


def implied_efficiency(inp: Inputs, C: int, observed: float) -> ImpliedEfficiency | None:
    """None when the model is within MISS_PCT of the observation at C."""
    modelled = lb.run(inp, C).tok_per_s
    if observed <= 0 or abs(modelled / observed - 1) * 100 <= MISS_PCT:
        return None

    def tps(s: float) -> float:
        return lb.run(_scaled(inp, s), C).tok_per_s
    e1 = _eff_b1(inp)
    lo, hi = SCALE_LO, SCALE_HI
    if not tps(lo) <= observed <= tps(hi):
        word = "faster" if observed > modelled else "slower"
        return ImpliedEfficiency(
            C, observed, modelled, None, e1, None, False,
            f"C={C}: no kernel efficiency explains the observed {observed:.1f} tok/s (the model "
            f"gives {modelled:.1f}); the server is {word} than any efficiency from "
            f"{SCALE_LO}x to {SCALE_HI}x the one fed in: look at the other inputs")
    for _ in range(40):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if tps(mid) < observed else (lo, mid)
    s = (lo * hi) ** 0.5
    possible = _max_eff(inp, C) * s <= 1.0
    text = (f"C={C}: the observed {observed:.1f} tok/s (modelled {modelled:.1f}) needs the "
            f"kernels of every stage at {s:.2f}x the efficiency fed in, {100 * e1 * s:.0f}% of the "
            f"roofline floor at micro-batch 1 instead of {100 * e1:.0f}%"
            + ("" if possible else
               " -- above the floor at a size this load runs, so kernel speed alone cannot "
               "explain it"))
    return ImpliedEfficiency(C, observed, modelled, s, e1, e1 * s, possible, text)
