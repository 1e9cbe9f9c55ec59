"""GPU spec sheets (datasheet ceilings) from `configs/gpus/<name>.json`.

Each file holds the peak HBM/GDDR bandwidth (`mem_bw_gbps`, GB = 1e9 bytes), memory size, dense
bf16 tensor TFLOPS, PCIe generation and lanes, NVLink, and a `source` line naming the datasheet.
They are the ceilings "estimated" figures come from; a measured bandwidth always wins where
one exists. `match_gpu(nvml_name)` maps a name as NVML reports it ("NVIDIA H200") to a spec,
most specific match first (the longest `nvml_match` substring wins).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from reports.base.model_config import ConfigError
from reports.base.paths import CONFIGS

DEFAULT_GPU = "rtx-pro-6000"
# PCIe GB/s per lane per direction by generation (PCI-SIG: 8/16/32 GT/s with 128b/130b
# encoding; Gen6 64 GT/s PAM4 with FLIT encoding).
PCIE_GBPS_PER_LANE = {3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


@dataclass(frozen=True)
class GpuSpec:
    name: str
    mem_bw_gbps: float
    bf16_tflops: float
    mem_gb: float
    pcie_gen: int
    pcie_lanes: int
    nvlink: bool
    nvlink_gbps: float | None = None
    sm: str | None = None
    full_name: str = ""
    nvml_match: tuple[str, ...] = ()
    source: str = ""

    @property
    def pcie_gbps(self) -> float:
        """Theoretical PCIe bandwidth per direction, GB/s: Gen5 x16 = 63.0."""
        return PCIE_GBPS_PER_LANE[self.pcie_gen] * self.pcie_lanes

    @property
    def link_gbps(self) -> float:
        """GPU-to-GPU link bandwidth per direction, GB/s: NVLink where the GPU has it, else
        PCIe."""
        return self.nvlink_gbps if self.nvlink and self.nvlink_gbps else self.pcie_gbps


def gpu_names() -> list[str]:
    return sorted(p.stem for p in (CONFIGS / "gpus").glob("*.json"))


def _parse(raw: dict, source: str) -> GpuSpec:
    def num(key: str, typ=float, optional: bool = False):
        v = raw.get(key)
        if v is None:
            if optional:
                return None
            raise ConfigError(f"{source}: field '{key}' is missing")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise ConfigError(f"{source}: field '{key}' must be a positive number, got {v!r}")
        return typ(v)

    if not isinstance(raw.get("nvlink"), bool):
        raise ConfigError(f"{source}: field 'nvlink' must be true or false")
    if not raw.get("source"):
        raise ConfigError(f"{source}: field 'source' is missing (name the datasheet)")
    spec = GpuSpec(name=str(raw.get("name") or Path(source).stem),
                   mem_bw_gbps=num("mem_bw_gbps"), bf16_tflops=num("bf16_tflops"),
                   mem_gb=num("mem_gb"), pcie_gen=num("pcie_gen", int),
                   pcie_lanes=num("pcie_lanes", int), nvlink=raw["nvlink"],
                   nvlink_gbps=num("nvlink_gbps", float, optional=True), sm=raw.get("sm"),
                   full_name=str(raw.get("full_name", "")),
                   nvml_match=tuple(raw.get("nvml_match") or ()), source=str(raw["source"]))
    if spec.pcie_gen not in PCIE_GBPS_PER_LANE:
        raise ConfigError(f"{source}: field 'pcie_gen' must be one of "
                          f"{', '.join(map(str, PCIE_GBPS_PER_LANE))}, got {spec.pcie_gen}")
    return spec


def load_gpu(name: str | Path = DEFAULT_GPU) -> GpuSpec:
    """A spec by name (`configs/gpus/<name>.json`) or by path to such a file."""
    s = str(name)
    p = Path(s) if (s.endswith(".json") or "/" in s) else CONFIGS / "gpus" / f"{s}.json"
    if not p.exists():
        raise ConfigError(f"unknown GPU {s!r}: spec sheets are {', '.join(gpu_names())}")
    try:
        raw = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p.name}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p.name}: top level must be a JSON object")
    return _parse(raw, p.name)


def all_gpus() -> list[GpuSpec]:
    return [load_gpu(n) for n in gpu_names()]


def match_gpu(nvml_name: str) -> GpuSpec | None:
    """The spec whose longest `nvml_match` substring occurs in `nvml_name` (case-insensitive)."""
    best, best_len = None, 0
    low = nvml_name.lower()
    for spec in all_gpus():
        for pat in spec.nvml_match:
            if pat.lower() in low and len(pat) > best_len:
                best, best_len = spec, len(pat)
    return best
