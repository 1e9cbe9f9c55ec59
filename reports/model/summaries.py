"""The report's summaries of the evidence: the user's server as sglang.json saw it
(`server_summary`), its diagnosis (`diagnosis_summary`), the observed loop over bench_serving's
whole run, the traced server's own what-ifs, and topology.json (`topology_summary`)."""
from __future__ import annotations

from dataclasses import fields, replace

from reports.base.payloads.topology import HopCost, TopologyData
from reports.base.payloads.sglang import SglangData
from reports.base.records import Record
from reports.model.report_type import (BenchRow, ModelledBenchRun,
                                       BusyOverTime, Hop, Level, NotDiagnosed, ObservedLoop,
                                       PipelineHop, ServerDiagnosis,
                                       ServerRank, ServerSlotImbalance, ServerSources,
                                       ServerSummary, RankTimeSplit, TopologySummary)
from reports.model.scenario.inputs import Inputs
from reports.model.observed.metrics_verdicts import window_lines
from reports.model.observed.server_log import (DP_RULES, attention_lines, dp_count, log_figures,
                                      moe_kernel_lines)


def observed_deployment(sg: SglangData, inp: Inputs, stage_cost: Record | None = None):
    """The observed loop as the diagnosis models it: (Deployment, the forward-time shape, the
    concurrency's source, the shape's source); None without a loop profile; raises
    NoLoopEvidence or ValueError when the profile cannot be modelled. Forward times at sizes
    the traces never ran follow the measured MoE-layer curve of stage_cost.json when there is
    one (said so, with the GPU it was measured on), else the roofline's bytes ratio."""
    from reports.base.model_config import load_model
    from reports.model.observed.deployment import curve_shape, from_evidence, moe_shape
    loop = sg.loop
    if loop is None or not loop.ranks:
        return None
    obs = dict(inp.observed)
    C = loop.concurrency
    c_src = loop.concurrency_from or "given (ppscope sglang --concurrency)"
    if C is None and len(obs) == 1:
        C, c_src = next(iter(obs)), "the one observed concurrency"
    # the served model's own shape, never the scenario's: a server whose model the evidence
    # does not name gets the nearest traced size (interpolated between sizes)
    try:        # a config.json given by path may not be on this machine: then unnamed
        model = load_model(loop.model) if loop.model else None
    except (OSError, ValueError):
        model = None
    shape = moe_shape(model) if model is not None else None
    if shape is not None:
        shape_src = f"roofline MoE-layer bytes ratio of {model.name} (estimated)"
    else:
        named = (f"dense model {model.name}" if model is not None
                 else "the served model is not named in the evidence")
        shape_src = (f"{named}: interpolated between traced sizes, else the nearest traced "
                     "size (estimated)")
    pts = _moe_curve(stage_cost)
    if pts:
        shape = curve_shape(pts)
        gpus = ", ".join(sorted(set(stage_cost.provenance.gpus))) or "an unnamed GPU"
        shape_src = (f"the MoE-layer curve of stage_cost.json, measured on {gpus} (a shape "
                     "only: the level is the traces')")
    # the server's own --pp-async-batch-depth (its start-up arguments in the log): the slot
    # count the window check counts rounds with (the model's slots stay the traces')
    args = sg.log.server_args if sg.log is not None else None
    depth = args.pp_async_batch_depth if args is not None else None
    dep = from_evidence(loop, concurrency=C, observed=obs.get(C) if C else None,
                        async_depth=depth, shape=shape)
    return dep, shape, c_src, shape_src


def diagnosis_summary(sg: SglangData, inp: Inputs, stage_cost: Record | None = None
                      ) -> ServerDiagnosis | NotDiagnosed | None:
    """The observed server diagnosed from its own evidence (reports/model/observed/diagnose.py), or
    None with the reason when the evidence has no usable loop profile (observed_deployment)."""
    from reports.model.observed.deployment import NoLoopEvidence
    from reports.model.observed.diagnose import diagnose, time_split_rows
    try:
        got = observed_deployment(sg, inp, stage_cost)
    except (NoLoopEvidence, ValueError) as e:
        return NotDiagnosed("not diagnosed", str(e))
    if got is None:
        return None
    dep, shape, c_src, shape_src = got
    obs = dict(inp.observed)
    C = dep.concurrency
    dg = diagnose(dep, shape, _runs_at(sg, inp, C))
    clock = unaligned_clocks(sg)
    if clock:      # said with the answer itself: its hops and waits rest on one clock assumed
        dg = replace(dg, answer=f"{dg.answer} (caveat: {clock})", caveats=(clock, *dg.caveats))
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
            tuple(dep.notes), f"forward at unobserved sizes: {shape_src}",
            tuple({str(b): v for b, v in c.items()} for c in dep.forward_busy),
            tuple(dep.empty_relay_us), tuple(dep.send_us), tuple(dep.process_us),
            dep.window_concurrency, dep.blocks),
        time_split=tuple(RankTimeSplit(**r) for r in time_split_rows(dep)),
        **{f.name: getattr(dg, f.name) for f in fields(dg)})


def _runs_at(sg: SglangData, inp: Inputs, C: int) -> tuple[float, ...]:
    """tok/s of each bench run at C where the observed point is their mean (sglang.json's bench
    runs); () where the point came from elsewhere (--observed, --bench: one figure each)."""
    from reports.base.bench_serving import runs_by_c
    src = inp.src("observed_tok_per_s")[1] if dict(inp.observed).get(C) else None
    if not src or "sglang.json" not in str(src):
        return ()
    return tuple(runs_by_c(sg.bench).get(C, ()))


def unaligned_clocks(sg: SglangData) -> str | None:
    """The caveat when `ppscope sglang` could not align two ranks' trace clocks (evidence.py
    `check_trace_ranks`: no offset, or several, fit their sends and receives): the figures that
    compare ranks (hops, waits for another rank) rest on one clock assumed."""
    clock = sg.traces.clock if sg.traces is not None else None   # Json: evidence.py's
    pairs = list(clock.get("unaligned") or ()) if isinstance(clock, dict) else []
    if not pairs:
        return None
    pairs = [str(p).replace("-", " and ") for p in pairs]
    return (f"the clocks of PP ranks {'; '.join(pairs)} could not be aligned (ppscope sglang: "
            "one clock assumed), so the hops and cross-rank waits may be off by their offset")


def traced_server_whatifs(sg: SglangData | None):
    """The traced server's own what-ifs (reports/model/observed/whatifs.py), where it has a
    loop profile to try them on."""
    if sg is None or sg.loop is None or not sg.loop.ranks:
        return None
    from reports.model.observed.whatifs import server_whatifs
    return server_whatifs(sg)


def _bench_run(sg: SglangData, dep, observed: float | None) -> ModelledBenchRun | None:
    """The observed loop over bench_serving's whole run (reports/model/observed/bench_run.py:
    its waves, the last one below C, prefill visits), the traced window's profiler slowdown
    taken off (LoopProfile.profiler_slowdown): the modelled tok/s set against bench_serving's,
    and what is left unexplained (% of the observed step, as `unexplained_pct`)."""
    from reports.model.observed import bench_run as ow
    if not sg.bench or dep.device != "cpu":
        return None
    try:
        _, server, load, _ = ow.from_sglang(sg)
        run = ow.bench_run(dep, server, load)
    except (ValueError, TypeError):
        return None
    slow = sg.loop.profiler_slowdown if sg.loop is not None else None
    slow_ci = sg.loop.profiler_slowdown_ci if sg.loop is not None and slow else None
    model = run.tok_per_s * (slow or 1.0)
    model_ci = (run.tok_per_s * slow_ci[0], run.tok_per_s * slow_ci[1]) if slow_ci else None
    left_ci = (tuple(100.0 * (1.0 - observed / m) for m in model_ci)
               if model_ci and observed and min(model_ci) > 0 else None)
    return ModelledBenchRun(run.tok_per_s, run.mean_in_flight, load.prompts, slow, model, observed,
                            100.0 * (1.0 - observed / model) if observed else None,
                            slow_ci, model_ci, left_ci)


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
            # the log's figures; with DP attention every DP rank's (reports/model/observed/server_log.py)
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
    if sg.loop is not None:   # SGLang issues' PP pathologies, as the traces time them
        notes += [f"PP pathology (traces, observed): {x}" for x in sg.loop.pathologies]
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
        notes=tuple(notes), metrics_lines=tuple(window_lines(sg.metrics_window)))


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
