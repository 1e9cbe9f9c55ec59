"""SGLang's own Triton MoE kernel reads ppscope's INT4 and FP8 weights as ppscope hands them over.

Tier `sglang` (pytest -m sglang): runs where `import sglang` works. `--moe-backends sglang`
(microbench/kernels/moe_sglang.py) passes ppscope's packed weights to SGLang's `fused_experts`
through `quant_args`; tests/test_moe_sglang.py checks that against a stand-in written from
SGLang's indexing. Here SGLang's real kernel runs: `invoke_fused_moe_kernel` of SGLang 0.5.23
(`sglang.kernels.ops.moe.fused_moe_triton_kernels`; `fused_moe_kernel_gptq_awq` for INT4 W4A16
group 32, `fused_moe_kernel` for FP8 128x128 blocks), on the GPU where there is one, else under
Triton's interpreter on the CPU, for the gate_up projection of a few routed tokens; the result
is compared with the float32 product on ppscope's dequantised weights. A layout SGLang reads
differently (a negative control below: the scale groups reversed) is far off.

On the interpreter the INT4 activations are fp16, not bf16: Triton 3.9's interpreter multiplies
a bf16 tile made by `.to(bfloat16)` as raw bits in `tl.dot` (a tile of ones gave 1.69e10, fp16
gave the right 64), which is Triton's, not SGLang's or ppscope's; fp16 holds these inputs
exactly and SGLang's kernel takes either.
"""
from __future__ import annotations

import dataclasses

import pytest

from triton_cpu import ON_GPU, skip_module_unless_runnable, torch  # first: the interpreter

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")
try:
    from sglang.kernels.ops.moe import fused_moe_triton_kernels as SK
except Exception as e:  # noqa: BLE001 - another release, or its import needs what is missing
    pytest.skip(f"SGLang's fused_moe_triton_kernels does not import ({type(e).__name__}: "
                f"{str(e)[:120]})", allow_module_level=True)
import triton.language as tl  # noqa: E402

from microbench.kernels import int4_pack as P  # noqa: E402
from microbench.kernels import moe_fp8 as F8  # noqa: E402
from microbench.kernels import moe_quant  # noqa: E402
from microbench.kernels import moe_sglang as SG  # noqa: E402
from reports.base.model_config import load_model  # noqa: E402

skip_module_unless_runnable()
DEV = "cuda" if ON_GPU else "cpu"
BLOCK_M = 16


def _aligned(ids, n_experts: int):
    """SGLang's moe_align_block_size output, made here: (token, slot) positions sorted by
    expert, each expert's run padded to BLOCK_M with the out-of-range position; the expert of
    each block; the padded length."""
    flat = ids.reshape(-1).cpu()
    pos, blocks = [], []
    for e in range(n_experts):
        mine = (flat == e).nonzero().reshape(-1).tolist()
        if mine:
            n = -(-len(mine) // BLOCK_M) * BLOCK_M
            pos += mine + [flat.numel()] * (n - len(mine))
            blocks += [e] * (n // BLOCK_M)
    as_i32 = lambda v: torch.tensor(v, dtype=torch.int32, device=ids.device)  # noqa: E731
    return as_i32(pos), as_i32(blocks), as_i32([len(pos)])


def _gate_up(fmt: str, b: int = 3, scales=None):
    """(SGLang's gate_up output [b, top_k, 2I] float32, the float32 reference)."""
    m = dataclasses.replace(load_model("kimi-k2"), hidden=256, moe_intermediate=128,
                            n_routed_experts=4, top_k=2)
    m = m.with_formats(routed_experts=fmt, shared_experts=fmt)
    qw = moe_quant.make_weights(m, fmt, DEV)
    E = qw.gate_up_q.shape[0]
    g = torch.Generator().manual_seed(0)
    adt = torch.bfloat16 if ON_GPU or fmt == "fp8" else torch.float16   # module docstring
    x = torch.randn(b, m.hidden, generator=g).to(torch.bfloat16).to(adt).to(DEV)
    ids = torch.stack([torch.randperm(E, generator=g)[:2] for _ in range(b)]).to(
        torch.int32).to(DEV)
    tw = torch.rand(b, 2, generator=g).to(DEV)
    w13, _, kw = SG.quant_args(qw)
    w1_scale = kw["w1_scale"] if scales is None else scales(kw["w1_scale"])
    cfg = {"BLOCK_SIZE_M": BLOCK_M, "BLOCK_SIZE_N": 32,
           "BLOCK_SIZE_K": 32 if fmt == "int4" else 128, "GROUP_SIZE_M": 1}
    out = torch.zeros(b, 2, w13.shape[1], dtype=adt, device=DEV)
    sorted_ids, blocks, padded = _aligned(ids, E)
    SK.invoke_fused_moe_kernel(x, w13, None, out, None, w1_scale, None, tw, ids, sorted_ids,
                               blocks, padded, False, 2, cfg,
                               tl.float16 if adt == torch.float16 else tl.bfloat16,
                               fmt == "fp8", False, False, fmt == "int4", False,
                               block_shape=kw["block_shape"])
    if fmt == "int4":
        wd, xr = P.dequantize(qw.gate_up_q, qw.gate_up_s).float(), x.float()
    else:   # SGLang quantises the activations per token and 128 inputs itself
        wd = F8.dequantize_blocks(qw.gate_up_q, qw.gate_up_s).float()
        xr = F8.dequantize_act(*SK.per_token_group_quant_fp8(x, 128)).float()
    ref = torch.einsum("bh,bknh->bkn", xr, wd[ids.long()])
    return out.float(), ref


def _rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
def test_sglangs_kernel_reads_ppscopes_weights(fmt):
    out, ref = _gate_up(fmt)
    assert _rel(out, ref) < 0.01     # measured on the CPU: INT4 0.0014, FP8 0.0033


def test_a_layout_sglang_reads_differently_is_far_off():
    # the 32-input scale groups in reverse order: the same values, not where SGLang reads them
    out, ref = _gate_up("int4", scales=lambda s: s.flip(-1).contiguous())
    assert _rel(out, ref) > 0.1
