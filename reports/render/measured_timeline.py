"""A few decode rounds of the dispatch probe's measured pipeline, from results/dispatch.trace.json.

What it reads: the Chrome trace the dispatch probe writes next to dispatch.json (one process per
stage with a `GPU forward` track, tid 1; one `slots` process with a track per slot, tid 100+s;
one instant event per measured point, named `"<policy> <arrival> C=<n>"`). Every GPU forward is
a complete event whose args carry the loop iteration `it`, `slot`, `kind` (prefill / decode) and
`n` (requests in the micro-batch).

Why: the report shows the simulated timeline of the model; this is the measured one beside it,
so a herd (one slot full, the others empty: long gaps between forwards) is seen, not inferred.

How: the trace is read once (json, size-capped: the probe writes at most ~300 ms per point, about
1-2 MB), one point is chosen (SGLang's admission at the largest concurrency not above the
report's, else the largest), and its GPU forwards are kept for `rounds` visits of every slot,
starting one round after the last prefill (steady decode: a prefill still running on a later
stage delays the first decodes). Returns `Span`s (the
simulated timeline's type) with times from the window's first forward, so the same plot code
draws both. Numbers here are measured by the probe; nothing is modelled.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from reports.model.sim.pipeline_model import Span
from reports.model.report_type import TimelineSummary

MAX_TRACE_BYTES = 64 << 20  # the probe's own traces are ~1-2 MB; a bigger file is not one
_POINT_RE = re.compile(r"^(?P<policy>\S+) (?P<arrival>\S+) C=(?P<c>\d+)$")
GPU_TID = 1
SLOT_TID0 = 100


@dataclass(frozen=True)
class MeasuredTimeline:
    file: str
    point: str            # "<policy> <arrival> C=<n>"
    concurrency: int
    slots: int
    rounds: int
    first_it: int
    spans: tuple[Span, ...]
    points: tuple[str, ...]   # every point in the trace

    @property
    def window_ms(self) -> float:
        if not self.spans:
            return 0.0
        return max(s.end_us for s in self.spans) / 1e3

    def summary(self) -> TimelineSummary:
        ranks = sorted({s.rank for s in self.spans})
        busy = {}
        w = self.window_ms * 1e3
        for r in ranks:
            sp = [s for s in self.spans if s.rank == r]
            busy[str(r)] = sum(s.end_us - s.start_us for s in sp) / w if w > 0 else None
        return TimelineSummary(self.file, self.point, self.concurrency, self.slots,
                               self.rounds, self.first_it, len(self.spans), self.window_ms,
                               busy, tuple(self.points))


def choose_point(points: list[str], max_c: int | None = None) -> str | None:
    """SGLang admission first, then the largest C not above max_c (else the largest C)."""
    parsed = [(p, m) for p in points if (m := _POINT_RE.match(p))]
    if not parsed:
        return points[0] if points else None  # an unlabelled trace: its one point

    def key(pm):
        p, m = pm
        c = int(m["c"])
        fits = max_c is None or c <= max_c
        return (m["policy"] == "sglang", fits, c if fits else -c)
    return max(parsed, key=key)[0]


def read_dispatch_trace(path: str | Path, rounds: int = 4,
                        max_c: int | None = None) -> tuple[MeasuredTimeline, ...]:
    """The chosen point's GPU forwards over `rounds` slot rounds, then (when the trace has it)
    the same arrival and C under the other admission policy, for contrast; () when the trace has
    no GPU forward. Raises ValueError (one line) for an unreadable or oversized file."""
    p = Path(path)
    fwd, slots, pts = _load(p)
    chosen = choose_point(list(pts), max_c)
    if chosen is None:
        return ()
    out = [chosen]
    m = _POINT_RE.match(chosen)
    if m:
        out += [q for q in pts if q != chosen and (n := _POINT_RE.match(q))
                and n["arrival"] == m["arrival"] and n["c"] == m["c"]][:1]
    tls = (_window(p.name, fwd, q, slots, rounds, tuple(pts)) for q in out)
    return tuple(t for t in tls if t is not None)


def _load(p: Path) -> tuple[list[dict], int | None, dict[str, None]]:
    try:
        size = p.stat().st_size
    except OSError as e:
        raise ValueError(f"{p.name}: cannot read ({e.strerror})") from None
    if size > MAX_TRACE_BYTES:
        raise ValueError(f"{p.name}: {size / 1e6:.0f} MB, more than a dispatch probe trace "
                         f"({MAX_TRACE_BYTES >> 20} MiB); not plotted")
    try:
        doc = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{p.name}: not a readable Chrome trace ({e})") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise ValueError(f"{p.name}: no traceEvents array")
    fwd: list[dict] = []
    slot_tracks: set[int] = set()
    pts: dict[str, None] = {}
    for e in events:
        if not isinstance(e, dict):
            continue
        ph = e.get("ph")
        if ph == "X" and e.get("tid") == GPU_TID and isinstance(e.get("args"), dict):
            a = e["args"]
            if isinstance(a.get("it"), int) and isinstance(e.get("ts"), (int, float)):
                fwd.append(e)
                pts.setdefault(str(a.get("point") or ""), None)
        elif ph == "M" and e.get("name") == "thread_name" and \
                isinstance(e.get("tid"), int) and e["tid"] >= SLOT_TID0:
            slot_tracks.add(e["tid"] - SLOT_TID0)
    return fwd, (len(slot_tracks) or None), pts


def _window(file: str, fwd: list[dict], point: str, slots: int | None, rounds: int,
            points: tuple[str, ...]) -> MeasuredTimeline | None:
    sel = [e for e in fwd if str(e["args"].get("point") or "") == point]
    if not sel:
        return None
    slots = slots or 1 + max(int(e["args"].get("slot", 0)) for e in sel)
    pre = [e["args"]["it"] for e in sel if e["args"].get("kind") == "prefill"]
    # steady decode: skip one full round after the last prefill (a long prefill on a later
    # stage still delays the first decodes behind it)
    first = (max(pre) + 1 + slots) if pre else min(e["args"]["it"] for e in sel)
    win = [e for e in sel if first <= e["args"]["it"] < first + rounds * slots]
    if not win:
        return None
    t0 = min(float(e["ts"]) for e in win)
    spans = tuple(sorted(
        (Span(rank=int(e.get("pid", 0)), slot=int(e["args"].get("slot", 0)),
              batch=int(e["args"].get("n", 0)), start_us=float(e["ts"]) - t0,
              end_us=float(e["ts"]) - t0 + float(e.get("dur", 0.0)))
         for e in win), key=lambda s: (s.start_us, s.rank)))
    m = _POINT_RE.match(point)
    return MeasuredTimeline(file=file, point=point, concurrency=int(m["c"]) if m else 0,
                            slots=slots, rounds=rounds, first_it=first, spans=spans,
                            points=points)
