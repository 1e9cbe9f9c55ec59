"""`ppscope report` end to end on the seed scenario, schema, HTML, bad inputs, dispatch check."""
import json
import time

import pytest

from reports.cli import main
from reports.paths import CONFIGS
from reports.records import make_record, write_record

SCHEMA = json.loads((CONFIGS / "schemas" / "report.schema.json").read_text())
TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
         "integer": int, "number": (int, float)}


def validate(obj, schema, where="$"):
    """Tiny JSON-Schema subset: type, required, properties, items, enum."""
    t = schema.get("type")
    if t:
        ts = t if isinstance(t, list) else [t]
        ok = any(isinstance(obj, TYPES[x]) and not (x in ("integer", "number")
                 and isinstance(obj, bool)) for x in ts)
        assert ok, f"{where}: {obj!r} is not {t}"
    if "enum" in schema:
        assert obj in schema["enum"], f"{where}: {obj!r} not in {schema['enum']}"
    for k in schema.get("required", []):
        assert k in obj, f"{where}: missing {k}"
    for k, sub in schema.get("properties", {}).items():
        if isinstance(obj, dict) and k in obj:
            validate(obj[k], sub, f"{where}.{k}")
    if "items" in schema and isinstance(obj, list):
        for i, x in enumerate(obj):
            validate(x, schema["items"], f"{where}[{i}]")


def test_validator_rejects():
    with pytest.raises(AssertionError):
        validate({"schema": "x"}, SCHEMA)


def test_seed_report_end_to_end(tmp_path, capsys):
    t = time.monotonic()
    rc = main(["report", "--results", str(tmp_path / "none"), "--out", str(tmp_path)])
    assert rc == 0
    assert time.monotonic() - t < 10
    out = capsys.readouterr().out
    assert out.startswith("every figure is estimated")
    rep = json.loads((tmp_path / "report.json").read_text())
    validate(rep, SCHEMA)
    assert rep["all_estimated"] is True
    assert [c["observed"] for c in rep["concurrency"]] == [34.0, 81.7, 248.1]
    assert [c["slot_sizes"][:4] for c in rep["concurrency"]] == [[1, 0, 0, 0], [8, 0, 0, 0],
                                                                 [8, 8, 8, 8]]
    md = (tmp_path / "report.md").read_text()
    assert "**Every figure below is estimated**" in md
    html = (tmp_path / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 3
    assert "http://" not in html and "https://" not in html and "<script" not in html
    trace = json.loads((tmp_path / "report.trace.json").read_text())
    assert any(e["ph"] == "X" for e in trace["traceEvents"])


def test_observed_flag_and_bad_value(tmp_path, capsys):
    assert main(["report", "--results", str(tmp_path), "--observed", "4:100"]) == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    assert [c["concurrency"] for c in rep["concurrency"]] == [1, 4, 8, 32]
    assert main(["report", "--results", str(tmp_path), "--observed", "4=100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--observed" in err[0]


def test_bench_jsonl(tmp_path):
    # Modelled on sglang.bench_serving --output-file: one JSON object per line, keys as in
    # its result dict (FACTS.md); values here are ours.
    f = tmp_path / "bench.jsonl"
    f.write_text(json.dumps({"backend": "sglang", "max_concurrency": 8, "completed": 80,
                             "output_throughput": 81.7, "mean_tpot_ms": 97.1}) + "\n"
                 + json.dumps({"backend": "sglang", "max_concurrency": 32, "completed": 320,
                               "output_throughput": 248.1, "mean_tpot_ms": 128.0}) + "\n")
    assert main(["report", "--results", str(tmp_path), "--bench", str(f)]) == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    assert {c["concurrency"]: c["observed"] for c in rep["concurrency"]} == {
        1: None, 8: 81.7, 32: 248.1}


def test_corrupt_record_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "topology.json").write_text("{not json")
    assert main(["report", "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "topology.json" in err[0]


def test_stale_and_waived_records_are_skipped_with_reason(tmp_path, capsys):
    rec = make_record("graphs", {"by_batch": []}, status="waived", reason="no GPU", argv=[])
    write_record(rec, tmp_path / "graphs.json")
    d = json.loads(json.dumps(make_record("dispatch", {"runs": []}, argv=[]).__dict__,
                              default=lambda o: o.__dict__))
    d["schema_version"] = 0
    (tmp_path / "dispatch.json").write_text(json.dumps(d))
    assert main(["report", "--results", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "graphs.json: status waived (no GPU); skipped" in err
    assert "dispatch.json: schema version 0" in err
    assert json.loads((tmp_path / "report.json").read_text())["all_estimated"] is True


def test_dispatch_validation_reproduces_closed_form(tmp_path):
    # 2 ranks, 1000 us per forward at any size, hop 50, no host: one slot of 8 ->
    # R = 2000 + 50 + 50 = 2100 us -> 8 / 2.1 ms = 3809.52 tok/s; probe said 3500 -> +8.8%
    stages = [{"rank": r, "gpu_us_p50": {"1": 1000.0, "8": 1000.0}, "host_us_p50": 0.0}
              for r in range(2)]
    data = {"config": {"pp": 2, "async_depth": 2, "slots": 4, "max_micro_batch": 8},
            "hop_us_in_loop": 50.0,
            "runs": [{"policy": "sglang", "arrival": "burst", "concurrency": 8,
                      "tok_per_s": 3500.0, "slot_sizes": [8, 0, 0, 0], "stages": stages}]}
    write_record(make_record("dispatch", data, argv=[]), tmp_path / "d.json")
    assert main(["report", "--results", str(tmp_path), "--validate-dispatch",
                 str(tmp_path / "d.json")]) == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    (chk,) = rep["dispatch_validation"]
    assert chk["modelled_tok_per_s"] == pytest.approx(8 / 2100e-6)
    assert chk["diff_pct"] == pytest.approx((8 / 2100e-6 / 3500 - 1) * 100)
