"""A report on the user's own server (`ppscope sglang`, then `ppscope report` with only
sglang.json in results/): a fix for every cause the diagnosis names, and the built-in scenario
set aside (reports/scenario_aside.py).

The recordings are the lab's (tests/fixtures/sglang_lab/: SGLang 0.5.23's own server, PP2 on
its CPU backend, the lab's 4-layer Llama): slow-stage (rank 1's forward slowed, profiled
without stacks, so no module event times a layer: held out from the layer split's own tests)
and clean-c8 (host work named first). The model's config is written here: a Llama of 4 layers,
as the lab serves. Expected values are read from report.json, never typed in."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from reports.cli import main
from reports.model.report_type import Report
from reports.render.answer_table import NOT_RUN, answer_table
from reports.scenario_aside import ASIDE_TITLE

LAB = Path(__file__).parent / "fixtures" / "sglang_lab"
LLAMA_4L = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
            "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 2048}


def _report(tmp: Path, case: str, *extra: str, scenario: str | None = None):
    d = LAB / case
    res = tmp / case
    res.mkdir(parents=True)
    assert main(["sglang", "--log", str(d / "server.log"), "--traces", str(d / "traces"),
                 "--bench", str(d / "bench.jsonl"), "--json", str(res / "sglang.json"),
                 *extra]) == 0
    args = ["report", "--results", str(res)] + (["--scenario", scenario] if scenario else [])
    assert main(args) == 0
    d = json.loads((res / "report.json").read_text())
    return (Report.from_json(d, strict=True), json.loads((res / "sglang.json").read_text()),
            (res / "report.md").read_text(), (res / "report.html").read_text())


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("model") / "config.json"
    p.write_text(json.dumps(LLAMA_4L))
    return p


@pytest.fixture(scope="module")
def slow(tmp_path_factory, model):
    return _report(tmp_path_factory.mktemp("slow"), "slow-stage", "--model", str(model))


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return _report(tmp_path_factory.mktemp("clean"), "clean-c8")


def _cell(rep: Report, row: str) -> str:
    return next(r[4] for r in answer_table(rep).rows if r[0] == row)


# ------------------------------------------------------------------ the layer split (item 1)

def test_a_slow_stage_without_stacks_gets_a_layer_split_in_its_answer(slow):
    rep, sg, md, _ = slow
    # no module event in this recording: the layers come from SGLang's rule, not the traces
    assert all(r.get("layers_per_forward") is None for r in sg["data"]["loop"]["ranks"].values())
    assert sg["data"]["loop"]["num_layers"] == 4
    dg = rep.diagnosed
    assert dg.named[0] == "slow_stage"
    f = dg.layer_split
    # rank 1 is the slow one: the split that balances the loop moves a layer to rank 0
    assert (f.now, f.value) == ("2,2", "3,1")
    assert f.gain_pct > 0 and f.gain_ci[0] <= f.gain_pct <= f.gain_ci[1]
    assert "even split" in f.layers_from and "forward over its layers" in f.cost_from
    assert f.gain_pct == pytest.approx(100 * (dg.modelled_step_ms / f.step_ms - 1), abs=0.1)
    want = (f"SGLANG_PP_LAYER_PARTITION=3,1 (now 2,2): {f.gain_pct:+.0f}% "
            f"({f.gain_ci[0]:.0f}-{f.gain_ci[1]:.0f}%) at C=8 ({NOT_RUN})")
    assert _cell(rep, "stage imbalance") == want and want in md
    # the same split is tried over bench_serving's whole run with the other settings
    assert any(w.command.startswith("SGLANG_PP_LAYER_PARTITION=3,1")
               for w in rep.server_whatifs.rows)


def test_without_the_models_layers_the_split_is_said_not_estimated(tmp_path):
    rep, *_ = _report(tmp_path, "slow-stage")
    assert rep.diagnosed.layer_split is None
    cell = _cell(rep, "stage imbalance")
    assert "not estimated" in cell and "--model" in cell and "%" not in cell


def test_a_given_partition_is_the_split_the_server_ran(tmp_path, model):
    rep, sg, *_ = _report(tmp_path, "slow-stage", "--model", str(model),
                          "--layer-partition", "1,3")
    assert sg["data"]["loop"]["layer_partition"] == "1,3"
    f = rep.diagnosed.layer_split
    assert f.now == "1,3" and "SGLANG_PP_LAYER_PARTITION=1,3" in f.layers_from


# ------------------------------------------------------------------ what to do (item 4)

def test_every_named_cause_has_a_setting_or_says_none_helps(clean):
    rep, _, md, _ = clean
    dg = rep.diagnosed
    assert dg.named and dg.named[0] == "host"
    rows = {r[0]: r for r in answer_table(rep).rows}
    host = rows["host work"]
    size = next(r for r in dg.rows if r.cause == "host")
    assert host[1] == "holds" and f"by {size.size_pct:.0f}%" in host[2]
    # no setting the model tried acts on host work: said, with what would, and no gain
    assert host[4].startswith("no setting modelled acts on it; what would: ")
    assert host[4].endswith("(not estimated)") and "%" not in host[4]


def test_a_slow_hop_names_the_settings_tried_and_what_would(clean):
    rep, *_ = clean
    cell = _cell(rep, "bandwidth is not the limit")
    depth = [w for w in rep.server_whatifs.rows if w.knob == "--pp-async-batch-depth"]
    assert depth and all(w.change_pct <= rep.server_whatifs.no_change_pct for w in depth)
    assert cell.startswith("no setting tried helps (")
    for w in depth:                 # the model's own figures, each one
        assert f"{w.command} {w.change_pct:+.0f}%" in cell
    assert "faster links or fewer bytes per hop" in cell and "TP (not estimated)" in cell


# ------------------------------------------------------------------ the scenario aside (item 5)

def test_the_built_in_scenario_steps_aside_on_a_servers_report(slow):
    rep, _, md, html = slow
    assert rep.scenario_aside and rep.scenario in rep.scenario_aside
    head = md[:md.index(f"## {ASIDE_TITLE}")]
    assert md.splitlines()[2].startswith("**This report is about your server, from its own "
                                         "evidence in sglang.json: the traces of its 2 PP ranks")
    # nothing of the scenario's deployment before its own heading, in both files
    d = rep.deployment
    for text in (head, html[:html.index('<h2 id="scenario">')]):
        for word in (d.model, d.gpu, "Scenario model:", "Every figure below is estimated"):
            assert word not in text, word
    # the scenario's sections follow everything about the server
    for sec in ("## Throughput", "## What-ifs (one server setting", "## Inputs",
                "## Per-stage cost", "## Measure your server"):
        assert md.index(sec) > md.index(f"## {ASIDE_TITLE}") > md.index("## Your server")
    assert html.index('id="throughput"') > html.index('id="scenario"') > html.index('id="server"')
    detail = md[md.index("### In detail"):md.index("## Your server: diagnosis")]
    assert "describe another deployment" not in detail and "make all" not in detail
    # a hypothesis only the scenario's model judged is not a verdict on this server
    routing = next(v for v in rep.verdicts if v.hypothesis == "MoE routing imbalance")
    assert routing.verdict == "not enough evidence"
    # "Your server" holds no modelled busy of the scenario's PP8 beside the server's PP2
    assert all(not r.modelled_busy_pct for r in rep.server.ranks)
    assert not [n for n in rep.server.notes if "the scenario has pp=" in n]
    assert "modelled compute %" not in md and "the scenario has pp=" not in md


def test_a_given_scenario_keeps_its_modelled_busy_beside_the_server(tmp_path):
    rep, _, _, _ = _report(tmp_path, "clean-c8", scenario="seed-pp8")
    assert any(r.modelled_busy_pct for r in rep.server.ranks)


def test_a_scenario_given_by_the_user_is_not_set_aside(tmp_path):
    rep, _, md, _ = _report(tmp_path, "slow-stage", scenario="seed-pp8")
    assert rep.scenario_aside is None and ASIDE_TITLE not in md
    assert md.index("## Throughput") < md.index("## Verdicts on the hypotheses")


def test_the_diagnosis_says_how_the_split_was_estimated(slow):
    rep, _, md, html = slow
    f = rep.diagnosed.layer_split
    line = next(x for x in md.splitlines() if x.startswith("- Layer split for the slow stage"))
    assert f"SGLANG_PP_LAYER_PARTITION={f.value} instead of {f.now}" in line
    assert f.layers_from in line and f.cost_from in line
    assert "Layer split for the slow stage" in html
