"""Scenario extremes: a deployment the model cannot answer for, or not in seconds, is refused in
one line that states the range (exit 2), never an internal error, a report run for minutes or a
recommendation for a deployment that cannot start. Weights that do not fit their GPUs
(Kimi K2 at PP1 on one 96 GB GPU: 553 GiB, a KV pool of 0 tokens), more stages than layers, a
bad layer partition, a routing skew beyond 2, an async depth or pipeline beyond what the
simulated loop runs in seconds, too many concurrencies; a burst far above the request rows is
admitted in O(slots) visits. Every scenario is made here from the built-in one.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from reports.base.errors import CliError
from reports.cli import main

ROOT = Path(__file__).resolve().parents[1]
SEED = json.loads((ROOT / "configs" / "scenarios" / "seed-pp8.json").read_text())


def scenario(tmp_path, name="sc", estimates=None, **changes) -> Path:
    d = {k: v for k, v in SEED.items() if k not in ("twin_record", "kernel_record")}
    d.update(changes, name=name)
    d["estimates"] = {**SEED["estimates"], **(estimates or {})}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(d))
    return path


def report(tmp_path, capsys, sc: Path) -> tuple[int, list[str]]:
    res = tmp_path / "results"
    res.mkdir(exist_ok=True)
    try:
        rc = main(["report", "--scenario", str(sc), "--results", str(res), "--no-cache"])
    except SystemExit as e:
        rc = e.code
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    return rc, err


def refused(tmp_path, capsys, sc: Path, *words) -> str:
    rc, err = report(tmp_path, capsys, sc)
    assert rc == 2 and len(err) == 1, (rc, err)
    assert "internal error" not in err[0] and "Traceback" not in err[0], err
    for w in words:
        assert w in err[0], (w, err[0])
    assert not (tmp_path / "results" / "report.json").exists()     # nothing recommended
    return err[0]


# ------------------------------------------------------------------ weights that do not fit

def test_weights_that_do_not_fit_one_gpu_are_said_and_nothing_is_recommended(tmp_path, capsys):
    msg = refused(tmp_path, capsys, scenario(tmp_path, pp=1), "kimi-k2's weights do not fit",
                  "pp=1", "rtx-pro-6000 (96 GB per GPU)", "553 GiB", "KV pool of 0 tokens",
                  "pp=8 is the smallest that fits")
    assert "--max-running-requests" not in msg


def test_tp_over_a_stage_counts_in_the_fit(tmp_path):
    """The same weights over TP 8 fit one stage: the check divides by tp as SGLang loads."""
    from reports.model.scenario.inputs import build_inputs, load_scenario
    inp = build_inputs(load_scenario(str(scenario(tmp_path, pp=1, tp=8))), {})
    assert inp.pp == 1 and inp.tp == 8


@pytest.mark.parametrize("gpu, pp", [("h200", 2), ("rtx-pro-6000", 4)])
def test_every_stage_is_checked_not_only_pp1(tmp_path, capsys, gpu, pp):
    refused(tmp_path, capsys, scenario(tmp_path, pp=pp, gpu=gpu), "do not fit", f"pp={pp}")


def test_a_server_seen_running_is_the_evidence_not_the_estimate():
    """sglang.json's start-up line says the server ran: the estimate gives way (a warning)."""
    from reports.base.gpu_specs import load_gpu
    from reports.base.model_config import load_model
    from reports.model.scenario import inputs
    from reports.model.scenario.file import read_scenario
    sc = read_scenario({**SEED, "pp": 1})
    ch = inputs._Chain(sc, [])
    settings = SimpleNamespace(chunked_prefill_size=8192)
    seen = {"sglang": SimpleNamespace(data={"log": {"server_settings": {
        "max_running_requests": 64}}})}
    inputs._memory_fit(ch, seen, load_model("kimi-k2"), load_gpu("rtx-pro-6000"), settings, 2000)
    (warn,) = ch.warn
    assert "do not fit at pp=1" in warn and "sglang.json's server log shows the server" in warn
    with pytest.raises(CliError, match="do not fit"):
        inputs._memory_fit(inputs._Chain(sc, []), {}, load_model("kimi-k2"),
                           load_gpu("rtx-pro-6000"), settings, 2000)


# ------------------------------------------------------------------ stages and layers

@pytest.mark.parametrize("pp", [64, 1024])
def test_more_stages_than_the_bound_is_refused_with_the_range(tmp_path, capsys, pp):
    refused(tmp_path, capsys, scenario(tmp_path, pp=pp), "field 'pp'", "from 1 to 16",
            f"got {pp}")


def test_more_stages_than_layers_is_refused_with_the_range(tmp_path, capsys):
    cfg = json.loads((ROOT / "configs" / "models" / "llama-3-70b.json").read_text())
    cfg["num_hidden_layers"] = 6
    (tmp_path / "llama-6l.json").write_text(json.dumps(cfg))
    refused(tmp_path, capsys, scenario(tmp_path, pp=8, model=str(tmp_path / "llama-6l.json")),
            "field 'pp'", "from 1 to 6", "6 layers", "got 8")


@pytest.mark.parametrize("partition, words", [
    ("8,8,8", "has 3 entries; pp is 8"), ("a,b", "entries must be integers"),
    ("0,61,0,0,0,0,0,0", "at least one layer"), ("8,8,8,8,8,8,8,8", "sums to 64")])
def test_a_bad_layer_partition_is_refused_naming_the_field(tmp_path, capsys, partition, words):
    refused(tmp_path, capsys, scenario(tmp_path, layer_partition=partition),
            "field 'layer_partition'", words)


# ---------------------------------------------------- what the model answers in seconds

@pytest.mark.parametrize("zipf", [9.9e8, 10, 2.5, -1])
def test_a_routing_skew_beyond_the_range_is_refused(tmp_path, capsys, zipf):
    refused(tmp_path, capsys, scenario(tmp_path, estimates={"zipf_s": zipf}),
            "field 'estimates.zipf_s'", "from 0 to 2")


@pytest.mark.parametrize("pp, depth, top", [(8, 1024, 56), (8, 57, 56), (16, 17, 16),
                                            (1, 512, 511)])
def test_an_async_depth_beyond_the_simulated_loop_is_refused(tmp_path, capsys, pp, depth, top):
    refused(tmp_path, capsys, scenario(tmp_path, pp=pp, async_depth=depth),
            "field 'async_depth'", f"from 0 to {top} at pp={pp}", "at most 512")


def test_too_many_concurrencies_are_refused(tmp_path, capsys):
    refused(tmp_path, capsys, scenario(tmp_path, concurrency=list(range(1, 10))),
            "field 'concurrency'", "1 to 8 concurrencies")


def test_the_largest_settings_in_range_are_read():
    from reports.model.scenario.file import read_scenario
    sc = read_scenario({**SEED, "pp": 16, "async_depth": 16, "concurrency": [1, 4096] * 4,
                        "estimates": {**SEED["estimates"], "zipf_s": 2.0}})
    assert (sc.pp, sc.async_depth, sc.estimates.zipf_s) == (16, 16, 2.0)
    assert read_scenario({**SEED, "pp": 8, "async_depth": 56}).async_depth == 56


def test_a_burst_far_above_the_request_rows_is_admitted_in_o_slots_visits():
    """C = 4096 against 64 request rows: once a whole round of slots admits no one (every
    request arrived, requests never leave), the rest of the visits place no one, and they are
    not run (they were: slots x (C + 2) visits, each copying the queue)."""
    from reports.base.slots import SlotConfig, burst_sizes, initial_assignment
    cfg = SlotConfig(pp=8, async_depth=8, max_micro_batch=8, max_running_requests=64,
                     chunked_prefill_size=8192)
    visits = [0]

    def times():                  # far more visits than a burst needs: count those taken
        for _ in range(100_000):
            visits[0] += 1
            yield 0.0
    out = initial_assignment([0.0] * 4096, cfg, "sglang", times(), prompt_lens=1000)
    assert sum(s is not None for s in out) == 64
    assert visits[0] <= 4 * cfg.slots
    assert sum(burst_sizes(4096, cfg, 1000)) == 64
