"""The change between two runs of one server, split by one Shapley split over what differs.

Input: the observed loops of both runs (report.json's `diagnosis.deployment`, both read by
reports/model/observed/deployment.py from SGLang's own traces). Output: per cause, its share of the
modelled change, and per rank the forward at the same micro-batch size then and now.

How it is split: each cause owns part of the loop's inputs (FIELDS). `value(S)` is the model of
the observed loop (reports/model/observed/deployment.py `run`, every cause on) with the inputs of the
causes in S taken from this run and the rest from the baseline; a cause's share is its exact
Shapley value over the causes whose inputs differ (reports/base/shapley.py). The
shares add up to value(all) - value(none), the modelled change, in any order of the causes.
Subtracting each side's own split (the cause's size against an ideal loop, then and now)
undersizes a large fault: a cause interacts with the others (a slow rank also lengthens the
other rank's waits), and that interaction is split differently on each side.
"""
from __future__ import annotations

from dataclasses import replace

from reports.base.shapley import shapley
from reports.model.observed.deployment import OBSERVED_CAUSES, Deployment, at_size, run
from reports.model.report_type import ForwardRow, ObservedLoop

# which Deployment fields each cause owns (forward = kernels + gaps: `busy` is the slow stage's,
# the gaps between launches are launch_gaps')
FIELDS = {
    "slow_stage": ("forward_busy",),
    "launch_gaps": ("gaps",),
    "host": ("host_us", "empty_us", "process_us"),
    "relay": ("relay_us", "empty_relay_us"),
    "herd": ("sizes",),
    "hop": ("hop_us", "send_wait_us", "sync_wait_us", "send_us"),
}


def deployment_of(v: ObservedLoop, concurrency: int) -> Deployment | None:
    """The deployment a report's observed loop describes; None when the report predates the
    fields a split needs (forward kernels, per-rank empty visits)."""
    if v is None or not v.forward_busy_us or not isinstance(v.empty_us, (tuple, list)):
        return None

    def curves(cs) -> tuple[dict[int, float], ...]:
        return tuple({int(b): float(x) for b, x in c.items()} for c in cs)
    zeros = tuple(0.0 for _ in range(v.pp))
    return Deployment(
        pp=v.pp, slots=v.slots, sizes=tuple(v.sizes), forward=curves(v.forward_us),
        forward_busy=curves(v.forward_busy_us), host_us=tuple(v.host_us),
        relay_us=tuple(v.relay_us), sync_wait_us=tuple(v.sync_wait_us),
        empty_us=tuple(v.empty_us), empty_relay_us=tuple(v.empty_relay_us) or zeros,
        hop_us=tuple(v.hop_us), send_wait_us=tuple(v.send_wait_us),
        graph_share=v.graph_share, concurrency=concurrency, observed_tok_per_s=None,
        device=v.device, send_us=tuple(v.send_us), process_us=tuple(v.process_us),
        blocks=v.blocks)


def _gaps(d: Deployment) -> tuple[dict[int, float], ...]:
    return tuple({b: max(0.0, f[b] - at_size(c, b)) for b in f} for f, c in
                 zip(d.forward, d.forward_busy))


def mixed(now: Deployment, base: Deployment, on: frozenset) -> Deployment:
    """The baseline with the inputs of the causes in `on` taken from this run."""
    pick = {f: (now if c in on else base) for c, fs in FIELDS.items() for f in fs}
    busy, gsrc = pick["forward_busy"], pick["gaps"]
    gaps = _gaps(gsrc)
    forward = tuple({b: at_size(c, b) + at_size(g, b) if g else at_size(c, b)
                     for b in sorted(set(c) | set(g))}
                    for c, g in zip(busy.forward_busy, gaps))
    kw = {f: getattr(src, f) for f, src in pick.items() if f not in ("forward_busy", "gaps")}
    return replace(base, forward=forward, forward_busy=busy.forward_busy, **kw)


def differing(now: Deployment, base: Deployment) -> list[str]:
    """The causes whose inputs differ between the two runs."""
    g_now, g_base = _gaps(now), _gaps(base)
    out = []
    for c, fs in FIELDS.items():
        if c == "launch_gaps":
            if g_now != g_base:
                out.append(c)
        elif any(getattr(now, f) != getattr(base, f) for f in fs if f != "gaps"):
            out.append(c)
    return [c for c in OBSERVED_CAUSES if c in out]


def split_change(now: Deployment, base: Deployment) -> tuple[dict[str, float], float, float]:
    """(cause -> ms per decode step of the modelled change, modelled step then, now). Both
    runs must be one loop (pp, slots): the caller checks."""
    memo: dict[frozenset, float] = {}
    every = frozenset(OBSERVED_CAUSES)

    def step(on: frozenset) -> float:
        if on not in memo:
            memo[on] = run(mixed(now, base, on), every).tpot_ms
        return memo[on]
    players = differing(now, base)
    parts = shapley(players, step) if players else {}
    return ({c: parts.get(c, 0.0) for c in OBSERVED_CAUSES}, step(frozenset()),
            step(frozenset(players)))


def forward_rows(now: ObservedLoop | None, base: ObservedLoop | None
                 ) -> tuple[ForwardRow, ...]:
    """Per rank, the forward then and now at each micro-batch size either run traced that
    lies within both runs' traced sizes: traced, or interpolated in log(b) between that run's
    traced sizes (deployment.at_size); never extrapolated."""
    out: list[ForwardRow] = []
    if now is None or base is None:
        return ()
    for r, (c_now, c_base) in enumerate(zip(now.forward_us, base.forward_us)):
        cn = {int(b): float(v) for b, v in c_now.items()}
        cb = {int(b): float(v) for b, v in c_base.items()}
        if not (cn and cb):
            continue
        lo, hi = max(min(cn), min(cb)), min(max(cn), max(cb))
        for b in sorted(b for b in set(cn) | set(cb) if lo <= b <= hi):
            a, z = at_size(cb, b), at_size(cn, b)
            if a > 0:
                out.append(ForwardRow(r, b, a, z, 100.0 * (z - a) / a))
    return tuple(out)
