"""The twin's steady decode read from SGLang's log (microbench/sglang_lab/twin/steady.py).

Fixtures: tests/fixtures/twin/logs/, rank 0's batch lines of three twin runs of the seed's PP8
deployment on SGLang 0.5.23's own scheduler (this project's twin, k = 60, 32 output tokens, the
log's clock in whole seconds): each from the run's warm-up prompt to its last token."""
import random
from pathlib import Path

import pytest

from microbench.sglang_lab.twin.steady import MIN_CYCLES, steady_decode

LOGS = Path(__file__).parent / "fixtures" / "twin" / "logs"


def _log(name: str) -> str:
    return (LOGS / name).read_text()


def test_pair_at_c32_decodes_four_per_slot_in_all_eight_slots():
    s = steady_decode(_log("pair-c32.log"), 32)
    assert s.slots == (4,) * 8
    assert s.cycles == 28
    # 28 rounds of the eight occupied slots, timed on the log's clock: 152 s / 28
    assert s.tpot_ms == pytest.approx(152_000 / 28)


def test_default_at_c8_times_the_two_slots_sglang_formed():
    s = steady_decode(_log("default-c8.log"), 8)
    assert s.slots == (1, 7)          # SGLang admitted the burst as 1 then 7
    assert s.tpot_ms == pytest.approx(6000.0)
    assert s.cycles == 28             # the window ends where the pool's #token falls


def test_default_at_c32_starts_after_the_last_prefill():
    s = steady_decode(_log("default-c32.log"), 32)
    assert s.slots == (1, 8, 8, 8, 7)
    assert sum(s.slots) == 32


def test_a_concurrency_the_slots_do_not_add_up_to_gives_none():
    assert steady_decode(_log("pair-c32.log"), 6) is None
    assert steady_decode(_log("pair-c32.log"), 33) is None
    assert steady_decode("", 4) is None


def _line(t: float, n: int, tok: int, rank: int = 0, kind: str = "Decode") -> str:
    whole = int(t)
    stamp = f"2026-12-06 10:{whole // 60:02d}:{whole % 60:02d}.{int(round((t - whole) * 1000)):03d}"
    if kind == "Prefill":
        return (f"[{stamp} PP{rank}] Prefill batch, #new-seq: {n}, #new-token: {n * 100}, "
                f"#cached-token: 0, token usage: 0.01, #running-req: 0, #queue-req: 0, ")
    return (f"[{stamp} PP{rank}] Decode batch, #running-req: {n}, #token: {tok}, token usage: "
            f"0.01, cpu graph: False, gen throughput (token/s): 1.00, #queue-req: 0, ")


def _run(sizes, period, rounds, finish_after=None, t0=1.0):
    """A prefill per slot, then `rounds` decode rounds of `period` s (ms clock); the first slot
    loses a request after `finish_after` rounds (its #token falls)."""
    out = [_line(t0 + 0.01 * i, n, 0, kind="Prefill") for i, n in enumerate(sizes)]
    tok, t = 1000, t0 + 1.0
    for r in range(rounds):
        for i, n in enumerate(sizes):
            if finish_after is not None and r >= finish_after and i == 0:
                n, tok = n - 1, tok - 100
            tok += n
            out.append(_line(t + period * i / len(sizes), n, tok))
            out.append(_line(t + 0.001, 3, 5, rank=1))        # another rank's line
        t += period
    return "\n".join(out)


def test_milliseconds_clock_and_a_finish_end_the_window():
    s = steady_decode(_run((2, 1, 1), 0.5, 12, finish_after=8), 4)
    assert s.slots == (2, 1, 1)
    assert s.tpot_ms == pytest.approx(500.0)
    assert s.cycles == 6               # from round 1 (the first skipped) to round 7, before the finish


def test_too_few_rounds_give_no_figure():
    assert steady_decode(_run((2, 2), 0.5, MIN_CYCLES), 4) is None
    assert steady_decode(_run((2, 2), 0.5, MIN_CYCLES + 2), 4).cycles == MIN_CYCLES


def test_garbage_lines_are_ignored():
    rng = random.Random(7)
    text = _run((3, 1), 0.25, 10).splitlines()
    noise = ["", "Decode batch", "[garbage PP0] Decode batch, #running-req: x",
             "INFO: 127.0.0.1 - POST /generate 200", "\x00\x01 binary"]
    for _ in range(40):
        text.insert(rng.randrange(len(text)), rng.choice(noise))
    s = steady_decode("\n".join(text), 4)
    assert s is not None and s.tpot_ms == pytest.approx(250.0)
