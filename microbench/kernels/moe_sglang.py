"""SGLang's own fused MoE Triton kernel, in bf16, INT4 W4A16 or FP8 block-scaled, timed beside
ppscope's kernels in the same format (`ppscope stage-cost --moe-backends triton,sglang`).

Only where `import sglang` works (the user's server machine): the point is to see whether the
server's own kernel is the slow part. Which kernel that is depends on the format and GPU: for
compressed-tensors INT4 W4A16 (Kimi K2) SGLang 0.5.23 runs this Triton kernel only with
`--moe-runner-backend triton`, on SM100/SM103 by default, or on ROCm; on other CUDA GPUs its
default is Marlin (`fused_marlin_moe`, sgl-kernel CUDA), which is not timed here. The server
log names the one it picked (`ppscope sglang --log`: `moe_kernel`). Nothing of SGLang is copied; its function is called:
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


def forward(call, qw, x):
    """The whole layer on x [b, H] through SGLang's kernel: ppscope's router (moe_route), SGLang's
    experts, the shared expert in its format (SGLang's kernel when quantised with the routed
    ones, else a bf16 dense MLP)."""
    import torch.nn.functional as F

    from microbench.kernels import moe_route as R

    ids, tw = R.route(qw.base, x)                      # [b, top_k + n_shared], shared appended
    w13, w2, kw = quant_args(qw)
    k = qw.base.top_k
    if qw.shared_gate_up is None:                      # shared expert(s) in the routed format
        return call(x, w13, w2, ids, tw, **kw)
    y = call(x, w13, w2, ids[:, :k].contiguous(), tw[:, :k].contiguous(), **kw)
    inter = qw.base.inter
    for s in range(qw.shared_gate_up.shape[0]):
        gu = x @ qw.shared_gate_up[s].t()              # [b, 2I]
        y = y + (F.silu(gu[:, :inter]) * gu[:, inter:]) @ qw.shared_down[s].t()
    return y
