"""The what-if plan's table: each setting's change predicted from the "before" case alone
against the change bench_serving measured (cases.whatif_plan, reports/model/observed/bench_run.py).

Per after case (a setting changed against its before case, SGLang's defaults at the same C):
the model runs bench_serving's run over the observed loop of the default server's profiled
window at that C (of every before case's, the one with the lowest profiler slowdown: the
window that ran closest to the benchmark's speed) with and without the change
(`observed_whatif.predict`), and from each other profiled window of the default server at that
C (another round of the restart pass: the range of predictions the evidence gives); cases
`<name>.<k>` are one case's interleaved runs; measured = median tok/s after / median before -
1, with the range every pairing of their repetitions spans (min after / max before - 1 ..
max / min - 1). A
prediction meets the target when its sign is right and it is within 25% of the measured change
or inside that range.

Per profiled case (before cases, async depth 1 and pp): the model of the observed loop against
bench_serving's tok/s, steady (every slot as traced) and over bench_serving's whole run, with
the profiler's own cost taken off: the server log's decode lines give each visit's time (SGLang
logs `gen throughput` = tokens / time since the previous decode line, metrics_reporter.py), so
the median visit at each `#running-req` inside the profiled window against outside it is how
much slower the traced loop ran than the benchmark's (microbench/sglang/profiler_cost.py).

    python -m reports.lab.whatifs results/lab-whatif [--records DIR] [--md]
                                                              [--json OUT.json]

`--records DIR`: each case's `ppscope sglang` record as DIR/<case>/sglang.json (default: in
the case, where the lab's analysis writes it).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from statistics import median

from reports.lab.summary import bench_tok_per_s
from reports.base.payloads.lab_case import LabCase
from reports.model.settings_change import LAYER_PARTITION

TARGET_REL = 0.25


def _case(d: Path) -> LabCase:
    from reports.lab.summary import read_case
    return read_case(d)


def change_of(after: LabCase, before: LabCase) -> tuple[str, object] | None:
    """(knob, value) the after case changed against its before case."""
    a, b = after.case, before.case
    if a.mmb and a.mmb != b.mmb:
        return "--pp-max-micro-batch-size", a.mmb
    if a.request_rate != b.request_rate:
        return "--request-rate", a.request_rate
    part = after.env.get(LAYER_PARTITION)
    if part and part != before.env.get(LAYER_PARTITION):
        return LAYER_PARTITION, part
    args = list(after.extra_args)
    for knob in ("--pp-async-batch-depth", "--max-running-requests", "--chunked-prefill-size"):
        if knob in args and knob not in before.extra_args:
            return knob, int(args[args.index(knob) + 1])
    return None


def _evidence(p: Path):
    from reports.base.records import read_record
    from reports.model.observed import bench_run as ow
    return ow.from_sglang(read_record(p).payload)


def _slowdown(p: Path) -> float | None:
    from reports.base.records import read_record
    loop = read_record(p).payload.loop
    return loop.profiler_slowdown if loop is not None else None


def _spread(v: list[float]) -> float | None:
    return 100 * (max(v) - min(v)) / median(v) if len(v) > 1 else None


def loop_rows(out: Path, records: Path | None = None) -> list[dict]:
    """The model of the observed loop against bench_serving, per profiled case
    (`records/<case>/sglang.json`, `ppscope sglang`'s record of it; default: in the case)."""
    from reports.model.observed import bench_run as ow
    rec = records or out
    rows = []
    for d in sorted(p for p in out.iterdir() if (rec / p.name / "sglang.json").exists()):
        c = _case(d)
        dep, server, load, _ = _evidence(rec / d.name / "sglang.json")
        tok = bench_tok_per_s(d)
        if not tok:
            continue
        meas = median(tok)
        steady = ow.steady_tok_per_s(dep)
        run = ow.bench_run(dep, server, load)
        slow = _slowdown(rec / d.name / "sglang.json")
        corr = run.tok_per_s * slow if slow else None
        rows.append({
            "case": d.name, "depth": server.pp_async_batch_depth, "concurrency": load.concurrency,
            "measured_tok_per_s": meas, "runs": len(tok), "spread_pct": _spread(tok),
            "traced_sizes": list(dep.sizes),
            "steady_tok_per_s": steady, "steady_diff_pct": 100 * (steady / meas - 1),
            "run_tok_per_s": run.tok_per_s, "run_in_flight": run.mean_in_flight,
            "profiler_slowdown": slow,
            "modelled_tok_per_s": corr,
            "diff_pct": 100 * (corr / meas - 1) if corr else None,
            "extra_args": list(c.extra_args),
        })
    return rows


def groups(out: Path) -> dict[str, list[Path]]:
    """Lab cases by name without the `.k` of interleaved runs (cases.whatif_live_plan)."""
    by: dict[str, list[Path]] = {}
    for d in sorted(out.iterdir()):
        if (d / "case.json").exists():
            by.setdefault(d.name.split(".")[0], []).append(d)
    return by


def whatif_rows(out: Path, records: Path | None = None) -> list[dict]:
    """Predicted against measured change per after case (module docstring)."""
    from reports.model.observed import bench_run as ow
    rec = records or out
    by = groups(out)

    slow: dict[str, float] = {}

    def windows(C: int) -> list[Path]:
        """Every default server's profiled window at C, the one that ran closest to the
        benchmark's speed (the lowest profiler slowdown) first."""
        cands = []
        for name, dirs in by.items():
            if not re.fullmatch(rf"(w[a-z]|sp)-base-c{C}", name):
                continue
            for d in dirs:
                if (rec / d.name / "sglang.json").exists():
                    if d.name not in slow:
                        slow[d.name] = _slowdown(rec / d.name / "sglang.json") or float("inf")
                    cands.append((slow[d.name], d.name))
        return [rec / name / "sglang.json" for _, name in sorted(cands)]
    rows = []
    for name, dirs in sorted(by.items()):
        c = _case(dirs[0])
        base = c.case.baseline
        evs = windows(c.case.concurrency) if base in by else []
        if not evs:
            continue
        ev = evs[0]
        ch = change_of(c, _case(by[base][0]))
        if ch is None:
            continue
        knob, value = ch
        a = [x for d in dirs for x in bench_tok_per_s(d)]
        b = [x for d in by[base] for x in bench_tok_per_s(d)]
        if not a or not b:
            continue
        dep, server, load, _ = _evidence(ev)
        pred = ow.predict(dep, server, load, knob, value)
        # the same prediction from each other window of the before server (another round)
        every = [pred.change_pct] + [ow.predict(*_evidence(e)[:3], knob, value).change_pct
                                     for e in evs[1:]]
        meas = 100 * (median(a) / median(b) - 1)
        lo, hi = 100 * (min(a) / max(b) - 1), 100 * (max(a) / min(b) - 1)
        p = pred.change_pct
        sign_ok = (p > 0) == (meas > 0) or lo <= p <= hi
        size_ok = abs(p - meas) <= TARGET_REL * abs(meas) or lo <= p <= hi
        rows.append({
            "case": name, "before": base, "knob": knob, "value": value,
            "concurrency": load.concurrency, "interleaved": len(dirs) > 1,
            "before_tok_per_s": median(b), "after_tok_per_s": median(a),
            "before_runs": len(b), "after_runs": len(a),
            "measured_pct": meas, "measured_range_pct": [lo, hi],
            "predicted_pct": p, "evidence": ev.parent.name,
            "predicted_range_pct": [min(every), max(every)], "windows": len(every),
            "sizes_before": list(pred.before.steady_sizes),
            "sizes_after": list(pred.after.steady_sizes),
            "ok": bool(sign_ok and size_ok),
        })
    return rows


def render(wrows: list[dict], lrows: list[dict], fmt: str = "simple") -> str:
    from tabulate import tabulate
    a = tabulate([[r["knob"] + " " + str(r["value"]), r["concurrency"],
                   f"{r['before_tok_per_s']:.1f} -> {r['after_tok_per_s']:.1f}",
                   f"{r['measured_pct']:+.1f}% ({r['measured_range_pct'][0]:+.1f} .. "
                   f"{r['measured_range_pct'][1]:+.1f})", f"{r['predicted_pct']:+.1f}%"
                   + (f" ({r['predicted_range_pct'][0]:+.1f} .. {r['predicted_range_pct'][1]:+.1f})"
                      if r.get("windows", 1) > 1 else ""),
                   " ".join(map(str, [x for x in r["sizes_before"] if x])) + " -> "
                   + " ".join(map(str, [x for x in r["sizes_after"] if x])),
                   "yes" if r["ok"] else "no"] for r in wrows],
                 headers=["setting", "C", "tok/s (median)", "measured (range)", "predicted",
                          "modelled slots", "target"], tablefmt=fmt)
    b = tabulate([[r["case"], r["depth"], r["concurrency"],
                   f"{r['measured_tok_per_s']:.1f}" + (f" ({r['spread_pct']:.0f}%)"
                                                       if r["spread_pct"] is not None else ""),
                   f"{r['steady_tok_per_s']:.1f} ({r['steady_diff_pct']:+.1f}%)",
                   f"{r['run_tok_per_s']:.1f}", f"{r['profiler_slowdown']:.3f}"
                   if r["profiler_slowdown"] else "-",
                   f"{r['modelled_tok_per_s']:.1f} ({r['diff_pct']:+.1f}%)"
                   if r["modelled_tok_per_s"] else "-"] for r in lrows],
                 headers=["case", "depth", "C", "bench tok/s (spread)", "steady model",
                          "run model", "profiler slowdown", "run model / slowdown"],
                 tablefmt=fmt)
    return a + "\n\n" + b


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    out = Path(argv[0])
    if not out.is_dir():
        print(f"whatifs: {out} is not a lab results folder", file=sys.stderr)
        return 2
    rec = Path(argv[argv.index("--records") + 1]) if "--records" in argv else None
    w, lp = whatif_rows(out, rec), loop_rows(out, rec)
    print(render(w, lp, "github" if "--md" in argv else "simple"))
    if "--json" in argv:
        dest = Path(argv[argv.index("--json") + 1])
        dest.write_text(json.dumps({"whatifs": w, "loop": lp}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
