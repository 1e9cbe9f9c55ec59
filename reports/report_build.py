"""Assemble the report (reports/model/report_type.py `Report`; its `to_json()` is report.json,
the truth the Markdown, HTML and terminal table render).

Levels per concurrency: `ideal` (every switch off), `predicted` (the model, every switch on),
`observed` (the user's benchmark). Attribution rows, verdicts, what-ifs, parameters with their
source, warnings about skipped records, (when dispatch.json exists) the model-vs-probe check, the
PP link map when topology.json exists (with its source label: `given` for a pasted `topo -m`,
its unknown links and parse notes), `server` when sglang.json exists (the user's own server:
per-rank observed busy, NCCL receive share, dispatch latency, decode lines, CUDA-graph share and
slot sizes, next to the modelled busy per stage; with DP attention each DP rank's log figures
and the rule that combines them; every figure observed, with its source),
`measured_timeline` when dispatch.trace.json exists (which probe point the plot shows), and
`answer`: 3-5 sentences written from those numbers
(biggest cause of the gap per concurrency, verdicts that hold, the recommended server setting
with its effect at each measured concurrency, unexplained gap). `assumptions` adds, for each
server setting the user did not give, what depends on the value assumed; `model_differs` lists
where the model is still simpler than SGLang.
"""
from __future__ import annotations

from dataclasses import fields, replace

from reports.model import loop_builder as lb
from reports.model.attribution import attribute
from reports.base.payloads.topology import HopCost, TopologyData
from reports.base.payloads.sglang import SglangData
from reports.base.records import Record
from reports.model.report_type import (REPORT_SCHEMA, AttributionAt, BenchRow, BenchRun,
                                       Comparison,
                                       BusyOverTime, Hop, Level, NotDiagnosed, ObservedLoop,
                                       PipelineHop, Report, ScenarioDeployment, ServerDiagnosis,
                                       ServerRank, ServerSlotImbalance, ServerSources,
                                       ServerSummary, StageCost, TimeSplit, TopologySummary)
from reports.model.scenario import Inputs
from reports.model.server_log import (DP_RULES, attention_lines, dp_count, log_figures,
                                      moe_kernel_lines)
from reports.model.validate_dispatch import micro_batch_choices, validate
from reports.model.verdicts import Verdict, VerdictAt, verdicts
from reports.model.settings_change import TP_KNOB, WhatIf
from reports.model.whatif import (OBJECTIVE, best_pair, measured_concurrency, recommendation,
                                  setting_of, transport_points, what_ifs)
from reports.base.slots import burst_sizes

def build_report(inp: Inputs, records: dict[str, Record],
                 baseline: tuple[str, Report] | None = None) -> Report:
    """`baseline`: (label, report.json of an earlier run) to say what changed since."""
    atts = [attribute(inp, C) for C in inp.concurrency]
    from reports.model.observed_server import differs_from, observed_server
    observed_dep = observed_server(records["sglang"].payload) if "sglang" in records else None
    differs = differs_from(observed_dep, pp=inp.pp, gpu=inp.gpu.name, scenario=inp.name)
    # the observed tok/s is the traced server's: set beside the scenario's model only when the
    # scenario is that deployment (else "observed / modelled" compares two different servers)
    obs = {} if differs else dict(inp.observed)
    conc = []
    for C, a in zip(inp.concurrency, atts):
        sim = lb.run(inp, C)
        conc.append(Level(C, a.ideal_tok_per_s, a.modelled_tok_per_s, obs.get(C), sim.tpot_ms,
                          tuple(sim.busy_frac), tuple(sim.slot_sizes)))
    from reports.model.arrival import alternatives
    arrival = alternatives(inp, obs, lambda C, a: lb.run(inp, C, arrival=a))
    wis = what_ifs(inp, transport_points(
        records["topology"].payload if "topology" in records else None))
    rec = recommendation(wis)
    if rec is not None:   # the recommended row first (a tie may have put another above it)
        wis = [rec] + [w for w in wis if w is not rec]
    sg = records["sglang"].payload if "sglang" in records else None
    rep = Report(
        schema=REPORT_SCHEMA, scenario=inp.name, all_estimated=inp.all_estimated,
        records_used=tuple(inp.records), warnings=tuple(inp.warnings),
        deployment=ScenarioDeployment(
            inp.model.name, inp.gpu.name, inp.pp, inp.async_depth, inp.max_micro_batch,
            inp.graphs, inp.graph_max_bs, inp.arrival, inp.context_len,
            _memory_kind(inp.gpu.source)),
        arrival=arrival, params=tuple(inp.params),
        assumptions={**dict(inp.assumptions), **setting_dependencies(inp)},
        observed_source=inp.src("observed_tok_per_s")[1] if obs else None,
        concurrency=tuple(conc),
        attribution=tuple(AttributionAt(a.concurrency, a.ideal_tpot_ms, a.modelled_tpot_ms,
                                        tuple(a.rows)) for a in atts),
        what_ifs=tuple(wis), objective=OBJECTIVE,
        measured_concurrency=tuple(measured_concurrency(inp)),
        recommendation=rec, best_pair=best_pair(inp, wis, setting_of(inp)),
        model_differs=MODEL_DIFFERS,
        stage_cost=tuple(StageCost(b, lb.stage_cost_us(inp, lb.ALL_ON, b),
                                   lb.stage_cost_us(inp, frozenset({"stage_imbalance"}), b))
                         for b in sorted({max(c.slot_sizes) for c in conc})),
        dispatch_validation=(tuple(validate(records["dispatch"])) if "dispatch" in records
                             else None),
        dispatch_micro_batches=(tuple(micro_batch_choices(records["dispatch"]))
                                if "dispatch" in records else None),
        topology=(topology_summary(records["topology"].payload) if "topology" in records
                  else None),
        observed_deployment=observed_dep, scenario_differs=differs,
        server=(server_summary(sg, conc, inp.pp, mla=inp.model.attention == "mla")
                if sg is not None else None),
        diagnosis=(diagnosis_summary(sg, inp, records.get("stage_cost")) if sg is not None
                   else None),
        server_whatifs=_server_whatifs(sg))
    if "watch" in records:  # GPU watch: observed (NVML) hints, reports/model/watch_summary.py
        from reports.model.watch_summary import watch_section
        rep = replace(rep, watch=watch_section(records["watch"]))
    if baseline is not None:  # what one change did: reports/model/compare.py
        from reports.model.compare import compare_reports
        label, old = baseline
        cmp_, warns = compare_reports(rep, old, label)   # another server: not compared, said
        rep = replace(rep, baseline_comparison=cmp_, warnings=(*rep.warnings, *warns))
    from reports.model.implied import implied_efficiency
    imp = [implied_efficiency(inp, C, o) for C, o in obs.items() if C in inp.concurrency]
    rep = replace(rep, implied_efficiency=tuple(x for x in imp if x is not None),
                  verdicts=tuple(verdicts(inp, atts, records, rep.diagnosis)))
    from reports.model.next_steps import next_steps
    rep = replace(rep, measure_your_server=tuple(next_steps(
        rep, [C for C, _ in inp.observed] or list(inp.concurrency), inp.pp,
        model=inp.model.name, mla=inp.model.attention == "mla")))
    return replace(rep, answer=tuple(answer(rep)))


def _memory_kind(source: str) -> str | None:
    """HBM3e, GDDR7, ...: the memory the GPU's datasheet line names."""
    import re
    m = re.search(r"\b(HBM\w*|GDDR\w*)", source or "")
    return m.group(1) if m else None


# Where the model is still simpler than SGLang 0.5.23 (rendered as its own list in the report).
MODEL_DIFFERS = (
    "Decode only: a slot that prefills is not costed (its decode is skipped in SGLang, and the "
    "prefill forward takes its turn); with long outputs this is a small share of the time.",
    "Admission ignores the KV-cache token budget and a slot's sticky `batch_is_full` flag; "
    "pages are one token.",
    "Occupancy drift is followed in loop turns, not time: a finished request's successor is "
    "assumed to arrive two visits later, and the loop is run for a few snapshots of it.",
    "Each NCCL transfer is one latency plus bytes / bandwidth on its own; transfers sharing a "
    "link, NCCL's per-peer buffer limits and the send/recv parity deadlock guard are not timed.",
    "CPU costs are one number per phase (schedule, launch, result processing, empty visit, "
    "gloo message) for every rank and batch size; Python jitter and GC pauses are left out.",
    "MoE weights per micro-batch follow uniform (or Zipf) routing in expectation, not the "
    "tokens actually routed.",
    "No speculative decoding, DP attention, TP inside a stage, or SGLANG_PP_COMM_OVERLAP.",
)


def setting_dependencies(inp: Inputs) -> dict[str, str]:
    """For max_running_requests not given by the user: whether the slot split (and so any
    verdict or what-if) changes with it, at the concurrencies modelled."""
    src = inp.src("max_running_requests")[0]
    if src in ("given", "observed") or inp.max_running_requests is None:
        return {}
    from reports.model import loop_builder as lb
    from reports.model.settings_change import Change

    def split(mrr: int) -> list[list[int]]:
        cfg = lb.Changed.of(inp, (Change("--max-running-requests", mrr),)).slot_config
        return [burst_sizes(C, cfg, inp.prompt_len)
                for C in inp.concurrency]

    now = split(inp.max_running_requests)
    lo, hi = 1, inp.max_running_requests   # the smallest value with the same split (bisection:
    while lo < hi:                          # a larger pool never splits a burst further)
        mid = (lo + hi) // 2
        if split(mid) == now:
            hi = mid
        else:
            lo = mid + 1
    return {"max_running_requests (dependencies)": (
        f"not given, so {inp.max_running_requests} is SGLang's default derived from an "
        f"estimated KV pool. Every modelled slot split ({', '.join(f'C={C}: ' + ' '.join(map(str, [x for x in sz if x])) for C, sz in zip(inp.concurrency, now))}) "
        f"is the same for any max_running_requests >= {lo}: no verdict or what-if depends on "
        f"the value above that. Below it the per-slot cap (max_running_requests // {inp.pp}) "
        "splits bursts further and the herd verdict, the attribution and every what-if at the "
        "concurrencies it changes would move; the --max-running-requests what-if rows show how.")}


def diagnosis_summary(sg: SglangData, inp: Inputs, stage_cost: Record | None = None
                      ) -> ServerDiagnosis | NotDiagnosed | None:
    """The observed server diagnosed from its own evidence (reports/model/diagnose.py), or
    None with the reason when the evidence has no usable loop profile. Forward times at sizes
    the traces never ran follow the measured MoE-layer curve of stage_cost.json when there is
    one (said so, with the GPU it was measured on), else the roofline's bytes ratio."""
    from reports.base.model_config import load_model
    from reports.model.deployment import (NoLoopEvidence, curve_shape, from_evidence,
                                          moe_shape)
    from reports.model.diagnose import diagnose, time_split_rows
    loop = sg.loop
    if loop is None or not loop.ranks:
        return None
    obs = dict(inp.observed)
    C = loop.concurrency
    c_src = loop.concurrency_from or "given (ppscope sglang --concurrency)"
    if C is None and len(obs) == 1:
        C, c_src = next(iter(obs)), "the one observed concurrency"
    try:
        model = load_model(loop.model) if loop.model else inp.model
        shape, shape_src = moe_shape(model), (f"roofline MoE-layer bytes ratio of {model.name} "
                                              "(estimated)")
        pts = _moe_curve(stage_cost)
        if pts:
            shape = curve_shape(pts)
            gpus = ", ".join(sorted(set(stage_cost.provenance.gpus))) or "an unnamed GPU"
            shape_src = (f"the MoE-layer curve of stage_cost.json, measured on {gpus} (a shape "
                         "only: the level is the traces')")
        dep = from_evidence(loop, concurrency=C, observed=obs.get(C) if C else None,
                            async_depth=None, shape=shape)
    except (NoLoopEvidence, ValueError) as e:
        return NotDiagnosed("not diagnosed", str(e))
    dg = diagnose(dep, shape)
    # dg's concurrency is dep's, which is C: the part's own `concurrency` field
    return ServerDiagnosis(
        status="ok", concurrency_source=c_src,
        bench_run=_bench_run(sg, dep, obs.get(C) if C else None),
        observed_source=inp.src("observed_tok_per_s")[1] if obs.get(C) else None,
        deployment=ObservedLoop(
            dep.pp, dep.slots, tuple(dep.sizes), dep.device, tuple(dep.host_us),
            tuple(dep.relay_us), tuple(dep.sync_wait_us), tuple(dep.send_wait_us),
            tuple(dep.hop_us), dep.graph_share, dep.empty_us,
            tuple({str(b): v for b, v in c.items()} for c in dep.forward), dep.sources,
            tuple(dep.notes), f"forward at unobserved sizes: {shape_src}"),
        time_split=tuple(TimeSplit(**r) for r in time_split_rows(dep)),
        **{f.name: getattr(dg, f.name) for f in fields(dg)})


def _server_whatifs(sg: SglangData | None):
    """The traced server's own what-ifs (reports/model/server_whatifs.py), where it has a
    loop profile to try them on."""
    if sg is None or sg.loop is None or not sg.loop.ranks:
        return None
    from reports.model.server_whatifs import server_whatifs
    return server_whatifs(sg)


def _bench_run(sg: SglangData, dep, observed: float | None) -> BenchRun | None:
    """The observed loop over bench_serving's whole run (reports/model/observed_whatif.py:
    its waves, the last one below C, prefill visits), the traced window's profiler slowdown
    taken off (LoopProfile.profiler_slowdown): the modelled tok/s set against bench_serving's,
    and what is left unexplained (% of the observed step, as `unexplained_pct`)."""
    from reports.model import observed_whatif as ow
    if not sg.bench or dep.device != "cpu":
        return None
    try:
        _, server, load, _ = ow.from_sglang(sg)
        run = ow.bench_run(dep, server, load)
    except (ValueError, TypeError):
        return None
    slow = sg.loop.profiler_slowdown if sg.loop is not None else None
    model = run.tok_per_s * (slow or 1.0)
    return BenchRun(run.tok_per_s, run.mean_in_flight, load.prompts, slow, model, observed,
                    100.0 * (1.0 - observed / model) if observed else None)


def _moe_curve(rec: Record | None) -> list[tuple[int, float]]:
    """(batch, us) of the MoE layer stage-cost measured (the backend it picked), or []."""
    if rec is None or rec.payload is None:
        return []
    for kind in ("moe", "moe_triton", "moe_fast", "moe_plain"):
        pts = rec.payload.layers.get(kind) or {}
        out = sorted((int(b), p.measured_us) for b, p in pts.items() if p.measured_us)
        if len(out) >= 2:
            return out
    return []


def _pct100(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else 100.0 * num / den


def server_summary(sg: SglangData, conc: list[Level], pp: int,
                   mla: bool | None = None) -> ServerSummary:
    """The user's server as sglang.json saw it, per PP rank (log and traces joined by rank),
    with the model's busy fraction per stage at each concurrency beside it. Observed only:
    `sources` names the file each group of numbers came from."""
    log_r = sg.ranks
    tr_r = sg.traces.ranks if sg.traces else {}
    metrics_src = sg.metrics.get("source") if isinstance(sg.metrics, dict) else None
    sources = ServerSources(
        log=", ".join(sg.log.log_files) or None if sg.log else None,
        traces=sg.traces.dir if tr_r else None,
        bench=sg.bench_source.file if sg.bench and sg.bench_source else None,
        metrics=metrics_src)
    ranks = []
    for r in sorted(set(log_r) | set(tr_r), key=lambda x: int(x)):
        lg, t = log_r.get(r), tr_r.get(r)
        span = t.span_us if t is not None and t.gpu_events else None
        rec = t.nccl_recv if t is not None else None
        ranks.append(ServerRank(
            rank=int(r),
            # any kernel running (NCCL receives that wait included): never shown as "busy"
            kernel_active_pct=_pct100(t.busy_us if t else None, span),
            compute_pct=_pct100(t.compute_us if t else None, span),
            nccl_recv_pct=_pct100(rec.total_us if rec else None, span),
            recv_transfer_pct=_pct100(rec.transfer_us if rec else None, span),
            recv_wait_pct=_pct100(rec.wait_us if rec else None, span),
            idle_pct=_pct100(t.idle_us if t else None, span),
            dispatch_latency_p50_us=t.dispatch_latency_us.p50 if t else None,
            cpu_dispatch_latency_p50_us=t.cpu_dispatch_latency_us.p50 if t else None,
            graph_kernels=t.graph_kernels if span else None,
            eager_kernels=t.eager_kernels if span else None,
            trace_span_ms=None if span is None else span / 1e3,
            # the log's figures; with DP attention every DP rank's (reports/model/server_log.py)
            **log_figures(lg),
            modelled_busy_pct={str(c.concurrency): 100.0 * c.busy_frac[int(r)]
                               for c in conc if int(r) < len(c.busy_frac)},
        ))
    notes = []
    if ranks and len(ranks) != pp:
        notes.append(f"the server's evidence covers {len(ranks)} PP rank(s), the scenario has "
                     f"pp={pp}: modelled busy shown for ranks that exist in both")
    if tr_r and all(tr_r[r].nccl_recv.wait_us is None for r in tr_r):
        notes.append("NCCL receive time includes the transfer; read the traces with "
                     "--link-gbps to split waiting from transfer")
    imb = sg.slot_imbalance
    if imb is not None:
        imb = ServerSlotImbalance(**{f.name: getattr(imb, f.name) for f in fields(imb)})
    n_dp = dp_count(sg)
    if n_dp and imb and str(imb.rank) in log_r:
        # DP attention: the PP rank's index pools every DP rank's windows (not one DP rank's)
        own = log_r[str(imb.rank)]
        if own.slot_imbalance is not None:
            imb = ServerSlotImbalance(**{f.name: getattr(own.slot_imbalance, f.name)
                                         for f in fields(own.slot_imbalance)}
                                      | {"rank": imb.rank, "dp": None,
                                         "dp_ranks": len(own.by_dp)})
    return ServerSummary(
        evidence="sglang.json", source="observed", sources=sources, ranks=tuple(ranks),
        dp_ranks=n_dp, dp_rules=DP_RULES if n_dp else None, slot_imbalance=imb,
        moe_kernel=dict(sg.log.moe_kernel) if sg.log else {},
        moe_kernel_lines=tuple(moe_kernel_lines(sg.log.moe_kernel if sg.log else None)),
        attention_backend=dict(sg.log.attention_backend) if sg.log else {},
        attention_lines=tuple(attention_lines(sg.log.attention_backend if sg.log else None,
                                              mla)),
        bench=tuple(BenchRow(b.max_concurrency, b.mean_concurrency, b.output_throughput,
                             b.mean_tpot_ms, b.median_itl_ms, b.mean_ttft_ms)
                    for b in sg.bench),
        busy_over_time={r: BusyOverTime(tr_r[r].bin_us, tuple(tr_r[r].busy_frac_over_time))
                        for r in sorted(tr_r, key=int) if tr_r[r].busy_frac_over_time},
        notes=tuple(notes))


def topology_summary(d: TopologyData) -> TopologySummary:
    """GPUs, link type per pair, the pipeline's hops with their link level (None: unknown) and
    the measured PP hop per (src, dst) at the smallest batch; `source` labels every figure
    (`given` for a pasted `topo -m`, `measured` when probed), `links_unknown` and `notes` say
    what the pasted text left unreadable and what the parser skipped."""
    hops: dict[tuple[int, int], HopCost] = {}
    for h in d.hops:
        if h.hop_us is None:
            continue
        key = (h.src, h.dst)
        if key not in hops or h.batch < hops[key].batch:
            hops[key] = h
    return TopologySummary(
        gpus=tuple(g.name for g in d.gpus), source=d.figure_label,
        pasted=d.source == "nvidia-smi", links=dict(d.links),
        links_unknown=tuple(d.links_unknown),
        pipeline_hops=tuple(PipelineHop(h.src, h.dst, h.link, h.hop_class)
                            for h in d.pipeline_hops),
        notes=tuple(d.notes),
        hops=tuple(Hop(h.src, h.dst, h.batch, h.hop_us, h.link, h.hop_class)
                   for h in (hops[k] for k in sorted(hops))))


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _effects_text(w: WhatIf) -> str:
    return ", ".join(f"C={e.concurrency} {e.baseline_tok_per_s:.1f} -> "
                     f"{e.predicted_tok_per_s:.1f} ({e.gain:+.0%})" for e in w.effects)


def range_text(w: WhatIf) -> str:
    """Where a setting holds (no loss over 2%) over the concurrencies checked."""
    top = w.checked_up_to
    if top is None:
        return "its range not checked"
    lost = w.loses_at
    if lost is None:
        return f"it loses nowhere up to C={top}"
    if w.holds_up_to is None:
        return f"it loses already at C={lost.concurrency} ({lost.gain:+.0%})"
    return (f"it holds up to C={w.holds_up_to} and loses beyond "
            f"(C={lost.concurrency}: {lost.gain:+.0%})")


def _where(at: tuple[VerdictAt, ...], verdict: str) -> str:
    return ", ".join(f"C={a.concurrency}" + (f" ({a.share:.0%} of the gap)"
                                              if a.share is not None and
                                              verdict in ("holds", "minor") else "")
                     for a in at if a.verdict == verdict)


def hypotheses_sentence(verdicts: tuple[Verdict, ...]) -> str:
    """The user's hypotheses in their order, each with the concurrencies where it holds."""
    from reports.model.causes import HYPOTHESES
    order = {h: k for k, h in enumerate(HYPOTHESES)}   # the user's order
    parts = []
    for v in sorted(verdicts, key=lambda v: order.get(v.hypothesis, len(order))):
        at = [a for a in v.at if a.concurrency]
        kinds = list(dict.fromkeys(a.verdict for a in at))
        if len(kinds) > 1:
            rank = ("holds", "minor", "does not hold", "not enough evidence")
            text = "; ".join(f"{k} at {_where(at, k)}" for k in sorted(kinds, key=rank.index))
        elif at and v.verdict in ("holds", "minor") and len(at) > 1 and \
                v.hypothesis != "bandwidth is not the limit":
            text = f"{v.verdict} at every C ({_where(at, v.verdict)})"
        else:
            text = v.verdict + (f" ({v.number.split(';')[0]})"
                                if v.verdict in ("holds", "minor") else "")
        cause = v.cause or HYPOTHESES.get(v.hypothesis)
        parts.append(f"{v.hypothesis}: {text}" + (f" [row {cause}]" if cause else ""))
    return "Your hypotheses, judged at every concurrency: " + "; ".join(parts) + "."


def bench_run_sentence(br: BenchRun) -> str:
    """The model of the observed loop over bench_serving's whole run against its tok/s."""
    slow = (f", the traced window's profiler slowdown ({br.profiler_slowdown:.2f}x) taken off"
            if br.profiler_slowdown else "")
    return (f"Over bench_serving's whole run ({br.prompts} prompts: waves, the last below C, "
            f"a prefill visit per prompt){slow}, the model of the observed loop gives "
            f"{br.modelled_tok_per_s:.1f} tok/s against the observed "
            f"{br.observed_tok_per_s:.1f}: {br.unexplained_pct:+.0f}% unexplained.")


def server_whatifs_sentence(sw) -> str | None:
    """The traced server's own what-ifs in one sentence (reports/model/server_whatifs.py)."""
    if sw is None:
        return None
    if sw.status != "ok":
        return f"Settings tried on your server's own loop: not modelled ({sw.reason})."
    if not sw.rows:
        return None
    def one(r):
        return f"{r.command} {r.change_pct:+.0f}%"
    best = sw.best
    rest = "; ".join(one(r) for r in sw.rows if r is not best)
    head = (f"Settings tried on your server's own loop (bench_serving's run of "
            f"{sw.prompts} prompts at C={sw.concurrency}, modelled): ")
    if best is not None:
        return head + (f"best {one(best)} ({best.note}); the others: {rest}." if rest
                       else f"best {one(best)} ({best.note}).")
    return head + (f"none gains more than {sw.no_change_pct:.0f}% ({rest}).")


def answer(rep: Report) -> list[str]:
    """3-5 plain sentences from the report's own numbers (nothing here is typed by hand)."""
    obs_c = [c.concurrency for c in rep.concurrency if c.observed]
    user_c = obs_c or [c.concurrency for c in rep.concurrency]
    atts = {a.concurrency: a for a in rep.attribution}
    by_cause: dict[str, list[tuple[int, float]]] = {}
    dg = rep.diagnosis
    lead = []
    from reports.model.observed_server import headline
    head = headline(rep.observed_deployment)
    differs = rep.scenario_differs
    if isinstance(dg, ServerDiagnosis):  # the observed server first: its evidence decides
        un, br = dg.unexplained_pct, dg.bench_run
        tail = "" if un is None else (f" The model of the observed loop leaves {un:+.0f}% of "
                                      "the observed step unexplained.")
        if br is not None and br.unexplained_pct is not None:
            tail = " " + bench_run_sentence(br)
        lead.append(f"Your server ({head or 'C=' + str(dg.concurrency)}, from its own "
                    f"traces and logs): {dg.answer}.{tail}")
    elif head:
        why = (dg.reason if dg is not None else None) or (
            "no loop profile: read its per-rank traces with `ppscope sglang --traces DIR`")
        lead.append(f"Your server ({head}): not diagnosed ({why}).")
    if differs:
        lead.append(differs[0].upper() + differs[1:] + ".")
    for C in user_c:
        rows = [r for r in atts[C].rows if r.cause != "unexplained"]
        top = max(rows, key=lambda r: r.ms_per_step)
        if top.ms_per_step > 0:
            by_cause.setdefault(top.label, []).append((C, top.share or 0.0))
    cmp_ = rep.baseline_comparison
    if isinstance(cmp_, Comparison):   # the user changed one thing: what it did comes first
        lead.insert(0, cmp_.answer[0].upper() + cmp_.answer[1:] + ".")
    out, n_lead = lead, len(lead)
    if by_cause and not differs:   # the scenario is another deployment: its sections say so
        parts = [f"{lab.split(' (')[0]} at {' and '.join(f'C={C}' for C, _ in cs)} "
                 f"({', '.join(_pct(sh) for _, sh in cs)} of the gap)"
                 for lab, cs in by_cause.items()]
        top_c = max(user_c)
        cm = next(c for c in rep.concurrency if c.concurrency == top_c)
        out.append(("In the scenario model (the deployment the scenario describes, estimates "
                    "where no evidence says): b" if lead else "B") +
                   f"iggest cause of the gap between ideal and modelled throughput: "
                   f"{'; '.join(parts)}. At C={top_c} the model gives "
                   f"{cm.predicted:.1f} tok/s of an ideal {cm.ideal_tok_per_s:.1f}.")
    out.insert(n_lead, hypotheses_sentence(rep.verdicts))
    from reports.model.arrival import sentence
    arr = sentence(rep.arrival) if rep.arrival and not differs else None
    if arr:
        out.append(arr)
    best = rep.recommendation
    tp = next((w for w in rep.what_ifs if w.knob == TP_KNOB), None)
    if differs:   # the scenario's what-ifs are not advice for the traced server
        best, tp = None, None
        sw = server_whatifs_sentence(rep.server_whatifs)
        out.append((sw + " " if sw else "") +
                   "No server setting is recommended from the scenario model: it is not the "
                   "traced server (pass --scenario with your deployment for its what-ifs).")
    elif best:
        s = (f"Best single server setting (geometric mean of tok/s over the measured "
             f"concurrencies, none worse by over 2%, the mixed load included): "
             f"{best.knob} = {best.setting}, {best.gain:+.0%} on that mean: "
             f"{_effects_text(best)}; {range_text(best)}")
        pair = rep.best_pair
        if pair and pair.gain > best.gain + 0.005:
            s += (f". Best two settings together: {pair.knob} = {pair.setting}, "
                  f"{pair.gain:+.0%} on that mean: {_effects_text(pair)}; "
                  f"{range_text(pair)}")
    else:
        s = ("No single server setting raises the geometric mean of modelled tok/s by more "
             "than 0.5% without losing over 2% at a measured concurrency")
    if tp and tp.gain > 0.005:
        # TP is a rough estimate (ring all-reduce + 1/p of the weights), not a measured
        # configuration, and not a server setting: qualify it.
        s += (f"; outside PP, a rough estimate, not a measurement, puts {tp.knob} "
              f"({tp.setting}) at {tp.gain:+.0%} on that mean: measure it before acting "
              "on it")
    if not differs:
        out.append(s + ".")
    un = [(C, r) for C in obs_c for r in atts[C].rows if r.cause == "unexplained"]
    if un:
        parts = []
        for C, r in un:
            o = next(c.observed for c in rep.concurrency if c.concurrency == C)
            word = "slower" if r.ms_per_step > 0 else "faster"
            parts.append(f"C={C} observed {o:.1f} vs modelled {o - r.tok_per_s:.1f} tok/s "
                         f"({abs(r.ms_per_step):.1f} ms/step {word})")
        imp = rep.implied_efficiency
        why = ""
        if imp:  # which input would have to change (an estimate: reports/model/implied.py)
            worst = max(imp, key=lambda x: abs(x.observed_tok_per_s / x.modelled_tok_per_s - 1))
            C, i1 = worst.concurrency, worst.implied_b1
            why = (f" Estimated: C={C} needs kernels at {i1:.0%} of the floor (b=1), not "
                   f"{worst.efficiency_b1:.0%}"
                   + ("" if worst.possible else " (beyond the floor: not kernels alone)")
                   + "." if i1 is not None else
                   f" Estimated: no kernel efficiency explains the C={C} miss.")
        out.append("Unexplained by the model: " + "; ".join(parts) + "." + why)
    elif not differs:
        out.append("No observed throughput given (--observed or --bench), so the unexplained "
                   "gap is not known.")
    if rep.all_estimated:
        tr = any(p.source == "transferred" for p in rep.params)
        out.append(f"Every figure except the observed tok/s is estimated"
                   f"{' or transferred from another GPU' if tr else ''}; run the probes on the "
                   "GPUs (make all) to replace the estimates with measurements.")
    return out
