"""The simulated pipeline timeline as a Chrome/Perfetto trace (open in ui.perfetto.dev).

One track per PP rank's GPU; one complete event ("ph": "X", microseconds) per forward, named
by slot and micro-batch size, so a herd shows up as a few long blocks with gaps between them.
"""
from __future__ import annotations

from typing import Any

from reports.model.sim.pipeline_model import Span


def trace_events(spans: tuple[Span, ...], pid: int = 0, label: str = "") -> list[dict[str, Any]]:
    ev: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": pid,
                                 "args": {"name": label or "simulated PP loop"}}]
    for r in sorted({s.rank for s in spans}):
        ev.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": r,
                   "args": {"name": f"PP rank {r} GPU"}})
    for s in spans:
        ev.append({"name": f"slot {s.slot} (b={s.batch})", "ph": "X", "pid": pid, "tid": s.rank,
                   "ts": round(s.start_us, 3), "dur": round(s.end_us - s.start_us, 3),
                   "args": {"slot": s.slot, "batch": s.batch}})
    return ev


def chrome_trace(per_concurrency: dict[int, tuple[Span, ...]]) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    for pid, (C, spans) in enumerate(sorted(per_concurrency.items())):
        events += trace_events(spans, pid, f"simulated PP loop, C={C}")
    return {"traceEvents": events, "displayTimeUnit": "ms"}
