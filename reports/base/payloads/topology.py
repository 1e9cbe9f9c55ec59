"""`topology.json`: the link map, copy-engine matrices and PP hop cost (`topology/probe.py`).

Live records (`source` "live") hold what NVML/sysfs/nvidia-smi say (`gpus`, `links`,
`p2p_support`), the copy-engine measurements (`p2p`, `latency`, `host`, `ring`; cupy,
topology/p2p.py), and under torchrun the PP hop per (src, dst, batch) (`hops`) and the nccl-tests
sendrecv sweep (`nccl_transport`; topology/hop.py). Offline records (`source` "nvidia-smi",
`mode` "offline") hold the parsed `nvidia-smi topo -m` only: `gpus` then carry index, CPU
affinity and NUMA ids, `nics` and `columns` are set, and `hidden`/`tensors` are null.
Pair keys "i-j" have i < j. Times in microseconds, bandwidths in GB/s (GB = 1e9 bytes).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from reports.base.schema import Json, ge

Status = Literal["ok", "waived"]   # per measurement: waived = not possible here, `reason` says why


@dataclass(frozen=True)
class TopoGpu:
    """One GPU. Live: every field NVML/sysfs answered; offline: index, cpu_affinity, numa_node,
    gpu_numa_id (what `nvidia-smi topo -m` prints)."""
    index: int = ge(0)
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None          # sysfs spelling, e.g. "0000:3b:00.0"
    memory_bytes: int | None = ge(0, default=None)
    pcie_gen_current: int | None = ge(0, default=None)
    pcie_gen_max: int | None = ge(0, default=None)
    pcie_width_current: int | None = ge(0, default=None)
    pcie_width_max: int | None = ge(0, default=None)
    numa_node: int | None = ge(0, default=None)
    cpu_affinity: str | None = None        # CPU list, e.g. "0-55,112-167"
    gpu_numa_id: int | None = ge(0, default=None)


@dataclass(frozen=True)
class PipelineHop:
    """A directed hop of the pipeline with its link level and class (topology/links.py)."""
    src: int = ge(0)
    dst: int = ge(0)
    link: str | None = None
    hop_class: str | None = None
    carries: Literal["hidden_states", "tokens"] = "hidden_states"


@dataclass(frozen=True)
class CopyTiming:
    """One timed copy (topology/p2p.py `Bench._timed`): median and p20/p80 per copy."""
    bytes: int | None = ge(0, default=None)
    time_us: float | None = ge(0, default=None)
    time_p20_us: float | None = ge(0, default=None)
    time_p80_us: float | None = ge(0, default=None)
    bandwidth_gbps: float | None = ge(0, default=None)
    bandwidth_p20_gbps: float | None = ge(0, default=None)
    bandwidth_p80_gbps: float | None = ge(0, default=None)
    samples: int | None = ge(0, default=None)
    # Raw per-sample times, kept for display and re-analysis only: nothing in ppscope computes
    # on them (the medians above are the figures), so they are free-form.
    time_samples_us: tuple[Json, ...] = ()
    spin_blocked: bool | None = None        # False: host-staged copy, timed without the spin
    slow_enqueue_samples: int | None = ge(0, default=None)


@dataclass(frozen=True, kw_only=True)
class P2PCopy(CopyTiming):
    """`p2p[]`: GPU src -> dst, a write or a read, one direction or both at once, P2P on/off."""
    src: int = ge(0)
    dst: int = ge(0)
    op: Literal["write", "read"]
    direction: Literal["uni", "bi"]
    p2p: bool
    status: Status = "ok"
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class HostCopy(CopyTiming):
    """`host[]`: pinned host <-> GPU bandwidth."""
    gpu: int = ge(0)
    direction: Literal["h2d", "d2h"]
    status: Status = "ok"
    reason: str | None = None


@dataclass(frozen=True)
class CopyLatency:
    """`latency[]`: a small copy src -> dst, time per copy."""
    src: int = ge(0)
    dst: int = ge(0)
    p2p: bool = True
    status: Status = "ok"
    reason: str | None = None
    bytes: int | None = ge(0, default=None)
    latency_us: float | None = ge(0, default=None)
    latency_p20_us: float | None = ge(0, default=None)
    latency_p80_us: float | None = ge(0, default=None)


@dataclass(frozen=True)
class RingPair:
    src: int = ge(0)
    dst: int = ge(0)
    bytes: int = ge(0, default=0)
    time_us: float | None = ge(0, default=None)
    bandwidth_gbps: float | None = ge(0, default=None)
    alone_gbps: float | None = ge(0, default=None)    # the same pair copying alone
    ratio: float | None = ge(0, default=None)         # in ring / alone


@dataclass(frozen=True)
class Ring:
    """Every pipeline pair copying at once (`p2p`: whether peer access was on)."""
    p2p: bool = False
    pairs: tuple[RingPair, ...] = ()
    min_gbps: float | None = ge(0, default=None)
    min_ratio: float | None = ge(0, default=None)


@dataclass(frozen=True)
class HopCost:
    """`hops[]`: one pipeline hop src -> dst for a micro-batch of `batch` requests, one way
    (topology/hop.py explains each figure). `overhead_us` = hop - gloo meta - torch send: it is
    negative when the parts overlap, so it has no range."""
    src: int = ge(0)
    dst: int = ge(0)
    batch: int = ge(1)
    bytes: int | None = ge(0, default=None)
    tensors: int | None = ge(1, default=None)
    nccl_us: float | None = ge(0, default=None)
    nccl_p20_us: float | None = ge(0, default=None)
    nccl_p80_us: float | None = ge(0, default=None)
    nccl_bandwidth_gbps: float | None = ge(0, default=None)
    nccl_transport_us: float | None = ge(0, default=None)
    nccl_transport_p20_us: float | None = ge(0, default=None)
    nccl_transport_p80_us: float | None = ge(0, default=None)
    nccl_busbw_gbps: float | None = ge(0, default=None)
    sendrecv_us: float | None = ge(0, default=None)
    sendrecv_p20_us: float | None = ge(0, default=None)
    sendrecv_p80_us: float | None = ge(0, default=None)
    gloo_meta_us: float | None = ge(0, default=None)
    gloo_send_us: float | None = ge(0, default=None)
    pickle_us: float | None = ge(0, default=None)
    overhead_us: float | None = None
    hop_us: float | None = ge(0, default=None)        # what SGLang pays (= sendrecv_us)
    link: str | None = None
    hop_class: str | None = None


@dataclass(frozen=True)
class TransportPoint:
    """`nccl_transport[]`: nccl-tests sendrecv_perf over all pipeline GPUs at one size; the
    slowest rank's median, and each rank's median (`per_rank_us`)."""
    bytes: int = ge(0)
    nccl_transport_us: float | None = ge(0, default=None)
    nccl_transport_p20_us: float | None = ge(0, default=None)
    nccl_transport_p80_us: float | None = ge(0, default=None)
    nccl_busbw_gbps: float | None = ge(0, default=None)
    per_rank_us: tuple[float, ...] = ge(0, default=())


@dataclass(frozen=True)
class Waiver:
    """A part of the run that could not be measured here (`what`: p2p | hop) and why."""
    what: str
    reason: str


@dataclass(frozen=True)
class TopologyData:
    SCHEMA_VERSION: ClassVar[int] = 1
    source: Literal["live", "nvidia-smi"]
    gpus: tuple[TopoGpu, ...]
    links: dict[str, str]                         # "i-j" -> NV# | PIX | PXB | PHB | NODE | SYS
    links_source: str                             # nvidia-smi | nvml | none
    pipeline: tuple[int, ...] = ge(0)             # GPU indices in pipeline order
    mode: Literal["quick", "default", "thorough", "offline"] = "default"
    p2p_support: dict[str, dict[str, str]] = field(default_factory=dict)  # NVML read/write
    sockets: int | None = ge(0, default=None)
    numa_nodes: int | None = ge(0, default=None)
    driver: str | None = None
    pipeline_hops: tuple[PipelineHop, ...] = ()
    hidden: int | None = ge(0, default=None)      # hop message: `tensors` x [b, hidden] bf16
    tensors: int | None = ge(0, default=None)
    p2p: tuple[P2PCopy, ...] = ()
    latency: tuple[CopyLatency, ...] = ()
    host: tuple[HostCopy, ...] = ()
    ring: Ring | None = None                      # older records hold {} when not measured
    hops: tuple[HopCost, ...] = ()
    decode_step_hop_us: dict[str, float] = ge(0, default_factory=dict)  # batch -> p-1 fwd hops
    nccl_transport: tuple[TransportPoint, ...] = ()
    waived: tuple[Waiver, ...] = ()
    notes: tuple[str, ...] = ()
    run_time_s: dict[str, float] = ge(0, default_factory=dict)   # wall seconds per phase
    projected_run_time_s: dict[str, float | None] = ge(0, default_factory=dict)  # n GPUs -> s
    nics: tuple[str, ...] = ()                    # offline: NIC columns of nvidia-smi topo -m
    columns: tuple[str, ...] = ()                 # offline: trailing columns printed
    links_unknown: tuple[str, ...] = ()           # offline: "i-j" pairs the pasted text left unreadable

    @property
    def figure_label(self) -> Literal["measured", "given"]:
        """The label of this record's figures wherever the report shows them: a `topo -m` table
        the user pasted (`--from-nvidia-smi`, source "nvidia-smi") is `given` (the user gave
        it; nothing on the server was probed), what ppscope probed itself is `measured`."""
        return "given" if self.source == "nvidia-smi" else "measured"

    def unknown_hops(self) -> tuple[PipelineHop, ...]:
        """Pipeline hops whose link level is unknown (a cell the parser could not place, a pair
        the link map lacks). No verdict, link class or link speed is ever taken from them."""
        return tuple(h for h in self.pipeline_hops if h.link is None)
