"""The side tools' records (microbench/stage_cost/tune_moe_quant.py, tune_moe_triton.py): the
envelope every probe writes, without a GPU a `waived` record and exit 2, a failure an `error`
record that keeps what was measured, a finished run `ok`. CPU tests with fakes; the real-GPU run
is marked `gpu`."""
from __future__ import annotations

import json

import pytest

from microbench.kit.run_writer import ToolWriter
from microbench.stage_cost import tune_moe_quant as Q
from microbench.stage_cost import tune_moe_triton as T
from reports.base.records import make_record, read_record, save_record

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("tool, args, name", [
    (T, [], "moe_triton.json"), (Q, [], "moe_quant.json"), (Q, ["--only-mla"], "mla.json")])
def test_without_a_gpu_a_waived_record_and_exit_2(tool, args, name, tmp_path, capsys,
                                                  monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert tool._main(["--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a CUDA GPU" in err[0] and "waived record" in err[0]
    rec = read_record(tmp_path / name)
    assert (rec.probe, rec.status, rec.reason) == (tool.PROBE, "waived", "needs a CUDA GPU")
    assert rec.provenance.argv[:3] == ("python3", "-m", tool.__name__)
    assert rec.provenance.argv[3:] == ("--out", str(tmp_path), *args)


def test_a_waived_run_never_replaces_a_good_record(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    good = tmp_path / "moe_triton.json"
    save_record(make_record(T.PROBE, {"rows": [{"batch": 1, "triton_us": 9.5}]}), good)
    assert T._main(["--out", str(tmp_path)]) == 2
    assert read_record(good).data["rows"] == [{"batch": 1, "triton_us": 9.5}]
    assert read_record(tmp_path / "moe_triton.waived.json").status == "waived"


@pytest.mark.parametrize("tool", [T, Q])
def test_a_failure_is_an_error_record_that_keeps_what_was_measured(tool, tmp_path, capsys,
                                                                    monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def fake_run(a, res, writer):
        res.update({"gpu": "NVIDIA H200", "checks": {"tiny/b1": 1e-3}, "rows": [{"batch": 1}]})
        writer.record(res, "partial", "written as the run goes")
        raise RuntimeError("CUDA out of memory\nmore lines")
    monkeypatch.setattr(tool, "_run", fake_run)
    assert tool._main(["--out", str(tmp_path)]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "RuntimeError: CUDA out of memory" in line and "error record" in line
    (path,) = tmp_path.glob("*.json")        # the run's own partial record, superseded
    rec = read_record(path)
    assert rec.status == "error" and rec.reason == "RuntimeError: CUDA out of memory"
    assert rec.data == {"gpu": "NVIDIA H200", "checks": {"tiny/b1": 1e-3}, "rows": [{"batch": 1}]}


class _Args:
    only_mla, skip_mla, batches = True, False, "1,8"


def test_tune_moe_quant_saves_partial_as_it_goes_and_ok_at_the_end(tmp_path, capsys):
    out = tmp_path / "mla.json"
    res = {"gpu": "NVIDIA H200", "checks": {"mla/triton/b1": 5e-3}, "rows": [],
           "mla_rows": [], "dtype": torch.bfloat16, "l2_bytes": 62914560, "nan": float("nan")}
    s = Q._Session(_Args(), 0.0, None, None, None, None, None, res,
                   ToolWriter(out, Q.PROBE, ["python3", "-m", Q.__name__, "--only-mla"]))
    s.save()
    rec = read_record(out)
    assert rec.status == "partial"
    assert rec.reason == "written as the run goes: 1 checks, 0 layer rows, 0 MLA rows"
    # what JSON cannot hold: a torch dtype as its text, NaN as null (as the bare files had it)
    assert rec.data["dtype"] == "torch.bfloat16" and rec.data["nan"] is None
    assert Q._print_mla(s) == 0
    rec = read_record(out)
    assert rec.status == "ok" and rec.reason is None and rec.data["wall_s"] > 0
    assert f"record: {out}" in capsys.readouterr().out
    assert json.loads(out.read_text())["provenance"]["origin"] is None


@pytest.mark.gpu
def test_tune_moe_triton_on_a_gpu_writes_an_ok_record(tmp_path):
    # a small MoE (Kimi K2's layout, 8 experts of 128 x 256) keeps the run to seconds
    from reports.base.model_config import CONFIGS
    cfg = json.loads((CONFIGS / "models" / "kimi-k2.json").read_text())
    cfg["text_config"].update(hidden_size=256, moe_intermediate_size=128, n_routed_experts=8,
                              num_experts_per_tok=4)
    model = tmp_path / "small.json"
    model.write_text(json.dumps(cfg))
    assert T._main(["--model", str(model), "--batches", "1,8", "--sweep-budget-s", "0",
                    "--out", str(tmp_path)]) == 0
    rec = read_record(tmp_path / "moe_triton.json")
    assert rec.status == "ok" and [r["batch"] for r in rec.data["rows"]] == [1, 8]
    assert all(r["triton_us"] > 0 for r in rec.data["rows"])
