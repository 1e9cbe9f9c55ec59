"""The twin's device times for an observed server: its own traced forwards, for the held-out
check of the twin (microbench/sglang_lab/twin/observed.py).

The scenario's twin holds each forward to the model's stage time (reports/model/scenario/
twin_costs.py). The observed server's twin holds each rank's decode forward to the forward time
its own traces give on that rank for that micro-batch size (the pipeline model's input,
reports/model/observed/deployment.py: observed sizes, interpolated between them, else the
nearest). Nothing else is emulated: on SGLang's CPU backend the host work, the hops and the
prefill of the twin are this machine's SGLang's own, as they were on the observed server when it
ran here. The hold is SGLang's CPU backend's (`sync`): `ModelRunner.forward` lasts the traced
time from its start, the real forward running inside it.

The traced window ran slower than the benchmark around it by the profiler's own cost: the
record's `profiler_slowdown`, SGLang's log's visit times inside the window against outside it
(microbench/sglang/profiler_cost.py). `scale` takes it off the forwards (1 / slowdown), as the
lab's loop table takes it off the model's run (reports/lab/whatifs.py); a measured ratio of the
same run, nothing fitted to the twin.

Stated limits: a traced forward is the whole `run_batch` range, which holds a little more than
`ModelRunner.forward` (the batch's preparation and the sampling), so a held forward runs that
much long; the slowdown is the whole visit's, taken as the forward's.
"""
from __future__ import annotations

from reports.base.payloads.twin import RankCosts, TwinCosts
from reports.model.observed.deployment import Deployment, at_size

SOURCES = {
    "decode_us": "observed: each rank's traced forward by micro-batch size (ppscope sglang)",
    "hop_us": "none added: the twin's own hops (gloo on this machine)",
    "host": "none added: the twin's own SGLang host work",
    "prefill_us": "none added: the twin's own prefill",
}


def costs(dep: Deployment, bmax: int, scale: float = 1.0) -> TwinCosts:
    """The hold module's times (microbench/sglang_lab/boot/inject/ppscope_twin_hold.py; the twin
    writes them at its k, reports/base/payloads/twin.py `write_costs`); `scale`: every
    forward's factor (1 / the window's profiler slowdown, module docstring)."""
    if not 0 < scale <= 1:
        raise ValueError(f"scale must be in (0, 1], got {scale}")
    if dep.device != "cpu":
        raise ValueError(f"the observed twin holds forwards on SGLang's CPU backend only; this "
                         f"record's forwards ran on {dep.device}")
    ranks = []
    for r in range(dep.pp):
        ranks.append(RankCosts(
            decode_us=(0.0,) + tuple(round(scale * at_size(dep.forward[r], b), 3)
                                     for b in range(1, bmax + 1)),
            prefill_tokens=(1, 2), prefill_us=(0.0, 0.0), lm_head_seq_us=0.0,
            host_us=0.0, empty_us=0.0, launch_us=0.0, process_us=0.0))
    return TwinCosts(mode="sync", ranks=tuple(ranks), hop_us=(0.0,) * (bmax + 1),
                     layer_split=tuple(dep.layers), forward_scale=scale, sources=SOURCES)
