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
