"""Block-size sweep and per-layer table for the Triton MoE kernel (`microbench/kernels/moe_triton.py`).

Run on a GPU: `PYTHONPATH=. python3 -m microbench.stage_cost.tune_moe_triton --out DIR` checks the layer
against the float32 reference (small and real Kimi K2 dims), sweeps block sizes, then prints the
per-layer table triton vs plain vs fast under CUDA-graph replay, with each one's share of the HBM
floor (spec sheet and measured copy bandwidth). The kernel module itself holds no tuning code.
DIR/moe_triton.json (default results/) is a ppscope record (`reports/base/records.py`: probe
`tune_moe_triton`, provenance, status): `partial` after each part, `ok` at the end, `error` with
what was kept when a part fails; without a GPU a `waived` one and exit 2.
"""
from __future__ import annotations

from dataclasses import asdict

from microbench.kernels.moe_triton import (KernelConfig, MoeConfig, config_for, down, gate_up,
                                           moe_experts, plan_blocks)

PROBE = "tune_moe_triton"   # the record's probe (module docstring)

# ------------------------------------------------------------------ GPU script: check, sweep, table

SWEEP_GATE_UP = tuple(KernelConfig(n, k, w, s) for n in (16, 32, 64, 128) for k in (128, 256)
                      for w, s in ((4, 3), (4, 4), (8, 4)))
SWEEP_DOWN = tuple(KernelConfig(n, k, w, s) for n in (32, 64, 128, 256) for k in (64, 128, 256)
                   for w, s in ((4, 3), (4, 5)))


def sweep(m, weights, batches, budget_s: float, progress=None) -> dict:
    """Time each kernel alone per block config and batch size; returns the best configs and
    every point ({"gate_up": {b: [(us, cfg)...]}, ...}). Stops at budget_s."""
    import time

    import torch

    from microbench.kernels import layers as L
    from microbench.kernels import common
    from microbench.kit.timing import do_bench

    t0 = time.perf_counter()
    out = {"gate_up": {}, "down": {}, "best": {}, "truncated": False}
    dev = torch.device("cuda")
    for b in batches:
        x = common.randn((b, m.hidden), 1.0, common.gen(dev, 7), dev)
        ids, tw = L.append_shared(weights, *L.moe_route(weights, x))
        kk = ids.shape[1]
        plan = plan_blocks(ids.reshape(-1), weights.gate_up.shape[0], 16)
        twf = tw.reshape(-1).float().contiguous()
        act = gate_up(x, weights.gate_up, plan, KernelConfig(), 16, kk)
        for name, grid in (("gate_up", SWEEP_GATE_UP), ("down", SWEEP_DOWN)):
            pts = []
            for kc in grid:
                if time.perf_counter() - t0 > budget_s:
                    out["truncated"] = True
                    break
                fn = ((lambda kc=kc: gate_up(x, weights.gate_up, plan, kc, 16, kk))
                      if name == "gate_up" else
                      (lambda kc=kc: down(act, weights.down, twf, plan, kc, 16)))
                try:
                    t = do_bench(fn, warmup_ms=5, rep_ms=30)
                    pts.append((t.median_us, asdict(kc)))
                except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: skip
                    pts.append((None, {**asdict(kc), "error": type(e).__name__}))
                if progress:
                    progress.update(1)
            out[name][str(b)] = pts
            ok = [p for p in pts if p[0] is not None]
            if ok:
                out["best"].setdefault(str(b), {})[name] = min(ok, key=lambda p: p[0])
    return out


def _main(argv=None) -> int:
    """Parse, then check, sweep and time; the record (`ToolWriter`) is written as it goes:
    `partial` after each part, `ok` at the end, `error` with what was kept when a part fails,
    `waived` without a GPU."""
    import argparse
    import sys
    from pathlib import Path

    from microbench.kit.run_writer import ToolWriter
    from reports.base.paths import results_dir

    p = argparse.ArgumentParser(prog="python -m microbench.stage_cost.tune_moe_triton",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="kimi-k2")
    p.add_argument("--batches", default="1,2,4,8,16,32,64,128")
    p.add_argument("--sweep-batches", default="1,8,32,128")
    p.add_argument("--sweep-budget-s", type=float, default=60.0, help="0 skips the sweep")
    p.add_argument("--use-sweep", action="store_true",
                   help="time the layer with the sweep's best configs instead of CONFIGS")
    p.add_argument("--out", default=str(results_dir()),
                   help="directory for the record moe_triton.json (default results/)")
    argv = sys.argv[1:] if argv is None else list(argv)
    a = p.parse_args(argv)
    writer = ToolWriter(Path(a.out, "moe_triton.json"), PROBE,
                        ["python3", "-m", "microbench.stage_cost.tune_moe_triton", *argv])

    import torch

    if not torch.cuda.is_available():
        return writer.waive("needs a CUDA GPU")
    return writer.run(lambda res: _run(a, res, writer))


def _run(a, res: dict, writer) -> int:
    """Check, sweep, then the per-layer table (module docstring), filling `res`."""
    import dataclasses
    import json

    import torch
    from tabulate import tabulate

    from microbench.kernels import common
    from microbench.kernels import layers as L
    from microbench.stage_cost import probe as sc
    from microbench.kit.timing import do_bench_graph
    from reports.base.model_config import load_model

    dev = torch.device("cuda")
    m = load_model(a.model).all_formats("bf16")
    gpu = sc.resolve(sc.StageCostConfig(model=a.model, dtype="bf16"))[1]
    res.update({"gpu": torch.cuda.get_device_name(), "spec": gpu.name,
                "mem_bw_spec_gbps": gpu.mem_bw_gbps, "checks": {}, "rows": []})
    batches = [int(x) for x in a.batches.split(",")]

    def save():
        writer.record(res, "partial", f"written as the run goes: {len(res['rows'])} of "
                      f"{len(batches)} layer rows")

    bw = sc.measure_mem_bw()
    res["mem_bw_measured_gbps"] = bw
    print(f"HBM copy bandwidth: {bw:.0f} GB/s (spec {gpu.mem_bw_gbps:.0f})", flush=True)
    # 1. correctness: tiny dims (odd sizes, several blocks per expert) and real dims
    tiny = dataclasses.replace(m, hidden=256, moe_intermediate=128, n_routed_experts=8, top_k=4)
    for name, mm, bs in (("tiny", tiny, (1, 3, 40)), ("real", m, (1, 5))):
        w = L.make_moe_weights(mm, "fast", dev)
        for b in bs:
            bl = L.build_moe(mm, b, dev, backend="triton", weights=w)
            res["checks"][f"{name}/b{b}"] = bl.check()
        del w
    # real dims, large batch (shared expert spans many blocks; prefill-sized config)
    w = L.make_moe_weights(m, "fast", dev)
    for b in (128, 512):
        xc = common.randn((b, m.hidden), 1.0, common.gen(dev, 3), dev)
        ids, tw = L.moe_route(w, xc)
        ref = L.moe_experts_fast(w, xc, ids, tw).float()
        y = moe_experts(w, xc, ids, tw)
        res["checks"][f"real/b{b}_vs_fast"] = common.rel_err(y, ref)
    print("checks (relative error vs reference):", json.dumps(res["checks"]), flush=True)
    save()
    # 2. sweep
    best = {}
    if a.sweep_budget_s > 0:
        sb = [int(x) for x in a.sweep_batches.split(",")]
        sw = sweep(m, w, sb, a.sweep_budget_s)
        res["sweep"] = sw
        best = sw["best"]
        for b, d in best.items():
            print(f"sweep b={b}: " + ", ".join(f"{k} {v[0]:.1f} us {v[1]}" for k, v in d.items()),
                  flush=True)
        save()

    def cfg_of(b):
        if not (a.use_sweep and best):
            return None
        near = min(best, key=lambda s: abs(int(s) - b) + (0 if int(s) >= b else 0.5))
        d = best[near]
        base = config_for(b)
        return MoeConfig(16, KernelConfig(**d["gate_up"][1]) if "gate_up" in d else base.gate_up,
                         KernelConfig(**d["down"][1]) if "down" in d else base.down)
    # 3. table: triton vs plain vs fast, same weights for triton/fast
    wp = L.make_moe_weights(m, "plain", dev)
    for b in batches:
        row = {"batch": b}
        for be, var, ww in (("triton", "fast", w), ("torch", "plain", wp), ("torch", "fast", w)):
            bl = L.build_moe(m, b, dev, backend=be, variant=var, weights=ww,
                             triton_config=cfg_of(b) if be == "triton" else None)
            t = do_bench_graph(bl.fn)
            key = "triton" if be == "triton" else var
            row[f"{key}_us"] = t.median_us
            row[f"{key}_p20_us"], row[f"{key}_p80_us"] = t.p20_us, t.p80_us
            row["distinct_experts"] = bl.info["distinct_experts"]
        fl = sc.moe_floor_us(m, row["distinct_experts"], gpu, None)
        row["floor_us"], row["floor_measured_bw_us"] = fl, fl * gpu.mem_bw_gbps / bw
        res["rows"].append(row)
        save()
    hdr = ["b", "experts", "triton_us", "plain_us", "fast_us", "floor_us", "eff_spec",
           "eff_meas_bw", "triton/plain"]
    rows = [[r["batch"], r["distinct_experts"], f"{r['triton_us']:.1f}", f"{r['plain_us']:.1f}",
             f"{r['fast_us']:.1f}", f"{r['floor_us']:.1f}",
             f"{100 * r['floor_us'] / r['triton_us']:.0f}%",
             f"{100 * r['floor_measured_bw_us'] / r['triton_us']:.0f}%",
             f"{r['triton_us'] / r['plain_us']:.2f}"] for r in res["rows"]]
    print(tabulate(rows, headers=hdr))
    dest, note = writer.record(res)
    print(f"record: {dest}" + (f" ({note})" if note else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
