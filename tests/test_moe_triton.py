"""The fused MoE Triton kernel, run through Triton's CPU interpreter at tiny sizes (the same
kernel source the GPU compiles), against the float32 reference; the block plan exactly."""
import dataclasses

import pytest

from triton_cpu import cpu_ok, torch  # first: chooses the interpreter
from microbench.kernels import layers as L  # noqa: E402
from microbench.kernels import moe_triton as MT  # noqa: E402
from reports.base.model_config import load_model  # noqa: E402


def test_plan_blocks_exact():
    # 10 pairs over G=4 experts, BLOCK_M=2: expert 0 x3 -> 2 blocks, 1 x0, 2 x1, 3 x6 -> 3
    flat = torch.tensor([3, 0, 3, 2, 3, 0, 3, 3, 0, 3])
    p = MT.plan_blocks(flat, 4, 2)
    assert MT.max_blocks(10, 4, 2) == 5 + 4 == p.count.numel()
    assert p.count.tolist() == [2, 1, 1, 2, 2, 2, 0, 0, 0]
    assert p.expert.tolist()[:6] == [0, 0, 2, 3, 3, 3]
    assert p.start.tolist()[:6] == [0, 2, 3, 4, 6, 8]
    assert flat[p.order.long()].tolist() == [0, 0, 0, 2, 3, 3, 3, 3, 3, 3]
    assert sorted(p.order.tolist()) == list(range(10))


def test_plan_blocks_cover_every_pair_once():
    g = torch.Generator().manual_seed(1)
    for T, G, bm in ((1, 3, 16), (37, 5, 16), (200, 385, 16), (64, 2, 4)):
        flat = torch.randint(0, G, (T,), generator=g)
        p = MT.plan_blocks(flat, G, bm)
        seen = []
        for e, s, c in zip(p.expert.tolist(), p.start.tolist(), p.count.tolist()):
            rows = p.order[s:s + c].long()
            assert (flat[rows] == e).all()
            seen += rows.tolist()
        assert sorted(seen) == list(range(T))


def tiny(**kw):
    m = load_model("kimi-k2")
    return dataclasses.replace(m, **{**dict(hidden=64, moe_intermediate=32, n_routed_experts=16,
                                            top_k=4), **kw})


@cpu_ok
@pytest.mark.parametrize("b", [1, 5])
def test_triton_layer_matches_reference(b):
    bl = L.build_moe(tiny(), b, "cpu", backend="triton")
    assert bl.backend == "triton/fast"
    assert bl.check() < L.REL_TOL
    assert bl.fn().shape == (b, 64)


@cpu_ok
def test_many_blocks_per_expert_and_ragged_dims():
    # 40 tokens: the shared expert spans 3 blocks of 16; hidden 80 / inter 48 exercise the
    # masked-K path and the N-tile fitting (48 -> 16)
    m = tiny(hidden=80, moe_intermediate=48, n_routed_experts=5, top_k=3)
    w = L.make_moe_weights(m, "fast", "cpu")
    x = torch.randn(40, 80, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    ids, tw = L.moe_route(w, x)
    y = MT.moe_experts(w, x, ids, tw)
    ref = L.moe_reference(w, x, ids, tw)
    assert L.rel_err(y, ref) < L.REL_TOL


@cpu_ok
def test_broken_routing_weight_fails_check():
    m = tiny()
    w = L.make_moe_weights(m, "fast", "cpu")
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    ids, tw = L.moe_route(w, x)
    tw_bad = tw.clone()
    tw_bad[:, 0] = 0                     # drops one routed expert's contribution
    with pytest.raises(L.CheckFailed):
        L.assert_close("t", MT.moe_experts(w, x, ids, tw_bad), L.moe_reference(w, x, ids, tw))


def test_config_table_and_fit():
    assert MT.config_for(1) is MT.CONFIGS[0][1]
    assert MT.config_for(10 ** 9) is MT.CONFIGS[-1][1]
    assert MT.fit_block(64, 2048) == 64 and MT.fit_block(64, 48) == 16 and MT.fit_block(128, 7168) == 128
    with pytest.raises(ValueError):
        MT.fit_block(64, 40)


@pytest.mark.gpu
def test_gpu_kernel_matches_reference_real_dims():
    m = load_model("kimi-k2").all_formats("bf16")
    bl = L.build_moe(m, 8, torch.device("cuda"), backend="triton", experts_sample=16)
    assert bl.check() < L.REL_TOL
