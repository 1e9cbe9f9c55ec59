"""How the benchmark's requests were split into micro-batches, from SGLang's own log.

Under PP, the micro-batch a request joins is fixed at its prefill: SGLang's `event_loop_pp`
(managers/scheduler_pp_mixin.py) visits the `pp + async_depth` slots round-robin, each visit
admits the requests that have reached the scheduler by then into that slot's running batch
(`get_new_batch_prefill`), and the request stays in that slot until it finishes. A burst of C
requests sent at once (bench_serving's start, or the successors of a group that finished
together) therefore lands as a few *waves*, one per prefill visit; the waves decide the slot
sizes the whole run then keeps, because the successors of requests that finished together
arrive together again.

The log says it: each `Prefill batch` line gives `#new-seq` (requests admitted) and
`#running-req` (the requests already in the slot it joins: 0 for an empty slot). A burst is a
run of prefill lines of one rank with no decode line between them: the visits in between were
prefills or empty slots (SGLang logs nothing for an empty visit). Lines inside the window
`/start_profile` opened (`Profiling starts` .. `Profiling done`) are left out: the traced window
is its own run, with its own burst, and not the benchmark's.

    bursts(lines) -> [{"waves": [[new_seq, running_req], ...], "requests": N}, ...]

in log order, rank 0 (the rank that admits; every rank logs the same admission). The what-if
model (reports/model/observed/bench_run.py) replays the first burst of C requests.
"""
from __future__ import annotations

import re
from typing import Iterable

MAX_BURSTS = 64       # bursts kept (the first ones): a day-long log has millions of prefills
MAX_WAVES = 64        # waves kept per burst
_PREFILL = re.compile(r"PP(\d+)\] Prefill batch, #new-seq: (\d+),.*?#running-req: (\d+),")
_DECODE = re.compile(r"PP(\d+)\] Decode batch, ")
_PROFILE = re.compile(r"PP(\d+)\] Profiling (starts|done)")


class BurstReader:
    """`bursts`, fed one log line at a time (profiler_cost.window_evidence shares the pass)."""

    def __init__(self, rank: str = "0") -> None:
        self.rank, self.tag = rank, "PP" + rank + "]"
        self.out: list[dict] = []
        self.cur: list[list[int]] = []
        self.profiling = False

    def _close(self) -> None:
        if self.cur and len(self.out) < MAX_BURSTS:
            self.out.append({"waves": self.cur[:MAX_WAVES],
                             "requests": sum(w[0] for w in self.cur)})
        self.cur = []

    def feed(self, ln: str) -> None:
        if self.tag not in ln or len(self.out) >= MAX_BURSTS:
            return
        m = _PROFILE.search(ln)
        if m and m.group(1) == self.rank:
            self._close()
            self.profiling = m.group(2) == "starts"
            return
        m = _PREFILL.search(ln)
        if m and m.group(1) == self.rank:
            if not self.profiling:
                self.cur.append([int(m.group(2)), int(m.group(3))])
            return
        m = _DECODE.search(ln)
        if m and m.group(1) == self.rank:
            self._close()

    def result(self) -> list[dict]:
        self._close()
        return self.out


def bursts(lines: Iterable[str], rank: str = "0") -> list[dict]:
    """The bursts of admission of one PP rank's log lines (module docstring)."""
    reader = BurstReader(rank)
    for ln in lines:
        reader.feed(ln)
    return reader.result()
