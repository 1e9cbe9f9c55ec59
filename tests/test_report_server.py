"""The report on the user's own SGLang evidence (sglang.json) and the probe's measured timeline.

Fixtures in tests/fixtures/report/: `sglang.json` was written by the real readers
(`ppscope sglang --log tests/fixtures/sglang/pp2_mixed.log --bench
tests/fixtures/sglang/bench.jsonl --traces tests/fixtures/traces/recorded`, host and time
in the provenance blanked); `dispatch.trace.json` is the dispatch probe's trace from a 2x H200 run
cut to the GPU-forward tracks of three points (sglang burst C=8, sglang/even burst C=32, it < 14).
"""
import json
import re
import shutil

import pytest

from reports.cli import main
from reports.render.measured_timeline import choose_point, read_dispatch_trace
from reports.base.records import read_record, write_record
from reports.model.report_type import Report
from reports.render.terminal import server_line
from reports.model.scenario.inputs import observed_from_sglang
from reports.model.verdicts import EVEN_CV, graph_evidence, observed_slots


@pytest.fixture
def sglang_rec(fixtures):
    return read_record(fixtures / "report" / "sglang.json")


def _results(tmp_path, fixtures, *names, edit=None):
    res = tmp_path / "res"
    res.mkdir()
    for n in names:
        shutil.copy(fixtures / "report" / n, res / n)
    if edit:
        rec = read_record(res / "sglang.json")
        edit(rec.data)
        write_record(rec, res / "sglang.json")
    return res


def _report(check, tmp_path, res, *extra):
    out = tmp_path / "out"
    assert main(["report", "--results", str(res), "--out", str(out), *extra]) == 0
    rep = json.loads((out / "report.json").read_text())
    check(rep)
    return rep, out


@pytest.fixture
def report_of(check_report_schema):
    """`_report` with the report checked against its schema."""
    return lambda *a, **k: _report(check_report_schema, *a, **k)


def _c32_is_300(d):
    next(b for b in d["bench"] if b["max_concurrency"] == 32)["output_throughput"] = 300.0


# -- 1. observed tok/s -------------------------------------------------------------------------

def test_observed_from_sglang_bench_runs(sglang_rec):
    obs, notes = observed_from_sglang(sglang_rec)
    # the unbounded run (max_concurrency null, mean 7.9) has no C: left out, with a note
    assert obs == {1: 34.0, 8: 81.7, 32: 248.1}
    assert notes == ["sglang.json: bench run without --max-concurrency (mean concurrency 7.9, "
                     "81.7 tok/s) not used as an observed point"]
    assert observed_from_sglang(None) == ({}, [])


def test_report_takes_observed_from_sglang_json(tmp_path, fixtures, capsys, report_of):
    res = _results(tmp_path, fixtures, "sglang.json", edit=_c32_is_300)
    rep, out = report_of(tmp_path, res)
    assert [(c["concurrency"], c["observed"]) for c in rep["concurrency"]] == \
        [(1, 34.0), (8, 81.7), (32, 300.0)]
    assert rep["observed_source"] == "sglang.json (bench_serving)"
    p = next(p for p in rep["params"] if p["name"] == "observed_tok_per_s")
    assert (p["source"], p["evidence"]) == ("observed", "sglang.json (bench_serving)")
    assert any("without --max-concurrency" in w for w in rep["warnings"])
    # sglang.json is evidence, not a model input: every model input is still estimated
    assert rep["all_estimated"] is True
    assert capsys.readouterr().out.startswith("every model input is estimated")
    md = (out / "report.md").read_text()
    assert "Observed tok/s from sglang.json (bench_serving) (observed" in md


def test_observed_and_bench_flags_override_sglang_json(tmp_path, fixtures, report_of):
    res = _results(tmp_path, fixtures, "sglang.json", edit=_c32_is_300)
    rep, _ = report_of(tmp_path, res, "--observed", "8:90")
    assert {c["concurrency"]: c["observed"] for c in rep["concurrency"]} == \
        {1: None, 8: 90.0, 32: None}
    assert rep["observed_source"] == "--observed"
    bench = tmp_path / "b.jsonl"
    bench.write_text('{"max_concurrency": 32, "output_throughput": 250.5}\n')
    rep, _ = report_of(tmp_path / "x", res, "--bench", str(bench))
    assert {c["concurrency"]: c["observed"] for c in rep["concurrency"]}[32] == 250.5
    assert rep["observed_source"] == "b.jsonl"


# -- 2. verdicts -------------------------------------------------------------------------------

def test_herd_verdict_cites_the_logged_slot_sizes(tmp_path, fixtures, report_of):
    rep, _ = report_of(tmp_path, _results(tmp_path, fixtures, "sglang.json"))
    v = next(v for v in rep["verdicts"] if v["hypothesis"].startswith("thundering herd"))
    # judged at every concurrency: at C=8 the burst puts all 8 requests in one slot (over 15%
    # of the gap: holds); the verdict cites the row at each C and the logged slot sizes
    assert v["verdict"] == "holds"
    at = {a["concurrency"]: a for a in v["at"]}
    assert at[8]["verdict"] == "holds" and at[1]["verdict"] == "does not hold"
    att8 = next(a for a in rep["attribution"] if a["concurrency"] == 8)
    assert at[8]["share"] == next(r["share"] for r in att8["rows"] if r["cause"] == "herd")
    assert v["number"].startswith(f"{at[8]['share']:.0%} of the gap at C=8; modelled 1 "
                                  "occupied slot(s) [8] for 8 stages; observed (log, PP rank 0, 8 "
                                  "decode lines): slot size median 0, max 8; slot-imbalance "
                                  "max/mean -, cv 1.73")
    assert v["evidence"].startswith("sglang.json (observed slots, log) + ")


def test_even_observed_slots_overrule_the_modelled_burst(tmp_path, fixtures, report_of):
    def even(d):
        for r in d["ranks"].values():
            r["decode_lines"], r["running_req"] = 16, {"min": 4, "median": 4.0, "max": 4}
        d["slot_imbalance"] = {"rank": 1, "window": 16, "windows": 1,
                               "max_over_mean_median": 1.0, "cv": 0.0}
    rep, _ = report_of(tmp_path, _results(tmp_path, fixtures, "sglang.json", edit=even))
    v = next(v for v in rep["verdicts"] if v["hypothesis"].startswith("thundering herd"))
    assert v["verdict"] == "does not hold"
    assert "(log, PP rank 1, 16 decode lines): slot size median 4, max 4; slot-imbalance " \
           "max/mean 1.00, cv 0.00 -- the server's slots are even" in v["number"]


def _typed(d: dict):
    from reports.base.payloads.sglang import SglangData
    from reports.base.schema import from_json
    return from_json(SglangData, d)   # the readers take the typed payload, checked like a record


def test_observed_slots_thresholds():
    def sg(n, cv, mom):
        return {"ranks": {"0": {"decode_lines": n, "running_req": {"min": 3, "median": 4.0,
                                                                   "max": 5}}},
                "slot_imbalance": {"rank": 0, "window": 16, "windows": 1,
                                   "max_over_mean_median": mom, "cv": cv}}
    assert observed_slots(_typed(sg(8, EVEN_CV - 0.01, 1.2)))["even"] is True
    assert observed_slots(_typed(sg(8, EVEN_CV, 1.2)))["even"] is False       # cv at the threshold
    assert observed_slots(_typed(sg(8, 0.1, 1.25)))["even"] is False          # max/mean at threshold
    assert observed_slots(_typed(sg(7, 0.1, 1.0)))["even"] is False           # too few lines to decide
    assert observed_slots(_typed({"ranks": {}, "slot_imbalance": None})) is None


def test_graph_verdict_from_log_and_traces(sglang_rec):
    d = json.loads(json.dumps(sglang_rec.data))
    assert graph_evidence(_typed(d)) == (
        "holds", "log: lowest per-rank share of decode batches on graphs 75% (rank 0); traces: "
        "95% of GPU kernels from graph replays on rank 0 (4608 graph / 265 one by one, 64 graph "
        "launches)", "sglang.json (observed: log, traces)")
    for r in d["ranks"].values():           # traces only: 4608 / 4873 on graphs -> no fallback
        r["cuda_graph_frac"] = None
    v, num, ev = graph_evidence(_typed(d))
    assert (v, ev) == ("does not hold", "sglang.json (observed: traces)")
    d["traces"]["ranks"]["1"].update(graph_kernels=100, eager_kernels=400, graph_launches=2)
    assert graph_evidence(_typed(d))[:2] == ("holds", "traces: 20% of GPU kernels from graph replays on "
                                     "rank 1 (100 graph / 400 one by one, 2 graph launches)")
    assert graph_evidence(_typed({"ranks": {}, "traces": None})) is None


# -- 3. "Your server" ----------------------------------------------------------------------------

def test_server_section_numbers(tmp_path, fixtures, report_of):
    rep, out = report_of(tmp_path, _results(tmp_path, fixtures, "sglang.json"))
    s = rep["server"]
    assert (s["evidence"], s["source"]) == ("sglang.json", "observed")
    assert s["sources"] == {"log": "tests/fixtures/sglang/pp2_mixed.log",
                            "traces": "tests/fixtures/traces/recorded",
                            "bench": "tests/fixtures/sglang/bench.jsonl", "metrics": None}
    r0, r1 = s["ranks"]
    # traces: busy 437003.73 of 569394.93 us; NCCL receives 175437.61 us; GPU dispatch p50
    assert r0["kernel_active_pct"] == pytest.approx(76.74879281718883)  # waits included
    assert r0["compute_pct"] == pytest.approx(45.81037474871857)
    assert r0["nccl_recv_pct"] == pytest.approx(30.811235705824963)
    assert r1["nccl_recv_pct"] == pytest.approx(48.896876205518666)
    assert r0["recv_wait_pct"] is None                  # no --link-gbps: not split
    assert r0["dispatch_latency_p50_us"] == pytest.approx(1174.3857421875)
    assert r1["cpu_dispatch_latency_p50_us"] == pytest.approx(24.6962890625)
    assert (r0["graph_kernels"], r0["eager_kernels"]) == (4608, 265)
    # log
    assert (r0["decode_lines"], r0["prefill_lines"], r0["cuda_graph_frac"]) == (8, 1, 0.75)
    assert r0["running_req"] == {"min": 0, "median": 0.0, "max": 8}
    assert r1["gen_tok_per_s_median"] == 235.0
    # modelled busy per stage beside it, from the same report's concurrency rows
    for r in (r0, r1):
        assert r["modelled_busy_pct"] == {
            str(c["concurrency"]): pytest.approx(100 * c["busy_frac"][r["rank"]])
            for c in rep["concurrency"]}
    assert [b["concurrency"] for b in s["bench"]] == [1, None, 8, 32]
    assert len(s["busy_over_time"]["0"]["busy_frac"]) == 20
    assert s["notes"][0].startswith("the server's evidence covers 2 PP rank(s), the scenario has pp=8")
    md = (out / "report.md").read_text()
    assert md.index("## Verdicts") < md.index("## Your server (observed, sglang.json)") < \
        md.index("## Where the time goes")
    row0 = next(ln for ln in md.splitlines() if ln.startswith("|         0 |"))
    assert row0.split("|")[2].strip() == "45.8"          # compute %, never "busy" with waits
    assert "0 / 0 / 8" in md and "[traces] = tests/fixtures/traces/recorded" in md
    assert server_line(Report.from_json(rep)) == ("your server (sglang.json, observed): GPU compute % per PP rank "
                                "[traces] 46 34; slot size median/max [log] 0/8 0/8; decode on "
                                "CUDA graph [log] 75% 100%")


# -- 4. measured timeline ------------------------------------------------------------------------

def test_choose_point():
    pts = ["even burst C=8", "sglang burst C=8", "sglang burst C=64", "even burst C=32"]
    assert choose_point(pts, 32) == "sglang burst C=8"
    assert choose_point(pts, None) == "sglang burst C=64"
    assert choose_point(["even burst C=8", "even burst C=64"], 32) == "even burst C=8"
    assert choose_point(["", "x"], 8) == ""
    assert choose_point([], 8) is None


def test_measured_timeline_window(fixtures):
    a, b = read_dispatch_trace(fixtures / "report" / "dispatch.trace.json", rounds=2, max_c=32)
    # 4 slots; prefill at it 0, skip one round -> it 5..12: slot 0 decodes at it 8 and 12
    assert (a.point, a.concurrency, a.slots, a.first_it, len(a.spans)) == \
        ("sglang burst C=32", 32, 4, 5, 4)
    assert [(s.rank, s.slot, s.batch) for s in a.spans] == [(0, 0, 32), (1, 0, 32)] * 2
    assert [round(s.start_us, 3) for s in a.spans] == [0.0, 7518.258, 16214.874, 23742.639]
    assert a.window_ms == pytest.approx(31.26156)
    assert a.summary().busy_frac_in_window["0"] == pytest.approx(
        (7500.221 + 7510.338) / 31261.56)
    # the same arrival and C under the other policy, for contrast: prefills at it 0 and 2
    assert (b.point, b.first_it, [s.slot for s in b.spans]) == \
        ("even burst C=32", 7, [0, 0, 2, 2, 0, 0])
    assert {s.batch for s in b.spans} == {16}
    (c,) = read_dispatch_trace(fixtures / "report" / "dispatch.trace.json", rounds=1, max_c=8)
    assert (c.point, c.first_it, len(c.spans)) == ("sglang burst C=8", 5, 2)


def test_measured_timeline_bad_files(tmp_path):
    p = tmp_path / "dispatch.trace.json"
    p.write_text('{"traceEvents": [')
    with pytest.raises(ValueError, match="not a readable Chrome trace"):
        read_dispatch_trace(p)
    p.write_text('{"traceEvents": [{"ph": "X", "tid": 0, "name": "idle"}]}')
    assert read_dispatch_trace(p) == ()


def test_report_with_measured_timeline_and_server_html(tmp_path, fixtures, report_of):
    res = _results(tmp_path, fixtures, "sglang.json", "dispatch.trace.json")
    rep, out = report_of(tmp_path, res)   # its wall time: docs/BENCHMARKS.md, not asserted
    mt = rep["measured_timeline"]
    assert [(m["point"], m["rounds"], m["first_it"], m["forwards"]) for m in mt] == \
        [("sglang burst C=32", 4, 5, 4), ("even burst C=32", 4, 7, 6)]
    assert mt[0]["window_ms"] == pytest.approx(31.26156)
    md = (out / "report.md").read_text()
    assert "## Measured pipeline timeline (dispatch probe)" in md
    page = (out / "report.html").read_text()
    assert all(v.startswith(('"data:', '"#')) for v in
               re.findall(r"""\b(?:src|href)\s*=\s*(\S{6})""", page))
    assert not re.search(r"""(?:src|href)\s*=\s*["']?https?:""", page) and "<script" not in page
    # the herd, throughput, server busy over time, stage cost, simulated and measured timelines
    assert page.count('src="data:image/png;base64,') == 6
    assert '<h2 id="server">Your server (observed, sglang.json)</h2>' in page
    assert page.index('id="verdicts"') < page.index('id="server"') < page.index('id="attribution"')
    assert page.index("simulated PP loop at C=32") < page.index("measured PP loop")


def test_unreadable_trace_is_a_warning(tmp_path, fixtures, capsys, report_of):
    res = _results(tmp_path, fixtures)
    (res / "dispatch.trace.json").write_text("not json")
    rep, out = report_of(tmp_path, res)
    assert "measured_timeline" not in rep
    assert any(w.startswith("dispatch.trace.json: not a readable Chrome trace") for w in rep["warnings"])
    assert "warning: dispatch.trace.json: not a readable" in capsys.readouterr().err


# -- which MoE kernel the server ran (its start-up lines, microbench/sglang/log.py) ---------------

def _report_with_log(tmp_path, fixtures, report_of, key, value):
    """The report of sglang.json whose log read `value` as `key`: report.json (its server part
    carries `value`) and report.md."""
    def edit(d):
        d["log"][key] = value
    rep, out = report_of(tmp_path, _results(tmp_path, fixtures, "sglang.json", edit=edit))
    assert rep["server"][key] == value
    return rep, (out / "report.md").read_text()


@pytest.mark.parametrize("mk,want,absent", [
    ({"scheme": "CompressedTensorsWNA16MarlinMoEMethod", "kernel": "marlin"},
     ["MoE kernel [log]: SGLang picked CompressedTensorsWNA16MarlinMoEMethod, i.e. the Marlin",
      "the sglang backend runs SGLang's Marlin MoE"], ["default block config"]),
    ({"scheme": "CompressedTensorsWNA16TritonMoE", "kernel": "triton",
      "reason": "moe_runner_backend=triton", "triton_config": "default",
      "config_file": "/c/E=384,N=256,device_name=X.json"},
     ["SGLang's Triton fused MoE (SGLang's reason: moe_runner_backend=triton)",
      "default block config (no tuned config for this GPU and expert shape: "
      "/c/E=384,N=256,device_name=X.json not found"], ["Marlin"]),
    ({}, [], ["MoE kernel [log]"]),
])
def test_report_names_the_servers_moe_kernel(tmp_path, fixtures, mk, want, absent, report_of):
    rep, md = _report_with_log(tmp_path, fixtures, report_of, "moe_kernel", mk)
    for w in want:
        assert w in md
    for a in absent:
        assert a not in md


@pytest.mark.parametrize("ab, want, absent", [
    ({"backend": "triton", "source": "default"},
     ["Attention backend [log]: triton (SGLang's default for this model and GPU).",
      "SGLang's Triton MLA decode", "python3 -m microbench.stage_cost.sglang_anchor"], []),
    ({"backend": "flashinfer", "source": "--attention-backend"},
     ["Attention backend [log]: flashinfer (from the server's arguments).",
      "not flashinfer's"], ["sglang_anchor"]),
    ({}, [], ["Attention backend [log]"]),
])
def test_report_names_the_servers_attention_backend(tmp_path, fixtures, ab, want, absent, report_of):
    rep, md = _report_with_log(tmp_path, fixtures, report_of, "attention_backend", ab)
    lines = " ".join(rep["server"]["attention_lines"])
    for w in want:
        assert w in md and w in lines
    for a in absent:
        assert a not in lines
