"""Model dimensions and weight formats, read from a Hugging Face `config.json`.

What it gives: a frozen `ModelConfig` with the numbers the roofline and the GPU probes need
(layers, hidden size, MoE shape, attention shape) and the storage format of each weight
component. Presets ship in `configs/models/<name>.json` (HF layout, unchanged keys):
`kimi-k2` (default; Kimi K2.5-style `text_config` nesting, routed experts INT4 W4A16 group 32,
everything else bf16), `deepseek-v3` (FP8 block 128), `qwen3-moe` (Qwen3-235B-A22B, bf16),
`llama-3-70b` (dense, for contrast).

Weight formats (bytes per weight element, scales counted):
- `bf16`: 2 bytes.
- `fp8`: 1 byte + one fp32 scale per 128x128 block (DeepSeek-V3 `weight_block_size`).
- `int4`: W4A16, symmetric, group 32 along the input dim: 0.5 byte + one bf16 scale per group
  (compressed-tensors `pack-quantized`, as Kimi K2-Thinking/K2.5 ship).

A preset may carry `ppscope_weight_formats` ({component: format}) to override what the
`quantization_config` implies. `load_model("path/to/config.json")` reads any HF config of the
DeepSeek-V3, Qwen3-MoE or Llama families. A bad file raises `ConfigError` with a one-line
message naming the file and the field.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reports.base.paths import CONFIGS, read_input_json

DEFAULT_MODEL = "kimi-k2"
FORMATS = ("bf16", "fp8", "int4")
FP8_BLOCK = 128
INT4_GROUP = 32
COMPONENTS = ("attention", "routed_experts", "shared_experts", "dense_mlp", "router",
              "embedding", "lm_head")


class ConfigError(ValueError):
    """A model or GPU config that cannot be used; the message is one line naming the field."""


@dataclass(frozen=True)
class WeightFormats:
    attention: str = "bf16"
    routed_experts: str = "bf16"
    shared_experts: str = "bf16"
    dense_mlp: str = "bf16"
    router: str = "bf16"
    embedding: str = "bf16"
    lm_head: str = "bf16"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v not in FORMATS:
                raise ConfigError(f"weight format for {f.name} must be one of {FORMATS}, got {v!r}")


@dataclass(frozen=True)
class ModelConfig:
    name: str
    num_layers: int
    hidden: int
    vocab: int
    first_k_dense: int            # layers [0, first_k_dense) use the dense MLP; the rest are MoE
    dense_intermediate: int
    moe_intermediate: int
    n_routed_experts: int         # 0 for a dense model
    top_k: int
    n_shared_experts: int
    attention: str                # "mla" | "gqa"
    num_heads: int
    num_kv_heads: int             # gqa only (mla: = num_heads)
    head_dim: int                 # gqa only
    q_lora_rank: int | None = None  # mla; None = no low-rank q projection
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    formats: WeightFormats = field(default_factory=WeightFormats)
    max_position_embeddings: int | None = None   # SGLang's default context_len

    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts > 0

    def layer_is_moe(self, layer: int) -> bool:
        return self.is_moe and layer >= self.first_k_dense

    def with_formats(self, **kw: str) -> "ModelConfig":
        return dataclasses.replace(self, formats=dataclasses.replace(self.formats, **kw))

    def all_formats(self, fmt: str) -> "ModelConfig":
        """Every component in one format (e.g. `--dtype bf16` for a measurement)."""
        return self.with_formats(**{c: fmt for c in COMPONENTS})


def matrix_bytes(rows: int, cols: int, fmt: str) -> int:
    """Bytes of one [rows, cols] weight (out x in) stored in `fmt`, scales included."""
    n = rows * cols
    if fmt == "bf16":
        return 2 * n
    if fmt == "fp8":  # 1 byte each + fp32 scale per 128x128 block
        return n + 4 * math.ceil(rows / FP8_BLOCK) * math.ceil(cols / FP8_BLOCK)
    if fmt == "int4":  # 2 weights per byte + bf16 scale per group of 32 inputs, per output row
        return n // 2 + 2 * rows * math.ceil(cols / INT4_GROUP)
    raise ConfigError(f"unknown weight format {fmt!r} (one of {FORMATS})")


def preset_names() -> list[str]:
    return sorted(p.stem for p in (CONFIGS / "models").glob("*.json"))


MAX_CONFIG_BYTES = 16 << 20   # a HF config.json is a few kB; /dev/zero is refused, not read


def load_model(name_or_path: str | Path = DEFAULT_MODEL) -> ModelConfig:
    """A preset name (`configs/models/<name>.json`) or a path to a HF `config.json`."""
    s = str(name_or_path)
    p = Path(s)
    if not (s.endswith(".json") or p.exists() or "/" in s):
        p = CONFIGS / "models" / f"{s}.json"
        if not p.exists():
            raise ConfigError(f"unknown model {s!r}: presets are {', '.join(preset_names())}, "
                              "or give the path of a HF config.json")
    if not os.path.lexists(p):
        raise ConfigError(f"{p}: no such model config file")
    raw = read_input_json(p, "model config", MAX_CONFIG_BYTES, ConfigError)
    if not isinstance(raw, dict):
        raise ConfigError(f"{p.name}: top level must be a JSON object")
    name = raw.get("ppscope_name") or (p.stem if p.parent == CONFIGS / "models" else
                                       raw.get("_name_or_path") or p.stem)
    return parse_hf_config(raw, name=str(name), source=p.name)


def _get(d: dict, key: str, source: str, typ=int, default: Any = ...) -> Any:
    if key not in d or d[key] is None:
        if default is ...:
            raise ConfigError(f"{source}: field '{key}' is missing")
        return default
    v = d[key]
    if typ is int:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"{source}: field '{key}' must be a non-negative integer, got "
                              f"{repr(v)[:40]}")
        hi = _BOUNDS.get(key, _MAX_FIELD)
        if v > hi:   # no model is this big: a typo or not a model config; floors would be absurd
            raise ConfigError(f"{source}: field '{key}' is {v}, above the {hi} any model has; "
                              "is it the right config.json?")
    return v


# Upper bounds on a config's sizes, well above any released model (vocabularies reach ~262k,
# hidden sizes ~16k, layers ~128, routed experts ~384): beyond them the roofline floors are
# absurd (a vocabulary of 1e20 gives stage floors of 1e27 us).
_MAX_FIELD = 1 << 30
_BOUNDS = {"vocab_size": 1 << 24, "hidden_size": 1 << 18, "num_hidden_layers": 1 << 14,
           "num_attention_heads": 1 << 14, "num_key_value_heads": 1 << 14,
           "intermediate_size": 1 << 22, "moe_intermediate_size": 1 << 22,
           "n_routed_experts": 1 << 16, "num_experts": 1 << 16, "head_dim": 1 << 14}


def _formats_from_quant(d: dict, top: dict, source: str, moe: bool) -> WeightFormats:
    q = d.get("quantization_config") or top.get("quantization_config")
    base = "bf16"
    kw: dict[str, str] = {}
    if isinstance(q, dict):
        method = q.get("quant_method")
        if method == "fp8":  # DeepSeek-V3: every Linear but router, embedding, lm_head
            blk = q.get("weight_block_size", [FP8_BLOCK, FP8_BLOCK])
            if list(blk) != [FP8_BLOCK, FP8_BLOCK]:
                raise ConfigError(f"{source}: field 'quantization_config.weight_block_size' "
                                  f"must be [128, 128], got {blk!r}")
            kw = dict(attention="fp8", routed_experts="fp8", shared_experts="fp8",
                      dense_mlp="fp8")
        elif method == "compressed-tensors":  # Kimi K2-Thinking/K2.5: routed experts INT4 g32
            groups = q.get("config_groups") or {}
            for g in groups.values():
                w = (g or {}).get("weights") or {}
                if w.get("num_bits") == 4:
                    if w.get("group_size") not in (None, INT4_GROUP):
                        raise ConfigError(f"{source}: field 'quantization_config.config_groups."
                                          f"weights.group_size' must be 32, got "
                                          f"{w.get('group_size')!r}")
                    if moe:
                        kw["routed_experts"] = "int4"
                    else:
                        kw.update(attention="int4", dense_mlp="int4")
    over = d.get("ppscope_weight_formats") or top.get("ppscope_weight_formats") or {}
    if not isinstance(over, dict):
        raise ConfigError(f"{source}: field 'ppscope_weight_formats' must be an object")
    for k, v in over.items():
        if k not in COMPONENTS:
            raise ConfigError(f"{source}: field 'ppscope_weight_formats.{k}' is not a component "
                              f"({', '.join(COMPONENTS)})")
        kw[k] = v
    try:
        return WeightFormats(**{c: kw.get(c, base) for c in COMPONENTS})
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def parse_hf_config(raw: dict, name: str = "model", source: str = "config.json") -> ModelConfig:
    """Build a ModelConfig from a HF config dict (DeepSeek-V3/Kimi, Qwen3-MoE, Llama)."""
    d = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    src = source + (":text_config" if d is not raw else "")
    L = _get(d, "num_hidden_layers", src)
    hidden = _get(d, "hidden_size", src)
    vocab = _get(d, "vocab_size", src)
    heads = _get(d, "num_attention_heads", src)
    if L == 0 or hidden == 0 or heads == 0:
        raise ConfigError(f"{src}: field 'num_hidden_layers'/'hidden_size'/'num_attention_heads'"
                          " must be positive")
    mla = "kv_lora_rank" in d and d.get("kv_lora_rank") is not None
    # MoE: DeepSeek names (n_routed_experts) or Qwen names (num_experts)
    E = _get(d, "n_routed_experts", src, default=None)
    if E is None:
        E = _get(d, "num_experts", src, default=0)
    moe = E > 0
    top_k = _get(d, "num_experts_per_tok", src) if moe else 0
    if moe and not 0 < top_k <= E:
        raise ConfigError(f"{src}: field 'num_experts_per_tok' must be in 1..{E}, got {top_k}")
    moe_inter = _get(d, "moe_intermediate_size", src) if moe else 0
    if moe:
        if "first_k_dense_replace" in d:
            first_dense = _get(d, "first_k_dense_replace", src)
        else:  # Qwen3-MoE: decoder_sparse_step 1 and no mlp_only_layers = every layer MoE
            if _get(d, "decoder_sparse_step", src, default=1) != 1 or d.get("mlp_only_layers"):
                raise ConfigError(f"{src}: field 'decoder_sparse_step'/'mlp_only_layers': only "
                                  "every-layer MoE is supported")
            first_dense = 0
        if _get(d, "moe_layer_freq", src, default=1) != 1:
            raise ConfigError(f"{src}: field 'moe_layer_freq' must be 1")
    else:
        first_dense = L
    dense_inter = _get(d, "intermediate_size", src, default=0)
    if first_dense > 0 and dense_inter == 0:
        raise ConfigError(f"{src}: field 'intermediate_size' is missing")
    n_shared = _get(d, "n_shared_experts", src, default=0) if moe else 0
    if mla:
        att = dict(attention="mla", num_kv_heads=heads, head_dim=0,
                   q_lora_rank=_get(d, "q_lora_rank", src, default=None),
                   kv_lora_rank=_get(d, "kv_lora_rank", src),
                   qk_nope_head_dim=_get(d, "qk_nope_head_dim", src),
                   qk_rope_head_dim=_get(d, "qk_rope_head_dim", src),
                   v_head_dim=_get(d, "v_head_dim", src))
    else:
        att = dict(attention="gqa",
                   num_kv_heads=_get(d, "num_key_value_heads", src, default=heads),
                   head_dim=_get(d, "head_dim", src, default=hidden // heads))
    return ModelConfig(name=name, num_layers=L, hidden=hidden, vocab=vocab,
                       first_k_dense=min(first_dense, L), dense_intermediate=dense_inter,
                       moe_intermediate=moe_inter, n_routed_experts=E, top_k=top_k,
                       n_shared_experts=n_shared, num_heads=heads,
                       formats=_formats_from_quant(d, raw, src, moe),
                       max_position_embeddings=_get(d, "max_position_embeddings", src,
                                                    default=None),
                       **att)
