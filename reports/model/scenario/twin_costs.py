"""The twin's device times: the model's own per-stage figures, written for SGLang's processes.

The twin (microbench/sglang_lab/twin/run.py) runs SGLang's own PP server at a deployment's settings
and holds every rank's forward to that deployment's stage time. The times are the ones the
pipeline model uses (reports/model/scenario/loop_builder.py, all effects on), so the twin and the model
differ only in the loop:

- decode: `loop_config(...).stage_us[rank][b]`: the stage's floor over its efficiency at b,
  padded to the captured CUDA-graph size, eager above the graph max bs;
- hops: `hop_us(b)` for the hidden states (the topology record's hop cost where measured);
- host: per non-empty visit `host_us` (get_next_batch_to_run) plus one gloo message of the
  request relay (`chain_us`), per empty visit `empty_us` plus that message, `launch_us` per
  forward, `process_us` per result;
- prefill, which the steady-state model leaves out: the stage's roofline floor at T tokens,
  weights read once and every token's flops with attention over half the prompt, over the
  efficiency of the largest micro-batch measured (a compute-bound GEMM is at least as efficient
  as the largest decode batch); the last rank's lm_head runs once per sequence (SGLang computes
  prefill logits for the last token of each prompt only). Estimated, and labelled so.

`costs(inp, bmax)` gives the times (reports/base/payloads/twin.py `TwinCosts`); the twin writes them
at its dilation k (`write_costs`) for its hold module (boot/inject/ppscope_twin_hold.py).
"""
from __future__ import annotations

from reports.base.interp import interp_log
from reports.base.partition import pp_partition
from reports.base.payloads.twin import MODES, RankCosts, TwinCosts
from reports.base.roofline import stage_floor
from reports.model.scenario import loop_builder as lb
from reports.model.scenario.inputs import Inputs

PREFILL_TOKENS = (1, 16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384)
SOURCES = {
    "decode_us": "the pipeline model's stage cost (loop_builder, all effects on)",
    "hop_us": "the pipeline model's hop cost",
    "host": "the model's host inputs (host_us + chain_us per visit, empty_us, launch_us, process_us)",
    "prefill_us": "estimated: roofline floor at T tokens over the largest micro-batch's efficiency",
}


def _prefill_us(inp: Inputs, stage, tokens: int, eff: float) -> tuple[float, float]:
    """(stage without lm_head, lm_head for one sequence) in us for a prefill of `tokens`."""
    f = stage_floor(inp.model, stage, tokens, inp.gpu, context_len=max(1, inp.prompt_len // 2))
    body = sum(us for kind, us in f.components_us.items() if kind != "lm_head")
    head = 0.0
    if stage.lm_head:
        head = stage_floor(inp.model, stage, 1, inp.gpu).components_us.get("lm_head", 0.0)
    return body / eff, head / eff


def costs(inp: Inputs, bmax: int, partition: str | None = None,
          mode: str = "async") -> TwinCosts:
    """The model's times for decode batches up to `bmax` (k is the twin run's: `write_costs`).
    `mode`: `async`, a GPU's device time (the CPU runs ahead of the forward, as SGLang's does
    on a GPU); `sync`, SGLang's CPU backend (the forward holds its rank's CPU)."""
    if mode not in MODES:
        raise ValueError(f"mode: one of {MODES}, got {mode!r}")
    cfg = lb.loop_config(inp, lb.ALL_ON, bmax, partition=partition)
    stages = pp_partition(inp.model.num_layers, inp.pp,
                          partition if partition is not None else inp.layer_partition)
    curve = inp.eff_curve
    eff = max(1e-3, interp_log(curve, max(b for b, _ in curve)))
    ranks = []
    for r, st in enumerate(stages):
        pre = [_prefill_us(inp, st, t, eff) for t in PREFILL_TOKENS]
        ranks.append(RankCosts(
            layers=st.num_layers,
            decode_us=tuple(round(v, 3) for v in cfg.stage_us[r]),
            prefill_tokens=PREFILL_TOKENS,
            prefill_us=tuple(round(body, 3) for body, _ in pre),
            lm_head_seq_us=round(pre[0][1], 3),
            host_us=inp.host_us + inp.chain_us, empty_us=inp.empty_us + inp.chain_us,
            launch_us=inp.launch_us, process_us=inp.process_us))
    return TwinCosts(mode=mode, ranks=tuple(ranks),
                     hop_us=tuple(round(v, 3) for v in cfg.hop_us[0]),
                     layer_split=tuple(st.num_layers for st in stages), sources=SOURCES)


def model_of_twin(inp: Inputs, C: int, changes=()):
    """The model's loop with the twin's one known difference from a GPU: the forward holds its
    rank's CPU (`cpu_forward`), so host work cannot overlap it. Set beside the twin, it tells a
    loop mechanic the model misses from that difference."""
    from dataclasses import replace
    from reports.model.sim.pipeline_model import simulate
    parts = [(simulate(replace(cfg, cpu_forward=True), tuple(sizes)), w)
             for cfg, sizes, w in lb.build(inp, C, changes=changes)]
    return lb.combine(parts)
