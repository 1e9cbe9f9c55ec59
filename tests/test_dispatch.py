"""Dispatch probe: pure pieces (summaries, trace, parsing, CLI errors) on synthetic rank data."""
from __future__ import annotations

import json

import pytest

from microbench.dispatch import probe as D
from reports.base.payloads.dispatch import DispatchData, PolicyRun, StageRun
from reports.base.schema import from_json, to_json
from microbench.dispatch.pp_loop import arrival_times, parse_cost_curve
from microbench.dispatch.pp_stage import interp_cost
from reports.base.cuda_graphs import padded
from reports.base.cuda_graphs import capture_sizes as sglang_capture_sizes
from reports import cli
from reports.base.records import read_record

MS = 1e-3


def test_run_summary_throughput_and_tpot(fake_rank):
    ranks = [fake_rank(0, 0.0), fake_rank(1, 0.0)]
    run = D.run_summary([r["points"][0] for r in ranks])
    # window it 4..12 = 8 ms; decodes at it 4 and 8 (it 12 closes the window): 16 tokens
    assert run.decode_tokens == 16
    assert run.window_s == pytest.approx(8 * MS)
    assert run.tok_per_s == pytest.approx(2000.0)
    assert run.tpot_ms == pytest.approx(4.0)      # 8 ms / 2 visits of slot 0
    assert run.slot_sizes == (8, 0, 0, 0)


def test_stage_summary_numbers(fake_rank):
    st = D.stage_summary(fake_rank(0, 0.0)["points"][0])
    assert st.dispatch_latency_us.p50 == pytest.approx(100.0)
    assert st.dispatch_latency_us.n == 3
    assert st.gpu_us_p50 == {"8": pytest.approx(500.0)}
    assert st.send_us_p50 == pytest.approx(30.0)
    assert st.wait_us_p50 == 0.0                  # 3 of 9 measured iterations waited 50
    assert st.host_us_p50 == pytest.approx(300.0)
    assert st.busy_frac == pytest.approx(1.5 / 8.5)  # 3 x 0.5 ms over fs(4)..fe(12)
    assert len(st.busy_frac_series) == 20


def test_hop_in_loop_is_sender_end_to_receiver_input(fake_rank):
    h = D.hop_in_loop([fake_rank(0, 0.0)["points"][0], fake_rank(1, 0.0)["points"][0]])
    assert h.by_hop["0->1"].n == 4
    assert h.p50_us == pytest.approx(40.0)


def _run(policy, tok, sizes, gpu, busy=0.5, c=8):
    return PolicyRun(policy=policy, arrival="burst", concurrency=c, tok_per_s=tok,
                     slot_sizes=tuple(sizes), stages=(StageRun(0, busy, gpu_us_p50=gpu),))


def test_even_vs_sglang_explains_a_loss_with_numbers():
    runs = [_run("sglang", 1000.0, [8, 0, 0, 0], {"8": 900.0}),
            _run("even", 900.0, [4, 0, 4, 0], {"4": 850.0})]
    (row,) = D.compare_policies(runs, pp=2)
    assert row.ratio == pytest.approx(0.9)
    why = row.why_not
    assert "850 us at b=4" in why and "900 us at b=8" in why
    assert "1700 us of stage time for even vs 900 us for sglang" in why
    assert "re-reads the experts" in why


def test_even_vs_sglang_gain_has_no_excuse():
    runs = [_run("sglang", 1000.0, [8, 0, 0, 0], {"8": 900.0}),
            _run("even", 1500.0, [4, 0, 4, 0], {"4": 500.0})]
    assert D.compare_policies(runs, pp=2)[0].why_not is None
    one = [_run("sglang", 400.0, [1, 0, 0, 0], {"1": 800.0}, c=1),
           _run("even", 400.0, [1, 0, 0, 0], {"1": 800.0}, c=1)]
    assert "cannot be split" in D.compare_policies(one, pp=2)[0].why_not


def test_summarize_matches_the_interface(fake_rank):
    ranks = [fake_rank(0, 0.0), fake_rank(1, 0.0)]
    lcfg = {"pp": 2, "async_depth": 2, "max_micro_batch": 512, "micro_batches": None,
            "work": "moe", "layers_per_stage": 2, "model": "kimi-k2", "graphs": True,
            "prompt_len": 16, "cost_points": []}
    d = D.summarize(lcfg, ranks, nccl_p2p_disabled=False)
    assert d.config.slots == 4 and d.config.layers_per_stage == 2
    assert d.runs[0].stages[1].rank == 1
    assert d.hop_us_in_loop == pytest.approx(40.0)
    back = from_json(DispatchData, json.loads(json.dumps(to_json(d), allow_nan=False)))
    assert back == d  # the record's JSON reads back to the same payload


def test_trace_has_stage_and_slot_tracks(fake_rank):
    tr = D.build_trace([fake_rank(0, 0.0), fake_rank(1, 0.0)])
    ev = tr["traceEvents"]
    names = {e["args"]["name"] for e in ev if e["ph"] == "M"}
    assert {"stage 0", "stage 1", "slots", "slot 0", "slot 3", "GPU forward"} <= names
    fwd0 = [e for e in ev if e["ph"] == "X" and e["pid"] == 0 and e["tid"] == 1]
    assert len(fwd0) == 4
    passages = [e for e in ev if e["ph"] == "X" and e["pid"] == 2]
    assert [e["name"] for e in passages] == ["prefill n=8"] + ["decode n=8"] * 3
    # slot passage = rank 0 forward start .. rank 1 forward end = 0.5 + 0.04 + 0.01 + 0.5 ms
    assert passages[1]["dur"] == pytest.approx(1050.0, abs=1e-3)
    assert any(e["ph"] == "C" for e in ev)


def test_cost_curve_and_capture_sizes():
    pts = parse_cost_curve("8:900, 1:800,32:1200")
    assert pts == [(1, 800.0), (8, 900.0), (32, 1200.0)]
    assert interp_cost(pts, 1) == 800.0
    assert interp_cost(pts, 4.5) == pytest.approx(850.0)
    assert interp_cost(pts, 20) == pytest.approx(1050.0)
    assert interp_cost(pts, 56) == pytest.approx(1500.0)   # last slope 12.5 us per request
    for bad in ("", "1:0", "x:3", "1:5,1:6", "4"):
        with pytest.raises(ValueError):
            parse_cost_curve(bad)
    assert sglang_capture_sizes(40) == [1, 2, 4, 8, 12, 16, 24, 32, 40]
    assert padded(5, 8) == 8
    assert padded(9, 8) is None


def test_arrivals():
    assert arrival_times("burst", 3, 2.0, 100.0, 0) == [0.0, 0.0, 0.0]
    assert arrival_times("staggered", 3, 2.0, 100.0, 0) == pytest.approx([0.0, 0.002, 0.004])
    p = arrival_times("poisson", 50, 2.0, 100.0, 0)
    assert p == arrival_times("poisson", 50, 2.0, 100.0, 0) and p == sorted(p)
    assert 0.2 < p[-1] < 1.0                      # ~49 gaps of 10 ms


def test_resolve_pp():
    assert D.resolve_pp("auto", 8) == 8
    assert D.resolve_pp("2", 8) == 2
    with pytest.raises(ValueError, match="only 2 are visible"):
        D.resolve_pp("8", 2)
    with pytest.raises(ValueError, match=">= 2"):
        D.resolve_pp("1", 2)


def test_loop_config_points_and_cap():
    cfg = D.DispatchConfig(pp=8, max_running_requests=32, concurrency=(1, 8),
                           policies=("sglang", "even"))
    lc = D.loop_config(cfg)
    assert lc["async_depth"] == 8 and lc["max_micro_batch"] == 4   # 32 // 8
    assert lc["hidden"] == 7168 and lc["n_routed_experts"] == 384
    assert len(lc["points"]) == 4
    cmd = D.torchrun_command(cfg, D.Path("c.json"), D.Path("o"))
    assert cmd[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "8",
                       "-m", "microbench.dispatch.pp_loop", "--config", "c.json", "--out-dir", "o"]


def test_cli_pp_too_large_is_one_line_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(D, "available", lambda: None)
    monkeypatch.setattr(D, "visible_gpus", lambda: 2)
    rc = cli.main(["dispatch", "--pp", "8", "--json", str(tmp_path / "d.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "only 2 are visible" in err[0]


def test_cli_waived_without_gpus(monkeypatch, tmp_path):
    monkeypatch.setattr(D, "available", lambda: "needs at least 2 GPUs for a pipeline, 0 visible")
    monkeypatch.setattr(D, "visible_gpus", lambda: 0)
    p = tmp_path / "d.json"
    assert cli.main(["dispatch", "--json", str(p)]) == 2
    rec = read_record(p)
    assert rec.status == "waived" and "2 GPUs" in rec.reason


def test_parse_inject_forms_and_errors():
    from reports.base.inject import parse_inject
    got = parse_inject(["slow-stage=1:1.5", "host-delay=0:800", "hop-delay=300"], pp=2)
    assert got == {"slow_stage": {1: 1.5}, "host_delay_us": {0: 800.0}, "hop_delay_us": 300.0}
    assert parse_inject([], pp=2) == {"slow_stage": {}, "host_delay_us": {}, "hop_delay_us": 0.0}
    for bad in ("slow-stage=2:1.5", "slow-stage=1:0.5", "host-delay=0:nan", "hop-delay=-1",
                "warp=1", "slow-stage"):
        with pytest.raises(ValueError, match="--inject"):
            parse_inject([bad], pp=2)


def test_sglang_log_lines_read_back_by_the_log_reader(tmp_path, fake_rank):
    from microbench.dispatch.pp_loop import sglang_log_lines
    from microbench.sglang import log as sglang_log
    pt = fake_rank(1, 0.0)["points"][0]
    lines = sglang_log_lines(pt, prompt_len=16, graphs_on=True, capture=[1, 2, 4, 8])
    assert lines[0].startswith("[") and " PP1] Prefill batch, #new-seq: 8, #new-token: 128" in lines[0]
    assert all(" PP1] Decode batch, #running-req: 8, " in ln for ln in lines[1:])
    assert "cuda graph: True" in lines[1]
    assert not any(ln.endswith(", ") for ln in lines)   # 0.5.23 ends with the last field
    # stamped when the result is processed: 4 ms between slot 0's results, gen throughput
    # = its 8 tokens over that gap
    assert "gen throughput (token/s): 2000.00" in lines[2]
    f = tmp_path / "x-PP-1.log"
    f.write_text("\n".join(lines) + "\n")
    s = sglang_log.read_logs([f], window=4)
    assert s.ranks["1"].decode_lines == len(lines) - 1
    assert s.ranks["1"].running_req.max == 8


def test_the_trace_is_committed_with_its_record(fake_rank, tmp_path, disk_full_for):
    lcfg = {"pp": 2, "async_depth": 2, "max_micro_batch": 512, "micro_batches": None,
            "work": "moe", "layers_per_stage": 2, "model": "kimi-k2", "graphs": True,
            "prompt_len": 16, "cost_points": []}
    work = tmp_path / "work"
    work.mkdir()
    for r in (0, 1):
        (work / f"rank{r}.json").write_text(json.dumps(fake_rank(r, 0.0)))
    cfg = D.DispatchConfig(json_path=str(tmp_path / "dispatch.json"))
    D._finish(cfg, lcfg, work, False, "ok", None, ["ppscope", "dispatch"])
    rec, trace = tmp_path / "dispatch.json", tmp_path / "dispatch.trace.json"
    before = rec.read_bytes(), trace.read_bytes()
    # the trace cannot be written: the record is not replaced either (one write_files)
    disk_full_for("dispatch.trace.json")
    with pytest.raises(OSError):
        D._finish(cfg, lcfg, work, False, "ok", None, ["ppscope", "dispatch", "again"])
    assert (rec.read_bytes(), trace.read_bytes()) == before
    # an interrupted run goes beside the good record and leaves its trace alone
    disk_full_for(None)
    _, note = D._finish(cfg, lcfg, work, False, "partial", "interrupted", ["ppscope", "dispatch"])
    assert "kept the ok record" in note
    assert (rec.read_bytes(), trace.read_bytes()) == before
    assert read_record(rec).status == "ok"
