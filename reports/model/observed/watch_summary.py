"""What a GPU watch (`watch.json`, reports/base/payloads/watch.py) says about the deployment.

From the per-GPU series: the distribution of activity and power per GPU; the fraction of
time k GPUs are busy at once (k = 0..n, busy = activity >= `BUSY_UTIL_PCT`); the lag at which
GPU i's activity follows GPU i-1's (the peak of the cross-correlation of their activity
series: the pipeline wave); PCIe (and NVLink) traffic against the link; and three hints with
their numbers. "Activity" is DCGM's SM active (as a %) where the record has it for every GPU
(at least half the ticks each), else NVML utilization, never a mix; PCIe bytes are DCGM's where
it gave them, else NVML's. The rules and thresholds are the same for both sources:

- `wave` (herd): at least half the GPUs idle in >= 60% of the ticks, some GPU busy in >= 20%, and
  every neighbour pair lagging the same way (lag > 0, peak correlation >= 0.3, lags within one
  utilization period of their median).
- `one_busy` (slow stage): the busiest GPU's mean utilization >= 1.5x the median of the others'
  and >= 20 points above it, or its mean power >= 1.3x the others' median.
- `all_low` (host-bound, or no load): every GPU under 30% utilization at once in >= 50% of ticks.
- `shared` (another process on a stage's GPU): a GPU ran two or more compute processes at once
  for >= 10% of the watch (NVML's process list; a PP deployment runs one rank per GPU, so a
  second process is someone else's work competing for that stage's SMs and memory bandwidth).
  This one does not depend on utilization at all: it names the processes, not their share.

GPUs are taken in index order as the pipeline's stage order (SGLang places PP rank r on the r-th
group of tp_size GPUs). Every hint is labelled `observed (NVML)` or `observed (DCGM)`: it is one
more piece of evidence for the diagnosis, and never overrules what the profiler traces show.
NVML utilization is not SM occupancy (`CAVEAT`), and SM active is an average over DCGM's period
(`CAVEAT_DCGM`), so these hints say where to look, not what the cause is.

CPU only; no numpy needed at this size.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from reports.base.payloads.watch import GpuSeries, WatchData

HINT_LABEL = "observed (NVML)"
HINT_LABEL_DCGM = "observed (DCGM)"
CAVEAT_DCGM = ("Busy here is DCGM's SM active: the fraction of time the SMs had at least one warp "
               "resident, averaged over all SMs and over DCGM's period ({period}), not NVML's "
               "\"a kernel ran\" utilization: a GPU spinning in an NCCL receive while it waits "
               "for its upstream stage holds only the SMs of its channels and reads low here, "
               "though it reads 100% in NVML. A resident warp may still be stalled, so SM active "
               "is an upper bound on useful work. Nothing shorter than DCGM's period is resolved.")
MIN_DCGM_SHARE = 0.5        # DCGM SM active is used when every GPU has it at this share of ticks
CAVEAT = ("NVML utilization is the share of the driver's sample period in which a kernel was "
          "running on the GPU, not SM occupancy: a GPU spinning in an NCCL receive while it "
          "waits for its upstream stage reads 100%, and power tells waiting from computing "
          "better. Nothing shorter than the driver's sample period ({period}) is resolved: a "
          "per-token pipeline wave of a few ms shows only as partial utilization.")

BUSY_UTIL_PCT = 50.0        # busy: at least half of the driver's window had a kernel running
LOW_UTIL_PCT = 30.0         # all_low: every GPU under this at once
WAVE_HALF_IDLE_SHARE = 0.6
WAVE_ACTIVE_SHARE = 0.2
WAVE_MIN_R = 0.3
ONE_BUSY_RATIO = 1.5
ONE_BUSY_GAP_PCT = 20.0
ONE_BUSY_POWER_RATIO = 1.3
ALL_LOW_SHARE = 0.5
SHARED_MIN_SHARE = 0.1      # shared: 2+ compute processes at once for this share of the watch
MIN_TICKS = 10              # fewer ticks than this: the hints say "not enough samples"
MAX_LAG_S = 10.0

# PCIe per-lane signalling rate (GT/s) and line coding by generation, from the PCI Express Base
# Specification (Gen1-2: 8b/10b; Gen3-5: 128b/130b; Gen6: FLIT mode, 242 of 256 bytes payload).
PCIE_GT_S = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
PCIE_CODING = {1: 8 / 10, 2: 8 / 10, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256}


def pcie_link_gbps(gen: int | None, width: int | None) -> float | None:
    """Datasheet bandwidth of a PCIe link, one direction, GB/s (1e9 bytes)."""
    if gen not in PCIE_GT_S or not width:
        return None
    return PCIE_GT_S[gen] * width * PCIE_CODING[gen] / 8


@dataclass(frozen=True)
class Dist:
    mean: float | None = None
    p10: float | None = None
    p50: float | None = None
    p90: float | None = None
    max: float | None = None
    n: int = 0


def percentile(xs: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def dist(values) -> Dist:
    xs = [v for v in values if v is not None]
    if not xs:
        return Dist()
    return Dist(mean=sum(xs) / len(xs), p10=percentile(xs, 10), p50=percentile(xs, 50),
                p90=percentile(xs, 90), max=max(xs), n=len(xs))


@dataclass(frozen=True)
class GpuStats:
    index: int
    name: str
    util_pct: Dist
    mem_util_pct: Dist
    power_w: Dist
    sm_mhz: Dist
    pcie_tx_gbps: Dist                  # DCGM's bytes where present (`pcie_source`), else NVML
    pcie_rx_gbps: Dist
    link_gbps: float | None             # one direction, GB/s
    link_source: str | None             # "given" or "datasheet (Gen5 x16)"
    pcie_pct_of_link: float | None      # busier direction's mean, % of the link
    lost_at_s: float | None = None
    unsupported: tuple[str, ...] = ()
    pcie_source: str = "nvml"           # nvml | dcgm
    sm_active_pct: Dist = Dist()        # DCGM (ratio x 100); n = 0 without DCGM
    sm_occupancy_pct: Dist = Dist()
    dram_active_pct: Dist = Dist()
    nvlink_tx_gbps: Dist = Dist()       # DCGM, GB/s (1e9 bytes)
    nvlink_rx_gbps: Dist = Dist()
    nvlink_pct_of_link: float | None = None   # against the given link bandwidth only


@dataclass(frozen=True)
class Lag:
    src: int                            # GPU index (stage i-1)
    dst: int                            # GPU index (stage i)
    lag_ticks: int | None               # > 0: dst's activity follows src's
    lag_s: float | None
    r: float | None                     # peak normalised cross-correlation


@dataclass(frozen=True)
class Hint:
    name: str                           # wave | one_busy | all_low
    holds: bool | None                  # None: not enough samples to say
    label: str
    rule: str
    text: str
    numbers: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WatchSummary:
    n_gpus: int                         # GPUs in the at-once figures (lost ones left out)
    ticks_used: int
    tick_s: float | None
    util_period_ms: float | None
    busy_threshold_pct: float
    k_busy_frac: tuple[float, ...]      # [k] = share of ticks with exactly k GPUs busy
    mean_busy_gpus: float | None
    all_low_frac: float | None
    gpus: tuple[GpuStats, ...]
    lags: tuple[Lag, ...]
    hints: tuple[Hint, ...]
    caveat: str
    achieved_hz: float | None
    cpu_pct_of_core: float | None
    notes: tuple[str, ...] = ()
    busy_source: str = "nvml util"      # what "busy" reads: "nvml util" or "dcgm sm_active"
    label: str = HINT_LABEL


def _gbps(xs) -> tuple[float | None, ...]:
    return tuple(None if v is None else v / 1e9 for v in xs)


def _pct(xs) -> tuple[float | None, ...]:
    return tuple(None if v is None else 100 * v for v in xs)


def _gpu_stats(g: GpuSeries, link_gbps: float | None) -> GpuStats:
    # DCGM's PCIe bytes (a per-second average over its period, every tick) are preferred to
    # NVML's 20 ms snapshots every couple of seconds
    dcgm_pcie = g.has("pcie_tx_bytes_per_s") or g.has("pcie_rx_bytes_per_s")
    if dcgm_pcie:
        tx, rx = dist(_gbps(g.pcie_tx_bytes_per_s)), dist(_gbps(g.pcie_rx_bytes_per_s))
    else:
        tx, rx = dist(g.pcie_tx_gbps), dist(g.pcie_rx_gbps)
    ntx, nrx = dist(_gbps(g.nvlink_tx_bytes_per_s)), dist(_gbps(g.nvlink_rx_bytes_per_s))
    nv_busiest = max((d.mean for d in (ntx, nrx) if d.mean is not None), default=None)
    if link_gbps is not None:
        link, src = link_gbps, "given"
    else:
        link = pcie_link_gbps(g.pcie_gen_max, g.pcie_width_max)
        src = f"datasheet (Gen{g.pcie_gen_max} x{g.pcie_width_max})" if link else None
    busiest = max((d.mean for d in (tx, rx) if d.mean is not None), default=None)
    return GpuStats(
        index=g.index, name=g.name, util_pct=dist(g.util_pct), mem_util_pct=dist(g.mem_util_pct),
        power_w=dist(g.power_w), sm_mhz=dist(g.sm_mhz), pcie_tx_gbps=tx, pcie_rx_gbps=rx,
        link_gbps=link, link_source=src,
        pcie_pct_of_link=None if busiest is None or not link else 100 * busiest / link,
        lost_at_s=g.lost_at_s, unsupported=tuple(g.unsupported),
        pcie_source="dcgm" if dcgm_pcie else "nvml",
        sm_active_pct=dist(_pct(g.sm_active)), sm_occupancy_pct=dist(_pct(g.sm_occupancy)),
        dram_active_pct=dist(_pct(g.dram_active)), nvlink_tx_gbps=ntx, nvlink_rx_gbps=nrx,
        nvlink_pct_of_link=None if nv_busiest is None or not link_gbps
        else 100 * nv_busiest / link_gbps)


def uses_sm_active(live: list[GpuSeries]) -> bool:
    """DCGM SM active drives the busy figures when every live GPU has it at >= MIN_DCGM_SHARE
    of its ticks; otherwise NVML utilization does, for every GPU (never a mix)."""
    return bool(live) and all(
        g.t_s and sum(v is not None for v in g.sm_active) >= MIN_DCGM_SHARE * len(g.t_s)
        for g in live)


def xcorr_lag(a: list[float], b: list[float], max_lag: int) -> tuple[int | None, float | None]:
    """Lag l (in samples) maximising corr(a[t], b[t + l]), l in [-max_lag, max_lag]: l > 0 means
    b follows a. Biased estimator (sums over the overlap, normalised by the whole series'
    variance), so a long lag must earn its peak; None when either series is flat."""
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    if n < 3:
        return None, None
    ma, mb = sum(a) / n, sum(b) / n
    da, db = [x - ma for x in a], [x - mb for x in b]
    den = math.sqrt(sum(x * x for x in da) * sum(x * x for x in db))
    if den == 0:
        return None, None
    best_l, best_r = None, -2.0
    for l in range(-max_lag, max_lag + 1):
        if l >= 0:
            num = sum(da[t] * db[t + l] for t in range(n - l))
        else:
            num = sum(da[t] * db[t + l] for t in range(-l, n))
        r = num / den
        if r > best_r + 1e-12 or (abs(r - best_r) <= 1e-12 and abs(l) < abs(best_l)):
            best_l, best_r = l, r
    return best_l, best_r


def summarize(d: WatchData, link_gbps: float | None = None,
              busy_pct: float = BUSY_UTIL_PCT) -> WatchSummary:
    """The watch's numbers and hints. `link_gbps`: measured or given link bandwidth (one
    direction); without it each GPU's PCIe link maximum from the datasheet table."""
    stats = tuple(_gpu_stats(g, link_gbps) for g in d.gpus)
    notes = []
    live = [g for g in d.gpus if g.lost_at_s is None]
    for g in d.gpus:
        if g.lost_at_s is not None:
            notes.append(f"GPU {g.index} lost at {g.lost_at_s:.1f} s ({g.lost_reason}): left out "
                         "of the at-once figures")
    for c, idx in d.unsupported_counters.items():
        notes.append(f"{c}: not supported on GPU {', '.join(map(str, idx))}")
    dcgm = uses_sm_active(live)
    if dcgm:
        period_ms = float(d.source.dcgm_period_ms) if d.source.dcgm_period_ms else None
        caveat = CAVEAT_DCGM.format(period=f"{period_ms:.0f} ms here" if period_ms
                                    else "not known for this record")
        activity = {g.index: _pct(g.sm_active) for g in live}
    else:
        periods = [g.util_period_ms for g in live if g.util_period_ms]
        period_ms = max(periods) if periods else None
        caveat = CAVEAT.format(period=f"{period_ms:.0f} ms here" if period_ms
                               else "not known for this record")
        activity = {g.index: g.util_pct for g in live}
        if any(g.has("sm_active") for g in live):
            notes.append("DCGM SM active is missing on some GPU or tick (under "
                         f"{MIN_DCGM_SHARE:.0%} of ticks): busy figures use NVML utilization")
    n_ticks = min((len(g.t_s) for g in live), default=0)
    ref = max(live, key=lambda g: len(g.t_s)) if live else None
    gaps = [b - a for a, b in zip(ref.t_s, ref.t_s[1:])] if ref else []
    tick_s = statistics.median(gaps) if gaps else None
    act = [activity[g.index] for g in live]
    used = [i for i in range(n_ticks) if all(a[i] is not None for a in act)]
    n = len(live)
    busy = [sum(1 for a in act if a[i] >= busy_pct) for i in used]
    k_frac = tuple(busy.count(k) / len(used) for k in range(n + 1)) if used else ()
    all_low = (sum(1 for i in used if all(a[i] < LOW_UTIL_PCT for a in act)) / len(used)
               if used else None)
    lags = []
    if len(used) >= 3 and tick_s:
        max_lag = max(1, min(len(used) // 4, int(MAX_LAG_S / tick_s)))
        series = []
        for a in act:    # ticks where any GPU has no value: that GPU's mean (no contribution)
            xs = [a[i] for i in range(n_ticks)]
            m = statistics.fmean(x for x in xs if x is not None)
            series.append([m if x is None else x for x in xs])
        for (ga, a), (gb, b) in zip(zip(live, series), list(zip(live, series))[1:]):
            l, r = xcorr_lag(a, b, max_lag)
            lags.append(Lag(src=ga.index, dst=gb.index, lag_ticks=l,
                            lag_s=None if l is None else round(l * tick_s, 6),
                            r=None if r is None else round(r, 4)))
    s = WatchSummary(
        n_gpus=n, ticks_used=len(used), tick_s=tick_s, util_period_ms=period_ms,
        busy_threshold_pct=busy_pct, k_busy_frac=k_frac,
        mean_busy_gpus=sum(busy) / len(busy) if busy else None, all_low_frac=all_low,
        gpus=stats, lags=tuple(lags), hints=(), caveat=caveat, achieved_hz=d.achieved_hz,
        cpu_pct_of_core=d.cpu_pct_of_core, notes=tuple(notes),
        busy_source="dcgm sm_active" if dcgm else "nvml util",
        label=HINT_LABEL_DCGM if dcgm else HINT_LABEL)
    live_stats = [st for st in stats if st.lost_at_s is None]
    return dataclasses.replace(s, hints=(_wave(s, tick_s), _one_busy(s, live_stats),
                                         _all_low(s, live_stats, d.load), _shared(d, s)))


def _enough(s: WatchSummary, need_gpus: int) -> str | None:
    if s.n_gpus < need_gpus:
        return f"needs {need_gpus} GPUs or more, the watch has {s.n_gpus}"
    if s.ticks_used < MIN_TICKS:
        return f"only {s.ticks_used} ticks with every GPU's {_word(s)} (needs {MIN_TICKS})"
    return None


def _wave(s: WatchSummary, tick_s: float | None) -> Hint:
    rule = (f"at least half the GPUs idle (< {s.busy_threshold_pct:g}%) in >= "
            f"{WAVE_HALF_IDLE_SHARE:.0%} of ticks, some GPU busy in >= {WAVE_ACTIVE_SHARE:.0%}, "
            f"and each GPU's {_word(s)} following the previous one's by a consistent lag "
            f"(> 0, correlation >= {WAVE_MIN_R})")
    why = _enough(s, 2)
    if why:
        return Hint("wave", None, s.label, rule, why)
    n = s.n_gpus
    half_idle = sum(f for k, f in enumerate(s.k_busy_frac) if k <= n / 2)
    active = sum(s.k_busy_frac[1:])
    lags = [x.lag_ticks for x in s.lags]
    rs = [x.r for x in s.lags]
    slack = 1
    if s.util_period_ms and tick_s:
        slack = max(1, round(s.util_period_ms / 1e3 / tick_s))
    consistent = bool(lags) and all(l is not None and l > 0 for l in lags) and \
        all(r is not None and r >= WAVE_MIN_R for r in rs) and \
        max(lags) - min(lags) <= 2 * slack
    holds = half_idle >= WAVE_HALF_IDLE_SHARE and active >= WAVE_ACTIVE_SHARE and consistent
    lag_s = [x.lag_s for x in s.lags]
    nums = {"half_idle_share": round(half_idle, 4), "active_share": round(active, 4),
            "lags_s": lag_s, "min_r": None if not rs or None in rs else min(rs)}
    lag_txt = ", ".join(f"{x.src}->{x.dst} {_s(x.lag_s)} (r {_f(x.r)})" for x in s.lags)
    text = (f"{'a wave passes from GPU to GPU' if holds else 'no pipeline wave'}: at least half "
            f"the GPUs idle {half_idle:.0%} of the time, some GPU busy {active:.0%}; lag per "
            f"neighbour {lag_txt or '-'}")
    return Hint("wave", holds, s.label, rule, text, nums)


def _one_busy(s: WatchSummary, st: list[GpuStats]) -> Hint:
    rule = (f"busiest GPU's mean {_word(s)} >= {ONE_BUSY_RATIO}x the others' median and >= "
            f"{ONE_BUSY_GAP_PCT:g} points above it, or its mean power >= "
            f"{ONE_BUSY_POWER_RATIO}x the others' median")
    why = _enough(s, 2)
    if why:
        return Hint("one_busy", None, s.label, rule, why)
    nums: dict[str, Any] = {}
    fired = None
    act = _act_metric(s)
    for metric, ratio_min, gap_min in ((act, ONE_BUSY_RATIO, ONE_BUSY_GAP_PCT),
                                       ("power_w", ONE_BUSY_POWER_RATIO, 0.0)):
        have = [x for x in st if getattr(x, metric).mean is not None]
        if len(have) < 2:
            continue
        top = max(have, key=lambda x: getattr(x, metric).mean)
        rest = statistics.median(getattr(x, metric).mean for x in have if x is not top)
        v = getattr(top, metric).mean
        ratio = v / rest if rest > 0 else (math.inf if v > 0 else 1.0)
        nums[metric] = {"gpu": top.index, "mean": round(v, 3), "others_median": round(rest, 3),
                        "ratio": None if math.isinf(ratio) else round(ratio, 4)}
        if fired is None and ratio >= ratio_min and v - rest >= gap_min:
            fired = (metric, top.index, v, rest, ratio)
    if not nums:
        return Hint("one_busy", None, s.label, rule, f"no {_word(s)} or power on two GPUs")
    if fired and act == "util_pct":
        # NVML utilization and power alone never call a PP rank busy: a rank spinning in an
        # NCCL receive reads ~100% and draws high power while it waits (sgl-project/sglang
        # #10489, ranks above 0); it takes SM activity (DCGM) or the traces to tell
        metric, gi, v, rest, ratio = fired
        unit = " W" if metric == "power_w" else "%"
        what = "utilization" if metric == "util_pct" else "power"
        return Hint("one_busy", None, s.label, rule,
                    f"not decided: GPU {gi} reads {v:.0f}{unit} {what} against {rest:.0f}{unit}, "
                    "but NVML utilization and power count a rank waiting in an NCCL receive as "
                    "busy (sgl-project/sglang#10489); needs DCGM's SM active (--watch-source "
                    "dcgm) or the ranks' traces (--traces)", nums)
    if fired:
        metric, gi, v, rest, ratio = fired
        unit = " W" if metric == "power_w" else "%"
        what = {"util_pct": "utilization", "sm_active_pct": "SM active"}.get(metric, "power")
        text = (f"GPU {gi} stands out: mean {what} {v:.0f}{unit} against {rest:.0f}{unit} for the "
                f"others' median ({'inf' if math.isinf(ratio) else f'{ratio:.2f}'}x)")
    else:
        u = nums.get(act) or nums.get("power_w")
        text = (f"no GPU stands out: busiest GPU {u['gpu']} at {u['ratio'] or 0:.2f}x the "
                "others' median")
    return Hint("one_busy", fired is not None, s.label, rule, text, nums)


def _all_low(s: WatchSummary, st: list[GpuStats], load: str | None) -> Hint:
    rule = (f"every GPU under {LOW_UTIL_PCT:g}% {_word(s)} at once in >= {ALL_LOW_SHARE:.0%} "
            "of ticks")
    why = _enough(s, 1)
    if why:
        return Hint("all_low", None, s.label, rule, why)
    share = s.all_low_frac or 0.0
    act = _act_metric(s)
    means = [getattr(x, act).mean for x in st if getattr(x, act).mean is not None]
    pw = [x.power_w.mean for x in st if x.power_w.mean is not None]
    holds = share >= ALL_LOW_SHARE
    nums = {"all_low_share": round(share, 4),
            f"mean_{act}": round(sum(means) / len(means), 3) if means else None,
            "mean_power_w": round(sum(pw) / len(pw), 3) if pw else None}
    text = f"every GPU under {LOW_UTIL_PCT:g}% at once {share:.0%} of the time"
    if holds:
        text += (" while the live load ran: the GPUs wait on the host" if load else
                 ": the host does not keep the GPUs fed, or no load ran during the watch")
    return Hint("all_low", holds, s.label, rule, text, nums)


def _shared(d: WatchData, s: WatchSummary) -> Hint:
    rule = (f"a GPU runs 2 or more compute processes at once for >= {SHARED_MIN_SHARE:.0%} of "
            "the watch (NVML's process list)")
    end = d.duration_s or 0.0
    seen = [g for g in d.gpus if g.processes]
    if not seen or end <= 0:
        return Hint("shared", None, s.label, rule, "no process list in the record")
    nums: dict[str, Any] = {}
    worst = None
    for g in seen:
        snaps = sorted(g.processes, key=lambda p: p.t_s)
        stop = g.lost_at_s if g.lost_at_s is not None else end
        multi, most, pids = 0.0, 0, {}
        for a, b in zip(snaps, snaps[1:] + [None]):
            t1 = min(stop, b.t_s if b is not None else stop)
            n = len(a.processes)
            most = max(most, n)
            if n >= 2:
                multi += max(0.0, t1 - a.t_s)
                for p in a.processes:
                    pids[p.pid] = p
        share = multi / end
        nums[str(g.index)] = {"max_processes": most, "shared_share": round(share, 4),
                              "pids": sorted(pids)}
        if share >= SHARED_MIN_SHARE and (worst is None or share > worst[1]):
            worst = (g.index, share, most, list(pids.values()))
    if worst is None:
        return Hint("shared", False, s.label, rule,
                    "every GPU ran at most one compute process at a time (or a second one for "
                    f"under {SHARED_MIN_SHARE:.0%} of the watch)", nums)
    gi, share, most, procs = worst
    who = ", ".join(f"pid {p.pid}" + (f" ({p.name})" if p.name else "")
                    + (f" {p.used_mib:.0f} MiB" if p.used_mib is not None else "")
                    for p in procs)
    return Hint("shared", True, s.label, rule,
                f"GPU {gi} ran {most} compute processes at once for {share:.0%} of the watch "
                f"({who}): another process competes with that stage for its SMs and memory "
                "bandwidth", nums)


def _act_metric(s: WatchSummary) -> str:
    """The GpuStats field the busy figures read: NVML utilization or DCGM SM active (%)."""
    return "sm_active_pct" if s.busy_source == "dcgm sm_active" else "util_pct"


def _word(s: WatchSummary) -> str:
    return "SM active" if s.busy_source == "dcgm sm_active" else "utilization"


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def timeline(d: WatchData, max_points: int = 400) -> dict[str, Any]:
    """Activity (what the busy figures read: DCGM SM active % or NVML utilization) and power per
    GPU in at most `max_points` bins (means), for the report's plot: report.json keeps this,
    not the raw series."""
    n = max((len(g.t_s) for g in d.gpus), default=0)
    step = max(1, math.ceil(n / max_points))
    dcgm = uses_sm_active([g for g in d.gpus if g.lost_at_s is None])

    def binned(xs):
        out = []
        for i in range(0, len(xs), step):
            v = [x for x in xs[i:i + step] if x is not None]
            out.append(round(sum(v) / len(v), 2) if v else None)
        return out
    return {"ticks_per_bin": step,
            "activity": "DCGM SM active" if dcgm else "NVML utilization",
            "gpus": [{"index": g.index, "t_s": [g.t_s[i] for i in range(0, len(g.t_s), step)],
                      "util_pct": binned(g.util_pct), "power_w": binned(g.power_w),
                      "activity_pct": binned(_pct(g.sm_active) if dcgm and g.sm_active
                                             else g.util_pct),
                      "lost_at_s": g.lost_at_s} for g in d.gpus]}


def watch_section(rec, link_gbps: float | None = None) -> dict[str, Any]:
    """report.json's `watch`: the summary, a binned timeline and which machine it describes."""
    from reports.base.schema import to_json
    d: WatchData = rec.payload
    s = summarize(d, link_gbps)
    return {"evidence": "watch.json", "source": s.label, "host": rec.provenance.host,
            "gpus": [g.name for g in d.gpus], "duration_s": d.duration_s, "load": d.load,
            "requested_hz": d.requested_hz, "dcgm_note": d.dcgm_note,
            "counter_source": to_json(d.source),
            "summary": to_json(s), "timeline": timeline(d)}
