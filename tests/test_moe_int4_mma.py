"""The CUDA INT4 MoE kernel (microbench/kernels/moe_int4_mma.py): its weight layout on the CPU
(every nibble and scale where the fragment contract of the module docstring puts it), the
kernel itself against the float32 reference on a GPU (`gpu`)."""
import dataclasses

import pytest

torch = pytest.importorskip("torch")
from microbench.kernels import int4_pack as P  # noqa: E402
from microbench.kernels import moe_int4_mma as MM  # noqa: E402
from cuda_host import check_parses  # noqa: E402


def _weights(E, N, K, seed):
    g = torch.Generator().manual_seed(seed)
    q, s = P.quantize(torch.randn(E, N, K, generator=g))
    return q, P.pack(q), s


def test_tile_rows_pair_gate_with_up():
    r = MM.tile_rows(64, 2)                  # gate_up of I = 32: gate rows 0..31, up 32..63
    assert r.shape == (4, 16)
    assert r[1].tolist() == [8, 9, 10, 11, 12, 13, 14, 15, 40, 41, 42, 43, 44, 45, 46, 47]
    assert MM.tile_rows(48, 1)[2].tolist() == list(range(32, 48))
    assert sorted(MM.tile_rows(64, 2).reshape(-1).tolist()) == list(range(64))


@pytest.mark.parametrize("nh,E,N,K", [(2, 3, 64, 128), (1, 2, 32, 192), (2, 1, 32, 64)])
def test_repack_round_trip(nh, E, N, K):
    q, wq, s = _weights(E, N, K, N + K)
    wr, sr = MM.repack(wq, s, nh)
    assert wr.shape == (E, N // 16, K // 64, 32, 4) and wr.dtype == torch.int32
    assert sr.shape == (E, N // 16, K // 64, 8, 2, 2) and sr.dtype == torch.bfloat16
    ref = P.dequantize(wq, s).float()[:, MM.tile_rows(N, nh).reshape(-1)]
    got = MM.fragment_weights(wr, sr, K).to(torch.bfloat16).float()
    assert torch.equal(got, ref.reshape(E, N // 16, 16, K))


def test_repack_word_and_scale_by_formula():
    # nibble j = kl*4 + kh*2 + rh of word [tile, chunk, lane, f] is row rh*8 + g, input
    # 16c + 4f + 2kh + kl (lane = 4g + c); the lane's scale pair is group c // 2
    N, K = 64, 128
    q, wq, s = _weights(1, N, K, 3)
    wr, sr = MM.repack(wq, s, 2)
    rows = MM.tile_rows(N, 2)
    for t, ch, lane, f in ((0, 0, 0, 0), (1, 1, 13, 2), (3, 1, 31, 3), (2, 0, 22, 1)):
        g, c = divmod(lane, 4)
        word = int(wr[0, t, ch, lane, f]) & 0xFFFFFFFF
        for j in range(8):
            kl, kh, rh = j // 4, (j // 2) % 2, j % 2
            k = ch * 64 + 16 * c + 4 * f + 2 * kh + kl
            assert (word >> 4 * j) & 0xF == int(q[0, rows[t, rh * 8 + g], k]) + 8
        for rh in (0, 1):
            grp = c // 2
            assert float(sr[0, t, ch, g, grp, rh]) == float(s[0, rows[t, rh * 8 + g],
                                                              2 * ch + grp])


def test_repacked_weights_live_and_die_with_their_source():
    import gc
    from types import SimpleNamespace

    _, wq, s = _weights(2, 128, 64, 5)                 # I = 64, H = 64
    _, dq, ds = _weights(2, 64, 64, 6)
    qw = SimpleNamespace(gate_up_q=wq, gate_up_s=s, down_q=dq, down_s=ds)
    first = MM.repacked(qw)
    assert MM.repacked(qw) is first                     # made once per weight set
    assert torch.equal(first.gate_up_r, MM.repack(wq, s, 2)[0])
    del qw, wq, s, dq, ds, first
    gc.collect()
    _, wq, s = _weights(2, 128, 128, 7)                # a new set (H = 128): never the old entry
    _, dq, ds = _weights(2, 128, 64, 8)
    qw = SimpleNamespace(gate_up_q=wq, gate_up_s=s, down_q=dq, down_s=ds)
    assert MM.repacked(qw).gate_up_r.shape == (2, 8, 2, 32, 4)
    assert len(MM._PACKED) == 1                         # the dead entry was dropped


def test_repack_rejects_untileable():
    _, wq, s = _weights(1, 24, 64, 1)
    with pytest.raises(ValueError, match="tile"):
        MM.repack(wq, s, 1)
    _, wq, s = _weights(1, 32, 96, 1)
    with pytest.raises(ValueError, match="tile"):
        MM.repack(wq, s, 1)


@pytest.mark.parametrize("ksplit", [1, 2, 4])
def test_cuda_source_parses_as_cpp(ksplit, tmp_path):
    check_parses(MM._SRC, {"KSPLIT": ksplit, "MINB": 12}, tmp_path)


def test_configs_cover_every_batch():
    assert MM.config_for(1).gate_up.ksplit == 4 and MM.config_for(8) == MM.config_for(1)
    assert MM.config_for(9) == MM.config_for(10 ** 6)
    with pytest.raises(ValueError):
        MM._kernel.__wrapped__(MM.MmaConfig(ksplit=3))


def test_unavailable_here_says_why():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    why = MM.available()
    assert why and "\n" not in why
    from microbench.kernels import moe_int4 as Q
    assert Q.kernel_name().startswith("moe_int4 (Triton")


def test_the_cuda_kernel_is_picked_at_decode_sizes_only(monkeypatch):
    from microbench.kernels import moe_int4 as Q
    monkeypatch.setattr(MM, "available", lambda: None)         # as where it builds
    assert Q.kernel_name(None, 1) == Q.kernel_name(None, MM.MAX_BATCH) == MM.KERNEL
    assert Q.kernel_name(None, MM.MAX_BATCH + 1).startswith("moe_int4 (Triton")
    assert Q.kernel_name(MM.MmaLayerConfig(), 4096) == MM.KERNEL   # asked for explicitly


# ---- GPU: the compiled kernel at real dims and both block sizes

@pytest.mark.gpu
def test_gpu_mma_layer_real_dims():
    from microbench.kernels import layers as L
    from microbench.kernels import moe_int4 as Q
    from reports.base.model_config import load_model

    if why := MM.available():
        pytest.skip(why)
    m = load_model("kimi-k2").all_formats("bf16").with_formats(routed_experts="int4")
    for b in (1, 8, 20, 40):      # 20, 40: experts with several blocks of 8 pairs
        bl = L.build_moe(m, b, torch.device("cuda"), backend="triton", fmt="int4",
                         experts_sample=16)
        assert bl.info["kernel"] == MM.KERNEL
        assert bl.check() < L.REL_TOL
        qw = bl.info["weights"]
        x = torch.randn(b, m.hidden, device="cuda").to(torch.bfloat16)
        ref = Q.moe_forward(qw, x, Q.config_for(b))          # the Triton kernel
        for cfg in (None, MM.MmaLayerConfig(MM.MmaConfig(2), MM.MmaConfig(4, 1, 12))):
            assert L.rel_err(MM.moe_forward(qw, x, cfg), ref) < 1e-2, (b, cfg)


@pytest.mark.gpu
def test_gpu_mma_shared_expert_in_int4():
    from microbench.kernels import layers as L
    from reports.base.model_config import load_model

    if why := MM.available():
        pytest.skip(why)
    m = dataclasses.replace(load_model("kimi-k2"), hidden=1024, moe_intermediate=512,
                            n_routed_experts=16, top_k=4).all_formats("int4")
    bl = L.build_moe(m, 40, torch.device("cuda"), backend="triton", fmt="int4")
    assert bl.info["shared_expert_format"] == "int4"
    assert bl.check() < L.REL_TOL
