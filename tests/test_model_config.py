import json

import pytest

from reports.base.gpu_specs import gpu_names, load_gpu, match_gpu
from reports.base.model_config import ConfigError, load_model, matrix_bytes, parse_hf_config


def test_kimi_k2_preset_reads_text_config_and_int4_experts():
    m = load_model("kimi-k2")
    assert (m.num_layers, m.hidden, m.vocab, m.first_k_dense) == (61, 7168, 163840, 1)
    assert (m.n_routed_experts, m.top_k, m.n_shared_experts, m.moe_intermediate) == (384, 8, 1, 2048)
    assert (m.attention, m.num_heads, m.q_lora_rank, m.kv_lora_rank) == ("mla", 64, 1536, 512)
    assert m.formats.routed_experts == "int4"
    assert {m.formats.attention, m.formats.shared_experts, m.formats.dense_mlp,
            m.formats.lm_head} == {"bf16"}
    assert not m.layer_is_moe(0) and m.layer_is_moe(1) and m.layer_is_moe(60)


def test_other_presets():
    ds = load_model("deepseek-v3")
    assert (ds.n_routed_experts, ds.num_heads, ds.first_k_dense, ds.vocab) == (256, 128, 3, 129280)
    assert ds.formats.routed_experts == "fp8" and ds.formats.lm_head == "bf16"
    q = load_model("qwen3-moe")
    assert (q.attention, q.num_kv_heads, q.n_routed_experts, q.n_shared_experts, q.first_k_dense) \
        == ("gqa", 4, 128, 0, 0)
    ll = load_model("llama-3-70b")
    assert not ll.is_moe and ll.first_k_dense == 80 and ll.head_dim == 128


def test_matrix_bytes_formats():
    # [2048, 7168] gate_proj of one K2 expert
    assert matrix_bytes(2048, 7168, "bf16") == 2048 * 7168 * 2
    # fp8: 1 B/elem + fp32 scale per 128x128 block: 16 x 56 blocks
    assert matrix_bytes(2048, 7168, "fp8") == 2048 * 7168 + 4 * 16 * 56
    # int4 g32: 0.5 B/elem + bf16 scale per 32 inputs per row: 2048 rows x 224 groups
    assert matrix_bytes(2048, 7168, "int4") == 2048 * 7168 // 2 + 2 * 2048 * 224


def test_all_formats_override():
    m = load_model("kimi-k2").all_formats("bf16")
    assert m.formats.routed_experts == "bf16"


def test_hf_path_and_errors(tmp_path):
    raw = json.loads(load_model.__globals__["CONFIGS"].joinpath("models/deepseek-v3.json").read_text())
    p = tmp_path / "config.json"
    p.write_text(json.dumps(raw))
    assert load_model(str(p)).n_routed_experts == 256
    del raw["hidden_size"]
    p.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="field 'hidden_size' is missing"):
        load_model(str(p))
    raw["hidden_size"] = "big"
    p.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="field 'hidden_size' must be a non-negative integer"):
        load_model(str(p))
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_model(str(p))
    with pytest.raises(ConfigError, match="unknown model 'nope'"):
        load_model("nope")


def test_bad_format_override_names_field():
    with pytest.raises(ConfigError, match="ppscope_weight_formats.experts"):
        parse_hf_config({"num_hidden_layers": 2, "hidden_size": 8, "vocab_size": 10,
                         "num_attention_heads": 2, "intermediate_size": 16,
                         "ppscope_weight_formats": {"experts": "int4"}})
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        parse_hf_config({"num_hidden_layers": 2, "hidden_size": 8, "vocab_size": 10,
                         "num_attention_heads": 2, "num_experts": 4, "num_experts_per_tok": 9,
                         "moe_intermediate_size": 4})


def test_gpu_specs():
    assert {"rtx-pro-6000", "h200", "h100-sxm", "a100-80gb", "l40s"} <= set(gpu_names())
    g = load_gpu("rtx-pro-6000")
    assert (g.mem_bw_gbps, g.mem_gb, g.pcie_gen, g.pcie_lanes, g.nvlink) == (1792, 96, 5, 16, False)
    assert round(g.pcie_gbps, 1) == 63.0
    assert load_gpu("h200").mem_bw_gbps == 4800 and load_gpu("h200").nvlink
    assert all(load_gpu(n).source for n in gpu_names())
    assert match_gpu("NVIDIA RTX PRO 6000 Blackwell Workstation Edition").name == "rtx-pro-6000"
    assert match_gpu("NVIDIA H100 80GB HBM3").name == "h100-sxm"
    assert match_gpu("NVIDIA H100 PCIe").name == "h100-pcie"
    assert match_gpu("Tesla T4") is None


def test_bad_gpu_file_names_field(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"name": "x", "mem_bw_gbps": -1, "nvlink": False, "source": "s"}))
    with pytest.raises(ConfigError, match="x.json: field 'mem_bw_gbps'"):
        load_gpu(str(p))


def test_gpu_link_bandwidth_and_pcie_gen(tmp_path):
    assert load_gpu("rtx-pro-6000").link_gbps == load_gpu("rtx-pro-6000").pcie_gbps
    assert round(load_gpu("l40s").pcie_gbps, 2) == 31.5  # Gen4 x16
    assert load_gpu("h200").link_gbps == 900  # NVLink wins over PCIe
    p = tmp_path / "g.json"
    p.write_text(json.dumps({"mem_bw_gbps": 1, "bf16_tflops": 1, "mem_gb": 1, "pcie_gen": 7,
                             "pcie_lanes": 16, "nvlink": False, "source": "s"}))
    with pytest.raises(ConfigError, match="g.json: field 'pcie_gen' must be one of 3, 4, 5, 6"):
        load_gpu(str(p))
