"""SGLang's own MLA decode attention computes, from what `microbench.stage_cost.sglang_anchor` hands it,
the same attention as ppscope's and as a float32 softmax.

Tier `sglang` (pytest -m sglang): runs where SGLang's `decode_attention_fwd` imports
(kernels/ops/attention/decode_attention.py, 0.5.23), on the GPU where there is one (bf16), else
under Triton's interpreter on the CPU (float32: the interpreter has no bf16 `tl.dot`). The
shapes split the cache as SGLang's MLA path does for a 288-wide row (latent 256 + rope 32, its
BLOCK_DPE branch; Kimi K2's 576 = 512 + 64 takes the same branch), with a context that is not
a multiple of its 32-row blocks. A negative control (queries handed as [rope | latent]) is far
off, so the check can fail.
"""
from __future__ import annotations

import pytest

from triton_cpu import ON_GPU, skip_module_unless_runnable, torch  # first: the interpreter

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")
from microbench.stage_cost import sglang_anchor as A  # noqa: E402

SG = A.sglang_kernels()
if isinstance(SG, str):
    pytest.skip(SG, allow_module_level=True)
skip_module_unless_runnable()
from microbench.kernels import mla_decode  # noqa: E402

DEV = "cuda" if ON_GPU else "cpu"
DT = torch.bfloat16 if ON_GPU else torch.float32
H, KL, ROPE, NOPE = 16, 256, 32, 64
SM = (NOPE + ROPE) ** -0.5


def _inputs(b, ctx, seed):
    g = torch.Generator().manual_seed(seed)
    q_lat = torch.randn(H, b, KL, generator=g).to(DEV, DT)
    q3 = torch.randn(b, H, NOPE + ROPE, generator=g).to(DEV, DT)
    cache = torch.randn(b, ctx, KL + ROPE, generator=g).to(DEV, DT)
    return q_lat, q3, cache


@pytest.mark.parametrize("b, ctx", [(1, 70), (3, 45)])
def test_sglang_and_ppscope_attention_agree_with_float32(b, ctx):
    decode_fwd, n_splits_fn, pdl, _ = SG
    q_lat, q3, cache = _inputs(b, ctx, seed=b * 100 + ctx)
    ref = A.reference(q_lat, q3[:, :, NOPE:], cache, KL, SM)
    cap = A.max_kv_splits(4, ctx)
    call = A.sglang_attention(decode_fwd, n_splits_fn, q_lat, q3[:, :, NOPE:], ctx, SM, cap,
                              sms=4, pdl=pdl and ON_GPU)
    assert call.splits and max(call.splits) <= cap
    tol = 2e-2 if ON_GPU else 1e-4
    assert A.rel_err(call(cache), ref) < tol
    partials, merge = mla_decode.make_attention(H, KL, ROPE, NOPE, DEV)
    o, ml = partials(q_lat, q3, cache, ctx)
    assert A.rel_err(merge(o, ml, DT).transpose(0, 1), ref) < tol


def test_queries_in_the_wrong_order_are_far_off():
    decode_fwd, n_splits_fn, _, _ = SG
    b, ctx = 2, 40
    q_lat, q3, cache = _inputs(b, ctx, seed=7)
    ref = A.reference(q_lat, q3[:, :, NOPE:], cache, KL, SM)
    # the rope part handed where the latent goes: a layout SGLang would read differently
    swapped = torch.cat([q3[:, :, NOPE:].transpose(0, 1), q_lat[:, :, :KL - ROPE]], -1)
    call = A.sglang_attention(decode_fwd, n_splits_fn, swapped, q_lat[:, :, KL - ROPE:]
                              .transpose(0, 1), ctx, SM, 8, sms=4)
    assert A.rel_err(call(cache), ref) > 0.3
