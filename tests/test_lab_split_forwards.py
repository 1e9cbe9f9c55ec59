"""reports/lab/split_forwards.py: each rank's forward before and after a layer split, against
the split what-if's "forward x n'/n" estimate. Cases as the lab writes them (case.json, and a
sglang.json record with each rank's forwards by micro-batch size)."""
from __future__ import annotations

import json
import math

import pytest

from reports.base.errors import CliError
from reports.base.records import make_record, write_record
from reports.lab import split_forwards as sf


def _case(root, name, partition, baseline="", fwd=None):
    d = root / name
    d.mkdir()
    (d / "case.json").write_text(json.dumps({
        "case": {"name": name, "concurrency": 8, "baseline": baseline, "fault": "slow-stage=1:2",
                 "expect": "slow_stage", "layer_partition": partition, "reps": 2},
        "device": "cpu", "env": {"SGLANG_PP_LAYER_PARTITION": partition}, "extra_args": [],
        "input_len": 64, "output_len": 128, "pp": 2, "seconds": 10.0,
        "started_unix": 1.0 + len(baseline)}))
    if fwd is not None:
        ranks = {str(r): {"rank": r, "device": "cpu", "forwards": 10, "iterations": 20,
                          "forward_us_by_batch": {str(b): v for b, v in c.items()},
                          "forward_effective_us_by_batch": {str(b): v for b, v in c.items()}}
                 for r, c in fwd.items()}
        write_record(make_record("sglang", {"loop": {"ranks": ranks}}), d / "sglang.json")
    return d


def test_a_split_pair_gives_each_ranks_layer_cost_and_the_estimates_error(tmp_path):
    # rank 0: 1 ms of other work + 2 layers of 1 ms -> 3 layers: 3 -> 4 ms; rank 1 (x2): 2 x
    # (1 + 2 x 1) = 6 -> 2 x (1 + 1) = 4 ms. The estimate x n'/n gives 4.5 and 3 ms.
    _case(tmp_path, "fx-slow1-c8.1", "2,2", fwd={0: {4: 3000.0, 8: 5000.0}, 1: {4: 6000.0}})
    _case(tmp_path, "fx-slow1-split-c8.1", "3,1", baseline="fx-slow1-c8.1",
          fwd={0: {4: 4000.0}, 1: {4: 4000.0}})
    rows = sf.rows(tmp_path)
    assert [(r.rank, r.batch, r.layers) for r in rows] == [(0, 4, (2, 3)), (1, 4, (2, 1))]
    r0, r1 = rows
    assert r0.layer_us == pytest.approx(1000) and r0.other_share == pytest.approx(1 / 3)
    assert r0.predicted_us == pytest.approx(4500) and r0.error_pct == pytest.approx(12.5)
    assert r1.layer_us == pytest.approx(2000) and r1.other_share == pytest.approx(1 / 3)
    assert r1.predicted_us == pytest.approx(3000) and r1.error_pct == pytest.approx(-25)
    text = sf.render(rows)
    assert "fx-slow1-c8.1 -> fx-slow1-split-c8.1" in text and "2 -> 3" in text


def test_no_profiled_pair_is_a_one_line_error(tmp_path):
    _case(tmp_path, "fx-slow1-c8.1", "2,2", fwd={0: {4: 3000.0}, 1: {4: 6000.0}})
    _case(tmp_path, "fx-slow1-split-c8.1", "3,1", baseline="fx-slow1-c8.1")   # not profiled
    with pytest.raises(CliError, match="no profiled pair"):
        sf.rows(tmp_path)
    with pytest.raises(CliError, match="not a lab results folder"):
        sf.rows(tmp_path / "absent")


def test_a_bad_partition_names_the_case(tmp_path):
    _case(tmp_path, "fx-slow1-c8.1", "2,2", fwd={0: {4: 3000.0}, 1: {4: 6000.0}})
    _case(tmp_path, "fx-slow1-split-c8.1", "3,x", baseline="fx-slow1-c8.1",
          fwd={0: {4: 4000.0}, 1: {4: 4000.0}})
    with pytest.raises(CliError, match="fx-slow1-split-c8.1"):
        sf.rows(tmp_path)


def test_the_command_line(tmp_path, capsys):
    assert sf.main([]) == 2
    _case(tmp_path, "a", "2,2", fwd={0: {4: 3000.0}, 1: {4: 6000.0}})
    _case(tmp_path, "b", "1,3", baseline="a", fwd={0: {4: 2000.0}, 1: {4: 8000.0}})
    assert sf.main([str(tmp_path), "--md"]) == 0
    assert "| a -> b |" in capsys.readouterr().out


def test_the_lab_recording_of_a_split_off_a_slow_last_rank():
    # the --fixes plan on the 2-core machine, round 1 (SGLang 0.5.23's CPU server, PP2, the
    # 4-layer Llama, rank 1's forward x2): 2,2 against 3,1, both profiled without stacks. The
    # last rank's forward holds work that stays on it (lm_head, logits, SGLang's own per-forward
    # work): one layer off shrank it by far less than half, the what-if's x n'/n estimate
    from pathlib import Path
    root = Path(__file__).parent / "fixtures" / "sglang_lab" / "fixes"
    rs = sf.rows(root)
    assert {(r.rank, r.layers) for r in rs} == {(0, (2, 3)), (1, (2, 1))}
    for r in rs:
        assert r.layer_us is not None and r.layer_us > 0
        if r.rank == 1:
            assert r.after_us > r.predicted_us and r.other_share > 0.25


def test_a_size_the_after_window_never_ran_is_interpolated_and_said(tmp_path):
    # the before window ran 4 and 4, the after window 1 and 7 (another herd split): the after
    # forward at 4 is interpolated between 1 and 7 (in log b, as the model interpolates a
    # curve: deployment.at_size); a size outside the after range is left out
    _case(tmp_path, "a", "2,2", fwd={0: {4: 3000.0, 8: 5000.0}, 1: {4: 6000.0}})
    _case(tmp_path, "b", "3,1", baseline="a", fwd={0: {1: 3000.0, 7: 5000.0},
                                                  1: {1: 3000.0, 7: 6000.0}})
    rs = sf.rows(tmp_path)
    assert [(r.rank, r.batch, r.interpolated) for r in rs] == [(0, 4, True), (1, 4, True)]
    w = math.log(4) / math.log(7)
    assert rs[0].after_us == pytest.approx(3000 + 2000 * w)
    assert rs[1].after_us == pytest.approx(3000 + 3000 * w)
    assert "(interpolated)" in sf.render(rs)
