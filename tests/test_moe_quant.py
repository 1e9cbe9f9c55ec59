"""The fused router/plan, the INT4 and FP8 MoE kernels and the MLA decode, run through Triton's
CPU interpreter at tiny sizes (the kernel sources the GPU compiles; the GPU-only inline PTX
dequantisation is checked by the `gpu` tests), against float32 references."""
import dataclasses

import pytest

from triton_cpu import cpu_ok, torch  # first: chooses the interpreter
from microbench.kernels import layers as L  # noqa: E402
from microbench.kernels import moe_fp8 as F8  # noqa: E402
from microbench.kernels import moe_int4 as Q  # noqa: E402
from microbench.kernels import moe_int4_gemv as G  # noqa: E402
from microbench.kernels import moe_route as R  # noqa: E402
from microbench.kernels import moe_triton as MT  # noqa: E402
from reports.base.model_config import load_model  # noqa: E402
SMALL = MT.MoeConfig(16, MT.KernelConfig(32, 128, 4, 3), MT.KernelConfig(64, 128, 4, 3))


def tiny(name="kimi-k2", **kw):
    return dataclasses.replace(load_model(name), **{**dict(
        hidden=256, moe_intermediate=128, n_routed_experts=16, top_k=4), **kw})


@cpu_ok
@pytest.mark.parametrize("experts_sample", [None, 6])
def test_fused_route_and_plan_match_torch(experts_sample):
    w = L.make_moe_weights(tiny(hidden=64, moe_intermediate=32, n_routed_experts=40, top_k=6),
                           "fast", "cpu", experts_sample=experts_sample, zipf_s=0.5)
    G = w.gate_up.shape[0]
    for b in (1, 9):
        x = torch.randn(b, 64, generator=torch.Generator().manual_seed(b)).to(torch.bfloat16)
        ids0, tw0 = L.append_shared(w, *L.moe_route(w, x))
        ids, tw = R.route(w, x)
        # same selected (biased) scores as torch's top-k; bf16 logits can tie, then ids may swap
        sc = (x @ w.router.t()).float().sigmoid() + w.bias
        k = w.top_k
        if experts_sample is None:
            ref_ids, _ = L.moe_route(w, x)
            assert torch.allclose(sc.gather(1, ids[:, :k].long()).sort(1)[0],
                                  sc.gather(1, ref_ids).sort(1)[0])
        assert (ids[:, k:].long() == ids0[:, k:]).all() and (tw[:, k:] == 1).all()
        assert torch.allclose(tw[:, :k].sum(1), tw0[:, :k].sum(1).float())
        for bm in (2, 16):                                  # plan: exactly plan_blocks'
            p0 = MT.plan_blocks(ids.reshape(-1).long(), G, bm)
            p1 = R.plan(ids.reshape(-1), G, bm, b if experts_sample is None else None)
            used = p0.count > 0
            assert p1.order.long().tolist() == p0.order.tolist()
            assert p1.count.long().tolist() == p0.count.tolist()
            assert (p1.expert.long()[used] == p0.expert[used]).all()
            assert (p1.start.long()[used] == p0.start[used]).all()


@cpu_ok
def test_route_pair_order_copy():
    w = L.make_moe_weights(tiny(hidden=64, moe_intermediate=32), "fast", "cpu")
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    _, _, xp = R.route(w, x, pair_order=True)
    perm = [8 * (k // 8) + [0, 4, 1, 5, 2, 6, 3, 7][k % 8] for k in range(64)]
    assert torch.equal(xp, x.float()[:, perm])


@cpu_ok
@pytest.mark.parametrize("shared", ["bf16", "int4"])
@pytest.mark.parametrize("b", [1, 20])
def test_int4_layer_matches_dequantised_reference(shared, b):
    # b = 20: the shared expert spans two blocks of 16
    w = L.make_moe_weights(tiny(), "fast", "cpu")
    qw = Q.quantize_weights(w, shared)
    assert (qw.shared_gate_up is None) == (shared == "int4")
    x = torch.randn(b, 256, generator=torch.Generator().manual_seed(b)).to(torch.bfloat16)
    ids, tw = R.route(w, x)
    ref = Q.reference(qw, x, ids[:, :4], tw[:, :4])
    assert L.rel_err(Q.moe_forward(qw, x, SMALL), ref) < 1e-2
    # and the quantisation itself is a real change of weights (the check would see a bad one)
    assert L.rel_err(L.moe_reference(w, x, ids[:, :4], tw[:, :4]), ref) > 0.05


def test_gemv_nibble_as_subnormal_is_exact():
    # the GEMV kernel reads nibble j of a word, masked in place at bits 4(j%4).., as an fp32:
    # every pattern below 2^24 is p * 2^-149 exactly (subnormals and the smallest normals)
    nib = torch.arange(16, dtype=torch.int64)
    for e in (0, 4, 8, 12):
        bits = (nib << e).to(torch.int32)
        assert torch.equal(bits.view(torch.float32).double(), nib.double() * 2.0 ** (e - 149))
    # with activations scaled by 2^(149 - 64 - e) the product is nib * x * 2^-64, exactly
    x = torch.tensor([1.5, -3.25, 2.0 ** -20], dtype=torch.float32)
    w = (torch.tensor([13 << 8], dtype=torch.int32)).view(torch.float32)
    assert torch.equal(w * (x * 2.0 ** (149 - 64 - 8)), 13 * x * 2.0 ** -64)


@cpu_ok
def test_route_gemv_layout_copy():
    w = L.make_moe_weights(tiny(hidden=64, moe_intermediate=32), "fast", "cpu")
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    _, _, xg, c16 = R.route(w, x, gemv_layout=True)
    rg, rc = G.gemv_layout_reference(x)
    assert torch.equal(xg, rg)
    # input 32g + 8w + j sits at 32g + 4j + w: input 9 (g 0, w 1, j 1) at 5, scaled 2^(85 - 4)
    assert float(xg[0, 5]) == float(x[0, 9].float()) * 2.0 ** 81
    assert torch.allclose(c16, rc, rtol=1e-6, atol=0)
    assert torch.allclose(c16[:, 1], -8 * x.float()[:, 16:32].sum(1) * 2.0 ** -64, rtol=1e-6)


@cpu_ok
@pytest.mark.parametrize("shared,b,block_m", [("bf16", 7, 4), ("int4", 3, 2)])
def test_int4_gemv_layer_matches_dequantised_reference(shared, b, block_m):
    # 6 experts, top 4: blocks of 1..4 rows; hidden 512 in 4 K steps of 4 groups
    w = L.make_moe_weights(tiny(hidden=512, n_routed_experts=6), "fast", "cpu")
    qw = Q.quantize_weights(w, shared)
    x = torch.randn(b, 512, generator=torch.Generator().manual_seed(b)).to(torch.bfloat16)
    ids, tw = R.route(w, x)
    cfg = G.GemvMoeConfig(G.GemvConfig(16, 4, 4, 2), G.GemvConfig(16, 2, 4, 2), 16, 64, block_m)
    assert L.rel_err(Q.moe_forward(qw, x, cfg), Q.reference(qw, x, ids[:, :4], tw[:, :4])) < 1e-2


@cpu_ok
@pytest.mark.parametrize("shared", ["bf16", "fp8"])
def test_fp8_layer_matches_reference(shared):
    w = L.make_moe_weights(tiny("deepseek-v3"), "fast", "cpu")
    qw = F8.quantize_weights(w, shared)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    ids, tw = R.route(w, x)
    ref = F8.reference(qw, x, ids[:, :4], tw[:, :4])
    assert L.rel_err(F8.moe_forward(qw, x, SMALL), ref) < 1e-2


@cpu_ok
def test_quant_layer_builder_and_broken_scale_fails():
    m = tiny().with_formats(routed_experts="int4")
    bl = L.build_moe(m, 3, "cpu", backend="triton", fmt="int4", experts_sample=6)
    assert bl.backend == "triton/int4" and bl.info["shared_expert_format"] == "bf16"
    assert bl.check() < L.REL_TOL
    qw = bl.info["weights"]
    bad = dataclasses.replace(qw, gate_up_s=qw.gate_up_s * 1.5)   # scales off by 50%
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    ids, tw = R.route(qw.base, x)
    with pytest.raises(L.CheckFailed):
        L.assert_close("t", Q.moe_forward(bad, x, SMALL), Q.reference(qw, x, ids[:, :4],
                                                                       tw[:, :4]))
    with pytest.raises(ValueError):
        L.build_moe(m, 3, "cpu", backend="torch", fmt="int4")


@cpu_ok
@pytest.mark.parametrize("b,ctx", [(1, 100), (3, 7)])
def test_mla_decode_matches_unabsorbed_reference(b, ctx):
    m = dataclasses.replace(load_model("kimi-k2"), hidden=256, q_lora_rank=64, kv_lora_rank=512,
                            qk_nope_head_dim=32, qk_rope_head_dim=64, v_head_dim=32)
    bl = L.build_attention(m, b, "cpu", context_len=ctx, backend="triton")
    assert bl.backend == "triton"
    assert bl.check() < L.REL_TOL


# ---- GPU: the compiled kernels (inline PTX dequantisation, fp8 tensor cores) at real dims

@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["int4", "fp8"])
def test_gpu_quant_layer_real_dims(fmt):
    m = load_model("kimi-k2").all_formats("bf16").with_formats(routed_experts=fmt)
    for b in (1, 8):
        bl = L.build_moe(m, b, torch.device("cuda"), backend="triton", fmt=fmt,
                         experts_sample=16)
        assert bl.check() < L.REL_TOL


@pytest.mark.gpu
def test_gpu_int4_gemv_real_dims():
    m = load_model("kimi-k2").all_formats("bf16").with_formats(routed_experts="int4")
    for b in (1, 5, 40):
        bl = L.build_moe(m, b, torch.device("cuda"), backend="triton", fmt="int4",
                         experts_sample=16, triton_config=G.config_for(b))
        assert bl.check() < L.REL_TOL


@pytest.mark.gpu
def test_gpu_int4_shared_in_format_and_large_batch():
    dev = torch.device("cuda")
    m = tiny(hidden=1024, moe_intermediate=512).all_formats("int4")
    bl = L.build_moe(m, 40, dev, backend="triton", fmt="int4")
    assert bl.info["shared_expert_format"] == "int4"
    assert bl.check() < L.REL_TOL


@pytest.mark.gpu
def test_gpu_mla_decode_real_dims():
    m = load_model("kimi-k2").all_formats("bf16")
    for b in (1, 4):
        assert L.build_attention(m, b, torch.device("cuda"), context_len=1000,
                                 backend="triton").check() < L.REL_TOL
