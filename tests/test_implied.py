"""The kernel efficiency an observed point implies (reports/model/scenario/implied.py)."""
from __future__ import annotations

import pytest

from reports.model.scenario import loop_builder as lb
from reports.model.scenario.implied import MISS_PCT, _scaled, implied_efficiency
from reports.model.scenario.inputs import build_inputs, load_scenario


@pytest.fixture(scope="module")
def seed():
    return build_inputs(load_scenario("seed-pp8"), {})


def test_within_the_target_implies_nothing(seed):
    m = lb.run(seed, 8).tok_per_s
    assert implied_efficiency(seed, 8, m * (1 + MISS_PCT / 200)) is None


def test_the_factor_found_meets_the_observation(seed):
    m = lb.run(seed, 1).tok_per_s
    x = implied_efficiency(seed, 1, 1.4 * m)
    assert x is not None and x.scale is not None and x.scale > 1
    # the model re-run with that factor gives the observed tok/s
    assert lb.run(_scaled(seed, x.scale), 1).tok_per_s == pytest.approx(1.4 * m, rel=1e-3)
    assert x.implied_b1 == pytest.approx(x.efficiency_b1 * x.scale)
    assert x.possible == (x.implied_b1 <= 1.0) and "C=1" in x.text
    slower = implied_efficiency(seed, 1, 0.5 * m)
    assert slower.scale < 1 and slower.possible


def test_beyond_any_efficiency_says_look_elsewhere(seed):
    x = implied_efficiency(seed, 1, 50 * lb.run(seed, 1).tok_per_s)
    assert x.scale is None and not x.possible and "other inputs" in x.text
    # above the floor: possible is False, and the text says kernel speed alone cannot do it
    y = implied_efficiency(seed, 1, 2.6 * lb.run(seed, 1).tok_per_s)
    assert y.scale is not None and y.implied_b1 > 1 and not y.possible
    assert "cannot" in y.text
