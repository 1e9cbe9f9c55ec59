"""The twin's bookkeeping on the CPU: the device times it writes are the model's own, the hold
module turns a batch into the right time, k comes from the calibration by its stated rule, and
the micro-batches are read from SGLang's own `Prefill batch` lines."""
from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from microbench.sglang_lab.twin.run import calibrated_k, waves, with_flag
from reports.base.payloads.twin import TwinCosts, TwinData, write_costs
from reports.base.schema import from_json
from reports.base.server_flags import server_args
from reports.model.scenario import loop_builder as lb
from reports.model.scenario.inputs import build_inputs, load_records, load_scenario
from reports.model.scenario.twin_costs import costs

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "tests" / "fixtures" / "sglang_lab"


def whatif_row(knob: str, setting: str):
    """A what-if row as the report carries it: shown strings and the changes applied."""
    from types import SimpleNamespace
    from reports.model.settings_change import Change
    changes = tuple(Change(f.strip(), v.strip()) for f, v in zip(knob.split(" + "),
                                                                  setting.split(" + ")))
    return SimpleNamespace(knob=knob, setting=setting, changes=changes)


@pytest.fixture(scope="module")
def seed():
    recs, warn = load_records(Path("/nonexistent-results"))
    return build_inputs(load_scenario("seed-pp8"), recs, warn)


@pytest.fixture
def hold(tmp_path, monkeypatch):
    inject = ROOT / "microbench" / "sglang_lab" / "boot" / "inject"
    monkeypatch.syspath_prepend(str(inject))
    spec = importlib.util.spec_from_file_location("twin_hold_under_test",
                                                  inject / "ppscope_twin_hold.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_device_times_are_the_models_own(seed, tmp_path):
    written = write_costs(tmp_path / "twin-costs.json", costs(seed, 32), 40.0)
    c = json.loads((tmp_path / "twin-costs.json").read_text())     # as the hold reads it
    assert from_json(TwinCosts, c) == written
    cfg = lb.loop_config(seed, lb.ALL_ON, 32)
    assert c["k"] == 40.0
    # SGLang's own split of Kimi's 61 layers over 8 ranks (the last 61 % 8 ranks get one more)
    assert c["layer_split"] == [7, 7, 7, 8, 8, 8, 8, 8]
    for r, rank in enumerate(c["ranks"]):
        assert rank["decode_us"] == pytest.approx(list(cfg.stage_us[r]), abs=1e-3)
        assert rank["host_us"] == seed.host_us + seed.chain_us
        assert rank["empty_us"] == seed.empty_us + seed.chain_us
        pre = rank["prefill_us"]
        assert all(b >= a for a, b in zip(pre, pre[1:]))        # more tokens, never cheaper
    assert c["hop_us"] == pytest.approx(list(cfg.hop_us[0]), abs=1e-3)
    # only the last rank computes logits, once per prefilled sequence
    assert [r["lm_head_seq_us"] > 0 for r in c["ranks"]] == [False] * 7 + [True]
    json.dumps(c)


def test_the_hold_turns_a_batch_into_its_time(seed, hold, tmp_path, monkeypatch):
    path = tmp_path / "twin-costs.json"
    write_costs(path, costs(seed, 16), 2.0)
    c = json.loads(path.read_text())
    monkeypatch.setenv("PPSCOPE_TWIN_COSTS", str(path))
    mode = lambda decode: SimpleNamespace(is_decode=lambda: decode)  # noqa: E731
    r3 = c["ranks"][3]
    dec = SimpleNamespace(forward_mode=mode(True), batch_size=8, extend_num_tokens=None)
    assert hold.forward_us(3, dec) == pytest.approx(r3["decode_us"][8] + r3["launch_us"])
    # past the table: its last step continued
    big = SimpleNamespace(forward_mode=mode(True), batch_size=18, extend_num_tokens=None)
    d = r3["decode_us"]
    assert hold.forward_us(3, big) == pytest.approx(d[16] + 2 * (d[16] - d[15]) + r3["launch_us"])
    pre = SimpleNamespace(forward_mode=mode(False), batch_size=2, extend_num_tokens=1024)
    i = r3["prefill_tokens"].index(1024)
    assert hold.forward_us(3, pre) == pytest.approx(r3["prefill_us"][i] + r3["launch_us"])
    last = c["ranks"][7]
    assert hold.forward_us(7, pre) == pytest.approx(last["prefill_us"][i] + 2 * last["lm_head_seq_us"]
                                                    + last["launch_us"])
    # k is read from the file and changes without a restart (the calibration's k = 0 first)
    c["k"] = 0.0
    path.write_text(json.dumps(c))
    hold._STATE["checked"] = 0.0
    import os
    os.utime(path, ns=(1, 1))
    assert hold._costs()["k"] == 0.0


def test_k_keeps_this_machines_step_under_the_stated_share():
    k, share = calibrated_k(host_tpot_ms=140.0, model_tpot_ms=32.4, max_k=60)
    assert k == 44 and share <= 0.10 and share == pytest.approx(140 / (44 * 32.4))
    k, share = calibrated_k(host_tpot_ms=400.0, model_tpot_ms=32.4, max_k=60)
    assert k == 60 and share > 0.10                       # capped: the share says so
    assert calibrated_k(1.0, 32.4, 60)[0] == 1


def test_settings_become_sglang_flags(seed):
    flags = server_args(seed.server)
    assert flags[:2] == ("--pp-async-batch-depth", "8")
    assert "--chunked-prefill-size" in flags and "8192" in flags
    new = with_flag(flags, "--chunked-prefill-size", "2048")
    assert new.count("--chunked-prefill-size") == 1 and new[-2:] == ("--chunked-prefill-size", "2048")


def test_the_waves_are_read_from_rank_0s_prefill_lines():
    log = next(LAB.glob("*/server.log")).read_text(errors="replace")
    w = waves(log)
    assert w and all(n >= 0 for n in w)
    text = ("[2026-12-04 10:00:00 PP0] Prefill batch, #new-seq: 1, #new-token: 1000, "
            "#cached-token: 0, token usage: 0.01, #running-req: 0, #queue-req: 7, \n"
            "[2026-12-04 10:00:00 PP1] Prefill batch, #new-seq: 1, #new-token: 1000, "
            "#cached-token: 0, token usage: 0.01, #running-req: 0, #queue-req: 0, \n"
            "[2026-12-04 10:00:01 PP0] Prefill batch, #new-seq: 7, #new-token: 7000, "
            "#cached-token: 0, token usage: 0.2, #running-req: 1, #queue-req: 0, \n")
    assert waves(text) == [1, 7]


def test_the_table_sets_twin_beside_model_and_observed():
    from microbench.sglang_lab.twin.table import render
    row = dict(flags=["--chunked-prefill-size", "8192"], twin_tpot_ms=100.0, model_tpot_ms=96.7,
               twin_output_tok_per_s=60.0, twin_decode_tok_per_s=80.0, model_tok_per_s=82.8,
               twin_ttft_ms=900.0, completed=8, waves=[1, 7], model_slots=[8])
    data = {"scenario": "seed-pp8", "pp": 8, "prompt_len": 1000, "output_len": 32,
            "calibration": {"k": 40, "host_tpot_ms": 130.0, "host_share": 0.1},
            "observed": [[8, 81.7]],
            "rows": [dict(row, setting="default", concurrency=8),
                     dict(row, setting="recommended", concurrency=8, twin_decode_tok_per_s=120.0,
                          model_tok_per_s=146.0, flags=["--chunked-prefill-size", "2048"])]}
    out = render(from_json(TwinData, data))
    assert "k = 40" in out and "81.7" in out and "1 7" in out
    assert "model of the run" in out and "-" in out.splitlines()[4]   # older rows: none
    data["rows"][0]["run_model_tpot_ms"] = 101.2
    assert "101.2 (+1%)" in render(from_json(TwinData, data))
    assert "+76%" in out and "+50%" in out       # model +76% (146 / 82.8), twin +50% (120 / 80)
    # the steady decode (SGLang's log) beside the model's steady loop, and its change
    data["rows"][0]["twin_steady_tpot_ms"] = 100.0
    data["rows"][1]["twin_steady_tpot_ms"] = 58.0
    out = render(from_json(TwinData, data))
    default = next(ln for ln in out.splitlines() if ln.startswith("default"))
    assert "100.0" in default and "-3%" in default          # model 96.7 against 100.0
    wi = next(ln for ln in out.splitlines() if ln.startswith("recommended") and "+76%" in ln)
    assert wi.split()[4:6] == ["+76%", "+72%"]              # model; twin steady 100 / 58


def test_the_cli_refuses_bad_input_in_one_line(capsys):
    from reports.cli import main
    for argv, word in ((["twin", "--concurrency", "0"], "--concurrency"),
                       (["twin", "--settings", "fastest"], "--settings"),
                       (["twin", "--k", "-1"], "--k")):
        rc = main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and word in err[0], err




def _async_costs_at_k_1000(seed, tmp_path, monkeypatch) -> dict:
    """The async costs of 8 ranks with no launch time, written at k = 1000 (milliseconds become
    seconds) where the hold reads them; the file as the hold reads it."""
    c = costs(seed, 8, mode="async")
    c = replace(c, ranks=tuple(replace(r, launch_us=0.0) for r in c.ranks))
    path = tmp_path / "twin-costs.json"
    write_costs(path, c, 1000.0)
    monkeypatch.setenv("PPSCOPE_TWIN_COSTS", str(path))
    return json.loads(path.read_text())


def test_async_device_time_travels_with_sglangs_messages(seed, hold, tmp_path, monkeypatch):
    """Two ranks' emulated devices on fakes of SGLang's objects: the forward returns at once,
    the hidden states carry their ready time (forward end + hop), the next rank's forward
    starts no earlier (its schedule stream holds their receive), and the CPU waits at the
    next slot's device-to-host sync for everything on the schedule stream: those tokens, the
    hidden states of the slot just run, this rank's previous forward (behind its hidden-state
    send). SGLang 0.5.23 scheduler_pp_mixin.py, its default path (SGLANG_PP_COMM_OVERLAP off)."""
    import time
    c = _async_costs_at_k_1000(seed, tmp_path, monkeypatch)
    mode = SimpleNamespace(is_decode=lambda: True)
    batch = SimpleNamespace(forward_mode=mode, batch_size=1, extend_num_tokens=None)
    runner = SimpleNamespace(pp_group=SimpleNamespace(rank_in_group=0))
    sched = SimpleNamespace(pp_group=SimpleNamespace(rank_in_group=0), mbs=[object(), None])
    forward = hold._forward(lambda self, fb: "out")
    launch = hold._launch(lambda self, mb, b, proxy: forward(runner, batch))  # run_batch
    sent = {}
    send = hold._send(lambda self, d, **k: sent.update(d))
    hold.reset_device()
    t0 = time.monotonic()
    assert launch(sched, 0, None, None) == "out"
    assert time.monotonic() - t0 < 0.5                  # the CPU went on at once
    end0 = hold._DEV["end"][0]
    assert end0 - t0 == pytest.approx(c["ranks"][0]["decode_us"][1] * 1e-3, abs=0.05)
    send(sched, {"hidden_states": SimpleNamespace(ndim=2, shape=(1, 8))}, msg_type="proxy")
    assert sent[hold.READY] == pytest.approx(end0 + c["hop_us"][1] * 1e-3)
    # the next forward on rank 0 waits for that send once SGLang commits it
    hold._commit_proxy(lambda self: None)(sched)
    assert hold._DEV["sched"] == pytest.approx(sent[hold.READY])
    # rank 1 (its own process in SGLang; here the same module state, reset): it starts when
    # the hidden states arrive, not when it is launched
    hold.reset_device()
    runner.pp_group.rank_in_group = 1
    sched.pp_group.rank_in_group = 1
    arrive = sent[hold.READY]
    recv = hold._recv_proxy(lambda self: SimpleNamespace(tensors={hold.READY: arrive}))
    recv(sched)
    launch(sched, 0, None, None)
    assert hold._DEV["end"][0] == pytest.approx(arrive + c["ranks"][1]["decode_us"][1] * 1e-3,
                                                abs=0.05)
    # the next slot's tokens are there already, but the sync waits for the schedule stream:
    # the hidden states just received
    early = time.monotonic()
    results = hold._results(lambda self, a, b: (SimpleNamespace(tensors={hold.READY: early}),
                                                None, None))
    process = hold._process(lambda self, *a: "processed")
    t1 = time.monotonic()
    results(sched, 1, 1)                               # slot 1 has no batch: no sync
    assert process(sched) == "processed" and time.monotonic() - t1 < 0.2
    results(sched, 1, 0)
    assert time.monotonic() - t1 < 0.2                 # the receive itself does not block
    process(sched)
    assert time.monotonic() >= arrive - 0.01


FIX = ROOT / "tests" / "fixtures" / "twin"


def _setting_changes() -> dict:
    """The twin's settings as the report's changes: the default, chunk 2048, and the pair."""
    from reports.model.settings_change import Change
    chunk = Change("--chunked-prefill-size", 2048)
    return {"default": (), "recommended": (chunk,),
            "pair": (chunk, Change("--pp-async-batch-depth", 0))}


def test_the_outputs_event_is_recorded_at_their_receive_in_sglangs_parity_order(seed, hold,
                                                                                 tmp_path,
                                                                                 monkeypatch):
    """SGLang 0.5.23 `_pp_send_recv_and_preprocess_output_tensors`: odd ranks receive the next
    slot's outputs before they send, and the device-to-host event is recorded at the receive
    (`copy_stream.wait_stream(schedule_stream)`). At depth 0 the last rank (odd) sends the
    tokens of the forward it just launched (`q_event`): its sync must not wait for that forward,
    or its GPU idles for the host work of every visit. Even ranks send first."""
    import time
    c = _async_costs_at_k_1000(seed, tmp_path, monkeypatch)
    last = len(c["ranks"]) - 1
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_decode=lambda: True), batch_size=4,
                            extend_num_tokens=None)
    runner = SimpleNamespace(pp_group=SimpleNamespace(rank_in_group=last))
    sched = SimpleNamespace(pp_group=SimpleNamespace(rank_in_group=last), mbs=[object()] * 2)
    forward = hold._forward(lambda self, fb: "out")
    launch = hold._launch(lambda self, mb, b, proxy: forward(runner, batch))
    prepare = hold._prepare_outputs(lambda self: {"next_token_ids": 1})
    send = hold._send(lambda self, d, **k: None)
    early = time.monotonic()
    recv = hold._recv_outputs(lambda self: ({hold.READY: early}, None))

    def odd(self, first_mb, next_mb):
        recv(self)
        send(self, prepare(self), msg_type="output")
        return None, None, None

    def even(self, first_mb, next_mb):
        send(self, prepare(self), msg_type="output")
        recv(self)
        return None, None, None

    got = {}
    for name, order in (("odd", odd), ("even", even)):
        hold.reset_device()
        launch(sched, 0, None, None)
        end0 = hold._DEV["end"][0]
        hold._results(order)(sched, 0, 1)
        got[name] = (hold._DEV["d2h"], end0, hold._DEV["out_sent"])
    d2h, end0, out_sent = got["odd"]
    assert d2h == pytest.approx(early) and end0 - d2h > 1.0   # not behind the forward
    assert out_sent > end0                    # the tokens leave once their forward ended
    d2h, end0, _ = got["even"]
    assert d2h >= end0                        # sent first: the event is behind the send
    # outputs without a time (SGLang skipped the message): the event behind the stream's work
    hold.reset_device()
    launch(sched, 0, None, None)
    hold._results(lambda self, a, b: (None, None, None))(sched, 0, 0)
    assert hold._DEV["d2h"] == pytest.approx(hold._DEV["end"][0])


def test_a_recorded_twin_keeps_its_books():
    """The seed's twin as recorded (PP8, SGLang 0.5.23 on the CPU; the shipped record before the
    cache flush, kept in tests/fixtures/twin/cached/): every row's figures
    are the bench's divided by k, the micro-batches are rank 0's own Prefill lines after the
    warm-up prompt, and the report's reader sets each setting's change beside the model's."""
    from reports.model.checks.twin_check import read_twin, twin_text
    import shutil
    doc = json.loads((FIX / "cached" / "seed-pp8.twin.json").read_text())["data"]
    cal = doc["calibration"]
    # k: the smallest that keeps this machine's own step under the target share, or the cap
    assert cal["host_share"] <= cal["target_share"] or cal["k"] == cal["max_k"]
    assert doc["costs"]["k"] == cal["k"] and doc["mode"] == "async" and doc["complete"]
    for r in doc["rows"]:
        # decode tok/s = C streams over the undilated TPOT
        assert r["twin_decode_tok_per_s"] == pytest.approx(r["concurrency"] * 1000.0 / r["twin_tpot_ms"])
        assert sum(r["waves"]) >= r["concurrency"]     # chunk continuations count again
    rec8 = next(r for r in doc["rows"] if r["setting"] == "recommended" and r["concurrency"] == 8)
    logged = waves((FIX / "recommended-prefill-pp0.log").read_text())
    n = len(rec8["waves"])
    # the server's own start-up request (22 tokens), bench_serving's warm-up prompt, then the run
    assert logged[2:2 + n] == rec8["waves"]
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(FIX / "cached" / "seed-pp8.twin.json", Path(d) / "twin.json")
        tw = read_twin(Path(d))
    text = twin_text(tw, whatif_row("--chunked-prefill-size", "2048"))
    assert "+85% at C=8 (model +76%)" in text


def test_the_built_in_report_carries_the_shipped_twin(tmp_path):
    """With no twin.json in results/, the built-in scenario's what-ifs carry its shipped twin
    run (configs/records/seed-pp8.twin.json), labelled as shipped; the answer table's cell says
    what the twin measured at the C where the herd holds most. A user's own twin.json wins, and
    one of another deployment is named in a warning and not used."""
    from reports.cli import main
    out = tmp_path / "r"
    out.mkdir()
    assert main(["report", "--results", str(out), "--no-cache"]) == 0
    rep = json.loads((out / "report.json").read_text())
    rec = rep["recommendation"]
    assert rec["setting"] == "2048" and "shipped with ppscope" in rec["twin"]
    assert "+87% at C=8 (model +76%)" in rec["twin"] and rec["twin_verdict"] == "agrees"
    assert "steady decode" in rec["twin"]
    md = (out / "report.md").read_text()
    table = md[:md.index("Biggest cause")]       # the answer table heads report.md
    assert "--chunked-prefill-size 2048: +76% at C=8 (twin +87%)" in table
    # the pair: +127% at C=8 against +109%, +68% at C=32 against +61%
    assert rep["best_pair"]["twin_verdict"] == "agrees"
    assert "expect the twin's" not in " ".join(rep["answer"])

    mine = json.loads((ROOT / "configs" / "records" / "seed-pp8.twin.json").read_text())
    mine["data"]["scenario"] = "another"
    (out / "twin.json").write_text(json.dumps(mine))
    assert main(["report", "--results", str(out), "--no-cache"]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["recommendation"].get("twin") is None
    assert any("twin.json describes another (PP8)" in w for w in rep["warnings"])


def test_the_twin_models_its_own_run():
    """Each twin row gets the model of that very run: rep 1's chunk-2048 run (SGLang admitted
    4, 3, 3, 1 with the warm-up prompt cached) modelled at 71.4 ms against the twin's 66.6."""
    from microbench.sglang_lab.twin.run import WARMUP_REQUESTS, _run_model
    records, warnings = load_records(Path("/nonexistent"))
    inp = build_inputs(load_scenario("seed-pp8"), records, warnings)
    d = json.loads((FIX / "reps" / "rep1.twin.json").read_text())["data"]
    row = next(r for r in d["rows"] if r["setting"] == "recommended")
    got = _run_model(inp, 8, row["completed"], d["output_len"], row["waves"],
                     _setting_changes()["recommended"], cached_prompts=WARMUP_REQUESTS)
    assert got == pytest.approx(row["twin_tpot_ms"], rel=0.10)
    assert _run_model(inp, 8, 8, 32, [], ()) is not None        # no logged waves: one burst


def test_the_table_gives_the_spread_of_repetitions():
    from microbench.sglang_lab.twin.table import render
    row = dict(flags=["--chunked-prefill-size", "8192"], model_tpot_ms=96.7,
               twin_output_tok_per_s=60.0, model_tok_per_s=82.8, twin_ttft_ms=900.0,
               completed=8, waves=[1, 7], model_slots=[8], concurrency=8)
    rows = []
    for rep, (base, chunk) in enumerate([(100.0, 60.0), (90.0, 50.0), (110.0, 55.0)], 1):
        rows += [dict(row, setting="default", rep=rep, twin_tpot_ms=base,
                      twin_decode_tok_per_s=8000.0 / base),
                 dict(row, setting="recommended", rep=rep, twin_tpot_ms=chunk,
                      twin_decode_tok_per_s=8000.0 / chunk, model_tok_per_s=146.0,
                      flags=["--chunked-prefill-size", "2048"])]
    out = render(from_json(TwinData, {"scenario": "seed-pp8", "pp": 8, "prompt_len": 1000,
                                      "output_len": 32, "calibration": {"k": 57}, "rows": rows}))
    spread = next(ln for ln in out.splitlines() if ln.startswith("default ") and "90.0-110.0" in ln)
    assert spread.split()[1:5] == ["8", "3", "100.0", "90.0-110.0"] and "20%" in spread
    # changes per repetition: +67%, +80%, +100%; the median +80%
    assert "+80% (+67% to +100%)" in out and "+76%" in out


def test_three_interleaved_runs_with_the_cache_flushed_support_both_settings(tmp_path):
    """tests/fixtures/twin/flush/: default, chunk 2048 and the pair at C = 8, three interleaved
    repetitions, bench_serving with --flush-cache. The report's reading of it: both changes
    agree with the model (within 25%), the pair gains more than the single setting, and the
    model of each run (every prompt prefilled) is within 10% of what SGLang's loop ran."""
    import shutil
    from microbench.sglang_lab.twin.run import _run_model
    from microbench.sglang_lab.twin.table import render
    from reports.model.checks.twin_check import AGREES, change_of, no_better, read_twin, verdict
    src = FIX / "flush" / "c8-reps3.twin.json"
    d = json.loads(src.read_text())["data"]
    assert d["flush_cache"] and d["reps"] == 3 and "schedule stream" in d["emulated"]
    assert [r.get("rep") for r in d["rows"]] == [1, 1, 1, 2, 2, 2, 3, 3, 3]   # interleaved
    shutil.copy(src, tmp_path / "twin.json")
    rec = read_twin(tmp_path)
    assert verdict(rec, whatif_row("--chunked-prefill-size", "2048")) == AGREES
    assert verdict(rec, whatif_row("--chunked-prefill-size + --pp-async-batch-depth", "2048 + 0")) == AGREES
    (pair,) = rec.changes[change_of("--chunked-prefill-size + --pp-async-batch-depth",
                                    "2048 + 0")]
    assert pair.runs == 3 and pair.lo <= pair.twin <= pair.hi
    single = SimpleNamespace(knob="--chunked-prefill-size", setting="2048")
    both = SimpleNamespace(knob="--chunked-prefill-size + --pp-async-batch-depth",
                           setting="2048 + 0")
    assert not no_better(rec, both, single)
    records, warnings = load_records(Path("/nonexistent"))
    inp = build_inputs(load_scenario("seed-pp8"), records, warnings)
    changes = _setting_changes()
    for r in d["rows"]:
        got = _run_model(inp, 8, r["completed"], d["output_len"], r["waves"], changes[r["setting"]])
        assert got == pytest.approx(r["twin_tpot_ms"], rel=0.10), r
    assert ("--chunked-prefill-size 2048 --pp-async-batch-depth 0"
            in render(from_json(TwinData, d)))


def _check_current_runs(d: dict, seed, tmp_path, src: Path) -> None:
    """What SGLang did in every run of a current-hold record, the model of each run and the
    steady loop within 10% of the twin's, and both what-ifs agree."""
    import shutil
    from microbench.sglang_lab.twin.run import _run_model
    from reports.model.checks.twin_check import AGREES, read_twin, verdict
    assert d["calibration"]["k"] == 60 and d["hold"] == "stream" and d["flush_cache"]
    changes = _setting_changes()
    for r in d["rows"]:
        C = r["concurrency"]
        assert sum(r["waves"]) >= C and r["completed"] == C
        if r["setting"] == "default" and C == 8:
            assert len(r["waves"]) >= 2            # the herd reached SGLang in two parts
        if r["setting"] != "default":
            assert max(r["waves"]) <= 3            # 2048 tokens: two prompts and a chunk
        run = _run_model(seed, C, r["completed"], d["output_len"], r["waves"],
                         changes[r["setting"]])
        assert run == pytest.approx(r["twin_tpot_ms"], rel=0.10), r
        steady = lb.run(seed, C, changes=changes[r["setting"]]).tpot_ms
        assert steady == pytest.approx(r["twin_steady_tpot_ms"], rel=0.10), r
    shutil.copy(src, tmp_path / "twin.json")
    rec = read_twin(tmp_path)
    assert verdict(rec, whatif_row("--chunked-prefill-size", "2048")) == AGREES
    assert verdict(rec, whatif_row("--chunked-prefill-size + --pp-async-batch-depth", "2048 + 0")) == AGREES


def test_repetitions_at_c32_and_c8_with_the_current_hold_and_tokenizer(tmp_path, seed):
    """tests/fixtures/twin/current/: default, chunk 2048 and the pair at C = 32 and 8, interleaved
    repetitions with the outputs' event at their receive and the lab model's tokenizer fixed
    (k = 60). What SGLang did in every run: the burst split as it arrived (never one slot of 8
    at C = 8), chunk 2048 admitting three at a time. The model of each run (SGLang's admission)
    within 10% of bench_serving's TPOT (the pair at C = 32 in run 2: -7%, with 43 of 1024 tokens
    reaching bench_serving without text: the lab model's special ids), the steady loop within
    10% of the twin's steady round, and both what-ifs agree at both C."""
    src = FIX / "current" / "c32-c8-reps.twin.json"
    d = json.loads(src.read_text())["data"]
    reps = max(r["rep"] for r in d["rows"])      # the run was stopped after two of three
    assert reps == 2 and len(d["rows"]) == 6 * reps and not d["complete"]
    assert [(r["rep"], r["setting"], r["concurrency"]) for r in d["rows"]] == [
        (rep, s, C) for rep in range(1, reps + 1) for s in ("default", "recommended", "pair")
        for C in (32, 8)]
    _check_current_runs(d, seed, tmp_path, src)


def test_third_repetition_at_c32(tmp_path, seed):
    """The third repetition at C = 32 (the record above stopped after two), one run per setting,
    k = 60: the default admitted as SGLang's default chunk allows (1 9 9 9 7), chunk 2048 and the
    pair three at a time; the same checks as the two repetitions'."""
    src = FIX / "current" / "c32-rep3.twin.json"
    d = json.loads(src.read_text())["data"]
    assert d["complete"] and [(r["setting"], r["concurrency"]) for r in d["rows"]] == [
        ("default", 32), ("recommended", 32), ("pair", 32)]
    assert d["rows"][0]["waves"][1:] == [9, 9, 9, 7]       # 8192 tokens: eight prompts and a chunk
    _check_current_runs(d, seed, tmp_path, src)


def test_the_cost_file_is_one_payload_written_at_the_runs_k(seed, tmp_path):
    """Both builders give the times alone (k is not theirs), the one writer sets k, and a cost
    file read back is checked field by field."""
    from reports.base.schema import SchemaError
    table = costs(seed, 8)
    assert isinstance(table, TwinCosts) and table.k == 0.0
    path = tmp_path / "twin-costs.json"
    at60 = write_costs(path, table, 60.0)
    assert at60 == replace(table, k=60.0)
    assert from_json(TwinCosts, json.loads(path.read_text())) == at60
    bad = json.loads(path.read_text())
    bad["ranks"][2]["decode_us"][3] = -1.0
    with pytest.raises(SchemaError, match=r"ranks\[2\]\.decode_us\[3\]"):
        from_json(TwinCosts, bad)
    with pytest.raises(SchemaError, match="mode"):
        from_json(TwinCosts, dict(bad, mode="gpu"))


def test_the_model_of_each_run_is_set_beside_it_after_the_runs(seed):
    """The measurement takes no model figure; `model_figures` gives them after the runs, the
    very numbers the shipped record holds (configs/records/seed-pp8.twin.json: one run of each
    setting)."""
    from microbench.sglang_lab.twin.run import TwinSetting, model_figures
    d = json.loads((ROOT / "configs" / "records" / "seed-pp8.twin.json").read_text())["data"]
    changes = _setting_changes()
    picked = {r["setting"]: r for r in d["rows"] if r["concurrency"] == 8}
    assert set(picked) == set(changes)
    for name, row in picked.items():
        got = model_figures(seed, TwinSetting(name, tuple(row["flags"]), changes[name]), row,
                            d["output_len"])
        assert got == {k: pytest.approx(row[k], rel=1e-9) for k in got}, name


def test_the_twins_servers_come_from_the_rows_own_changes(seed):
    """The recommendation's and the pair's servers are started from each WhatIf's own changes
    (no display strings split): the flags the shipped record's servers ran with."""
    from microbench.sglang_lab.twin.cli import settings_to_run
    got = {s.name: s for s in settings_to_run(seed, ["default", "recommended", "pair"])}
    shipped = json.loads((Path(__file__).resolve().parents[1] / "configs" / "records"
                          / "seed-pp8.twin.json").read_text())["data"]["rows"]
    for row in shipped:
        assert list(got[row["setting"]].flags) == row["flags"], row["setting"]
    assert [(c.flag, c.value) for c in got["pair"].changes] == [
        ("--chunked-prefill-size", 2048), ("--pp-async-batch-depth", 0)]
