"""The model's error measured in the lab, added to a change's growth intervals
(reports/model/model_error.py): the band arithmetic, the record's checks on read, the shipped
record, and the calibration's writer, out-of-sample and leave-one-round-out checks."""
from __future__ import annotations

import json

import pytest

from reports.base.errors import CliError
from reports.model import model_error as me


def _err(**bands) -> me.ModelError:
    return me.ModelError(0.9, "a test", "cmd", tuple(
        me.CauseError(c, 5, lo, hi, (lo + hi) / 2) for c, (lo, hi) in bands.items()))


def test_a_growing_cause_is_widened_by_its_own_band():
    err = _err(host=(0.5, 2.0), pooled=(0.8, 1.25))
    assert me.widened("host", (10.0, 12.0), err) == ((5.0, 24.0), True)
    # a band inside 1 never narrows the window's interval
    (lo, hi), own = me.widened("host", (10.0, 12.0), _err(host=(1.1, 1.2)))
    assert (lo, own) == (10.0, True) and hi == pytest.approx(14.4)


def test_a_cause_the_lab_never_injected_takes_the_pooled_band():
    err = _err(host=(0.5, 2.0), pooled=(0.8, 1.25))
    assert me.widened("hop", (10.0, 12.0), err) == ((8.0, 15.0), False)
    assert me.widened("hop", (10.0, 12.0), _err(host=(0.5, 2.0))) == ((10.0, 12.0), False)
    assert me.widened("host", (10.0, 12.0), None) == ((10.0, 12.0), False)


def test_shrinking_and_straddling_growths_widen_outwards():
    err = _err(host=(0.5, 2.0))
    assert me.widened("host", (-12.0, -10.0), err) == ((-24.0, -5.0), True)
    lo, hi = me.widened("host", (-1.0, 3.0), err)[0]
    assert lo <= -1.0 and hi >= 3.0 and lo < 0 < hi


def test_band_is_the_central_level_of_the_ratios():
    b = me.band_of("host", [float(x) for x in range(1, 22)], 0.9)   # 1..21
    assert (b.cases, b.ratio_lo, b.ratio_median, b.ratio_hi) == (21, 2.0, 11.0, 20.0)


@pytest.mark.parametrize("payload", [
    [], {"kind": "other"},
    {"kind": "ppscope-model-error", "level": 0.9, "measured_on": "x", "command": "c",
     "causes": [{"cause": "host", "cases": 3, "ratio_lo": 2.0, "ratio_hi": 1.0,
                 "ratio_median": 1.5}]},
    {"kind": "ppscope-model-error", "level": 0.9, "measured_on": "x", "command": "c",
     "causes": [{"cause": "host", "cases": 3, "ratio_lo": 0.0, "ratio_hi": 1.0,
                 "ratio_median": 0.5}]},
    {"kind": "ppscope-model-error", "level": 0.9, "measured_on": "x", "command": "c",
     "causes": [{"cause": "host", "cases": 3, "ratio_lo": 0.5, "ratio_hi": float("inf"),
                 "ratio_median": 1.0}]},
    {"kind": "ppscope-model-error", "level": 1.5, "measured_on": "x", "command": "c",
     "causes": []},
    {"kind": "ppscope-model-error", "level": 0.9, "causes": []},
], ids=["list", "kind", "lo-above-hi", "zero-ratio", "inf", "level", "missing"])
def test_a_damaged_record_is_one_line(tmp_path, payload):
    p = tmp_path / "model-error.json"
    p.write_text(json.dumps(payload))
    with pytest.raises(CliError) as e:
        me.read(p)
    assert "\n" not in str(e.value) and str(e.value).startswith("model-error.json")


def test_record_round_trips_and_the_shipped_one_reads(tmp_path):
    err = _err(host=(0.7, 1.3), pooled=(0.5, 1.4))
    p = tmp_path / "m.json"
    p.write_text(json.dumps(err.to_dict()))
    assert me.read(p) == err
    shipped = me.shipped()
    assert shipped is not None and shipped.level == 0.9
    assert {c.cause for c in shipped.causes} >= {"host", "slow_stage", me.POOLED}
