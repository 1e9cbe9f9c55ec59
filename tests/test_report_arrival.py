"""How requests arrive (reports/model/scenario/arrival.py): burst and trickle both modelled, and decided by
the server log's `#new-seq` where the log has it (SGLang 0.5.23's own PP2 server, the lab)."""
from __future__ import annotations

import re

from reports.base.records import read_record
from reports.cli import main
from reports.model.scenario import loop_builder as lb
from reports.base.schema import to_json
from reports.model.scenario.arrival import alternatives, arrival_from_log, sentence
from reports.model.scenario.inputs import build_inputs, load_scenario

LAB_LOG = "sglang_lab/clean-c8/server.log"


def _sglang(tmp_path, fixtures, log_text=None):
    log = fixtures / LAB_LOG
    if log_text is not None:
        log = tmp_path / "server.log"
        log.write_text(log_text)
    out = tmp_path / "res" / "sglang.json"
    assert main(["sglang", "--log", str(log), "--json", str(out)]) == 0
    return read_record(out)


def test_the_labs_burst_is_read_as_a_burst(tmp_path, fixtures):
    # 8 requests sent at once by bench_serving reached SGLang's scheduler in waves (2 then 5 after
    # the warm-up's single requests): most requests came in groups, so a burst
    kind, detail = arrival_from_log(_sglang(tmp_path, fixtures).payload)
    assert kind == "burst" and "PP rank 0" in detail and "1, 1, 1, 2, 5" in detail


def test_one_request_per_prefill_is_a_trickle(tmp_path, fixtures):
    text = re.sub(r"#new-seq: \d+", "#new-seq: 1", (fixtures / LAB_LOG).read_text())
    kind, _ = arrival_from_log(_sglang(tmp_path, fixtures, text).payload)
    assert kind == "trickle"


def test_the_observed_arrival_feeds_the_model(tmp_path, fixtures):
    rec = _sglang(tmp_path, fixtures)
    inp = build_inputs(load_scenario("seed-pp8"), {"sglang": rec})
    assert inp.arrival == "burst" and inp.src("arrival") == ("observed", "sglang.json (log)")


def test_trickle_spreads_a_burst_over_consecutive_slots_and_the_answer_says_so():
    inp = build_inputs(load_scenario("seed-pp8"), {})
    burst, trickle = lb.run(inp, 8, arrival="burst"), lb.run(inp, 8, arrival="trickle")
    assert [s for s in burst.slot_sizes if s] == [8]
    assert list(trickle.slot_sizes[:8]) == [1] * 8 and trickle.tok_per_s > 1.5 * burst.tok_per_s
    alt = alternatives(inp, dict(inp.observed), lambda C, a: lb.run(inp, C, arrival=a))
    arr = to_json(alt)   # as report.json holds it
    assert 8 in arr["differs_at"] and 1 not in arr["differs_at"]
    row8 = next(r for r in arr["by_concurrency"] if r["concurrency"] == 8)
    assert row8["observed_fits"] == "burst"          # 81.7 tok/s: one slot of 8
    text = sentence(alt)
    assert text.startswith("The answer hangs on how requests arrive: C=8 ")
    assert "#new-seq" in text and "assumes burst (given)" in text
