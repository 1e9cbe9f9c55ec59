"""reports/model/next_steps.py: the "measure your server" commands follow the evidence."""
from __future__ import annotations

from dataclasses import replace

import pytest

from reports.model import next_steps as ns
from reports.model.next_steps import next_steps
from reports.model.report_type import REPORT_SCHEMA, Report
from reports.model.causes import HERD
from reports.model.scenario.inputs import Param
from reports.model.verdicts import Verdict, VerdictAt


@pytest.fixture(autouse=True)
def _plain_invocation(monkeypatch):
    """The commands as a user with ppscope on PATH sees them (reports/base/invocation.py)."""
    monkeypatch.setattr(ns, "ppscope_command", lambda: "ppscope")
    monkeypatch.setattr(ns, "python_command", lambda: "python3")


def _rep(eff_source: str | None) -> Report:
    params = [Param("pp", 8, "given", "")]
    if eff_source:
        params.append(Param("kernel_efficiency", 0.5, eff_source, ""))
    return Report(REPORT_SCHEMA, "test", params=tuple(params))


def _kernel_step(steps):
    return [s for s in steps if "stage-cost" in " ".join(s.commands)]


def test_estimated_kernels_ask_for_stage_cost_and_the_attention_anchor():
    steps = next_steps(_rep("estimated"), [1, 8, 32], 8, model="deepseek-v3", mla=True)
    (k,) = _kernel_step(steps)
    assert "estimated" in k.why
    assert k.commands[0] == "ppscope stage-cost --model deepseek-v3 --pp 8 --moe-backends triton,sglang"
    assert "python3 -m microbench.stage_cost.sglang_anchor --model deepseek-v3" in k.commands
    assert k.commands[-1] == "ppscope report --results results"


def test_transferred_kernels_are_not_measured_there():
    (k,) = _kernel_step(next_steps(_rep("transferred"), [8], 4, model="kimi-k2"))
    assert "transferred, not measured there" in k.why


def test_no_attention_anchor_without_mla():
    (k,) = _kernel_step(next_steps(_rep("estimated"), [8], 4, model="llama-3-70b", mla=False))
    assert not any("sglang_anchor" in c for c in k.commands)
    assert "MLA" not in k.why


def test_measured_kernels_need_no_step():
    assert not _kernel_step(next_steps(_rep("measured"), [8], 8))
    assert not _kernel_step(next_steps(_rep(None), [8], 8))


def test_profile_commands_name_the_report_model():
    steps = next_steps(_rep("measured"), [32], 8, model="qwen3-moe", mla=False)
    prof = [c for s in steps for c in s.commands if c.startswith("ppscope sglang")]
    assert prof and all("--model qwen3-moe" in c for c in prof if "--model" in c)
    assert not any("kimi-k2" in c for s in steps for c in s.commands)


def test_commands_call_ppscope_the_way_it_runs_here(monkeypatch):
    monkeypatch.setattr(ns, "ppscope_command", lambda: ".venv/bin/ppscope")
    monkeypatch.setattr(ns, "python_command", lambda: ".venv/bin/python")
    steps = next_steps(_rep("estimated"), [1, 8], 8, model="kimi-k2")
    cmds = [c for s in steps for c in s.commands]
    assert all(not c.startswith("ppscope ") for c in cmds)
    assert ".venv/bin/python -m microbench.stage_cost.sglang_anchor --model kimi-k2" in cmds
    # every value filled in: no placeholder a shell would take literally
    assert not any(" N" in c.split("'")[0] or "<" in c or "..." in c for c in cmds)
    bench = [c for c in cmds if "sglang.bench_serving" in c]
    assert [c.split("--max-concurrency ")[1].split()[0] for c in bench] == ["1", "8"]
    assert all("--output-file bench.jsonl" in c for c in bench)
    assert all("--flush-cache" in c for c in bench)   # the warm-up prompt is served cold


def test_profile_at_the_concurrency_where_the_herd_is():
    herd = Verdict(HERD, "holds", "", "", cause="herd", at=tuple(
        VerdictAt(C, "holds", share, "") for C, share in ((1, 0.0), (8, 0.54), (32, 0.23))))
    rep = replace(_rep("measured"), verdicts=(herd,))
    steps = next_steps(rep, [1, 8, 32], 8)
    prof = next(c for s in steps for c in s.commands if "--profile" in c)
    assert "--live-concurrency 8 " in prof and "--watch" not in prof


def test_invocation_names_the_running_environment(tmp_path, monkeypatch):
    from reports.base import invocation as inv
    scripts = tmp_path / "env" / "bin"
    scripts.mkdir(parents=True)
    monkeypatch.setattr(inv.sysconfig, "get_path", lambda name: str(scripts))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert inv.ppscope_command().endswith("-m reports.cli")     # no script: the module
    (scripts / "ppscope").write_text("#!/bin/sh\n")
    (scripts / "ppscope").chmod(0o755)
    assert inv.ppscope_command() == "env/bin/ppscope"            # not on PATH: its own path
    monkeypatch.setenv("PATH", str(scripts))
    assert inv.ppscope_command() == "ppscope"                    # on PATH and this env's
