import numpy as np
import pytest

from reports.gpu_specs import load_gpu
from reports.model_config import load_model
from reports.partition import pp_partition
from reports.roofline import (expected_distinct_experts, layer_floor, routed_expert_bytes,
                              stage_floor, zipf_inclusion)


@pytest.mark.parametrize("E,k,b", [(384, 8, 1), (384, 8, 8), (384, 8, 32), (256, 8, 64), (16, 2, 5)])
def test_distinct_experts_vs_monte_carlo(E, k, b):
    rng = np.random.default_rng(1234)
    trials = 3000
    # each token draws a uniform k-subset of E experts (top-k of random scores)
    scores = rng.random((trials, b, E))
    picks = np.argpartition(scores, E - k, axis=-1)[..., E - k:]  # [trials, b, k]
    hit = np.zeros((trials, E), dtype=bool)
    np.put_along_axis(hit, picks.reshape(trials, b * k), True, axis=1)
    mc = hit.sum(axis=1)
    expected = expected_distinct_experts(E, k, b)
    assert abs(mc.mean() - expected) < 4 * mc.std() / np.sqrt(trials) + 1e-9


def test_distinct_experts_edges_and_zipf():
    assert expected_distinct_experts(384, 8, 1) == pytest.approx(8.0)
    assert expected_distinct_experts(384, 8, 0) == 0.0
    assert expected_distinct_experts(384, 8, 10**6) == pytest.approx(384.0)
    q = zipf_inclusion(384, 8, 1.2)
    assert q.sum() == pytest.approx(8.0) and q.max() <= 1.0 + 1e-12
    assert expected_distinct_experts(384, 8, 1, zipf_s=1.2) == pytest.approx(8.0)
    assert expected_distinct_experts(384, 8, 32, zipf_s=1.0) < expected_distinct_experts(384, 8, 32)
    assert expected_distinct_experts(384, 8, 32, zipf_s=1e-12) == pytest.approx(
        expected_distinct_experts(384, 8, 32))


def test_k2_bytes_by_hand():
    m, g = load_model("kimi-k2"), load_gpu("rtx-pro-6000")
    # one routed expert, INT4 g32: 3 x 2048 x 7168 = 44,040,192 weights x 0.5 B = 22,020,096
    # + bf16 scales: gate/up 2048 rows x 224 groups x 2 B = 917,504 each, down 7168 x 64 x 2 =
    # 917,504 -> 2,752,512; total 24,772,608 B.
    assert routed_expert_bytes(m) == 24_772_608
    # MoE layer at b=1: router 384 x 7168 x 2 = 5,505,024; shared expert bf16 44,040,192 x 2 =
    # 88,080,384; 8 distinct experts x 24,772,608 = 198,180,864 -> 291,766,272 B.
    moe = layer_floor(m, "moe", 1, g, context_len=0)
    assert moe.weight_bytes == 291_766_272
    assert moe.floor_us == pytest.approx(291_766_272 / 1792e9 * 1e6)   # 162.8 us, memory-bound
    # MLA attention, bf16: q_a 1536x7168 = 11,010,048; q_b 64*192 x 1536 = 18,874,368;
    # kv_a 576 x 7168 = 4,128,768; kv_b 64*256 x 512 = 8,388,608; o 7168 x 8192 = 58,720,256
    # -> 101,122,048 x 2 B = 202,244,096 + norms (2x7168 + 1536 + 512) x 2 = 32,768
    att = layer_floor(m, "attention", 1, g, context_len=1000)
    assert att.weight_bytes == 202_276_864
    assert att.kv_bytes == 1000 * 576 * 2                      # MLA latent + rope, bf16
    # lm_head 163840 x 7168 x 2 = 2,348,810,240 + final norm 14,336
    assert layer_floor(m, "lm_head", 4, g).weight_bytes == 2_348_824_576


def test_k2_stage_floor_last_stage():
    m, g = load_model("kimi-k2"), load_gpu("rtx-pro-6000")
    st = pp_partition(61, 8)
    last = stage_floor(m, st[7], 1, g, context_len=0)
    # 8 x (202,276,864 + 291,766,272) + 2,348,824,576
    assert last.weight_bytes == 8 * (202_276_864 + 291_766_272) + 2_348_824_576
    assert set(last.components_us) == {"attention", "moe", "lm_head"}
    first = stage_floor(m, st[0], 1, g, context_len=0)
    assert first.components_us.keys() == {"attention", "moe", "dense_mlp", "embedding"}
    # layer 0 dense MLP bf16: 3 x 18432 x 7168 x 2 B
    assert first.components_bytes["dense_mlp"] == 3 * 18432 * 7168 * 2
    assert last.floor_us > first.floor_us
    # more tokens: more distinct experts, more bytes, but less per token
    b32 = stage_floor(m, st[3], 32, g, context_len=0)
    b1 = stage_floor(m, st[3], 1, g, context_len=0)
    assert b1.weight_bytes < b32.weight_bytes < 32 * b1.weight_bytes


def test_measured_bandwidth_overrides_spec():
    m, g = load_model("kimi-k2"), load_gpu("rtx-pro-6000")
    a = layer_floor(m, "moe", 1, g, context_len=0, mem_bw_gbps=896)
    b = layer_floor(m, "moe", 1, g, context_len=0)
    assert a.floor_us == pytest.approx(2 * b.floor_us)
