"""INT4 W4A16 packing (compressed-tensors layout) and FP8 block quantisation: exact values
worked out by hand, round trips, and bytes that equal the roofline's `matrix_bytes`."""
import pytest

torch = pytest.importorskip("torch")
from microbench.kernels import int4_pack as P  # noqa: E402
from microbench.kernels import moe_fp8 as F8  # noqa: E402
from reports.base.model_config import load_model, matrix_bytes  # noqa: E402
from reports.base.roofline import layer_floor, moe_fixed_bytes, routed_expert_bytes  # noqa: E402


def test_pack_word_by_hand():
    # q = 0..7 -> nibbles q + 8 = 8..15, input i in bits 4i..4i+3: 0xFEDCBA98 as int32
    q = torch.arange(8, dtype=torch.int8)
    assert P.pack(q).tolist() == [0xFEDCBA98 - 2 ** 32] == [-19088744]
    # q = -8 everywhere -> nibble 0; q = 7 in input 1 only -> 15 << 4
    q = torch.full((8,), -8, dtype=torch.int8)
    q[1] = 7
    assert P.pack(q).tolist() == [0xF0]
    assert P.unpack(P.pack(q)).tolist() == q.tolist()


def test_pack_unpack_round_trip_and_range():
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-8, 8, (3, 5, 64), generator=g, dtype=torch.int8)
    p = P.pack(q)
    assert p.dtype == torch.int32 and p.shape == (3, 5, 8)
    assert torch.equal(P.unpack(p), q)
    with pytest.raises(ValueError):
        P.pack(torch.full((8,), 8, dtype=torch.int8))
    with pytest.raises(ValueError):
        P.pack(torch.zeros(7, dtype=torch.int8))


def test_quantize_group_by_hand():
    # one group of 32: max |w| = 7.5 -> scale 7.5 / 7.5 = 1; 7.5 rounds to 8 and clamps to 7,
    # -7.5 rounds to -8; 2.5 -> 2 (round half to even), 0.26 -> 0, -3.6 -> -4
    w = torch.zeros(1, 32)
    w[0, :5] = torch.tensor([7.5, -7.5, 2.5, 0.26, -3.6])
    q, s = P.quantize(w)
    assert s.tolist() == [[1.0]] and s.dtype == torch.bfloat16
    assert q[0, :5].tolist() == [7, -8, 2, 0, -4]
    d = P.dequantize(P.pack(q), s)
    assert d[0, :5].tolist() == [7.0, -8.0, 2.0, 0.0, -4.0]


def test_dequantise_within_half_a_step():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(4, 16, 128, generator=g)
    p, s = P.quantize_pack(w)
    d = P.dequantize(p, s, torch.float32)
    step = s.float().repeat_interleave(P.GROUP, -1)
    # |w - q s| <= s / 2 inside the range; the clamp at +7 costs at most one more half step
    assert ((w - d).abs() <= step * 1.0 + 1e-6).all()
    assert ((w - d).abs() <= step * 0.5 + 1e-6).float().mean() > 0.95
    assert float((w - d).norm() / w.norm()) < 0.12


def test_int4_bytes_equal_matrix_bytes():
    g = torch.Generator().manual_seed(2)
    p, s = P.random_packed((2, 96, 256), 0.1, g, "cpu")
    assert p.numel() * 4 + s.numel() * 2 == 2 * matrix_bytes(96, 256, "int4")
    # Kimi K2 gate/up [2048, 7168]: 2048 x 896 int32 words + 2048 x 224 bf16 scales
    assert 2048 * 896 * 4 + 2048 * 224 * 2 == 8_257_536 == matrix_bytes(2048, 7168, "int4")
    # down [7168, 2048]: 7168 x 256 words + 7168 x 64 scales
    assert 7168 * 256 * 4 + 7168 * 64 * 2 == 8_257_536 == matrix_bytes(7168, 2048, "int4")


def test_fp8_blocks_by_hand_and_round_trip():
    w = torch.zeros(128, 256)
    w[0, 0], w[5, 200] = 448.0 * 2, -7.0           # block (0,0): amax 896 -> scale 2
    q, s = F8.quantize_blocks(w)
    assert s.tolist() == [[2.0, 0.015625]]           # 7 / 448 = 2^-6
    assert q.float()[0, 0] == 448.0 and q.float()[5, 200] == -448.0
    g = torch.Generator().manual_seed(3)
    w = torch.randn(2, 256, 384, generator=g)
    q, s = F8.quantize_blocks(w)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (2, 2, 3)
    assert float((F8.dequantize_blocks(q, s) - w).norm() / w.norm()) < 2 ** -4
    assert q.numel() + s.numel() * 4 == 2 * matrix_bytes(256, 384, "fp8")
    x = torch.randn(3, 256, generator=g)
    xq, xs = F8.quantize_act(x)
    assert xs.shape == (3, 2) and float(xq.float().abs().max()) == 448.0
    assert float((F8.dequantize_act(xq, xs) - x).norm() / x.norm()) < 2 ** -4


def test_deepseek_fp8_moe_bytes_by_hand():
    m = load_model("deepseek-v3")
    # one routed expert fp8: 3 x (2048 x 7168 = 14,680,064 B + fp32 scale per 128x128 block:
    # 16 x 56 blocks x 4 B = 3,584) = 3 x 14,683,648 = 44,050,944
    assert routed_expert_bytes(m) == 44_050_944
    # router bf16 256 x 7168 x 2 = 3,670,016 + shared expert fp8 44,050,944 = 47,720,960
    assert moe_fixed_bytes(m) == 47_720_960
    # b = 1: + 8 distinct routed experts = 400,128,512
    from reports.base.gpu_specs import load_gpu
    assert layer_floor(m, "moe", 1, load_gpu("h200"), context_len=0).weight_bytes == 400_128_512


def test_quant_weight_bytes_match_allocation():
    import dataclasses

    from microbench.kernels import moe_quant
    m = dataclasses.replace(load_model("kimi-k2"), hidden=256, moe_intermediate=128,
                            n_routed_experts=8, top_k=2)
    for fmt in ("int4", "fp8"):
        mm = m.with_formats(routed_experts=fmt, shared_experts="bf16")
        qw = moe_quant.make_weights(mm, fmt, "cpu", experts_sample=4)
        # router 8 x 256 bf16 + 4 routed experts in fmt + 1 shared expert bf16
        assert qw.nbytes() == moe_quant.weight_bytes(mm, fmt, 4) == (
            8 * 256 * 2 + 4 * routed_expert_bytes(mm) + 3 * 128 * 256 * 2)
