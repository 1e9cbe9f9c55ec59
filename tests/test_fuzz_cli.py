"""Every sub-command against bad values: the answer is a result (exit 0) or one line on stderr
with exit 2, never a traceback or an "internal error" (exit 1), and a bad value never replaces a
good record. CPU paths only (--plan, offline topology, readers, report, dispatch without GPUs)."""
from __future__ import annotations

import json

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from reports.cli import main  # noqa: E402

BAD_NUMBERS = st.sampled_from(["nan", "inf", "-inf", "-1", "0", "-0.5", "1e400", "abc", "",
                               "1e9", "3.5", "0x10", "1,2", " 7 ", "NaN", "-1e-9"])

# (argv before the value, flag) for numeric flags reachable without a GPU
CASES = [
    (["stage-cost", "--plan", "--gpu", "rtx-pro-6000"], "--mem-bw"),
    (["stage-cost", "--plan", "--gpu", "rtx-pro-6000"], "--context"),
    (["stage-cost", "--plan", "--gpu", "rtx-pro-6000"], "--pp"),
    (["graphs", "--plan"], "--max-bs"),
    (["graphs", "--plan"], "--pp"),
    (["dispatch"], "--pp"),
    (["dispatch"], "--seconds"),
    (["dispatch"], "--cost-us"),
    (["dispatch"], "--stagger-ms"),
    (["report"], "--observed"),
]


def _run(argv, capsys) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as e:          # argparse rejects a value: its usage line + exit 2
        rc = e.code
    err = capsys.readouterr().err
    return rc, err


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(CASES), value=BAD_NUMBERS)
def test_bad_numbers_are_one_line_errors(case, value, tmp_path, capsys):
    head, flag = case
    out = tmp_path / "r"
    argv = head + [flag, value, "--json" if head[0] != "report" else "--results", str(out / "x.json")
                   if head[0] != "report" else str(out)]
    rc, err = _run(argv, capsys)
    assert rc in (0, 2), (argv, rc, err)
    assert "Traceback" not in err and "internal error" not in err, (argv, err)
    if rc == 2 and "usage:" not in err:
        assert len([ln for ln in err.splitlines() if ln.strip()]) <= 2, err


def test_a_failed_run_keeps_the_good_record(tmp_path, capsys):
    path = tmp_path / "stage_cost.json"
    assert main(["stage-cost", "--plan", "--gpu", "rtx-pro-6000", "--json", str(path)]) == 0
    good = path.read_text()
    for bad in (["--mem-bw", "nan"], ["--context", "-5"]):
        rc, _ = _run(["stage-cost", "--plan", "--gpu", "rtx-pro-6000", "--json", str(path)] + bad,
                     capsys)
        assert rc == 2 and path.read_text() == good
    assert json.loads(good)["status"] == "ok"


@pytest.mark.parametrize("argv", [
    ["report", "--results", "/dev/null"],
    ["sglang", "--log", "/dev/zero"],
    ["sglang", "--bench", "/"],
    ["topology", "--from-nvidia-smi", "/dev/null"],
    ["report", "--observed", "100000:5"],
])
def test_odd_paths_and_sizes(argv, capsys, tmp_path):
    if argv[0] in ("sglang", "topology"):
        argv = argv + ["--json", str(tmp_path / "x.json")]
    rc, err = _run(argv, capsys)
    assert rc in (0, 2) and "Traceback" not in err and "internal error" not in err, err


@pytest.mark.parametrize("value", ["a,b", "4", "3,3", "0,4", "4,0", "-1,5", "2,2,0", "", "2;2"])
def test_a_bad_layer_partition_is_one_line_and_keeps_the_record(value, tmp_path, capsys):
    # `ppscope sglang --layer-partition`, checked as SGLang's get_pp_indices checks it against
    # the traced ranks (2) and the model's layers (4, from --model's config.json)
    from pathlib import Path
    lab = Path(__file__).parent / "fixtures" / "sglang_lab" / "slow-stage"
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                               "hidden_size": 256, "intermediate_size": 512,
                               "num_hidden_layers": 4, "num_attention_heads": 4,
                               "num_key_value_heads": 4, "vocab_size": 32000}))
    out = tmp_path / "sglang.json"
    out.write_text("good")
    rc, err = _run(["sglang", "--traces", str(lab / "traces"), "--model", str(cfg),
                    f"--layer-partition={value}", "--json", str(out)], capsys)
    assert rc == 2 and "Traceback" not in err, err
    assert len([ln for ln in err.splitlines() if ln.strip()]) == 1, err
    assert out.read_text() == "good"


def test_a_layer_partition_without_traces_is_refused(tmp_path, capsys):
    from pathlib import Path
    lab = Path(__file__).parent / "fixtures" / "sglang_lab" / "slow-stage"
    rc, err = _run(["sglang", "--log", str(lab / "server.log"), "--layer-partition", "2,2",
                    "--json", str(tmp_path / "x.json")], capsys)
    assert rc == 2 and "--traces" in err and not (tmp_path / "x.json").exists()
