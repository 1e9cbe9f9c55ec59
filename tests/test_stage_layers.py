"""The layer forwards are device-agnostic: their reference checks run on CPU at tiny dims.
The GPU test times a small real measurement."""
import dataclasses

import pytest

from reports.base.model_config import load_model

torch = pytest.importorskip("torch")
from microbench.kernels import layers as L  # noqa: E402


def tiny(name="kimi-k2"):
    m = load_model(name)
    if m.attention == "mla":
        return dataclasses.replace(m, hidden=64, moe_intermediate=32, n_routed_experts=16,
                                   top_k=4, dense_intermediate=96, vocab=300, num_heads=4,
                                   q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
                                   qk_rope_head_dim=8, v_head_dim=16)
    return dataclasses.replace(m, hidden=64, num_heads=8, num_kv_heads=2, head_dim=16,
                               moe_intermediate=32, n_routed_experts=16, top_k=4,
                               dense_intermediate=96, vocab=300)


@pytest.mark.parametrize("variant", ["fast", "plain", "loop"])
@pytest.mark.parametrize("b", [1, 6])
def test_moe_variants_match_reference(variant, b):
    bl = L.build_moe(tiny(), b, "cpu", variant=variant)
    assert bl.check() < L.REL_TOL
    assert bl.fn().shape == (b, 64)
    assert 4 <= bl.info["distinct_experts"] <= min(16, 4 * b)


def test_fast_equals_plain_on_same_routing():
    m = tiny()
    fast = L.make_moe_weights(m, "fast", "cpu")
    plain = dataclasses.replace(
        L.make_moe_weights(m, "plain", "cpu"), router=fast.router,
        gate=fast.gate_up[:16, :32].contiguous(), up=fast.gate_up[:16, 32:].contiguous(),
        down=fast.down[:16].contiguous(),
        s_gate_up=torch.cat([fast.gate_up[16, :32], fast.gate_up[16, 32:]]),
        s_down=fast.down[16])
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    ids, tw = L.moe_route(fast, x)
    a = L.moe_experts_fast(fast, x, ids, tw).float()
    b = L.moe_experts_plain(plain, x, ids, tw).float()
    assert float((a - b).norm() / b.norm()) < 2e-2


def test_experts_sample_folds_ids():
    bl = L.build_moe(tiny(), 8, "cpu", experts_sample=5)
    assert bl.info["experts_allocated"] == 5 and bl.info["distinct_experts"] <= 5
    assert bl.check() < L.REL_TOL


def test_qwen_moe_without_shared_expert():
    bl = L.build_moe(tiny("qwen3-moe"), 3, "cpu")
    assert bl.check() < L.REL_TOL


@pytest.mark.parametrize("name", ["kimi-k2", "llama-3-70b"])
def test_attention_matches_reference(name):
    assert L.build_attention(tiny(name), 3, "cpu", context_len=40).check() < L.REL_TOL


def test_mlp_and_lm_head():
    assert L.build_dense_mlp(tiny(), 3, "cpu").check() < L.REL_TOL
    bl = L.build_lm_head(tiny(), 3, "cpu")
    assert bl.check() < L.REL_TOL
    assert bl.fn().shape == (3,)


def test_broken_layer_fails_its_check(monkeypatch):
    real = L.moe_experts_fast
    # drops the last routed slot of every token: a plausible indexing bug
    monkeypatch.setattr(L, "moe_experts_fast",
                        lambda w, x, ids, tw: real(w, x, ids[:, :-1], tw[:, :-1]))
    with pytest.raises(L.CheckFailed, match="relative error"):
        L.build_moe(tiny(), 3, "cpu", variant="fast").check()


@pytest.mark.gpu
def test_gpu_stage_cost_small(tmp_path):
    from microbench.stage_cost import probe as sc
    rec, _ = sc.run(sc.StageCostConfig(model="kimi-k2", pp=8, dtype="bf16", batches=(1, 4),
                                       prefill_chunk=256, experts_sample=16, context_len=256,
                                       out=tmp_path / "sc.json"))
    assert rec.status == "ok", rec.reason
    d = rec.payload
    moe = d.layers["moe"]["4"]
    assert moe.measured_us > 0 and 0 < moe.efficiency < 1.5
    assert d.layers["moe_plain"]["4"].measured_us > 0
    assert d.layers["moe_triton"]["4"].measured_us > 0
    assert d.moe_backend_by_batch["4"] in ("triton", "plain")
    assert d.mem_bw_measured_gbps > 100
    assert moe.efficiency_measured_bw > moe.efficiency  # copy bw < spec sheet
    assert d.stages[7].by_batch["4"].measured_us > 0


def test_pick_fastest_verified_backend():
    from microbench.stage_cost import probe as sc
    from reports.base.payloads.stage_cost import LayerPoint as P
    layers = {"moe_triton": {"1": P(measured_us=300.0), "8": P(error="check failed")},
              "moe_plain": {"1": P(measured_us=400.0), "8": P(measured_us=1900.0)}}
    chosen = sc.pick_fastest(layers, ("triton", "plain"))
    assert chosen == {"1": "triton", "8": "plain"}
    assert layers["moe"]["1"] == P(measured_us=300.0, backend_name="triton")
    assert layers["moe"]["8"].measured_us == 1900.0
    layers = {"moe_triton": {"2": P(error="x")}}
    assert sc.pick_fastest(layers, ("triton",)) == {}
    assert layers["moe"]["2"].error == "x"
