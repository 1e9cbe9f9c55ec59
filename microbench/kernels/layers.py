"""Single-layer decode forwards at a model's real dimensions, with random (never zero) weights.

What: the pieces a pipeline stage is made of, built so each can be timed eagerly or replayed
from a CUDA graph (no host syncs, fixed-size index tensors):
- `moe`: router (sigmoid scores + correction bias, top-k), routed experts, shared expert.
  Backends: `torch` variant `fast` (gate+up fused into one [G, 2I, H] weight, the shared
  expert(s) appended as extra groups every token visits, offsets by `searchsorted`, one
  `torch._grouped_mm` per projection over the sorted tokens; empty groups cost nothing),
  variant `plain` (the straightforward grouped_mm layer: separate gate/up/down, histc offsets,
  index_add combine, separate shared MLP) kept as the reference point; a loop over the touched
  experts where `_grouped_mm` is missing (not graph-capturable: it syncs); `sglang`
  (SGLang's fused_moe Triton kernel when sglang imports); `triton` (ppscope's own fused
  decode kernel, microbench/kernels/moe_triton.py, on the `fast` weight layout).
- `attention`: MLA decode with absorbed projections over a KV cache of `context_len` tokens
  (GQA for Llama/Qwen); RoPE itself is left out (elementwise, negligible). Backend `torch`
  (op by op) or, for MLA, `triton` (microbench/kernels/mla_decode.py, 8 launches).
- `dense_mlp`, `lm_head` (final norm, logits, Gumbel-max sampling).
Each builder returns a `Built` with `fn` (one forward on fixed inputs) and `check()` that
compares the op with a float32 reference on fresh random inputs (STYLE rule 4); probes call
`check()` before timing. MoE routed experts also run in INT4 W4A16 and FP8 block-scaled
formats (`build_moe(fmt=...)`, microbench/kernels/moe_quant.py); everything else is bf16.

`experts_sample=N` allocates N routed experts instead of E and folds expert ids modulo N; the
distinct experts actually touched are counted from the routing so the floor stays honest.
"""
from __future__ import annotations


from microbench.kernels.moe_common import (MoEWeights, append_shared, moe_reference,  # noqa: F401
                                           moe_route, zipf_bias)
from microbench.kernels.common import (REL_TOL, Built, CheckFailed, assert_close,  # noqa: F401 - re-exported
                                       gen, randn, rel_err, rmsnorm)
from reports.base import roofline
from reports.base.model_config import ModelConfig

def grouped_mm_available(device) -> str | None:
    """None if torch._grouped_mm runs here, else the reason."""
    import torch

    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no _grouped_mm"
    try:
        a = torch.ones(4, 16, device=device, dtype=torch.bfloat16)
        w = torch.ones(2, 16, 16, device=device, dtype=torch.bfloat16)
        offs = torch.tensor([1, 4], device=device, dtype=torch.int32)
        y = torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
        if float(y[0, 0]) != 16.0:
            return "torch._grouped_mm gave a wrong result"
    except Exception as e:  # noqa: BLE001 - unsupported arch/build: fall back
        return f"torch._grouped_mm unsupported here ({type(e).__name__})"
    return None


# ------------------------------------------------------------------ MoE

def make_moe_weights(m: ModelConfig, variant: str, device, *, experts_sample: int | None = None,
                     zipf_s: float = 0.0, seed: int = 0) -> MoEWeights:
    import torch

    H, I, E, S = m.hidden, m.moe_intermediate, m.n_routed_experts, m.n_shared_experts
    n = min(experts_sample or E, E)
    g = gen(device, seed)
    sh, si = H ** -0.5, I ** -0.5
    common = dict(router=randn((E, H), sh, g, device), bias=zipf_bias(E, zipf_s, device),
                  n_alloc=n, top_k=m.top_k, n_shared=S, inter=I, scale=2.5)
    if variant == "fast":
        G = n + S
        return MoEWeights(**common, gate_up=randn((G, 2 * I, H), sh, g, device),
                          down=randn((G, H, I), si, g, device),
                          group_ids=torch.arange(G, device=device),
                          shared_ids=torch.arange(n, G, device=device))
    if variant in ("plain", "loop"):
        return MoEWeights(**common, gate=randn((n, I, H), sh, g, device),
                          up=randn((n, I, H), sh, g, device), down=randn((n, H, I), si, g, device),
                          s_gate_up=randn((2 * S * I, H), sh, g, device) if S else None,
                          s_down=randn((H, S * I), si, g, device) if S else None)
    raise ValueError(f"unknown MoE variant {variant!r}")


def moe_experts_fast(w: MoEWeights, x, ids, tw):
    import torch
    import torch.nn.functional as F

    b, I = x.shape[0], w.inter
    ids, tw = append_shared(w, ids, tw)
    kk = ids.shape[1]
    sorted_ids, order = ids.flatten().sort(stable=True)              # [b*kk]
    xs = x[order // kk]                                              # [b*kk, H] sorted by expert
    offs = torch.searchsorted(sorted_ids, w.group_ids, right=True).to(torch.int32)  # [G] ends
    h = torch._grouped_mm(xs, w.gate_up.transpose(-2, -1), offs=offs)  # [b*kk, 2I]
    a = F.silu(h[:, :I]) * h[:, I:]
    y = torch._grouped_mm(a, w.down.transpose(-2, -1), offs=offs)    # [b*kk, H]
    yu = torch.empty_like(y).index_copy_(0, order, y)                # back to (token, slot) order
    return torch.bmm(tw.to(y.dtype).view(b, 1, kk), yu.view(b, kk, -1)).view(b, -1)


def _shared_plain(w: MoEWeights, x):
    import torch.nn.functional as F

    if not w.n_shared:
        return 0
    h = x @ w.s_gate_up.t()
    SI = w.n_shared * w.inter
    return (F.silu(h[:, :SI]) * h[:, SI:]) @ w.s_down.t()


def moe_experts_plain(w: MoEWeights, x, ids, tw):
    import torch
    import torch.nn.functional as F

    b, k = ids.shape
    flat = ids.flatten()
    sorted_ids, order = flat.sort()
    tok = order // k
    counts = torch.histc(flat.float(), bins=w.n_alloc, min=0, max=w.n_alloc - 1)
    offs = counts.cumsum(0).to(torch.int32)
    xs = x[tok]
    gt = torch._grouped_mm(xs, w.gate.transpose(-2, -1), offs=offs)
    up = torch._grouped_mm(xs, w.up.transpose(-2, -1), offs=offs)
    y = torch._grouped_mm(F.silu(gt) * up, w.down.transpose(-2, -1), offs=offs)
    out = torch.zeros_like(x).index_add_(0, tok, y * tw.flatten()[order, None].to(y.dtype))
    return out + _shared_plain(w, x)


def moe_experts_loop(w: MoEWeights, x, ids, tw):
    """Correct everywhere, not capturable: visits each touched expert (host sync)."""
    import torch
    import torch.nn.functional as F

    out = torch.zeros_like(x)
    for e in torch.unique(ids).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        h = F.silu(x[tok] @ w.gate[e].t()) * (x[tok] @ w.up[e].t())
        out.index_add_(0, tok, (h @ w.down[e].t()) * tw[tok, slot, None].to(x.dtype))
    return out + _shared_plain(w, x)


def build_moe(m: ModelConfig, batch: int, device, *, backend: str = "torch",
              variant: str = "fast", experts_sample: int | None = None, zipf_s: float = 0.0,
              seed: int = 0, weights: MoEWeights | None = None,
              triton_config=None, fmt: str = "bf16") -> Built:
    """`fmt`: the routed experts' format; int4 / fp8 run ppscope's quantised Triton kernels
    (microbench/kernels/moe_quant.py, backend "triton" only), bf16 everything above."""
    import torch

    if not m.is_moe:
        raise ValueError(f"{m.name} has no MoE layers")
    if fmt != "bf16":
        if backend not in ("triton", "sglang"):
            raise ValueError(f"MoE backend {backend}/{variant} runs bf16 only, not {fmt}")
        from microbench.kernels import moe_quant
        return moe_quant.build(m, batch, device, fmt, experts_sample=experts_sample,
                               zipf_s=zipf_s, seed=seed, weights=weights, config=triton_config,
                               backend=backend)
    if backend == "triton":
        from microbench.kernels import moe_triton as MT
        if why := MT.available():
            raise RuntimeError(why)
        variant = "fast"
    if backend == "sglang":
        from microbench.kernels import moe_sglang
        fe = moe_sglang.experts_fn()
        if isinstance(fe, str):
            raise RuntimeError(fe)
        variant = "fast"
    elif backend != "triton" and variant != "loop" and grouped_mm_available(device):
        variant = "loop"
    w = weights or make_moe_weights(m, variant if variant != "loop" else "plain", device,
                                    experts_sample=experts_sample, zipf_s=zipf_s, seed=seed)
    if backend == "sglang":
        n = w.n_alloc
        w13, w2 = w.gate_up[:n], w.down[:n]

        def experts(w_, x, ids, tw):
            y = fe(x, w13, w2, ids, tw)
            if w_.n_shared:
                S = torch.arange(n, n + w_.n_shared, device=x.device).expand(x.shape[0], -1)
                y = y + fe(x, w_.gate_up[n:], w_.down[n:], S - n,
                           torch.ones(S.shape, device=x.device))
            return y
    elif backend == "triton":
        def experts(w_, x, ids, tw):
            return MT.moe_experts(w_, x, ids, tw, triton_config)
    else:
        experts = {"fast": moe_experts_fast, "plain": moe_experts_plain,
                   "loop": moe_experts_loop}[variant]
    g = gen(device, seed + 1)
    x = randn((batch, m.hidden), 1.0, g, device)

    def fn():
        ids, tw = moe_route(w, x)
        return experts(w, x, ids, tw)

    def check() -> float:
        xc = randn((min(batch, 5), m.hidden), 1.0, gen(device, seed + 99), device)
        ids, tw = moe_route(w, xc)
        ref_scores = (xc.float() @ w.router.float().t()).sigmoid()
        assert_close("moe router scores", (xc @ w.router.t()).float().sigmoid(), ref_scores)
        return assert_close(f"moe experts ({backend}/{variant})", experts(w, xc, ids, tw),
                             moe_reference(w, xc, ids, tw))

    ids, _ = moe_route(w, x)
    distinct = int(torch.unique(ids).numel())
    nbytes = sum(t.numel() * t.element_size() for t in (w.router, w.gate_up, w.down, w.gate, w.up,
                                                        w.s_gate_up, w.s_down) if t is not None)
    return Built("moe", batch, f"{backend}/{variant}", fn, check,
                 graphable=variant != "loop", weight_bytes=nbytes,
                 info={"distinct_experts": distinct, "experts_allocated": w.n_alloc,
                       "weights": w, "kernel": _MOE_KERNELS.get(backend, f"torch/{variant} (bf16)")})


_MOE_KERNELS = {"triton": "moe_triton (Triton, bf16)", "sglang": "SGLang fused_moe (bf16)"}


def moe_weight_bytes(m: ModelConfig, experts_sample: int | None = None) -> int:
    """bf16 bytes `make_moe_weights` allocates (either variant): reports/base/roofline.py's
    `moe_weight_bytes` for bf16."""
    return roofline.moe_weight_bytes(m, "bf16", experts_sample)


# ------------------------------------------------------------------ attention

def build_attention(m: ModelConfig, batch: int, device, *, context_len: int,
                    seed: int = 0, backend: str = "torch") -> Built:
    """backend "torch" (op by op) or, for MLA, "triton" (microbench/kernels/mla_decode.py:
    the same absorbed decode in 8 launches); both checked against the float32 reference."""
    import torch

    H, h = m.hidden, m.num_heads
    g = gen(device, seed)
    sh = H ** -0.5
    if m.attention == "mla":
        ql, kl, nope, rope, vd = (m.q_lora_rank or 0), m.kv_lora_rank, m.qk_nope_head_dim, \
            m.qk_rope_head_dim, m.v_head_dim
        qk = nope + rope
        W = dict(wqa=randn((ql, H), sh, g, device) if ql else None,
                 qn=randn((ql,), 1.0, g, device).abs_().add_(0.5) if ql else None,
                 wqb=randn((h * qk, ql or H), (ql or H) ** -0.5, g, device),
                 wkva=randn((kl + rope, H), sh, g, device),
                 kvn=randn((kl,), 1.0, g, device).abs_().add_(0.5),
                 wkvb=randn((h * (nope + vd), kl), kl ** -0.5, g, device),
                 wo=randn((H, h * vd), (h * vd) ** -0.5, g, device))
        wkvb = W["wkvb"].view(h, nope + vd, kl)
        w_uk, w_uv = wkvb[:, :nope], wkvb[:, nope:]                 # [h, nope, kl], [h, vd, kl]
        sm = qk ** -0.5

        def proj(x):
            qa = rmsnorm(x @ W["wqa"].t(), W["qn"]) if ql else x
            q = (qa @ W["wqb"].t()).view(-1, h, qk)
            kv = x @ W["wkva"].t()
            return q[..., :nope], q[..., nope:], torch.cat([rmsnorm(kv[:, :kl], W["kvn"]),
                                                            kv[:, kl:]], -1)

        def forward(x, cache):                                       # cache [b, ctx, kl+rope]
            q_nope, q_rope, new = proj(x)
            cache[:, -1] = new                                       # this step's latent
            q_lat = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)   # [b, h, kl]
            s = torch.bmm(torch.cat([q_lat, q_rope], -1), cache.transpose(1, 2))  # [b, h, ctx]
            p = torch.softmax(s.float() * sm, -1).to(x.dtype)
            o_lat = torch.bmm(p, cache[..., :kl])                    # [b, h, kl]
            o = torch.bmm(o_lat.transpose(0, 1), w_uv.transpose(1, 2))  # [h, b, vd]
            return o.transpose(0, 1).reshape(x.shape[0], h * vd) @ W["wo"].t()

        if backend == "triton":
            from microbench.kernels import mla_decode
            forward = mla_decode.make_forward(W, m)  # noqa: F811 - the fused decode instead

        def reference(x, cache):                                     # not absorbed, float32
            c, kr = cache[..., :kl].float(), cache[..., kl:].float()  # [b, ctx, *]
            q_nope, q_rope, _ = proj(x)
            k_nope = torch.einsum("bck,hnk->bhcn", c, w_uk.float())
            v = torch.einsum("bck,hvk->bhcv", c, w_uv.float())
            s = (torch.einsum("bhn,bhcn->bhc", q_nope.float(), k_nope)
                 + torch.einsum("bhr,bcr->bhc", q_rope.float(), kr))
            p = torch.softmax(s * sm, -1)
            o = torch.einsum("bhc,bhcv->bhv", p, v).reshape(x.shape[0], h * vd)
            return o @ W["wo"].float().t()
        kv_w = kl + rope
    else:
        hd, kvh = m.head_dim, m.num_kv_heads
        W = dict(wq=randn((h * hd, H), sh, g, device), wk=randn((kvh * hd, H), sh, g, device),
                 wv=randn((kvh * hd, H), sh, g, device),
                 wo=randn((H, h * hd), (h * hd) ** -0.5, g, device))
        kv_w = 2 * kvh * hd
        sm = hd ** -0.5

        def forward(x, cache):                                       # cache [b, ctx, 2*kvh*hd]
            b = x.shape[0]
            cache[:, -1] = torch.cat([x @ W["wk"].t(), x @ W["wv"].t()], -1)
            q = (x @ W["wq"].t()).view(b, kvh, h // kvh, hd)
            kv = cache.view(b, -1, 2, kvh, hd)
            k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)  # [b, kvh, ctx, hd]
            p = torch.softmax((q @ k.transpose(-1, -2)).float() * sm, -1).to(x.dtype)
            return (p @ v).reshape(b, h * hd) @ W["wo"].t()

        def reference(x, cache):
            b = x.shape[0]
            q = (x.float() @ W["wq"].float().t()).view(b, kvh, h // kvh, hd)
            kv = cache.float().view(b, -1, 2, kvh, hd)
            k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
            p = torch.softmax((q @ k.transpose(-1, -2)) * sm, -1)
            return (p @ v).reshape(b, h * hd) @ W["wo"].float().t()

    ctx = max(int(context_len), 1)
    x = randn((batch, H), 1.0, g, device)
    cache = randn((batch, ctx, kv_w), 1.0, g, device)

    def check() -> float:
        gc = gen(device, seed + 99)
        xc = randn((min(batch, 3), H), 1.0, gc, device)
        cc = randn((xc.shape[0], min(ctx, 64), kv_w), 1.0, gc, device)
        y = forward(xc, cc)                                          # writes cc[:, -1]
        return assert_close(f"{m.attention} attention", y, reference(xc, cc))

    if backend != "torch" and not (backend == "triton" and m.attention == "mla"):
        raise ValueError(f"attention backend {backend!r} is for MLA only")
    nbytes = sum(t.numel() * t.element_size() for t in W.values() if t is not None)
    return Built("attention", batch, backend, lambda: forward(x, cache), check,
                 weight_bytes=nbytes, info={"context_len": ctx,
                                            "kv_cache_bytes": cache.numel() * 2,
                                            "kernel": _attn_kernel(m, backend, batch),
                                            "forward": forward, "inputs": (x, cache),
                                            "weights": W})


def _attn_kernel(m: ModelConfig, backend: str, batch: int) -> str:
    if backend == "triton" and m.attention == "mla":
        from microbench.kernels import mla_decode
        return mla_decode.kernel_name(batch, heads=m.num_heads, kv_lora=m.kv_lora_rank,
                                      rope=m.qk_rope_head_dim, q_lora=m.q_lora_rank or 0)
    return _ATTN_KERNELS[backend]


_ATTN_KERNELS = {"torch": "torch ops (bf16, absorbed MLA / GQA)"}


# ------------------------------------------------------------------ dense MLP, lm_head

def build_dense_mlp(m: ModelConfig, batch: int, device, *, seed: int = 0) -> Built:
    import torch.nn.functional as F

    H, I = m.hidden, m.dense_intermediate
    g = gen(device, seed)
    wgu, wd = randn((2 * I, H), H ** -0.5, g, device), randn((H, I), I ** -0.5, g, device)
    x = randn((batch, H), 1.0, g, device)

    def forward(x):
        h = x @ wgu.t()
        return (F.silu(h[:, :I]) * h[:, I:]) @ wd.t()

    def check() -> float:
        xc = randn((min(batch, 5), H), 1.0, gen(device, seed + 99), device).float()
        h = xc @ wgu.float().t()
        ref = (F.silu(h[:, :I]) * h[:, I:]) @ wd.float().t()
        return assert_close("dense mlp", forward(xc.to(wgu.dtype)), ref)

    return Built("dense_mlp", batch, "torch", lambda: forward(x), check,
                 weight_bytes=(3 * H * I) * 2, info={"kernel": "torch matmuls (bf16)"})


def build_lm_head(m: ModelConfig, batch: int, device, *, temperature: float = 0.7,
                  seed: int = 0) -> Built:
    """Final RMSNorm, logits in fp32, Gumbel-max sampling (graph-safe: torch's Philox RNG)."""
    import torch

    H, V = m.hidden, m.vocab
    g = gen(device, seed)
    w, nw = randn((V, H), H ** -0.5, g, device), randn((H,), 1.0, g, device).abs_().add_(0.5)
    x = randn((batch, H), 1.0, g, device)

    def logits_of(x):
        return (rmsnorm(x, nw) @ w.t()).float()                     # [b, V]

    def forward(x):
        lg = logits_of(x)
        u = torch.rand_like(lg).clamp_(1e-10, 1.0)
        return torch.argmax(lg / temperature - torch.log(-torch.log(u)), -1)

    def check() -> float:
        xc = randn((min(batch, 4), H), 1.0, gen(device, seed + 99), device)
        ref = rmsnorm(xc, nw).float() @ w.float().t()
        err = assert_close("lm_head logits", logits_of(xc), ref)
        tok = forward(xc)
        if not bool(((tok >= 0) & (tok < V)).all()):
            raise CheckFailed("lm_head sampling returned token ids outside the vocabulary")
        return err

    return Built("lm_head", batch, "torch", lambda: forward(x), check, weight_bytes=V * H * 2,
                 info={"kernel": "torch matmul + Gumbel-max sampling (bf16)"})


def build(kind: str, m: ModelConfig, batch: int, device, **kw) -> Built:
    if kind == "moe":
        return build_moe(m, batch, device, **{k: v for k, v in kw.items()
                                              if k in ("backend", "variant", "experts_sample",
                                                       "zipf_s", "seed", "weights",
                                                       "triton_config", "fmt")})
    if kind == "attention":
        return build_attention(m, batch, device, context_len=kw.get("context_len", 2048),
                               seed=kw.get("seed", 0),
                               backend=kw.get("attention_backend", "torch"))
    if kind == "dense_mlp":
        return build_dense_mlp(m, batch, device, seed=kw.get("seed", 0))
    if kind == "lm_head":
        return build_lm_head(m, batch, device, seed=kw.get("seed", 0))
    raise ValueError(f"unknown layer kind {kind!r}")
