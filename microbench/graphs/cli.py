"""`ppscope graphs`: CUDA-graph replay vs eager per layer, and SGLang's capture rule."""
from __future__ import annotations

import argparse

from microbench.kit.probe_cli import exit_status, run_measured
from microbench.stage_cost.cli import check_number, int_list
from reports.base.cuda_graphs import default_max_bs
from reports.base.errors import CliError
from reports.base.paths import default_record_path, json_path
from reports.base.payloads.graphs import GraphsData


def register(sub) -> None:
    from microbench.graphs import probe as gr

    p = sub.add_parser("graphs", help="CUDA-graph vs eager per layer; SGLang capture sizes",
                       description=gr.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="kimi-k2", help="preset name or HF config.json path")
    p.add_argument("--pp", type=int, default=8,
                   help="the deployment's pipeline size: sets the layers per stage (default 8)")
    p.add_argument("--partition", help="layers per stage, e.g. 7,7,7,8,8,8,8,8")
    p.add_argument("--batches", type=int_list, default=gr.DEFAULT_BATCHES,
                   help="micro-batch sizes to time, comma-separated (default: "
                        f"{','.join(map(str, gr.DEFAULT_BATCHES))})")
    p.add_argument("--max-bs", type=int, help="SGLang --cuda-graph-max-bs-decode (default: SGLang's "
                   "default for this GPU's memory, else 256)")
    p.add_argument("--user-batches", type=int_list, default=(),
                   help="micro-batch sizes your server runs, e.g. 1,4,32: flagged if eager")
    p.add_argument("--context", type=int, default=2048, help="KV-cache tokens per request")
    p.add_argument("--experts-sample", type=int, help="allocate only N routed experts")
    p.add_argument("--variant", default="fast", choices=["fast", "plain"],
                   help="torch MoE layer timed: fast (fused gate/up, one grouped GEMM per "
                        "projection) or plain (the straightforward reference layer)")
    p.add_argument("--plan", action="store_true", help="capture rule only; no GPU needed")
    p.add_argument("--json", help="record path (default results/graphs.json)")
    p.set_defaults(func=main)


MAX_BS = 1 << 16


def config_from_args(args):
    """Check every argument (one-line CliError) and build the config; nothing is written."""
    from microbench.graphs import probe as gr
    from reports.base.model_config import ConfigError, load_model
    from reports.base.partition import pp_partition

    check_number("--pp", args.pp, lo=1)
    # SGLang captures one graph per size up to max_bs (every 32 past 512): 65536 is 2000+ graphs,
    # far past any server; a billion would build a 30-million-entry list before failing
    check_number("--max-bs", args.max_bs, lo=1, hi=MAX_BS)
    check_number("--context", args.context)
    check_number("--experts-sample", args.experts_sample, lo=1)
    try:
        pp_partition(load_model(args.model).num_layers, args.pp, args.partition)
    except (ConfigError, ValueError) as e:
        raise CliError(str(e)) from None
    max_bs = args.max_bs
    if max_bs is None:
        mem = None
        if not args.plan and gr.available() is None:
            import torch
            mem = torch.cuda.get_device_properties(0).total_memory / 2**30  # binary GB
        # no GPU to ask (--plan, or measuring waived): the 90-160 GB class (RTX PRO 6000, H200)
        max_bs = default_max_bs(mem) if mem is not None else 256
    out = json_path(args.json, default_record_path(gr.PROBE))
    return gr.GraphsConfig(model=args.model, pp=args.pp, partition=args.partition,
                           batches=args.batches, max_bs=max_bs, user_batches=args.user_batches,
                           context_len=args.context, experts_sample=args.experts_sample,
                           variant=args.variant, plan=args.plan, out=out, argv=tuple(args.argv))


def main(args) -> int:
    from microbench.graphs import probe as gr

    cfg = config_from_args(args)
    rec, note = run_measured(gr, cfg, args.plan, "the capture rule", len(cfg.batches),
                             "graphs", "batch")
    print(render(rec.payload))
    print(f"\n{note or f'record: {cfg.out}'}" + (f"  status: {rec.status} ({rec.reason})"
                                                 if rec.status != "ok" else ""))
    return exit_status(rec)


def render(d: GraphsData) -> str:
    from tabulate import tabulate

    def f(v, fmt="{:.1f}"):
        return "-" if v is None else fmt.format(v)

    rows = [[r.batch, f(r.eager_us), f(r.graph_us), f(r.kernels_per_layer, "{}"),
             f(r.launch_overhead_us_per_kernel, "{:.2f}"), f(r.cpu_launch_us),
             r.sglang_path, f(r.padded_to, "{}"), f(r.padding_waste, "{:.0%}")]
            for r in d.by_batch]
    lines = [f"{d.model} PP{d.pp}: {d.representative}; max_bs {d.max_bs}, "
             f"{len(d.capture_sizes)} captured sizes; prefill {d.prefill_path}",
             tabulate(rows, headers=["batch", "eager_us", "graph_us", "kernels/layer",
                                     "launch_us/kernel", "cpu_launch_us", "sglang_path",
                                     "padded_to", "padding_waste"], tablefmt="simple")]
    lines += [f"flag: {x}" for x in d.flags]
    lines += [f"note: {x}" for x in d.notes]
    return "\n".join(lines)
