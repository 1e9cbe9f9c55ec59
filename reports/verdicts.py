"""A verdict on each of the user's hypotheses: holds / does not hold / not enough evidence.

Each verdict names the number that decides it, taken from the attribution rows (share of the
ideal -> modelled gap at the highest concurrency) or straight from a record. Thresholds: a cause
"holds" when it explains >= 15% of the gap, "does not hold" below 5%; in between the verdict says
"minor". A hypothesis about runtime behaviour that no record measured (graph fallback, routing)
gets "not enough evidence" plus what the model would predict.

With sglang.json (the user's own server), the herd verdict cites the slot sizes the server
logged next to the modelled ones; evenly filled observed slots overrule the modelled burst
admission ("does not hold"). The CUDA-graph verdict is decided by the log's `cuda graph` field,
else by the traces' share of kernels replayed from graphs. Observed numbers are cited, never
fed into the model.
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


# Observed slot sizes (`#running-req` per decode line, one slot's size under PP): "even" when the
# sampled sizes barely vary (coefficient of variation < 0.25 and max/mean per window < 1.25)
# over at least MIN_LINES lines. The log samples every --decode-log-interval steps, so a few
# lines can miss slots; below MIN_LINES the observation is cited but does not decide.
EVEN_CV, EVEN_MAX_OVER_MEAN, MIN_LINES = 0.25, 1.25, 8
# Traces: a rank whose GPU kernels mostly (>= half) come from graph replays runs decode on
# graphs; NCCL, copies and sampling are launched one by one even then, so 100% is not expected.
GRAPH_KERNEL_SHARE = 0.5


def observed_slots(sg: dict) -> dict | None:
    """Slot sizes the server logged: the rank the log reader picked for its run-wide index (the
    one with most decode lines), its #running-req min/median/max and the slot-imbalance index."""
    ranks = sg.get("ranks") or {}
    imb = sg.get("slot_imbalance") or {}
    r = str(imb["rank"]) if imb.get("rank") is not None else (
        max(ranks, key=lambda k: ranks[k].get("decode_lines") or 0) if ranks else None)
    if r is None or r not in ranks:
        return None
    d = ranks[r]
    rr = d.get("running_req") or {}
    if rr.get("median") is None:
        return None
    cv, mom = imb.get("cv"), imb.get("max_over_mean_median")
    n = int(d.get("decode_lines") or 0)
    even = (n >= MIN_LINES and cv is not None and cv < EVEN_CV
            and (mom is None or mom < EVEN_MAX_OVER_MEAN))
    return {"rank": int(r), "decode_lines": n, "min": rr.get("min"), "median": rr["median"],
            "max": rr.get("max"), "max_over_mean": mom, "cv": cv, "window": imb.get("window"),
            "even": even}


def _g(x, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def observed_slots_text(o: dict) -> str:
    return (f"(log, PP rank {o['rank']}, {o['decode_lines']} decode lines): slot size median "
            f"{o['median']:g}, max {_g(o['max'], 'g')}; slot-imbalance max/mean {_g(o['max_over_mean'])}"
            f", cv {_g(o['cv'])}")


def graph_evidence(sg: dict) -> tuple[str, str, str] | None:
    """(verdict, number, evidence) on CUDA-graph fallback from the server's log (share of decode
    lines with `cuda graph: True`) and traces (kernels from graph replays vs launched one by one);
    the log decides when it has the field, else the traces. None when neither says anything."""
    fr = [(r, d["cuda_graph_frac"]) for r, d in (sg.get("ranks") or {}).items()
          if d.get("cuda_graph_frac") is not None]
    tr = [(r, int(d.get("graph_kernels") or 0), int(d.get("eager_kernels") or 0),
           int(d.get("graph_launches") or 0))
          for r, d in ((sg.get("traces") or {}).get("ranks") or {}).items()
          if d.get("gpu_events")]
    if not fr and not tr:
        return None
    parts, srcs = [], []
    v = UNKNOWN
    if fr:
        r, lo = min(fr, key=lambda x: x[1])
        parts.append(f"log: lowest per-rank share of decode batches on graphs {lo:.0%} (rank {r})")
        srcs.append("log")
        v = HOLDS if lo < 0.9 else NOT
    if tr:
        r, g, e, n = min(tr, key=lambda x: x[1] / max(1, x[1] + x[2]))
        share = g / max(1, g + e)
        parts.append(f"traces: {share:.0%} of GPU kernels from graph replays on rank {r} "
                     f"({g} graph / {e} one by one, {n} graph launches)")
        srcs.append("traces")
        if not fr:
            v = HOLDS if share < GRAPH_KERNEL_SHARE else NOT
    return v, "; ".join(parts), f"sglang.json (observed: {', '.join(srcs)})"


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
    sg = records.get("sglang")
    obs = observed_slots(sg.data) if sg is not None else None
    num = (f"{herd:.0%} of the gap at C={C}; modelled {len(sizes)} occupied slot(s) {sizes} "
           f"for {inp.pp} stages")
    v = _by_share(herd)
    adm = f"{inp.src('max_micro_batch')[1]} (admission modelled, estimated)"
    if obs is not None:
        num += "; observed " + observed_slots_text(obs)
        if obs["even"]:
            v = NOT
            num += " -- the server's slots are even, so the modelled burst admission does not apply"
        ev = f"sglang.json (observed slots, log) + {adm}"
    else:
        ev = adm
    out.append(Verdict("thundering herd / uneven split", v, num, ev))
    # 3. CUDA-graph fallback
    gr = records.get("graphs")
    launch = _share(att, "launch_overhead")
    gv = graph_evidence(sg.data) if sg is not None else None
    if gv is not None:
        out.append(Verdict("CUDA-graph fallback", gv[0], gv[1], gv[2]))
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
