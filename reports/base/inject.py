"""The PP-loop probe's fault switches (`ppscope dispatch --inject`), parsed in one place: the
probe (microbench/dispatch/pp_loop.py) applies them, the dispatch validation
(reports/model/checks/validate_dispatch.py) reads them back from the record's settings."""
from __future__ import annotations


INJECT_KINDS = ("slow-stage", "host-delay", "hop-delay")


def parse_inject(specs, pp: int) -> dict:
    """`--inject` specs -> {"slow_stage": {rank: factor}, "host_delay_us": {rank: us},
    "hop_delay_us": us}. Forms: `slow-stage=RANK:FACTOR` (that rank's forward takes FACTOR
    times as long: an extra calibrated sleep kernel after it, inside `run_batch`),
    `host-delay=RANK:US` (that rank's host spins US microseconds per loop iteration, inside
    `get_next_batch_to_run` on ranks > 0; per visit with a batch), `hop-delay=US` (every
    hidden-state send leaves US later: a sleep kernel on a side stream the send waits on, so
    the sender's forward is not slowed)."""
    out = {"slow_stage": {}, "host_delay_us": {}, "hop_delay_us": 0.0}
    for spec in specs or ():
        kind, sep, val = str(spec).partition("=")
        if kind not in INJECT_KINDS or not sep:
            raise ValueError(f"--inject {spec!r}: expected one of slow-stage=RANK:FACTOR, "
                             "host-delay=RANK:US, hop-delay=US")
        try:
            if kind == "hop-delay":
                us = float(val)
                if not 0 <= us <= 1e6:
                    raise ValueError
                out["hop_delay_us"] = us
                continue
            r, sep2, x = val.partition(":")
            rank, v = int(r), float(x)
            if not sep2 or not 0 <= rank < pp:
                raise ValueError
        except ValueError:
            raise ValueError(f"--inject {spec!r}: bad value (rank 0..{pp - 1}, finite numbers)"
                             ) from None
        if kind == "slow-stage":
            if not 1.0 <= v <= 100.0:
                raise ValueError(f"--inject {spec!r}: FACTOR must be between 1 and 100")
            out["slow_stage"][rank] = v
        else:
            if not 0 <= v <= 1e6:
                raise ValueError(f"--inject {spec!r}: US must be between 0 and 1e6")
            out["host_delay_us"][rank] = v
    return out
