"""`ppscope sglang`: SGLang's own evidence (logs, per-rank traces, metrics, bench_serving runs, a
live server) into one record, `results/sglang.json`. Needs no GPU: it reads what the server wrote,
or talks to the server over HTTP.

Readers (CPU only): `--log`, `--traces`, `--metrics`, `--bench`; live probe: `--url` (with
`--profile --trace-dir DIR` to record and read per-rank traces in one command). Prints tables.
`--watch [SECONDS]` samples every GPU through NVML beside the load (microbench/watch/sampler.py).
See each reader module's docstring (microbench/sglang/*.py) for what the numbers mean.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from reports.base.errors import CliError
from reports.base.payloads.sglang import (ArrivalBurst, BenchRun, BenchSource, LoopProfile,
                                          MetricsWindow, SglangData, TraceRank)
from reports.base.schema import from_json

_DESTS = ("sglang_log", "sglang_traces", "sglang_metrics", "bench", "url")

EPILOG = """\
examples:
  ppscope sglang --log server.log --bench bench.jsonl
  ppscope sglang --traces /srv/sglang_traces/1712345678 --link-gbps 50
  ppscope sglang --metrics http://127.0.0.1:30000/metrics
  ppscope sglang --url http://127.0.0.1:30000 --profile --trace-dir /srv/sglang_traces
  ppscope sglang --url http://127.0.0.1:30000 --mmb-sweep 2,4,8   # pp_max_micro_batch_size
  ppscope sglang --watch 60                      # GPU utilization/power/PCIe beside your load
  ppscope sglang --url http://127.0.0.1:30000 --watch   # the watch covers the live load

then `ppscope report` reads results/sglang.json and diagnoses that server.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "sglang", help="read a real SGLang server's evidence: logs, traces, metrics, bench, live",
        description="Read SGLang's own evidence of a pipeline-parallel deployment (server logs, "
                    "per-rank profiler traces, /metrics, bench_serving results) or probe a live "
                    "server, and write results/sglang.json for `ppscope report`.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.add_argument("--json", default=None, help="record path (default results/sglang.json)")
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("evidence to read (at least one)")
    g.add_argument("--log", "--sglang-log", dest="sglang_log", nargs="+", metavar="FILE",
                   help="server log(s), plain or .gz; several files = several ranks")
    g.add_argument("--traces", "--sglang-traces", dest="sglang_traces", nargs="+",
                   metavar="DIR_OR_FILE",
                   help="per-rank Kineto traces from /start_profile: one profile's directory, "
                   "or its files (e.g. DIR/PROFILE_ID-*)")
    g.add_argument("--metrics", "--sglang-metrics", dest="sglang_metrics", nargs="+",
                   metavar="FILE_OR_URL",
                   help="SGLang's /metrics: two scrapes of one server (saved pages or URLs; "
                   "the report works on their difference), one page (the window since start-up), "
                   "or a Prometheus /api/v1/query_range JSON export of its sglang: series")
    g.add_argument("--bench", metavar="FILE",
                   help="bench_serving output: its JSONL (--output-file) or the printed result")
    g.add_argument("--url", metavar="URL",
                   help="live probe of an OpenAI-compatible server, e.g. http://127.0.0.1:30000")
    g = p.add_argument_group("live probe (--url)")
    g.add_argument("--live-concurrency", type=int, default=8, metavar="C",
                   help="concurrent streams in the live probe (default 8)")
    g.add_argument("--live-tokens", type=int, default=64, metavar="N",
                   help="max_tokens per stream, with ignore_eos (default 64)")
    g.add_argument("--live-arrival", choices=("burst", "staggered", "both"), default="both",
                   help="live-probe arrival pattern (default both)")
    g.add_argument("--live-stagger-ms", type=float, default=50.0,
                   help="gap between stream starts when staggered (default 50)")
    g.add_argument("--live-timeout", type=float, default=120.0, metavar="S",
                   help="upper bound on each live run, seconds (default 120)")
    g.add_argument("--metrics-window", type=float, default=None, metavar="S",
                   help="with --url: scrape its /metrics twice, S seconds apart, under the "
                   "load it serves (each scrape bounded in time and size); no live probe is run")
    g.add_argument("--model-name", default=None, help="model name for requests "
                   "(default: the first of /v1/models)")
    g.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    g.add_argument("--mmb-sweep", default="", metavar="N,N,...",
                   help="pp_max_micro_batch_size values to try via POST /set_internal_state")
    g.add_argument("--profile", action="store_true",
                   help="with --url: /start_profile, run the load, /stop_profile, read the traces")
    g.add_argument("--trace-dir", metavar="DIR",
                   help="--profile: where the server writes traces (its SGLANG_TORCH_PROFILER_DIR)")
    g.add_argument("--profile-steps", type=int, default=20, help="num_steps for /start_profile")
    g.add_argument("--profile-stacks", action="store_true",
                   help="--profile with SGLang's own defaults (with_stack, record_shapes: the "
                   "Python tracer inflates host times); default: both off")
    g = p.add_argument_group("GPU watch (microbench/watch/sampler.py)")
    g.add_argument("--watch", type=float, nargs="?", const=0.0, default=None, metavar="SECONDS",
                   help="sample every GPU through NVML (and DCGM's dcgmi dmon, where it runs) "
                   "for SECONDS into results/watch.json and watch.trace.json; with --url it "
                   "covers the live load instead")
    g.add_argument("--watch-hz", type=float, default=10.0, metavar="HZ",
                   help="watch ticks per second (default 10)")
    g.add_argument("--watch-source", choices=("auto", "nvml", "dcgm"), default="auto",
                   help="auto (default): also run `dcgmi dmon` for DCGM's profiling fields (SM "
                   "active, SM occupancy, DRAM active, PCIe/NVLink bytes/s) when dcgmi is on "
                   "PATH, NVML alone otherwise or if dcgmi fails (the record says why); nvml: "
                   "never start dcgmi; dcgm: like auto, but an error when dcgmi is not on PATH")
    g = p.add_argument_group("reading")
    g.add_argument("--link-gbps", type=float, default=None,
                   help="PP hop bandwidth, GB/s, to split NCCL receives into transfer vs waiting")
    g.add_argument("--model", default=None, metavar="PRESET",
                   help="model preset (e.g. kimi-k2) or the served model's config.json: its "
                        "hidden size turns hidden-state receives into micro-batch sizes in the "
                        "loop profile, its layer count gives the layers each rank runs (the "
                        "report's layer split)")
    g.add_argument("--layer-partition", default=None, metavar="A,B,...",
                   help="the server's SGLANG_PP_LAYER_PARTITION, where it was set (default: "
                        "SGLang's even split of the model's layers)")
    g.add_argument("--concurrency", type=int, default=None, metavar="C",
                   help="client streams while the traces were recorded (the bench run's "
                        "--max-concurrency); with --url --profile it is --live-concurrency")
    g.add_argument("--hta-compatible", action="store_true",
                   help="read --traces by Holistic Trace Analysis's rules, to compare with it: "
                   "cuda_sync events on stream -1 left out but other syncs counted busy, kernels "
                   "with no launch event dropped when there are 2+ ProfilerSteps, intervals "
                   "rounded inward to whole us. Default: no sync event is busy (they are waits), "
                   "kernels with no launch event are kept (real GPU work), sub-us times kept. "
                   "Both: the last of 2+ ProfilerSteps left out; events without dur or with "
                   "NaN/negative/over-a-day durations skipped and counted. The rules used are in "
                   "the record (traces.ranks.N.rules)")
    g.add_argument("--slot-window", type=int, default=16, metavar="W",
                   help="decode lines per slot-imbalance window: pp + async depth (default 16)")


def wants(args: argparse.Namespace) -> bool:
    return any(getattr(args, d, None) for d in _DESTS)


def _mmb(s: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise CliError(f"--mmb-sweep: expected comma-separated integers, got {s!r}") from None


def collect(args: argparse.Namespace) -> SglangData:
    from reports.base import bench_serving as sglang_bench
    from microbench.sglang import log as sglang_log
    from microbench.sglang import trace as sglang_trace
    data = SglangData()
    if not wants(args):
        raise CliError("needs at least one of --log, --traces, --metrics, --bench, --url")
    if args.link_gbps is not None and not 0 < args.link_gbps < 1e5:
        raise CliError(f"--link-gbps must be a positive number, got {args.link_gbps}")
    if args.concurrency is not None and not 1 <= args.concurrency <= 1 << 16:
        raise CliError(f"--concurrency must be between 1 and 65536, got {args.concurrency}")
    if getattr(args, "layer_partition", None) is not None and not args.sglang_traces:
        raise CliError("--layer-partition describes the traced ranks: give --traces too")
    if not 1 <= args.slot_window <= 4096:
        raise CliError(f"--slot-window must be between 1 and 4096, got {args.slot_window}")
    if args.sglang_log:         # its ranks, slot_imbalance and log
        data = sglang_log.read_logs(args.sglang_log, window=args.slot_window)
    if args.sglang_traces:
        data = replace(data, traces=sglang_trace.read_traces(
            args.sglang_traces, link_gbps=args.link_gbps,
            hta_compatible=getattr(args, "hta_compatible", False)))
    if args.sglang_metrics or getattr(args, "metrics_window", None) is not None:
        from microbench.sglang import metrics_window as mw
        if args.sglang_metrics:
            srcs = args.sglang_metrics
            pages, src, secs = mw.read_pages([srcs] if isinstance(srcs, str) else list(srcs))
        elif args.url:
            pages, src, secs = mw.scrape_pages(args.url, args.metrics_window)
        else:
            raise CliError("--metrics-window needs --url (or give saved scrapes to --metrics)")
        data = replace(data, metrics={**pages[-1], "source": src}, metrics_window=from_json(
            MetricsWindow, mw.window(pages, src, secs), "metrics_window"))
    if args.bench:
        b = sglang_bench.read_bench(args.bench)
        data = replace(data, bench=tuple(from_json(BenchRun, r, f"bench[{i}]")
                                         for i, r in enumerate(b["runs"])),
                       bench_source=BenchSource(file=b["file"], format=b["source"],
                                                lines_unrecognised=b["lines_unrecognised"]))
        dup = [n for n in sglang_bench.observed_points(b["runs"], b["file"])[1]
               if " runs at C=" in n]             # several runs at one C: which one counts
        for note in b["notes"] + dup:
            print(f"warning: {note}", file=sys.stderr)
    if args.sglang_traces:      # after --bench: its --max-concurrency is C when not given
        loop = _loop(args, data)
        if args.sglang_log:
            from microbench.sglang.profiler_cost import window_evidence
            from reports.model.observed.resample import LEVEL, REPLICATES, SEED
            slow, slow_ci, bursts = window_evidence(_log_files(args.sglang_log), LEVEL,
                                                    REPLICATES, SEED)
            loop = replace(loop, profiler_slowdown=slow, profiler_slowdown_ci=slow_ci, bursts=tuple(
                from_json(ArrivalBurst, b, f"loop.bursts[{i}]") for i, b in enumerate(bursts)))
        data = replace(data, loop=loop)
    if args.url and not _reads(args, "live"):
        pass      # --metrics-window: the server's own load is watched, none is added
    elif args.url:
        from microbench.sglang import live as sglang_live
        if not 1 <= args.live_concurrency <= 4096 or not 1 <= args.live_tokens <= 1 << 20:
            raise CliError("--live-concurrency must be 1..4096 and --live-tokens 1..1048576")
        for name in ("live_timeout", "live_stagger_ms"):
            v = getattr(args, name)
            if not 0 <= v < 1e6 or (name == "live_timeout" and v == 0):
                raise CliError(f"--{name.replace('_', '-')} must be a positive number, got {v}")
        cfg = sglang_live.LiveConfig(
            url=args.url, concurrency=args.live_concurrency, max_tokens=args.live_tokens,
            arrival=args.live_arrival, stagger_s=args.live_stagger_ms / 1e3, timeout_s=args.live_timeout,
            model=args.model_name, chat=args.chat, mmb_sweep=_mmb(args.mmb_sweep),
            profile=args.profile, trace_dir=args.trace_dir, profile_steps=args.profile_steps,
            profile_stacks=getattr(args, "profile_stacks", False))
        data = replace(data, live=sglang_live.run_live(cfg, link_gbps=args.link_gbps))
    elif args.profile:
        raise CliError("--profile needs --url")
    return data


def _log_files(paths) -> list[Path]:
    """The plain-text log files among --log's paths (folders: their *.log files)."""
    out = []
    for p in (paths if isinstance(paths, (list, tuple)) else [paths]):
        p = Path(p)
        out += sorted(p.glob("*.log")) if p.is_dir() else [p] if p.suffix != ".gz" else []
    return out


def _model(args: argparse.Namespace):
    """The model of `--model` (a preset or a config.json), or None."""
    if getattr(args, "model", None):
        from reports.base.model_config import ConfigError, load_model
        try:
            return load_model(args.model)
        except (ConfigError, OSError, ValueError) as e:
            raise CliError(f"--model {args.model}: {str(e).splitlines()[0]}") from None
    return None


def _hidden(args: argparse.Namespace) -> int | None:
    """Hidden size, to turn a hidden-state receive's element count into a micro-batch size:
    the model preset's (`--model`), else None (then only rank 0's batch sizes are known)."""
    m = _model(args)
    return m.hidden if m is not None else None


def _layers(args: argparse.Namespace, pp: int) -> tuple[int | None, str | None]:
    """(the model's layer count, the server's SGLANG_PP_LAYER_PARTITION) as given, the
    partition checked as SGLang checks it (reports/base/partition.py) against the traced
    ranks and the model's layers; a partition alone gives the layer count."""
    from reports.base.partition import layer_counts
    m = _model(args)
    total = m.num_layers if m is not None else None
    part = getattr(args, "layer_partition", None)
    if part is None:
        return total, None
    try:
        counts = [int(x) for x in str(part).split(",")]
    except ValueError:
        raise CliError(f"--layer-partition {part!r}: expected comma-separated integers like "
                       "7,7,8") from None
    try:
        layer_counts(total if total is not None else sum(counts), pp, str(part))
    except ValueError as e:
        raise CliError(f"--layer-partition: {e}") from None
    return total if total is not None else sum(counts), ",".join(map(str, counts))


def _loop(args: argparse.Namespace, data: SglangData) -> LoopProfile:
    """Per-iteration loop profile of the traced ranks (microbench/sglang/steps.py)."""
    from microbench.sglang import steps
    from microbench.sglang import trace as sglang_trace
    by_name = {p.name: p for p in sglang_trace.find_traces(args.sglang_traces)}
    tr = data.traces.ranks
    paths = {int(r): by_name[d.file] for r, d in tr.items() if d.file in by_name and r.isdigit()}
    offsets = {int(r): d.clock_offset_us for r, d in tr.items()
               if r.isdigit() and d.clock_offset_us}   # evidence.py's estimate
    loop = steps.read_loop(paths, hidden=_hidden(args), link_gbps=args.link_gbps,
                           no_gpu_events=bool(tr) and all(not d.gpu_events for d in tr.values()),
                           offsets=offsets)
    c, c_from = args.concurrency, "given (ppscope sglang --concurrency)"
    if c is None and args.url and args.profile:
        c, c_from = args.live_concurrency, "the live probe's --live-concurrency"
    caps = {b.max_concurrency for b in data.bench} - {None}
    if c is None and len(caps) == 1:
        c, c_from = caps.pop(), "bench_serving's --max-concurrency (--bench)"
    total, part = _layers(args, len(loop.ranks))
    return replace(loop, concurrency=c, model=getattr(args, "model", None),
                   link_gbps=args.link_gbps, concurrency_from=c_from if c else None,
                   num_layers=total, layer_partition=part)


def render(data: SglangData) -> str:
    from tabulate import tabulate
    parts = []
    if data.ranks:
        def row(label, d):
            imb = d.slot_imbalance
            return [label, d.decode_lines, d.prefill_lines, _count(d.running_req.min),
                    d.running_req.median, _count(d.running_req.max), d.cuda_graph_frac,
                    d.gen_throughput_tok_s.median, imb.max_over_mean_median if imb else None]
        rows = []
        for r, d in data.ranks.items():   # DP attention: all DP ranks, then each one
            rows.append(row(f"{r} (all DP)" if d.by_dp else r, d))
            rows += [row(f"{r} DP{k}", x) for k, x in d.by_dp.items()]
        parts.append("Server log, per PP rank\n" + tabulate(rows, headers=[
            "pp rank", "decode lines", "prefill lines", "running min", "running median",
            "running max", "cuda-graph frac", "gen tok/s median", "slot max/mean"],
            floatfmt=".2f"))
        log = data.log
        parts.append(f"lines: {log.lines_total} total, {log.lines_batch} batch, "
                     f"{log.lines_unrecognised} unrecognised, {log.lines_other} other")
        if log.files_without_batch_lines:
            parts.append("no batch lines in: " + ", ".join(log.files_without_batch_lines))
        from reports.model.observed.server_log import attention_lines, log_setting_lines, moe_kernel_lines
        parts += moe_kernel_lines(log.moe_kernel)
        parts += attention_lines(log.attention_backend)
        parts += log_setting_lines(log, data.ranks)
    if data.traces:
        if any(d.gpu_events for d in data.traces.ranks.values()):
            parts.append(_render_traces(data.traces.ranks))
        for line in data.traces.files_skipped:
            parts.append(f"trace left out: {line}")
        for line in (data.traces.clock or {}).get("notes") or ():   # Json: evidence.py's
            parts.append(f"clock: {line}")
    if data.loop and data.loop.ranks:
        parts.append(_render_loop(data.loop))
    if data.bench:
        rows = [["none" if b.max_concurrency is None else b.max_concurrency,
                 b.mean_concurrency, b.output_throughput, b.mean_ttft_ms,
                 b.mean_tpot_ms, b.median_itl_ms] for b in data.bench]
        parts.append("bench_serving\n" + tabulate(rows, headers=[
            "max concurrency", "mean concurrency", "output tok/s", "mean TTFT ms",
            "mean TPOT ms", "median ITL ms"], floatfmt=("g", ".2f", ".1f", ".1f", ".1f", ".1f")))
    if data.metrics_window:
        from reports.model.observed.metrics_verdicts import window_table
        parts.append(window_table(data.metrics_window))
    elif data.metrics:        # Json (display only): metrics.py's summary
        parts.append(f"metrics: {len(data.metrics['ranks'])} pp rank(s) from "
                     f"{data.metrics['source']}")
    if data.live:             # Json (display only): live.py's runs
        runs = data.live["runs"] + [s for s in data.live["mmb_sweep"] if s["status"] == "ok"]
        rows = [[r["arrival"], r.get("pp_max_micro_batch_size"), r["concurrency"],
                 r["tok_per_s"], r["itl_ms"]["p50"], r["itl_ms"]["p99"], r["lockstep"]["index"]]
                for r in runs]
        parts.append("Live probe\n" + tabulate(rows, headers=[
            "arrival", "pp_max_micro_batch_size", "C", "tok/s", "ITL p50 ms", "ITL p99 ms",
            "lockstep index"], floatfmt=".2f"))
    return "\n\n".join(parts)


def _count(v: float | None) -> int | float | None:
    """A count the payload types as a float (`Dist`: #running-req's min and max are whole
    requests), shown as the whole number it is."""
    return int(v) if v is not None and float(v).is_integer() else v


def _ms(v):
    return None if v is None else v / 1e3


def _render_loop(loop: LoopProfile) -> str:
    """The loop profile per rank (microbench/sglang/steps.py, cpu_steps.py), ms."""
    from tabulate import tabulate
    rows = []
    for r, d in sorted(loop.ranks.items(), key=lambda kv: int(kv[0])):
        if d.reason:
            rows.append([r, d.reason] + [None] * 10)
            continue
        fw = ", ".join(f"{b}: {v / 1e3:.2f}" for b, v in d.forward_us_by_batch.items()
                       if v is not None)
        w = d.wait_us_mean
        rows.append([r, d.forwards, fw, d.iterations, d.slots,
                     _ms(d.host_us_mean), _ms(d.host_us_empty_mean),
                     _ms(d.send_us_mean), _ms(w.get("relay")), _ms(w.get("input")),
                     _ms(w.get("output")), _ms(w.get("commit"))])
    hops = ", ".join(f"{k}: {v.mean_us / 1e3:.2f} ms" for k, v in loop.hops.items()
                     if v.mean_us is not None)
    where = "on the CPU (SGLang's CPU backend)" if loop.device == "cpu" else "on the GPU"
    return (f"Loop profile per rank (forwards {where}; waiting is blocked time, not work)\n"
            + tabulate(rows, headers=["rank", "decode forwards", "forward ms by batch size",
                                      "iterations", "slots", "host ms/visit",
                                      "host ms/empty visit", "hidden-state send ms",
                                      "wait: request list ms", "wait: input ms",
                                      "wait: outputs ms", "wait: send commits ms"],
                            floatfmt=".2f")
            + (f"\nhops (arrival after the send was posted): {hops}" if hops else "")
            + "".join(f"\nPP pathology [traces]: {x}" for x in loop.pathologies)
            + _bursts_line(loop))


def _bursts_line(loop: LoopProfile) -> str:
    """The benchmark's first burst of C requests as the log admitted it (arrival_bursts.py):
    the micro-batches the run kept, beside the traced window's own."""
    from reports.model.observed.bench_run import waves_text
    c = loop.concurrency
    b = next((b for b in loop.bursts if b.requests == c), None)
    if b is None:
        return ""
    return (f"\nfirst burst of {c} requests outside the traced window [log]: admitted as "
            f"{waves_text(b.waves)}")


def _render_traces(ranks: dict[str, TraceRank]) -> str:
    from tabulate import tabulate
    rows, sched = [], {}
    for r, d in ranks.items():
        if not d.gpu_events:
            rows.append([r, 0] + [None] * 12)
            continue
        cs = d.idle_split_compute_stream_us or {}      # Json (display only): trace.py's
        rec = d.nccl_recv
        rows.append([r, d.gpu_events, _ms(d.span_us), 100 * d.busy_frac,
                     100 * d.compute_us / d.span_us,
                     _ms(d.idle_us), _ms(cs.get("host_wait_us")), _ms(cs.get("other_us")),
                     rec.kernels, _ms(rec.total_us), _ms(rec.wait_us),
                     d.dispatch_latency_us.p50, d.cpu_dispatch_latency_us.p50,
                     f"{d.graph_kernels}/{d.eager_kernels}"])
        for name, v in d.scheduler_ranges_us.items():     # Json: {range: {count, total_us}}
            sched.setdefault(name, {})[r] = f"{v['total_us'] / 1e3:.1f} ({v['count']})"
    out = "Profiler traces, per rank (recv wait = NCCL receive time beyond bytes / --link-gbps)\n" + \
        tabulate(rows, headers=[
            "rank", "GPU events", "span ms", "busy %", "compute %", "idle ms", "compute idle: host-wait ms",
            "compute idle: other ms", "NCCL recvs", "NCCL recv ms", "recv wait ms",
            "GPU dispatch p50 us", "CPU dispatch p50 us", "graph/eager kernels"], floatfmt=".1f")
    bad = {r: d.events_unrecognised for r, d in ranks.items() if d.events_unrecognised}
    if bad:
        out += "\nunrecognised trace events (skipped, counted): " + \
            ", ".join(f"rank {r}: {n}" for r, n in bad.items())
    if sched:
        names = list(ranks)
        out += "\n\nScheduler ranges, ms (count)\n" + tabulate(
            [[k] + [v.get(r) for r in names] for k, v in sched.items()],
            headers=["range"] + [f"rank {r}" for r in names])
    return out


def run(args: argparse.Namespace) -> int:
    if getattr(args, "watch", None) is not None:  # --watch: microbench/watch/sampler.py
        from microbench.watch.cli import run_watch
        return run_watch(args, evidence=run_evidence if wants(args) else None)
    return run_evidence(args)


# The parts of sglang.json each source writes. Successive runs accumulate: a run replaces only
# the parts of the sources it read and keeps the others from the record already there, so
# `--log --traces` after `--url` keeps the live probe's ITL and lockstep figures.
PARTS = {"log": ("sglang_log", ("ranks", "slot_imbalance", "log")),
         "traces": ("sglang_traces", ("traces", "loop")),
         "metrics": ("sglang_metrics", ("metrics", "metrics_window")),
         "bench": ("bench", ("bench", "bench_source")),
         "live": ("url", ("live",))}


def _reads(args: argparse.Namespace, part: str) -> bool:
    """Whether this run reads `part`: `--url --metrics-window` reads the metrics, not a live
    probe."""
    window = getattr(args, "metrics_window", None) is not None
    if part == "metrics" and window:
        return True
    if part == "live" and window:
        return False
    return bool(getattr(args, PARTS[part][0], None))


def merge_earlier(data: SglangData, args: argparse.Namespace, path: Path,
                  utc: str) -> tuple[SglangData, list[str]]:
    """`data` with the parts this run did not read filled from the good sglang.json at `path`,
    and its `sources` (part -> when it was read); and the parts kept. An earlier record that
    is not a good sglang record of this schema is left alone (save_record's rule)."""
    from reports.base.records import GOOD, RecordError, read_record
    old = None
    if path.exists():
        try:
            old = read_record(path)
        except RecordError:
            old = None
    if old is not None and (old.probe != "sglang" or old.status not in GOOD
                            or old.payload is None):
        old = None
    earlier = old.payload if old is not None else None
    old_sources = dict(earlier.sources) if earlier is not None else {}
    sources, kept, parts = {}, [], {}
    for part, (dest, keys) in PARTS.items():
        if _reads(args, part):
            sources[part] = utc
        elif earlier is not None and any(getattr(earlier, k) for k in keys):
            parts.update({k: getattr(earlier, k) for k in keys})
            sources[part] = old_sources.get(part, old.provenance.utc)
            kept.append(part)
    return replace(data, **parts, sources=sources), kept


def check_usable_traces(data: SglangData) -> None:
    """A traces part with nothing usable never replaces a good one, nor passes for a reading:
    some rank must hold a GPU kernel, or (SGLang's CPU backend) a scheduler loop that was read.
    A Chrome trace of something else, ppscope's own report.trace.json, events whose times are
    all invalid or no events at all: a one-line CliError, and nothing is written."""
    tr = data.traces
    if not tr:
        return
    ranks = tr.ranks
    loop = data.loop.ranks if data.loop else {}
    if any(d.gpu_events for d in ranks.values()) or any(not d.reason for d in loop.values()):
        return
    n = sum(d.events for d in ranks.values())
    raise CliError(f"{tr.dir}: no usable event in {len(ranks)} trace file(s) ({n} "
                   "events; no GPU kernel with a valid time, no SGLang scheduler loop): not "
                   "SGLang's per-rank profiler traces? Nothing written")


def run_evidence(args: argparse.Namespace) -> int:
    import datetime as dt
    from reports.base.paths import default_record_path, json_path
    from reports.base.records import make_record, record_lock, save_record
    data = collect(args)
    check_usable_traces(data)
    path = json_path(getattr(args, "json", None), default_record_path("sglang"))
    shown = data   # the tables show what this run read
    with record_lock(path):   # read, merge, write: a second run at once waits, loses nothing
        data, kept = merge_earlier(data, args, path,
                                   dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
        from microbench.sglang.evidence import check_parts
        check_parts(data, kept, path)       # one server: a part of another is refused
        rec = make_record("sglang", data, argv=getattr(args, "argv", None))
        path, note = save_record(rec, path)
    print(render(shown))
    for r, d in (shown.traces.ranks.items() if shown.traces else ()):
        for w in d.warnings:     # after every check: a refusal is its one line alone
            print(f"warning: trace {d.file} (rank {r}): {w}", file=sys.stderr)
    if kept:
        print(f"kept from the earlier {path.name}: " + ", ".join(
            f"{p} ({data.sources[p]})" for p in kept), file=sys.stderr)
    print(f"\n{note or f'wrote {path}'}", file=sys.stderr)
    return 0
