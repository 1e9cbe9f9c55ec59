"""interp_linear and interp_log: exact values at and between measured points."""
import math

from reports.base.interp import interp_linear, interp_log


def test_interp_log_flat_beyond_ends_and_log_between():
    curve = ((1, 10.0), (4, 30.0))
    assert interp_log(curve, 0.5) == 10.0
    assert interp_log(curve, 8) == 30.0
    # b = 2 is half-way from 1 to 4 in log(b)
    assert math.isclose(interp_log(curve, 2), 20.0)
    assert interp_log([(4, 30.0), (1, 10.0)], 4) == 30.0


def test_interp_linear_extends_last_slope():
    assert interp_linear([(0.0, 1.0), (2.0, 5.0)], 3.0) == 7.0
