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

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from microbench.kit.run_writer import RunWriter
from microbench.stage_cost.probe import available  # same need: torch with a CUDA GPU
from reports.base.cuda_graphs import capture_sizes, padded
from reports.base.model_config import load_model
from reports.base.partition import pp_partition
from reports.base.payloads.graphs import GraphPoint, GraphsData
from reports.base.records import Record, make_record

PROBE = "graphs"
DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)


def graph_path(batch: int, max_bs: int) -> dict[str, Any]:
    """Which path SGLang takes for a decode batch: graph (padded) or eager; the keys are
    `GraphPoint`'s sglang_path, padded_to and padding_waste."""
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


def plan_data(cfg: GraphsConfig) -> GraphsData:
    """The capture rule for this model and pp, every time still unmeasured."""
    m = load_model(cfg.model)
    stages = pp_partition(m.num_layers, cfg.pp, cfg.partition)
    paths = {b: graph_path(b, cfg.max_bs) for b in cfg.user_batches}
    off = [b for b, p in paths.items() if p["sglang_path"] == "eager"]
    flags = [f"micro-batch {b} > max_bs {cfg.max_bs}: runs eager" for b in off]
    flags += [f"micro-batch {b} replays the graph for {p['padded_to']} "
              f"({p['padding_waste']:.0%} padding)"
              for b, p in paths.items() if b not in off and p["padding_waste"] > 0]
    return GraphsData(
        model=m.name, pp=cfg.pp, max_bs=cfg.max_bs,
        capture_sizes=tuple(capture_sizes(cfg.max_bs)),
        prefill_path="eager (SGLang runs prefill eagerly under PP)",
        stage_layers=tuple(s.num_layers for s in stages),
        representative=("one decoder layer (attention + " + ("MoE" if m.is_moe else "dense MLP")
                        + ") timed; stage figures = layer x count"),
        user_batches=tuple(cfg.user_batches), off_graph_user_batches=tuple(off),
        flags=tuple(flags),
        by_batch=tuple(GraphPoint(batch=b, **graph_path(b, cfg.max_bs)) for b in cfg.batches))


def run(cfg: GraphsConfig, progress=None) -> tuple[Record, str | None]:
    """Plan (the rule) or measure; saves `cfg.out` as it goes when given (the status rule of
    `save_record`). Returns the record and the writer's note (set when the record went beside
    a good one)."""
    data = plan_data(cfg)
    writer = RunWriter(cfg.out) if cfg.out else None
    if cfg.plan:
        rec = make_record(PROBE, data, argv=list(cfg.argv))
    elif (reason := available()):
        rec = make_record(PROBE, data, status="waived", reason=f"needs a GPU: {reason}",
                          argv=list(cfg.argv))
    else:
        return _measure(cfg, data, progress, writer)
    return rec, writer.save(rec, plan=cfg.plan)[1] if writer else None


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


def measure_point(cfg: GraphsConfig, m, row: GraphPoint, stage_layers, moe_w, check: bool
                  ) -> tuple[GraphPoint, Any]:
    """One micro-batch size: eager and graph time of one layer, kernels, host launch time.
    Returns the filled point and the MoE weights (shared across sizes)."""
    import torch

    from microbench.kernels import layers as L
    from microbench.kit.graph_capture import capture_graph
    from microbench.kit.timing import do_bench, do_bench_graph, host_bench

    dev = torch.device("cuda")
    b = row.batch
    att = L.build("attention", m, b, dev, context_len=cfg.context_len)
    if m.is_moe:
        mlp = L.build("moe", m, b, dev, variant=cfg.variant, experts_sample=cfg.experts_sample,
                      weights=moe_w)
        moe_w = mlp.info.pop("weights")
    else:
        mlp = L.build("dense_mlp", m, b, dev)
    if check:
        att.check()
        mlp.check()

    def layer(att=att, mlp=mlp):
        att.fn()
        return mlp.fn()

    eager_us = do_bench(layer).median_us
    graph_us = cpu_replay_us = None
    if mlp.graphable:
        graph_us = do_bench_graph(layer).median_us
        g, _ = capture_graph(layer, warmup=1)
        cpu_replay_us = host_bench(g.replay, reps=10).median_us
        torch.cuda.synchronize()
    kernels = count_kernels(layer)
    cpu_launch_us = host_bench(layer, reps=10).median_us
    torch.cuda.synchronize()
    point = replace(
        row, eager_us=eager_us, graph_us=graph_us, kernels_per_layer=kernels,
        launch_overhead_us_per_kernel=(eager_us - graph_us) / kernels
        if graph_us is not None and kernels else None,
        cpu_launch_us=cpu_launch_us, cpu_replay_us=cpu_replay_us, moe_backend=mlp.backend,
        stage_graph_us=tuple(n * (graph_us or eager_us) for n in stage_layers))
    del att, mlp
    return point, moe_w


def _measure(cfg: GraphsConfig, data: GraphsData, progress, writer) -> tuple[Record, str | None]:
    from microbench.kernels import layers as L

    m = load_model(cfg.model).all_formats("bf16")
    moe_w = None
    errors = []
    rows = list(data.by_batch)
    for k, row in enumerate(rows):
        try:
            rows[k], moe_w = measure_point(cfg, m, row, data.stage_layers, moe_w, check=k == 0)
        except L.CheckFailed as e:
            rows[k] = replace(row, error=str(e))
        except Exception as e:  # noqa: BLE001 - record it and go on to the next size
            rows[k] = replace(row, error=f"{type(e).__name__}: "
                                         f"{(str(e).splitlines() or [''])[0][:200]}")
        if rows[k].error:
            errors.append(rows[k].error)
        if progress:
            progress.update(1)
        if writer:  # what Ctrl-C or a crash leaves: the sizes measured so far
            writer.save(make_record(PROBE, replace(data, by_batch=tuple(rows)), status="partial",
                                    reason=f"incomplete: {k + 1} of {len(rows)} batch sizes "
                                           "measured (interrupted, or still running)",
                                    argv=list(cfg.argv)))
    notes = ((f"MoE layers allocate {cfg.experts_sample} of "
              f"{load_model(cfg.model).n_routed_experts} routed experts",)
             if cfg.experts_sample else ())
    rec = make_record(PROBE, replace(data, by_batch=tuple(rows), notes=notes),
                      status="error" if errors else "ok",
                      reason="; ".join(sorted(set(errors)))[:500] if errors else None,
                      argv=list(cfg.argv))
    return rec, writer.save(rec)[1] if writer else None
