"""Dispatch probe on real GPUs (skipped without them)."""
from __future__ import annotations

import pytest

from microbench import dispatch as D


@pytest.mark.gpu
def test_moe_stage_matches_reference_small_dims_and_replays_in_a_graph():
    import dataclasses

    import torch

    from microbench import layers as L
    from microbench.pp_loop import build_moe_stage, capture_graphs
    from reports.model_config import load_model
    dev = torch.device("cuda")
    m = dataclasses.replace(load_model("kimi-k2"), hidden=256, moe_intermediate=128,
                            n_routed_experts=16, top_k=4).all_formats("bf16")
    cfg = {"model": "kimi-k2", "layers_per_stage": 2, "graphs": True, "moe_variant": "fast"}
    fwd, info = build_moe_stage(torch, cfg, 0, dev, model=m)
    assert info["moe_backend"] == "torch/fast" and info["moe_check_rel_err"] <= L.REL_TOL
    ws = [L.make_moe_weights(m, "fast", dev, seed=i) for i in range(2)]
    x = torch.randn(5, 256, device=dev, dtype=torch.bfloat16)
    want = x.float()
    for w in ws:
        xb = want.to(torch.bfloat16)
        ids, tw = L.moe_route(w, xb)
        want = want + L.moe_reference(w, xb, ids, tw)
    got = fwd(x).float()
    assert float((got - want).norm() / (want - x.float()).norm()) < 3e-2
    g, gx, gy = capture_graphs(torch, fwd, [8], 256, dev)[8]
    gx[:5].copy_(x)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(gy[:5], fwd(gx)[:5])


@pytest.mark.multigpu
def test_pp2_busy_loop_end_to_end(tmp_path):
    cfg = D.DispatchConfig(pp=2, work="busy", cost_us="1:300,4:400", concurrency=(1, 4),
                           seconds_per_point=0.5, json_path=str(tmp_path / "d.json"),
                           timeout_s=300)
    rec = D.run(cfg)
    assert rec.status == "ok", rec.reason
    runs = {(r["policy"], r["concurrency"]): r for r in rec.data["runs"]}
    assert runs[("sglang", 4)]["slot_sizes"] == [4, 0, 0, 0]
    assert runs[("even", 4)]["slot_sizes"] == [2, 0, 2, 0]
    assert all(r["tok_per_s"] > 0 for r in runs.values())
    assert (tmp_path / "d.trace.json").exists()
