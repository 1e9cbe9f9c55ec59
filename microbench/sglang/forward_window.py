"""A few rounds of every rank's traced forwards, kept in the loop profile to draw the loop as it ran.

What it keeps: from the middle of the traced window (the ramp at its start and the tail at its
end left out), rank 0's next `MAX_PER_RANK` forwards and, on every other rank, the forwards that
start while those run; each as `LoopForward` (rank, loop iteration, batch size, mode, start and
end from the kept window's first forward). The traces of one host share a clock (the ranks'
offsets are taken off before this: microbench/sglang/steps.py `read_loop`).

Why capped: a traced window holds thousands of forwards per rank; a drawing needs a few rounds
of the slots, and sglang.json stays a few kB larger, not megabytes.

Input: rank -> the reader's per-forward dicts (`start`, `end`, `batch`, `mode`, `visit`), from
microbench/sglang/steps.py (GPU traces) or cpu_steps.py (SGLang's CPU backend).
"""
from __future__ import annotations

MAX_PER_RANK = 32      # forwards of rank 0 kept: a few rounds of up to 16 slots


def keep(fwds: dict[int, list[dict]], max_per_rank: int = MAX_PER_RANK) -> list[dict]:
    """The kept forwards as LoopForward fields, by start time; [] without a forward on the
    first rank or without iteration numbers."""
    order = sorted(fwds)
    if not order:
        return []
    first = sorted((f for f in fwds[order[0]] if f.get("visit") is not None),
                   key=lambda f: f["start"])
    if not first:
        return []
    lo = max(0, (len(first) - max_per_rank) // 2)
    sel = first[lo:lo + max_per_rank]
    t0, t1 = sel[0]["start"], sel[-1]["end"]
    rows = []
    for r in order:
        rank_sel = sel if r == order[0] else [
            f for f in sorted(fwds[r], key=lambda f: f["start"])
            if f.get("visit") is not None and t0 <= f["start"] < t1][:max_per_rank]
        for f in rank_sel:
            rows.append({"rank": r, "visit": int(f["visit"]),
                         "batch": f["batch"] if f.get("batch") is not None else None,
                         "mode": f.get("mode"), "start_us": round(f["start"] - t0, 1),
                         "end_us": round(f["end"] - t0, 1)})
    return sorted(rows, key=lambda d: (d["start_us"], d["rank"]))
