"""`--moe-backends sglang` in the served formats (microbench/kernels/moe_sglang.py), on the CPU
against a stand-in `sglang` module whose `fused_experts` reads the weights as SGLang 0.5.23's
kernels index them (kernels/ops/moe/fused_moe_triton_kernels.py: `fused_moe_kernel_gptq_awq`
takes input k from byte k // 2, low nibble for even k, value - 8 without zero points, times the
scale of group k // block_shape[1]; the FP8 path scales block [n // 128, k // 128]). The
stand-in is written from that indexing, not from SGLang's code: it checks that ppscope hands
SGLang its weights in the layout SGLang reads; whether SGLang's own kernel runs is decided on
the user's machine by the same check before anything is timed."""
import dataclasses
import sys
import types
from typing import NamedTuple

import pytest

from triton_cpu import cpu_ok, torch  # first: chooses the interpreter
from microbench.kernels import layers as L  # noqa: E402
from microbench.kernels import moe_sglang as SG  # noqa: E402
from reports.base.model_config import load_model  # noqa: E402


class TopK(NamedTuple):
    topk_weights: object
    topk_ids: object
    router_logits: object


@dataclasses.dataclass
class RunnerConfig:
    inplace: bool = True


def _dequant(w, scale, kw):
    """[E, N, K] float32 weights as SGLang's kernels read them."""
    w = w.cpu()
    if kw.get("use_int4_w4a16"):
        assert w.dtype == torch.uint8 and kw["block_shape"][0] == 0
        g = kw["block_shape"][1]
        k = torch.arange(w.shape[2] * 2)
        nib = (w[:, :, k // 2].to(torch.int32) >> ((k % 2) * 4)) & 0xF
        return (nib - 8).float() * scale.float().repeat_interleave(g, dim=2)
    if kw.get("use_fp8_w8a8"):
        bn, bk = kw["block_shape"]
        s = scale.float().repeat_interleave(bn, dim=1).repeat_interleave(bk, dim=2)
        return w.float() * s[:, :w.shape[1], :w.shape[2]]
    return w.float()


def _act(v, kw):
    """SGLang's FP8 path quantises activations per token and group of block_shape[1] inputs
    (scale = the group's absolute maximum / 448, e4m3); other formats keep them."""
    if not kw.get("use_fp8_w8a8"):
        return v
    g = v.reshape(-1, kw["block_shape"][1])
    sc = g.abs().amax(1, keepdim=True).clamp(min=1e-12) / 448.0
    return ((g / sc).to(torch.float8_e4m3fn).float() * sc).reshape(v.shape)


def fake_fused_experts(x, w1, w2, topk_output, runner_config, **kw):
    assert isinstance(runner_config, RunnerConfig) and runner_config.inplace is False
    tw, ids = topk_output.topk_weights, topk_output.topk_ids
    assert ids.dtype == torch.int32
    W1, W2 = _dequant(w1, kw.get("w1_scale"), kw), _dequant(w2, kw.get("w2_scale"), kw)
    inter = W1.shape[1] // 2
    xf, out = x.float(), torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = W1[e] @ _act(xf[t], kw)
            a = (torch.nn.functional.silu(h[:inter]) * h[inter:])
            out[t] += float(tw[t, j]) * (W2[e] @ _act(a, kw))
    return out.to(x.dtype)


@pytest.fixture
def fake_sglang(monkeypatch):
    names = ["sglang", "sglang.srt", "sglang.srt.layers", "sglang.srt.layers.moe",
             "sglang.srt.layers.moe.moe_runner", "sglang.srt.layers.moe.moe_runner.triton_utils",
             "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe",
             "sglang.srt.layers.moe.topk"]
    for n in names:
        monkeypatch.setitem(sys.modules, n, types.ModuleType(n))
    sys.modules["sglang.srt.layers.moe.moe_runner"].MoeRunnerConfig = RunnerConfig
    sys.modules["sglang.srt.layers.moe.topk"].StandardTopKOutput = TopK
    sys.modules["sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe"].fused_experts = \
        fake_fused_experts


def tiny(name, fmt, **kw):
    m = dataclasses.replace(load_model(name), **{**dict(
        hidden=256, moe_intermediate=128, n_routed_experts=16, top_k=4), **kw})
    return m.with_formats(routed_experts=fmt)


@cpu_ok
@pytest.mark.parametrize("name,fmt", [("kimi-k2", "int4"), ("deepseek-v3", "fp8"),
                                      ("kimi-k2", "bf16")])
def test_sglang_backend_hands_weights_in_sglangs_layout(fake_sglang, name, fmt):
    m = tiny(name, fmt)
    bl = L.build_moe(m, 3, "cpu", backend="sglang", fmt=fmt, experts_sample=6)
    assert bl.backend.startswith("sglang")
    assert bl.check() < L.REL_TOL
    if fmt != "bf16":
        assert bl.info["kernel"] == f"SGLang fused_experts ({fmt})"


@cpu_ok
def test_a_wrong_layout_fails_the_check(fake_sglang, monkeypatch):
    # scales handed as if every group were 64 inputs: SGLang would read the wrong scale
    real = SG.quant_args

    def wrong(qw):
        w1, w2, kw = real(qw)
        return w1, w2, {**kw, "block_shape": [0, 64], "w1_scale": kw["w1_scale"][:, :, ::2],
                        "w2_scale": kw["w2_scale"][:, :, ::2]}
    monkeypatch.setattr(SG, "quant_args", wrong)
    bl = L.build_moe(tiny("kimi-k2", "int4"), 3, "cpu", backend="sglang", fmt="int4",
                     experts_sample=6)
    with pytest.raises(L.CheckFailed):
        bl.check()


def _no_sglang(monkeypatch):
    """`import sglang` fails, also where an earlier test imported the real one."""
    for name in [n for n in sys.modules if n.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "sglang", None)


def test_without_sglang_the_reason_names_both_paths(monkeypatch):
    _no_sglang(monkeypatch)
    why = SG.experts_fn()
    assert isinstance(why, str) and "moe_runner.triton_utils.fused_moe" in why \
        and "fused_moe_triton.fused_moe" in why


# -- INT4 on Marlin, SGLang's default on CUDA GPUs other than SM100/SM103. The stand-in reads
# the weights in the layout SGLang's compressed-tensors loader hands `gptq_marlin_moe_repack`
# (schemes/compressed_tensors_wNa16_moe.py: packed [E, K/8, N], eight consecutive inputs per
# int32 word from the low nibble, value + 8; scales [E, K/32, N]); its "repack" keeps that layout.

def _fake_repack(w, perm, size_k, size_n, num_bits):
    assert w.dtype == torch.int32 and w.shape[1:] == (size_k // 8, size_n) and num_bits == 4
    assert w.is_contiguous() and perm.shape == (w.shape[0], 0)
    return w.clone()


def _fake_permute(s, size_k, size_n, group_size):
    assert s.shape[1:] == (size_k // group_size, size_n) and group_size == 32
    return s.clone()


def _fake_marlin(x, w1, w2, s1, s2, gating, tw, ids, *, g_idx1, g_idx2, sort_indices1,
                 sort_indices2, workspace, num_bits, is_k_full):
    assert num_bits == 4 and is_k_full and ids.dtype == torch.int32
    assert gating.shape == (x.shape[0], w1.shape[0]) and workspace is not None

    def deq(w, s):                                    # [E, K/8, N] -> [E, N, K] float32
        k = torch.arange(w.shape[1] * 8)
        nib = (w[:, k // 8, :].to(torch.int64) >> ((k % 8) * 4)[None, :, None]) & 0xF
        return ((nib - 8).float() * s.float().repeat_interleave(32, dim=1)).transpose(1, 2)
    W1, W2 = deq(w1, s1), deq(w2, s2)
    inter = W1.shape[1] // 2
    xf, out = x.float(), torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = W1[e] @ xf[t]
            out[t] += float(tw[t, j]) * (W2[e] @ (torch.nn.functional.silu(h[:inter])
                                                  * h[inter:]))
    return out.to(x.dtype)


@pytest.fixture
def fake_marlin(fake_sglang, monkeypatch):
    for n, attrs in ((SG._MARLIN[0], {"fused_marlin_moe": _fake_marlin}),
                     (SG._MARLIN[1], {"gptq_marlin_moe_repack": _fake_repack}),
                     (SG._MARLIN[2], {"marlin_moe_permute_scales": _fake_permute,
                                      "marlin_make_workspace": lambda dev, n: torch.zeros(4)})):
        mod = types.ModuleType(n)
        for k, v in attrs.items():
            setattr(mod, k, v)
        monkeypatch.setitem(sys.modules, n, mod)
    monkeypatch.setattr(SG, "int4_default", lambda: "marlin")


@cpu_ok
def test_int4_runs_marlin_where_that_is_sglangs_default(fake_marlin):
    bl = L.build_moe(tiny("kimi-k2", "int4"), 3, "cpu", backend="sglang", fmt="int4",
                     experts_sample=6)
    assert bl.info["kernel"].startswith("SGLang fused_marlin_moe (int4, Marlin")
    assert bl.check() < L.REL_TOL


@cpu_ok
def test_without_marlin_the_triton_kernel_runs_and_the_label_says_so(fake_sglang, monkeypatch):
    monkeypatch.setattr(SG, "int4_default", lambda: "marlin")
    bl = L.build_moe(tiny("kimi-k2", "int4"), 3, "cpu", backend="sglang", fmt="int4",
                     experts_sample=6)
    assert bl.info["kernel"].startswith("SGLang fused_experts (int4); its default on this GPU, "
                                        "Marlin, was not timed: sglang fused_marlin_moe not "
                                        "importable")
    assert bl.check() < L.REL_TOL


@pytest.mark.parametrize("cap,cuda,want", [((9, 0), "12.8", "marlin"), ((12, 0), "12.8", "marlin"),
                                           ((10, 0), "12.8", "triton"),
                                           ((10, 0), "12.6", "marlin")])
def test_int4_default_follows_sglangs_rule(monkeypatch, cap, cuda, want):
    _no_sglang(monkeypatch)                                # SGLang's own check not importable
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: cap)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    assert SG.int4_default() == want
