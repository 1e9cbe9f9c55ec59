import json

import pytest

from microbench.stage_cost import probe as sc
from reports.cli import main
from reports.base.model_config import load_model
from reports.base.payloads.stage_cost import LayerPoint
from reports.base.records import read_record


def test_plan_cli_writes_record_and_png(tmp_path, capsys):
    out = tmp_path / "sc.json"
    rc = main(["stage-cost", "--model", "kimi-k2", "--pp", "8", "--gpu", "rtx-pro-6000",
               "--plan", "--batches", "1,8", "--png-batch", "1", "--json", str(out)])
    assert rc == 0
    rec = read_record(out)
    d = rec.payload
    assert rec.status == "ok" and d.gpu == "rtx-pro-6000" and d.batches == (1, 8)
    assert [s.num_layers for s in d.stages] == [7, 7, 7, 8, 8, 8, 8, 8]
    assert [s.lm_head for s in d.stages][-1] is True
    last = d.stages[7].by_batch["1"]
    assert last.measured_us is None and last.floor_us > d.stages[6].by_batch["1"].floor_us
    assert set(last.floor_components_us) == {"attention", "moe", "lm_head"}
    assert d.imbalance["1"].floor > 1.0 and d.imbalance["1"].measured is None
    assert out.with_suffix(".png").stat().st_size > 1000
    assert "floor_us" in capsys.readouterr().out


@pytest.mark.parametrize("argv, words", [
    (["--plan", "--partition", "8,8"], "has 2 entries; pp is 8"),
    (["--plan", "--model", "nope"], "unknown model 'nope'"),
    (["--plan", "--gpu", "nope"], "unknown GPU 'nope'"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, words):
    assert main(["stage-cost", *argv, "--json", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err


def test_bad_config_file_names_field(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_hidden_layers": 4, "vocab_size": 10,
                               "num_attention_heads": 2}))
    assert main(["stage-cost", "--plan", "--pp", "2", "--model", str(cfg),
                 "--json", str(tmp_path / "x.json")]) == 2
    assert "field 'hidden_size' is missing" in capsys.readouterr().err


def test_measure_without_gpu_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sc, "available", lambda: "no CUDA GPU visible")
    assert main(["stage-cost", "--json", str(tmp_path / "x.json")]) == 2
    assert "needs a GPU" in capsys.readouterr().err


def test_stage_cost_sums_layers_and_imbalance():
    m = load_model("kimi-k2").all_formats("bf16")
    cfg = sc.StageCostConfig(pp=2, batches=(4,), gpu="h200", plan=True)
    stages = sc.plan_stages(m, sc.load_gpu("h200"), cfg)   # 30 + 31 layers; layer 0 dense
    layers = {"attention": {"4": LayerPoint(measured_us=10.0)},
              "moe": {"4": LayerPoint(measured_us=100.0)},
              "dense_mlp": {"4": LayerPoint(measured_us=50.0)},
              "lm_head": {"4": LayerPoint(measured_us=400.0)}}
    filled, imb = sc.fill_stage_costs(m, stages, layers)
    s0, s1 = (s.by_batch["4"] for s in filled)
    assert s0.components == {"attention": 300.0, "moe": 2900.0, "dense_mlp": 50.0}
    assert s0.measured_us == 3250.0
    assert s1.measured_us == 31 * 110.0 + 400.0                 # 3810
    assert imb["4"].measured == pytest.approx(3810 / ((3250 + 3810) / 2))
    assert s1.efficiency == pytest.approx(s1.floor_us / 3810)
    assert stages[0].by_batch["4"].measured_us is None          # the plan is left as it was
    layers["moe"]["4"] = LayerPoint(error="check failed")        # a failed layer: no total
    filled, imb = sc.fill_stage_costs(m, stages, layers)
    assert filled[0].by_batch["4"].measured_us is None and imb["4"].measured is None


def test_moe_floor_uses_distinct_experts():
    m = load_model("kimi-k2").all_formats("bf16")
    g = sc.load_gpu("h200")
    # router 5,505,024 + shared 88,080,384 + 8 x 88,080,384 bf16 experts = 798,228,480 B
    assert sc.moe_floor_us(m, 8, g, None) == pytest.approx(798_228_480 / 4800e9 * 1e6)
