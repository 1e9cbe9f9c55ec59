"""Dispatch probe on real GPUs (skipped without them)."""
from __future__ import annotations

import dataclasses

import pytest

from microbench.dispatch import probe as D


def _small():
    from reports.base.model_config import load_model
    return dataclasses.replace(load_model("kimi-k2"), hidden=256, moe_intermediate=128,
                               n_routed_experts=16, top_k=4).all_formats("bf16")


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["auto", "triton", "fast", "plain"])
def test_moe_stage_matches_reference_and_graph_replay_equals_eager(variant):
    import torch

    from microbench.kernels import layers as L
    from microbench.kernels import moe_triton as MT
    from microbench.dispatch.pp_stage import build_moe_stage, capture_graphs
    dev = torch.device("cuda")
    m = _small()
    if variant == "triton" and MT.available():
        pytest.skip(MT.available())
    # largest forward 4 x 80 = 320 rows: every block-size row of moe_triton.CONFIGS is checked
    cfg = {"model": "kimi-k2", "layers_per_stage": 2, "graphs": True, "moe_variant": variant,
           "concurrency": [1, 4], "prompt_len": 80, "max_micro_batch": 512}
    fwd, info = build_moe_stage(torch, cfg, 0, dev, model=m)
    want_backend = {"auto": "torch/fast" if MT.available() else "triton/fast",
                    "triton": "triton/fast", "fast": "torch/fast", "plain": "torch/plain"}
    assert info["moe_backend"] == want_backend[variant], info
    assert info["moe_fallbacks"] == {} and info["moe_check_rel_err"] <= L.REL_TOL
    if info["moe_backend"] == "triton/fast":
        assert info["moe_checked_batches"] == [1, 5, 17, 65, 257]
    # each of the stage's layers against the float32 per-expert reference on the *same* input
    # and routed ids. Comparing two chained layers end to end is not a valid check: the router
    # is discontinuous, so a last-bit difference in layer 1's output (plain's index_add_ adds
    # with atomics, in a varying order) can flip a near-tie expert choice in layer 2 and move
    # the result by 0.1-0.2, which is what made this test fail 2 runs in 9 before.
    gen = torch.Generator(device=dev).manual_seed(1234)
    x = torch.randn(5, 256, device=dev, dtype=torch.bfloat16, generator=gen)
    from microbench.dispatch.pp_stage import stage_forward
    x_in, outs = x, []
    for w in fwd.weights:
        ids, tw = L.moe_route(w, x_in)
        y = fwd.experts(w, x_in, ids, tw)
        assert L.rel_err(y, L.moe_reference(w, x_in, ids, tw)) < 3e-2
        outs.append(y)
        x_in = x_in + y
    if variant == "plain":
        # atomics: last bits differ run to run, and over two chained layers that can flip a
        # near-tie routing choice in layer 2 (a 0.1-0.2 change, 1 run in 9 on an H200). One
        # layer sees the same input, hence the same routing: only the last bits may differ.
        one = stage_forward(L, fwd.weights[:1], fwd.experts)
        assert L.rel_err(one(x), x + outs[0]) < 1e-2
    else:
        assert torch.equal(fwd(x), x_in)     # same kernels, same inputs: bit for bit
    # graph replay == eager at the same size (padded rows included): bit for bit, except
    # `plain`, whose index_add_ combine adds with atomics (order, hence rounding, varies); its
    # graph holds one layer, since over two a last-bit difference can flip layer 2's routing
    if variant == "plain":
        fwd = stage_forward(L, fwd.weights[:1], fwd.experts)
    graphs = capture_graphs(torch, fwd, [8, 40], 256, dev)
    for b, rows in ((8, 5), (40, 33)):
        g, gx, gy = graphs[b]
        gx[:rows].copy_(torch.randn(rows, 256, device=dev, dtype=torch.bfloat16, generator=gen))
        g.replay()
        torch.cuda.synchronize()
        eager = fwd(gx)
        if variant == "plain":
            assert L.rel_err(gy, eager) < 1e-2, (variant, b)
        else:
            assert torch.equal(gy, eager), (variant, b)


@pytest.mark.multigpu
def test_pp2_busy_loop_end_to_end(tmp_path):
    cfg = D.DispatchConfig(pp=2, work="busy", cost_us="1:300,4:400", concurrency=(1, 4),
                           seconds_per_point=0.5, json_path=str(tmp_path / "d.json"),
                           timeout_s=300)
    rec, _ = D.run(cfg)   # (record, the writer's note)
    assert rec.status == "ok", rec.reason
    runs = {(r["policy"], r["concurrency"]): r for r in rec.data["runs"]}
    assert runs[("sglang", 4)]["slot_sizes"] == [4, 0, 0, 0]
    assert runs[("even", 4)]["slot_sizes"] == [2, 0, 2, 0]
    assert all(r["tok_per_s"] > 0 for r in runs.values())
    assert (tmp_path / "d.trace.json").exists()
    assert rec.data["config"]["moe_backend"] is None


@pytest.mark.multigpu
def test_pp2_moe_loop_runs_the_backend_stage_cost_picks(tmp_path):
    """Real K2 dims, one MoE layer per stage, graphs on: the default (auto) runs the fused
    Triton kernel on both ranks and says so."""
    from microbench.kernels import moe_triton as MT
    cfg = D.DispatchConfig(pp=2, work="moe", layers_per_stage=1, concurrency=(1, 8),
                           seconds_per_point=0.5, json_path=str(tmp_path / "d.json"),
                           timeout_s=300)
    rec, _ = D.run(cfg)   # (record, the writer's note)
    assert rec.status == "ok", rec.reason
    want = "torch/fast" if MT.available() else "triton/fast"
    c = rec.data["config"]
    assert c["moe_variant"] == "auto" and c["moe_backend"] == want
    assert [rec.data["ranks"][r]["moe_backend"] for r in ("0", "1")] == [want, want]
    assert all(r["tok_per_s"] > 0 for r in rec.data["runs"])


@pytest.mark.multigpu
def test_pp2_serve_mode_under_torchrun(tmp_path):
    """`--serve` on 2 GPUs: the live probe (a load, a pp_max_micro_batch_size sweep, a profile)
    against rank 0's endpoint while the loop runs, then the session's record."""
    import socket
    import threading
    import time
    import urllib.request

    from microbench.sglang import live as sglang_live
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = D.DispatchConfig(pp=2, work="busy", cost_us="1:300,4:400", max_running_requests=8,
                           policies=("sglang",), serve=f"127.0.0.1:{port}", serve_seconds=30,
                           json_path=str(tmp_path / "d.json"), timeout_s=300,
                           profile_dir=str(tmp_path / "default"))
    out = {}
    th = threading.Thread(target=lambda: out.update(r=D.run(cfg)), daemon=True)
    th.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                break
        except OSError:
            time.sleep(0.5)
    res = sglang_live.run_live(sglang_live.LiveConfig(
        url=url, concurrency=4, max_tokens=8, timeout_s=60, mmb_sweep=(1, 2), profile=True,
        trace_dir=str(tmp_path / "traces"), profile_steps=1000))
    assert res["runs"][0]["chunks"] == 32 and res["runs"][0]["streams_ok"] == 4
    assert [x["status"] for x in res["mmb_sweep"]] == ["ok", "ok"]
    assert sorted(res["profile"]["traces"]["ranks"]) == ["0", "1"]
    th.join(120)
    rec, _ = out["r"]
    assert rec.status == "ok", rec.reason
    (run,) = rec.data["runs"]
    assert run["arrival"] == "served" and run["tok_per_s"] > 0
