"""The status rule through each probe's CLI: a run that is waived, fails or is interrupted never
replaces a good record (it goes beside it as NAME.STATUS.json), arguments are checked before
anything is written, and a finished run supersedes what it left while running (CPU only)."""
from __future__ import annotations

import json

import pytest

from microbench.graphs import probe as gr
from microbench.stage_cost import probe as sc
from microbench.kernels import layers as L
from microbench.kit.run_writer import RunWriter
from reports.base.records import make_record, read_record
from reports.cli import main

# a dense model keeps the stage-cost run off the MoE memory check (which needs a GPU)
DENSE = ["--model", "llama-3-70b", "--pp", "2", "--batches", "1,8", "--prefill-chunk", "0",
         "--png-batch", "1", "--gpu", "h200"]


def _names(d):
    return sorted(p.name for p in d.iterdir())


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def _planned_then_no_gpu(tmp_path, capsys, monkeypatch, probe, argv) -> str:
    """A GPU probe's `--plan` record, then a run of it where `probe.available` finds no GPU:
    exit 2 with one line naming why, and the planned record kept; that line."""
    out = tmp_path / f"{argv[0].replace('-', '_')}.json"
    assert main([*argv, "--plan", "--json", str(out)]) == 0
    good = out.read_text()
    monkeypatch.setattr(probe, "available", lambda: "no CUDA GPU visible")
    assert main([*argv, "--json", str(out)]) == 2
    err = _one_line(capsys)
    assert "needs a GPU (no CUDA GPU visible)" in err
    assert out.read_text() == good
    return err


# ---- stage-cost ----

def test_stage_cost_without_gpu_leaves_waived_beside_ok(tmp_path, capsys, monkeypatch):
    err = _planned_then_no_gpu(tmp_path, capsys, monkeypatch, sc, ["stage-cost", *DENSE])
    assert "stage_cost.waived.json" in err
    w = read_record(tmp_path / "stage_cost.waived.json")
    assert w.status == "waived" and "needs a GPU" in w.reason


def test_stage_cost_without_gpu_and_no_record_leaves_waived(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sc, "available", lambda: "no CUDA GPU visible")
    assert main(["stage-cost", *DENSE, "--json", str(tmp_path / "sc.json")]) == 2
    assert read_record(tmp_path / "sc.json").status == "waived"
    assert _names(tmp_path) == ["sc.json"]          # no plot without a measurement


@pytest.mark.parametrize("flag, value", [("--mem-bw", "nan"), ("--mem-bw", "-5"),
                                         ("--mem-bw", "inf"), ("--zipf", "nan"),
                                         ("--zipf", "-1"), ("--context", "-1"),
                                         ("--experts-sample", "0"), ("--pp", "0")])
def test_stage_cost_bad_number_writes_nothing(tmp_path, capsys, flag, value):
    out = tmp_path / "stage_cost.json"
    assert main(["stage-cost", *DENSE, "--plan", flag, value, "--json", str(out)]) == 2
    assert flag in _one_line(capsys) and not out.exists() and _names(tmp_path) == []


@pytest.fixture
def cpu_measure(monkeypatch):
    """stage-cost/graphs measure on the CPU: every layer build fails its check (the first
    `interrupt_at` builds pass through to a KeyboardInterrupt instead, when set)."""
    pytest.importorskip("torch")
    state = {"calls": 0, "interrupt_at": None}

    def build(kind, m, b, dev, **kw):
        state["calls"] += 1
        if state["interrupt_at"] == state["calls"]:
            raise KeyboardInterrupt
        raise L.CheckFailed(f"{kind}: max rel err 0.5 > 0.02")
    monkeypatch.setattr(L, "build", build)
    monkeypatch.setattr(sc, "available", lambda: None)
    monkeypatch.setattr(gr, "available", lambda: None)
    monkeypatch.setattr(sc, "measure_mem_bw", lambda: 3000.0)
    return state


def test_stage_cost_failed_run_keeps_ok_record(tmp_path, capsys, cpu_measure):
    out = tmp_path / "stage_cost.json"
    assert main(["stage-cost", *DENSE, "--plan", "--json", str(out)]) == 0
    good = out.read_text()
    assert main(["stage-cost", *DENSE, "--json", str(out)]) == 1
    assert out.read_text() == good and (tmp_path / "stage_cost.png").exists()
    assert _names(tmp_path) == ["stage_cost.error.json", "stage_cost.json", "stage_cost.png"]
    bad = read_record(tmp_path / "stage_cost.error.json")
    assert bad.status == "error" and "max rel err 0.5" in bad.reason
    assert bad.payload.layers["attention"]["8"].error.startswith("attention: max rel err")
    assert "kept the ok record" in capsys.readouterr().out


def test_stage_cost_failed_run_without_a_record_is_the_record(tmp_path, cpu_measure):
    out = tmp_path / "stage_cost.json"
    assert main(["stage-cost", *DENSE, "--json", str(out)]) == 1
    # its own interim `partial` saves were superseded in place, nothing left beside
    assert read_record(out).status == "error"
    assert _names(tmp_path) == ["stage_cost.json", "stage_cost.png"]


def test_stage_cost_interrupted_run_is_partial_beside_ok(tmp_path, cpu_measure):
    out = tmp_path / "stage_cost.json"
    assert main(["stage-cost", *DENSE, "--plan", "--json", str(out)]) == 0
    good = out.read_text()
    cpu_measure["interrupt_at"] = 2          # attention fails at b=1, Ctrl-C in the next kind
    assert main(["stage-cost", *DENSE, "--json", str(out)]) == 130
    assert out.read_text() == good
    part = read_record(tmp_path / "stage_cost.partial.json")
    assert part.status == "partial" and part.reason.startswith("incomplete: 1 of 6 points")
    assert "interrupted" in part.reason and part.payload.layers["attention"]["1"].error


# ---- graphs ----

GRAPHS = ["--model", "kimi-k2", "--pp", "8", "--batches", "1,8", "--max-bs", "256"]


def test_graphs_without_gpu_leaves_waived_beside_ok(tmp_path, capsys, monkeypatch):
    err = _planned_then_no_gpu(tmp_path, capsys, monkeypatch, gr, ["graphs", *GRAPHS])
    assert "--plan" in err
    assert read_record(tmp_path / "graphs.waived.json").status == "waived"


def test_graphs_failed_run_keeps_ok_record(tmp_path, cpu_measure):
    out = tmp_path / "graphs.json"
    assert main(["graphs", *GRAPHS, "--plan", "--json", str(out)]) == 0
    good = out.read_text()
    assert main(["graphs", *GRAPHS, "--json", str(out)]) == 1
    assert out.read_text() == good and _names(tmp_path) == ["graphs.error.json", "graphs.json"]
    bad = read_record(tmp_path / "graphs.error.json")
    assert bad.status == "error" and [r.error[:9] for r in bad.payload.by_batch] == \
        ["attention"] * 2


def test_graphs_bad_max_bs_writes_nothing(tmp_path, capsys):
    assert main(["graphs", "--plan", "--max-bs", "0", "--json", str(tmp_path / "g.json")]) == 2
    assert "--max-bs" in _one_line(capsys) and _names(tmp_path) == []


# ---- topology ----

def _ok_topology(fixtures, out):
    assert main(["topology", "--from-nvidia-smi", str(fixtures / "topo" / "five_gpu_two_numa.txt"),
                 "--json", str(out), "--no-png"]) == 0
    return out.read_text()


def test_topology_without_gpu_leaves_waived_beside_ok(fixtures, tmp_path, capsys, monkeypatch):
    out = tmp_path / "topology.json"
    good = _ok_topology(fixtures, out)
    monkeypatch.setattr("microbench.kit.gpus.nvml_gpu_count", lambda: 0)
    assert main(["topology", "--json", str(out)]) == 2
    err = _one_line(capsys)
    assert "needs NVIDIA GPUs" in err and "topology.waived.json" in err
    assert out.read_text() == good and read_record(out).status == "ok"
    assert read_record(tmp_path / "topology.waived.json").status == "waived"


@pytest.mark.parametrize("exc, rc, status, words", [
    (RuntimeError("host<->GPU0 copy returned wrong data"), 2, "error",
     "RuntimeError: host<->GPU0 copy returned wrong data"),
    (KeyboardInterrupt(), 130, "partial", "interrupted (Ctrl-C)"),
])
def test_topology_failed_or_interrupted_run_keeps_ok_record(
        fixtures, tmp_path, monkeypatch, fake_machine, exc, rc, status, words):
    out = tmp_path / "topology.json"
    good = _ok_topology(fixtures, out)
    monkeypatch.setattr("microbench.kit.gpus.nvml_gpu_count", lambda: 3)

    def broken(self, i, j, staged=False):
        raise exc
    monkeypatch.setattr(fake_machine.Bench, "bidirectional", broken)  # fails after host + first copies
    assert main(["topology", "--json", str(out), "--no-hop", "--quick", "--no-png"]) == rc
    assert out.read_text() == good
    assert _names(tmp_path) == sorted(["topology.json", f"topology.{status}.json"])
    bad = read_record(tmp_path / f"topology.{status}.json")
    assert bad.status == status and words in bad.reason
    assert "kept" in bad.reason and len(bad.payload.host) == 6   # what was measured stays


def test_topology_finished_run_replaces_ok_and_clears_beside(fixtures, tmp_path, monkeypatch,
                                                              fake_machine):
    out = tmp_path / "topology.json"
    _ok_topology(fixtures, out)
    (tmp_path / "topology.error.json").write_text("{}")   # left by an earlier failed run
    monkeypatch.setattr("microbench.kit.gpus.nvml_gpu_count", lambda: 3)
    assert main(["topology", "--json", str(out), "--no-hop", "--quick", "--no-png"]) == 0
    assert _names(tmp_path) == ["topology.json"]
    assert read_record(out).payload.source == "live"


@pytest.mark.parametrize("args, words", [(["--hop-timeout", "nan"], "--hop-timeout"),
                                         (["--tensors", "0"], "--tensors"),
                                         (["--hidden", "-1"], "--hidden")])
def test_topology_bad_argument_writes_nothing(tmp_path, capsys, monkeypatch, args, words):
    monkeypatch.setattr("microbench.kit.gpus.nvml_gpu_count", lambda: 0)  # would write waived
    assert main(["topology", *args, "--json", str(tmp_path / "t.json")]) == 2
    assert words in _one_line(capsys) and _names(tmp_path) == []


# ---- the writer a run saves through ----

def _rec(status, v):
    return make_record("a", {"v": v}, status=status, reason=None if status == "ok" else "r",
                       argv=[])


def test_run_writer_supersedes_its_own_interim_record(tmp_path):
    path = tmp_path / "a.json"
    w = RunWriter(path)
    w.save(_rec("partial", 1))
    assert w.save(_rec("error", 2)) == (path, None)        # no older record: in place
    assert read_record(path).data == {"v": 2} and _names(tmp_path) == ["a.json"]


def test_run_writer_never_replaces_an_older_good_record(tmp_path):
    path = tmp_path / "a.json"
    RunWriter(path).save(_rec("ok", 0))
    w = RunWriter(path)
    assert w.save(_rec("partial", 1))[0] == tmp_path / "a.partial.json"
    dest, note = w.save(_rec("error", 2))
    assert dest == tmp_path / "a.error.json" and "kept the ok record" in note
    assert _names(tmp_path) == ["a.error.json", "a.json"]  # its own partial went
    assert read_record(path).data == {"v": 0}
    assert RunWriter(path).save(_rec("ok", 3)) == (path, None)
    assert _names(tmp_path) == ["a.json"]


def test_stage_cost_plan_goes_beside_a_measured_record(tmp_path, capsys):
    # `--plan` over a measured stage_cost.json (here: a plan record whose command line says it
    # measured) leaves that record and its plot alone
    out = tmp_path / "stage_cost.json"
    assert main(["stage-cost", *DENSE, "--plan", "--json", str(out)]) == 0
    rec = json.loads(out.read_text())
    rec["provenance"]["argv"] = [a for a in rec["provenance"]["argv"] if a != "--plan"]
    out.write_text(json.dumps(rec))
    good = out.read_text()
    assert main(["stage-cost", *DENSE, "--plan", "--json", str(out)]) == 0
    assert out.read_text() == good
    assert read_record(tmp_path / "stage_cost.plan.json").status == "ok"
    assert "kept the ok record" in capsys.readouterr().out
