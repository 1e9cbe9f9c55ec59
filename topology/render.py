"""Human output of a topology record: tables (tabulate) and a PNG heatmap (matplotlib, Agg).

Tables: GPUs with NUMA node / CPU list / PCIe; the link matrix; bandwidth matrices in the
layout of cuda-samples' p2pBandwidthLatencyTest (rows = source, columns = destination, GB/s,
GB = 1e9 bytes) and latency matrices (us); pinned host<->device; the ring; each pipeline hop
with its class and cost per decode step, the parts of that cost, and the NCCL sendrecv sweep.
The JSON record stays the truth; this only renders it.
"""
from __future__ import annotations

import io
from pathlib import Path

from tabulate import tabulate

from reports.base.payloads.topology import HopCost, TopologyData
from reports.base.records import write_atomic
from topology.links import pair_key

LINK_ORDER = ("NV", "C2C", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC")


def _n(data: TopologyData) -> list[int]:
    return [g.index for g in data.gpus]


def _cell(v, fmt="{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def link_table(data: TopologyData) -> str:
    idx = _n(data)
    gpus = {g.index: g for g in data.gpus}
    rows = []
    for i in idx:
        row = [f"GPU{i}"]
        for j in idx:
            row.append("X" if i == j else data.links.get(pair_key(i, j), "?"))
        g = gpus[i]
        row += [_cell(g.numa_node, "{}"), g.cpu_affinity or "-"]
        rows.append(row)
    head = ["link"] + [f"GPU{j}" for j in idx] + ["NUMA", "CPUs"]
    sock = data.sockets
    title = f"Links (sockets: {sock if sock is not None else 'unknown'}, " \
            f"NUMA nodes: {data.numa_nodes or 'unknown'})"
    return title + "\n" + tabulate(rows, head, disable_numparse=True)


def gpu_table(data: TopologyData) -> str:
    rows = []
    for g in data.gpus:
        if g.name is None:  # an offline record: nvidia-smi topo -m names no GPU
            return ""
        mem = g.memory_bytes
        rows.append([g.index, g.name, g.pci_bus_id or "-",
                     _cell(mem / 1e9 if mem else None, "{:.0f}"),
                     f"{_cell(g.pcie_gen_current, '{}')}/{_cell(g.pcie_gen_max, '{}')}",
                     f"x{_cell(g.pcie_width_current, '{}')}/x{_cell(g.pcie_width_max, '{}')}",
                     _cell(g.numa_node, "{}")])
    return tabulate(rows, ["GPU", "name", "PCI bus", "memory (GB)", "PCIe gen (cur/max)",
                           "width (cur/max)", "NUMA"])


def matrix(data: TopologyData, entries: list, key: str, title: str, fmt="{:.2f}",
           symmetric: bool = False) -> str:
    """Rows = source, columns = destination; `entries` are P2PCopy or CopyLatency."""
    idx = list(data.pipeline) or _n(data)
    m = {(e.src, e.dst): e for e in entries}
    rows = []
    for i in idx:
        row = [i]
        for j in idx:
            e = m.get((i, j))
            if e is None and symmetric:  # bidirectional entries are stored once per pair
                e = m.get((j, i))
            if i == j:
                row.append("")
            elif e is None:
                row.append("-")
            elif e.status == "waived":
                row.append("WAIVED")
            else:
                row.append(_cell(getattr(e, key), fmt))
        rows.append(row)
    return title + "\n" + tabulate(rows, ["src\\dst"] + idx, disable_numparse=True)


def measurement_tables(data: TopologyData) -> list[str]:
    out = []

    def sel(op, direction, peer):
        return [e for e in data.p2p if e.op == op and e.direction == direction
                and e.p2p == peer]
    specs = [("write", "uni", False, "Unidirectional P2P=Disabled bandwidth (GB/s)"),
             ("write", "uni", True, "Unidirectional P2P=Enabled bandwidth, P2P writes (GB/s)"),
             ("read", "uni", True, "Unidirectional P2P=Enabled bandwidth, P2P reads (GB/s)"),
             ("write", "bi", False, "Bidirectional P2P=Disabled bandwidth (GB/s)"),
             ("write", "bi", True, "Bidirectional P2P=Enabled bandwidth (GB/s)")]
    for op, direction, peer, title in specs:
        es = sel(op, direction, peer)
        if es:
            out.append(matrix(data, es, "bandwidth_gbps", title, symmetric=direction == "bi"))
    for peer, title in ((False, "P2P=Disabled latency (us)"),
                        (True, "P2P=Enabled latency, P2P writes (us)")):
        es = [e for e in data.latency if e.p2p == peer]
        if es:
            out.append(matrix(data, es, "latency_us", title))
    if data.host:
        by: dict[int, dict[str, float | None]] = {}
        for h in data.host:
            by.setdefault(h.gpu, {})[h.direction] = h.bandwidth_gbps
        gnuma = {g.index: g.numa_node for g in data.gpus}
        out.append("Pinned host <-> device\n" + tabulate(
            [[g, _cell(gnuma.get(g), "{}"), _cell(v.get("h2d")), _cell(v.get("d2h"))]
             for g, v in sorted(by.items())],
            ["GPU", "NUMA", "H2D (GB/s)", "D2H (GB/s)"]))
    ring = data.ring
    if ring is not None and ring.pairs:
        out.append(f"Ring: all pipeline pairs copying at once (P2P {'on' if ring.p2p else 'off'})\n"
                   + tabulate([[f"{p.src}->{p.dst}", _cell(p.bandwidth_gbps),
                                _cell(p.alone_gbps), _cell(p.ratio)]
                               for p in ring.pairs],
                              ["pair", "in ring (GB/s)", "alone (GB/s)", "ring/alone"]))
    return out


def hop_table(data: TopologyData, show_batches=(1, 8, 32, 64, 256)) -> str:
    hops, classes = data.hops, data.pipeline_hops
    if not classes:
        return ""
    by: dict[tuple[int, int], dict[int, HopCost]] = {}
    for h in hops:
        by.setdefault((h.src, h.dst), {})[h.batch] = h
    batches = sorted({h.batch for h in hops} & set(show_batches)) if hops else []
    rows = []
    for c in classes:
        row = [f"{c.src}->{c.dst}", c.link or "?", c.hop_class or "?", c.carries]
        for b in batches:
            h = by.get((c.src, c.dst), {}).get(b)
            row.append(f"{_cell(h.hop_us, '{:.1f}')} ({_cell(h.nccl_us, '{:.1f}')})"
                       if h else "-")
        rows.append(row)
    step = data.decode_step_hop_us
    if batches and step:
        rows.append(["per decode step", "", "", f"{len(classes) - 1} fwd hops"] +
                    [_cell(step.get(str(b)), "{:.1f}") for b in batches])
    head = ["hop", "link", "class", "carries"] + [f"b={b} us" for b in batches]
    note = ("PP hops: SGLang-style send/recv one way (NCCL alone in brackets), microseconds"
            if batches else "PP hops (not measured)")
    return note + "\n" + tabulate(rows, head, disable_numparse=True)


def _median(xs: list[float]) -> float | None:
    xs = sorted(xs)
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


HOP_PARTS = (("hop_us", "hop (SGLang) us"), ("gloo_meta_us", "gloo meta us"),
             ("nccl_us", "torch send us"), ("overhead_us", "rest us"),
             ("nccl_transport_us", "NCCL transport us"), ("nccl_busbw_gbps", "busbw GB/s"))


def hop_parts_table(data: TopologyData) -> str:
    """Per batch size, the median over the measured hops of each part of hop_us."""
    if not data.hops:
        return ""
    rows = []
    for b in sorted({h.batch for h in data.hops}):
        hb = [h for h in data.hops if h.batch == b]
        rows.append([b, hb[0].bytes] + [
            _cell(_median([getattr(h, k) for h in hb if getattr(h, k) is not None]), "{:.1f}")
            for k, _ in HOP_PARTS])
    return ("PP hop, one way, median over hops: SGLang's cost = gloo metadata + torch send + "
            "rest; NCCL transport = back-to-back batched exchange (nccl-tests sendrecv_perf)\n"
            + tabulate(rows, ["batch", "bytes"] + [t for _, t in HOP_PARTS],
                       disable_numparse=True))


def transport_table(data: TopologyData) -> str:
    rows = [[t.bytes, _cell(t.nccl_transport_us), _cell(t.nccl_busbw_gbps)]
            for t in data.nccl_transport]
    if not rows:
        return ""
    return (f"NCCL sendrecv over {len(data.pipeline)} GPUs (each sends to the next, receives "
            "from the previous; compare nccl-tests sendrecv_perf)\n"
            + tabulate(rows, ["bytes", "time (us)", "busbw (GB/s)"], disable_numparse=True))


def render_text(rec) -> str:
    parts = [f"ppscope topology: {rec.status}" + (f" ({rec.reason})" if rec.reason else "")]
    data = rec.payload
    if data is None:
        return parts[0] + "\n"
    for t in (gpu_table(data), link_table(data), *measurement_tables(data), hop_table(data),
              hop_parts_table(data), transport_table(data)):
        if t:
            parts.append(t)
    return "\n\n".join(parts) + "\n"


def _level(link: str | None) -> int:
    if not link:
        return len(LINK_ORDER)
    for k, name in enumerate(LINK_ORDER):
        if link.startswith(name):
            return k
    return len(LINK_ORDER)


def write_png(data: TopologyData, path: Path) -> Path | None:
    """Heatmaps: link level, P2P write bandwidth, P2P latency (written atomically). None if
    nothing to draw."""
    png = png_bytes(data)
    return None if png is None else write_atomic(path, png)


def png_bytes(data: TopologyData) -> bytes | None:
    """The heatmaps of `write_png` as PNG bytes; None if nothing to draw."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    idx = _n(data)
    if len(idx) < 2:
        return None
    pos = {g: k for k, g in enumerate(idx)}
    panels = []
    lm = np.full((len(idx), len(idx)), np.nan)
    lab = [["X" if i == j else "" for j in idx] for i in idx]
    for key, link in data.links.items():
        i, j = (int(x) for x in key.split("-"))
        for a, b in ((i, j), (j, i)):
            lm[pos[a], pos[b]] = _level(link)
            lab[pos[a]][pos[b]] = link
    panels.append(("link level (nearer = darker)", lm, lab, "viridis"))
    for title, entries, key, cmap in (
            ("P2P write GB/s (P2P on)", [e for e in data.p2p if e.op == "write"
                                         and e.direction == "uni" and e.p2p],
             "bandwidth_gbps", "magma"),
            ("P2P latency us (P2P on)", [e for e in data.latency if e.p2p],
             "latency_us", "magma_r")):
        m = np.full((len(idx), len(idx)), np.nan)
        lb = [["" for _ in idx] for _ in idx]
        for e in entries:
            v = getattr(e, key)
            if v is not None and e.src in pos and e.dst in pos:
                m[pos[e.src], pos[e.dst]] = v
                lb[pos[e.src]][pos[e.dst]] = f"{v:.1f}"
        if np.isfinite(m).any():
            panels.append((title, m, lb, cmap))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4), squeeze=False)
    for ax, (title, m, lb, cmap) in zip(axes[0], panels):
        ax.imshow(np.ma.masked_invalid(m), cmap=cmap)
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(len(idx)), [f"GPU{j}" for j in idx], fontsize=7, rotation=90)
        ax.set_yticks(range(len(idx)), [f"GPU{i}" for i in idx], fontsize=7)
        for a in range(len(idx)):
            for b in range(len(idx)):
                if lb[a][b]:
                    ax.text(b, a, lb[a][b], ha="center", va="center", fontsize=6, color="k",
                            bbox={"facecolor": "w", "alpha": 0.6, "pad": 1, "lw": 0})
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
