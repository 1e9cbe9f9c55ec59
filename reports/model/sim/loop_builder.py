"""Moved to reports/model/scenario/loop_builder.py; this old name holds only the re-export the
lab's twin driver (microbench/sglang_lab/twin.py) still imports, until it imports the new one."""
from reports.model.scenario.loop_builder import run  # noqa: F401
