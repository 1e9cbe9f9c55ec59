"""Roofline floor of one decode step through a pipeline stage: bytes that must be read, FLOPs,
and the time a perfect kernel would need on a given GPU.

For a micro-batch of `b` requests each with `context_len` tokens of KV cache:
- weights read once per step: attention projections, router, shared expert, the *distinct*
  routed experts the b tokens touch, dense MLP layers, `lm_head` on the last stage (the
  embedding reads only b rows). Formats and their scales come from `ModelConfig.formats`.
- distinct experts under uniform top-k routing: E·(1-(1-k/E)^b) (each token's k-subset holds a
  given expert with probability k/E, independently across tokens). With Zipf skew `s` a token
  picks its k experts one after another without replacement, each time with weight r^-s among
  those left (r = popularity rank; Plackett-Luce, what top-k of noisy router scores gives).
  Its per-token inclusion probability q_e replaces k/E: Σ_e 1-(1-q_e)^b, exact given q_e.
  q_e comes from the exponential race (expert j fires at T_j ~ Exp(w_j); the first k to fire
  are picked): q_e = ∫ w_e e^(-w_e t) P(fewer than k others fired by t) dt, integrated
  numerically (Σ q_e = k to ~1e-9). Skew lowers the count.
- `skew_spread`: a seeded Monte-Carlo of the same routing, token by token, for the stage-to-
  stage spread that skew causes (see its docstring).
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
from functools import lru_cache

import numpy as np

from reports.base.gpu_specs import GpuSpec
from reports.base.model_config import ModelConfig, matrix_bytes
from reports.base.partition import Stage, imbalance

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


def zipf_weights(E: int, zipf_s: float) -> np.ndarray:
    """Popularity of the expert of rank r = 1..E, r^-s normalised to sum 1, shape [E]."""
    if zipf_s < 0:
        raise ValueError(f"zipf exponent must be >= 0, got {zipf_s}")
    w = np.arange(1, E + 1, dtype=np.float64) ** (-float(zipf_s))
    return w / w.sum()


@lru_cache(maxsize=64)
def _inclusion(E: int, k: int, zipf_s: float) -> tuple[float, ...]:
    w = zipf_weights(E, zipf_s)                                  # [E], sums to 1
    # t grid (log-spaced): below t_lo fewer than k experts fire with probability ~1 (t_lo^k),
    # above t_hi the k most popular have all fired (P < k·e^-60).
    t_lo, t_hi = 1e-4, 60.0 / np.sort(w)[-k]
    x = np.linspace(np.log(t_lo), np.log(t_hi), 2001)
    t = np.exp(x)                                                # [G]
    p = -np.expm1(-np.outer(w, t))                               # [E, G] P(T_j < t)
    # Poisson-binomial counts truncated to 0..k-1, prefix over experts 0..e-1 and suffix
    # over e+1..E-1, so "all but e" is one convolution (no unstable deconvolution). The
    # prefixes are kept, the suffix is carried down from the last expert: one [E, k, G] array
    # instead of three (the same sums in the same order, a fifth of the memory to touch).
    pre = np.empty((E, k, t.size))
    cur = np.zeros((k, t.size))
    cur[0] = 1.0
    for e in range(E):
        pre[e] = cur
        nxt = cur * (1 - p[e])
        nxt[1:] += cur[:-1] * p[e]
        cur = nxt
    fewer = np.empty((E, t.size))                                # P(others fired < k by t)
    suf = np.zeros((k, t.size))
    suf[0] = 1.0
    for j in range(E - 1, -1, -1):
        fewer[j] = np.einsum("ag,ag->g", pre[j], np.cumsum(suf, axis=0)[::-1])
        nxt = suf * (1 - p[j])
        nxt[1:] += suf[:-1] * p[j]
        suf = nxt
    f = w[:, None] * np.exp(-np.outer(w, t)) * fewer * t         # integrand in x = log t
    q = (1 - np.exp(-w * t_lo)) + np.sum((f[:, 1:] + f[:, :-1]) * 0.5 * np.diff(x), axis=1)
    return tuple(np.minimum(q, 1.0).tolist())


def zipf_inclusion(E: int, k: int, zipf_s: float = 0.0) -> np.ndarray:
    """Per-token probability that each expert (by popularity rank) is among the k a token
    picks under Zipf(s) routing without replacement; shape [E], sums to k."""
    if not 0 < k <= E:
        raise ValueError(f"top_k must be in 1..{E}, got {k}")
    if zipf_s < 0:
        raise ValueError(f"zipf exponent must be >= 0, got {zipf_s}")
    if zipf_s == 0.0 or k == E:
        return np.full(E, k / E)
    return np.array(_inclusion(E, k, float(zipf_s)))


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


def routed_expert_bytes(m: ModelConfig, fmt: str | None = None) -> int:
    """One routed expert (gate, up, down) in `fmt`, by default the model's routed format."""
    return mlp_bytes(m.hidden, m.moe_intermediate, fmt or m.formats.routed_experts)


def moe_fixed_bytes(m: ModelConfig) -> int:
    """Bytes an MoE layer reads whatever the routing: router + shared expert(s)."""
    return (matrix_bytes(m.n_routed_experts, m.hidden, m.formats.router)
            + (mlp_bytes(m.hidden, m.n_shared_experts * m.moe_intermediate,
                         m.formats.shared_experts) if m.n_shared_experts else 0))


def moe_weight_bytes(m: ModelConfig, fmt: str, experts: int | None = None) -> int:
    """Bytes of the weights one MoE layer allocates with its routed experts in `fmt`, `experts`
    of them (default all; a probe may allocate a sample): router [E, H] in bf16, `experts`
    routed experts in `fmt`, each of the S shared experts as one more expert, in `fmt` when the
    model keeps them in `fmt`, else bf16 (a kernel runs its own format or bf16, nothing else).
    This is what microbench/kernels allocates; all bf16 it is 2·(E·H + (n+S)·3·H·I)."""
    E, S = m.n_routed_experts, m.n_shared_experts
    n = min(experts or E, E)
    shared_fmt = fmt if m.formats.shared_experts == fmt else "bf16"
    return (matrix_bytes(E, m.hidden, "bf16") + n * routed_expert_bytes(m, fmt)
            + S * routed_expert_bytes(m, shared_fmt))


def stage_weight_bytes(m: ModelConfig, stage: Stage) -> int:
    """Weights a stage's GPU holds (what loading the model leaves resident): every layer's
    attention, all routed experts + router + shared expert (MoE layers) or the dense MLP, the
    whole embedding table on the first stage and final norm + lm_head on the last."""
    per_moe = moe_fixed_bytes(m) + m.n_routed_experts * routed_expert_bytes(m) if m.is_moe else 0
    per_dense = mlp_bytes(m.hidden, m.dense_intermediate, m.formats.dense_mlp)
    n_moe = sum(1 for i in stage.layers if m.layer_is_moe(i))
    total = (stage.num_layers * attention_weight_bytes(m) + n_moe * per_moe
             + (stage.num_layers - n_moe) * per_dense)
    if stage.embedding:
        total += matrix_bytes(m.vocab, m.hidden, m.formats.embedding)
    if stage.lm_head:
        total += matrix_bytes(m.vocab, m.hidden, m.formats.lm_head) + 2 * m.hidden
    return int(total)


def kv_elems_per_token_layer(m: ModelConfig) -> int:
    if m.attention == "mla":
        return m.kv_lora_rank + m.qk_rope_head_dim
    return 2 * m.num_kv_heads * m.head_dim


def floor_us(nbytes: float, flops: float, gpu: GpuSpec, bw: float | None) -> float:
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
        w = moe_fixed_bytes(m) + int(round(distinct * routed_expert_bytes(m)))
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
                      floor_us=floor_us(w + kv, fl, gpu, mem_bw_gbps))


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


# ---- routing skew: Monte-Carlo of the distinct experts and the stage-to-stage spread ----

POOL_LAYERS = 1024   # independent layer routings simulated; draws pick layers from this pool
# stage_floor needs a GPU for its time; bytes do not depend on it
BYTES_ONLY_GPU = GpuSpec(name="bytes-only", mem_bw_gbps=1.0, bf16_tflops=1.0, mem_gb=0.0, pcie_gen=5,
                  pcie_lanes=16, nvlink=False)


@dataclass(frozen=True)
class SkewSpread:
    """Routing of one micro-batch of `batch` tokens through every MoE layer, `draws` times."""
    batch: int
    zipf_s: float
    draws: int
    distinct_mean: float              # Monte-Carlo mean distinct experts per MoE layer
    distinct_expected: float          # expected_distinct_experts (exact formula)
    distinct_sem: float               # standard error of distinct_mean (pool of layers)
    moe_bytes_per_token: float        # router + shared + expected routed bytes / token / MoE layer
    stage_bytes_mean: tuple[float, ...]
    stage_bytes_p10: tuple[float, ...]
    stage_bytes_p90: tuple[float, ...]
    max_over_mean: float              # E over draws of max/mean stage bytes
    max_over_mean_of_means: float     # max/mean of the mean stage bytes (the layer split alone)
    slowest_stage_loss: float         # E[max_i bytes_i] / max_i E[bytes_i] - 1 (>= 0)


def route_tokens(rng: np.random.Generator, E: int, k: int, zipf_s: float, n: int) -> np.ndarray:
    """n tokens, each picks k distinct experts one after another with Zipf(s) weights among
    those left (draws with replacement, repeats rejected: the same law). -> [n, k] ranks."""
    cdf = np.cumsum(zipf_weights(E, zipf_s))
    cdf[-1] = 1.0
    picks = np.empty((n, k), dtype=np.int64)
    for j in range(k):
        todo = np.arange(n)
        while todo.size:
            c = np.minimum(np.searchsorted(cdf, rng.random(todo.size), side="right"), E - 1)
            dup = (picks[todo, :j] == c[:, None]).any(axis=1)
            picks[todo[~dup], j] = c[~dup]
            todo = todo[dup]
    return picks


def distinct_by_prefix(picks: np.ndarray, E: int) -> np.ndarray:
    """picks [layers, tokens, k] -> distinct experts touched by the first b tokens,
    [layers, tokens] (column b-1 = b tokens), via the token index where each expert is first hit."""
    L, B, k = picks.shape
    first = np.full((L, E), B, dtype=np.int64)                   # [layers, experts]
    tok = np.broadcast_to(np.arange(B)[None, :, None], picks.shape)
    np.minimum.at(first, (np.broadcast_to(np.arange(L)[:, None, None], picks.shape), picks), tok)
    hist = np.bincount((np.arange(L)[:, None] * (B + 1) + first).ravel(),
                       minlength=L * (B + 1)).reshape(L, B + 1)
    return np.cumsum(hist, axis=1)[:, :B]


def skew_spread(model: ModelConfig, stages, batch, zipf_s: float, draws: int = 200,
                seed: int = 0, *, context_len: int = DEFAULT_CONTEXT,
                pool: int = POOL_LAYERS) -> dict[int, SkewSpread]:
    """Seeded Monte-Carlo of routing skew under pipeline parallelism, for each batch size.

    Under PP every GPU holds all experts of its own layers, so skew cannot idle a GPU the way it
    does under expert parallelism. It changes (a) how many distinct experts a micro-batch reads
    (skew concentrates tokens: fewer bytes) and (b) each stage's bytes per step, which now vary
    from layer to layer and step to step. Which experts are hot differs per layer, but a layer's
    distinct count depends only on the popularity curve, not on which experts hold it (no
    expert placement under PP), so layers are independent and identically distributed: we route
    `pool` layers token by token (the largest batch; smaller batches are its first b tokens) and
    each of `draws` pipelines takes its MoE layers from that pool at random. Stage bytes = the
    non-routed bytes of `stage_floor` (attention, KV, router, shared expert, dense, lm_head,
    embedding) + distinct · bytes of one routed expert. Returns {batch: SkewSpread}.
    `slowest_stage_loss` bounds what the spread costs a pipeline paced by its slowest stage.
    """
    batches = sorted({int(batch)} if np.isscalar(batch) else {int(b) for b in batch})
    if not batches or batches[0] < 1:
        raise ValueError(f"batch sizes must be >= 1, got {batch}")
    if draws < 1 or pool < 2:
        raise ValueError(f"draws must be >= 1 and pool >= 2, got {draws}, {pool}")
    if not model.is_moe:
        raise ValueError(f"{model.name} has no MoE layers")
    E, k, bmax = model.n_routed_experts, model.top_k, batches[-1]
    rng = np.random.default_rng(seed)
    picks = route_tokens(rng, E, k, zipf_s, pool * bmax).reshape(pool, bmax, k)
    distinct = distinct_by_prefix(picks, E)                      # [pool, bmax]
    moe_of = [[i for i in st.layers if model.layer_is_moe(i)] for st in stages]
    n_moe = sum(len(x) for x in moe_of)
    choice = rng.integers(0, pool, size=(draws, n_moe))          # [draws, moe layers]
    owner = np.repeat(np.arange(len(stages)), [len(x) for x in moe_of])
    reb = routed_expert_bytes(model)
    out = {}
    for b in batches:
        d = distinct[:, b - 1].astype(np.float64)                # [pool]
        per_stage = np.zeros((draws, len(stages)))
        np.add.at(per_stage.T, owner, d[choice].T)               # Σ distinct over a stage's layers
        fixed = []
        for st, ml in zip(stages, moe_of):
            f = stage_floor(model, st, b, BYTES_ONLY_GPU, context_len=context_len)
            uni = int(round(expected_distinct_experts(E, k, b) * reb))
            fixed.append(f.weight_bytes + f.kv_bytes - len(ml) * uni)
        sb = np.asarray(fixed)[None, :] + per_stage * reb        # [draws, stages]
        mean = sb.mean(axis=0)
        out[b] = SkewSpread(
            batch=b, zipf_s=float(zipf_s), draws=draws, distinct_mean=float(d.mean()),
            distinct_expected=expected_distinct_experts(E, k, b, zipf_s),
            distinct_sem=float(d.std(ddof=1) / np.sqrt(pool)),
            moe_bytes_per_token=(moe_fixed_bytes(model)
                                 + expected_distinct_experts(E, k, b, zipf_s) * reb) / b,
            stage_bytes_mean=tuple(mean.tolist()),
            stage_bytes_p10=tuple(np.percentile(sb, 10, axis=0).tolist()),
            stage_bytes_p90=tuple(np.percentile(sb, 90, axis=0).tolist()),
            max_over_mean=float(np.mean(sb.max(axis=1) / sb.mean(axis=1))),
            max_over_mean_of_means=imbalance(mean.tolist()),
            slowest_stage_loss=float(sb.max(axis=1).mean() / mean.max() - 1.0))
    return out
