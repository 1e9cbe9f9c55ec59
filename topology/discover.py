"""Discover the GPUs of this machine and how they are wired, without touching CUDA.

What: per GPU its index, name, UUID, PCI bus id, memory, PCIe generation and width (current
and max), NUMA node and CPU affinity; per pair the link level (NV#, PIX, PXB, PHB, NODE, SYS)
and whether NVML reports P2P reads/writes as supported; the number of CPU sockets.
How: NVML (`nvidia-ml-py`) for the GPUs, sysfs for NUMA node / CPU list / sockets, and the
link levels from `nvidia-smi topo -m` when it parses (that is what users compare against),
else from NVML's common-ancestor query plus NVLink state.
Indices follow NVML/nvidia-smi (PCI bus order); the measurement sets CUDA_DEVICE_ORDER=PCI_BUS_ID
so CUDA ordinals match them.
"""
from __future__ import annotations

import glob
import shutil
import subprocess
from dataclasses import dataclass, field

from topology.links import NVML_LEVEL_NAMES, pair_key
from topology.smi_parse import TopoParseError, parse_topo_matrix

# nvmlGpuP2PStatus_t (nvml.h) -> the words nvidia-smi topo -p2p uses.
P2P_STATUS = {0: "OK", 1: "chipset not supported", 2: "GPU not supported",
              3: "topology not supported", 4: "disabled by regkey", 5: "not supported",
              6: "unknown"}


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str | None
    pci_bus_id: str | None          # sysfs spelling, e.g. "0000:3b:00.0"
    memory_bytes: int | None
    pcie_gen_current: int | None
    pcie_gen_max: int | None
    pcie_width_current: int | None
    pcie_width_max: int | None
    numa_node: int | None
    cpu_affinity: str | None        # CPU list, e.g. "0-55,112-167"


@dataclass(frozen=True)
class Discovery:
    gpus: tuple[GpuInfo, ...]
    links: dict[str, str]                       # "i-j" -> level, every pair i < j
    p2p_support: dict[str, dict[str, str]]      # "i-j" -> {"read": "OK"|reason, "write": ...}
    sockets: int | None
    numa_nodes: int | None
    links_source: str                           # "nvidia-smi" | "nvml" | "none"
    driver: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


def _s(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's "00000000:3B:00.0" -> sysfs's "0000:3b:00.0"."""
    dom, rest = nvml_bus_id.split(":", 1)
    return f"{int(dom, 16):04x}:{rest.lower()}"


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def socket_count(root: str = "/sys/devices/system/cpu") -> int | None:
    ids = {_read(p) for p in glob.glob(f"{root}/cpu[0-9]*/topology/physical_package_id")}
    ids.discard(None)
    return len(ids) or None


def numa_node_count(root: str = "/sys/devices/system/node") -> int | None:
    return len(glob.glob(f"{root}/node[0-9]*")) or None


def mask_to_cpulist(words: list[int], bits: int = 64) -> str | None:
    """NVML's CPU affinity bitmask (array of unsigned longs) -> "0-3,8-11"."""
    cpus = [w * bits + b for w, word in enumerate(words) for b in range(bits) if word >> b & 1]
    if not cpus:
        return None
    out, start, prev = [], cpus[0], cpus[0]
    for c in cpus[1:] + [None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
        if c is not None:
            start = prev = c
    return ",".join(out)


def _try(fn, *a):
    try:
        return fn(*a)
    except Exception:  # noqa: BLE001 - NVML raises NVMLError_NotSupported & co per query
        return None


def _gpu_info(nv, i: int) -> GpuInfo:
    h = nv.nvmlDeviceGetHandleByIndex(i)
    pci = _try(nv.nvmlDeviceGetPciInfo, h)
    bus = sysfs_bus_id(_s(pci.busId)) if pci is not None else None
    numa = cpus = None
    if bus:
        n = _read(f"/sys/bus/pci/devices/{bus}/numa_node")
        numa = int(n) if n is not None and n.lstrip("-").isdigit() and int(n) >= 0 else None
        cpus = _read(f"/sys/bus/pci/devices/{bus}/local_cpulist") or None
    if cpus is None:
        mask = _try(nv.nvmlDeviceGetCpuAffinity, h, 64)
        cpus = mask_to_cpulist(list(mask)) if mask else None
    mem = _try(nv.nvmlDeviceGetMemoryInfo, h)
    return GpuInfo(
        index=i, name=_s(nv.nvmlDeviceGetName(h)), uuid=_try(lambda: _s(nv.nvmlDeviceGetUUID(h))),
        pci_bus_id=bus, memory_bytes=int(mem.total) if mem is not None else None,
        pcie_gen_current=_try(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
        pcie_gen_max=_try(nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
        pcie_width_current=_try(nv.nvmlDeviceGetCurrPcieLinkWidth, h),
        pcie_width_max=_try(nv.nvmlDeviceGetMaxPcieLinkWidth, h),
        numa_node=numa, cpu_affinity=cpus,
    )


def _nvml_link(nv, ha, hb, bus_b: str | None) -> str | None:
    """Link level from NVML: NV<count> when NVLink joins the pair, else the PCIe level."""
    nvl = _try(nv.nvmlDeviceGetP2PStatus, ha, hb, nv.NVML_P2P_CAPS_INDEX_NVLINK)
    if nvl == 0:
        direct = active = 0
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
            if _try(nv.nvmlDeviceGetNvLinkState, ha, link) != 1:
                continue
            active += 1
            rpci = _try(nv.nvmlDeviceGetNvLinkRemotePciInfo, ha, link)
            if rpci is not None and bus_b and sysfs_bus_id(_s(rpci.busId)) == bus_b:
                direct += 1
        # Behind NVSwitch the remote end is the switch: nvidia-smi then shows all active links.
        return f"NV{direct or active}"
    lvl = _try(nv.nvmlDeviceGetTopologyCommonAncestor, ha, hb)
    return NVML_LEVEL_NAMES.get(lvl) if lvl is not None else None


def smi_links(n: int) -> tuple[dict[str, str] | None, str | None]:
    """Links from `nvidia-smi topo -m`, or (None, why not)."""
    if not shutil.which("nvidia-smi"):
        return None, "nvidia-smi not on PATH"
    try:
        out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                             timeout=30)
        topo = parse_topo_matrix(out.stdout)
    except (OSError, subprocess.TimeoutExpired, TopoParseError) as e:
        return None, f"nvidia-smi topo -m unusable: {str(e).splitlines()[0] if str(e) else e}"
    if len(topo.gpus) != n:
        return None, f"nvidia-smi topo -m lists {len(topo.gpus)} GPUs, NVML {n}"
    if topo.unknown_pairs:
        return None, f"nvidia-smi topo -m unusable: {topo.notes[-1]}"
    return topo.links, None


def discover() -> Discovery:
    """Everything NVML, sysfs and nvidia-smi can say. Raises RuntimeError when NVML is unusable."""
    try:
        import pynvml as nv
    except ImportError:
        raise RuntimeError("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from None
    try:
        nv.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded...
        raise RuntimeError(f"NVML unavailable ({e})") from None
    notes: list[str] = []
    try:
        n = nv.nvmlDeviceGetCount()
        gpus = tuple(_gpu_info(nv, i) for i in range(n))
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        p2p: dict[str, dict[str, str]] = {}
        nvml_links: dict[str, str] = {}
        for i in range(n):
            for j in range(i + 1, n):
                key = pair_key(i, j)
                p2p[key] = {
                    what: P2P_STATUS.get(_try(nv.nvmlDeviceGetP2PStatus, handles[i], handles[j],
                                              cap), "unknown")
                    for what, cap in (("read", nv.NVML_P2P_CAPS_INDEX_READ),
                                      ("write", nv.NVML_P2P_CAPS_INDEX_WRITE))}
                lvl = _nvml_link(nv, handles[i], handles[j], gpus[j].pci_bus_id)
                if lvl:
                    nvml_links[key] = lvl
        driver = _try(lambda: _s(nv.nvmlSystemGetDriverVersion()))
    finally:
        nv.nvmlShutdown()
    links, why = smi_links(len(gpus)) if len(gpus) > 1 else ({}, None)
    source = "nvidia-smi"
    if links is None:
        notes.append(why or "nvidia-smi links unavailable")
        links, source = nvml_links, "nvml" if nvml_links else "none"
    if len(gpus) < 2:
        source = "none"
    return Discovery(gpus=gpus, links=links, p2p_support=p2p, sockets=socket_count(),
                     numa_nodes=numa_node_count(), links_source=source, driver=driver,
                     notes=tuple(notes))
