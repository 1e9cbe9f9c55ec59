"""MoE layers in the quantised formats models are served in (`layers.build_moe(fmt=...)`):
INT4 W4A16 (`moe_int4`) and FP8 block-scaled (`moe_fp8`) routed experts, the shared expert in
the model's own format for it, the router in bf16. Random weights at real dimensions, made
directly in the packed format (no bf16 copy of every expert).

The layer is `moe_route.route` + `moe_route.plan` + the format's two expert kernels + the slot
sum; `check()` compares it with the format's float32 reference on the dequantised weights
(fresh random inputs, the same routing), before anything is timed.
"""
from __future__ import annotations

from microbench.kernels import common
from microbench.kernels.moe_common import QuantMoEWeights

QUANT_FORMATS = ("int4", "fp8")
KERNELS = {"int4": "moe_int4_mma (CUDA) where it builds, else moe_int4 (Triton); INT4 W4A16 "
                   "group 32",
           "fp8": "moe_fp8 (Triton, FP8 e4m3 128x128 block scales, per-token-group activations)"}


def _module(fmt: str):
    if fmt == "int4":
        from microbench.kernels import moe_int4 as mod
    elif fmt == "fp8":
        from microbench.kernels import moe_fp8 as mod
    else:
        raise ValueError(f"no quantised MoE kernel for format {fmt!r} (have {QUANT_FORMATS})")
    return mod


def make_weights(m, fmt: str, device, *, experts_sample: int | None = None,
                 zipf_s: float = 0.0, seed: int = 0) -> QuantMoEWeights:
    """Routed experts in `fmt`; the shared expert(s) in `m.formats.shared_experts` (kept in
    bf16 unless that is `fmt`: a kernel runs its own format or bf16, nothing else)."""
    import torch

    from microbench.kernels import moe_common as L

    mod = _module(fmt)
    # router, bias, ids: the fast layout's, without allocating its bf16 experts
    E, S = m.n_routed_experts, m.n_shared_experts
    n = min(experts_sample or E, E)
    g = common.gen(device, seed)
    base = L.MoEWeights(router=common.randn((E, m.hidden), m.hidden ** -0.5, g, device),
                        bias=L.zipf_bias(E, zipf_s, device), n_alloc=n, top_k=m.top_k,
                        n_shared=S, inter=m.moe_intermediate, scale=2.5,
                        group_ids=torch.arange(n + S, device=device),
                        shared_ids=torch.arange(n, n + S, device=device))
    shared_fmt = fmt if m.formats.shared_experts == fmt else "bf16"
    return mod.random_weights(base, m.hidden, m.moe_intermediate, g, device, shared_fmt)


def build(m, batch: int, device, fmt: str, *, experts_sample: int | None = None,
          zipf_s: float = 0.0, seed: int = 0, weights: QuantMoEWeights | None = None,
          config=None, backend: str = "triton"):
    """A `layers.Built` for the quantised layer: ppscope's kernel (backend "triton/<fmt>") or
    SGLang's own in the same format ("sglang/<fmt>", microbench/kernels/moe_sglang.py)."""
    import torch

    from microbench.kernels import common as C
    from microbench.kernels import moe_common as L
    from microbench.kernels import moe_route as R

    mod = _module(fmt)
    if backend == "sglang":
        from microbench.kernels import moe_sglang as SG
        experts, kernel = SG.experts_for(fmt)

        def forward(qw_, x_, cfg_=None):
            return SG.forward(experts, qw_, x_)
    elif backend == "triton":
        if why := mod.available():
            raise RuntimeError(why)
        forward = mod.moe_forward
        kernel = (mod.kernel_name(config, batch) if hasattr(mod, "kernel_name")
                  else KERNELS[fmt])
    else:
        raise ValueError(f"MoE backend {backend} does not run {fmt}")
    qw = weights or make_weights(m, fmt, device, experts_sample=experts_sample, zipf_s=zipf_s,
                                 seed=seed)
    if qw.fmt != fmt:
        raise ValueError(f"weights are {qw.fmt}, asked for {fmt}")
    x = common.randn((batch, m.hidden), 1.0, common.gen(device, seed + 1), device)

    def fn():
        return forward(qw, x, config)

    def check() -> float:
        xc = common.randn((min(batch, 5), m.hidden), 1.0, common.gen(device, seed + 99), device)
        ids, tw = R.route(qw.base, xc)                   # what moe_forward routes to
        k = qw.base.top_k
        if qw.base.n_alloc == qw.base.router.shape[0]:   # ids not folded: compare the router
            # same biased scores as torch's top-k (on exact ties the ids may differ)
            sc = (xc @ qw.base.router.t()).float().sigmoid() + qw.base.bias
            common.assert_close("moe router (fused vs torch top-k scores)",
                                sc.gather(1, ids[:, :k].long()).sort(1)[0],
                                sc.gather(1, L.moe_route(qw.base, xc)[0]).sort(1)[0], tol=1e-6)
        return common.assert_close(f"moe experts ({backend}/{fmt})", forward(qw, xc, config),
                                   mod.reference(qw, xc, ids[:, :k], tw[:, :k]))

    ids, _ = R.route(qw.base, x)
    distinct = int(torch.unique(ids[:, :qw.base.top_k]).numel())
    return C.Built("moe", batch, f"{backend}/{fmt}", fn, check, graphable=True,
                   weight_bytes=qw.nbytes(),
                   info={"distinct_experts": distinct, "experts_allocated": qw.base.n_alloc,
                         "weights": qw, "kernel": kernel,
                         "shared_expert_format": "bf16" if qw.shared_gate_up is not None
                         else fmt})
