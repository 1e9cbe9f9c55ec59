"""The dispatch probe's MoE stage is microbench.kernels.layers' MoE (the layer stage-cost times), on CPU."""
from __future__ import annotations

import dataclasses
import re

import pytest

torch = pytest.importorskip("torch")

from microbench.kernels import layers as L  # noqa: E402
from microbench.dispatch.pp_stage import build_moe_stage  # noqa: E402
from reports.base.model_config import load_model  # noqa: E402

CFG = {"model": "kimi-k2", "layers_per_stage": 2, "graphs": True, "moe_variant": "fast"}


def small():
    # K2's structure (sigmoid router, top-k, one shared expert) at toy dimensions
    return dataclasses.replace(load_model("kimi-k2"), hidden=256, moe_intermediate=128,
                               n_routed_experts=16, top_k=4).all_formats("bf16")


def test_stage_is_layers_moe_and_matches_float32_reference():
    if L.grouped_mm_available(torch.device("cpu")):
        pytest.skip("torch._grouped_mm does not run on this CPU build")
    m, dev = small(), torch.device("cpu")
    fwd, info = build_moe_stage(torch, CFG, 1, dev, model=m, free_bytes=10**12)
    assert info["moe_backend"] == "torch/fast"
    assert info["layers_used"] == 2 and info["note"] is None
    assert info["layer_bytes"] == L.moe_weight_bytes(m) == 2 * (16 * 256 + 17 * 3 * 256 * 128)
    assert info["moe_check_rel_err"] <= L.REL_TOL
    # same seeds -> the same weights: rebuild them and run the float32 per-expert reference
    ws = [L.make_moe_weights(m, "fast", dev, seed=1000 * 1 + i) for i in range(2)]
    g = torch.Generator().manual_seed(7)
    x = torch.randn(6, 256, generator=g).to(torch.bfloat16)
    got = fwd(x).float()
    want = x.float()
    for w in ws:
        ids, tw = L.moe_route(w, want.to(torch.bfloat16))
        want = want + L.moe_reference(w, want.to(torch.bfloat16), ids, tw)
    err = float((got - want).norm() / (want - x.float()).norm())
    assert err < 3e-2


def test_stage_keeps_what_fits_and_says_so():
    m = small()
    per = L.moe_weight_bytes(m)
    if L.grouped_mm_available(torch.device("cpu")):
        pytest.skip("torch._grouped_mm does not run on this CPU build")
    _, info = build_moe_stage(torch, CFG, 0, torch.device("cpu"), model=m,
                              free_bytes=int(1.5 * per / 0.85))
    assert info["layers_used"] == 1
    assert info["note"] == "only 1 of 2 layers fit in GPU memory"
    with pytest.raises(RuntimeError, match="one MoE layer needs .* GB free; use --work busy"):
        build_moe_stage(torch, CFG, 0, torch.device("cpu"), model=m, free_bytes=per // 2)


# ---------------------------------------------------------------- backend choice (as stage-cost)

def test_moe_candidates_exact():
    from microbench.dispatch.pp_stage import moe_candidates

    def c(req, cuda=True, triton=None, gmm=None):
        return moe_candidates(req, on_cuda=cuda, triton_reason=triton, grouped_mm_reason=gmm)
    # auto: triton first only on a CUDA device where triton imports; then fast, else loop
    assert c("auto") == ["triton", "fast"]
    assert c("auto", triton="triton is not installed") == ["fast"]
    assert c("auto", cuda=False) == ["fast"]
    assert c("auto", gmm="no _grouped_mm") == ["triton", "loop"]
    assert c("auto", cuda=False, gmm="no _grouped_mm") == ["loop"]
    assert c("auto", triton="triton is not installed", gmm="no _grouped_mm") == ["loop"]
    # forced: alone, or a one-line reason; never a silent substitute
    assert c("triton") == ["triton"] and c("triton", cuda=False) == ["triton"]
    assert c("fast", triton="x") == ["fast"] and c("plain", cuda=False) == ["plain"]
    with pytest.raises(RuntimeError, match="^--moe-variant triton: triton is not installed$"):
        c("triton", triton="triton is not installed")
    with pytest.raises(RuntimeError, match="^--moe-variant plain: no _grouped_mm$"):
        c("plain", gmm="no _grouped_mm")
    with pytest.raises(ValueError, match="unknown --moe-variant 'grouped'"):
        c("grouped")


def test_triton_check_batches_one_per_config_row(monkeypatch):
    from microbench.kernels import moe_triton as MT
    from microbench.dispatch.pp_stage import triton_check_batches
    monkeypatch.setattr(MT, "CONFIGS", ((4, None), (16, None), (64, None), (1 << 30, None)))
    assert triton_check_batches(1) == [1]
    assert triton_check_batches(4) == [1]
    assert triton_check_batches(5) == [1, 5]
    assert triton_check_batches(64) == [1, 5, 17]
    assert triton_check_batches(512) == [1, 5, 17, 65]


def test_loop_max_rows():
    from microbench.dispatch.pp_stage import loop_max_rows
    # prefill of all 32 streams x 16 tokens dominates the decode size (32)
    assert loop_max_rows({"concurrency": [1, 8, 32], "prompt_len": 16,
                          "max_micro_batch": 512}) == 512
    # decode 41 pads to the capture size 48 (range(16, 257, 8))
    assert loop_max_rows({"concurrency": [41], "prompt_len": 1, "max_micro_batch": 512}) == 48
    # cap 10 per slot pads to 12; the 41-row prefill is larger
    assert loop_max_rows({"concurrency": [41], "prompt_len": 1, "max_micro_batch": 10}) == 41


def test_auto_on_cpu_runs_torch_fast_and_records_the_choice():
    if L.grouped_mm_available(torch.device("cpu")):
        pytest.skip("torch._grouped_mm does not run on this CPU build")
    _, info = build_moe_stage(torch, {**CFG, "moe_variant": "auto"}, 0, torch.device("cpu"),
                              model=small(), free_bytes=10**12)
    assert info["moe_backend"] == "torch/fast" and info["moe_variant_requested"] == "auto"
    assert info["moe_candidates"] == ["fast"] and info["moe_fallbacks"] == {}
    assert info["moe_checked_batches"] == [5]


def _triton_interpreted():
    import importlib.util
    if importlib.util.find_spec("triton") is None:
        return False
    import sys
    if "triton" not in sys.modules and not torch.cuda.is_available():
        import os
        os.environ["TRITON_INTERPRET"] = "1"  # read when triton is first imported
    import triton
    return bool(triton.knobs.runtime.interpret)


def _reference_stage(m, x, layout: str, rank: int, n: int = 2):
    ws = [L.make_moe_weights(m, layout, torch.device("cpu"), seed=1000 * rank + i)
          for i in range(n)]
    want = x.float()
    for w in ws:
        ids, tw = L.moe_route(w, want.to(torch.bfloat16))
        want = want + L.moe_reference(w, want.to(torch.bfloat16), ids, tw)
    return want


def test_forced_triton_stage_matches_float32_reference_in_interpreter():
    if not _triton_interpreted():
        pytest.skip("needs triton imported with TRITON_INTERPRET=1 (CPU)")
    from microbench.dispatch.pp_stage import triton_check_batches
    m = small()
    cfg = {**CFG, "moe_variant": "triton", "concurrency": [1], "prompt_len": 20,
           "max_micro_batch": 512}                    # largest forward: a 20-token prefill
    fwd, info = build_moe_stage(torch, cfg, 1, torch.device("cpu"), model=m, free_bytes=10**12)
    assert info["moe_backend"] == "triton/fast" and info["moe_candidates"] == ["triton"]
    assert info["moe_checked_batches"] == sorted({5, *triton_check_batches(20)})
    assert info["moe_check_rel_err"] <= L.REL_TOL
    x = torch.randn(6, 256, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    want = _reference_stage(m, x, "fast", rank=1)
    assert float((fwd(x).float() - want).norm() / (want - x.float()).norm()) < 3e-2


def test_failed_check_falls_back_to_next_candidate_and_says_why(monkeypatch):
    if L.grouped_mm_available(torch.device("cpu")):
        pytest.skip("torch._grouped_mm does not run on this CPU build")
    from microbench.kernels import moe_triton as MT
    from microbench.dispatch import pp_stage as P
    monkeypatch.setattr(MT, "available", lambda: None)
    # a kernel that returns the wrong answer (half the right one) must not be timed
    monkeypatch.setattr(MT, "moe_experts", lambda w, x, ids, tw, cfg=None:
                        0.5 * L.moe_experts_fast(w, x, ids, tw))
    monkeypatch.setattr(P, "moe_candidates", lambda req, **kw: ["triton", "fast"])
    _, info = build_moe_stage(torch, {**CFG, "moe_variant": "auto"}, 0, torch.device("cpu"),
                              model=small(), free_bytes=10**12)
    assert info["moe_backend"] == "torch/fast"
    assert list(info["moe_fallbacks"]) == ["triton"]
    assert re.match(r"CheckFailed: moe experts \(triton/fast\): relative error 0\.[45]\d* > 0\.02 ",
                    info["moe_fallbacks"]["triton"])
    monkeypatch.setattr(P, "moe_candidates", lambda req, **kw: ["triton"])
    with pytest.raises(RuntimeError, match=r"^rank 0: MoE backend triton: moe experts "
                                           r"\(triton/fast\): relative error 0\.[45]"):
        build_moe_stage(torch, {**CFG, "moe_variant": "triton"}, 0, torch.device("cpu"),
                        model=small(), free_bytes=10**12)


def test_loop_backend_cannot_be_graphed(monkeypatch):
    from microbench.dispatch import pp_stage as P
    monkeypatch.setattr(P, "moe_candidates", lambda req, **kw: ["loop"])
    with pytest.raises(RuntimeError, match="torch/loop syncs the host .* --no-graphs"):
        build_moe_stage(torch, {**CFG, "moe_variant": "auto"}, 0, torch.device("cpu"),
                        model=small(), free_bytes=10**12)
    _, info = build_moe_stage(torch, {**CFG, "moe_variant": "auto", "graphs": False}, 0,
                              torch.device("cpu"), model=small(), free_bytes=10**12)
    assert info["moe_backend"] == "torch/loop"


def test_record_names_the_backend_the_ranks_ran():
    from microbench.dispatch import probe as D
    same = {"0": {"moe_backend": "triton/fast"}, "1": {"moe_backend": "triton/fast"}}
    assert D.moe_backend_of(same) == "triton/fast"
    mixed = {"0": {"moe_backend": "triton/fast"}, "1": {"moe_backend": "torch/fast"}}
    assert D.moe_backend_of(mixed) == "torch/fast,triton/fast"
    assert D.moe_backend_of({"0": {"layers_used": 0}, "1": {}}) is None


def test_cli_default_is_auto_and_reaches_the_ranks():
    import argparse

    from microbench.dispatch import probe as D
    from microbench.dispatch import cli as dispatch_cli
    ap = argparse.ArgumentParser()
    dispatch_cli.register(ap.add_subparsers())
    cfg = dispatch_cli.config_from_args(ap.parse_args(["dispatch", "--pp", "2"]), 2)
    assert cfg.moe_variant == "auto" and D.loop_config(cfg)["moe_variant"] == "auto"
    cfg = dispatch_cli.config_from_args(
        ap.parse_args(["dispatch", "--pp", "2", "--moe-variant", "triton"]), 2)
    assert D.loop_config(cfg)["moe_variant"] == "triton"


def test_loop_max_rows_within_the_prefill_budget():
    from microbench.dispatch.pp_stage import loop_max_rows
    # 64 prompts of 1000 tokens: one visit prefills at most the 8192-token chunk budget
    assert loop_max_rows({"concurrency": [64], "prompt_len": 1000, "max_micro_batch": 512,
                          "chunked_prefill_size": 8192}) == 8192
    # chunking off: max_prefill_tokens, or one whole prompt beyond it
    assert loop_max_rows({"concurrency": [64], "prompt_len": 1000, "max_micro_batch": 512,
                          "chunked_prefill_size": -1}) == 16384
    assert loop_max_rows({"concurrency": [2], "prompt_len": 20000, "max_micro_batch": 512,
                          "chunked_prefill_size": None}) == 20000
