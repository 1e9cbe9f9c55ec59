"""Moved to reports/model/checks/validate_dispatch.py; this old name holds only the two record
types reports/model/report_type.py still imports, until it imports the new one."""
from reports.model.checks.validate_dispatch import Check, MicroBatchChoice  # noqa: F401
