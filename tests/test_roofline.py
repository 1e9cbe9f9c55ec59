import numpy as np
import pytest

from reports.base.gpu_specs import load_gpu
from reports.base.model_config import load_model
from reports.base.partition import pp_partition
from reports.base.roofline import (expected_distinct_experts, layer_floor, routed_expert_bytes,
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


# ---- routing skew: exact inclusion vs Monte-Carlo, stage spread ----

def test_zipf_inclusion_exact_against_token_draws():
    # Plackett-Luce inclusion: the numerical integral vs 200k routed tokens (seeded)
    from reports.base.roofline import route_tokens
    picks = route_tokens(np.random.default_rng(7), 16, 3, 1.0, 200_000)
    assert (np.sort(picks, axis=1)[:, 1:] != np.sort(picks, axis=1)[:, :-1]).all()  # distinct
    freq = np.bincount(picks.ravel(), minlength=16) / 200_000
    q = zipf_inclusion(16, 3, 1.0)
    assert q.sum() == pytest.approx(3.0, abs=1e-8)
    sem = np.sqrt(q * (1 - q) / 200_000)
    assert np.all(np.abs(freq - q) < 4 * sem + 1e-12)
    assert zipf_inclusion(384, 8, 0.0) == pytest.approx(np.full(384, 8 / 384))
    # the old capped approximation min(1, k p_e) gave 41.38 here; token draws give ~44.1
    assert expected_distinct_experts(384, 8, 8, zipf_s=1.0) == pytest.approx(44.10963, abs=1e-4)


@pytest.mark.parametrize("s", [0.0, 1.0])
def test_skew_spread_mean_matches_formula(s):
    from reports.base.roofline import skew_spread
    m = load_model("kimi-k2")
    r = skew_spread(m, pp_partition(61, 8), (1, 8, 32), s, draws=50, seed=0)
    for b, x in r.items():
        # pool of 1024 routed layers: the MC mean is within 4 standard errors of the formula
        assert abs(x.distinct_mean - x.distinct_expected) <= 4 * x.distinct_sem + 1e-9
        assert x.distinct_expected == pytest.approx(expected_distinct_experts(384, 8, b, s))
    assert r[1].distinct_mean == 8.0 and r[1].distinct_sem == 0.0


def test_skew_spread_seeded_numbers():
    from reports.base.roofline import moe_fixed_bytes, skew_spread
    m = load_model("kimi-k2")
    stages = pp_partition(61, 8)
    r = skew_spread(m, stages, (8, 32), 1.0, draws=100, seed=0)
    x = r[32]
    assert x.distinct_mean == pytest.approx(117.4345703125)  # seed 0, 1024 layers of 32 tokens
    assert x.moe_bytes_per_token == pytest.approx(
        (moe_fixed_bytes(m) + x.distinct_expected * routed_expert_bytes(m)) / 32)
    # s = 0: mean stage bytes = stage_floor's (uniform) bytes up to MC noise; spread is the split
    u = skew_spread(m, stages, 32, 0.0, draws=100, seed=0)[32]
    g = load_gpu("rtx-pro-6000")
    ref = [stage_floor(m, st, 32, g) for st in stages]
    ref_b = [f.weight_bytes + f.kv_bytes for f in ref]
    assert np.allclose(u.stage_bytes_mean, ref_b, rtol=5e-3)  # 100 draws of 7-8 layers
    assert u.max_over_mean_of_means == pytest.approx(max(ref_b) / np.mean(ref_b), rel=5e-3)
    # lm_head keeps the last stage slowest in every draw: per-layer noise costs nothing here
    assert u.slowest_stage_loss == pytest.approx(0.0, abs=1e-9)
    assert x.slowest_stage_loss == pytest.approx(0.0, abs=1e-9)
    assert all(p10 <= mu <= p90 for p10, mu, p90 in
               zip(x.stage_bytes_p10, x.stage_bytes_mean, x.stage_bytes_p90))
    # skew reads fewer bytes in every stage
    assert all(a < b for a, b in zip(x.stage_bytes_mean, u.stage_bytes_mean))


def test_skew_spread_rejects_bad_input():
    from reports.base.roofline import skew_spread
    with pytest.raises(ValueError):
        skew_spread(load_model("kimi-k2"), pp_partition(61, 8), 0, 1.0)
    with pytest.raises(ValueError):
        skew_spread(load_model("llama-3-70b"), pp_partition(80, 8), 8, 1.0)


def test_moe_weight_bytes_allocated_by_hand():
    from reports.base.roofline import moe_weight_bytes

    m = load_model("kimi-k2")   # E 384, S 1, H 7168, I 2048; routed int4, shared bf16
    # router 384 x 7168 x 2 = 5,505,024; shared expert bf16 3 x 2048 x 7168 x 2 = 88,080,384
    # int4, all 384 experts: 384 x 24,772,608 = 9,512,681,472 -> 9,606,266,880 B
    assert moe_weight_bytes(m, "int4") == 9_606_266_880
    # int4, a sample of 8 experts: 8 x 24,772,608 = 198,180,864 -> 291,766,272 B (the b=1 floor)
    assert moe_weight_bytes(m, "int4", 8) == 291_766_272
    # bf16, 8 experts: 2 x (384 x 7168 + (8 + 1) x 3 x 7168 x 2048)
    #   = 2 x (2,752,512 + 396,361,728) = 798,228,480 B
    assert moe_weight_bytes(m, "bf16", 8) == 798_228_480
    # fp8 routed: the shared expert is not fp8 in this model, so it stays bf16.
    # one fp8 expert: 44,040,192 B + fp32 scales (gate/up 16 x 56 x 4 = 3,584 each, down
    # 56 x 16 x 4 = 3,584) = 44,050,944 -> 2 x 44,050,944 + 5,505,024 + 88,080,384 = 181,687,296
    assert moe_weight_bytes(m, "fp8", 2) == 181_687_296
    # more experts than the model has: all of them
    assert moe_weight_bytes(m, "int4", 1000) == moe_weight_bytes(m, "int4")
