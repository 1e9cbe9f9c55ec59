"""A verdict on each of the user's hypotheses: holds / does not hold / not enough evidence.

Each verdict names the number that decides it, taken from the attribution rows (share of the
ideal -> modelled gap at the highest concurrency) or straight from a record. Thresholds: a cause
"holds" when it explains >= 15% of the gap, "does not hold" below 5%; in between the verdict says
"minor". A hypothesis about runtime behaviour that no record measured (graph fallback, routing)
gets "not enough evidence" plus what the model would predict.
"""
from __future__ import annotations

from dataclasses import dataclass

from reports import loop_builder as lb
from reports.attribution import Attribution
from reports.records import Record
from reports.scenario import Inputs

HOLDS, MINOR, NOT, UNKNOWN = "holds", "minor", "does not hold", "not enough evidence"


@dataclass(frozen=True)
class Verdict:
    hypothesis: str
    verdict: str
    number: str
    evidence: str


def _share(att: Attribution, *causes: str) -> float:
    return sum((r.share or 0.0) for r in att.rows if r.cause in causes)


def _by_share(s: float) -> str:
    return HOLDS if s >= 0.15 else (NOT if s < 0.05 else MINOR)


def verdicts(inp: Inputs, atts: list[Attribution], records: dict[str, Record]) -> list[Verdict]:
    att = max(atts, key=lambda a: a.concurrency)
    C = att.concurrency
    out = []
    # 1. bandwidth is not the limit: link bytes/s vs link bandwidth, and the hop row
    hop_share = _share(att, "p2p_hops")
    tok = att.modelled_tok_per_s
    gbps = tok * 4 * inp.model.hidden / 1e9  # hidden + residual per token per hop, bf16
    bw = lb.PCIE_GBPS_PER_LANE.get(inp.gpu.pcie_gen, 3.938) * inp.gpu.pcie_lanes
    src, ev = inp.src("hop_us")
    # The hypothesis is about bandwidth: judge it by link utilisation. What a hop costs in
    # latency (gloo metadata, launch, sync) is reported beside it, since it is not bandwidth.
    util = gbps / bw if bw else 0.0
    out.append(Verdict("bandwidth is not the limit",
                       HOLDS if util < 0.10 else (MINOR if util < 0.5 else NOT),
                       f"link carries {gbps * 1e3:.1f} MB/s of {bw:.0f} GB/s ({util:.2%}); "
                       f"hop latency (not bandwidth) = {hop_share:.0%} of the gap at C={C}",
                       f"{ev} ({src})"))
    # 2. herd / uneven split
    herd = _share(att, "slot_imbalance", "too_few_microbatches")
    sizes = [s for s in lb.admitted_sizes(inp, C) if s]
    ev = "sglang.json (observed slots)" if "sglang" in records else \
        f"{inp.src('max_micro_batch')[1]} (admission modelled, estimated)"
    out.append(Verdict("thundering herd / uneven split", _by_share(herd),
                       f"{herd:.0%} of the gap at C={C}; {len(sizes)} occupied slot(s) "
                       f"{sizes} for {inp.pp} stages", ev))
    # 3. CUDA-graph fallback
    gr, sg = records.get("graphs"), records.get("sglang")
    launch = _share(att, "launch_overhead")
    if sg is not None:
        fr = [r.get("cuda_graph_frac") for r in (sg.data.get("ranks") or {}).values()
              if r.get("cuda_graph_frac") is not None]
        lo = min(fr) if fr else None
        out.append(Verdict("CUDA-graph fallback",
                           UNKNOWN if lo is None else (HOLDS if lo < 0.9 else NOT),
                           "no cuda graph field in the logs" if lo is None else
                           f"lowest per-rank share of decode batches on graphs: {lo:.0%}",
                           "sglang.json (observed)"))
    elif gr is not None:
        out.append(Verdict("CUDA-graph fallback", _by_share(launch),
                           f"launch/padding = {launch:.0%} of the gap; graph max bs "
                           f"{inp.graph_max_bs}, largest slot {max(sizes)}", "graphs.json (measured)"))
    else:
        out.append(Verdict("CUDA-graph fallback", UNKNOWN,
                           f"model predicts {launch:.0%} of the gap (largest slot {max(sizes)} <= "
                           f"graph max bs {inp.graph_max_bs}); no graphs.json or SGLang logs",
                           "scenario (estimated)"))
    # 4. cross-socket NUMA
    topo = records.get("topology")
    if topo is None:
        out.append(Verdict("cross-socket NUMA", UNKNOWN,
                           f"hops = {hop_share:.0%} of the gap with estimated hop cost; "
                           "no topology.json", "scenario (estimated)"))
    else:
        hops = topo.data.get("hops") or []
        cls: dict[str, list[float]] = {}
        for h in hops:
            if h.get("hop_us") is not None:
                cls.setdefault(h.get("hop_class", "?"), []).append(float(h["hop_us"]))
        cross = cls.get("cross-socket")
        near = [v for k, vs in cls.items() if k != "cross-socket" for v in vs]
        if not cross:
            out.append(Verdict("cross-socket NUMA", NOT, "no PP hop crosses a socket",
                               "topology.json (measured)"))
        else:
            ratio = (sum(cross) / len(cross)) / (sum(near) / len(near)) if near else None
            out.append(Verdict("cross-socket NUMA", _by_share(hop_share),
                               f"hops = {hop_share:.0%} of the gap; cross-socket hop "
                               + (f"{ratio:.2f}x same-socket" if ratio else "only"),
                               "topology.json (measured)"))
    # 5. MoE routing imbalance
    skew = _share(att, "routing_skew")
    out.append(Verdict("MoE routing imbalance", UNKNOWN if inp.zipf_s == 0 else _by_share(skew),
                       f"no routing measurement; uniform routing assumed (zipf_s = {inp.zipf_s})"
                       if inp.zipf_s == 0 else f"skew = {skew:.0%} of the gap",
                       "scenario (estimated)"))
    # 6. stage imbalance
    costs = lb.stage_cost_us(inp, lb.ALL_ON, max(sizes))
    imb = _share(att, "stage_imbalance")
    src, ev = inp.src("kernel_efficiency")
    out.append(Verdict("stage imbalance", _by_share(imb),
                       f"{imb:.0%} of the gap; slowest stage {max(costs) / (sum(costs) / len(costs)):.2f}x "
                       f"the mean at b={max(sizes)}", f"{ev} ({src})"))
    return out
