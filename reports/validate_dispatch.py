"""Model vs the dispatch probe: rebuild the pipeline model for exactly the probe's configuration.

Inputs come only from dispatch.json: pp, async depth, slot cap; per-rank forward time by
micro-batch size (`stages[].gpu_us_p50`, pooled over runs, median); host time per slot visit
(`host_us_p50`); hop (`hop_us_in_loop`, else `send_us_p50`). Each run's own `slot_sizes` are the
slots. Output: modelled vs measured tok/s per policy x arrival x C and the % difference
(target: within 10%).
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from reports.errors import CliError
from reports.pipeline_model import LoopConfig, simulate
from reports.records import Record
from reports.scenario import interp_log


@dataclass(frozen=True)
class Check:
    policy: str
    arrival: str
    concurrency: int
    slot_sizes: tuple[int, ...]
    measured_tok_per_s: float
    modelled_tok_per_s: float
    diff_pct: float


def _med(vals: list[float]) -> float:
    return float(median(vals)) if vals else 0.0


def validate(rec: Record) -> list[Check]:
    d = rec.data
    cfg, runs = d.get("config") or {}, d.get("runs") or []
    try:
        pp, depth = int(cfg["pp"]), int(cfg["async_depth"])
    except (KeyError, TypeError, ValueError):
        raise CliError("dispatch.json: config lacks pp / async_depth") from None
    gpu: dict[int, dict[int, list[float]]] = {}
    host: dict[int, list[float]] = {}
    send: list[float] = []
    for r in runs:
        for s in r.get("stages") or []:
            rank = int(s.get("rank", 0))
            for b, us in (s.get("gpu_us_p50") or {}).items():
                if us is not None:
                    gpu.setdefault(rank, {}).setdefault(int(b), []).append(float(us))
            if s.get("host_us_p50") is not None:
                host.setdefault(rank, []).append(float(s["host_us_p50"]))
            if s.get("send_us_p50") is not None:
                send.append(float(s["send_us_p50"]))
    if len(gpu) < pp:
        raise CliError(f"dispatch.json: gpu_us_p50 for {len(gpu)} of {pp} ranks; cannot model")
    hop = d.get("hop_us_in_loop")
    hop = float(hop) if isinstance(hop, (int, float)) else _med(send)
    host_us = _med([v for vs in host.values() for v in vs])
    out = []
    for r in runs:
        sizes = [int(x) for x in r.get("slot_sizes") or []]
        if not sizes or not sum(sizes) or r.get("tok_per_s") is None:
            continue
        bmax = max(sizes)
        curves = [sorted((b, _med(v)) for b, v in gpu[i].items()) for i in range(pp)]
        stage = tuple(tuple([0.0] + [interp_log(c, b) for b in range(1, bmax + 1)])
                      for c in curves)
        hop_row = tuple([0.0] + [hop] * bmax)
        lc = LoopConfig(stage_us=stage, hop_us=tuple([hop_row] * pp), async_depth=depth,
                        host_us=host_us, empty_us=0.0, chain_us=0.0)
        sim = simulate(lc, sizes[:lc.slots])
        meas = float(r["tok_per_s"])
        out.append(Check(str(r.get("policy")), str(r.get("arrival", "burst")),
                         int(r.get("concurrency", sum(sizes))), tuple(sizes), meas,
                         sim.tok_per_s, (sim.tok_per_s / meas - 1) * 100 if meas else 0.0))
    return out
