"""Shapley rows add up to the ideal -> modelled gap and do not depend on the order of causes."""
import itertools

import pytest

from reports.model.scenario import loop_builder as lb
from reports.base.shapley import shapley
from reports.model.attribution import attribute
from reports.model.scenario.inputs import build_inputs, load_scenario


def test_shapley_exact_on_a_known_game():
    # v(S) = 3*[a] + 5*[b] + 4*[a and b]: the interaction is split equally -> a=5, b=7
    v = lambda s: 3 * ("a" in s) + 5 * ("b" in s) + 4 * ({"a", "b"} <= s)
    assert shapley(["a", "b"], v) == {"a": 5.0, "b": 7.0}


def test_shapley_order_independent():
    v = lambda s: len(s) ** 2 + 2 * ("x" in s) * ("z" in s)
    base = shapley(["x", "y", "z"], v)
    for perm in itertools.permutations(["x", "y", "z"]):
        assert shapley(list(perm), v) == pytest.approx(base)


@pytest.fixture(scope="module")
def seed():
    return build_inputs(load_scenario("seed-pp8"), {})


@pytest.mark.parametrize("C", [1, 8, 32])
def test_rows_sum_to_gap(seed, C):
    a = attribute(seed, C)
    causes = [r for r in a.rows if r.cause != "unexplained"]
    assert sum(r.ms_per_step for r in causes) == pytest.approx(a.modelled_tpot_ms - a.ideal_tpot_ms)
    assert sum(r.tok_per_s for r in causes) == pytest.approx(
        a.modelled_tok_per_s - a.ideal_tok_per_s)
    assert sum(r.share for r in causes) == pytest.approx(1.0)
    unexplained = [r for r in a.rows if r.cause == "unexplained"][0]
    obs = dict(seed.observed)[C]
    assert unexplained.tok_per_s == pytest.approx(obs - a.modelled_tok_per_s)


def test_seed_herd_at_c8(seed):
    # burst + cap 64//8 = 8: all 8 requests in one slot -> one micro-batch for 8 stages
    assert [s for s in lb.admitted_sizes(seed, 8) if s] == [8]
    rows = {r.cause: r for r in attribute(seed, 8).rows}
    assert rows["herd"].share > 0.3     # one cause: too few and uneven micro-batches
    assert rows["routing_skew"].ms_per_step == pytest.approx(0.0)  # zipf_s = 0 in the seed


def test_order_of_players_does_not_change_rows(seed):
    a = attribute(seed, 32)
    b = attribute(seed, 32, players=tuple(reversed(lb.SWITCHES)))
    da = {r.cause: r.ms_per_step for r in a.rows}
    db = {r.cause: r.ms_per_step for r in b.rows}
    assert da == pytest.approx(db)
