"""`SGLANG_PP_LAYER_PARTITION` as a what-if of the observed server: whole layers moved between
its ranks.

A rank's forward is its decoder layers plus what is not a layer: the embedding on rank 0, the
final norm, `lm_head`, the logits and sampling on the last rank (SGLang 0.5.23
srt/distributed/utils.py `get_pp_indices` splits only the layers), and SGLang's own work per
forward on every rank. A window profiled with SGLang's defaults (`with_stack`) times the
decoder layers on each rank (microbench/sglang/cpu_steps.py `layer_costs`): the layers per
forward (the split the server ran, which SGLang logs nowhere) and one layer's time by
micro-batch size.

A split moves whole layers, so rank r's forward at size b becomes its observed forward +
(n'_r - n_r) x one layer at b. One layer's time is the mean over the ranks (one model's layers
are alike; the ranks' own means differ by the window's noise). Nothing else of the loop
changes: the host work, the hops and the admission are the server's as observed.

Stated limits: the server's forward must be timed on its CPU (SGLang's CPU backend); on a GPU
the module events time the launches, not the device's work, and the split is not offered. The
Python tracer runs inside the layers: a window with stacks times them as that window ran.
"""
from __future__ import annotations

from dataclasses import replace

from reports.base.partition import layer_counts
from reports.model.observed.deployment import OBSERVED_CAUSES, Deployment, at_size, run


def split_of(dep: Deployment) -> tuple[int, ...] | None:
    """The layers each rank ran, where the traces time them on every rank; else None."""
    if len(dep.layers) == dep.pp and all(dep.layers) and dep.layer_us:
        return dep.layers
    return None


def why_not(dep: Deployment) -> str | None:
    """Why the split cannot be tried on this server, or None when it can."""
    if dep.device != "cpu":
        return (f"the layers are timed on the CPU only (on {dep.device} the module events "
                "time the launches, not the device's work)")
    if split_of(dep) is None:
        return ("no decoder layer is timed in the traces: profile a window with SGLang's "
                "defaults (stacks), whose module events time each layer")
    return None


def parse(value: str, total: int, pp: int) -> tuple[int, ...]:
    """A partition "a,b,..." checked as SGLang checks it (reports/base/partition.py)."""
    return tuple(layer_counts(total, pp, str(value)))


def layer_at(dep: Deployment, b: int) -> float:
    """One layer's time at micro-batch size b, us (observed sizes, else interpolated)."""
    return at_size(dep.layer_us, b)


def resplit(dep: Deployment, value) -> Deployment:
    """`dep` with its layers split as `value` ("a,b,..."): each rank's forward curves moved by
    the layers it gains or loses."""
    now = split_of(dep)
    if now is None:
        raise ValueError(why_not(dep) or "no layer split")
    new = parse(value, sum(now), dep.pp)

    def moved(curves):
        return tuple({b: max(0.0, v + (n1 - n0) * layer_at(dep, b)) for b, v in c.items()}
                     for c, n0, n1 in zip(curves, now, new))
    return replace(dep, forward=moved(dep.forward), forward_busy=moved(dep.forward_busy),
                   layers=new)


def neighbours(split: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every split one layer away: one layer across one boundary, either way."""
    out = []
    for r in range(len(split) - 1):
        for d in (1, -1):
            c = list(split)
            c[r] += d
            c[r + 1] -= d
            if min(c) >= 1:
                out.append(tuple(c))
    return out


def text(split) -> str:
    return ",".join(map(str, split))


def best_split(dep: Deployment, max_moves: int = 16) -> tuple[int, ...] | None:
    """The split a local search reaches from the server's own, one layer at a time, on the
    steady round of the observed loop (every slot as traced): the best neighbour while it
    shortens the round. With no better neighbour, the best neighbour all the same (the
    what-if then says what moving a layer costs). None when the split cannot be tried."""
    now = split_of(dep)
    if now is None or dep.pp < 2:
        return None

    def step_us(split):
        return run(resplit(dep, text(split)), frozenset(OBSERVED_CAUSES)).tpot_ms
    cur, cur_t = now, step_us(now)
    first = min(neighbours(now), key=step_us, default=None)
    for _ in range(max_moves):
        cand = min(neighbours(cur), key=step_us, default=None)
        if cand is None or step_us(cand) >= cur_t:
            break
        cur, cur_t = cand, step_us(cand)
    return cur if cur != now else first
