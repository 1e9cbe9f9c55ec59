"""A verdict on each of the user's hypotheses: holds / does not hold / not enough evidence.

Each verdict names the number that decides it, taken from the attribution rows (share of the
ideal -> modelled gap at the highest concurrency) or straight from a record. Thresholds: a cause
"holds" when it explains >= 15% of the gap, "does not hold" below 5%; in between the verdict says
"minor". A hypothesis about runtime behaviour that no record measured (graph fallback, routing)
gets "not enough evidence" plus what the model would predict; routing skew is tested by
re-running the model at Zipf s = 1 (see `routing_verdict`).

With sglang.json (the user's own server), the herd verdict cites the slot sizes the server
logged next to the modelled ones; evenly filled observed slots overrule the modelled burst
admission ("does not hold"). The CUDA-graph verdict is decided by the log's `cuda graph` field,
else by the traces' share of kernels replayed from graphs, else by /metrics' decode passes on a
graph; stage imbalance by the traces' diagnosis, else by /metrics' run_batch seconds per rank
(reports/model/observed/metrics_verdicts.py), each set beside the other where both exist. Observed
numbers are cited, never fed into the model.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from reports.base.partition import imbalance
from reports.model.scenario import loop_builder as lb
from reports.model.attribution import Attribution
from reports.model.observed.bursts import BURST_SOURCE
from reports.model.causes import (BANDWIDTH, GRAPHS, HERD, HOLDS, HYPOTHESES, MINOR, NOISE,
                                   NOT, NUMA, ROUTING, STAGES, UNKNOWN)
from reports.model.observed.diagnose import span
from reports.base.payloads.sglang import SglangData
from reports.base.records import Record
from reports.model.scenario.inputs import Inputs
from reports.model.observed.server_log import dp_count, graph_off_number, graph_shares



@dataclass(frozen=True)
class VerdictAt:
    """The verdict at one concurrency, from the share of its cause's row there."""
    concurrency: int
    verdict: str
    share: float | None    # the cause row's share of the ideal -> modelled gap (None: no row)
    number: str


@dataclass(frozen=True)
class Verdict:
    hypothesis: str
    verdict: str           # over every concurrency judged (`combine`)
    number: str
    evidence: str
    cause: str | None = None          # the cause (reports/model/causes.py) that settles it
    at: tuple[VerdictAt, ...] = ()    # per concurrency, lowest C first


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


def observed_slots(sg: SglangData) -> dict | None:
    """Slot sizes the server logged: the rank the log reader picked for its run-wide index (the
    one with most decode lines), its #running-req min/median/max and the slot-imbalance index."""
    ranks, imb = sg.ranks, sg.slot_imbalance
    r = str(imb.rank) if imb is not None and imb.rank is not None else (
        max(ranks, key=lambda k: ranks[k].decode_lines) if ranks else None)
    if r is None or r not in ranks:
        return None
    d = ranks[r]
    if d.running_req.median is None:
        return None
    if d.by_dp and d.slot_imbalance is not None:
        # DP attention: the run-wide index is one DP rank's scheduler; the PP rank's own pools
        # every DP rank's windows (server_log.DP_RULES), so no DP rank is left out
        imb = d.slot_imbalance
    cv = imb.cv if imb is not None else None
    mom = imb.max_over_mean_median if imb is not None else None
    even = (d.decode_lines >= MIN_LINES and cv is not None and cv < EVEN_CV
            and (mom is None or mom < EVEN_MAX_OVER_MEAN))
    return {"rank": int(r), "dp_ranks": len(d.by_dp), "decode_lines": d.decode_lines,
            "min": d.running_req.min,
            "median": d.running_req.median, "max": d.running_req.max, "max_over_mean": mom,
            "cv": cv, "window": imb.window if imb is not None else None, "even": even}


def _g(x, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def observed_slots_text(o: dict) -> str:
    dp = f" of {o['dp_ranks']} DP ranks" if o.get("dp_ranks") else ""
    return (f"(log, PP rank {o['rank']}, {o['decode_lines']} decode lines{dp}): slot size median "
            f"{o['median']:g}, max {_g(o['max'], 'g')}; slot-imbalance max/mean {_g(o['max_over_mean'])}"
            f", cv {_g(o['cv'])}")


def graph_evidence(sg: SglangData) -> tuple[str, str, str] | None:
    """(verdict, number, evidence) on CUDA-graph fallback from the server's log (share of decode
    lines with `cuda graph: True`) and traces (kernels from graph replays vs launched one by one);
    the log decides when it has the field, else the traces. None when neither says anything."""
    from reports.model.observed.metrics_verdicts import beside, graph_share, graph_verdict
    met = graph_verdict(sg.metrics_window) if sg.metrics_window is not None else None
    met_share = graph_share(sg.metrics_window)
    fr = graph_shares(sg)   # per scheduler: each DP rank of a PP rank on its own
    gs = sg.log.graph_setting if sg.log is not None else None
    if gs is not None and gs.off_by_setting:   # eager on purpose: never read as a fallback
        return (NOT, beside(graph_off_number(gs.reasons, fr), NOT, met),
                "sglang.json (observed: log start-up lines)")
    tr = [(r, d.graph_kernels or 0, d.eager_kernels or 0, d.graph_launches or 0)
          for r, d in (sg.traces.ranks.items() if sg.traces else ()) if d.gpu_events]
    if not fr and not tr:
        return met      # /metrics alone, or nothing
    parts, srcs = [], []
    v = UNKNOWN
    if fr:
        r, lo, _ = min(fr, key=lambda x: x[1])
        parts.append(f"log: lowest per-rank share of decode batches on graphs {lo:.0%} (rank {r})")
        if dp_count(sg):   # the PP ranks' shares over every DP rank's batches, beside it
            parts.append("over all DP ranks' decode batches per PP rank " + ", ".join(
                f"{k}: {d.cuda_graph_frac:.0%}" for k, d in
                sorted(sg.ranks.items(), key=lambda kv: int(kv[0]))
                if d.cuda_graph_frac is not None))
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
    own = lo if fr else share
    return (v, beside("; ".join(parts), v, met, own, met_share),
            f"sglang.json (observed: {', '.join(srcs)})")


# Skew tested when the scenario states none: Zipf s = 1 (expert of popularity rank r picked
# with weight 1/r: the hottest of 384 experts in ~76% of tokens' top-8) -- strong, but in the
# range reported for MoE routers without a balancing loss.
TEST_ZIPF = 1.0


def routing_verdict(inp: Inputs, att: Attribution, records: dict[str, Record],
                    sizes: list[int]) -> Verdict:
    """Re-run the model with skew on (same path as the `routing_skew` switch: stage_floor's
    distinct experts) and take the stage spread from the routing Monte-Carlo at the largest
    slot. The slowdown either causes is judged as a share of the ideal -> modelled gap (TPOT)
    at the highest C: < 5% does not hold, < 15% minor, else holds. Labelled measured only when
    stage_cost.json timed the MoE layer with --zipf > 0."""
    from dataclasses import replace

    from reports.base.roofline import skew_spread

    C = att.concurrency
    s = inp.zipf_s or TEST_ZIPF
    base = lb.run(inp, C)
    skewed = lb.run(replace(inp, zipf_s=s), C)
    gap = att.modelled_tpot_ms - att.ideal_tpot_ms
    effect = skewed.tok_per_s / base.tok_per_s - 1 if base.tok_per_s else 0.0
    b = max(sizes)
    if inp.model.is_moe:
        stages = lb.pp_partition(inp.model.num_layers, inp.pp, inp.layer_partition)
        sp = skew_spread(inp.model, stages, b, s, draws=200, seed=0,
                         context_len=inp.mean_context_tokens)[b]
        spread, loss = sp.max_over_mean, sp.slowest_stage_loss
    else:
        spread, loss = None, 0.0
    # The hypothesis is that routing imbalance *slows* the pipeline: judge the slowdown (a
    # longer step from the skewed model, or the slowest stage's loss to routing noise). A
    # speed-up cannot explain the gap; it is cited, as a caveat on the uniform assumption.
    slow_ms = max(skewed.tpot_ms - base.tpot_ms, base.tpot_ms * loss, 0.0)
    share = slow_ms / gap if gap > 1e-12 else 0.0
    sc = records.get("stage_cost")
    measured = sc is not None and sc.payload.zipf_s > 0 and any(
        e.measured_us is not None for e in sc.payload.layers.get("moe", {}).values())
    away = elsewhere(sc, inp, "stage_cost.json") if measured else None
    label = ("stage_cost.json (measured with --zipf)" if measured and not away
             else "roofline Monte-Carlo (estimated)"
             + (f"; stage_cost.json's --zipf run not used: {away}" if away else ""))
    why = ("scenario's zipf_s" if inp.zipf_s else
           f"zipf_s = {s:g}: a strong but common skew; the scenario assumes uniform routing")
    num = (f"under PP every GPU holds all experts of its layers: skew s={s:g} ({why}) changes "
           f"modelled tok/s by {effect:+.1%} at C={C} (fewer distinct experts per micro-batch); "
           + (f"stage spread max/mean {spread:.3f} at b={b}, slowest stage "
              f"{loss:+.2%} from per-step routing noise; " if spread is not None else "")
           + f"slowdown = {share:.0%} of the gap"
           + ("; skew makes the pipeline faster, so it cannot explain the gap (if the router is "
              "this skewed, the uniform-routing model understates tok/s)" if effect > 0.005
              else ""))
    return _with_share(Verdict(ROUTING, _by_share(share), num, label), share)


def machine_of(rec: Record) -> str:
    """The machine a record describes, in words (GPU count and names from its provenance)."""
    g = list(rec.provenance.gpus)
    names = sorted(set(g))
    return (f"{len(g)}x {', '.join(names)} on host {rec.provenance.host}" if g
            else f"host {rec.provenance.host} (no GPU named)")


def other_machine(rec: Record, inp: Inputs) -> str | None:
    """Why `rec` does not describe the deployment's machine (another GPU kind, fewer GPUs than
    the pipeline), or None when it may. A record from another machine never decides a verdict
    about the user's machine."""
    from reports.base.gpu_specs import match_gpu
    g = list(rec.provenance.gpus)
    if rec.probe == "topology" and rec.payload is not None:
        named = [x.name for x in rec.payload.gpus if x.name]
        # a pasted table describes the machine it was printed on, not the one that parsed it
        g = named if (named or rec.payload.source == "nvidia-smi") else g
    g = [n for n in g if n]
    if not g:
        return None   # a pasted `topo -m` names no GPU: nothing says it is another machine
    kinds = {getattr(match_gpu(n), "name", n) for n in g}
    if kinds != {inp.gpu.name}:
        return f"it describes {len(g)}x {', '.join(sorted(set(g)))}, the deployment {inp.pp}x {inp.gpu.name}"
    if len(g) < inp.pp:
        return f"it describes {len(g)} GPUs, the deployment's pipeline has {inp.pp}"
    return None


def elsewhere(rec: Record | None, inp: Inputs, name: str) -> str | None:
    """`other_machine` in words naming the record (`graphs.json describes 1x NVIDIA H200, the
    deployment 8x ...`), or None when `rec` is absent or may be the deployment's machine."""
    why = other_machine(rec, inp) if rec is not None else None
    return why.replace("it describes", f"{name} describes", 1) if why else None


def _pair(h) -> str:
    a, b = sorted((h.src, h.dst))
    return f"GPU{a}\u2013GPU{b}"


def numa_verdict(inp: Inputs, topo: Record | None, hop_share: float, C: int) -> Verdict:
    """Cross-socket NUMA from topology.json: measured hop costs by link class when the probe
    timed hops, else the pipeline hops' link classes (a pasted `topo -m`: labelled `given`). A
    pipeline hop whose link is unknown leaves it undecided: an unreadable cell is never read as
    a socket crossing, a link class or a link speed."""
    H = NUMA
    if topo is None:
        return Verdict(H, UNKNOWN, f"hops = {hop_share:.0%} of the gap with estimated hop cost; "
                       "no topology.json", "scenario (estimated)")
    elsewhere = other_machine(topo, inp)
    if elsewhere:
        return Verdict(H, UNKNOWN, f"topology.json does not decide it: {elsewhere}; run "
                       "`ppscope topology` on the server (or --from-nvidia-smi its `topo -m`)",
                       f"topology.json ({machine_of(topo)})")
    d = topo.payload
    label = d.figure_label
    ev = f"topology.json ({label})"
    unknown = sorted({_pair(h) for h in d.unknown_hops()})
    if unknown:
        where = "in the pasted table" if label == "given" else "in the link map read here"
        known = [h for h in d.pipeline_hops if h.hop_class == "cross-socket"]
        return Verdict(H, UNKNOWN, f"undecided: link{'s' if len(unknown) > 1 else ''} "
                       f"{', '.join(unknown)} unknown {where} (the pipeline hop over "
                       f"{'them' if len(unknown) > 1 else 'it'} may or may not cross a socket)"
                       + ("; known to cross: " + ", ".join(f"GPU{h.src}->GPU{h.dst} {h.link}"
                                                           for h in known) if known else ""),
                       ev)
    cls: dict[str, list[float]] = {}
    for h in d.hops:
        if h.hop_us is not None:
            cls.setdefault(h.hop_class or "?", []).append(h.hop_us)
    if cls:   # hops timed by the probe: cross-socket hop cost against the others
        cross = cls.get("cross-socket")
        near = [v for k, vs in cls.items() if k != "cross-socket" for v in vs]
        if not cross:
            return Verdict(H, NOT, "no PP hop crosses a socket", ev)
        ratio = (sum(cross) / len(cross)) / (sum(near) / len(near)) if near else None
        return Verdict(H, _by_share(hop_share), f"hops = {hop_share:.0%} of the gap; "
                       "cross-socket hop " + (f"{ratio:.2f}x same-socket" if ratio else "only"),
                       ev)
    crossing = [h for h in d.pipeline_hops if h.hop_class == "cross-socket"]
    if not d.pipeline_hops:
        return Verdict(H, UNKNOWN, "topology.json has no pipeline hop with a link level", ev)
    if not crossing:
        return Verdict(H, NOT, f"no PP hop crosses a socket (link levels {label}, no hop "
                       "timed)", ev)
    src, hev = inp.src("hop_us")
    return Verdict(H, _by_share(hop_share),
                   f"{len(crossing)} PP hop(s) cross a socket ("
                   + ", ".join(f"GPU{h.src}->GPU{h.dst} {h.link}" for h in crossing)
                   + f", link levels {label}); hops = {hop_share:.0%} of the gap at C={C} with "
                   f"the hop cost {src}, not timed on these links", f"{ev} + {hev} ({src})")


def observed_verdicts(diag) -> dict[str, Verdict]:
    """Verdicts decided by the diagnosis of the observed server (reports/model/observed/diagnose.py;
    `diag`: report.json's `diagnosis`, reports/model/report_type.py `ServerDiagnosis`):
    a cause holds when it slows the server by >= 10%, does not hold under 3%; where the
    diagnosis has intervals, it holds only where the size's whole interval is >= 10%, and one
    whose interval straddles 10% is within noise (reports/model/observed/diagnose.py)."""
    if diag is None or diag.status != "ok":
        return {}
    rows = {r.cause: r for r in diag.rows}
    ev = f"sglang.json traces at C={diag.concurrency} (observed)"
    # the micro-batches come from the benchmark's first burst where the log shows it
    # (reports/model/observed/bursts.py), else from the traced window
    herd_ev = (f"{ev}, micro-batches from the server log's first burst of "
               f"{diag.concurrency} (observed)"
               if diag.deployment.sources.get("sizes") == BURST_SOURCE else ev)

    def v(cause: str) -> str:
        size = rows[cause].size_pct or 0.0
        lo, hi = rows[cause].size_ci or (size, size)
        if lo >= 10:
            return HOLDS
        if hi >= 10:        # the interval straddles the threshold that decides it
            return NOISE
        return NOT if size < 3 else MINOR

    def num(cause: str) -> str:
        r = rows[cause]
        return f"slows the observed server by {r.size_pct or 0:.0f}%{span(r.size_ci)}: {r.detail}"
    hop = rows["hop"]
    C = int(diag.concurrency)

    def at(x: Verdict) -> Verdict:   # decided at the traced concurrency only
        return replace(x, cause=HYPOTHESES.get(x.hypothesis),
                       at=(VerdictAt(C, x.verdict, None, x.number),))
    return {k: at(x) for k, x in {
        HERD: Verdict(HERD, v("herd"), num("herd"), herd_ev),
        GRAPHS: Verdict(GRAPHS, v("launch_gaps"),
                                       num("launch_gaps"), ev),
        STAGES: Verdict(STAGES, v("slow_stage"), num("slow_stage"), ev),
        BANDWIDTH: Verdict(
            BANDWIDTH, {HOLDS: NOT, NOT: HOLDS, NOISE: NOISE}.get(v("hop"), MINOR),
            f"hops and waits on communication slow the observed server by "
            f"{hop.size_pct or 0:.0f}%{span(hop.size_ci)}: {hop.detail}", ev),
    }.items()}


def verdicts(inp: Inputs, atts: list[Attribution], records: dict[str, Record],
             diagnosis=None) -> list[Verdict]:
    """Model-based verdicts, replaced by the observed server's where its diagnosis decides
    them (`observed_verdicts`)."""
    base = model_verdicts(inp, atts, records)
    obs = observed_verdicts(diagnosis)
    sg = records.get("sglang")
    gs = sg.payload.log.graph_setting if sg is not None and sg.payload.log is not None else None
    if gs is not None and gs.off_by_setting:   # graphs off on purpose: the setting is the answer
        obs.pop(GRAPHS, None)
    out = [obs.get(x.hypothesis, x) for x in base]
    return with_metrics(out, sg.payload.metrics_window if sg is not None else None)


def with_metrics(vs: list[Verdict], window) -> list[Verdict]:
    """The /metrics window's verdicts (reports/model/observed/metrics_verdicts.py): deciding stage
    imbalance where no observed evidence did, set beside the observed ones otherwise (their
    disagreement said). The graph verdict's own evidence takes it in `graph_evidence`."""
    from reports.model.observed import metrics_verdicts as mv
    if window is None:
        return vs
    st = mv.slow_stage(window)
    out = []
    for v in vs:
        if v.hypothesis == STAGES and st is not None:
            if "(observed" in v.evidence:
                v = replace(v, number=mv.beside(v.number, v.verdict, st))
            else:
                v = Verdict(STAGES, st[0], st[1], st[2], HYPOTHESES.get(STAGES))
        out.append(v)
    return out


# Strength of a verdict on a harmful cause (the herd, graphs, ...): over the concurrencies it
# takes the strongest, since a cause that holds at one measured C is a cause the user has.
# BANDWIDTH is the other way round: it holds only where it holds at every C.
_RANK = {HOLDS: 3, MINOR: 2, NOISE: 1.5, NOT: 1, UNKNOWN: 0}


def combine(per_c: list[Verdict], concurrencies: list[int]) -> Verdict:
    """One hypothesis judged at each concurrency (`per_c[i]` at `concurrencies[i]`)."""
    first = per_c[0]
    cause = HYPOTHESES.get(first.hypothesis)
    at = tuple(VerdictAt(C, v.verdict, v.at[0].share if v.at else None, v.number)
               for C, v in sorted(zip(concurrencies, per_c), key=lambda x: x[0]))
    decided = [a for a in at if a.verdict != UNKNOWN]
    if not decided:
        pick = at[-1]
    elif first.hypothesis == BANDWIDTH:
        pick = min(decided, key=lambda a: (-{HOLDS: 1, MINOR: 2, NOISE: 2.5, NOT: 3}[a.verdict],
                                           -a.concurrency))
    else:
        pick = max(decided, key=lambda a: (_RANK[a.verdict], a.share or 0.0, a.concurrency))
    src = dict(zip(concurrencies, per_c))[pick.concurrency]
    rows = ", ".join(f"C={a.concurrency} {a.share:.0%}" for a in at if a.share is not None)
    if first.hypothesis == BANDWIDTH:   # judged by the link's utilisation, not a share
        number = pick.number.split("; ")[0] + f" at C={pick.concurrency}" + (
            f"; hop row {rows} of the gap" if rows else "")
    elif len(at) > 1 and len({a.verdict for a in at}) > 1:
        where = "; ".join(
            f"{v} at " + ", ".join(f"C={a.concurrency}" + (f" ({a.share:.0%})" if a.share
                                                            is not None else "")
                                   for a in at if a.verdict == v)
            for v in sorted({a.verdict for a in at}, key=lambda v: -_RANK[v]))
        number = f"{pick.number}; by concurrency: {where} of the gap (row {cause})"
    else:
        number = pick.number
    return Verdict(first.hypothesis, pick.verdict, number, src.evidence, cause, at)


def model_verdicts(inp: Inputs, atts: list[Attribution], records: dict[str, Record]
                   ) -> list[Verdict]:
    """Every hypothesis judged at every concurrency modelled (`combine`)."""
    per = [_verdicts_at(inp, att, records) for att in atts]
    Cs = [a.concurrency for a in atts]
    return [combine([p[i] for p in per], Cs) for i in range(len(per[0]))]


def _with_share(v: Verdict, share: float | None) -> Verdict:
    return replace(v, cause=HYPOTHESES.get(v.hypothesis),
                   at=(VerdictAt(0, v.verdict, share, v.number),))


def _verdicts_at(inp: Inputs, att: Attribution, records: dict[str, Record]) -> list[Verdict]:
    C = att.concurrency
    out = []
    # 1. bandwidth is not the limit: link bytes/s vs link bandwidth, and the hop row
    hop_share = _share(att, "hop")
    tok = att.modelled_tok_per_s
    gbps = tok * 4 * inp.model.hidden / 1e9  # hidden + residual per token per hop, bf16
    bw = inp.gpu.link_gbps  # the link the PP hop actually uses
    src, ev = inp.src("hop_us")
    # The hypothesis is about bandwidth: judge it by link utilisation. What a hop costs in
    # latency (gloo metadata, launch, sync) is reported beside it, since it is not bandwidth.
    util = gbps / bw if bw else 0.0
    away = elsewhere(records.get("topology"), inp, "topology.json") if src != "estimated" \
        else None
    out.append(Verdict(BANDWIDTH,
                       HOLDS if util < 0.10 else (MINOR if util < 0.5 else NOT),
                       f"link carries {gbps * 1e3:.1f} MB/s of {bw:.0f} GB/s ({util:.2%}); "
                       f"hop latency (not bandwidth) = {hop_share:.0%} of the gap at C={C}"
                       + (f" with another machine's hop cost ({away})" if away else ""),
                       # decided by the deployment's link bandwidth, never another machine's hops
                       f"{inp.gpu.name} link bandwidth (spec); hop cost from {ev}, which "
                       f"describes {machine_of(records['topology'])}" if away
                       else f"{ev} ({src})"))
    # 2. herd / uneven split
    herd = _share(att, "herd")
    sizes = [s for s in lb.admitted_sizes(inp, C) if s]
    sg = records.get("sglang")
    obs = observed_slots(sg.payload) if sg is not None else None
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
    out.append(Verdict(HERD, v, num, ev))
    # 3. CUDA-graph fallback
    gr = records.get("graphs")
    launch = _share(att, "launch_gaps")
    gv = graph_evidence(sg.payload) if sg is not None else None
    if gv is not None:
        out.append(Verdict(GRAPHS, gv[0], gv[1], gv[2]))
    elif away := elsewhere(gr, inp, "graphs.json"):   # never another machine's
        out.append(Verdict(GRAPHS, UNKNOWN,
                           f"graphs.json does not decide it: {away}; run `ppscope graphs` on "
                           "the server, or give its SGLang log", f"graphs.json ({machine_of(gr)})"))
    elif gr is not None:
        out.append(Verdict(GRAPHS, _by_share(launch),
                           f"launch/padding = {launch:.0%} of the gap; graph max bs "
                           f"{inp.graph_max_bs}, largest slot {max(sizes)}", "graphs.json (measured)"))
    else:
        out.append(Verdict(GRAPHS, UNKNOWN,
                           f"model predicts {launch:.0%} of the gap (largest slot {max(sizes)} <= "
                           f"graph max bs {inp.graph_max_bs}); no graphs.json or SGLang logs",
                           "scenario (estimated)"))
    # 4. cross-socket NUMA
    out.append(numa_verdict(inp, records.get("topology"), hop_share, C))
    # 5. MoE routing imbalance
    out.append(routing_verdict(inp, att, records, sizes))
    # 6. stage imbalance
    costs = lb.stage_cost_us(inp, lb.ALL_ON, max(sizes))
    imb = _share(att, "slow_stage")
    src, ev = inp.src("kernel_efficiency")
    sc = records.get("stage_cost")
    num = f"{imb:.0%} of the gap; slowest stage {imbalance(costs):.2f}x the mean at b={max(sizes)}"
    if away := elsewhere(sc, inp, "stage_cost.json"):   # its stage costs are another machine's
        out.append(Verdict(STAGES, UNKNOWN, f"stage_cost.json does not decide it: {away}; the "
                           f"model with its efficiency carried over gives {num}; run `ppscope "
                           "stage-cost` on the server, or give its /metrics or traces",
                           f"stage_cost.json ({machine_of(sc)})"))
    else:
        out.append(Verdict(STAGES, _by_share(imb), num, f"{ev} ({src})"))
    shares = {"hop": hop_share, "herd": herd, "launch_gaps": launch, "slow_stage": imb}
    return [v if v.at else _with_share(v, shares.get(HYPOTHESES.get(v.hypothesis)))
            for v in out]
