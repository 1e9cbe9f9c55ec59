"""The twin's held-out check (microbench/sglang_lab/twin/observed.py): the cost file written
from an observed record, its rendering, and the CLI's bad input. The run itself starts SGLang
(docs/BENCHMARKS.md section 17, held-out check); here only what needs no server."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from microbench.sglang.steps import read_loop
from microbench.sglang_lab.twin.observed import render
from reports.base.schema import to_json
from reports.base.server_flags import server_args
from reports.cli import main
from reports.model.observed.deployment import at_size, from_evidence
from reports.model.observed.twin_costs import costs
from reports.model.observed import bench_run as ow

LAB = Path(__file__).parent / "fixtures" / "sglang_lab" / "clean-c8" / "traces"


@pytest.fixture(scope="module")
def dep():
    files = {int(p.name.split("-PP-")[1].split(".")[0]): p for p in LAB.glob("*.trace.json.gz")}
    return from_evidence(read_loop(files), concurrency=8, observed=None)


def test_each_rank_is_held_to_its_own_traced_forward(dep):
    t = to_json(costs(dep, 16))
    assert t["mode"] == "sync" and t["k"] == 0.0 and len(t["ranks"]) == dep.pp
    for r, row in enumerate(t["ranks"]):
        assert len(row["decode_us"]) == 17 and row["decode_us"][0] == 0.0
        for b in (1, 2, 6, 16):
            assert row["decode_us"][b] == pytest.approx(at_size(dep.forward[r], b), abs=1e-3)
        # nothing else is emulated: the twin's own host work, hops and prefill
        assert row["host_us"] == row["empty_us"] == row["process_us"] == row["launch_us"] == 0
        assert row["prefill_us"] == [0.0, 0.0]
    assert not any(t["hop_us"])
    # the two ranks' traced forwards differ, and so do their holds
    assert t["ranks"][0]["decode_us"][6] != t["ranks"][1]["decode_us"][6]


def test_a_gpu_record_is_refused(dep):
    with pytest.raises(ValueError, match="CPU backend"):
        costs(replace(dep, device="gpu"), 8)


def test_the_server_flags_are_the_records_settings():
    s = ow.observed_settings(2, 1, rows=64, chunk=256)
    f = server_args(s)
    assert f[:2] == ("--pp-async-batch-depth", "1")
    assert "--chunked-prefill-size" in f and "--max-running-requests" in f
    # the cap SGLang derives from the rows is left to it, as the observed server left it; a
    # cap the server was started with is passed on
    assert "--pp-max-micro-batch-size" not in f
    capped = server_args(ow.observed_settings(2, 1, cap=8, rows=64, chunk=256))
    assert capped[-2:] == ("--pp-max-micro-batch-size", "8")


def test_render_says_whether_the_target_is_met():
    d = {"record": "sglang.json", "pp": 2, "flags": ["--pp-async-batch-depth", "0"],
         "concurrency": 8, "prompts": 18, "input_len": 64, "output_len": 128,
         "recorded_tok_per_s": 225.0, "profiler_slowdown": 1.2,
         "server_tok_per_s": [300.0, 310.0], "twin_tok_per_s": [250.0, 240.0],
         "twin_vs_server_pct": -20.0, "within_target": False, "target_pct": 15.0}
    text = render(d)
    assert "not met" in text and "-20.0%" in text and "300.0, 310.0" in text


def test_a_missing_record_is_a_one_line_error(tmp_path, capsys):
    assert main(["twin", "--observed", str(tmp_path / "none.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["twin", "--observed", str(tmp_path / "none.json"), "--reps", "0"]) == 2


def test_the_windows_own_slowdown_is_taken_off_the_holds(dep):
    full, half = to_json(costs(dep, 8)), to_json(costs(dep, 8, scale=0.5))
    assert half["forward_scale"] == 0.5
    for a, b in zip(full["ranks"], half["ranks"]):
        assert b["decode_us"][6] == pytest.approx(a["decode_us"][6] / 2, abs=1e-3)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError):
            costs(dep, 8, scale=bad)


def test_the_hold_counts_the_forwards_it_lengthened(tmp_path, monkeypatch):
    import importlib.util
    import time
    from microbench.sglang_lab.twin.observed import held
    inject = Path(__file__).resolve().parents[1] / "microbench" / "sglang_lab" / "boot" / "inject"
    monkeypatch.syspath_prepend(str(inject))
    spec = importlib.util.spec_from_file_location("twin_hold_stats", inject / "ppscope_twin_hold.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    stats = tmp_path / "hold-stats"
    monkeypatch.setenv("PPSCOPE_TWIN_STATS", str(stats))
    now = time.monotonic()
    mod._count(1, now + 0.25)          # ends later than the real forward: held
    mod._count(1, now - 1.0)           # the real forward outlasted it: not held
    mod._STATS["written"] = 0.0
    mod._count(1, now - 1.0)
    got = held(stats, pp=2)            # rank 0 wrote nothing: counted as none
    assert got["forwards"] == 3 and got["held"] == 1
    assert 0.2 < got["held_s"] <= 0.25
