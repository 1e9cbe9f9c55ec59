"""The round per slot pattern (reports/lab/rounds.py, its command microbench/sglang_lab/rounds.py):
hand-made visits, and a real
recording of SGLang's depth-2 server at C = 1 (tests/fixtures/sglang_lab/restart/wr-d2-c1.1)."""
from __future__ import annotations

from pathlib import Path

from microbench.sglang_lab import rounds
from reports.lab.rounds import phases
from reports.cli import main as ppscope

FIX = Path(__file__).parent / "fixtures" / "sglang_lab" / "restart" / "wr-d2-c1.1"


def test_phases_split_the_window_by_pattern():
    # 4 slots; 3 rounds of 4-3-1-4 at 80 ms a round (20 per visit), then 4 rounds of a lone
    # request at 20 ms (5 per visit), then idle
    vs, t = [], 0.0
    for _ in range(3):
        for n in (4, 3, 1, 4):
            vs.append((t, n))
            t += 20_000
    for _ in range(4):
        for n in (1, 0, 0, 0):
            vs.append((t, n))
            t += 5_000
    for _ in range(8):
        vs.append((t, 0))
        t += 1_000
    ph = phases(vs, 4)
    assert [(p.pattern, p.rounds, p.round_ms) for p in ph] == [
        ((4, 3, 1, 4), 3, 80.0), ((1, 0, 0, 0), 4, 20.0)]
    assert phases(vs[:8], 4) == []          # two rounds: a transition, not a phase


def test_a_real_depth2_window_is_read_and_modelled(tmp_path):
    case = tmp_path / "wr-d2-c1.1"
    case.mkdir()
    (case / "traces").symlink_to((FIX / "traces").resolve())
    assert ppscope(["sglang", "--log", str(FIX / "server.log"), "--traces", str(FIX / "traces"),
                    "--bench", str(FIX / "bench.jsonl"), "--concurrency", "1",
                    "--json", str(case / "sglang.json")]) == 0
    rows = rounds.case_rows(case)
    # one request alone on a 4-slot server: one phase, one occupied slot of four
    assert len(rows) == 1 and rows[0]["depth"] == 2
    assert sorted(int(x) for x in rows[0]["pattern"].split("-")) == [0, 0, 0, 1]
    assert rows[0]["rounds"] >= 10
    assert 20 < rows[0]["traced_round_ms"] < 40
    # the model of the same trace: within 10% of the round SGLang ran (BENCHMARKS 15)
    assert abs(rows[0]["diff_pct"]) < 10, rows


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert rounds.main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sglang.json" in err


def test_a_case_is_read_as_soon_as_its_baseline_has_a_report(tmp_path):
    """The lab reads each case right after it is measured where it can (its traces there, its
    baseline's report written), so a run cut short keeps every case read so far."""
    import json
    from microbench.sglang_lab.lab import _ready

    def case(name, baseline="", traces=True):
        d = tmp_path / name
        (d / "traces").mkdir(parents=True) if traces else d.mkdir(parents=True)
        (d / "case.json").write_text(json.dumps({"case": {"name": name, "baseline": baseline,
                                                             "concurrency": 8}}))
        return d
    clean, fault = case("clean-c8.1"), case("slow-x3.1", baseline="clean-c8.1")
    assert _ready(clean) and not _ready(fault)          # the fault waits for the clean report
    (clean / "report.json").write_text("{}")
    assert _ready(fault)
    assert not _ready(case("no-window", traces=False))   # nothing traced: nothing to read
