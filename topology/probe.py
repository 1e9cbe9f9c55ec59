"""The topology probe: discovery + P2P matrices + ring + PP hop, as one record.

`run(cfg)` discovers the GPUs (NVML/sysfs/nvidia-smi), measures copy-engine bandwidth and
latency with cupy (topology/p2p.py), then launches topology/hop.py under torchrun for the NCCL
hop cost, and returns the record. It saves the record after every step (status `partial` until
the end, through `save_record`'s status rule), so Ctrl-C keeps what was measured; a step that
fails leaves an `error` record with what was kept.
`from_smi_text(text)` builds the offline record from a saved `nvidia-smi topo -m`.
Record layout: `TopologyData` (reports/base/payloads/topology.py); every pair key "i-j" has
i < j; units live in field names.
Run time: T(n) = t_start + n*t_host + n(n-1)/2*t_pair + t_ring + t_torchrun + t_sweep + n*t_hop
(see MODES); `data["run_time_s"]` holds this run's phase times and `projected_run_time_s` the
formula applied to 4 and 8 GPUs.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from microbench.kit import launch
from microbench.kit.run_writer import RunWriter
from reports.base.payloads.topology import (CopyLatency, HopCost, HostCopy, P2PCopy, PipelineHop,
                                            Ring, RingPair, TopoGpu, TopologyData, TransportPoint,
                                            Waiver)
from reports.base.records import Record, make_record
from reports.base.schema import SchemaError, from_json
from topology.links import hop_class, pair_key, pipeline_pairs

PROBE = "topology"
INCOMPLETE = "incomplete: measurement interrupted or still running"
MB = 1_000_000


@dataclass(frozen=True)
class TopologyConfig:
    json_path: Path
    gpus: tuple[int, ...] | None = None     # NVML indices in pipeline order (default: first pp)
    pp: int | None = None
    hidden: int = 7168
    tensors: int = 2
    mode: str = "default"                   # quick | default | thorough
    p2p: bool = True
    hop: bool = True
    hop_timeout_s: float = 180.0
    argv: tuple[str, ...] = ()


# Run time on n GPUs (what `run` records in data["run_time_s"] and projects to 8 GPUs):
#   T(n) = t_start + n * t_host + n(n-1)/2 * t_pair + t_ring + t_torchrun + t_sweep + n * t_hop
# t_pair (both directions, P2P on and off) dominates and scales with 1 / bandwidth: on PCIe Gen5
# (~53 GB/s P2P, ~20 GB/s host-staged) about 0.8 s by default and 0.13 s with --quick; t_hop is
# all batch sizes of one pipeline hop (~0.3 s default); t_torchrun is process start + NCCL init
# (~5-10 s). 8 PCIe GPUs: ~40 s default, ~15 s --quick; --thorough several minutes.
MODES: dict[str, dict[str, Any]] = {
    "quick": {"nbytes": 32 * MB, "samples": 1, "warmup_ms": 5.0, "staged_min_samples": 1, "batches": "1,8,64,256", "warmup": 3,
              "iters": 10, "blocks": 3, "sizes": "8,32768,8388608"},
    "default": {"nbytes": 160 * MB, "samples": 2, "warmup_ms": 10.0, "staged_min_samples": 3, "batches": "1,2,4,8,16,32,64,128,256",
                "warmup": 5, "iters": 20, "blocks": 5,
                "sizes": "8,128,2048,32768,524288,8388608,134217728"},
    "thorough": {"nbytes": 160 * MB, "samples": 10, "warmup_ms": 50.0, "staged_min_samples": 10,
                 "batches": "1,2,4,8,12,16,24,32,48,64,96,128,192,256", "warmup": 10,
                 "iters": 100, "blocks": 10, "sizes": "all"},
}


def available() -> str | None:
    """Why measurement cannot run here, or None."""
    from microbench.kit.gpus import nvml_gpu_count

    if nvml_gpu_count() == 0:
        return ("measuring the topology needs NVIDIA GPUs and their driver (NVML found none); "
                "on this machine you can still parse a saved `nvidia-smi topo -m` with "
                "`ppscope topology --from-nvidia-smi FILE`")
    return None


def classify_hops(links: dict[str, str], pipeline: list[int]) -> list[PipelineHop]:
    """Each directed pipeline hop with its link level and class."""
    out = []
    for src, dst in pipeline_pairs(pipeline):
        link = links.get(pair_key(src, dst))
        out.append(PipelineHop(src=src, dst=dst, link=link,
                               hop_class=hop_class(link) if link else None,
                               carries="tokens" if (src, dst) == (pipeline[-1], pipeline[0])
                               else "hidden_states"))
    return out


def decode_step_cost(hops: list[HopCost], pipeline: list[int]) -> dict[str, float]:
    """Per batch size: the sum of hop_us over the p-1 forward hops a micro-batch makes."""
    forward = {(pipeline[k], pipeline[k + 1]) for k in range(len(pipeline) - 1)}
    by_b: dict[str, float] = {}
    counts: dict[str, int] = {}
    for h in hops:
        if (h.src, h.dst) in forward and h.hop_us is not None:
            b = str(h.batch)
            by_b[b] = by_b.get(b, 0.0) + h.hop_us
            counts[b] = counts.get(b, 0) + 1
    return {b: v for b, v in by_b.items() if counts[b] == len(forward)}


def project_run_time_s(phases: dict[str, float], n: int, target: int) -> float | None:
    """T(target) from the phase wall times of a run on n >= 2 GPUs, by the formula above:
    per-GPU (host), per-pair (copies), per-hop (pipeline hops: n of them) terms rescaled,
    the rest (start-up, ring, torchrun start, sendrecv sweep) kept as is."""
    if n < 2 or not phases:
        return None
    pairs = lambda k: k * (k - 1) / 2  # noqa: E731
    fixed = sum(phases.get(k, 0.0) for k in ("start", "ring", "torchrun", "sweep"))
    return (fixed + phases.get("host", 0.0) * target / n
            + phases.get("pairs", 0.0) * pairs(target) / pairs(n)
            + phases.get("hops", 0.0) * target / n)


def build_data(disc, pipeline: list[int], *, p2p=(), latency=(), host=(), ring=None, hops=(),
               transport=(), hidden: int | None, tensors: int | None, mode: str, waived=(),
               source: str = "live") -> TopologyData:
    """The payload of topology.json from a Discovery and the measurements (payload objects;
    each hop gets its link level and class here)."""
    links = dict(disc.links)
    classes = {(c.src, c.dst): c for c in classify_hops(links, pipeline)}
    hop_list = []
    for h in hops:
        c = classes.get((h.src, h.dst))
        hop_list.append(replace(h, link=c.link if c else None,
                                hop_class=c.hop_class if c else None))
    return TopologyData(
        source=source,
        gpus=tuple(TopoGpu(**asdict(g)) for g in disc.gpus),
        links=links,
        links_source=disc.links_source,
        p2p_support=dict(disc.p2p_support),
        sockets=disc.sockets,
        numa_nodes=disc.numa_nodes,
        driver=disc.driver,
        pipeline=tuple(pipeline),
        pipeline_hops=tuple(classes.values()),
        hidden=hidden,
        tensors=tensors,
        mode=mode,
        p2p=tuple(p2p),
        latency=tuple(latency),
        host=tuple(host),
        ring=ring,
        hops=tuple(hop_list),
        decode_step_hop_us=decode_step_cost(hop_list, pipeline),
        # nccl-tests sendrecv_perf pattern over all pipeline GPUs (see topology/hop.py)
        nccl_transport=tuple(transport),
        waived=tuple(waived),
        notes=tuple(disc.notes),
    )


def from_smi_text(text: str, pipeline: list[int] | None = None, argv=None) -> Record:
    """Offline record from `nvidia-smi topo -m` text (raises TopoParseError when malformed)."""
    from topology.discover import Discovery
    from topology.smi_parse import parse_topo_matrix

    topo = parse_topo_matrix(text)
    pipeline = pipeline or list(range(len(topo.gpus)))
    bad = [g for g in pipeline if g >= len(topo.gpus)]
    if bad:
        raise ValueError(f"GPU {bad[0]} is not in the file (it lists {len(topo.gpus)} GPUs)")
    disc = Discovery(gpus=(), links=topo.links, p2p_support={}, sockets=None, numa_nodes=None,
                     links_source="nvidia-smi", notes=topo.notes)
    numa = {g.numa_node for g in topo.gpus if g.numa_node is not None}
    data = replace(build_data(disc, pipeline, hidden=None, tensors=None, mode="offline",
                              source="nvidia-smi"),
                   gpus=tuple(TopoGpu(**asdict(g)) for g in topo.gpus), nics=tuple(topo.nics),
                   columns=tuple(topo.columns), numa_nodes=len(numa) or None,
                   # pairs the text did not give readably (shown as "?")
                   links_unknown=tuple(topo.unknown_pairs))
    return make_record(PROBE, data, argv=argv)


# ---------------------------------------------------------------- live measurement


def _p2p_entries(bench, devices, cuda, disc, cfg_p2p, bar, on_step) -> tuple:
    """All pair measurements. `cuda` maps NVML index -> CUDA ordinal."""
    from topology.p2p import can_access_peer, peer_access

    p2p, lat = [], []
    for a in range(len(devices)):
        for b in range(a + 1, len(devices)):
            i, j = devices[a], devices[b]
            ci, cj = cuda[i], cuda[j]
            ok = can_access_peer(ci, cj)
            sup = disc.p2p_support.get(pair_key(i, j), {})
            why = (f"no P2P between GPU{i} and GPU{j}: CUDA cannot access peer "
                   f"(NVML read: {sup.get('read', '?')}, write: {sup.get('write', '?')}); "
                   "host-staged numbers given") if not ok else None
            for peer in (True, False):
                if peer and not ok:
                    for s, d in ((i, j), (j, i)):
                        for op in ("write", "read"):
                            p2p.append(P2PCopy(src=s, dst=d, op=op, direction="uni", p2p=True,
                                               status="waived", reason=why))
                        lat.append(CopyLatency(src=s, dst=d, p2p=True, status="waived",
                                               reason=why))
                    p2p.append(P2PCopy(src=i, dst=j, op="write", direction="bi", p2p=True,
                                       status="waived", reason=why))
                    bar.update(7)
                    continue
                with peer_access([(ci, cj)], on=peer):
                    for s, d, cs, cd in ((i, j, ci, cj), (j, i, cj, ci)):
                        ops = ("write", "read") if (peer and cfg_p2p.reads) else ("write",)
                        for op in ops:
                            r = bench.unidirectional(cs, cd, read=(op == "read"),
                                                     staged=not peer)
                            p2p.append(P2PCopy(src=s, dst=d, op=op, direction="uni", p2p=peer,
                                               **r))
                            bar.update(1)
                        lat.append(CopyLatency(src=s, dst=d, p2p=peer,
                                               **bench.latency(cs, cd, staged=not peer)))
                        bar.update(1)
                    if cfg_p2p.bidirectional:
                        p2p.append(P2PCopy(src=i, dst=j, op="write", direction="bi", p2p=peer,
                                           **bench.bidirectional(ci, cj, staged=not peer)))
                    bar.update(1)
                on_step(p2p, lat)
    return p2p, lat


def _ring(bench, devices, cuda, p2p: list[P2PCopy]) -> Ring:
    from topology.p2p import can_access_peer, peer_access

    pairs = pipeline_pairs(devices)
    peer_ok = [(cuda[s], cuda[d]) for s, d in pairs if can_access_peer(cuda[s], cuda[d])]
    use_p2p = len(peer_ok) == len(pairs)
    inv = {c: g for g, c in cuda.items()}
    with peer_access(peer_ok if use_p2p else [], on=True):
        res = bench.ring([(cuda[s], cuda[d]) for s, d in pairs])
    alone = {(e.src, e.dst): e.bandwidth_gbps for e in p2p
             if e.op == "write" and e.direction == "uni" and e.p2p == use_p2p
             and e.status == "ok"}
    out = []
    for r in res:
        s, d = inv[r["src"]], inv[r["dst"]]
        a = alone.get((s, d))
        out.append(RingPair(**{**r, "src": s, "dst": d}, alone_gbps=a,
                            ratio=r["bandwidth_gbps"] / a if a else None))
    ratios = [o.ratio for o in out if o.ratio is not None]
    return Ring(p2p=use_p2p, pairs=tuple(out), min_gbps=min(o.bandwidth_gbps for o in out),
                min_ratio=min(ratios) if ratios else None)


def run_hop(devices: list[int], cfg: TopologyConfig, out_json: Path, mode: dict) -> tuple:
    """torchrun topology.hop on `devices`; returns (its JSON: hops, transport, phase_s; None)
    or what it wrote before failing and the reason."""
    env = launch.repo_env(CUDA_DEVICE_ORDER="PCI_BUS_ID",
                          CUDA_VISIBLE_DEVICES=",".join(str(d) for d in devices))
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = launch.torchrun_command(len(devices), "topology.hop", [
        "--out", str(out_json), "--hidden", str(cfg.hidden), "--tensors", str(cfg.tensors),
        "--batches", mode["batches"], "--warmup", str(mode["warmup"]),
        "--iters", str(mode["iters"]), "--blocks", str(mode["blocks"]),
        "--sizes", mode["sizes"], "--timeout-s", str(min(cfg.hop_timeout_s, 120)),
        "--gpus", ",".join(str(d) for d in devices)])
    log = cfg.json_path.parent / f"{cfg.json_path.stem}_hop.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as lf:
        rc, timed_out = launch.run_group(cmd, env, cfg.hop_timeout_s, stdout=lf, grace_s=10)
    reason = (f"PP hop timed out after {cfg.hop_timeout_s:.0f} s (log: {log})" if timed_out
              else None if rc == 0 else f"torchrun exited with {rc} (log: {log})")
    got = json.loads(out_json.read_text()) if out_json.exists() else {}
    return got, reason


def hop_results(got: dict, source: str = "hops.json") -> tuple[list[HopCost],
                                                               list[TransportPoint]]:
    """topology/hop.py's JSON -> payload objects, checked field by field like a record."""
    try:
        return ([from_json(HopCost, h, f"{source}: hops[{k}]")
                 for k, h in enumerate(got.get("hops", []))],
                [from_json(TransportPoint, t, f"{source}: transport[{k}]")
                 for k, t in enumerate(got.get("transport", []))])
    except SchemaError as e:
        raise RuntimeError(f"PP hop results unusable: {e}") from None


@dataclass
class _Measured:
    """What a live run has measured so far (the record is rebuilt from it at every save)."""
    p2p: list[P2PCopy] = field(default_factory=list)
    latency: list[CopyLatency] = field(default_factory=list)
    host: list[HostCopy] = field(default_factory=list)
    ring: Ring | None = None
    hops: list[HopCost] = field(default_factory=list)
    transport: list[TransportPoint] = field(default_factory=list)
    waived: list[Waiver] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)  # wall s per phase (run-time formula)

    def kept(self) -> str:
        return (f"{len(self.p2p) + len(self.latency) + len(self.host)} copy measurements and "
                f"{len(self.hops)} PP hops kept")


def _devices(cfg: TopologyConfig, n: int) -> list[int]:
    if cfg.pp and not cfg.gpus and cfg.pp > n:  # never measure fewer GPUs than asked for
        raise ValueError(f"--pp {cfg.pp} but this machine has {n} GPU(s); "
                         f"use --pp {n} or leave it out to measure every GPU")
    devices = list(cfg.gpus) if cfg.gpus else list(range(cfg.pp or n))
    bad = [d for d in devices if d >= n or d < 0]
    if bad:
        raise ValueError(f"GPU {bad[0]} does not exist (this machine has {n})")
    return devices


def run(cfg: TopologyConfig) -> tuple[Record, str | None]:
    """Measure this machine. Saves the record to cfg.json_path as it goes (`partial` until the
    end, `error` if a step fails) and returns the last one with the writer's note."""
    from topology.discover import discover

    t_run = time.perf_counter()
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    mode = MODES[cfg.mode]
    disc = discover()
    devices = _devices(cfg, len(disc.gpus))
    m = _Measured()
    writer = RunWriter(cfg.json_path)

    def save(status: str = "partial", reason: str | None = INCOMPLETE,
             final: bool = False) -> tuple[Record, str | None]:
        data = build_data(disc, devices, p2p=m.p2p, latency=m.latency, host=m.host, ring=m.ring,
                          hops=m.hops, transport=m.transport, hidden=cfg.hidden,
                          tensors=cfg.tensors, mode=cfg.mode, waived=m.waived)
        projected = {str(k): project_run_time_s(m.phases, len(devices), k)
                     for k in (4, 8)} if final else {}
        data = replace(data, run_time_s={**m.phases, "total": time.perf_counter() - t_run},
                       projected_run_time_s=projected)
        rec = make_record(PROBE, data, argv=list(cfg.argv) or None, status=status,
                          reason=reason)
        return rec, writer.save(rec)[1]

    save()
    try:
        if len(devices) < 2:
            m.waived.append(Waiver("p2p", f"{len(devices)} GPU in use: P2P, ring and PP hop "
                                          "need two or more"))
        if cfg.p2p:
            _measure_copies(disc, devices, mode, m, t_run, save)
        if cfg.hop and len(devices) > 1:
            _measure_hop(cfg, devices, mode, m)
    except KeyboardInterrupt:
        save("partial", f"interrupted (Ctrl-C): {m.kept()}")
        raise
    except Exception as e:
        save("error", f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}; "
                      f"{m.kept()}")
        raise
    return save("ok", "; ".join(w.reason for w in m.waived) or None, final=True)


def _measure_copies(disc, devices: list[int], mode: dict, m: _Measured, t_run: float,
                    save) -> None:
    """Copy-engine matrices (cupy): host <-> GPU, every pair, then the ring."""
    from tqdm import tqdm

    try:
        from topology.p2p import Bench, P2PConfig, device_bus_ids, device_count
        cuda_bus = device_bus_ids(device_count())
    except ImportError as e:
        m.waived.append(Waiver("p2p", f"cupy unavailable ({e}); copy-engine matrices not "
                                      "measured"))
        return
    by_bus = {b: k for k, b in enumerate(cuda_bus)}
    cuda = {g.index: by_bus.get(g.pci_bus_id, g.index) for g in disc.gpus}
    pc = P2PConfig(nbytes=mode["nbytes"], samples=mode["samples"], warmup_ms=mode["warmup_ms"],
                   staged_min_samples=mode["staged_min_samples"])
    bench = Bench([cuda[d] for d in devices], pc)
    m.phases["start"] = time.perf_counter() - t_run
    npairs = len(devices) * (len(devices) - 1) // 2
    total = npairs * 12 + len(devices) + (1 if len(devices) > 1 else 0)
    with tqdm(total=total, desc="topology: copies", unit="step", file=sys.stderr,
              leave=False) as bar:
        t0 = time.perf_counter()
        for d in devices:
            m.host += [HostCopy(**{**h, "gpu": d}) for h in bench.host(cuda[d])]
            bar.update(1)
        m.phases["host"] = time.perf_counter() - t0
        save()

        def step(p2p, lat):
            m.p2p, m.latency = p2p, lat
            save()
        if len(devices) > 1:
            t0 = time.perf_counter()
            _p2p_entries(bench, devices, cuda, disc, pc, bar, step)
            m.phases["pairs"] = time.perf_counter() - t0
            m.ring = _ring(bench, devices, cuda, m.p2p)
            m.phases["ring"] = time.perf_counter() - t0 - m.phases["pairs"]
            bar.update(1)
    save()


def _measure_hop(cfg: TopologyConfig, devices: list[int], mode: dict, m: _Measured) -> None:
    """The PP hop and the sendrecv sweep under torchrun (topology/hop.py)."""
    try:
        import torch  # noqa: F401 - only to fail early with a clear reason
    except ImportError:
        m.waived.append(Waiver("hop", "torch not installed: PP hop not measured"))
        return
    with tempfile.TemporaryDirectory() as td:
        print(f"topology: PP hop over GPUs {devices} (torchrun, NCCL)...", file=sys.stderr)
        t0 = time.perf_counter()
        got, why = run_hop(devices, cfg, Path(td) / "hops.json", mode)
        m.hops, m.transport = hop_results(got)
        inner = got.get("phase_s", {})
        m.phases["sweep"], m.phases["hops"] = inner.get("sweep", 0.0), inner.get("hops", 0.0)
        m.phases["torchrun"] = time.perf_counter() - t0 - m.phases["sweep"] - m.phases["hops"]
        if why:
            m.waived.append(Waiver("hop", why))
