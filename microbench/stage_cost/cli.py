"""`ppscope stage-cost`: per-stage decode cost against its roofline (see microbench/stage_cost)."""
from __future__ import annotations

import argparse
import math

from microbench.kit.probe_cli import exit_status, run_measured
from reports.base.errors import CliError
from reports.base.paths import default_record_path, json_path
from reports.base.payloads.stage_cost import Routing, StageCostData


def int_list(s: str) -> tuple[int, ...]:
    try:
        v = tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 1,2,4,8, got {s!r}") from None
    if not v or min(v) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
    return v


def name_list(s: str) -> tuple[str, ...]:
    from microbench.stage_cost.probe import MOE_BACKENDS

    v = tuple(x.strip() for x in s.split(",") if x.strip())
    bad = [x for x in v if x not in MOE_BACKENDS]
    if not v or bad:
        raise argparse.ArgumentTypeError(f"expected some of {','.join(MOE_BACKENDS)}, got {s!r}")
    return v


def register(sub) -> None:
    from microbench.stage_cost import probe as sc

    p = sub.add_parser("stage-cost", help="per-stage decode cost vs roofline (one GPU; --plan "
                       "anywhere)", description=sc.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="kimi-k2", help="preset name or HF config.json path")
    p.add_argument("--pp", type=int, default=8, help="pipeline stages (default 8)")
    p.add_argument("--partition", help="layers per stage, e.g. 7,7,7,8,8,8,8,8 "
                   "(SGLANG_PP_LAYER_PARTITION)")
    p.add_argument("--gpu", help="GPU spec sheet for the floor (default: this GPU, else "
                   "rtx-pro-6000)")
    p.add_argument("--dtype", default="native", choices=["native", "bf16", "fp8", "int4"],
                   help="weight format for every component (native: the model's own mix)")
    p.add_argument("--moe-backends", type=name_list, default=sc.StageCostConfig.moe_backends,
                   help="MoE backends timed in the same run; the stage figures use the fastest "
                   "that passed its check, per batch (default triton,plain; known: "
                   f"{','.join(sc.MOE_BACKENDS)}; `sglang` = SGLang's own fused MoE kernel, in "
                   "the served format too (INT4 W4A16, FP8), where sglang imports)")
    p.add_argument("--batches", type=int_list, default=sc.DEFAULT_BATCHES,
                   help="micro-batch sizes (default 1,2,4,8,16,32,64,128)")
    p.add_argument("--prefill-chunk", type=int, default=2048, help="tokens; 0 skips it")
    p.add_argument("--context", type=int, default=2048, help="KV-cache tokens per request")
    p.add_argument("--zipf", type=float, default=0.0, help="expert-routing skew exponent")
    p.add_argument("--experts-sample", type=int, help="allocate only N routed experts")
    p.add_argument("--mem-bw", type=float, help="measured HBM bandwidth, GB/s, for the floor")
    p.add_argument("--plan", action="store_true", help="floors only; no GPU needed")
    p.add_argument("--png", help="plot path (default: next to the JSON)")
    p.add_argument("--png-batch", type=int, default=8, help="micro-batch size to plot")
    p.add_argument("--json", help="record path (default results/stage_cost.json)")
    p.set_defaults(func=main)


def check_number(flag: str, v: float | None, *, lo: float = 0.0, strict: bool = False,
                 hi: float | None = None) -> None:
    """A numeric flag must be finite and >= lo (> lo when strict) and <= hi when given;
    one-line CliError."""
    if v is None:
        return
    ok = math.isfinite(v) and (v > lo if strict else v >= lo)
    if not ok:
        raise CliError(f"{flag} must be a finite number {'>' if strict else '>='} {lo:g}, "
                       f"got {v}")
    if hi is not None and v > hi:
        raise CliError(f"{flag} must be at most {hi:g}, got {v}")


def config_from_args(args):
    """Check every argument (one-line CliError) and build the config; nothing is written."""
    from microbench.stage_cost import probe as sc
    from reports.base.model_config import ConfigError
    from reports.base.partition import pp_partition

    check_number("--pp", args.pp, lo=1)
    check_number("--prefill-chunk", args.prefill_chunk)
    check_number("--context", args.context)
    check_number("--zipf", args.zipf)
    check_number("--experts-sample", args.experts_sample, lo=1)
    check_number("--mem-bw", args.mem_bw, strict=True)
    if args.png_batch not in args.batches:
        raise CliError(f"--png-batch {args.png_batch} is not among --batches")
    out = json_path(args.json, default_record_path(sc.PROBE))
    cfg = sc.StageCostConfig(
        model=args.model, pp=args.pp, partition=args.partition, gpu=args.gpu, dtype=args.dtype,
        moe_backends=args.moe_backends,
        batches=args.batches, prefill_chunk=args.prefill_chunk, context_len=args.context,
        zipf_s=args.zipf, experts_sample=args.experts_sample, mem_bw_gbps=args.mem_bw,
        plan=args.plan, out=out, argv=tuple(args.argv))
    try:
        mm, _ = sc.resolve(cfg)
        pp_partition(mm.num_layers, cfg.pp, cfg.partition)
    except (ConfigError, ValueError) as e:
        raise CliError(str(e)) from None
    return cfg, mm


def main(args) -> int:
    from microbench.stage_cost import probe as sc

    cfg, mm = config_from_args(args)
    out = cfg.out
    points = 2 + mm.is_moe * len(cfg.moe_backends) + (mm.first_k_dense > 0)   # per batch
    rec, note = run_measured(sc, cfg, args.plan, "roofline floors", points * len(cfg.batches),
                             "stage-cost", "pt")
    print(render(rec.payload))
    if note:  # the run went beside a good record; that record and its plot stay
        print(f"\n{note}  status: {rec.status} ({rec.reason})")
        return exit_status(rec)
    png = sc.plot(rec.payload, args.png or out.with_suffix(".png"), args.png_batch)
    print(f"\nrecord: {out}  plot: {png}" + (f"  status: {rec.status} ({rec.reason})"
                                             if rec.status != "ok" else ""))
    return exit_status(rec)


def _f(v, fmt="{:.1f}"):
    return "-" if v is None else fmt.format(v)


def _pct(v):
    return _f(v and 100 * v, "{:.0f}%")


def render(d: StageCostData) -> str:
    from tabulate import tabulate

    rows = []
    for st in d.stages:
        for b, e in st.by_batch.items():
            rows.append([st.index, st.num_layers, "yes" if st.lm_head else "", b,
                         _f(e.measured_us), _f(e.floor_us), _pct(e.efficiency)])
    meas = d.mem_bw_measured_gbps
    out = [f"{d.model} PP{d.pp} on {d.gpu} ({d.mem_bw_gbps:.0f} GB/s, "
           f"{d.mem_bw_from}" + (f"; copy measured {meas:.0f} GB/s" if meas else "")
           + f"), formats {d.dtype}" + (f", MoE backend {d.backend}" if d.backend else ""),
           tabulate(rows, headers=["stage", "layers", "lm_head", "batch", "measured_us",
                                   "floor_us", "efficiency"], tablefmt="simple")]
    if d.layers:
        lrows = []
        for kind, by_b in d.layers.items():
            for b, e in by_b.items():
                lrows.append([kind, b, e.backend or "", _f(e.measured_us), _f(e.floor_us),
                              _pct(e.efficiency), _pct(e.efficiency_measured_bw),
                              "" if e.distinct_experts is None else e.distinct_experts,
                              _f(e.sm_clock_mhz, "{:.0f}") + (f" ({e.clock_limits})"
                                                              if e.clock_limits else ""),
                              (e.error or "")[:60]])
        out += ["", tabulate(lrows, headers=["layer", "batch", "backend", "measured_us",
                                             "floor_us", "eff_spec_bw", "eff_measured_bw",
                                             "experts", "SM MHz", "error"], tablefmt="simple")]
    imb = [[b, _f(v.measured, "{:.3f}"), _f(v.floor, "{:.3f}")]
           for b, v in d.imbalance.items()]
    if imb:
        out += ["", tabulate(imb, headers=["batch", "imbalance_measured (max/mean)",
                                           "imbalance_floor"], tablefmt="simple")]
    if d.routing:
        out += ["", render_routing(d.routing)]
    out += [f"note: {n}" for n in d.notes]
    return "\n".join(out)


def render_routing(r: Routing) -> str:
    """Compact routing-skew table: one row per batch, one column per Zipf exponent, each cell
    `distinct experts per MoE layer / MoE MB per token per layer / stage bytes max/mean`."""
    from tabulate import tabulate

    zs = list(r.by_zipf)
    batches = list(r.by_zipf[zs[0]])
    rows = [[b] + [f"{e.distinct_experts:.1f} / {e.moe_bytes_per_token / 1e6:.0f} / "
                   f"{e.stage_spread_max_over_mean:.3f}"
                   for e in (r.by_zipf[s][b] for s in zs)] for b in batches]
    loss = max(e.slowest_stage_loss for by_b in r.by_zipf.values() for e in by_b.values())
    return (f"routing skew ({r.source}, {r.draws} draws; each token picks {r.top_k} of "
            f"{r.experts} experts, Zipf exponent s, 0 = uniform)\n"
            + tabulate(rows, headers=["batch"] + [f"s={s}: experts / MB/token / stage max/mean"
                                                  for s in zs], tablefmt="simple")
            + f"\nslowest stage lost to per-step routing noise (E[max]/max E - 1): at most "
            f"{100 * loss:.2f}%" + ("; the layer split and lm_head set the spread" if loss < 0.005
                                    else ""))
