"""MLA decode attention with 64 heads per CTA (microbench/kernels/mla_attn_mma.py): its source,
shape rules and split rule on the CPU, the kernel against a float32 softmax on a GPU (`gpu`);
and which micro-batches of `mla_decode` run it or fold the norm launch away."""
import math

import pytest

torch = pytest.importorskip("torch")
from cuda_host import check_parses  # noqa: E402
from microbench.kernels import mla_attn_mma as A  # noqa: E402


@pytest.mark.parametrize("stages,heads", [(2, 64), (3, 64), (4, 64), (2, 32)])
def test_cuda_source_parses_as_cpp(stages, heads, tmp_path):
    check_parses(A._SRC, {"STAGES": stages, "HEADS": heads}, tmp_path)


def test_shared_memory_fits_an_sm80_block():
    # sm_80 / sm_90 allow 163 / 227 KiB per block; 3 stages must fit both
    assert A.smem_bytes(3) <= 163 * 1024
    assert A.smem_bytes(4) <= 227 * 1024
    # 32 heads per CTA: two CTAs per SM on an sm_90 (228 KiB, 1 KiB reserved per CTA)
    assert 2 * (A.smem_bytes(2, 32) + 1024) <= 228 * 1024
    # the padded rows: 16 bytes past the 576-element cache row, 8 floats / bf16 past a block
    assert A.smem_bytes(1) == 2 * 32 * 584 + 4 * 4 * 64 * 40 + 2 * 64 * 40 + 4 * 64
    with pytest.raises(ValueError):
        A._kernel(1, 64)
    with pytest.raises(ValueError):
        A._kernel(2, 16)


def test_unavailable_where_a_block_gets_too_little_shared_memory(monkeypatch):
    # e.g. an RTX PRO 6000 (sm_120) or an L40S (sm_89): 99 KiB per block
    monkeypatch.setattr(A.CL, "unavailable", lambda build: None)
    monkeypatch.setattr(A, "_smem_limit", lambda: 99 * 1024)
    A.available.cache_clear()
    try:
        assert A.available() == "needs 118 KiB of shared memory per block, this GPU allows 99 KiB"
        monkeypatch.setattr(A, "_smem_limit", lambda: 227 * 1024)
        A.available.cache_clear()
        assert A.available() is None
    finally:
        A.available.cache_clear()


def test_fits_names_the_shape():
    assert A.fits(64, 512, 64) is None and A.fits(128, 512, 64) is None
    assert "heads" in A.fits(16, 512, 64)
    assert "512 + 64" in A.fits(64, 256, 64) and "512 + 64" in A.fits(64, 512, 32)


@pytest.mark.parametrize("b,ctx,heads,sms,want", [
    (1, 2048, 64, 132, 64),      # capped at one 32-row block per split
    (8, 2048, 64, 132, 16), (64, 2048, 64, 132, 2), (128, 2048, 64, 132, 1),
    (200, 2048, 64, 132, 1), (4, 2048, 128, 132, 16), (1, 40, 64, 132, 2)])
def test_splits_fill_one_wave(b, ctx, heads, sms, want):
    s = A.splits_for(b, ctx, heads, sms)
    assert s == want
    assert b * s * (heads // 64) <= sms or s == 1
    assert s <= math.ceil(ctx / 32)
    # 32 heads per CTA: twice the CTAs per token, two per SM: the same splits
    assert A.splits_for(b, ctx, heads, sms, cta_heads=32) == s


def test_attention_rejects_shapes_it_was_not_built_for():
    q = torch.zeros(16, 1, 512, dtype=torch.bfloat16)
    q3 = torch.zeros(1, 16, 192, dtype=torch.bfloat16)
    c = torch.zeros(1, 64, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="heads"):
        A.attention(q, q3, 128, c, None, None, 64, 0.07, 32)
    q = torch.zeros(64, 1, 512, dtype=torch.bfloat16)
    q3 = torch.zeros(1, 64, 192, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 32"):
        A.attention(q, q3, 128, c, None, None, 64, 0.07, 48)
    with pytest.raises(ValueError, match="ctx"):                    # more rows than the cache
        A.attention(q, q3, 128, c, None, None, 65, 0.07, 32)
    o = torch.zeros(1, 2, 64, 512)
    with pytest.raises(ValueError, match="ml must be"):            # wrong split count in ml
        A.attention(q, q3, 128, c, o, torch.zeros(1, 3, 64, 2), 64, 0.07, 32)
    with pytest.raises(ValueError, match="o must be"):
        A.attention(q, q3, 128, c, o.bfloat16(), torch.zeros(1, 2, 64, 2), 64, 0.07, 32)


def _softmax_reference(q_lat, q3, nope, cache, ctx, sm_scale):
    # float32 attention over the latent: [h, b, 512] normalised latent outputs
    q = torch.cat([q_lat.float(), q3[:, :, nope:].float().transpose(0, 1)], -1)   # [h, b, 576]
    c = cache[:, :ctx].float()                                                     # [b, ctx, 576]
    s = torch.einsum("hbd,bcd->hbc", q, c) * sm_scale
    return torch.einsum("hbc,bcd->hbd", s.softmax(-1), c[..., :512])


def _merge(o, ml):
    m, l = ml[..., 0], ml[..., 1]                                                  # [b, S, h]
    w = torch.exp(m - m.max(1, keepdim=True).values)
    return ((o * w[..., None]).sum(1) / (w * l).sum(1)[..., None]).transpose(0, 1)  # [h, b, 512]


@pytest.mark.gpu
@pytest.mark.parametrize("b,ctx,split,heads,cta_heads", [
    (1, 2048, 32, 64, 64), (3, 1000, 96, 64, 64), (8, 77, 32, 128, 64), (64, 2048, 1024, 64, 64),
    (3, 1000, 96, 64, 32), (2, 77, 64, 128, 32)])
def test_kernel_matches_float32_softmax(b, ctx, split, heads, cta_heads):
    if not torch.cuda.is_available() or (why := A.available()):
        pytest.skip(why or "no CUDA GPU")
    g = torch.Generator(device="cuda").manual_seed(b + ctx)
    dev, nope = "cuda", 128
    q_lat = torch.randn(heads, b, 512, device=dev, generator=g).bfloat16()
    q3 = torch.randn(b, heads, nope + 64, device=dev, generator=g).bfloat16()
    cache = torch.randn(b, ctx + 5, 576, device=dev, generator=g).bfloat16()   # rows past ctx unread
    S = -(-ctx // split)
    o = torch.empty(b, S, heads, 512, device=dev)
    ml = torch.empty(b, S, heads, 2, device=dev)
    sm = 192 ** -0.5
    A.attention(q_lat, q3, nope, cache, o, ml, ctx, sm, split, cta_heads=cta_heads)
    ref = _softmax_reference(q_lat, q3, nope, cache, ctx, sm)
    err = ((_merge(o, ml) - ref).norm() / ref.norm()).item()
    assert err < 1e-2, err


def test_mla_decode_kernel_choice_per_batch():
    import dataclasses

    from microbench.kernels import mla_decode as MD

    cfg = MD.MlaConfig()
    assert [b for b in (1, 8, 15, 16, 64) if MD.mma_attention(b, cfg)] == [16, 64]
    assert not MD.mma_attention(64, dataclasses.replace(cfg, mma_attn_min_b=0))
    # the norm launch goes where W_qb runs gemv_mma (which then writes the cache row too)
    assert [b for b in (1, 4, 8, 9, 16) if MD.fused_norms(b, 1536, cfg)] == [1, 4, 8]
    assert not MD.fused_norms(1, 0, cfg)                     # no q latent (DeepSeek-V2 Lite)
    assert not MD.fused_norms(1, 1536, dataclasses.replace(cfg, fuse_norms=False))
    assert not MD.fused_norms(1, 1536, dataclasses.replace(cfg, gemv=False))
    assert MD.fused_norms(8, 1536, dataclasses.replace(cfg, mma_attn_min_b=4))


@pytest.mark.gpu
def test_gpu_fused_norms_match_the_norm_kernel():
    # output and this step's cache row, with and without the norm launch, every token to 8
    import dataclasses

    from microbench.kernels import layers as L
    from microbench.kernels import mla_decode as MD
    from reports.base.model_config import load_model

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    m = load_model("kimi-k2").all_formats("bf16")
    for b, ctx, mma_from in ((1, 300, 16), (5, 300, 16), (8, 2048, 16), (4, 2049, 2)):
        bt = L.build_attention(m, b, torch.device("cuda"), context_len=ctx, backend="triton")
        W, (x, cache) = bt.info["weights"], bt.info["inputs"]
        outs = []
        for on in (True, False):
            c = cache.clone()
            cfg = dataclasses.replace(MD.CONFIG, fuse_norms=on, mma_attn_min_b=mma_from)
            outs.append((MD.make_forward(W, m, cfg)(x, c), c[:, -1].float()))
        (y1, r1), (y0, r0) = outs
        assert float((y1.float() - y0.float()).norm() / y0.float().norm()) < 1e-2, b
        assert float((r1 - r0).norm() / r0.norm()) < 1e-2, b
        assert bt.check() < L.REL_TOL
