"""The clock offset between two ranks' traces, from the messages one sent and the other received.

Kineto stamps each rank's events with its own host's clock. On one host the ranks share it; on
two nodes the clocks differ by whatever NTP/PTP left (milliseconds are common), and every
cross-rank figure of the loop reader (a hop: the receiver's input after the sender's forward
ended) is off by that much. So before ranks are compared their clocks are checked.

A point-to-point message is a rendezvous: the receive cannot complete before the send was
posted, and the send (gloo's, NCCL's kernel) cannot complete before the receive was posted
(c10d's `gloo:send` / `gloo:recv` ranges; the GPU-side `nccl:send a->b` / `nccl:recv b<-a`
annotations). With `delta` = receiver's clock - sender's clock, each matched pair gives
`recv_start - send_end <= delta <= recv_end - send_start`. Messages in both directions
(rank r -> r+1, and the last rank's outputs back to the first) bound it from both sides, as
NTP's round trip does.

Matching: the messages between two ranks are received in the order they were sent (c10d's
point-to-point on one pair of ranks), but each trace is its own window, so the receiver's j-th
receive is the sender's (j+k)-th send for an unknown shift k. Every shift whose pairs agree on
one `delta` (MIN_AGREE of them: a window's edge cuts a few) is a candidate; both directions'
candidates must agree. One region of agreement: the offset, its midpoint (half its width is the
uncertainty); zero inside it: one clock. None, or several that disagree: it cannot be told.

Which messages: SGLang's PP loop sends only to the next rank (the last rank to the first), on
gloo for its Python objects and on NCCL (GPU) or gloo (CPU) for the hidden states; each
transport is matched on its own.
"""
from __future__ import annotations

import bisect

MIN_AGREE = 0.8        # share of a shift's pairs that must bound one common offset
MIN_PAIRS = 3          # fewer matched messages than this tell nothing
MAX_PAIRS = 64         # receives matched per shift (the middle of the window; plenty to agree)
MAX_OFFSET_US = 5e6    # offsets searched: +-5 s (beyond it the windows check refuses the traces)


def _stab(ivs: list[tuple[float, float]]) -> tuple[int, float, float]:
    """(most intervals holding one common point, that region's lo, hi)."""
    ev = sorted([(lo, 0) for lo, _ in ivs] + [(hi, 1) for _, hi in ivs])
    best, n, lo, hi = 0, 0, 0.0, 0.0
    for i, (t, kind) in enumerate(ev):
        if kind == 0:
            n += 1
            if n > best:
                best, lo = n, t
                hi = ev[i + 1][0] if i + 1 < len(ev) else t
        else:
            n -= 1
    return best, lo, hi


def candidates(sends: list[tuple[float, float]], recvs: list[tuple[float, float]]
               ) -> list[tuple[float, float, int]]:
    """Regions (lo, hi, pairs agreeing) of `delta` = receiver clock - sender clock, one per
    shift whose matched pairs agree (module docstring). Times in us, each list sorted."""
    if len(sends) < MIN_PAIRS or len(recvs) < MIN_PAIRS:
        return []
    mid = len(recvs) // 2
    j0 = max(0, mid - MAX_PAIRS // 2)
    block = recvs[j0:j0 + MAX_PAIRS]
    # shifts that put the block's middle receive within MAX_OFFSET_US of a send
    r = block[len(block) // 2]
    starts = [s for s, _ in sends]
    i_lo = bisect.bisect_left(starts, r[0] - MAX_OFFSET_US - (r[1] - r[0])) - len(block)
    i_hi = bisect.bisect_right(starts, r[1] + MAX_OFFSET_US) + len(block)
    out = []
    for k in range(max(i_lo, -len(block)), min(i_hi, len(sends)) + 1):
        ivs = [(rv[0] - sends[j + k][1], rv[1] - sends[j + k][0])
               for j, rv in enumerate(block) if 0 <= j + k < len(sends)]
        if len(ivs) < max(MIN_PAIRS, MIN_AGREE * len(block) / 2):
            continue
        n, lo, hi = _stab(ivs)
        if n >= MIN_PAIRS and n >= MIN_AGREE * len(ivs):
            out.append((lo, hi, n))
    return out


def _merge(regions: list[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    out: list[list] = []
    for lo, hi, n in sorted(regions):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
            out[-1][2] += n
        else:
            out.append([lo, hi, n])
    return [tuple(x) for x in out]


def estimate(a: dict[str, list], b: dict[str, list]) -> dict:
    """The offset of rank b's clock against rank a's, from their messages. `a`, `b`: per
    transport ("gloo", "nccl") {"send": [(ts, end)], "recv": [...]}, sorted, us.
    Returns {"status": "same" | "offset" | "ambiguous" | "unknown" | "no messages",
    "offset_us", "pm_us", "pairs"}: "same": one clock (0 within the bounds); "offset": b's
    clock is `offset_us` (+- `pm_us`) ahead of a's; "ambiguous": zero is excluded but several
    offsets fit; "unknown": the messages agree on no single offset (a transport that does not
    rendezvous, a window's edge); "no messages": nothing matched to tell."""
    regions = []       # per transport and direction: the candidate regions of delta
    for tr in sorted(set(a) | set(b)):
        sa, ra = a.get(tr, {}).get("send", []), a.get(tr, {}).get("recv", [])
        sb, rb = b.get(tr, {}).get("send", []), b.get(tr, {}).get("recv", [])
        for s, r, sign in ((sa, rb, 1), (sb, ra, -1)):
            if len(s) >= MIN_PAIRS and len(r) >= MIN_PAIRS:   # a direction with messages
                regions.append(_merge([(lo, hi, n) if sign > 0 else (-hi, -lo, n)
                                       for lo, hi, n in candidates(s, r)]))
    used = regions
    if not used:
        return {"status": "no messages", "offset_us": None, "pm_us": None, "pairs": 0}
    if any(not r for r in used):     # one direction's messages agree on no offset at all
        return {"status": "unknown", "offset_us": None, "pm_us": None, "pairs": 0}
    # every direction must hold the offset: intersect their regions
    agree = used[0]
    for r in used[1:]:
        agree = [(max(x[0], y[0]), min(x[1], y[1]), x[2] + y[2]) for x in agree for y in r
                 if max(x[0], y[0]) <= min(x[1], y[1])]
    agree = _merge(agree)
    if any(lo <= 0.0 <= hi for lo, hi, _ in agree):
        n = max(p for lo, hi, p in agree if lo <= 0.0 <= hi)
        return {"status": "same", "offset_us": 0.0, "pm_us": None, "pairs": n}
    if not agree:
        return {"status": "unknown", "offset_us": None, "pm_us": None, "pairs": 0}
    if len(agree) > 1:       # zero excluded, but several offsets fit
        return {"status": "ambiguous", "offset_us": None, "pm_us": None,
                "pairs": sum(p for *_, p in agree)}
    lo, hi, n = agree[0]
    return {"status": "offset", "offset_us": (lo + hi) / 2, "pm_us": (hi - lo) / 2, "pairs": n}
