"""CUDA-graph replay vs eager launch, per decoder layer, and SGLang's graph capture rule.

Measured (one GPU): for each micro-batch size, one representative decoder layer of the model
(attention + MoE, or attention + dense MLP for a dense model) at real dimensions in bf16:
- `eager_us`: GPU time per layer launched eagerly (`do_bench`, CUDA events);
- `graph_us`: the same layer replayed from a CUDA graph (`do_bench_graph`);
- `kernels_per_layer`: GPU activities (kernels, memcpy/memset) in one eager forward,
  counted with torch.profiler;
- `launch_overhead_us_per_kernel` = (eager - graph) / kernels;
- `cpu_launch_us`: host time to enqueue one eager layer (`host_bench`, no sync inside), and
  `cpu_replay_us`: host time to launch one graph replay.
Per stage, multiply by the stage's layer count (`stage_layers`): this is one representative
layer x count, not a capture of the whole stack (said so in the record).

SGLang's rule (0.5.x, `cuda_graph_runner`): captured sizes are
`[1,2,4,8,12] + range(16,257,8) + range(272,512,16) + range(512,max_bs+1,32)` up to `max_bs`;
a decode batch runs padded to the next captured size; above `max_bs` it runs eager; prefill
always runs eager under PP. Default `max_bs` on 90-160 GB GPUs: 256 (tp < 4), 512 otherwise.
`padding_waste` = (padded - batch) / padded of the replayed work.

Run: `ppscope graphs --model kimi-k2 --pp 8` (GPU), `--plan` for the rule alone.
Read: `by_batch[i]` per micro-batch size: `graph_us` well below `eager_us` means launch gaps
dominate that size eagerly; `sglang_path` "eager" (above `max_bs`) or a large `padding_waste`
is what SGLang would pay there; `flags` names the user's own batch sizes that hit either.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from microbench.stage_cost import available  # same need: torch with a CUDA GPU
from reports.base.cuda_graphs import capture_sizes, padded
from reports.base.model_config import load_model
from reports.base.partition import pp_partition
from reports.base.records import Record, make_record, write_record

PROBE = "graphs"
DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)


def graph_path(batch: int, max_bs: int) -> dict[str, Any]:
    """Which path SGLang takes for a decode batch: graph (padded) or eager."""
    s = padded(batch, max_bs)
    if s is None:
        return {"sglang_path": "eager", "padded_to": None, "padding_waste": 0.0}
    return {"sglang_path": "graph", "padded_to": s, "padding_waste": (s - batch) / s}


@dataclass(frozen=True)
class GraphsConfig:
    model: str = "kimi-k2"
    pp: int = 8
    partition: str | None = None
    batches: tuple[int, ...] = DEFAULT_BATCHES
    max_bs: int = 256
    user_batches: tuple[int, ...] = ()   # micro-batch sizes the user runs (flagged if eager)
    context_len: int = 2048
    experts_sample: int | None = None
    variant: str = "fast"
    plan: bool = False
    out: Path | None = None
    argv: tuple[str, ...] = ()


def _base(cfg: GraphsConfig) -> dict[str, Any]:
    m = load_model(cfg.model)
    stages = pp_partition(m.num_layers, cfg.pp, cfg.partition)
    paths = {b: graph_path(b, cfg.max_bs) for b in cfg.user_batches}
    off = [b for b, p in paths.items() if p["sglang_path"] == "eager"]
    flags = [f"micro-batch {b} > max_bs {cfg.max_bs}: runs eager" for b in off]
    flags += [f"micro-batch {b} replays the graph for {p['padded_to']} "
              f"({p['padding_waste']:.0%} padding)"
              for b, p in paths.items() if b not in off and p["padding_waste"] > 0]
    return {"model": m.name, "pp": cfg.pp, "max_bs": cfg.max_bs,
            "capture_sizes": capture_sizes(cfg.max_bs),
            "prefill_path": "eager (SGLang runs prefill eagerly under PP)",
            "stage_layers": [s.num_layers for s in stages],
            "representative": ("one decoder layer (attention + "
                               + ("MoE" if m.is_moe else "dense MLP")
                               + ") timed; stage figures = layer x count"),
            "user_batches": list(cfg.user_batches), "off_graph_user_batches": off,
            "flags": flags, "by_batch": [
                {"batch": b, "eager_us": None, "graph_us": None, "kernels_per_layer": None,
                 "launch_overhead_us_per_kernel": None, "cpu_launch_us": None,
                 "cpu_replay_us": None, **graph_path(b, cfg.max_bs)} for b in cfg.batches]}


def run(cfg: GraphsConfig, progress=None) -> Record:
    data = _base(cfg)
    if cfg.plan:
        rec = make_record(PROBE, data, argv=list(cfg.argv))
    elif (reason := available()):
        rec = make_record(PROBE, data, status="waived", reason=f"needs a GPU: {reason}",
                          argv=list(cfg.argv))
    else:
        return _measure(cfg, data, progress)
    if cfg.out:
        write_record(rec, cfg.out)
    return rec


def count_kernels(fn) -> int | None:
    """GPU activities (kernels + memcpy/memset) one call of `fn` launches, via torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception:  # noqa: BLE001 - profiler unavailable (CUPTI missing): leave it unknown
        return None


def _measure(cfg: GraphsConfig, data: dict, progress) -> Record:
    import torch

    from microbench.kernels import layers as L
    from microbench.kit.timing import do_bench, do_bench_graph, host_bench

    m = load_model(cfg.model).all_formats("bf16")
    dev = torch.device("cuda")
    moe_w = None
    errors = []
    for row in data["by_batch"]:
        b = row["batch"]
        try:
            att = L.build("attention", m, b, dev, context_len=cfg.context_len)
            if m.is_moe:
                mlp = L.build("moe", m, b, dev, variant=cfg.variant,
                              experts_sample=cfg.experts_sample, weights=moe_w)
                moe_w = mlp.info.pop("weights")
            else:
                mlp = L.build("dense_mlp", m, b, dev)
            if row is data["by_batch"][0]:
                att.check()
                mlp.check()

            def layer(att=att, mlp=mlp):
                att.fn()
                return mlp.fn()

            eager = do_bench(layer)
            row["eager_us"] = eager.median_us
            row["moe_backend"] = mlp.backend
            if mlp.graphable:
                row["graph_us"] = do_bench_graph(layer).median_us
                g = torch.cuda.CUDAGraph()
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    layer()
                torch.cuda.current_stream().wait_stream(s)
                with torch.cuda.graph(g):
                    layer()
                row["cpu_replay_us"] = host_bench(g.replay, reps=10).median_us
                torch.cuda.synchronize()
            row["kernels_per_layer"] = count_kernels(layer)
            row["cpu_launch_us"] = host_bench(layer, reps=10).median_us
            torch.cuda.synchronize()
            if row["graph_us"] is not None and row["kernels_per_layer"]:
                row["launch_overhead_us_per_kernel"] = \
                    (row["eager_us"] - row["graph_us"]) / row["kernels_per_layer"]
            row["stage_graph_us"] = [n * (row["graph_us"] or row["eager_us"])
                                     for n in data["stage_layers"]]
            del att, mlp
        except L.CheckFailed as e:
            row["error"] = str(e)
            errors.append(str(e))
        except Exception as e:  # noqa: BLE001 - record it and go on to the next size
            row["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
            errors.append(row["error"])
        if progress:
            progress.update(1)
        if cfg.out:
            write_record(make_record(PROBE, data, status="error", reason="incomplete: "
                                     "still running or interrupted", argv=list(cfg.argv)),
                         cfg.out)
    if cfg.experts_sample:
        data["notes"] = [f"MoE layers allocate {cfg.experts_sample} of "
                         f"{load_model(cfg.model).n_routed_experts} routed experts"]
    rec = make_record(PROBE, data, status="error" if errors else "ok",
                      reason="; ".join(sorted(set(errors)))[:500] if errors else None,
                      argv=list(cfg.argv))
    if cfg.out:
        write_record(rec, cfg.out)
    return rec
