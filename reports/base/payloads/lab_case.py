"""`case.json`: what the lab ran for one case (microbench/sglang_lab/lab.py `run_case` writes
it; the lab's tables read it, reports/lab/).

`case` is the plan's case as it ran (microbench/sglang_lab/cases.py `Case`: every field of it
is a field of `CasePlan`, tests/test_lab_case.py holds the two together); the rest is the server
and the load it ran on. Files of earlier labs lack the fields added since (each has the default
that says so) or name the hog's core in the case (`hog_core`); a reader takes a file another
version may have written, so unknown keys are skipped (`read_lab_case`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from reports.base.schema import Json, ge, gt, if_set


@dataclass(frozen=True)
class CasePlan:
    """One case of the lab's plan, as it ran."""
    concurrency: int = ge(1)
    name: str = ""
    fault: str | None = ""                # the fault module's grammar, e.g. "host-delay=0:3000"
    hog_rank: int | None = ge(0, default=None)   # a CPU hog on the core this rank is pinned to
    hog_core: int | None = if_set()       # earlier labs: the hog's core itself
    mmb: int | None = ge(1, default=None)        # pp_max_micro_batch_size set for the case
    request_rate: float | None = gt(0, default=None)
    reps: int = ge(1, default=1)
    stacks: bool = False
    window_stacks: bool = False
    live: bool = False
    baseline: str | None = ""             # the case its slowdown is measured against
    expect: str | None = ""               # the cause the diagnosis should name first
    profile: bool = True
    window_concurrency: int | None = ge(1, default=None)
    layer_partition: str = ""             # the layers each rank ran, given to `ppscope sglang`


@dataclass(frozen=True)
class LabCase:
    """`case.json` (module docstring)."""
    case: CasePlan
    pp: int | None = ge(1, default=None)
    device: str = "cpu"
    extra_args: tuple[str, ...] = ()
    pp_max_micro_batch_size: int | None = ge(1, default=None)
    env: dict[str, str] = field(default_factory=dict)   # the server's SGLANG_* variables
    server: Json = None                   # the lab's choices for its server (server.py)
    hog_core: int | None = ge(0, default=None)
    started_unix: float | None = ge(0, default=None)
    seconds: float | None = ge(0, default=None)
    input_len: int | None = ge(1, default=None)
    output_len: int | None = ge(1, default=None)
    flush_cache: bool = False
    # started with ppscope's recipe (--enable-metrics --decode-log-interval 1); earlier labs
    # always were
    recipe: bool = True
