"""`ppscope topology`: the link map, P2P bandwidth/latency matrices and the cost of a PP hop.

Offline (any machine):  ppscope topology --from-nvidia-smi topo.txt [--json OUT]
Live (GPU machine):     ppscope topology [--pp N | --gpus 0,1,..] [--quick | --thorough]
The record goes to results/topology.json (or --json), the heatmap next to it (`<name>.png`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reports.base.errors import CliError
from reports.base.paths import default_record_path, json_path

DESCRIPTION = """\
Map how the GPUs are wired and what moving a pipeline stage's hidden state costs.
Live: discovers GPUs (NVML), measures copy-engine bandwidth/latency between every pair with
P2P on and off (like cuda-samples' p2pBandwidthLatencyTest), pinned host<->device bandwidth,
all pipeline pairs copying at once (the ring), and under torchrun the NCCL and SGLang-style
send/recv cost of one PP hop for micro-batches of 1..256 requests.
Offline: --from-nvidia-smi parses a saved `nvidia-smi topo -m` (no GPU needed).
NCCL: per hop, SGLang's cost (hop_us = gloo metadata + torch send + rest) and the NCCL
transport as nccl-tests sendrecv_perf measures it; plus a sendrecv sweep over all GPUs
(8 B..128 MB in powers of two with --thorough, 7 sizes by default, 3 with --quick).
Time on n GPUs: T(n) = t_start + n*t_host + n(n-1)/2*t_pair + t_ring + t_torchrun + t_sweep
+ n*t_hop. On PCIe Gen5, t_pair ~0.8 s (0.13 s --quick), t_torchrun ~5-10 s: 8 GPUs ~40 s
by default, ~15 s with --quick. Each run records its phase times (run_time_s) and the
projection to 4 and 8 GPUs (projected_run_time_s)."""


def register(subparsers) -> None:
    p = subparsers.add_parser("topology", help="GPU link map, P2P matrices, PP hop cost",
                              description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from-nvidia-smi", metavar="FILE", dest="from_smi",
                   help="parse a saved `nvidia-smi topo -m` output instead of measuring")
    p.add_argument("--json", metavar="OUT", default=None,
                   help="record path (default: results/topology.json)")
    p.add_argument("--pp", type=int, default=None,
                   help="pipeline size: use GPUs 0..PP-1 in order (default: all GPUs)")
    p.add_argument("--gpus", default=None,
                   help="comma-separated GPU indices in pipeline order (overrides --pp)")
    p.add_argument("--hidden", type=int, default=None,
                   help="hidden size of the hop message (default: the --model's)")
    p.add_argument("--model", default="kimi-k2",
                   help="model preset or config.json for the hidden size (default kimi-k2)")
    p.add_argument("--tensors", type=int, default=2,
                   help="tensors per hop; DeepSeek/Kimi models send hidden_states and residual "
                        "(default 2)")
    speed = p.add_mutually_exclusive_group()
    speed.add_argument("--quick", action="store_true", help="fewer samples (< 15 s on 8 GPUs)")
    speed.add_argument("--thorough", action="store_true", help="more samples and batch sizes")
    p.add_argument("--no-p2p", action="store_true", help="skip the copy-engine measurements")
    p.add_argument("--no-hop", action="store_true", help="skip the torchrun PP hop")
    p.add_argument("--hop-timeout", type=float, default=180.0, metavar="S",
                   help="kill the PP hop measurement after S seconds (default 180)")
    p.add_argument("--no-png", action="store_true", help="do not write the heatmap")
    p.set_defaults(func=handle)


def _parse_gpus(s: str | None) -> tuple[int, ...] | None:
    if s is None:
        return None
    try:
        gpus = tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise CliError(f"--gpus must be comma-separated integers, got {s!r}") from None
    if len(gpus) != len(set(gpus)) or not gpus or min(gpus) < 0:
        raise CliError(f"--gpus must list distinct non-negative indices, got {s!r}")
    return gpus


def hidden_size(model: str | None, hidden: int | None) -> int:
    """--hidden wins, else the --model preset's (or config.json's) hidden size."""
    if hidden is not None:
        if hidden <= 0:
            raise CliError(f"--hidden must be positive, got {hidden}")
        return hidden
    from reports.base.model_config import load_model

    try:
        return int(load_model(model).hidden)
    except Exception as e:  # noqa: BLE001 - a bad --model is the user's to fix
        raise CliError(f"--model {model!r}: {str(e).splitlines()[0] if str(e) else e}") from None


def _finish(rec, out: Path, png: bool | Path, note: str | None = None) -> None:
    """Print the record; `png`: True to draw the heatmap now (the measured run, whose record
    is already written), or the heatmap already written with the record."""
    from topology.render import render_text, write_png

    print(render_text(rec))
    if note:  # the run went beside a good record, which stays (and so does its heatmap)
        print(note)
        return
    path = png if isinstance(png, Path) else None
    if png is True and rec.payload is not None:
        try:
            path = write_png(rec.payload, out.with_suffix(".png"))
        except OSError:   # never the new record beside the old run's heatmap
            out.with_suffix(".png").unlink(missing_ok=True)
            raise
    if path:
        print(f"heatmap: {path}")
    print(f"record: {out}")


def _check_args(args) -> None:
    """Every argument, before anything is written (one-line CliError)."""
    if args.pp is not None and args.pp < 1:
        raise CliError(f"--pp must be at least 1, got {args.pp}")
    if args.hidden is not None and not 0 < args.hidden <= 1 << 18:   # also with --from-nvidia-smi
        raise CliError(f"--hidden must be a positive hidden size (at most {1 << 18}), "
                       f"got {args.hidden}")
    if args.tensors < 1:
        raise CliError(f"--tensors must be at least 1, got {args.tensors}")
    if not 0 < args.hop_timeout < 1e7:  # also rejects NaN and inf
        raise CliError(f"--hop-timeout must be a positive number of seconds, "
                       f"got {args.hop_timeout}")


def handle(args) -> int:
    from microbench.kit.probe_cli import save_waived
    from reports.base.records import save_record

    out = json_path(args.json, default_record_path("topology"))
    gpus = _parse_gpus(args.gpus)
    _check_args(args)
    if args.from_smi:
        from topology.probe import from_smi_text
        from topology.smi_parse import TopoParseError, read_smi_file

        try:
            text = read_smi_file(args.from_smi)
        except TopoParseError as e:
            raise CliError(str(e)) from None
        try:
            pipeline = list(gpus) if gpus else None
            rec = from_smi_text(text, pipeline=pipeline, argv=args.argv)
            if pipeline is None and args.pp:
                n = len(rec.payload.gpus)
                if args.pp > n:
                    raise ValueError(f"--pp {args.pp} but the file lists {n} GPUs")
                rec = from_smi_text(text, pipeline=list(range(args.pp)), argv=args.argv)
        except (TopoParseError, ValueError) as e:
            raise CliError(f"{args.from_smi}: {e}") from None
        for note in rec.payload.notes:   # what the parser skipped or left unknown
            print(f"warning: {args.from_smi}: {note}", file=sys.stderr)
        # the record and its heatmap in one commit: a failure leaves the earlier pair whole
        from topology.render import png_bytes
        png = png_bytes(rec.payload) if not args.no_png else None
        _, note = save_record(rec, out, with_files=[(out.with_suffix(".png"), png)] if png else ())
        _finish(rec, out, png is not None and out.with_suffix(".png"), note)
        return 0

    from topology.probe import TopologyConfig, available, run

    hidden = hidden_size(args.model, args.hidden)
    why = available()
    if why:  # cannot run here: a waived record (beside a good one, never over it), exit 2
        raise CliError(f"{why} ({save_waived('topology', why, args.argv, out)})")
    cfg = TopologyConfig(json_path=out, gpus=gpus, pp=args.pp, hidden=hidden,
                         tensors=args.tensors,
                         mode="quick" if args.quick else "thorough" if args.thorough else "default",
                         p2p=not args.no_p2p, hop=not args.no_hop, hop_timeout_s=args.hop_timeout,
                         argv=tuple(args.argv))
    try:
        rec, note = run(cfg)
    except (ValueError, RuntimeError) as e:  # bad --gpus, NVML unusable: one line, exit 2
        raise CliError(str(e).splitlines()[0]) from None
    _finish(rec, out, not args.no_png, note)
    print("topology: done", file=sys.stderr)
    return 0
