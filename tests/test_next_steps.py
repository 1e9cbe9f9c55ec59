"""reports/model/next_steps.py: the "measure your server" commands follow the evidence."""
from __future__ import annotations

from reports.model.next_steps import next_steps


def _rep(eff_source: str | None) -> dict:
    params = [{"name": "pp", "source": "given"}]
    if eff_source:
        params.append({"name": "kernel_efficiency", "source": eff_source})
    return {"params": params}


def _kernel_step(steps):
    return [s for s in steps if "stage-cost" in " ".join(s.commands)]


def test_estimated_kernels_ask_for_stage_cost_and_the_attention_anchor():
    steps = next_steps(_rep("estimated"), [1, 8, 32], 8, model="deepseek-v3", mla=True)
    (k,) = _kernel_step(steps)
    assert "estimated" in k.why
    assert k.commands[0] == "ppscope stage-cost --model deepseek-v3 --pp 8 --moe-backends triton,sglang"
    assert "python3 -m microbench.sglang_anchor --model deepseek-v3" in k.commands
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
