"""`SGLANG_PP_LAYER_PARTITION` as a what-if of the observed server: whole layers moved between
its ranks.

A rank's forward is its decoder layers plus what is not a layer: the embedding on rank 0, the
final norm, `lm_head`, the logits and sampling on the last rank (SGLang 0.5.23
srt/distributed/utils.py `get_pp_indices` splits only the layers), and SGLang's own work per
forward on every rank. Two estimates of one layer's cost, the report says which it used
(`cost_from`):

- **timed** (a window profiled with SGLang's defaults, `with_stack`, on SGLang's CPU backend):
  the module events time the decoder layers on each rank (microbench/sglang/cpu_steps.py
  `layer_costs`): the layers per forward and one layer's time by micro-batch size, the mean
  over the ranks (one model's layers are alike; the ranks' own means differ by the window's
  noise). Rank r's forward at size b becomes its observed forward + (n'_r - n_r) x one layer.
  What is not a layer (the extras) stays on its rank.
- **from the forward** (no module events, or a GPU, where they time the launches, not the
  device's work): the layers each rank runs follow from SGLang's own rule (get_pp_indices:
  SGLANG_PP_LAYER_PARTITION where given, else the even split) over the model's layer count
  (`ppscope sglang --model`), and one layer on rank r costs its forward / n_r: the record
  does not time the extras apart, so they are counted as layer work (on the first and last
  rank a layer is then estimated dearer than it is, and moving one off them gains a little
  less than predicted). A rank's own per-layer cost keeps what made it slow (a slower or
  busier core, a slower device): rank r's forward becomes its observed forward x n'_r / n_r.

Nothing else of the loop changes: the host work, the hops and the admission are the server's
as observed. The Python tracer runs inside the layers: a window with stacks times them as that
window ran.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from reports.base.partition import layer_counts
from reports.model.observed.deployment import OBSERVED_CAUSES, Deployment, at_size, run
from reports.model.observed.split_error import widened


def split_of(dep: Deployment) -> tuple[int, ...] | None:
    """The layers each rank runs (counted in the traces, else SGLang's rule over the model's
    layers); None when neither is in the evidence."""
    if len(dep.layers) == dep.pp and all(dep.layers):
        return dep.layers
    return None


def why_not(dep: Deployment) -> str | None:
    """Why the split cannot be tried on this server, or None when it can."""
    if split_of(dep) is None:
        return ("the layers each rank runs are not in the evidence: give `ppscope sglang` the "
                "served model (--model, a preset or its config.json) with the server's "
                "SGLANG_PP_LAYER_PARTITION if set (--layer-partition), or profile a window "
                "with SGLang's defaults (stacks) on its CPU backend, whose module events "
                "time each layer")
    return None


def cost_from(dep: Deployment) -> str:
    """Which estimate of one layer's cost the split uses (module docstring)."""
    if dep.layer_us:
        return "one layer timed in the traces (module events), the mean over the ranks"
    return ("each rank's forward over its layers (the embedding, lm_head and sampling are "
            "not timed apart, so they count as layer work)")


def cost_note(dep: Deployment, b: int) -> str:
    """One layer's cost at size b in words, with how it was known."""
    if dep.layer_us:
        return f"one layer timed {layer_at(dep, b) / 1e3:.1f} ms at {b} requests"
    per = [layer_at(dep, b, r) / 1e3 for r in range(dep.pp)]
    return ("one layer estimated " + "/".join(f"{x:.1f}" for x in per)
            + f" ms on the ranks at {b} requests: each rank's forward over its layers")


def parse(value: str, total: int, pp: int) -> tuple[int, ...]:
    """A partition "a,b,..." checked as SGLang checks it (reports/base/partition.py)."""
    return tuple(layer_counts(total, pp, str(value)))


def layer_at(dep: Deployment, b: int, rank: int | None = None) -> float:
    """One layer's time at micro-batch size b, us (observed sizes, else interpolated): the
    timed mean over the ranks, else rank `rank`'s forward over its layers (the slowest
    rank's where no rank is named)."""
    if dep.layer_us:
        return at_size(dep.layer_us, b)
    per = [at_size(f, b) / n for f, n in zip(dep.forward, dep.layers)]
    return per[rank] if rank is not None else max(per)


def resplit(dep: Deployment, value) -> Deployment:
    """`dep` with its layers split as `value` ("a,b,..."): each rank's forward curves moved by
    the layers it gains or loses (module docstring)."""
    now = split_of(dep)
    if now is None:
        raise ValueError(why_not(dep) or "no layer split")
    new = parse(value, sum(now), dep.pp)

    def moved(curves):
        if dep.layer_us:
            return tuple({b: max(0.0, v + (n1 - n0) * layer_at(dep, b)) for b, v in c.items()}
                         for c, n0, n1 in zip(curves, now, new))
        return tuple({b: v * n1 / n0 for b, v in c.items()}
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


def best_split(dep: Deployment, max_moves: int = 16, shape=None) -> tuple[int, ...] | None:
    """The split a local search reaches from the server's own, one layer at a time, on the
    steady round of the observed loop (every slot as traced): the best neighbour while it
    shortens the round. With no better neighbour, the best neighbour all the same (the
    what-if then says what moving a layer costs). None when the split cannot be tried."""
    now = split_of(dep)
    if now is None or dep.pp < 2:
        return None
    memo: dict = {}

    def step_us(split):
        if split not in memo:
            memo[split] = run(resplit(dep, text(split)), frozenset(OBSERVED_CAUSES),
                              shape).tpot_ms
        return memo[split]
    cur, cur_t = now, step_us(now)
    first = min(neighbours(now), key=step_us, default=None)
    for _ in range(max_moves):
        cand = min(neighbours(cur), key=step_us, default=None)
        if cand is None or step_us(cand) >= cur_t:
            break
        cur, cur_t = cand, step_us(cand)
    return cur if cur != now else first


@dataclass(frozen=True)
class SplitFix:
    """The layer split recommended for a slow stage: `value` against the server's own `now`,
    on the model of the observed loop (every cause as observed): its decode step after, ms,
    and the change of tok/s it predicts, % (with its interval from the traced window's
    block bootstrap where the window kept blocks); how the layers and their cost were known."""
    value: str
    now: str
    step_ms: float
    gain_pct: float
    gain_ci: tuple[float, ...] | None
    layers_from: str
    cost_from: str
    # the window's interval alone, where `gain_ci` adds the lab's split error
    # (reports/model/observed/split_error.py), and where that error was measured
    gain_window_ci: tuple[float, ...] | None = None
    error_from: str = ""


def split_fix(dep: Deployment, full_ms: float, shape=None, replicates=(), error=None
              ) -> SplitFix | None:
    """The best split (best_split) and its predicted gain over the modelled step `full_ms`;
    `replicates`: the window's bootstrap deployments (reports/model/observed/resample.py),
    each tried at the same split; `error`: the lab's split error (split_error.SplitError),
    added to that interval. None where the split cannot be tried."""
    best = best_split(dep, shape=shape)
    if best is None:
        return None
    on = frozenset(OBSERVED_CAUSES)
    value = text(best)

    def gain(d: Deployment, full: float) -> float:
        return 100 * (full / run(resplit(d, value), on, shape).tpot_ms - 1)
    after = run(resplit(dep, value), on, shape).tpot_ms
    ci = None
    if replicates:
        from reports.model.observed.resample import percentile_interval
        lo, hi = percentile_interval([gain(d, run(d, on, shape).tpot_ms) for d in replicates])
        ci = (round(lo, 1), round(hi, 1))
    wide = widened(ci, error)
    return SplitFix(value, text(split_of(dep)), round(after, 3),
                    round(100 * (full_ms / after - 1), 1), wide, dep.layers_from or "-",
                    cost_from(dep), gain_window_ci=ci,
                    error_from=error.where() if error is not None and ci is not None else "")
