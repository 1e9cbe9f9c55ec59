"""Roofline floor of one decode step through a pipeline stage: bytes that must be read, FLOPs,
and the time a perfect kernel would need on a given GPU.

For a micro-batch of `b` requests each with `context_len` tokens of KV cache:
- weights read once per step: attention projections, router, shared expert, the *distinct*
  routed experts the b tokens touch, dense MLP layers, `lm_head` on the last stage (the
  embedding reads only b rows). Formats and their scales come from `ModelConfig.formats`.
- distinct experts under uniform top-k routing: E·(1-(1-k/E)^b) (each token's k-subset holds a
  given expert with probability k/E, independently across tokens). With Zipf skew `s`
  (expert of popularity rank r chosen with weight r^-s) the per-token inclusion probability
  q_e = min(1, k·p_e) (capped mass re-spread over the rest) replaces k/E: Σ_e 1-(1-q_e)^b.
  This is an approximation for s > 0 (exact for s = 0); skew lowers the count.
- KV cache: MLA keeps (kv_lora_rank + qk_rope_head_dim) elements per token per layer; GQA
  2·kv_heads·head_dim.
- FLOPs: 2 per weight element used per token (routed: top_k experts per token) plus attention
  over the context (MLA absorbed: 2·(kv_lora+rope)·ctx + 2·kv_lora·ctx per head per token).

The floor is Σ over components of max(bytes / bandwidth, FLOPs / peak): each component is its
own kernel(s), memory- or compute-bound on its own. Bandwidth is the spec sheet's unless a
measured `mem_bw_gbps` is given. GB = 1e9 bytes. No torch here: reports/ is CPU-only.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from reports.gpu_specs import GpuSpec
from reports.model_config import ModelConfig, matrix_bytes
from reports.partition import Stage

DEFAULT_CONTEXT = 2048
LAYER_KINDS = ("attention", "moe", "dense_mlp", "lm_head", "embedding")


@dataclass(frozen=True)
class LayerFloor:
    weight_bytes: int
    kv_bytes: int
    flops: int
    floor_us: float


@dataclass(frozen=True)
class StageFloor:
    weight_bytes: int
    kv_bytes: int
    flops: int
    floor_us: float
    components_us: dict[str, float] = field(default_factory=dict)     # attention, moe, ...
    components_bytes: dict[str, int] = field(default_factory=dict)


def zipf_inclusion(E: int, k: int, zipf_s: float = 0.0) -> np.ndarray:
    """Per-token probability that each expert is among its k choices, shape [E], sums to k."""
    if not 0 < k <= E:
        raise ValueError(f"top_k must be in 1..{E}, got {k}")
    if zipf_s < 0:
        raise ValueError(f"zipf exponent must be >= 0, got {zipf_s}")
    w = np.arange(1, E + 1, dtype=np.float64) ** (-float(zipf_s))
    q = k * w / w.sum()
    for _ in range(E):  # water-fill: cap at 1, spread the excess over the uncapped experts
        over = q > 1.0
        if not over.any():
            break
        excess = float((q[over] - 1.0).sum())
        q[over] = 1.0
        free = q < 1.0
        q[free] += excess * q[free] / q[free].sum()
    return q


def expected_distinct_experts(E: int, k: int, b: int, zipf_s: float = 0.0) -> float:
    """Expected number of distinct experts touched by b tokens, each picking k of E."""
    if b < 0:
        raise ValueError(f"batch must be >= 0, got {b}")
    if zipf_s == 0.0:
        return E * (1.0 - (1.0 - k / E) ** b)
    q = zipf_inclusion(E, k, zipf_s)
    return float(np.sum(1.0 - (1.0 - q) ** b))


# ---- bytes of each component (weights read once per step) ----

def attention_weight_bytes(m: ModelConfig) -> int:
    f, H = m.formats.attention, m.hidden
    if m.attention == "mla":
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            q = matrix_bytes(m.q_lora_rank, H, f) + matrix_bytes(m.num_heads * qk, m.q_lora_rank, f)
        else:
            q = matrix_bytes(m.num_heads * qk, H, f)
        b = (q + matrix_bytes(m.kv_lora_rank + m.qk_rope_head_dim, H, f)
             + matrix_bytes(m.num_heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank, f)
             + matrix_bytes(H, m.num_heads * m.v_head_dim, f))
        norms = 2 * H + (m.q_lora_rank or 0) + m.kv_lora_rank   # bf16 norm vectors
    else:
        hd = m.head_dim
        b = (matrix_bytes(m.num_heads * hd, H, f) + 2 * matrix_bytes(m.num_kv_heads * hd, H, f)
             + matrix_bytes(H, m.num_heads * hd, f))
        norms = 2 * H
    return b + 2 * norms


def attention_params(m: ModelConfig) -> int:
    """Weight elements of the attention block (for FLOPs)."""
    H = m.hidden
    if m.attention == "mla":
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = (m.q_lora_rank * H + m.num_heads * qk * m.q_lora_rank if m.q_lora_rank
             else m.num_heads * qk * H)
        return (q + (m.kv_lora_rank + m.qk_rope_head_dim) * H
                + m.num_heads * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank
                + H * m.num_heads * m.v_head_dim)
    return 2 * m.num_heads * m.head_dim * H + 2 * m.num_kv_heads * m.head_dim * H


def mlp_bytes(H: int, inter: int, fmt: str) -> int:
    """gate [I, H] + up [I, H] + down [H, I]."""
    return 2 * matrix_bytes(inter, H, fmt) + matrix_bytes(H, inter, fmt)


def routed_expert_bytes(m: ModelConfig) -> int:
    return mlp_bytes(m.hidden, m.moe_intermediate, m.formats.routed_experts)


def kv_elems_per_token_layer(m: ModelConfig) -> int:
    if m.attention == "mla":
        return m.kv_lora_rank + m.qk_rope_head_dim
    return 2 * m.num_kv_heads * m.head_dim


def _floor_us(nbytes: float, flops: float, gpu: GpuSpec, bw: float | None) -> float:
    bw_bps = (bw or gpu.mem_bw_gbps) * 1e9
    return max(nbytes / bw_bps, flops / (gpu.bf16_tflops * 1e12)) * 1e6


def layer_floor(m: ModelConfig, kind: str, batch: int, gpu: GpuSpec, *,
                context_len: int = DEFAULT_CONTEXT, zipf_s: float = 0.0,
                mem_bw_gbps: float | None = None, kv_elem_bytes: int = 2) -> LayerFloor:
    """One component of one layer (or a stage extra) for one decode step of `batch` tokens."""
    H, b = m.hidden, batch
    if kind == "attention":
        w = attention_weight_bytes(m)
        kv = b * context_len * kv_elems_per_token_layer(m) * kv_elem_bytes
        if m.attention == "mla":
            att = 2 * m.num_heads * context_len * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
        else:
            att = 4 * m.num_heads * m.head_dim * context_len
        fl = b * (2 * attention_params(m) + att)
    elif kind == "moe":
        if not m.is_moe:
            raise ValueError(f"{m.name} has no MoE layers")
        I = m.moe_intermediate
        distinct = expected_distinct_experts(m.n_routed_experts, m.top_k, b, zipf_s)
        w = (matrix_bytes(m.n_routed_experts, H, m.formats.router)
             + (mlp_bytes(H, m.n_shared_experts * I, m.formats.shared_experts)
                if m.n_shared_experts else 0)
             + int(round(distinct * routed_expert_bytes(m))))
        kv = 0
        fl = b * 2 * (m.n_routed_experts * H + 3 * H * I * (m.top_k + m.n_shared_experts))
    elif kind == "dense_mlp":
        w, kv = mlp_bytes(H, m.dense_intermediate, m.formats.dense_mlp), 0
        fl = b * 2 * 3 * H * m.dense_intermediate
    elif kind == "lm_head":  # final norm + lm_head
        w, kv = matrix_bytes(m.vocab, H, m.formats.lm_head) + 2 * H, 0
        fl = b * 2 * m.vocab * H
    elif kind == "embedding":  # only the b rows looked up
        w, kv, fl = b * matrix_bytes(1, H, m.formats.embedding), 0, 0
    else:
        raise ValueError(f"unknown layer kind {kind!r} (one of {LAYER_KINDS})")
    return LayerFloor(weight_bytes=int(w), kv_bytes=int(kv), flops=int(fl),
                      floor_us=_floor_us(w + kv, fl, gpu, mem_bw_gbps))


def stage_floor(model: ModelConfig, stage: Stage, batch: int, gpu: GpuSpec, *,
                context_len: int = DEFAULT_CONTEXT, zipf_s: float = 0.0,
                mem_bw_gbps: float | None = None, kv_elem_bytes: int = 2) -> StageFloor:
    """Floor of one decode step of a `batch`-request micro-batch through `stage`."""
    kw = dict(context_len=context_len, zipf_s=zipf_s, mem_bw_gbps=mem_bw_gbps,
              kv_elem_bytes=kv_elem_bytes)
    n_moe = sum(1 for i in stage.layers if model.layer_is_moe(i))
    counts = {"attention": stage.num_layers, "moe": n_moe,
              "dense_mlp": stage.num_layers - n_moe,
              "embedding": int(stage.embedding), "lm_head": int(stage.lm_head)}
    wb = kvb = fl = 0
    comp_us: dict[str, float] = {}
    comp_b: dict[str, int] = {}
    for kind, n in counts.items():
        if n == 0:
            continue
        lf = layer_floor(model, kind, batch, gpu, **kw)
        wb += n * lf.weight_bytes
        kvb += n * lf.kv_bytes
        fl += n * lf.flops
        comp_us[kind] = n * lf.floor_us
        comp_b[kind] = n * (lf.weight_bytes + lf.kv_bytes)
    return StageFloor(weight_bytes=wb, kv_bytes=kvb, flops=fl,
                      floor_us=sum(comp_us.values()), components_us=comp_us,
                      components_bytes=comp_b)
