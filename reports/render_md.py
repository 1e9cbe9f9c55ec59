"""report.json -> Markdown (results/report.md) and the compact terminal table."""
from __future__ import annotations

from typing import Any

from tabulate import tabulate


def _f(x: Any, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def banner(rep: dict[str, Any]) -> str:
    if rep["all_estimated"]:
        return ("**Every figure below is estimated** (no probe records in results/: roofline, "
                "datasheet and the scenario's stated assumptions) except the observed tok/s.")
    return f"Measured inputs from: {', '.join(rep['records_used'])}; the rest is estimated."


def terminal_table(rep: dict[str, Any]) -> str:
    rows = [[c["concurrency"], _f(c["ideal_tok_per_s"]), _f(c["predicted"]), _f(c["observed"]),
             _f(c["predicted_tpot_ms"], 2), " ".join(str(s) for s in c["slot_sizes"] if s)]
            for c in rep["concurrency"]]
    top = tabulate(rows, headers=["C", "ideal tok/s", "modelled tok/s", "observed tok/s",
                                  "modelled TPOT ms", "occupied slots"])
    a = max(rep["attribution"], key=lambda x: x["concurrency"])
    rows = [[r["cause"], _f(r["ms_per_step"], 2), _f(r["tok_per_s"]),
             "-" if r["share"] is None else f"{r['share']:.0%}", r["source"]] for r in a["rows"]]
    mid = tabulate(rows, headers=[f"cause (C={a['concurrency']})", "ms/step", "tok/s", "share",
                                  "source"])
    ver = tabulate([[v["hypothesis"], v["verdict"], v["number"]] for v in rep["verdicts"]],
                   headers=["hypothesis", "verdict", "deciding number"])
    head = "every figure is estimated (no records in results/)\n" if rep["all_estimated"] else ""
    return f"{head}{top}\n\n{mid}\n\n{ver}"


def render_md(rep: dict[str, Any]) -> str:
    d = rep["deployment"]
    out = [f"# ppscope report: {rep['scenario']}", "", banner(rep), "",
           f"{d['model']} on {d['pp']}x {d['gpu']}, PP{d['pp']}, async depth {d['async_depth']}, "
           f"pp_max_micro_batch_size {d['max_micro_batch']}, CUDA graphs "
           f"{'on' if d['cuda_graphs'] else 'off'} (max bs {d['graph_max_bs']}), "
           f"{d['arrival']} arrivals, mean context {d['context_len']} tokens.", ""]
    for w in rep["warnings"]:
        out.append(f"> warning: {w}")
    out += ["", "## Throughput", "", tabulate(
        [[c["concurrency"], _f(c["ideal_tok_per_s"]), _f(c["predicted"]), _f(c["observed"]),
          _f(c["predicted_tpot_ms"], 2), " ".join(f"{b:.0%}" for b in c["busy_frac"]),
          " ".join(str(s) for s in c["slot_sizes"] if s)] for c in rep["concurrency"]],
        headers=["C", "ideal tok/s", "modelled tok/s", "observed tok/s", "TPOT ms",
                 "GPU busy per stage", "occupied slots"], tablefmt="github"), ""]
    out += ["## Where the time goes (ideal -> modelled, Shapley; then modelled -> observed)", ""]
    for a in rep["attribution"]:
        out += [f"### C = {a['concurrency']}: ideal {a['ideal_tpot_ms']:.2f} ms/step -> "
                f"modelled {a['modelled_tpot_ms']:.2f} ms/step", "", tabulate(
                    [[r["label"], _f(r["ms_per_step"], 2), _f(r["tok_per_s"]),
                      "-" if r["share"] is None else f"{r['share']:.0%}", r["evidence"],
                      r["source"]] for r in a["rows"]],
                    headers=["cause", "ms per decode step", "tok/s", "share of gap", "evidence",
                             "source"], tablefmt="github"), ""]
    out += ["## Verdicts on the hypotheses", "", tabulate(
        [[v["hypothesis"], v["verdict"], v["number"], v["evidence"]] for v in rep["verdicts"]],
        headers=["hypothesis", "verdict", "deciding number", "evidence"], tablefmt="github"), ""]
    out += ["## What-ifs (one change, model re-run)", "", tabulate(
        [[w["knob"], w["setting"], w["concurrency"], _f(w["baseline_tok_per_s"]),
          _f(w["predicted_tok_per_s"]), f"{w['gain']:+.0%}", w["note"]] for w in rep["what_ifs"]],
        headers=["knob", "setting", "C", "now tok/s", "predicted tok/s", "gain", "note"],
        tablefmt="github"), ""]
    if rep.get("dispatch_validation"):
        out += ["## Model vs dispatch probe (same configuration)", "", tabulate(
            [[c["policy"], c["arrival"], c["concurrency"], _f(c["measured_tok_per_s"]),
              _f(c["modelled_tok_per_s"]), f"{c['diff_pct']:+.1f}%",
              c.get("note") or "within 10%"]
             for c in rep["dispatch_validation"]],
            headers=["policy", "arrival", "C", "measured tok/s", "modelled tok/s", "diff",
                     "note"], tablefmt="github"), "",
            "Model inputs from dispatch.json only (forward time per rank and size, rank-0 "
            "dispatch latency per slot size, hop); rank 0's token read is a host sync on its "
            "compute stream, so its host time sits between its forwards.", ""]
    if rep.get("dispatch_micro_batches"):
        out += ["## Micro-batch count (dispatch probe's configuration)", "", tabulate(
            [[c["concurrency"], c["micro_batches"], " ".join(map(str, c["slot_sizes"])),
              _f(c["modelled_tok_per_s"]), _f(c["measured_tok_per_s"]),
              "interpolated" if c["interpolated"] else "measured"]
             for c in rep["dispatch_micro_batches"]],
            headers=["C", "micro-batches", "slot sizes", "modelled tok/s", "measured tok/s",
                     "forward times"], tablefmt="github"), ""]
    out += ["## Inputs", "", tabulate(
        [[p["name"], str(p["value"])[:70], p["source"], p["evidence"], p["note"]]
         for p in rep["params"]],
        headers=["input", "value", "source", "evidence", "note"], tablefmt="github"), ""]
    if rep["assumptions"]:
        out += ["## Scenario assumptions", ""] + [f"- **{k}**: {v}"
                                                  for k, v in rep["assumptions"].items()]
    return "\n".join(out) + "\n"
