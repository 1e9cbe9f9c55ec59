"""The live lab tier: SGLang 0.5.23's own PP2 server on this CPU, read by ppscope.

`make sglang-lab-test` (CI, after `make test`): installs SGLang into the lab's own venv
(microbench/sglang_lab/venv.py), runs the quick plan (clean C=8 and a slow stage on the last
rank, factor 2), then checks that `ppscope sglang` + `ppscope report` diagnose each case on
SGLang's real artefacts and name the slow stage first. Skipped in one line only when SGLang
cannot be installed (no package index); any other failure fails.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang_lab

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from microbench.sglang_lab.venv import LabError, ensure_venv
    lab_dir = Path(os.environ.get("PPSCOPE_LAB_DIR", ROOT / ".lab"))
    try:
        ensure_venv(lab_dir, print)
    except LabError as e:
        log = (lab_dir / "install.log")
        text = log.read_text(errors="replace") if log.exists() else ""
        if any(s in text for s in ("No matching distribution", "Could not find a version",
                                   "NewConnectionError", "Temporary failure in name resolution",
                                   "Network is unreachable")):
            pytest.skip(f"SGLang cannot be installed here (no package index): {e}")
        raise
    out = tmp_path_factory.mktemp("lab")
    from reports.cli import main
    rc = main(["sglang-lab", "--quick", "--lab-dir", str(lab_dir), "--out", str(out)])
    assert rc == 0
    return out


def test_every_case_is_diagnosed_and_names_the_observed_server(lab):
    rows = json.loads((lab / "summary.json").read_text())
    assert {r["case"] for r in rows} == {"clean-c8", "slow-stage"}
    for r in rows:
        assert r["diagnosis"] == "ok", r
        rep = json.loads((lab / r["case"] / "report.json").read_text())
        md = (lab / r["case"] / "report.md").read_text()
        head = md.splitlines()[0]
        assert "PP2" in head and "cpu" in head and "C=8" in head, head
        assert rep["observed_deployment"]["cuda_graphs"]["value"].startswith("off by setting")


def test_every_token_the_lab_model_can_make_has_text_of_its_own(lab):
    """bench_serving counts a token when its streamed chunk carries text: every id of the lab
    model decodes (in the lab venv, by its own tokenizer, skipping special tokens as SGLang's
    detokenizer does) to complete text, the three reserved ids too, and config.json's vocab has
    no id beyond the tokenizer's."""
    import subprocess
    import sys
    from microbench.sglang_lab.venv import ensure_model, ensure_venv
    lab_dir = Path(os.environ.get("PPSCOPE_LAB_DIR", ROOT / ".lab"))
    python = ensure_venv(lab_dir, print)
    model = ensure_model(python, lab_dir)
    probe = ("import json, sys; from transformers import AutoTokenizer\n"
             "t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
             "v = json.load(open(sys.argv[1] + '/config.json'))['vocab_size']\n"
             "bad = [i for i in range(v) if t.decode([i], skip_special_tokens=True) in ('',)\n"
             "       or t.decode([i]).endswith('\\ufffd')]\n"
             "print(json.dumps({'vocab': v, 'tokens': len(t), 'bad': bad}))\n")
    out = subprocess.run([str(python), "-c", probe, str(model)], capture_output=True, text=True,
                         timeout=300, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["vocab"] == got["tokens"] and got["bad"] == [], (got, sys.executable)


def test_the_slow_stage_is_named_first_with_its_size(lab):
    rows = {r["case"]: r for r in json.loads((lab / "summary.json").read_text())}
    slow = rows["slow-stage"]
    assert slow["first_cause"] == "slow_stage", slow
    assert slow["moved_cause"] == "slow_stage", slow     # what grew most against clean
    assert slow["slowdown_pct"] and slow["slowdown_pct"] > 10
    # Its size: what the model says the fault did must be a large growth of the right rank's
    # forward, not a number within a bound of bench_serving's slowdown. The ratio of the two
    # is not resolvable from one repetition on a shared 2-core CI machine: fresh-clone runs of
    # this tier gave 0.56, 0.76, 1.02, 1.68 and 2.13 (two clean repetitions of the same server
    # 30% apart; the clean case's own model 19-41% short of its bench_serving step, which is
    # the growth's denominator). The size is held where repetitions resolve it: the full lab,
    # three repetitions on an idle machine, within 20% (docs/BENCHMARKS.md, section 14).
    assert slow["moved_pct"] > 25, slow
    rep = json.loads((lab / "slow-stage" / "report.json").read_text())
    cmp_ = {r["cause"]: r["growth_ms"] for r in rep["baseline_comparison"]["rows"]}
    # the slow stage is the cause that grew most in the baseline comparison too (a ratio to
    # the others is timing: the joint split also sizes the window's own slot split, which
    # differs between two one-repetition windows; one fresh-clone run gave the herd 7.8 ms
    # against the slow stage's 18.2)
    named = {c: g for c, g in cmp_.items() if c != "unexplained"}
    assert max(named, key=lambda c: abs(named[c])) == "slow_stage", cmp_
    assert "rank 1 forward" in slow["answer"], slow["answer"]


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    """A short twin: the seed's model and costs at PP4 (depth 4; TP 2, so that each stage's
    weights fit its GPUs), C = 4, 8 output tokens, a fixed k = 2 (no calibration: this tier
    checks what SGLang did, not timing)."""
    from microbench.sglang_lab.venv import LabError, ensure_venv
    lab_dir = Path(os.environ.get("PPSCOPE_LAB_DIR", ROOT / ".lab"))
    try:
        ensure_venv(lab_dir, print)
    except LabError as e:
        pytest.skip(f"SGLang cannot be installed here: {e}")
    out = tmp_path_factory.mktemp("twin")
    sc = json.loads((ROOT / "configs" / "scenarios" / "seed-pp8.json").read_text())
    sc.update(name="seed-pp4", pp=4, async_depth=4, concurrency=[4], observed_tok_per_s={},
              max_running_requests=16, tp=2)
    (out / "pp4.json").write_text(json.dumps(sc))
    from reports.cli import main
    rc = main(["twin", "--scenario", str(out / "pp4.json"), "--results", str(out / "results"),
               "--settings", "default", "--output-len", "8", "--k", "2", "--lab-dir",
               str(lab_dir), "--out", str(out / "art"), "--json", str(out / "twin.json")])
    assert rc == 0
    data = json.loads((out / "twin.json").read_text())["data"]
    data["server_log"] = (out / "art" / "default" / "server.log").read_text(errors="replace")
    return data


def test_the_twin_runs_the_deployment_on_sglangs_scheduler(twin):
    assert twin["pp"] == 4 and twin["calibration"]["k"] == 2
    assert twin["costs"]["layer_split"] == [15, 15, 15, 16]
    (row,) = twin["rows"]
    assert row["setting"] == "default" and row["concurrency"] == 4 and row["completed"] == 4
    # what SGLang admitted (its own Prefill batch lines of rank 0), beside the model's
    assert row["waves"] and all(n >= 1 for n in row["waves"]), row
    assert sum(row["model_slots"]) == 4
    assert row["twin_tpot_ms"] > 0 and row["model_tpot_ms"] > 0
    assert row["run_model_tpot_ms"] and row["run_model_tpot_ms"] > 0   # the model of this run
    # bench_serving's --flush-cache: SGLang emptied its prefix cache after the warm-up request
    assert twin["flush_cache"] and "Cache flushed successfully" in twin["server_log"]
    # the steady decode is read from SGLang's own log, on its millisecond clock (SGLANG_LOG_MS)
    assert re.search(r"\d\d:\d\d:\d\d\.\d{3} PP0\] Decode batch", twin["server_log"])
    assert "twin_steady_tpot_ms" in row
    if row["twin_steady_tpot_ms"] is not None:
        assert sum(row["steady_slots"]) == 4 and row["steady_cycles"] >= 3
