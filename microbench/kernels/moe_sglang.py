"""SGLang's own fused MoE Triton kernel, in bf16, INT4 W4A16 or FP8 block-scaled, timed beside
ppscope's kernels in the same format (`ppscope stage-cost --moe-backends triton,sglang`).

Only where `import sglang` works (the user's server machine): the point is to see whether the
server's own kernel is the slow part. Which kernel that is depends on the format and GPU: for
compressed-tensors INT4 W4A16 (Kimi K2) SGLang 0.5.23 runs its Triton kernel by default only
on SM100/SM103 (or with `--moe-runner-backend triton`, or on ROCm); on other CUDA GPUs its
default is Marlin (`fused_marlin_moe`, sgl-kernel CUDA). `experts_for` times the one SGLang
would pick on this GPU (`int4_default`, SGLang's own `is_sm100_supported` where it imports),
and the record's kernel label names it. The server log names the one the server picked
(`ppscope sglang --log`: `moe_kernel`). Nothing of SGLang is copied; its function is called:
`fused_experts` of `sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe` (SGLang 0.5.23;
`sglang.srt.layers.moe.fused_moe_triton.fused_moe` in earlier 0.4/0.5 releases, tried second),
with `StandardTopKOutput` (`sglang.srt.layers.moe.topk`) and `MoeRunnerConfig`
(`sglang.srt.layers.moe.moe_runner`).

The weights are ppscope's own (microbench/kernels/moe_common.py, moe_int4.py, moe_fp8.py), and
their layouts are the ones SGLang's kernels read (0.5.23 kernels/ops/moe/
fused_moe_triton_kernels.py, `fused_moe_kernel_gptq_awq` and `invoke_fused_moe_kernel`):
- bf16: w13 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I].
- INT4 W4A16 (`use_int4_w4a16`, `block_shape=[0, 32]`): two 4-bit inputs per byte along K, the
  even input in the low nibble, stored as value + 8 (no zero points): ppscope's int32 words of 8
  nibbles (compressed-tensors order) viewed as bytes, little-endian, are exactly that; scales
  bf16 [E, N, K/32].
- FP8 (`use_fp8_w8a8`, `block_shape=[128, 128]`): e4m3 [E, N, K], fp32 scales [E, N/128,
  K/128]; activations quantised per token and 128-input group inside SGLang's call.
A bf16 shared expert (Kimi K2 keeps it in bf16) runs as the dense MLP SGLang runs it, in torch.
Every call is checked against the float32 reference on the dequantised weights before it is
timed (microbench/kernels/moe_quant.py `build`), so a layout SGLang reads differently fails the
check and is recorded as failed, never timed.
"""
from __future__ import annotations

_PATHS = ("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe",   # 0.5.23
          "sglang.srt.layers.moe.fused_moe_triton.fused_moe")          # earlier releases


def experts_fn():
    """(x, w13, w2, ids, tw, **quant) -> y with SGLang's `fused_experts`, or a reason string."""
    import importlib

    why = []
    fe = None
    for path in _PATHS:
        try:
            fe = importlib.import_module(path).fused_experts
            break
        except Exception as e:  # noqa: BLE001 - not installed, another release, missing deps
            why.append(f"{path}: {type(e).__name__}: {str(e)[:80]}")
    if fe is None:
        return "sglang fused_experts not importable (" + "; ".join(why) + ")"

    import torch

    def call(x, w13, w2, ids, tw, **quant):
        try:
            from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig
            from sglang.srt.layers.moe.topk import StandardTopKOutput
        except ImportError:   # releases before the runner config: the older call form
            return fe(x, w13, w2, tw, ids.to(torch.int32), inplace=False, **quant)
        return fe(x, w13, w2, StandardTopKOutput(tw, ids.to(torch.int32), None),
                  MoeRunnerConfig(inplace=False), **quant)
    return call


# SGLang's INT4 W4A16 MoE default on CUDA GPUs other than SM100/SM103 (0.5.23:
# layers/quantization/compressed_tensors/compressed_tensors.py picks
# CompressedTensorsWNA16MarlinMoEMethod; schemes/compressed_tensors_wNa16_moe.py repacks the
# weights with gptq_marlin_moe_repack / marlin_moe_permute_scales and calls fused_marlin_moe)
_MARLIN = ("sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe",
           "sglang.srt.hardware_backend.gpu.quantization.gptq_kernels",
           "sglang.srt.layers.quantization.marlin_utils")


def int4_default() -> str | None:
    """The kernel SGLang runs compressed-tensors INT4 W4A16 MoE with by default on this GPU:
    "triton" on SM100/SM103 (its `is_sm100_supported`, asked where importable: capability 10.x
    and CUDA >= 12.8), "marlin" on other CUDA GPUs; None without a CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        from sglang.srt.utils.common import is_sm100_supported
        sm100 = bool(is_sm100_supported())
    except Exception:  # noqa: BLE001 - not installed or another release: the same rule here
        cuda = tuple(int(v) for v in (torch.version.cuda or "0.0").split(".")[:2])
        sm100 = torch.cuda.get_device_capability()[0] == 10 and cuda >= (12, 8)
    return "triton" if sm100 else "marlin"


def marlin_fn():
    """(x, qw, ids, tw) -> y with SGLang's `fused_marlin_moe` on ppscope's INT4 weights repacked
    as SGLang repacks compressed-tensors checkpoints (once per weight set), or a reason string.
    SGLang's loader holds them as [E, K/8, N] packed and [E, K/32, N] scales: ppscope's
    [E, N, K/8] / [E, N, K/32] transposed (the same int32 words: 8 consecutive inputs, value + 8,
    symmetric, no act-order)."""
    import importlib

    try:
        fmm = importlib.import_module(_MARLIN[0]).fused_marlin_moe
        repack = importlib.import_module(_MARLIN[1]).gptq_marlin_moe_repack
        mu = importlib.import_module(_MARLIN[2])
        permute, make_ws = mu.marlin_moe_permute_scales, mu.marlin_make_workspace
    except Exception as e:  # noqa: BLE001 - not installed, another release, no sgl-kernel
        return f"sglang fused_marlin_moe not importable ({type(e).__name__}: {str(e)[:100]})"

    import torch

    packed: dict = {}

    def weights(qw):
        from microbench.kernels.common import cached_for

        def make():
            E, I, H = qw.gate_up_q.shape[0], qw.base.inter, qw.down_q.shape[1]
            none = torch.empty((E, 0), dtype=torch.int32, device=qw.gate_up_q.device)
            w13 = repack(qw.gate_up_q.transpose(1, 2).contiguous(), none, H, 2 * I, 4)
            w2 = repack(qw.down_q.transpose(1, 2).contiguous(), none, I, H, 4)
            s13 = permute(qw.gate_up_s.transpose(1, 2).contiguous(), H, 2 * I, 32)
            s2 = permute(qw.down_s.transpose(1, 2).contiguous(), I, H, 32)
            return w13, w2, s13, s2, make_ws(w13.device, 4), none
        return cached_for(packed, (qw.gate_up_q, qw.gate_up_s, qw.down_q, qw.down_s), make,
                          keep=1)

    def call(x, qw, ids, tw):
        w13, w2, s13, s2, ws, none = weights(qw)
        gating = x.new_empty((x.shape[0], w13.shape[0]))   # SGLang reads only its row count
        return fmm(x, w13, w2, s13, s2, gating, tw, ids.to(torch.int32), g_idx1=none,
                   g_idx2=none, sort_indices1=none, sort_indices2=none, workspace=ws,
                   num_bits=4, is_k_full=True)
    return call


def experts_for(fmt: str):
    """(experts(x, qw, ids, tw) -> y, kernel label) running SGLang's own kernel for `fmt` as
    SGLang would on this GPU: INT4 on Marlin where that is SGLang's default (`int4_default`),
    else `fused_experts` (Triton). Where the default cannot be imported, the Triton kernel runs
    and the label says so. RuntimeError (one line) when nothing of SGLang's imports."""
    why_marlin = None
    if fmt == "int4" and int4_default() == "marlin":
        call = marlin_fn()
        if not isinstance(call, str):
            return call, "SGLang fused_marlin_moe (int4, Marlin: its default on this GPU)"
        why_marlin = call
    fe = experts_fn()
    if isinstance(fe, str):
        raise RuntimeError(fe if why_marlin is None else f"{why_marlin}; {fe}")

    def experts(x, qw, ids, tw):
        w13, w2, kw = quant_args(qw)
        return fe(x, w13, w2, ids, tw, **kw)
    label = f"SGLang fused_experts ({fmt})"
    if why_marlin:
        label += f"; its default on this GPU, Marlin, was not timed: {why_marlin}"
    return experts, label


def quant_args(qw) -> tuple:
    """(w13, w2, keyword arguments) for SGLang's call on ppscope's quantised weights."""
    import torch

    if qw.fmt == "int4":
        kw = dict(use_int4_w4a16=True, w1_scale=qw.gate_up_s, w2_scale=qw.down_s,
                  block_shape=[0, 32])
        return qw.gate_up_q.view(torch.uint8), qw.down_q.view(torch.uint8), kw
    if qw.fmt == "fp8":
        kw = dict(use_fp8_w8a8=True, w1_scale=qw.gate_up_s, w2_scale=qw.down_s,
                  block_shape=[128, 128])
        return qw.gate_up_q, qw.down_q, kw
    raise ValueError(f"no SGLang call for format {qw.fmt}")


def forward(experts, qw, x):
    """The whole layer on x [b, H] through SGLang's kernel (`experts_for`): ppscope's router
    (moe_route), SGLang's experts, the shared expert in its format (SGLang's kernel when
    quantised with the routed ones, else a bf16 dense MLP)."""
    import torch.nn.functional as F

    from microbench.kernels import moe_route as R

    ids, tw = R.route(qw.base, x)                      # [b, top_k + n_shared], shared appended
    k = qw.base.top_k
    if qw.shared_gate_up is None:                      # shared expert(s) in the routed format
        return experts(x, qw, ids, tw)
    y = experts(x, qw, ids[:, :k].contiguous(), tw[:, :k].contiguous())
    inter = qw.base.inter
    for s in range(qw.shared_gate_up.shape[0]):
        gu = x @ qw.shared_gate_up[s].t()              # [b, 2I]
        y = y + (F.silu(gu[:, :inter]) * gu[:, inter:]) @ qw.shared_down[s].t()
    return y
