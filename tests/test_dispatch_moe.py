"""The dispatch probe's MoE stage is microbench.layers' MoE (the layer stage-cost times), on CPU."""
from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from microbench import layers as L  # noqa: E402
from microbench.pp_loop import build_moe_stage  # noqa: E402
from reports.model_config import load_model  # noqa: E402

CFG = {"model": "kimi-k2", "layers_per_stage": 2, "graphs": True, "moe_variant": "fast"}


def small():
    # K2's structure (sigmoid router, top-k, one shared expert) at toy dimensions
    return dataclasses.replace(load_model("kimi-k2"), hidden=256, moe_intermediate=128,
                               n_routed_experts=16, top_k=4).all_formats("bf16")


def test_stage_is_layers_moe_and_matches_float32_reference():
    if L.grouped_mm_available(torch.device("cpu")):
        pytest.skip("torch._grouped_mm does not run on this CPU build")
    m, dev = small(), torch.device("cpu")
    fwd, info = build_moe_stage(torch, CFG, 1, dev, model=m, free_bytes=10**12)
    assert info["moe_backend"] == "torch/fast"
    assert info["layers_used"] == 2 and info["note"] is None
    assert info["layer_bytes"] == L.moe_weight_bytes(m) == 2 * (16 * 256 + 17 * 3 * 256 * 128)
    assert info["moe_check_rel_err"] <= L.REL_TOL
    # same seeds -> the same weights: rebuild them and run the float32 per-expert reference
    ws = [L.make_moe_weights(m, "fast", dev, seed=1000 * 1 + i) for i in range(2)]
    g = torch.Generator().manual_seed(7)
    x = torch.randn(6, 256, generator=g).to(torch.bfloat16)
    got = fwd(x).float()
    want = x.float()
    for w in ws:
        ids, tw = L.moe_route(w, want.to(torch.bfloat16))
        want = want + L.moe_reference(w, want.to(torch.bfloat16), ids, tw)
    err = float((got - want).norm() / (want - x.float()).norm())
    assert err < 3e-2


def test_stage_keeps_what_fits_and_says_so():
    m = small()
    per = L.moe_weight_bytes(m)
    if L.grouped_mm_available(torch.device("cpu")):
        pytest.skip("torch._grouped_mm does not run on this CPU build")
    _, info = build_moe_stage(torch, CFG, 0, torch.device("cpu"), model=m,
                              free_bytes=int(1.5 * per / 0.85))
    assert info["layers_used"] == 1
    assert info["note"] == "only 1 of 2 layers fit in GPU memory"
    with pytest.raises(RuntimeError, match="one MoE layer needs .* GB free; use --work busy"):
        build_moe_stage(torch, CFG, 0, torch.device("cpu"), model=m, free_bytes=per // 2)
