import pytest

from reports.base.partition import layer_counts, pp_partition


def test_kimi_k2_pp8_matches_sglang():
    stages = pp_partition(61, 8)
    assert [s.num_layers for s in stages] == [7, 7, 7, 8, 8, 8, 8, 8]
    assert [s.first_layer for s in stages] == [0, 7, 14, 21, 29, 37, 45, 53]
    assert [s.lm_head for s in stages] == [False] * 7 + [True]
    assert [s.embedding for s in stages] == [True] + [False] * 7
    assert list(stages[7].layers) == list(range(53, 61))


def test_even_split_and_pp1():
    assert layer_counts(64, 8) == [8] * 8
    (only,) = pp_partition(61, 1)
    assert only.embedding and only.lm_head and only.num_layers == 61


def test_override_is_used():
    assert layer_counts(61, 8, "8,8,8,8,8,8,8,5") == [8, 8, 8, 8, 8, 8, 8, 5]


@pytest.mark.parametrize("override, words", [
    ("8,8,8", "has 3 entries; pp is 8"),
    ("8,8,8,8,8,8,8,8", "sums to 64; the model has 61"),
    ("a,8,8,8,8,8,8,8", "must be integers"),
    ("0,9,8,8,8,8,8,12", "at least one layer"),
])
def test_override_validation(override, words):
    with pytest.raises(ValueError) as e:
        pp_partition(61, 8, override)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_too_few_layers():
    with pytest.raises(ValueError, match="cannot be split"):
        pp_partition(3, 4)


def test_imbalance_is_max_over_mean():
    from reports.base.partition import imbalance

    assert imbalance([7, 7, 7, 8, 8, 8, 8, 8]) == 8 / (61 / 8)   # Kimi K2's split, PP8
    assert imbalance([3.0, 3.0]) == 1.0
    assert imbalance([1, 2, 3]) == 1.5
