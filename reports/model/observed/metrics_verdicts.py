"""Verdicts from SGLang's `/metrics` alone: a window of two scrapes (microbench/sglang/
metrics_window.py; sglang.json `metrics_window`, reports/base/payloads/sglang.py `MetricsWindow`).

What each figure is, per PP rank over the window (every one labelled `observed (metrics)`):
- the share of each scheduler stage category in the rank's loop wall time
  (`scheduler_stage_seconds_total`, SGLang 0.5.23 srt/observability/scheduler_stage_metrics.py
  attributes each second of the loop to exactly one category);
- forward occupancy (`fwd_occupancy`, percent; SGLang replaced its bubble timer with it,
  sgl-project/sglang#24197): the bubble is 100 - occupancy where it is a number; where it reads
  NaN (it needs SGLang's device timer, metrics_reporter.py) the bubble is the share of the
  `idle` and `recv_requests` categories (waiting for work or for the previous stage);
- decode passes on a CUDA graph against all decode passes (`cuda_graph_passes_total`).

Verdicts:
- CUDA-graph fallback: no decode graph captured at start-up on any rank and none used: off by
  setting ("does not hold"); otherwise the lowest per-rank share of decode passes on a graph
  decides, as the log's share does (< 90%: holds).
- stage imbalance: the pipeline runs at its slowest stage's pace, so the slowest rank's
  `run_batch` seconds over the ranks' mean, minus one, is the time the others wait for it
  against an even split: >= 15% holds, < 5% does not hold (the model's thresholds,
  verdicts.py `_by_share`); minor between. Occupancy is cited beside where it is a number.
What /metrics cannot tell is said once (`CANNOT`).
"""
from __future__ import annotations

from reports.base.payloads.sglang import MetricsWindow
from reports.model.causes import HOLDS, MINOR, NOT

LABEL = "observed (metrics)"
EVIDENCE = f"sglang.json /metrics window ({LABEL})"
CANNOT = ("what /metrics cannot tell: the herd's slot sizes (how a burst of requests was split "
          "into micro-batches) and per-iteration waits; they need the server log (--log, with "
          "--decode-log-interval 1) or per-rank traces")
GRAPH_SHARE = 0.9            # as the log's share (verdicts.py graph_evidence)
SLOW_HOLDS, SLOW_NOT = 0.15, 0.05
WAITING = ("idle", "recv_requests")


def as_window(w) -> MetricsWindow | None:
    """The payload, from sglang.json's dict (CLI) or already typed (report)."""
    if w is None or isinstance(w, MetricsWindow):
        return w
    from reports.base.schema import from_json
    return from_json(MetricsWindow, w, "metrics_window", lax=True)


def _ranks(w: MetricsWindow):
    return sorted(w.ranks.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 1 << 30)


def bubble(r) -> tuple[float | None, str]:
    """(bubble share 0..1, how it was read) of one rank."""
    if r.fwd_occupancy_pct is not None:
        return 1 - r.fwd_occupancy_pct / 100, "1 - fwd_occupancy"
    total = sum(r.stage_s.values())
    if total <= 0:
        return None, "no loop time in the window"
    # a lower bound: waits SGLang files under `other` are not in it
    return sum(r.stage_s.get(c, 0.0) for c in WAITING) / total, "idle+recv share (at least)"


def window_table(w) -> str:
    """Per-rank figures of the window, for the terminal."""
    from tabulate import tabulate
    w = as_window(w)
    cats = sorted({c for _, r in w.ranks.items() for c in r.stage_s},
                  key=lambda c: (c != "run_batch", c))
    rows = []
    for k, r in _ranks(w):
        total = sum(r.stage_s.values())
        b, how = bubble(r)
        occ = ("NaN" if r.fwd_occupancy_nan else None) if r.fwd_occupancy_pct is None \
            else f"{r.fwd_occupancy_pct:.1f}"
        rows.append([k, total, r.stage_s.get("run_batch"), occ,
                     None if b is None else 100 * b, how, r.idle_s,
                     f"{r.decode_graph_passes:.0f}/{r.decode_passes:.0f}"]
                    + [100 * r.stage_s.get(c, 0.0) / total if total else None for c in cats])
    span = (f", {w.seconds:.1f} s" if w.seconds is not None else "")
    head = (f"/metrics window per PP rank ({LABEL}; {w.source}{span}"
            + ("; one scrape: the window is the server's life since start-up" if w.scrapes == 1
               else "") + ")")
    return (head + "\n" + tabulate(rows, headers=[
        "pp rank", "loop s", "run_batch s", "fwd occupancy %", "bubble %", "bubble from",
        "idle s", "decode on graph/all"] + [f"{c} %" for c in cats], floatfmt=".1f")
            + "".join(f"\ncaveat: {c}" for c in w.caveats) + f"\n{CANNOT}")


def window_lines(w) -> list[str]:
    """The window per rank in sentences, for the report's server section."""
    w = as_window(w)
    if w is None:
        return []
    out = []
    for k, r in _ranks(w):
        total = sum(r.stage_s.values())
        rb = r.stage_s.get("run_batch") or 0.0
        b, how = bubble(r)
        occ = (f"{r.fwd_occupancy_pct:.0f}%" if r.fwd_occupancy_pct is not None
               else "NaN" if r.fwd_occupancy_nan else "not exported")
        out.append(f"/metrics, PP rank {k} [{LABEL}]: run_batch {rb:.1f} s of {total:.1f} s in "
                   f"the loop ({rb / total:.0%})" if total else f"/metrics, PP rank {k} [{LABEL}]: "
                   "no loop time")
        out[-1] += (f", bubble {'-' if b is None else f'{b:.0%}'} ({how}), fwd_occupancy {occ}, "
                    f"idle {'-' if r.idle_s is None else f'{r.idle_s:.1f} s'}, decode passes on a "
                    f"CUDA graph {r.decode_graph_passes:.0f} of {r.decode_passes:.0f}.")
    out += [f"/metrics caveat [{LABEL}]: {c}." for c in w.caveats]
    return out + [CANNOT[0].upper() + CANNOT[1:] + "."]


def graph_verdict(w) -> tuple[str, str, str] | None:
    """(verdict, number, evidence) on CUDA-graph fallback; None without decode passes."""
    w = as_window(w)
    rs = [(k, r) for k, r in _ranks(w) if r.decode_passes > 0]
    if not rs:
        return None
    used = sum(r.decode_graph_passes for _, r in rs)
    captured = [r.graphs_captured for _, r in rs]
    if used == 0 and all(c is False for c in captured) and not (w.graph_capture_s or 0) > 0:
        n = sum(r.decode_passes for _, r in rs)
        return (NOT, f"off by setting: no decode CUDA graph captured at start-up on any PP "
                f"rank (graph_memory_usage_gb{{phase=decode}} 0, startup_cuda_graph_time_"
                f"seconds {w.graph_capture_s or 0:g}); 0 of {n:.0f} decode passes on a graph: "
                "eager on purpose, not a fallback", EVIDENCE)
    k, r = min(rs, key=lambda kr: kr[1].decode_graph_passes / kr[1].decode_passes)
    share = r.decode_graph_passes / r.decode_passes
    return (HOLDS if share < GRAPH_SHARE else NOT,
            f"lowest per-rank share of decode passes on a CUDA graph {share:.0%} (rank {k}: "
            f"{r.decode_graph_passes:.0f} of {r.decode_passes:.0f})", EVIDENCE)


def slow_stage(w) -> tuple[str, str, str, int] | None:
    """(verdict, number, evidence, slowest rank) on stage imbalance; None below two ranks with
    run_batch time."""
    w = as_window(w)
    rb = [(k, r.stage_s.get("run_batch") or 0.0) for k, r in _ranks(w)]
    rb = [(k, v) for k, v in rb if v > 0]
    if len(rb) < 2:
        return None
    k, top = max(rb, key=lambda kv: kv[1])
    mean = sum(v for _, v in rb) / len(rb)
    loss = top / mean - 1
    v = HOLDS if loss >= SLOW_HOLDS else NOT if loss < SLOW_NOT else MINOR
    occ = [(k2, r.fwd_occupancy_pct) for k2, r in _ranks(w) if r.fwd_occupancy_pct is not None]
    nan = [k2 for k2, r in _ranks(w) if r.fwd_occupancy_nan]
    return (v, f"slowest stage PP rank {k}: run_batch {top:.1f} s against the ranks' mean "
            f"{mean:.1f} s ({', '.join(f'rank {a} {b:.1f} s' for a, b in rb)}): the others wait "
            f"{loss:.0%} of an even split"
            + (("; fwd_occupancy " + ", ".join(f"rank {a} {b:.0f}%" for a, b in occ)) if occ
               else "") + (f"; fwd_occupancy NaN on rank(s) {', '.join(nan)}" if nan else ""),
            EVIDENCE, int(k))


def graph_share(w) -> float | None:
    """The lowest per-rank share of decode passes on a CUDA graph in the window."""
    w = as_window(w)
    rs = [r for _, r in _ranks(w) if r.decode_passes > 0] if w is not None else []
    return min((r.decode_graph_passes / r.decode_passes for r in rs), default=None)


def beside(number: str, verdict: str, other: tuple | None, share: float | None = None,
           other_share: float | None = None) -> str:
    """A verdict's number with the metrics' own beside it, and their disagreement said: another
    verdict, or (graphs) shares of decode work on a graph more than 10 points apart."""
    if other is None:
        return number
    text = f"{number}; /metrics ({LABEL}): {other[1]}"
    if other[0] != verdict:
        text += f" -- the evidence disagrees: /metrics says {other[0]!r}, this says {verdict!r}"
    elif share is not None and other_share is not None and abs(share - other_share) > 0.1:
        text += (f" -- the evidence disagrees: {share:.0%} on a graph here, {other_share:.0%} "
                 "in /metrics (another window or another server?)")
    return text
