"""Dispatch probe on real GPUs (skipped without them)."""
from __future__ import annotations

import pytest

from microbench import dispatch as D


@pytest.mark.gpu
def test_moe_layer_matches_reference_small_dims():
    import torch
    from microbench.pp_loop import _moe_forward, _moe_layer, _moe_reference
    F, dev = torch.nn.functional, torch.device("cuda")
    torch.manual_seed(0)
    L = _moe_layer(torch, 256, 128, 16, 128, dev)
    x = torch.randn(5, 256, device=dev, dtype=torch.bfloat16)
    got = _moe_forward(torch, F, x, L, 4).float() - x.float()
    want = _moe_reference(torch, F, x, L, 4) - x.float()
    assert float((got - want).norm() / want.norm()) < 3e-2


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
