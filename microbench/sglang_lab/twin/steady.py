"""The twin's steady decode, read from SGLang's own log: the round of the pipeline once every
prompt of a run has been prefilled and before the first one finishes.

Why: bench_serving's TPOT is a median over prompts of (last token - first token) / (tokens - 1).
With short outputs, the later prompts' prefills run between the earlier prompts' decodes for much
of the run, so a setting that changes the chunking changes that transient as well as the decode
loop. The pipeline model's TPOT is the decode loop alone (every slot decoding, nobody
prefilling). This reads the same quantity off the twin: rank 0's `Decode batch` lines
(SGLang 0.5.23 logs one per decode visit with `--decode-log-interval 1`; under PP its
`#running-req` is the micro-batch of the slot just visited), after the run's last `Prefill batch`
line.

How: the occupied slots are visited in a fixed order, so the decode lines repeat with a cycle of
`m` lines, `m` the smallest count whose `#running-req` add up to the run's concurrency C (every
request decoding). One cycle is one token for every request: the steady TPOT is the time of
whole cycles over their count. The first cycle after the last prefill is left out (the prefill's
forward is still passing through the later stages), and the window ends before the first line
that shows a request gone: a micro-batch unlike one cycle before, or the KV pool's `#token`
falling. With the log's clock in
whole seconds, the window must be long (twin runs set SGLANG_LOG_MS=1: milliseconds).
"""
from __future__ import annotations

from dataclasses import dataclass

from microbench.sglang.log_scan import BatchLine, parse_line

MIN_CYCLES = 3        # fewer whole cycles in the window: no steady figure


@dataclass(frozen=True)
class SteadyDecode:
    tpot_ms: float            # one cycle of the occupied slots, on the log's clock (dilated)
    cycles: int               # whole cycles timed
    slots: tuple[int, ...]    # `#running-req` of the occupied slots, in visit order


def rank0_lines(log_text: str) -> list[BatchLine]:
    """Rank 0's batch lines, in order (lines without a PP tag count as rank 0)."""
    out = []
    for line in log_text.splitlines():
        b = parse_line(line)
        if isinstance(b, BatchLine) and b.pp in (0, None) and b.t_s is not None:
            out.append(b)
    return out


def steady_decode(log_text: str, C: int, skip_cycles: int = 1) -> SteadyDecode | None:
    """The steady decode round of one bench_serving run at concurrency C (the log from the run's
    start); None when the log has no window of `MIN_CYCLES` whole cycles with all C requests
    decoding."""
    lines = rank0_lines(log_text)
    last_prefill = max((i for i, b in enumerate(lines) if b.kind == "Prefill"), default=-1)
    dec = [(b.t_s, int(b.fields["#running-req"]), b.fields.get("#token"))
           for b in lines[last_prefill + 1:] if b.kind == "Decode"]
    total, m = 0, 0
    for _, n, _ in dec:
        total, m = total + n, m + 1
        if total >= C:
            break
    if total != C or m == 0:
        return None
    start = skip_cycles * m
    end = start
    while end + 1 < len(dec) and not _finished(dec, end + 1, m):
        end += 1
    cycles = (end - start) // m
    if cycles < MIN_CYCLES:
        return None
    stop = start + cycles * m
    return SteadyDecode(tpot_ms=(dec[stop][0] - dec[start][0]) * 1e3 / cycles, cycles=cycles,
                        slots=tuple(n for _, n, _ in dec[:m]))


def _finished(dec: list, j: int, m: int) -> bool:
    """Line j shows a request gone: its slot's micro-batch differs from one cycle before (a
    slot emptied shifts the cycle), or the KV pool's `#token` fell (a finished request's
    tokens freed; it grows by each visit's tokens while every request decodes)."""
    tok, prev = dec[j][2], dec[j - 1][2]
    return (dec[j][1] != dec[j - m][1]
            or (isinstance(tok, int) and isinstance(prev, int) and tok < prev))
