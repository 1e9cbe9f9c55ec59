"""Moved to reports/model/scenario/bench_transient.py; this old name holds only the re-exports
the lab's twin driver (microbench/sglang_lab/twin.py) still imports, until it imports the new one."""
from reports.model.scenario.bench_transient import model_bench, waves_of  # noqa: F401
