"""The decode-size bf16 projection kernel (microbench/kernels/gemv_mma.py): its source, launch
shapes and input rules on the CPU; the kernel against a float32 matmul on a GPU (`gpu`)."""
import pytest

torch = pytest.importorskip("torch")
from cuda_host import check_parses  # noqa: E402
from microbench.kernels import gemv_mma as G  # noqa: E402


def _cuda_generator(seed: int):
    """A seeded CUDA generator; the test is skipped where the kernel cannot run."""
    if why := G.available():
        pytest.skip(why)
    return torch.Generator(device="cuda").manual_seed(seed)


def _bf16(g, *shape: int, scale: float = 1.0):
    """Normal bf16 values times `scale` on the GPU, from generator `g`."""
    return (torch.randn(*shape, device="cuda", generator=g) * scale).to(torch.bfloat16)


def _rel_err(y, ref) -> float:
    return float((y.float() - ref).norm() / ref.norm())


@pytest.mark.parametrize("ksplit,unroll,nt,rms", [(1, 1, 1, 0), (4, 2, 1, 0), (16, 2, 2, 0),
                                                  (8, 4, 2, 0), (32, 4, 1, 0), (1, 1, 1, 1),
                                                  (4, 1, 2, 1)])
def test_cuda_source_parses_as_cpp(ksplit, unroll, nt, rms, tmp_path):
    check_parses(G._SRC, {"KSPLIT": ksplit, "UNROLL": unroll, "NT": nt, "RMS": rms}, tmp_path)


def test_side_job_inputs_are_checked_before_any_launch():
    # CPU tensors: every rule below fails before the kernel would be built or launched
    bf = torch.bfloat16
    x, w = torch.zeros(2, 1536, dtype=bf), torch.zeros(64, 1536, dtype=bf)
    src, dst = torch.zeros(2, 576, dtype=bf), torch.zeros(2, 576, dtype=bf)
    nw = torch.zeros(512, dtype=bf)
    with pytest.raises(ValueError, match="needs rms_eps"):
        G.gemv(x, w, side=(src, nw, dst, 512))
    with pytest.raises(ValueError, match="src / dst"):
        G.gemv(x, w, rms_eps=1e-6, side=(src, nw, dst[:1], 512))
    with pytest.raises(ValueError, match="norm weight"):
        G.gemv(x, w, rms_eps=1e-6, side=(src, nw[:256], dst, 512))
    with pytest.raises(ValueError, match="bf16"):
        G.gemv(x, w, rms_eps=1e-6, side=(src, nw.float(), dst, 512))


def test_rms_only_on_16_row_tiles():
    G._kernel.cache_clear()
    with pytest.raises(ValueError, match="RMS"):
        G._kernel(G.GemvConfig(4, 1, 1, 8), True)


@pytest.mark.parametrize("n,k,z,b", [(2112, 7168, 1, 1), (12288, 1536, 1, 8), (7168, 8192, 1, 16),
                                     (512, 128, 64, 1), (128, 512, 64, 4), (16, 64, 1, 1),
                                     (2112, 7168, 1, 16)])
def test_config_for_shapes(n, k, z, b):
    cfg = G.config_for(n, k, z, b)
    assert cfg.rows == (8 if n // 16 * z < G.SMALL_TILES else 16)
    tiles, nch = n // cfg.rows * z, k // G.CHUNK
    assert cfg.ksplit in (1, 2, 4, 8, 16)
    assert cfg.nt == (1 if b <= 8 or cfg.rows == 8 else 2)
    # the split stops at the target, at 16 warps or where a warp would get < 2 chunks
    assert (tiles * cfg.ksplit >= G.TARGET_WARPS or cfg.ksplit == 16
            or nch // (2 * cfg.ksplit) < 2)
    assert cfg.ksplit == 1 or nch // cfg.ksplit >= 2
    assert cfg.unroll == (2 if cfg.rows == 16 and b == 1 and nch // cfg.ksplit >= 7 else 1)
    G._kernel.cache_clear()
    with pytest.raises(ValueError):
        G._kernel(G.GemvConfig(3))
    with pytest.raises(ValueError):
        G._kernel(G.GemvConfig(4, 1, 1, 12))


def test_config_for_picks_the_sweep_winners():
    # the best measured launch shapes on an H200 (docs/BENCHMARKS.md section 8)
    assert G.config_for(2112, 7168, 1, 1) == G.GemvConfig(16, 1, 1, 8)   # x @ [W_qa; W_kva]
    assert G.config_for(2112, 7168, 1, 16) == G.GemvConfig(16, 1, 1, 8)
    assert G.config_for(12288, 1536, 1, 1) == G.GemvConfig(4, 1, 1)     # q_a @ W_qb
    assert G.config_for(7168, 8192, 1, 1) == G.GemvConfig(8, 2, 1)      # o @ W_o
    assert G.config_for(7168, 8192, 1, 4) == G.GemvConfig(8, 1, 1)
    assert G.config_for(512, 128, 64, 1) == G.GemvConfig(1, 1, 1)       # W_uk per head


def test_fits_says_why_not():
    w = torch.zeros(2112, 7168, dtype=torch.bfloat16)
    assert G.fits(w, 1) is None and G.fits(w, 16) is None
    assert "tokens" in G.fits(w, 17) and "tokens" in G.fits(w, 0)
    assert "tile" in G.fits(torch.zeros(24, 64, dtype=torch.bfloat16), 1)
    assert "tile" in G.fits(torch.zeros(16, 96, dtype=torch.bfloat16), 1)
    assert "contiguous" in G.fits(torch.zeros(64, 32, dtype=torch.bfloat16).t(), 1)
    with pytest.raises(ValueError, match="tokens"):
        G.gemv(torch.zeros(17, 64, dtype=torch.bfloat16), torch.zeros(16, 64, dtype=torch.bfloat16))


# ---- GPU

@pytest.mark.gpu
def test_gpu_gemv_against_float32():
    g = _cuda_generator(3)
    for n, k, b in [(2112, 7168, 1), (12288, 1536, 5), (7168, 8192, 16), (48, 192, 9)]:
        w = _bf16(g, n, k)
        x = _bf16(g, b, k)
        ref = G.reference(x, w)
        for cfg in (None, G.GemvConfig(1, 1, 2), G.GemvConfig(16, 4, 2),
                    G.GemvConfig(4, 2, 1, 8), G.GemvConfig(32, 1, 1, 8)):
            y = G.gemv(x, w, cfg=cfg)
            err = _rel_err(y, ref)
            assert err < 1e-2, (n, k, b, cfg, err)


@pytest.mark.gpu
def test_gpu_gemv_with_rmsnorm_folded_in():
    # gemv(x, w * nw, rms_eps) == RMSNorm(x, nw) @ w^T, x a strided view (MLA's q latent)
    g = _cuda_generator(5)        # skipped first where the kernel cannot run
    from microbench.kernels.common import rmsnorm
    for n, k, b in [(12288, 1536, 1), (12288, 1536, 8), (4096, 1536, 13), (64, 512, 3)]:
        w = _bf16(g, n, k)
        nw = torch.rand(k, device="cuda", generator=g).add_(0.5).to(torch.bfloat16)
        a = _bf16(g, b, k + 576, scale=3)
        ref = G.reference(rmsnorm(a[:, :k].float(), nw.float()), w)
        wn = (w.float() * nw.float()).to(torch.bfloat16)
        for cfg in (None, G.GemvConfig(1, 1, 2), G.GemvConfig(16, 2, 2), G.GemvConfig(4, 1, 1, 8)):
            y = G.gemv(a[:, :k], wn, cfg=cfg, rms_eps=1e-6)
            err = _rel_err(y, ref)
            assert err < 1e-2, (n, k, b, cfg, err)


@pytest.mark.gpu
def test_gpu_gemv_side_job_writes_the_normed_row():
    # gemv(.., side=) also writes RMSNorm(src[:, :k]) * w and src's tail into a strided dst
    g = _cuda_generator(6)        # skipped first where the kernel cannot run
    from microbench.kernels.common import rmsnorm
    for b in (1, 3, 8):
        a = _bf16(g, b, 1536 + 576, scale=2)
        w = _bf16(g, 12288, 1536)
        nw = torch.rand(512, device="cuda", generator=g).add_(0.5).to(torch.bfloat16)
        cache = torch.zeros(b, 7, 576, device="cuda", dtype=torch.bfloat16)
        G.gemv(a[:, :1536], w, rms_eps=1e-6, side=(a[:, 1536:], nw, cache[:, -1], 512))
        ref = rmsnorm(a[:, 1536:2048].float(), nw.float())
        assert float((cache[:, -1, :512].float() - ref).norm() / ref.norm()) < 1e-2
        assert torch.equal(cache[:, -1, 512:], a[:, 2048:])
        assert not cache[:, :-1].any()
    with pytest.raises(ValueError, match="side"):
        G.gemv(a[:, :1536], w, side=(a[:, 1536:], nw, cache[:, -1], 512))   # no rms_eps


@pytest.mark.gpu
def test_gpu_gemv_batched_strided_in_place():
    # MLA's absorbed W_uv: per head, x [h, b, kl] in, each head's columns of [b, h * vd] out
    g = _cuda_generator(4)
    h, b, kl, vd, nope = 8, 3, 512, 128, 128
    wkvb = _bf16(g, h, nope + vd, kl)
    lat = _bf16(g, h, b, kl)
    out = torch.full((b, h * vd), float("nan"), device="cuda", dtype=torch.bfloat16)
    G.gemv(lat, wkvb[:, nope:], out=out.view(b, h, vd).transpose(0, 1))
    ref = G.reference(lat, wkvb[:, nope:]).transpose(0, 1).reshape(b, h * vd)
    assert float((out.float() - ref).norm() / ref.norm()) < 1e-2


@pytest.mark.gpu
def test_gpu_mla_projections_on_gemv_match_cublas_for_every_token():
    # the layer's float32 check uses 3 tokens; here every token of up to 16 (both MMA halves)
    import dataclasses

    from microbench.kernels import layers as L
    from microbench.kernels import mla_decode as MD
    from reports.base.model_config import load_model

    if why := G.available():
        pytest.skip(why)
    m = load_model("kimi-k2").all_formats("bf16")
    for b in (1, 5, 12, 16):
        bt = L.build_attention(m, b, torch.device("cuda"), context_len=256, backend="triton")
        assert bt.check() < L.REL_TOL
        W, (x, cache) = bt.info["weights"], bt.info["inputs"]
        ys = [MD.make_forward(W, m, dataclasses.replace(MD.CONFIG, gemv=on))(x, cache.clone())
              for on in (True, False)]
        err = float((ys[0].float() - ys[1].float()).norm() / ys[1].float().norm())
        assert err < 1e-2, (b, err)
        assert ("gemv_mma" in bt.info["kernel"]) == bool(MD.gemv_projections(b))
