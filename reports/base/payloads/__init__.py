"""One payload dataclass per record, defined once: the probe that writes it and every reader use
it. `PAYLOADS` maps a probe name (the record's `probe`) to its class."""
from __future__ import annotations

from reports.base.payloads.dispatch import DispatchData
from reports.base.payloads.watch import WatchData

PAYLOADS: dict[str, type] = {
    "dispatch": DispatchData,
    "watch": WatchData,
}
