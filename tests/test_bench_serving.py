"""One bench_serving rule for both ways into the report: `ppscope sglang --bench` (runs kept in
sglang.json, then read by the report) and `ppscope report --bench` give the same observed points
for the same file; an uncapped run is kept in the record but is never a point for a C."""
import json

from reports.base.bench_serving import observed_points, read_bench
from reports.base.records import read_record
from reports.cli import main
from reports.model.scenario import observed_from_sglang


def _bench_file(tmp_path, fixtures):
    # the fixture plus a later C=8 run: the last run per C wins
    f = tmp_path / "bench.jsonl"
    later = {"backend": "sglang", "max_concurrency": 8, "output_token_throughput": 90.0}
    f.write_text((fixtures / "sglang" / "bench.jsonl").read_text() + json.dumps(later) + "\n")
    return f


def test_sglang_and_report_paths_give_same_observed_points(tmp_path, fixtures, capsys):
    f = _bench_file(tmp_path, fixtures)
    rec_path = tmp_path / "res" / "sglang.json"
    assert main(["sglang", "--bench", str(f), "--json", str(rec_path)]) == 0
    rec = read_record(rec_path)
    kept = [b for b in rec.data["bench"] if b["concurrency_from"] == "measured"]
    assert [(b["max_concurrency"], b["mean_concurrency"]) for b in kept] == [(None, 7.9)]
    via_sglang, notes_sglang = observed_from_sglang(rec)

    via_report, notes_report = observed_points(read_bench(f)["runs"], "bench.jsonl")
    assert via_sglang == via_report == {1: 34.0, 8: 90.0, 32: 248.1}
    assert [n.split(": ", 1)[1] for n in notes_sglang] == \
        [n.split(": ", 1)[1] for n in notes_report] == \
        ["bench run without --max-concurrency (mean concurrency 7.9, 81.7 tok/s) not used as an "
         "observed point"]

    out = tmp_path / "out"
    assert main(["report", "--results", str(tmp_path / "empty"), "--out", str(out),
                 "--bench", str(f)]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert {c["concurrency"]: c["observed"] for c in rep["concurrency"]
            if c["observed"] is not None} == via_report
    assert any("bench.jsonl: bench run without --max-concurrency" in w for w in rep["warnings"])
    assert any("bench.jsonl: 1 line(s) not bench_serving runs" in w for w in rep["warnings"])
