"""Diagnose the observed server: where its time per decode step goes, and the named faults.

Input: the `Deployment` the evidence describes (reports/model/observed/deployment.py). The pipeline model
of that loop, with every cause as observed, gives `modelled`; with every cause at its reference
(deployment.REFERENCE) it gives `reference`. The gap is split over the causes by exact Shapley
values (reports/base/shapley.py) on the time per decode step, so the rows add up to
modelled - reference; `unexplained` = observed - modelled is its own row, and its size is said
on every run.

Each cause's **size** is the slowdown it causes within the model of the observed loop:
`ms / (modelled step - ms)` (a cause of size 50% makes the server 1.5x slower than it would be
without it). The answer names the largest cause above `NAME_PCT` with its size and the numbers
behind it (the slow rank's forward against the median rank's, the host time per visit against
the forward, occupied slots per cycle against pp, the eager share, the hop against its transfer
time); when none is above it, the answer is "nothing big".

How sure (reports/model/observed/resample.py): every figure of the model (each cause's ms per
step and size, the modelled step) gets a LEVEL interval from the traced window's block
bootstrap, the observed step one from the bench runs at C (Student's t over the runs), and
`unexplained` both combined. A cause is named only where its size's interval clears NAME_PCT;
one whose point is above it and whose interval is not is "within noise", and the answer says
what would decide it. A window the reader kept no blocks for is diagnosed as before, said so.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from statistics import median_low

from reports.base.shapley import shapley
from reports.model.observed import layer_split, resample, split_error
from reports.model.observed.bursts import BURST_SOURCE
from reports.model.observed.deployment import (OBSERVED_CAUSES, LABELS, REFERENCE, Deployment,
                                               at_size, run, window_differs)

NAME_PCT = 10.0   # a cause is named when its size (slowdown) is at least this
CPU_CAUSES = ("host", "relay")


@dataclass(frozen=True)
class CauseRow:
    cause: str
    label: str
    ms_per_step: float
    size_pct: float | None         # slowdown it causes (see module docstring)
    share_pct: float | None        # of the observed (else modelled) step
    reference: str
    detail: str
    ms_ci: tuple[float, ...] | None = None     # (lo, hi) at the diagnosis' interval level
    size_ci: tuple[float, ...] | None = None


@dataclass(frozen=True)
class AtConcurrency:
    concurrency: int


@dataclass(frozen=True)
class DiagnosisFigures:
    """What a diagnosis found at its concurrency; report.json's diagnosis part has these fields
    too, after its own (reports/model/report_type.py `ServerDiagnosis`)."""
    observed_tok_per_s: float | None
    modelled_tok_per_s: float
    reference_tok_per_s: float
    observed_step_ms: float | None
    modelled_step_ms: float
    reference_step_ms: float
    rows: tuple[CauseRow, ...]
    unexplained_ms: float | None
    unexplained_pct: float | None  # of the observed step
    answer: str
    named: tuple[str, ...]
    caveats: tuple[str, ...] = ()
    # traced CPU costs scaled to meet the observed step (an estimate; see `cpu_corrected`)
    cpu_scale: float | None = None
    corrected_rows: tuple[CauseRow, ...] = ()
    corrected_answer: str | None = None
    # how sure (module docstring): the level, the intervals, where they come from
    interval_level: float | None = None
    modelled_step_ci: tuple[float, ...] | None = None
    observed_step_ci: tuple[float, ...] | None = None
    unexplained_ci: tuple[float, ...] | None = None
    observed_runs: tuple[float, ...] = ()      # tok/s of each bench run at C
    within_noise: tuple[str, ...] = ()         # causes above NAME_PCT whose interval is not
    interval_note: str | None = None
    # where a slow stage is named: the layer split that balances the model of the loop
    # (reports/model/observed/layer_split.py), with its predicted gain
    layer_split: layer_split.SplitFix | None = None


@dataclass(frozen=True)
class Diagnosis(DiagnosisFigures, AtConcurrency):
    """The diagnosis at one concurrency: `concurrency`, then the figures (dataclass fields run
    from the last base to the first)."""


def details(dep: Deployment) -> dict[str, str]:
    """The numbers behind each cause, in words."""
    b_typ = max(dep.sizes)
    fw = [at_size(c, b_typ) for c in dep.forward_busy]
    med = median_low(fw)
    slow = max(range(dep.pp), key=lambda r: fw[r])
    waits = []
    for r, ts in dep.time_split.items():
        w, win = ts.get("comm_wait_us"), ts.get("window_us")
        if w is not None and win:
            waits.append(f"rank {r} waits {100 * w / win:.0f}% of the window in NCCL receives")
    host_r = max(range(dep.pp), key=lambda r: dep.host_us[r])
    relay_r = max(range(dep.pp), key=lambda r: dep.relay_us[r])
    eager = None if dep.graph_share is None else 1 - dep.graph_share
    gap = [at_size(f, b_typ) - at_size(g, b_typ) for f, g in zip(dep.forward, dep.forward_busy)]
    cpu = dep.device == "cpu"
    proc = (f" + {dep.process_us[host_r]:.0f} us processing results after it"
            if cpu and dep.process_us else "")
    return {
        "slow_stage": (f"rank {slow} forward ({'run_batch on the CPU' if cpu else 'kernels + GPU queueing'}) {fw[slow]:.0f} us at "
                       f"b={b_typ} vs median rank "
                       f"{med:.0f} us ({fw[slow] / med:.2f}x)" + ("; " + "; ".join(waits)
                                                                 if waits else "")),
        "host": (f"rank {host_r}: {dep.host_us[host_r]:.0f} us of host per visit on the critical "
                 f"path against a {fw[host_r]:.0f} us forward{proc}"
                 + ("" if dep.host_us[host_r] <= fw[host_r] else " (host-bound: CPU longer "
                    "than " + ("the forward" if cpu else "GPU") + " per visit)")),
        "relay": (f"rank {relay_r} blocked {dep.relay_us[relay_r]:.0f} us per visit handing the "
                  f"request list to rank {(relay_r + 1) % dep.pp} (that rank's CPU is late)"),
        "herd": (f"{dep.occupied} occupied slot(s) per cycle of {dep.slots} (pp = {dep.pp}), "
                 f"sizes {','.join(str(n) for n in dep.sizes if n)} for C = {dep.concurrency}"
                 + (" (the benchmark's first burst in the server's log)"
                    if dep.sources.get("sizes") == BURST_SOURCE else "")),
        "launch_gaps": ((f"{100 * eager:.0f}% of forwards eager" if eager is not None else
                         "graph share unknown")
                        + f"; {max(gap):.0f} us of launch gaps per forward (largest rank)"),
        "hop": ", ".join(f"hop {r}->{(r + 1) % dep.pp} {h:.0f} us" for r, h in
                         enumerate(dep.hop_us))
               + "".join(f"; rank {r} spends {w:.0f} us per visit sending its hidden states"
                         for r, w in enumerate(dep.send_us) if w >= 50)
               + "".join(f"; rank {r} waits {w:.0f} us per visit for data queued behind "
                         f"communication" for r, w in enumerate(dep.sync_wait_us) if w >= 50)
               + "".join(f"; rank {r}'s next forward waits {w:.0f} us for its own send"
                         for r, w in enumerate(dep.send_wait_us) if w >= 50),
    }


# a cause at least this share of the step is given as its share ("97% of the step"): "X%
# slower" is then a percentage of the small rest (97% of the step reads "3158% slower")
SHARE_WORDING = 0.5


def span(ci, fmt: str = ".0f", unit: str = "%") -> str:
    """" (lo-hi%)" for an interval, "" for none."""
    if not ci:
        return ""
    lo, hi = ci
    return f" ({lo:{fmt}}-{hi:{fmt}}{unit})" if lo >= 0 else f" ({lo:{fmt}} to {hi:{fmt}}{unit})"


def worded(ms: float, step: float, ci=None, ms_ci=None) -> str:
    """A cause's size for people: its share of the step when it is most of it, else how much
    slower it makes the server; `ci`: the size's interval (% slower), `ms_ci` the ms'."""
    if step > 0 and ms >= SHARE_WORDING * step:
        return (f"{100 * ms / step:.0f}% of the decode step ({ms:.2f}"
                + (f" ({ms_ci[0]:.2f}-{ms_ci[1]:.2f})" if ms_ci else "") + f" of {step:.2f} ms)")
    return (f"makes the server {100 * ms / (step - ms):.0f}% slower{span(ci)} ({ms:.2f} of "
            f"{step:.2f} ms per decode step)")


def _shapley_ms(dep: Deployment, shape) -> tuple[dict[str, float], float, float]:
    """(cause -> ms per step, modelled step, reference step) of one deployment."""
    players = list(OBSERVED_CAUSES)
    memo: dict = {}

    def step_ms(on: frozenset) -> float:
        if on not in memo:
            memo[on] = run(dep, on, shape).tpot_ms
        return memo[on]
    split = shapley(players, step_ms)
    return split, step_ms(frozenset(players)), step_ms(frozenset())


def _size(ms: float, base: float) -> float | None:
    return 100 * ms / (base - ms) if base - ms > 1e-9 else None


def window_intervals(dep: Deployment, shape) -> tuple[dict[str, tuple], dict[str, tuple],
                                                      tuple | None]:
    """({cause: ms interval}, {cause: size interval}, modelled step interval) from the
    window's block bootstrap; empty where it kept no blocks."""
    reps = [_shapley_ms(d, shape) for d in resample.replicates(dep)]
    if not reps:
        return {}, {}, None
    ms = {c: resample.percentile_interval([r[0][c] for r in reps]) for c in OBSERVED_CAUSES}
    size = {}
    for c in OBSERVED_CAUSES:
        v = [_size(r[0][c], r[1]) for r in reps]
        if all(x is not None for x in v):
            size[c] = resample.percentile_interval(v)
    return ms, size, resample.percentile_interval([r[1] for r in reps])


def _split(dep: Deployment, shape, cis=None
           ) -> tuple[list[CauseRow], float, float, str, tuple, tuple]:
    """Shapley rows (largest first), modelled and reference step, the answer, named causes,
    causes within noise. `cis`: window_intervals(dep)'s (ms, size) intervals, or None."""
    split, full, ref = _shapley_ms(dep, shape)
    ms_ci, size_ci = cis or ({}, {})
    obs_tps = dep.observed_tok_per_s
    obs_step = dep.concurrency / obs_tps * 1e3 if obs_tps else None
    base = full  # sizes within the model of the observed loop; `unexplained` says how far off
    det = details(dep)
    rows = []
    for c in OBSERVED_CAUSES:
        ms = split[c]
        rows.append(CauseRow(c, LABELS[c], ms, _size(ms, base), 100 * ms / (obs_step or full),
                             REFERENCE[c], det[c], _rounded(ms_ci.get(c), 3),
                             _rounded(size_ci.get(c), 1)))
    rows.sort(key=lambda r: -r.ms_per_step)
    big = [r for r in rows if r.size_pct is not None and r.size_pct >= NAME_PCT]
    named = tuple(r.cause for r in big if r.size_ci is None or r.size_ci[0] >= NAME_PCT)
    noise = tuple(r.cause for r in big if r.cause not in named)
    if named:
        top = next(r for r in rows if r.cause == named[0])
        answer = (f"{top.label}: {worded(top.ms_per_step, base, top.size_ci, top.ms_ci)}; "
                  f"{top.detail}")
    elif noise:
        top = next(r for r in rows if r.cause == noise[0])
        answer = (f"within noise: {top.label} {top.size_pct:.0f}%{span(top.size_ci)} could be "
                  f"under {NAME_PCT:.0f}%; to decide: a longer traced window (this one: "
                  f"{dep.blocks.count} blocks of the loop)")
    else:
        biggest = rows[0]
        answer = (f"nothing big: no cause is above {NAME_PCT:.0f}% (largest: {biggest.cause} "
                  f"{biggest.size_pct or 0:.0f}%{span(biggest.size_ci)})")
    return rows, full, ref, answer, named, noise


def _rounded(ci, nd: int) -> tuple[float, ...] | None:
    return None if ci is None else (round(ci[0], nd), round(ci[1], nd))


def cpu_scaled(dep: Deployment, k: float) -> Deployment:
    """The deployment with every traced CPU cost (host work, relay waits, empty visits) x k."""
    return replace(dep, host_us=tuple(k * v for v in dep.host_us),
                   relay_us=tuple(k * v for v in dep.relay_us), empty_us=tuple(k * v for v in dep.empty_us),
                   empty_relay_us=tuple(k * v for v in dep.empty_relay_us))


def cpu_corrected(dep: Deployment, obs_step: float, shape=None) -> float | None:
    """The factor k in (0, 1) on the traced CPU costs at which the model of the observed loop
    meets the observed step, or None when none does. The PyTorch profiler adds CPU overhead to
    every op it records (the request-list relay, the host's scheduling), not GPU time; a tok/s
    measured without it (bench_serving) is then faster than the traced loop. Bisection: the
    modelled step grows with k."""
    def step(k: float) -> float:
        return run(cpu_scaled(dep, k), frozenset(OBSERVED_CAUSES), shape).tpot_ms
    lo, hi = 0.0, 1.0
    if not step(lo) <= obs_step <= step(hi):
        return None
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if step(mid) < obs_step else (lo, mid)
    return (lo + hi) / 2


def observed_intervals(C: int, runs, full: float, full_ci) -> tuple[tuple | None, tuple | None]:
    """(observed step interval, unexplained interval), ms: the bench runs' t interval of their
    mean tok/s as a step, and the unexplained part's (its two halves' widths added in
    quadrature: the runs and the window vary independently). None under two runs."""
    tps = resample.runs_interval(runs)
    if tps is None or tps[0] <= 0:
        return None, None
    m = sum(runs) / len(runs)
    obs, lo, hi = C / m * 1e3, C / tps[1] * 1e3, C / tps[0] * 1e3
    mlo, mhi = full_ci if full_ci else (full, full)
    u = obs - full
    return ((round(lo, 3), round(hi, 3)),
            (round(u - ((obs - lo) ** 2 + (mhi - full) ** 2) ** 0.5, 3),
             round(u + ((hi - obs) ** 2 + (full - mlo) ** 2) ** 0.5, 3)))


def _interval_note(dep: Deployment, runs) -> str:
    w = (f"the traced window's block bootstrap ({dep.blocks.count} blocks, "
         f"{resample.REPLICATES} replicates)" if dep.blocks is not None and dep.blocks.count
         else None)
    b = (f"the {len(runs)} bench_serving runs at C={dep.concurrency} (Student's t)"
         if len(runs) >= 2 else None)
    said = " and ".join(x for x in (w, b) if x)
    lack = []
    if w is None:
        lack.append("the traced window kept no blocks (too short, or read by an older "
                    "ppscope: read its traces again)")
    if b is None:
        lack.append(f"{len(runs) or 'no'} bench run{'' if len(runs) == 1 else 's'} at "
                    f"C={dep.concurrency}: give two or more for the observed step's interval")
    return (f"{100 * resample.LEVEL:.0f}% intervals" + (f" from {said}" if said else "")
            + ("; none from " + "; ".join(lack) if lack else ""))


def diagnose(dep: Deployment, shape=None, runs: tuple[float, ...] = ()) -> Diagnosis:
    """The diagnosis of the observed loop; `runs`: tok/s of each bench run at its C."""
    ms_ci, size_ci, full_ci = window_intervals(dep, shape)
    rows, full, ref, answer, named, noise = _split(dep, shape, (ms_ci, size_ci))
    obs_tps = dep.observed_tok_per_s
    obs_step = dep.concurrency / obs_tps * 1e3 if obs_tps else None
    unexpl = obs_step - full if obs_step is not None else None
    obs_ci, un_ci = observed_intervals(dep.concurrency, runs, full, full_ci)
    caveats = []
    if any(c in CPU_CAUSES for c in named):
        caveats.append("host and rank-chaining rows come from traces recorded under the PyTorch "
                       "profiler, whose per-op CPU overhead lengthens host work and the waits it "
                       "causes: read them as upper bounds")
    k, c_rows, c_answer = None, (), None
    if unexpl is not None and obs_step and unexpl / obs_step < -NAME_PCT / 100:
        caveats.append(f"the model of the traced loop is {-100 * unexpl / obs_step:.0f}% slower "
                       "than the observed step: the traced run was slower than the one that "
                       "gave the tok/s (profiler overhead, or a different load); every size "
                       "here is then too large by about as much")
        k = cpu_corrected(dep, obs_step, shape)
        if k is not None:   # an estimate: the split again with the CPU costs that meet it
            c_rows, _, _, c_answer, _, _ = _split(cpu_scaled(dep, k), shape)
            c_rows = tuple(c_rows)
            caveats.append(f"with the traced CPU costs (host work, relay waits) scaled by "
                           f"{k:.2f} the model meets the observed step (estimated, as if the "
                           f"whole difference were profiler overhead): {c_answer}")
    split = (layer_split.split_fix(dep, full, shape, resample.replicates(dep),
                                   split_error.shipped())
             if "slow_stage" in named else None)
    off = window_differs(dep.window_concurrency, dep.concurrency, dep.forward[0])
    if off is not None:     # said first: every size below describes another load
        answer = f"{off}. Of that window: {answer}"
        caveats.insert(0, off)
    return Diagnosis(
        concurrency=dep.concurrency, observed_tok_per_s=obs_tps,
        modelled_tok_per_s=dep.concurrency / full * 1e3, reference_tok_per_s=dep.concurrency
        / ref * 1e3, observed_step_ms=obs_step, modelled_step_ms=full, reference_step_ms=ref,
        rows=tuple(rows), unexplained_ms=unexpl,
        unexplained_pct=None if unexpl is None else 100 * unexpl / obs_step,
        answer=answer, named=named, caveats=tuple(caveats), cpu_scale=k,
        corrected_rows=c_rows, corrected_answer=c_answer,
        interval_level=resample.LEVEL if (full_ci or obs_ci) else None,
        modelled_step_ci=_rounded(full_ci, 3), observed_step_ci=obs_ci,
        unexplained_ci=un_ci if unexpl is not None else None,
        observed_runs=tuple(float(x) for x in runs), within_noise=noise,
        interval_note=_interval_note(dep, runs), layer_split=split)


def time_split_rows(dep: Deployment) -> list[dict]:
    """Per rank: compute / communication transfer / communication wait / idle, % of the traced
    window (waiting inside an NCCL receive is never called busy)."""
    out = []
    for r, ts in sorted(dep.time_split.items(), key=lambda kv: int(kv[0])):
        win = ts.get("window_us") or 0.0
        pct = (lambda v: None if v is None or not win else 100 * v / win)
        out.append({"rank": int(r), "compute_pct": pct(ts.get("compute_us")),
                    "transfer_pct": pct(ts.get("comm_transfer_us")),
                    "wait_pct": pct(ts.get("comm_wait_us")),
                    "comm_pct": pct(ts.get("comm_us")),
                    "idle_pct": pct(ts.get("idle_us"))})
    return out


