"""Model vs SGLang's own server first, then vs the dispatch probe.

SGLang first (`validate_sglang`): a lab case of SGLang's real PP server (`ppscope sglang-lab`,
its `ppscope sglang` record and its server log): the model of the observed loop built from the
case's per-rank costs (reports/model/observed/deployment.py) runs bench_serving's whole run
(reports/model/observed/bench_run.py `bench_run`), with the profiler's measured slowdown of the
traced window taken off (`LoopProfile.profiler_slowdown`, from the log's decode lines,
microbench/sglang/profiler_cost.py), against
bench_serving's median tok/s. Nothing of the measured tok/s feeds the model.

The probe second: rebuild the pipeline model for exactly the probe's configuration.

Inputs come only from dispatch.json, never from its tok/s: pp, async depth; per-rank forward
time by micro-batch size (`stages[].gpu_us_p50`, pooled over runs, median); per-rank CPU per
phase of SGLang's loop order (`sched_us_p50` get_next_batch_to_run, `launch_us_p50` run_batch,
`process_us_p50` process_batch_result, `host_empty_us_p50` an empty slot's whole visit; the rest
of a busy visit's CPU, `host_busy_us_p50` minus the two, counts as schedule), each run's own
(the CPU per visit depends on the batch and on what the loop waits for: on the 2x H200 record
rank 0's busy visit took 1140-1956 us across four runs; pooled medians put one run's CPU into
another's), pooled medians over runs only where a run lacks them; the hop (`hop_us_in_loop`, else
`send_us_p50`), used for hidden states and tokens alike, except that an injected `hop-delay`
(which the probe puts on hidden-state sends only) is taken off the token return; the gloo
message latency (`ranks[].gloo_one_way_us`, measured by the probe at start-up, else 0). Each
run's own `slot_sizes` are the slots. The probe and the model run the same loop order (SGLang
0.5.23 `event_loop_pp`: held outputs, per-rank sync, commits before reuse), so a difference is
an effect one of them lacks.

A record from a probe without the phase split (older schema-2 records) has its whole host time
per visit placed before the launch (`host_us_p50`), said so in the notes.

Output: modelled vs measured tok/s per policy x arrival x C (and per injected fault), the %
difference and, outside the 10% target, the reason; `micro_batch_choices()` re-runs the same
inputs with the requests spread over 1, pp or all slots (the micro-batch-count what-if; batch
sizes not measured in the record are interpolated, said so).

`python -m reports.model.checks.validate_dispatch [LAB_CASE_DIR ...] [RECORD.json ...]` prints the
SGLang cases' table, then the probe records' (the GPU matrix in docs/ writes one record per
configuration), and exits 1 when a point is outside the target.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from statistics import median

from reports.base.errors import CliError
from reports.base.inject import parse_inject
from reports.model.sim.pipeline_model import LoopConfig, simulate
from reports.base.records import Record
from reports.base.interp import interp_log
from reports.base.server_settings import slot_count
from reports.base.slots import SlotConfig, even_slots

TARGET_PCT = 10.0


@dataclass(frozen=True)
class Check:
    policy: str
    arrival: str
    concurrency: int
    slot_sizes: tuple[int, ...]
    measured_tok_per_s: float
    modelled_tok_per_s: float
    diff_pct: float
    note: str = ""              # why it is outside the target, "" when within
    injected: tuple[str, ...] = ()   # --inject faults of the run


@dataclass(frozen=True)
class MicroBatchChoice:
    concurrency: int
    micro_batches: int
    slot_sizes: tuple[int, ...]
    modelled_tok_per_s: float
    measured_tok_per_s: float | None   # a run of the record with exactly these slot sizes
    interpolated: bool                 # a slot size the record has no forward time for


@dataclass(frozen=True)
class ProbeInputs:
    pp: int
    depth: int
    curves: tuple[tuple[tuple[int, float], ...], ...]   # per rank: (batch, forward us)
    host_us: tuple[float, ...]                          # per rank: schedule
    launch_us: tuple[float, ...]                        # per rank: run_batch CPU
    process_us: tuple[float, ...]                       # per rank: result processing
    empty_us: tuple[float, ...]                         # per rank: an empty slot's visit
    hop_us: float
    chain_us: float
    phase_split: bool                                   # False: an older probe's record
    commit_split: bool = True                           # False: commit waits counted as host
    hop_delay_us: float = 0.0                           # --inject hop-delay (proxy sends only)


def _med(vals: list[float]) -> float:
    return float(median(vals)) if vals else 0.0


def probe_inputs(rec: Record) -> ProbeInputs:
    d = rec.payload
    if d is None:
        raise CliError(f"dispatch.json: status {rec.status}; nothing to model")
    pp, depth = d.config.pp, d.config.async_depth
    gpu: dict[int, dict[int, list[float]]] = {}
    phase: dict[str, dict[int, list[float]]] = {k: {} for k in (
        "sched_us_p50", "launch_us_p50", "process_us_p50", "host_empty_us_p50", "host_us_p50",
        "host_busy_us_p50")}
    send: list[float] = []
    for r in d.runs:
        for s in r.stages:
            for b, us in s.gpu_us_p50.items():
                if us is not None and int(b) > 0:
                    gpu.setdefault(s.rank, {}).setdefault(int(b), []).append(us)
            for k in phase:
                v = getattr(s, k)
                if v is not None:
                    phase[k].setdefault(s.rank, []).append(v)
            if s.send_us_p50 is not None:
                send.append(s.send_us_p50)
    if len(gpu) < pp:
        raise CliError(f"dispatch.json: gpu_us_p50 for {len(gpu)} of {pp} ranks; cannot model")
    hop = d.hop_us_in_loop if d.hop_us_in_loop is not None else _med(send)
    curves = tuple(tuple(sorted((b, _med(v)) for b, v in gpu[i].items())) for i in range(pp))

    def per_rank(k):
        return tuple(_med(phase[k].get(i, [])) for i in range(pp))
    split = bool(phase["sched_us_p50"])
    gl = [float(i["gloo_one_way_us"]) for i in (d.ranks or {}).values()
          if isinstance(i, dict) and i.get("gloo_one_way_us") is not None]
    launch = per_rank("launch_us_p50") if split else (0.0,) * pp
    process = per_rank("process_us_p50") if split else (0.0,) * pp
    if split:   # all CPU of a visit with a batch not in run_batch or processing: before launch
        busy = per_rank("host_busy_us_p50")
        host = tuple(max(s_, b - l_ - p_) for s_, b, l_, p_ in
                     zip(per_rank("sched_us_p50"), busy, launch, process))
    else:
        host = per_rank("host_us_p50")
    commit = any(s.commit_wait_us_p50 is not None for r in d.runs for s in r.stages)
    try:
        delay = parse_inject(d.config.inject, pp)["hop_delay_us"]
    except ValueError as e:
        raise CliError(f"dispatch.json: {e}") from None
    return ProbeInputs(pp, depth, curves, host, launch, process,
                       per_rank("host_empty_us_p50"), hop, _med(gl), split, commit, delay)


def for_run(pi: ProbeInputs, run) -> ProbeInputs:
    """The record-wide inputs with this run's own CPU per phase where it has them."""
    if not pi.phase_split:
        return pi
    st = {s.rank: s for s in run.stages}

    def own(k: str, pooled: tuple[float, ...]) -> tuple[float, ...]:
        return tuple(getattr(st[i], k) if i in st and getattr(st[i], k) is not None else p
                     for i, p in enumerate(pooled))
    launch = own("launch_us_p50", pi.launch_us)
    process = own("process_us_p50", pi.process_us)
    busy = own("host_busy_us_p50", tuple(h + l_ + p_ for h, l_, p_ in
                                        zip(pi.host_us, pi.launch_us, pi.process_us)))
    sched = own("sched_us_p50", (0.0,) * pi.pp)
    host = tuple(max(s_, b - l_ - p_) for s_, b, l_, p_ in zip(sched, busy, launch, process))
    return replace(pi, host_us=host, launch_us=launch, process_us=process,
                   empty_us=own("host_empty_us_p50", pi.empty_us))


def loop_for(pi: ProbeInputs, bmax: int) -> LoopConfig:
    stage = tuple(tuple([0.0] + [interp_log(list(c), b) for b in range(1, bmax + 1)])
                  for c in pi.curves)
    hop_row = tuple([0.0] + [pi.hop_us] * bmax)
    # `--inject hop-delay=US` delays the hidden-state sends only (microbench/dispatch/pp_loop.py
    # send_proxy): the token return (last -> 0) keeps the hop without it
    tok_row = tuple([0.0] + [max(0.0, pi.hop_us - pi.hop_delay_us)] * bmax)
    return LoopConfig(stage_us=stage, hop_us=tuple([hop_row] * (pi.pp - 1) + [tok_row]),
                      async_depth=pi.depth,
                      host_us=pi.host_us, launch_us=pi.launch_us, process_us=pi.process_us,
                      empty_us=pi.empty_us, chain_us=pi.chain_us)


def _note(diff_pct: float, sizes: list[int], pi: ProbeInputs) -> str:
    if abs(diff_pct) <= TARGET_PCT:
        return ""
    occupied = sum(1 for n in sizes if n)
    why = "over-predicts" if diff_pct > 0 else "under-predicts"
    if not pi.phase_split:
        return (f"model {why}: the record has no per-phase CPU times (an older probe), so host "
                "time is placed before each launch")
    if not pi.commit_split and diff_pct < 0:
        return (f"model {why}: the record's host times include the CPU blocked committing "
                "gloo sends (a probe before `commit_wait_us_p50`), which the model already "
                f"waits for: the host work per visit ({occupied} of {len(sizes)} slots "
                "occupied) is over-costed")
    if occupied == 1:
        return (f"model {why} with one occupied slot: the round trip (forwards + hops + rank-0 "
                "host) is the whole story here, so a forward time measured under other slot "
                "sizes (pooled median) is the likely culprit")
    return (f"model {why} with {occupied} micro-batches: effect not in the model (e.g. NCCL "
            "kernels sharing the GPU with a forward, links shared by transfers, Python jitter)")


def validate(rec: Record) -> list[Check]:
    pi = probe_inputs(rec)
    out = []
    for r in rec.payload.runs:
        sizes = list(r.slot_sizes)
        if not sizes or not sum(sizes) or r.tok_per_s is None:
            continue
        lc = loop_for(for_run(pi, r), max(sizes))
        sim = simulate(lc, sizes[:lc.slots])
        meas = r.tok_per_s
        diff = (sim.tok_per_s / meas - 1) * 100 if meas else 0.0
        out.append(Check(r.policy, r.arrival, r.concurrency, tuple(sizes), meas,
                         sim.tok_per_s, diff, _note(diff, sizes, pi),
                         tuple(r.injected)))
    return out


@dataclass(frozen=True)
class SglangCheck:
    """The model of the observed loop against one SGLang lab case's bench_serving tok/s."""
    case: str
    pp: int
    depth: int
    concurrency: int
    measured_tok_per_s: float          # bench_serving, median over the case's runs
    runs: int
    steady_tok_per_s: float            # the loop as traced, steady state
    run_tok_per_s: float               # bench_serving's whole run over that loop
    profiler_slowdown: float | None    # traced window / outside, from the log's decode lines
    modelled_tok_per_s: float          # run / slowdown (the run as is where none was measured)
    diff_pct: float
    note: str = ""


def validate_sglang(rec: Record, case: str = "") -> SglangCheck:
    """One SGLang lab case (module docstring). `rec`: its sglang.json (read with its server
    log: without one, no profiler correction, said in the note)."""
    from statistics import median as med
    from reports.model.observed import bench_run as ow
    if rec.payload is None or rec.payload.loop is None:
        raise CliError(f"{case or 'sglang.json'}: no loop profile (read the traces with "
                       "`ppscope sglang --traces DIR`)")
    dep, server, load, _ = ow.from_sglang(rec.payload)
    tok = [b.output_throughput for b in rec.payload.bench if b.output_throughput]
    if not tok:
        raise CliError(f"{case or 'sglang.json'}: no bench_serving run to compare with")
    meas = float(med(tok))
    steady = ow.steady_tok_per_s(dep)
    run = ow.bench_run(dep, server, load)
    slow = rec.payload.loop.profiler_slowdown
    model = run.tok_per_s * (slow or 1.0)
    diff = 100.0 * (model / meas - 1.0)
    note = ""
    if abs(diff) > TARGET_PCT:
        why = "over-predicts" if diff > 0 else "under-predicts"
        note = (f"model {why}: " + ("no profiled window in the log to take the profiler's cost "
                                     "off" if slow is None else
                                     "the traced window is not the benchmark's loop (the "
                                     "machine's load changed between them), or a cost the "
                                     "model lacks"))
    return SglangCheck(case, dep.pp, server.pp_async_batch_depth, load.concurrency, meas, len(tok), steady,
                       run.tok_per_s, slow, model, diff, note)


def validate_sglang_case(path) -> SglangCheck:
    """`validate_sglang` on a lab case folder's sglang.json."""
    from pathlib import Path
    from reports.base.records import read_record
    d = Path(path)
    return validate_sglang(read_record(d / "sglang.json"), d.name)


def micro_batch_choices(rec: Record) -> list[MicroBatchChoice]:
    """For each C the record ran: the model's tok/s with the C requests spread evenly over
    m = 1, pp and all slots (the `--micro-batches` knob of `even`), next to a measured run
    with the same slot sizes where the record has one."""
    pi = probe_inputs(rec)
    S = slot_count(pi.pp, pi.depth)
    runs = [r for r in rec.payload.runs if r.tok_per_s is not None]
    measured = {r.slot_sizes: r.tok_per_s for r in runs}
    have = {b for c in pi.curves for b, _ in c}
    out = []
    for C in sorted({r.concurrency for r in runs}):
        for m in sorted({1, pi.pp, S}):
            if m > C:
                continue
            sizes = [0] * S
            chosen = even_slots(SlotConfig(pi.pp, pi.depth, max(C, 1)), m)
            for j in range(C):  # C requests over the m chosen slots, as `even` fills them
                sizes[chosen[j % m]] += 1
            lc = loop_for(pi, max(sizes))
            sim = simulate(lc, sizes)
            out.append(MicroBatchChoice(C, m, tuple(sizes), sim.tok_per_s,
                                        measured.get(tuple(sizes)),
                                        any(n and n not in have for n in sizes)))
    return out


def main(argv: list[str] | None = None) -> int:
    """Print model vs probe for each dispatch record given; exit 1 if any point is outside
    the target (the GPU matrix's pass/fail)."""
    from tabulate import tabulate

    from reports.base.records import RecordError, read_record
    from pathlib import Path
    paths = list(sys.argv[1:] if argv is None else argv)
    if not paths:
        print("usage: python -m reports.model.checks.validate_dispatch [LAB_CASE_DIR ...] "
              "[DISPATCH.json ...]")
        return 2
    rows, bad = [], 0
    cases = [p for p in paths if Path(p).is_dir()]
    for p in cases:           # SGLang's own server first
        try:
            chk = validate_sglang_case(p)
        except (CliError, RecordError, OSError, ValueError) as e:
            print(f"{p}: not checked: {str(e).splitlines()[0]}")
            bad += 1
            continue
        bad += bool(chk.note)
        rows.append([p, chk.pp, chk.depth, "sglang", "-", chk.concurrency, "-", "-",
                     f"{chk.measured_tok_per_s:.1f}", f"{chk.modelled_tok_per_s:.1f}",
                     f"{chk.diff_pct:+.1f}%", chk.note or "within 10%"])
    for p in (p for p in paths if p not in cases):
        try:
            rec = read_record(p)
            if rec.payload is None:
                raise CliError(f"status {rec.status} ({rec.reason})")
            checks = validate(rec)
        except (CliError, RecordError, OSError, ValueError) as e:
            print(f"{p}: not checked: {str(e).splitlines()[0]}")
            bad += 1
            continue
        c = rec.payload.config
        for chk in checks:
            bad += bool(chk.note)
            rows.append([p, c.pp, c.async_depth, "graphs" if c.graphs else "eager",
                         chk.policy, chk.concurrency, ",".join(chk.injected) or "-",
                         " ".join(str(x) for x in chk.slot_sizes if x),
                         f"{chk.measured_tok_per_s:.1f}", f"{chk.modelled_tok_per_s:.1f}",
                         f"{chk.diff_pct:+.1f}%", chk.note or "within 10%"])
    print(tabulate(rows, headers=["record", "pp", "depth", "mode", "policy", "C", "inject",
                                  "slots", "measured tok/s", "modelled tok/s", "diff",
                                  "note"]))
    print(f"{len(rows) - bad} of {len(rows)} points within {TARGET_PCT:g}%")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
