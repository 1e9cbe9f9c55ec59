"""`python -m microbench.sglang_lab.rounds OUT/<case> [...]`: the round per slot pattern in each
case's traced window against the model of it (the analysis: reports/lab/rounds.py). This side
reads rank 0's trace with microbench/sglang's reader, which the analysis side may not import.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reports.lab.rounds import case_record, phase_rows, rank0_trace, render, visits_of


def visits(trace: Path) -> list[tuple[float, int]]:
    """(start us, decode batch size or 0) per loop iteration of one rank's trace."""
    from microbench.sglang.cpu_steps import collect
    return visits_of(collect(trace))


def case_rows(case: Path) -> list[dict]:
    """Each phase of the case's traced window: traced round, modelled round, the difference."""
    from microbench.sglang.cpu_steps import collect
    sg = case_record(case)
    trace = rank0_trace(case)
    return phase_rows(case, sg, trace, collect(trace))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m microbench.sglang_lab.rounds",
        description="Per slot pattern in each case's traced window: the round SGLang ran "
                    "(rank 0's trace) against the model of the same record.")
    ap.add_argument("cases", nargs="+", type=Path,
                    help="case folders holding traces/ and sglang.json")
    a = ap.parse_args(argv)
    from reports.cli import run_guarded   # ppscope's error rules: one line, exit 2
    return run_guarded("rounds", lambda: _main(a.cases))


def _main(cases: list[Path]) -> int:
    from reports.base.errors import CliError
    from reports.base.records import RecordError
    rows = []
    for c in cases:
        if not (c / "sglang.json").is_file() or not (c / "traces").is_dir():
            raise CliError(f"{c}: needs traces/ and sglang.json (ppscope sglang --json)")
        try:
            rows += case_rows(c)
        except (ValueError, RecordError) as e:   # a trace's error is a CliError already
            raise CliError(str(e)) from None
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
