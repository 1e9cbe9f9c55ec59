"""The lab's table: per case, tok/s (bench_serving), the slowdown against its baseline, and
the diagnosis's first named cause with its size (from the case's report.json; "analysis
failed" when the case's last analysis failed, never the report of an earlier one)."""
from __future__ import annotations

import json
from pathlib import Path
from statistics import mean

from reports.base.payloads.lab_case import CasePlan, LabCase
from reports.model.compare import change_interval


def bench_tok_per_s(case_dir: Path) -> list[float]:
    """Output tok/s of each bench_serving run of the case (reports/base/bench_serving.py)."""
    from reports.base.bench_serving import read_bench
    p = case_dir / "bench.jsonl"
    if not p.exists():
        return []
    return [float(r["output_throughput"]) for r in read_bench(str(p))["runs"]
            if r.get("output_throughput") is not None]


def read_case(case_dir: Path) -> LabCase:
    """`case_dir/case.json` (reports/base/payloads/lab_case.py); a one-line CliError naming the
    file when it is not a lab case (garbage, another file, a case without its concurrency, a
    field of another type)."""
    from reports.base.errors import CliError
    from reports.base.paths import read_input_json
    from reports.base.schema import SchemaError, from_json
    p = case_dir / "case.json"
    d = read_input_json(p, "lab case.json", 1 << 20)
    case = d.get("case") if isinstance(d, dict) else None
    if not isinstance(case, dict) or type(case.get("concurrency")) is not int:
        raise CliError(f"{p}: not a lab case.json (no case with its concurrency)")
    try:            # a file another lab may have written: keys it does not know are skipped
        return from_json(LabCase, d, "case.json", lax=True)
    except SchemaError as e:
        raise CliError(f"{p}: {e}: not a lab case.json") from None


def _hog(case: CasePlan) -> str:
    """A CPU hog's case: on its rank's pinned core (today), or on a core (earlier records)."""
    if case.hog_rank is not None:
        return f"cpu hog on rank {case.hog_rank}'s core"
    return f"cpu hog on core {case.hog_core}" if case.hog_core is not None else ""


def analysis_error(case_dir: Path) -> str | None:
    """Why the case's last analysis (analysis.json, lab.analyse_case) failed; None when it did
    not fail or there is none."""
    try:
        d = json.loads((case_dir / "analysis.json").read_text())
    except (OSError, ValueError):
        return None
    err = d.get("error") if isinstance(d, dict) else None
    return str(err) if err else None


def _report(case_dir: Path) -> dict:
    p = case_dir / "report.json"
    try:
        return json.loads(p.read_text()) if p.exists() else {}
    except ValueError:
        return {}


def summarise(out: Path) -> list[dict]:
    rows, tok = [], {}
    dirs = sorted(d for d in out.iterdir() if (d / "case.json").exists())
    for d in dirs:
        tok[d.name] = bench_tok_per_s(d)
    for d in dirs:
        case = read_case(d).case
        t = tok[d.name]
        # the baseline measured at the start of the plan and again at its end (drift check)
        base = tok.get(case.baseline or "", []) + tok.get(f"{case.baseline}-end", [])
        failed = analysis_error(d)   # then its report.json is an earlier analysis's: not shown
        rep = {} if failed else _report(d)
        dg = rep.get("diagnosis") or {}
        first = next((r for r in dg.get("rows", []) if r.get("cause") in (dg.get("named") or [])),
                     None)
        cmp_ = rep.get("baseline_comparison") or {}
        moved = None
        if cmp_.get("status") == "ok":
            named = [r for r in cmp_["rows"] if r["cause"] != "unexplained"]
            if named:
                moved = max(named, key=lambda r: r["growth_ms"])
        rows.append({
            "modelled_step_ms": dg.get("modelled_step_ms"),
            "observed_step_ms": dg.get("observed_step_ms"),
            "case": d.name, "concurrency": case.concurrency, "fault": case.fault or _hog(case),
            "tok_per_s": mean(t) if t else None, "runs": len(t),
            "spread_pct": 100 * (max(t) - min(t)) / mean(t) if len(t) > 1 else None,
            "slowdown_pct": 100 * (mean(base) / mean(t) - 1) if t and base and case.baseline
            else None,
            "diagnosis": "failed" if failed else dg.get("status"),
            "first_cause": "analysis failed" if failed else first["cause"] if first else
            ("nothing big" if dg.get("status") == "ok" else None),
            "analysis_error": failed,
            "first_size_pct": first.get("size_pct") if first else None,
            "first_size_ci": first.get("size_ci") if first else None,
            # the measured slowdown's interval: Welch's t over both servers' bench runs
            "slowdown_ci": change_interval(base, t) if t and base and case.baseline
            else None,
            "significant": cmp_.get("significant"),
            "moved_ci": ([100 * g / cmp_["baseline_step_ms"] for g in moved["growth_ci"]]
                         if moved and moved.get("growth_ci") else None),
            # the windows' noise alone (the model's error measured in the lab not added)
            "moved_window_ci": ([100 * g / cmp_["baseline_step_ms"]
                                 for g in moved.get("growth_window_ci") or moved["growth_ci"]]
                                if moved and moved.get("growth_ci") else None),
            "expect": case.expect or "",
            "answer": dg.get("answer"),
            # against the baseline's diagnosis: the cause that grew most, and its growth as a
            # share of the baseline's observed step (the model's slowdown from that cause)
            "moved_cause": moved["cause"] if moved else None,
            "moved_pct": 100 * moved["growth_ms"] / cmp_["baseline_step_ms"] if moved else None,
            "modelled_change_pct": cmp_.get("change_pct") if cmp_.get("kind") == "modelled"
            else None,
            "unexplained_pct": dg.get("unexplained_pct"),
        })
    return rows


def render(rows: list[dict]) -> str:
    from tabulate import tabulate
    def ci(x) -> str:
        return f"{x[0]:.0f} to {x[1]:.0f}" if x else ""
    sig = {True: "yes", False: "no", None: ""}
    return tabulate([[r["case"], r["concurrency"], r["fault"], r["tok_per_s"], r["runs"],
                      r["spread_pct"], r["slowdown_pct"], ci(r.get("slowdown_ci")),
                      sig[r.get("significant")], r["first_cause"], r["first_size_pct"],
                      ci(r.get("first_size_ci")), r["moved_cause"], r["moved_pct"],
                      ci(r.get("moved_ci")), r["unexplained_pct"], r["expect"]]
                     for r in rows],
                    headers=["case", "C", "fault", "tok/s", "runs", "spread %", "slowdown %",
                             "90% interval", "significant", "first cause", "size %",
                             "90% interval", "grew most vs baseline", "growth %", "90% interval",
                             "unexplained %", "expected"], floatfmt=".1f")
