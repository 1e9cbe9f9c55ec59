"""The layer split's own error as the lab measured it (reports/model/observed/split_error.py):
the record, its checks, and the interval it widens."""
from __future__ import annotations

import json

import pytest

from reports.base.errors import CliError
from reports.model.observed import split_error as se


def _err(lo=-23.0, hi=14.0, med=-5.0):
    return se.SplitError(0.9, 6, lo, hi, med, "the lab", "cmd")


def test_the_interval_takes_the_labs_misses_in_points():
    assert se.widened((18.0, 27.5), _err()) == (-5.0, 41.5)
    # a band that lies all on one side never narrows the window's interval
    assert se.widened((10.0, 20.0), _err(lo=2.0, hi=5.0, med=3.0)) == (10.0, 25.0)
    assert se.widened(None, _err()) is None and se.widened((1.0, 2.0), None) == (1.0, 2.0)


def test_the_band_is_the_central_level_of_the_differences():
    e = se.band_of([-23.3, -22.3, -8.8, -2.0, 12.0, 15.3], "m", "c")
    assert e.cases == 6 and e.points_lo < -22 and e.points_hi > 12
    assert e.points_lo <= e.points_median <= e.points_hi
    with pytest.raises(ValueError):
        se.band_of([], "m", "c")


def test_the_record_is_checked_on_read(tmp_path):
    p = tmp_path / "split-error.json"
    p.write_text(json.dumps(_err().to_dict()))
    assert se.read(p) == _err()
    for bad in ({**_err().to_dict(), "kind": "other"},
                {**_err().to_dict(), "points_lo": 30.0},
                {**_err().to_dict(), "cases": 0},
                {**_err().to_dict(), "points_hi": float("nan")}):
        p.write_text(json.dumps(bad))
        with pytest.raises(CliError, match="split-error.json"):
            se.read(p)
    p.write_text("garbage")
    with pytest.raises(CliError):
        se.read(p)


def test_the_shipped_record_reads():
    e = se.shipped()
    assert e is not None and e.cases >= 2 and "lab" in e.measured_on
    assert e.points_lo < 0 < e.points_hi      # the lab's splits missed on both sides
