"""One payload dataclass per record, defined once: the probe that writes it and every reader use
it. `PAYLOADS` maps a probe name (the record's `probe`) to its class."""
from __future__ import annotations

from reports.base.payloads.dispatch import DispatchData
from reports.base.payloads.graphs import GraphsData
from reports.base.payloads.sglang import SglangData
from reports.base.payloads.stage_cost import StageCostData
from reports.base.payloads.topology import TopologyData
from reports.base.payloads.watch import WatchData
from reports.base.probes import NAMES

_CLASSES = {"topology": TopologyData, "stage_cost": StageCostData, "graphs": GraphsData,
            "dispatch": DispatchData, "watch": WatchData, "sglang": SglangData}
# one class per probe of reports/base/probes.py, in its order
PAYLOADS: dict[str, type] = {name: _CLASSES[name] for name in NAMES}
