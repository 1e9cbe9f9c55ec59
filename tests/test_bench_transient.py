"""A benchmark run modelled visit by visit (reports/model/scenario/bench_transient.py), the pipeline
model over a plan (pipeline_model.Plan) and the admission engine's record of a run
(slots.RunRecord), held against the twin's recording of the seed's PP8 deployment on SGLang's own
scheduler (tests/fixtures/twin/cached/: the shipped record of the run before the twin flushed
SGLang's prefix cache after bench_serving's warm-up; SGLang 0.5.23, 32 output tokens)."""
import json
from pathlib import Path

import pytest

from reports.base.slots import RunRecord, SlotConfig, Successor, Wave, run_loop
from reports.model.scenario.bench_transient import model_bench, waves_of
from reports.model.sim.pipeline_model import Plan, simulate, simulate_plan, uniform_loop
from reports.model.settings_change import Change
from reports.model.scenario.inputs import build_inputs, load_records, load_scenario

TWIN = Path(__file__).parent / "fixtures" / "twin" / "cached" / "seed-pp8.twin.json"
OVERRIDES = {"default": (), "recommended": (Change("--chunked-prefill-size", 2048),),
             "pair": (Change("--chunked-prefill-size", 2048), Change("--pp-async-batch-depth", 0))}


def test_plan_of_steady_decodes_matches_the_steady_loop():
    cfg = uniform_loop(4, 2, 3, 1000.0, 60.0, 60.0)
    steady = simulate(cfg, [3, 3])
    rounds = 40
    one = [(3, 0), (3, 0)] + [(0, 0)] * (cfg.slots - 2)
    plan = Plan(cfg, tuple(one * rounds), lambda r, t, n: 0.0)
    simulate_plan(plan)
    j0, j1 = cfg.slots * 20, cfg.slots * 30
    per_round = (plan.processed[j1] - plan.processed[j0]) / 10
    assert per_round == pytest.approx(steady.tpot_ms * 1e3, rel=1e-6)


def test_a_prefill_in_the_plan_delays_the_decodes_behind_it():
    cfg = uniform_loop(2, 1, 2, 1000.0, 60.0, 60.0)
    base = [(2, 0)] * 40
    slow = list(base)
    slow[10] = (1, 500)
    plans = [Plan(cfg, tuple(b), lambda r, t, n: 10.0 * t) for b in (base, slow)]
    for p in plans:
        simulate_plan(p)
    assert plans[1].processed[30] > plans[0].processed[30] + 4000
    with pytest.raises(ValueError):
        simulate_plan(Plan(cfg, ((-1, 0),), lambda r, t, n: 0.0))


def test_run_record_keeps_every_visit_and_every_request():
    cfg = SlotConfig(pp=2, async_depth=0, max_micro_batch=8, chunked_prefill_size=8192)
    rec = RunRecord()
    run = run_loop(cfg, [Wave(4)], Successor(6), prompt_len=100, output_len=lambda: 5,
                   record=rec)
    assert len(rec.requests) == 6
    assert all(n == 5 and last > first for first, last, n in rec.requests)
    prefills = [(n, t) for n, t in rec.batches if t]
    assert [n for n, _ in prefills] == [b for b, _ in run.prefills]
    assert sum(t for _, t in prefills) == 6 * 100


@pytest.fixture(scope="module")
def twin():
    d = json.loads(TWIN.read_text())["data"]
    records, warnings = load_records(Path("/nonexistent"))
    inp = build_inputs(load_scenario(d["scenario"]), records, warnings)
    return d, inp


def test_replayed_admission_gives_the_waves_sglang_logged(twin):
    d, inp = twin
    for row in d["rows"]:
        C = row["concurrency"]
        # bench_serving's warm-up prompt is the run's first, served from the prefix cache
        m = model_bench(inp, C, row["completed"], d["output_len"],
                        waves_of(row["waves"], C), changes=OVERRIDES[row["setting"]],
                        cached_prompts=1)
        got = [n for n, _ in m.prefill_visits]
        if C <= 8:   # the C = 32 runs' last few prompts differ by one between slots
            assert got == row["waves"], (row["setting"], C)


def test_the_transient_explains_the_pair_at_c32(twin):
    """The steady-state model puts the best pair at 75 ms TPOT at C = 32; SGLang's scheduler
    took 96 ms on the twin (94 with the earlier hold), because in a 32-token run the later
    prompts' prefills run between the decodes for the whole run. The model of that same run lands within 10% of the twin."""
    d, inp = twin
    row = next(r for r in d["rows"] if r["setting"] == "pair" and r["concurrency"] == 32)
    m = model_bench(inp, 32, row["completed"], d["output_len"], waves_of(row["waves"], 32),
                    changes=OVERRIDES["pair"], cached_prompts=1)
    assert row["model_tpot_ms"] < 0.85 * row["twin_tpot_ms"]
    assert m.tpot_ms == pytest.approx(row["twin_tpot_ms"], rel=0.10)


REPS = Path(__file__).parent / "fixtures" / "twin" / "reps"


def _cached_tokens(log: str) -> list[tuple[int, int, int]]:
    """(#new-seq, #new-token, #cached-token) of rank 0's Prefill lines (SGLang 0.5.23
    scheduler_metrics_mixin.py `log_prefill_stats`)."""
    import re
    pat = re.compile(r"#new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+)")
    return [tuple(int(x) for x in m.groups()) for m in map(pat.search, log.splitlines()) if m]


def test_the_warm_up_prompt_is_served_from_the_cache_and_moves_the_admission(twin):
    """bench_serving's warm-up request is the run's first prompt, so SGLang's radix cache holds
    999 of its 1000 tokens when the run sends it (both repetitions' logs). When it arrives with
    others (repetition 1), chunk 2048 admits 4 prompts in the first visit (1 + 1000 + 1000 + 47
    tokens) and the slots come out 4, 3, 3, 1 instead of 1, 3, 3, 3, 1 (repetition 2): the
    twin's TPOT 66.6 ms against 49.6. The model of the run reproduces both admissions only with
    that prompt's cache hit, and repetition 1's TPOT within 10% (without the hit: 57.8 ms,
    -13%). These repetitions ran on the twin's earlier hold; its 1, 3, 3, 3, 1 miss (59.3 ms
    against 49.6) is the hold's, found below (BENCHMARKS 17)."""
    _, inp = twin
    for rep, first in (("rep1", (4, 2048, 999)), ("rep2", (1, 1, 999))):
        lines = _cached_tokens((REPS / f"{rep}-recommended-prefill-pp0.log").read_text())
        run = [x for x in lines if x[1] != 22 and x != (1, 1000, 0)]   # start-up, warm-up
        assert run[0] == first, (rep, run)
    tpot = {}
    for rep in ("rep1", "rep2", "rep3"):
        d = json.loads((REPS / f"{rep}.twin.json").read_text())["data"]
        row = next(r for r in d["rows"] if r["setting"] == "recommended")
        args = (inp, 8, row["completed"], d["output_len"], waves_of(row["waves"], 8))
        m = model_bench(*args, changes=OVERRIDES["recommended"], cached_prompts=1)
        assert [n for n, _ in m.prefill_visits] == row["waves"], rep
        tpot[rep] = (m.tpot_ms, row["twin_tpot_ms"])
    assert tpot["rep1"][0] == pytest.approx(tpot["rep1"][1], rel=0.10)
    assert tpot["rep1"][0] > tpot["rep2"][0] and tpot["rep1"][1] > tpot["rep2"][1]
    d = json.loads((REPS / "rep1.twin.json").read_text())["data"]
    row = next(r for r in d["rows"] if r["setting"] == "recommended")
    plain = model_bench(inp, 8, row["completed"], d["output_len"], waves_of(row["waves"], 8),
                        changes=OVERRIDES["recommended"])
    assert [n for n, _ in plain.prefill_visits] != row["waves"]


STREAM = Path(__file__).parent / "fixtures" / "twin" / "stream"


def test_with_sglangs_stream_order_the_twin_meets_the_model_of_each_run(twin):
    """The twin's hold emulating SGLang's schedule stream (receives hold the stream until the
    data arrives, the forward waits for it, the CPU waits at the next slot's d2h sync for
    everything on it): two chunk-2048 runs at C = 8 admitted 1, 3, 3, 3, 1 (the warm-up prompt
    alone first) and 3, 3, 3, 1 (with two others; logged as 2000 new tokens and 1000 cached).
    The model of each run, with that cache hit, lands within 10% of the twin in both (59.3 ms
    against 54.7, 71.2 against 66.3). The earlier hold, where a relay left before the relaying
    forward ended, ran the 1, 3, 3, 3, 1 run at 49.6 ms (reps/, -16% against the model)."""
    _, inp = twin
    firsts = {}
    for run in ("run1", "run2"):
        lines = _cached_tokens((STREAM / f"{run}-recommended-prefill-pp0.log").read_text())
        firsts[run] = [x for x in lines if x[1] != 22 and x != (1, 1000, 0)][0]
        d = json.loads((STREAM / f"{run}.twin.json").read_text())["data"]
        (row,) = d["rows"]
        m = model_bench(inp, 8, row["completed"], d["output_len"], waves_of(row["waves"], 8),
                        changes=OVERRIDES["recommended"], cached_prompts=1)
        assert [n for n, _ in m.prefill_visits] == row["waves"], run
        assert m.tpot_ms == pytest.approx(row["twin_tpot_ms"], rel=0.10), run
    assert firsts == {"run1": (1, 1, 999), "run2": (3, 2000, 1000)}
    old = json.loads((REPS / "rep2.twin.json").read_text())["data"]
    new = json.loads((STREAM / "run1.twin.json").read_text())["data"]
    rec = [next(r for r in d["rows"] if r["setting"] == "recommended") for d in (old, new)]
    assert rec[0]["waves"] == rec[1]["waves"] == [1, 3, 3, 3, 1]
    assert rec[1]["twin_tpot_ms"] > 1.05 * rec[0]["twin_tpot_ms"]
