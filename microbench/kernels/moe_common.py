"""The MoE weight layout shared by the torch layers (`layers.py`) and the Triton kernel
(`moe_triton.py`), and the one rule both apply: shared experts join every token with weight 1."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MoEWeights:
    router: Any            # [E, H] bf16 (E = real expert count; ids folded to n_alloc)
    bias: Any              # [E] fp32 correction bias (skew lives here)
    n_alloc: int
    top_k: int
    n_shared: int          # shared expert split into n_shared groups of width I
    inter: int
    scale: float           # routed_scaling_factor
    gate_up: Any = None    # fast: [n_alloc + n_shared, 2I, H]
    down: Any = None       # fast: [n_alloc + n_shared, H, I]; plain: [n_alloc, H, I]
    gate: Any = None       # plain: [n_alloc, I, H]
    up: Any = None
    s_gate_up: Any = None  # plain shared: [n_shared*I*2, H]
    s_down: Any = None     # plain shared: [H, n_shared*I]
    group_ids: Any = None  # [G] 0..G-1 (searchsorted targets)
    shared_ids: Any = None  # [n_shared] n_alloc..


def append_shared(w: MoEWeights, ids, tw):
    """Fast layout: the shared expert(s) join every token's ids ([b, k] -> [b, k + n_shared])
    with routing weight 1, so one grouped pass covers routed and shared experts."""
    import torch

    if not w.n_shared:
        return ids, tw
    b = ids.shape[0]
    return (torch.cat([ids, w.shared_ids.expand(b, w.n_shared)], 1),
            torch.cat([tw, tw.new_ones(b, w.n_shared)], 1))


@dataclass(frozen=True)
class QuantMoEWeights:
    """Routed experts (and the shared expert(s) when they share the format) packed in `fmt`;
    the router and any bf16 shared expert as in `MoEWeights`.

    `base`: router, bias, n_alloc, top_k, n_shared, inter, scale, shared_ids (gate_up/down
    unused). Quantised groups 0..n_q-1 are the routed experts, then the shared expert(s) when
    `shared_gate_up` is None; otherwise the shared expert(s) are bf16 groups n_q.. of
    `shared_gate_up` [n_shared, 2I, H] / `shared_down` [n_shared, H, I].
    int4 (see int4_pack): `gate_up_q` int32 [n_q, 2I, H/8], `gate_up_s` bf16 [n_q, 2I, H/32],
    `down_q` int32 [n_q, H, I/8], `down_s` bf16 [n_q, H, I/32].
    fp8 (see moe_fp8): `*_q` float8_e4m3fn [n_q, N, K], `*_s` fp32 [n_q, N/128, K/128].
    """
    fmt: str
    base: MoEWeights
    gate_up_q: Any
    gate_up_s: Any
    down_q: Any
    down_s: Any
    shared_gate_up: Any = None
    shared_down: Any = None

    @property
    def n_q(self) -> int:
        return self.gate_up_q.shape[0]

    def tensors(self):
        return (self.base.router, self.gate_up_q, self.gate_up_s, self.down_q, self.down_s,
                self.shared_gate_up, self.shared_down)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors() if t is not None)


class LazyExperts:
    """`experts[e]` -> one expert's weight in float32, made on demand by `fn(e)` (and kept):
    lets `layers.moe_reference` run on quantised weights without a dequantised copy of every
    expert."""

    def __init__(self, fn):
        self.fn = fn
        self.cache: dict[int, Any] = {}

    def __getitem__(self, e):
        e = int(e)
        if e not in self.cache:
            self.cache[e] = self.fn(e)
        return self.cache[e]


def zipf_bias(E: int, zipf_s: float, device):
    """Correction bias that skews the router toward low-rank experts: log of Zipf weights,
    scaled so it competes with the random-input sigmoid scores (approximate skew; the record
    counts the experts actually touched)."""
    import torch

    r = torch.arange(1, E + 1, device=device, dtype=torch.float32)
    return -zipf_s * torch.log(r) * 0.1


def moe_route(w: MoEWeights, x):
    """Router: sigmoid scores, top-k on score + bias, weights renormalised (DeepSeek noaux_tc
    without groups). Returns ids [b, k] folded into the allocated experts, weights [b, k] fp32."""
    import torch

    scores = (x @ w.router.t()).float().sigmoid()                    # [b, E]
    _, ids = torch.topk(scores + w.bias, w.top_k, dim=-1)            # [b, k]
    tw = scores.gather(1, ids)
    tw = tw / tw.sum(-1, keepdim=True) * w.scale
    return ids.remainder_(w.n_alloc) if w.n_alloc < w.router.shape[0] else ids, tw


def moe_reference(w: MoEWeights, x, ids, tw):
    """float32, one token and one expert at a time."""
    import torch
    import torch.nn.functional as F

    xf = x.float()
    out = torch.zeros_like(xf)
    I = w.inter
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if w.gate_up is not None:
                gu, dn = w.gate_up[e].float(), w.down[e].float()
                g_, u_ = gu[:I], gu[I:]
            else:
                g_, u_, dn = w.gate[e].float(), w.up[e].float(), w.down[e].float()
            out[t] += float(tw[t, j]) * (dn @ (F.silu(g_ @ xf[t]) * (u_ @ xf[t])))
        for s in range(w.n_shared):
            if w.gate_up is not None:
                e = w.n_alloc + s
                gu, dn = w.gate_up[e].float(), w.down[e].float()
                out[t] += dn @ (F.silu(gu[:I] @ xf[t]) * (gu[I:] @ xf[t]))
            else:
                SI = w.n_shared * I
                gu, dn = w.s_gate_up.float(), w.s_down.float()
                sl = slice(s * I, (s + 1) * I)
                out[t] += dn[:, sl] @ (F.silu(gu[:SI][sl] @ xf[t]) * (gu[SI:][sl] @ xf[t]))
    return out
