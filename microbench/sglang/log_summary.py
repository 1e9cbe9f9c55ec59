"""The scanned batch lines summarised per PP rank (and DP rank): slot sizes, graph share,
throughput over time, prefill waves, runtime config overrides (microbench/sglang/log.py)."""
from __future__ import annotations

import ast
import math
from typing import Iterable

import numpy as np

from microbench.sglang.log_scan import LogScan, RankGroup, time_order


def _num(x):
    """A numpy scalar as a plain int or float for JSON."""
    return x.item() if hasattr(x, "item") else x


def _q(vals: np.ndarray) -> dict:
    if not len(vals):
        return {"min": None, "median": None, "max": None}
    return {"min": _num(vals.min()), "median": float(np.median(vals)), "max": _num(vals.max())}


def _windows(sizes: np.ndarray, window: int) -> np.ndarray:
    k = len(sizes) // window
    if k == 0:
        return np.zeros(0)
    w = sizes[:k * window].reshape(k, window).astype(np.float64)
    mean = w.mean(axis=1)
    keep = mean > 0
    return w.max(axis=1)[keep] / mean[keep]


def _cv(sizes: np.ndarray) -> float | None:
    mean = float(sizes.mean()) if len(sizes) else 0.0
    return float(sizes.astype(np.float64).std() / mean) if len(sizes) > 1 and mean > 0 else None


def slot_imbalance(sizes, window: int) -> dict:
    """max/mean of slot sizes per window of `window` consecutive decode lines (median over
    windows) and the coefficient of variation of all sizes. See the module docstring."""
    sizes = np.asarray(sizes)
    ratios = _windows(sizes, window)
    return {"window": window, "windows": len(ratios),
            "max_over_mean_median": float(np.median(ratios)) if len(ratios) else None,
            "cv": _cv(sizes)}


def _cat(arrays: list[np.ndarray]) -> np.ndarray:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _throughput_series(dec: list[tuple], bin_s: float) -> list[dict]:
    t = _cat([d[0] for d in dec])
    known = ~np.isnan(t)
    if not known.any():
        return []
    t = t[known]
    gen = _cat([d[2] for d in dec])[known]
    size = _cat([d[1] for d in dec])[known].astype(np.float64)
    queue = _cat([d[3] for d in dec])[known].astype(np.float64)
    b = np.floor((t - t.min()) / bin_s).astype(np.int64)
    bins, inv, n = np.unique(b, return_inverse=True, return_counts=True)
    inv = inv.ravel()
    sums = [np.bincount(inv, weights=w, minlength=len(bins)) for w in (gen, size, queue)]
    return [{"t_s": float(k * bin_s), "lines": int(c),
             "gen_throughput_tok_s": float(sums[0][j] / c),
             "running_req_mean": float(sums[1][j] / c), "queue_req_mean": float(sums[2][j] / c)}
            for j, (k, c) in enumerate(zip(bins, n))]


PREFILL_WAVES = 64    # prefill lines kept one by one per rank (the first ones, in time order)


def _waves(groups: list[RankGroup]) -> dict:
    """What the prefill lines of one PP rank (all its DP ranks, in clock order) say about
    admission: each prefill batch admits `#new-seq` waiting requests, so the sequence of
    #new-seq is how arrivals were split (8 requests sent at once, admitted as 6 then 2: two
    prefills, and under PP two micro-batch slots of 6 and 2)."""
    cols = [np.concatenate(c) for c in zip(*(g.prefill() for g in groups))]
    t, seq, tok, cached, running, queue = time_order(cols) if len(groups) > 1 else cols
    vals, counts = np.unique(seq, return_counts=True)
    k = min(len(seq), PREFILL_WAVES)
    return {
        "prefill_new_seq_total": int(seq.sum()),
        "prefill_cached_tokens": int(cached[cached >= 0].sum()),
        "prefill_new_seq_hist": {str(v): int(c) for v, c in zip(vals, counts)},
        "prefill_waves": [
            {"t_s": None if math.isnan(t[i]) else float(t[i]), "new_seq": int(seq[i]),
             "new_token": int(tok[i]), "cached_token": None if cached[i] < 0 else int(cached[i]),
             "running_req": None if running[i] < 0 else int(running[i]),
             "queue_req": int(queue[i])} for i in range(k)],
    }


def _summary(groups: list[RankGroup], dec: list[tuple], window: int) -> dict:
    sizes = _cat([d[1] for d in dec])
    graph = _cat([d[4] for d in dec])
    logged = graph >= 0
    if len(dec) == 1:
        imb = slot_imbalance(dec[0][1], window)
    else:   # windows within each DP rank's scheduler, pooled; cv per scheduler, median
        ratios = np.concatenate([_windows(d[1], window) for d in dec])
        cvs = [c for c in (_cv(d[1]) for d in dec) if c is not None]
        imb = {"window": window, "windows": len(ratios),
               "max_over_mean_median": float(np.median(ratios)) if len(ratios) else None,
               "cv": float(np.median(cvs)) if cvs else None}
    spans = [d[5] for d in dec if d[5] is not None]
    return {
        "decode_lines": len(sizes),
        "prefill_lines": sum(g.prefills for g in groups),
        "running_req": _q(sizes),
        "cuda_graph_frac": float((graph[logged] == 1).mean()) if logged.any() else None,
        # which `{device} graph: B` field the decode lines logged ("cuda", "cpu", ...: SGLang
        # names it by device); the share above is of that device's graph path
        "graph_device": ",".join(sorted(set().union(*(g.labels for g in groups)))) or None,
        "gen_throughput_tok_s": _q(_cat([d[2] for d in dec])),
        "queue_req": _q(_cat([d[3] for d in dec])),
        "prefill_new_tokens": sum(g.new_tokens for g in groups),
        **_waves(groups),
        "span_s": (max(b for _, b in spans) - min(a for a, _ in spans)) if spans else None,
        "slot_imbalance": imb,
    }


OVERRIDE_SAME_S = 5.0   # one POST reaches every scheduler within moments: one change


def _override_dict(text: str) -> dict:
    """The logged overrides as {key: value} (values JSON can hold; others as their repr);
    empty when the text is not a dict literal (it is kept as logged beside it)."""
    try:
        d = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return {}
    if not isinstance(d, dict):
        return {}
    ok = (str, int, bool, type(None))
    return {str(k): v if isinstance(v, ok) or isinstance(v, float) and math.isfinite(v)
            else repr(v) for k, v in d.items()}


def config_overrides(events: Iterable[tuple]) -> list[dict]:
    """Runtime setting changes (see OVERRIDE_WORD) in clock order: `t_s` (log clock, seconds
    since the epoch read as UTC, None without a clock), `clock` (as logged), `ranks` (the PP
    ranks whose scheduler logged it; file index without PP tags), `overrides` (the settings and
    their new values), `text` (the dict as logged). The same change logged by several
    schedulers within OVERRIDE_SAME_S seconds is one."""
    out: list[dict] = []
    for t, clock, rank, text in sorted(events, key=lambda e: (e[0] is None, e[0] or 0.0)):
        same = next((e for e in reversed(out) if e["text"] == text and (
            e["t_s"] is None and t is None
            or e["t_s"] is not None and t is not None and t - e["t_s"] <= OVERRIDE_SAME_S)),
            None)
        if same is None:
            out.append({"t_s": t, "clock": clock, "ranks": [rank],
                        "overrides": _override_dict(text), "text": text})
        elif rank not in same["ranks"]:
            same["ranks"] = sorted(same["ranks"] + [rank])
    return out


def summarize(scan: LogScan, window: int = 16, bin_s: float = 10.0) -> dict:
    """The `ranks` / `slot_imbalance` part of sglang.json from a scan."""
    # rank -> dp -> the (attn_cp, tp) groups of that scheduler; keep the lowest (same batch)
    by_rank: dict[int, dict] = {}
    for (rank, dp, cp, tp), g in scan.groups.items():
        by_rank.setdefault(rank, {}).setdefault(dp, []).append(((cp or 0, tp or 0), g))
    ranks = {}
    skipped = 0
    best = None    # (decode lines, rank, dp, decode arrays) of the scheduler with most lines
    for r in sorted(by_rank):
        kept: dict = {}
        for dp, gs in by_rank[r].items():
            gs.sort(key=lambda x: x[0])
            kept[dp] = gs[0][1]
            skipped += sum(g.lines for _, g in gs[1:])
        dps = sorted(kept, key=lambda d: -1 if d is None else d)
        dec = {x: kept[x].decode() for x in dps}
        d = _summary([kept[x] for x in dps], [dec[x] for x in dps], window)
        d["dp_ranks"] = [x for x in dps if x is not None]
        d["over_time"] = _throughput_series([dec[x] for x in dps], bin_s)
        if dps != [None]:
            d["by_dp"] = {str(x): _summary([kept[x]], [dec[x]], window)
                          for x in dps if x is not None}
        ranks[str(r)] = d
        for x in dps:
            n = len(dec[x][1])
            if best is None or n > best[0]:
                best = (n, r, x, dec[x])
    run = None
    if best is not None and best[0] > 0:
        # run-wide index: the scheduler with the most decode lines (every rank sees the same
        # slots)
        run = {"rank": best[1], "dp": best[2], **slot_imbalance(best[3][1], window)}
    return {
        "log_files": list(scan.files),
        "lines_total": scan.lines_total,
        "lines_batch": scan.lines_batch - skipped,
        "lines_other": scan.lines_other,
        "lines_unrecognised": scan.lines_unrecognised,
        "lines_other_tp": skipped,
        "files_without_batch_lines": list(scan.files_without_batch_lines),
        "ranks": ranks,
        "slot_imbalance": run,
        "config_overrides": config_overrides(scan.overrides),
    }
