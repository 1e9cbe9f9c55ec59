"""Moved to reports/model/observed/bench_run.py; this old name holds only the re-export the lab's
drivers (microbench/sglang_lab/rounds.py, twin_observed.py) still import, until they import the
new one."""
from reports.model.observed.bench_run import from_sglang  # noqa: F401
