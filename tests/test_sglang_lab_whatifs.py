"""The model against SGLang's own server: the what-if plan's recordings
(tests/fixtures/sglang_lab/whatif/, `ppscope sglang-lab --whatif`, trimmed by
microbench/sglang_lab/fixtures.py --iterations 30 --bench-info-once).

SGLang 0.5.23's `launch_server --pp-size 2 --device cpu` with its defaults (`wi-base-c<C>`,
profiled) and with one setting changed (`wi-<setting>-c<C>`: bench_serving only), C = 1, 8, 16,
three bench_serving runs each; the live settings also interleaved with their before runs
(`wl-<setting>-c<C>.<k>`). Four profiled windows kept only their bench runs (size). From each before case's evidence alone the model predicts the
change (reports/model/observed/bench_run.py); bench_serving measured it. docs/BENCHMARKS.md
section 15 holds the table these fixtures reproduce.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from reports.cli import main

WI = Path(__file__).parent / "fixtures" / "sglang_lab" / "whatif"
CASES = sorted(d.name for d in WI.iterdir() if (d / "case.json").exists()) if WI.exists() else []
PROFILED = [c for c in CASES if (WI / c / "traces").is_dir()]
# where the prediction misses the target, and why (docs/BENCHMARKS.md section 15): each is a
# first-pass after case run minutes after its before case, in which the server's own decode
# lines show the loaded machine running every visit ~1.4-1.6x slower; two of them change
# nothing SGLang does at C = 1. Interleaved (`wl-*`), the same settings are within target.
KNOWN_MISSES = {
    "wi-chunk-c1": "no-op at C = 1 (one 64-token prompt per prefill either way); drift",
    "wi-rate-c1": "no-op at C = 1 (one stream: paced = unpaced); drift",
    "wi-mmb-c8": "drift: rank 0's visits 37 ms against 17-25 ms in the before runs",
    "wi-mrr-c8": "drift: rank 0's visits 36 ms; -39% predicted at the before runs' speed",
    # replayed from the benchmark's first burst in the log (1, 9, 6: groups of 7 and 9;
    # observed_whatif.py), not from the traced window's groups:
    "wi-d1-c16": "-27% predicted against +13% measured here; both restart passes on an idle "
                 "machine measured depth 1 at C = 16 at -16% to -27% (BENCHMARKS 15)",
}
# the model of the observed loop outside 10% of bench_serving on this first, loaded pass:
# - (wl-base-c16.1 missed while the run model spread each group's successors over
#   several visits; replaying the log's burst, successors arriving together, it is within 10%)
# - wi-d1-c1, wi-d2-c1, wi-d2-c8 (+16..+22%): the model is faster than the benchmark. Before
#   the trace reader took rank 0's waits in its send commits out of its host time these were
#   inside 10%, by two errors cancelling: those waits counted twice (the model 17-30% slower
#   than its own traced loop at C = 1) against runs slower than the windows. wi-d1-c1's model
#   now reproduces its traced step (2% unexplained); the restart pass on an idle machine
#   (test_sglang_lab_restart.py) holds the model to its traced loop at C = 1, depth 0-2.
# - wl-base-c16.1 (-16%) and wi-base-c1 (-10%), since admission is slots.run_loop's: a finished
#   prompt's successor comes back two visits after rank 0 processed its last token (SGLang's
#   loop), not at the next visit. At C = 16 the old rule merged the second generation into one
#   slot of 16, a round the model costs 71 ms; the log decodes 7 and 9 again (tests/
#   test_admission_engine.py), a round it costs 88 ms: the round's cost, not the admission, is
#   what misses. At C = 1 the visits between a prompt and its successor are charged a
#   one-request round each (bench_run's empty round), more than SGLang's empty visits.
# - wi-d2-c8 (+17%, +33% with the old rule) as below.
# wi-d2-c1 left the misses once each rank's own empty visits were costed (-0.1%)
LOOP_MISSES = {"wi-d1-c1", "wi-d2-c8", "wi-base-c1", "wl-base-c16.1"}


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> Path:
    """`ppscope sglang` on each profiled case, as the lab runs it."""
    out = tmp_path_factory.mktemp("wi")
    for case in PROFILED:
        d = WI / case
        c = json.loads((d / "case.json").read_text())["case"]["concurrency"]
        (out / case).mkdir()
        assert main(["sglang", "--log", str(d / "server.log"), "--traces", str(d / "traces"),
                     "--bench", str(d / "bench.jsonl"), "--concurrency", str(c),
                     "--json", str(out / case / "sglang.json")]) == 0
    return out


def test_the_whatif_recordings_are_there():
    assert {"wi-base-c1", "wl-base-c8.1", "wl-base-c16.1"} <= set(PROFILED)
    assert any(c.startswith("wi-mmb-") for c in CASES)
    assert any(c.startswith("wi-d1-") for c in PROFILED)


def test_each_setting_change_is_predicted_from_the_before_case_alone(records):
    from reports.lab.whatifs import whatif_rows
    rows = whatif_rows(WI, records)
    knobs = {r["knob"] for r in rows}
    assert knobs == {"--pp-max-micro-batch-size", "--pp-async-batch-depth",
                     "--chunked-prefill-size", "--max-running-requests", "--request-rate"}
    assert len(rows) == 18
    missed = {r["case"]: r for r in rows if not r["ok"]}
    assert set(missed) == set(KNOWN_MISSES), {k: (v["predicted_pct"], v["measured_pct"],
                                                 v["measured_range_pct"])
                                             for k, v in missed.items()}


def test_the_model_of_the_observed_loop_against_bench_serving(records):
    from reports.model.checks.validate_dispatch import TARGET_PCT, validate_sglang_case
    checks = {case: validate_sglang_case(records / case) for case in PROFILED}
    assert all(c.profiler_slowdown is not None for c in checks.values())
    outside = {case for case, c in checks.items() if abs(c.diff_pct) > TARGET_PCT}
    assert outside == LOOP_MISSES, {k: round(c.diff_pct, 1) for k, c in checks.items()}
    # without the profiler's slowdown and bench_serving's run, the steady loop alone misses
    # as many points (more before the successor rule moved two misses in), other ones
    steady = {case for case, c in checks.items()
              if abs(100 * (c.steady_tok_per_s / c.measured_tok_per_s - 1)) > TARGET_PCT}
    assert len(steady) >= len(outside) and steady != outside


def test_validate_dispatch_checks_sglang_lab_cases_first(records, capsys):
    from reports.model.checks.validate_dispatch import main as vmain
    case = records / "wi-d2-c8"
    rc = vmain([str(case)])
    out = capsys.readouterr().out
    assert "sglang" in out.splitlines()[2] and "of 1 points within 10%" in out
    assert rc in (0, 1) and (rc == 0) == ("within 10%" in out.splitlines()[2])
    assert vmain([str(records / "no-such-case")]) == 1


def test_the_restart_plan_alternates_the_servers_and_profiles_its_own_before_cases():
    # each restart setting on its own server, the servers alternating round by round, so that a
    # change of the machine's load falls on every side; the before evidence is this pass's own
    from microbench.sglang_lab.cases import whatif_restart_plan
    from reports.base.payloads.lab_case import CasePlan, LabCase
    from reports.lab.whatifs import change_of
    plan = whatif_restart_plan(pp=2, rounds=2)
    names = [g.name for g in plan]
    assert names == ["wr-d0-1", "wr-d1-1", "wr-d2-1", "wr-chunk64-1", "wr-mrr4-1",
                     "wr-d0-2", "wr-d1-2", "wr-d2-2", "wr-chunk64-2", "wr-mrr4-2"]
    profiled = {c.name for g in plan for c in g.cases if c.profile}
    # every round's default servers (one before window per round), the first round's others
    assert profiled == ({f"wr-base-c{C}.{k}" for C in (1, 8, 16) for k in (1, 2)}
                        | {c.name for g in plan[1:5] for c in g.cases})
    assert len(whatif_restart_plan(pp=2, rounds=3)) == 15
    by = {g.name: g for g in plan}
    # chunked prefill is not tried at C = 1 (one prompt fits any budget), 4 rows only above 4
    assert [c.concurrency for c in by["wr-chunk64-1"].cases] == [8, 16]
    assert [c.concurrency for c in by["wr-mrr4-2"].cases] == [8, 16]
    # every after case names its before case and changes exactly one setting against it
    for g in plan[1:5]:
        for c in g.cases:
            after = LabCase(CasePlan(c.concurrency, baseline=c.baseline),
                            extra_args=tuple(g.extra_args))
            before = LabCase(CasePlan(c.concurrency))
            knob, value = change_of(after, before)
            assert c.baseline == f"wr-base-c{c.concurrency}"
            assert knob in g.extra_args and str(value) in g.extra_args
