"""The benchmark's first burst of arrivals, as SGLang's log shows it, on a slot loop.

A burst is rank 0's prefill lines with no decode line between them, outside the profiled window
(microbench/sglang/arrival_bursts.py): each wave is [#new-seq, #running-req of the slot it
joined]. Under PP a request stays in the micro-batch it was admitted to (SGLang 0.5.23
managers/scheduler_pp_mixin.py, `event_loop_pp`: slot `mb_id` keeps `running_mbs[mb_id]`), so
the burst's waves fix the benchmark's micro-batches for the whole run: the waves replayed on
the loop give the slot sizes that bench_serving's tok/s was measured with.
"""
from __future__ import annotations

from typing import Sequence

# Deployment.sources["sizes"] when the slot sizes are the burst's
BURST_SOURCE = "observed (log: the benchmark's first burst)"


def wave_visits(waves: Sequence[tuple[int, int]], slots: int) -> list[int] | None:
    """The visit (counted from the burst's first prefill) at which each wave was admitted on
    a server of `slots` slots, all empty at the start: the next visit whose slot holds as many
    requests as the wave's `#running-req` says (0: an empty slot). None when the waves do not
    fit that loop (not a burst from an empty server, or another slot count)."""
    held, v, out = [0] * slots, 0, []
    for n, running in waves:
        for u in range(v, v + slots):
            if held[u % slots] == running:
                break
        else:
            return None
        held[u % slots] += n
        out.append(u)
        v = u + 1
    return out


def wave_slot_sizes(waves: Sequence[tuple[int, int]], slots: int) -> tuple[int, ...] | None:
    """Requests per slot once the burst was admitted (slot 0 = the burst's first visit), or
    None when the waves do not fit a loop of `slots` slots."""
    visits = wave_visits(waves, slots)
    if visits is None or not waves:
        return None
    out = [0] * slots
    for (n, _), v in zip(waves, visits):
        out[v % slots] += n
    return tuple(out)


def first_burst(bursts, requests: int | None):
    """The log's first burst of exactly `requests` arrivals (an ArrivalBurst), or None."""
    if not requests:
        return None
    return next((b for b in bursts or () if b.requests == requests), None)
