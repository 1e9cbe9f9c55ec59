"""`ppscope dispatch`: argument parsing and the human-readable table for microbench/dispatch/probe.py.
No torch at import time."""
from __future__ import annotations

import argparse

from reports.base.errors import CliError
from reports.base.sglang_defaults import MRR_MIN
from reports.base.paths import default_record_path, json_path, results_dir
from reports.base.slots import POLICIES

EPILOG = """\
examples:
  ppscope dispatch --pp 2 --work moe --layers-per-stage 2 --concurrency 1,8,32 --policies sglang,even
  NCCL_P2P_DISABLE=1 ppscope dispatch --pp 2 --json results/dispatch_nop2p.json
  ppscope dispatch --pp 2 --moe-variant fast   # torch MoE (default auto: Triton, as stage-cost)
  ppscope dispatch --pp auto --work busy --cost-us 1:800,8:900,32:1200 --no-graphs
  ppscope dispatch --pp 2 --profile --trace-dir traces/   # per-rank Kineto traces, SGLang names
  ppscope dispatch --pp 2 --profile --inject slow-stage=1:1.5   # what a slow stage looks like

serve mode: the same loop behind an OpenAI-compatible endpoint with SGLang's control routes
(/v1/completions, /v1/chat/completions, /v1/models, /health, /get_server_info, /metrics,
/start_profile, /stop_profile, /set_internal_state), on rank 0, until Ctrl-C:
  ppscope dispatch --pp 2 --serve 30000 --max-running-requests 64
  ppscope sglang --url http://127.0.0.1:30000 --profile --trace-dir "$PWD/traces" --mmb-sweep 1,2,4,8
  (then Ctrl-C the first; its record goes to results/dispatch_serve.json)

SGLang's own evidence (logs, traces, metrics, bench, a live server) is `ppscope sglang`.

multi-node: pass torchrun's own flags through --torchrun-args, e.g.
  --torchrun-args "--nnodes 2 --node-rank 0 --rdzv-backend c10d --rdzv-endpoint HOST:29500"
  (run the same command on every node; --pp is then GPUs per node; host clocks differ between
  nodes, so cross-node hop times are not meaningful). Not tested.

reading it: tok/s per policy and concurrency; even/sglang ratio (and why, when even does not
help); per stage: busy fraction, dispatch latency (input on GPU -> first kernel) p50/p99,
GPU forward time per micro-batch size. Open the trace in ui.perfetto.dev to see the herd.
"""


def _ints(text: str) -> tuple[int, ...]:
    try:
        v = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not v or min(v) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return v


def _choices(allowed):
    def parse(text: str) -> tuple[str, ...]:
        v = tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [x for x in v if x not in allowed]
        if not v or bad:
            raise argparse.ArgumentTypeError(
                f"{', '.join(bad) or text!r}: choose from {', '.join(allowed)}")
        return v
    return parse


def register(subparsers) -> None:
    from microbench.dispatch.probe import ARRIVALS, DEVICES, WORKS
    p = subparsers.add_parser(
        "dispatch", help="SGLang's PP scheduler loop on real GPUs: dispatch latency, slot balance",
        description="Run SGLang's pipeline-parallel decode loop discipline (pp + async-depth "
                    "slots, requests pinned to the slot that admitted them, gloo request lists, "
                    "NCCL hidden states) on real GPUs, one process per GPU under torchrun, and "
                    "measure where each stage's time goes under the `sglang` and `even` "
                    "admission policies.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pp", default="auto", help="pipeline stages = GPUs (default: auto = all "
                   "visible GPUs; more than visible is an error)")
    p.add_argument("--async-depth", type=int, default=None,
                   help="--pp-async-batch-depth: extra slots (default: = pp)")
    p.add_argument("--max-running-requests", type=int, default=MRR_MIN,
                   help="sets the per-slot cap max(this // pp, 1) (default %(default)s: SGLang "
                   "0.5.23 derives clamp(KV-pool tokens / context x 512, 2048, 4096) when not "
                   "given; this loop holds no KV pool, so the floor)")
    p.add_argument("--max-micro-batch", type=int, default=None,
                   help="per-slot cap pp_max_micro_batch_size (overrides the above)")
    p.add_argument("--chunked-prefill-size", type=int, default=8192,
                   help="prefill token budget per slot visit (SGLang's default on 90-160 GB "
                        "GPUs: 8192); <= 0 turns chunked prefill off (then "
                        "max_prefill_tokens 16384 is the budget)")
    p.add_argument("--micro-batches", type=int, default=None,
                   help="`even` policy: slots to spread over (default pp)")
    p.add_argument("--work", choices=WORKS, default="moe",
                   help="stage work: real K2-dims MoE layers (bf16) or a calibrated busy kernel")
    p.add_argument("--moe-variant", choices=["auto", "triton", "fast", "plain"], default="auto",
                   help="--work moe: MoE backend. auto (default) = as stage-cost picks: the "
                        "fused Triton decode kernel where triton imports and passes its "
                        "reference check on this GPU, else torch fast, else the per-expert "
                        "loop; triton|fast|plain force one (a rank fails if it cannot run)")
    p.add_argument("--layers-per-stage", type=int, default=2,
                   help="MoE layers per stage (fewer if memory is short; the record says so)")
    p.add_argument("--cost-us", default="1:800,8:900,32:1200",
                   help="--work busy: stage time vs micro-batch size, BATCH:US,... interpolated")
    p.add_argument("--model", default="kimi-k2", help="model preset for dimensions")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--graphs", dest="graphs", action="store_true", default=True,
                   help="capture the decode forward in CUDA graphs (default)")
    g.add_argument("--no-graphs", dest="graphs", action="store_false", help="run eager")
    p.add_argument("--concurrency", type=_ints, default=(1, 8, 32), help="default 1,8,32")
    p.add_argument("--policies", type=_choices(POLICIES), default=None,
                   help="admission policies (default sglang,even; with --serve one, default "
                        "sglang)")
    p.add_argument("--arrival", type=_choices(ARRIVALS), default=("burst",),
                   help="arrival patterns: burst (default), staggered, poisson")
    p.add_argument("--stagger-ms", type=float, default=2.0, help="staggered: gap per stream")
    p.add_argument("--poisson-rate", type=float, default=500.0, help="poisson: streams/s")
    p.add_argument("--prompt-len", type=int, default=16, help="prefill tokens per request")
    p.add_argument("--seconds", type=float, default=None,
                   help="measured steady-decode seconds per point (default 2); with --serve: "
                        "serve this long, then stop (default: until Ctrl-C or SIGTERM)")
    p.add_argument("--timeout", type=float, default=None,
                   help="whole-run limit in seconds (default 600; with --serve none)")
    p.add_argument("--collective-timeout", type=float, default=120.0,
                   help="timeout of every collective / receive, seconds")
    p.add_argument("--trace", default=None, help="Perfetto trace path (default next to --json)")
    p.add_argument("--torchrun-args", default="", help="extra torchrun flags (multi-node)")
    p.add_argument("--inject", action="append", default=[], metavar="FAULT",
                   help="inject a fault to see what it looks like (repeatable): "
                        "slow-stage=RANK:FACTOR, host-delay=RANK:US, hop-delay=US")
    p.add_argument("--json", default=None, help="record path (default results/dispatch.json; with --serve "
                   "results/dispatch_serve.json, so a served session never replaces the "
                   "benchmark record the report reads)")
    p.add_argument("--profile", action="store_true",
                   help="record per-rank torch.profiler traces of the loop (SGLang's range names) "
                        "and SGLang-format scheduler logs, for `ppscope sglang --traces/--log`")
    p.add_argument("--trace-dir", metavar="DIR",
                   help="--profile: where the traces and logs go (default results/dispatch_traces;"
                        " with --serve: where /start_profile writes when its body names no "
                        "output_dir and SGLANG_TORCH_PROFILER_DIR is unset)")
    p.add_argument("--serve", metavar="[HOST:]PORT",
                   help="serve mode: rank 0 answers an OpenAI-compatible endpoint with SGLang's "
                        "control routes (host default 127.0.0.1) and the loop runs the requests "
                        "it gets until Ctrl-C / SIGTERM / --seconds; --concurrency and --arrival "
                        "do not apply; record: results/dispatch_serve.json")
    p.add_argument("--device", choices=DEVICES, default="cuda",
                   help="cuda (default: one GPU per rank, NCCL for tensors) or cpu (as SGLang's "
                        "--device cpu: gloo for everything, the forward on the host; --work busy "
                        "only, no CUDA graphs; runs on a machine without GPUs)")
    p.set_defaults(func=handle)


def config_from_args(args, n_gpus: int, check_gpus: bool = True):
    """Check every argument (one-line CliError) and build the config. With check_gpus False
    (no GPU here: the record will be waived) --pp is checked for form only."""
    from microbench.dispatch.probe import DispatchConfig, resolve_pp
    from microbench.dispatch.pp_loop import parse_cost_curve
    try:
        pp = resolve_pp(args.pp, n_gpus if check_gpus else max(n_gpus, 2 ** 16)) \
            if str(args.pp) != "auto" or check_gpus else 2
        if args.work == "busy":
            parse_cost_curve(args.cost_us)
        from reports.base.inject import parse_inject
        parse_inject(args.inject, pp)
    except ValueError as e:
        raise CliError(str(e)) from None
    for name in ("async_depth", "max_micro_batch", "micro_batches"):
        v = getattr(args, name)
        if v is not None and v < (0 if name == "async_depth" else 1):
            raise CliError(f"--{name.replace('_', '-')} must be "
                           f"{'>= 0' if name == 'async_depth' else '>= 1'}, got {v}")
    serve = getattr(args, "serve", None)
    policies = args.policies or (("sglang",) if serve else ("sglang", "even"))
    if serve:
        from microbench.dispatch.serve_http import parse_address
        try:
            host, port = parse_address(serve)
        except ValueError as e:
            raise CliError(str(e)) from None
        if len(policies) != 1:
            raise CliError("--serve runs one admission policy: give one with --policies "
                           "(sglang or even)")
        if args.profile:
            raise CliError("--serve: profile through POST /start_profile and /stop_profile "
                           "(or `ppscope sglang --url ... --profile`), not --profile")
    seconds = args.seconds if args.seconds is not None else (None if serve else 2.0)
    timeout = args.timeout if args.timeout is not None else (None if serve else 600.0)
    if args.layers_per_stage < 1 or args.prompt_len < 1:
        raise CliError("--layers-per-stage and --prompt-len must be >= 1")
    for name, v in (("seconds", seconds), ("timeout", timeout),
                    ("collective_timeout", args.collective_timeout),
                    ("poisson_rate", args.poisson_rate)):
        if v is None:
            continue
        if not (v > 0 and v < 1e7):  # also rejects NaN and inf
            raise CliError(f"--{name.replace('_', '-')} must be a positive number, got {v}")
    if not 0 <= args.stagger_ms < 1e6:
        raise CliError(f"--stagger-ms must be >= 0, got {args.stagger_ms}")
    if args.max_running_requests < 1:
        raise CliError(f"--max-running-requests must be >= 1, got {args.max_running_requests}")
    if max(args.concurrency) > 4096:
        raise CliError(f"--concurrency: at most 4096 streams per point, got {max(args.concurrency)}")
    return DispatchConfig(
        pp=pp, async_depth=args.async_depth, max_running_requests=args.max_running_requests,
        chunked_prefill_size=args.chunked_prefill_size,
        max_micro_batch=args.max_micro_batch, micro_batches=args.micro_batches, work=args.work,
        moe_variant=args.moe_variant,
        layers_per_stage=args.layers_per_stage, cost_us=args.cost_us, model=args.model,
        graphs=args.graphs, concurrency=args.concurrency, policies=policies,
        arrivals=args.arrival, prompt_len=args.prompt_len, stagger_ms=args.stagger_ms,
        poisson_rate_per_s=args.poisson_rate,
        seconds_per_point=2.0 if serve else seconds,
        collective_timeout_s=args.collective_timeout, timeout_s=timeout,
        profile_dir=((args.trace_dir or str(results_dir() / "dispatch_traces"))
                     if args.profile or serve else None),
        json_path=str(json_path(args.json, default_record_path("dispatch_serve" if serve
                                                                     else "dispatch"))),
        serve=f"{host}:{port}" if serve else None, serve_seconds=seconds if serve else None,
        trace_path=args.trace, torchrun_args=tuple(args.torchrun_args.split()),
        inject=tuple(args.inject), device=getattr(args, "device", "cuda"),
        argv=tuple(getattr(args, "argv", ())))


def render(rec) -> str:
    from tabulate import tabulate
    lines = [f"dispatch: {rec.status}" + (f" ({rec.reason})" if rec.reason else "")]
    d = rec.payload
    if d is None:
        return lines[0]
    c = d.config
    lines.append(f"pp={c.pp} slots={c.slots} cap={c.max_micro_batch} work={c.work}"
                 + (f" moe={c.moe_backend}" if c.moe_backend else "")
                 + f" graphs={c.graphs} nccl_p2p_disabled={c.nccl_p2p_disabled}"
                 + (f" inject={','.join(c.inject)}" if c.inject else ""))
    rows = []
    for r in d.runs:
        for s in r.stages:
            rows.append([r.policy, r.arrival, r.concurrency, _f(r.tok_per_s), _f(r.tpot_ms, 2),
                         ",".join(str(x) for x in r.slot_sizes), s.rank, _f(s.busy_frac, 2),
                         _f(s.dispatch_latency_us.p50), _f(s.dispatch_latency_us.p99),
                         _f(s.wait_us_p50), _f(s.send_us_p50)])
    if rows:
        lines.append(tabulate(rows, headers=["policy", "arrival", "C", "tok/s", "TPOT ms",
                                             "slot sizes", "stage", "busy", "disp p50 us",
                                             "disp p99 us", "wait p50 us", "send p50 us"]))
    cmp_rows = [[x.arrival, x.concurrency, _f(x.ratio, 3), x.why_not or ""]
                for x in d.even_vs_sglang]
    if cmp_rows:
        lines.append(tabulate(cmp_rows, headers=["arrival", "C", "even/sglang", "why not"]))
    if d.hop_us_in_loop is not None:
        lines.append(f"hop inside the loop (p50): {d.hop_us_in_loop:.1f} us")
    return "\n".join(lines)


def _check_listen(addr: str) -> None:
    """Bind the serve address once before launching the ranks: a port in use (or a host not of
    this machine) is a one-line error now, not a failed rank later."""
    import socket
    from microbench.dispatch.serve_http import parse_address
    host, port = parse_address(addr)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(infos[0][4])
    except OSError as e:
        raise CliError(f"--serve {addr}: cannot listen there ({e.strerror or e})") from None


def _f(x, nd: int = 0) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def handle(args) -> int:
    from microbench.dispatch.probe import available, run, trace_path_for, visible_gpus
    from microbench.kit.probe_cli import save_waived
    cpu = getattr(args, "device", "cuda") == "cpu"
    n = visible_gpus() if not cpu else 2   # on the CPU --pp auto is 2 ranks
    reason = available("cpu") if cpu else available()
    # arguments first: a bad flag is a one-line error and writes nothing
    cfg = config_from_args(args, n if not reason or str(args.pp) != "auto" else 2,
                           check_gpus=not reason and not cpu)
    if cpu and cfg.work != "busy":
        raise CliError("--device cpu runs --work busy only (the MoE stage needs a GPU)")
    if cfg.serve and not reason:
        _check_listen(cfg.serve)
    if reason:  # cannot run here: a waived record (beside a good one, never over it), exit 2
        saved = save_waived("dispatch", reason, getattr(args, "argv", None), cfg.json_path)
        raise CliError(f"{reason}; nothing measured ({saved}); on a machine without GPUs, read "
                       "SGLang's evidence with `ppscope sglang`")
    if cfg.serve:
        print(f"starting {cfg.pp} ranks; rank 0 serves http://{cfg.serve} once the stages are "
              "built (GET /health answers 200 then); Ctrl-C or SIGTERM stops it", flush=True)
    try:
        rec, note = run(cfg)
    except ValueError as e:
        raise CliError(str(e)) from None
    print(render(rec))
    if note:
        print(note)
    elif rec.status in ("ok", "partial"):
        print(f"wrote {cfg.json_path} and {trace_path_for(cfg)}")
    return 0 if rec.status == "ok" else 1

