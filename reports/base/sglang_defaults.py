"""SGLang's server defaults that shape the PP loop, as pure functions (no torch, no SGLang).

Every rule here is read from SGLang 0.5.23 (the PyPI wheel) and names the file and function it
comes from; `tests/test_sglang_oracle.py` (marker `sglang`) checks them against SGLang's own
functions where SGLang is installed.

What is derived and why it matters for a PP deployment:
- `chunked_prefill_size`: the prefill token budget of one slot visit (with 1000-token prompts a
  burst of 32 requests splits ~8 per slot under the 8192 default, whatever the per-slot cap).
- decode CUDA-graph `max_bs` and the captured sizes (reports/base/cuda_graphs.py).
- `mem_fraction_static` -> the KV pool in tokens -> `max_running_requests` -> the per-slot cap
  `pp_max_micro_batch_size = max(max_running_requests // pp_size, 1)`
  (reports/base/server_settings.py).

GPU memory: SGLang buckets by `nvidia-smi`'s `memory.total` in MiB; the spec sheets' memory
size is taken as GiB (`mem_gb * 1024` MiB): GPU memory sizes are binary (a 96 GB RTX PRO 6000
reports 97887 MiB; the bucket edges are far from every listed GPU).

What SGLang measures at start-up and ppscope can only estimate (each a stated estimate, used
only when the user's launch command or server log does not give `max_running_requests`):
`CONTEXT_OVERHEAD_GIB` (CUDA context and communicator buffers before the model loads) and the
weights each rank holds (reports/base/roofline.py: `stage_weight_bytes`).
"""
from __future__ import annotations

from dataclasses import dataclass

from reports.base.model_config import ModelConfig
from reports.base.partition import pp_partition
from reports.base.roofline import kv_elems_per_token_layer, stage_weight_bytes

SGLANG_VERSION = "0.5.23"
MIB = 1 << 20
GIB = 1 << 30

# SGLang 0.5.23 arg_groups/fields/schedule.py, `max_prefill_tokens` default.
MAX_PREFILL_TOKENS = 16384
# SGLang 0.5.23 arg_groups/fields/parallel.py, `pp_async_batch_depth` default.
PP_ASYNC_BATCH_DEPTH = 0
# SGLang 0.5.23 mem_cache/kv_cache_configurator.py, `resolve_max_num_reqs`:
# estimated = clamp(token_capacity / context_len * 512, 2048, 4096).
MRR_PER_CONTEXT = 512
MRR_MIN, MRR_MAX = 2048, 4096
# Stated estimate (not SGLang's): GPU memory taken before the model loads (CUDA context,
# NCCL/gloo buffers); SGLang measures it as the free memory before loading.
CONTEXT_OVERHEAD_GIB = 1.0


def gpu_mem_mib(mem_gb: float) -> float:
    """Spec-sheet memory size (binary GB) -> MiB as SGLang's `get_device_memory_capacity`."""
    return float(mem_gb) * 1024


def default_chunked_prefill_size(mem_mib: float | None) -> int:
    """SGLang 0.5.23 arg_groups/memory_hook.py, `handle_gpu_memory_settings`: by GPU memory
    (MiB): < 20 GiB 2048, < 60 GiB 4096, < 160 GiB 8192, else 16384; unknown memory 4096."""
    if mem_mib is None:
        return 4096
    if mem_mib < 20 * 1024:
        return 2048
    if mem_mib < 60 * 1024:
        return 4096
    if mem_mib < 160 * 1024:
        return 8192
    return 16384


def default_decode_max_bs(mem_mib: float | None, tp: int = 1,
                          max_running_requests: int | None = None) -> int:
    """SGLang 0.5.23 arg_groups/memory_hook.py, `handle_gpu_memory_settings`: decode CUDA-graph
    max_bs by GPU memory and TP (< 20 GiB 8; < 35 GiB 48 / 160 with tp >= 4; < 60 GiB 32 / 160;
    < 160 GiB 256 / 512; else 512; unknown 160), then lowered to `--max-running-requests` when
    the user set it (not when SGLang derives it later from the KV pool)."""
    if mem_mib is None:
        bs = 160
    elif mem_mib < 20 * 1024:
        bs = 8
    elif mem_mib < 35 * 1024:
        bs = 48 if tp < 4 else 160
    elif mem_mib < 60 * 1024:
        bs = 32 if tp < 4 else 160
    elif mem_mib < 160 * 1024:
        bs = 256 if tp < 4 else 512
    else:
        bs = 512
    if max_running_requests is not None and bs > max_running_requests:
        bs = int(max_running_requests)
    return bs


def default_mem_fraction_static(mem_mib: float, chunked_prefill_size: int, decode_max_bs: int,
                                tp: int = 1, pp: int = 1, decode_graphs: bool = True) -> float:
    """SGLang 0.5.23 arg_groups/memory_hook.py, `handle_gpu_memory_settings` (+ `reserve_for_
    graph_mb`), for a non-disaggregated server without DP attention, DeepEP or a VLM:
    reserved MiB = 512 + max(chunked_prefill_size, 2048) * 1.5 + tp * pp / 8 * 1024
    + 2 * decode max_bs (decode graphs on); at least 10 GiB on GPUs over 60 GiB; prefill CUDA
    graphs are off by default under PP (arg_groups/cuda_graph_hook.py,
    `apply_cuda_graph_compatibility`), so they reserve nothing here.
    mem_fraction_static = round((mem - reserved) / mem, 3)."""
    reserved = 512 + max(chunked_prefill_size, 2048) * 1.5 + tp * pp / 8 * 1024
    if decode_graphs:
        reserved += decode_max_bs * 2
    if mem_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((mem_mib - reserved) / mem_mib, 3)


def kv_cell_bytes(model: ModelConfig, num_layers: int, kv_elem_bytes: int = 2) -> int:
    """KV-cache bytes per token on a rank with `num_layers` layers: SGLang 0.5.23
    model_executor/pool_configurator.py (`_compute_cell_size`): MLA keeps kv_lora_rank +
    qk_rope_head_dim elements per layer (mem_cache/kv_cache_configurator.py,
    `calculate_mla_kv_cache_dim`); MHA/GQA 2 * kv_heads * head_dim. bf16 cache by default."""
    return kv_elems_per_token_layer(model) * num_layers * kv_elem_bytes


def default_max_running_requests(token_capacity: int, context_len: int) -> int:
    """SGLang 0.5.23 mem_cache/kv_cache_configurator.py, `resolve_max_num_reqs`, without
    --max-running-requests: min(clamp(capacity / context_len * 512, 2048, 4096), capacity // 2)."""
    est = int(token_capacity / context_len * MRR_PER_CONTEXT)
    est = max(min(est, MRR_MAX), MRR_MIN)
    return min(est, token_capacity // 2)


def resolve_max_running_requests(given: int | None, token_capacity: int,
                                 context_len: int) -> int:
    """The value the server runs with: the user's, lowered to capacity // 2 if the KV pool
    cannot hold it (same function), else the default rule."""
    if given is not None:
        return min(max(1, int(given)), token_capacity // 2)
    return default_max_running_requests(token_capacity, context_len)


@dataclass(frozen=True)
class KvEstimate:
    """How ppscope derives the KV pool the way SGLang sizes it (per rank, the minimum wins)."""
    mem_fraction_static: float
    weights_gib: tuple[float, ...]      # per rank
    kv_gib: tuple[float, ...]           # per rank, the pool SGLang would allocate
    cell_bytes: tuple[int, ...]         # per rank, KV bytes per token
    token_capacity: int                 # min over ranks (SGLang all-reduces MIN across PP)
    context_len: int
    max_running_requests: int


def estimate_kv(model: ModelConfig, mem_gb: float, pp: int, *, tp: int = 1,
                partition: str | None = None, chunked_prefill_size: int | None = None,
                decode_max_bs: int | None = None, mem_fraction_static: float | None = None,
                context_len: int | None = None, max_running_requests: int | None = None,
                decode_graphs: bool = True) -> KvEstimate:
    """SGLang's KV sizing (0.5.23 mem_cache/kv_cache_configurator.py, `_profile_available_bytes`:
    pool = free memory after loading - memory before loading * (1 - mem_fraction_static);
    token capacity = pool / cell bytes, the minimum over PP ranks) with the stated estimates
    above for what SGLang measures. TP splits the weights and the MLA latent is replicated
    (tp > 1 is rough: attention heads are split, the latent KV is not)."""
    mem_mib = gpu_mem_mib(mem_gb)
    chunk = chunked_prefill_size or default_chunked_prefill_size(mem_mib)
    max_bs = decode_max_bs or default_decode_max_bs(mem_mib, tp, max_running_requests)
    mfs = mem_fraction_static if mem_fraction_static is not None else \
        default_mem_fraction_static(mem_mib, chunk, max_bs, tp, pp, decode_graphs)
    total = mem_mib * MIB
    before = total - CONTEXT_OVERHEAD_GIB * GIB
    weights, kv, cells, caps = [], [], [], []
    for st in pp_partition(model.num_layers, pp, partition):
        w = stage_weight_bytes(model, st) / tp
        pool = max(0.0, (before - w) - before * (1 - mfs))
        cell = kv_cell_bytes(model, st.num_layers)
        weights.append(w / GIB)
        kv.append(pool / GIB)
        cells.append(cell)
        caps.append(int(pool // cell))
    cap = min(caps)
    ctx = int(context_len or model.max_position_embeddings or 4096)
    return KvEstimate(mfs, tuple(weights), tuple(kv), tuple(cells), cap, ctx,
                      resolve_max_running_requests(max_running_requests, cap, ctx)
                      if cap > 1 else 0)
