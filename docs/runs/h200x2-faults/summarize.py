"""Print the fault-matrix table of docs/BENCHMARKS.md from diagnose_matrix.sh's output.

For each case: measured tok/s and slowdown against the clean run at the same C (even admission,
graphs on); the report's first named cause and its size; unexplained; and, as a check of the
attribution itself, how many ms per decode step the injected fault's cause grew against the
clean run's diagnosis next to how much the observed step grew.
    python docs/runs/h200x2-faults/summarize.py OUTDIR
"""
import json
import sys
from pathlib import Path

FAULT = {"slow-stage": "slow_stage", "host-delay": "host", "hop-delay": "hop",
         "graphs-off": "launch_gaps", "gpu1-shared": "slow_stage", "cpu-hog": "relay",
         "base/sglang": "herd", "nop2p": None}


def load(d: Path) -> dict:
    return json.loads((d / "report.json").read_text())["diagnosis"]


def main(out: str) -> None:
    root = Path(out)
    clean = {8: load(root / "base" / "diag-even-c8"), 32: load(root / "base" / "diag-even-c32")}
    print("| case | C | tok/s | slowdown vs clean | first named cause (size) | unexplained | "
          "injected cause's growth vs step growth, ms |")
    print("|---|---|---|---|---|---|---|")
    for d in sorted(root.glob("*/diag-*")):
        if d.name.endswith("-noprof"):   # the CPU-correction check, printed by diagnose_matrix
            continue
        case, (pol, c) = d.parent.name, d.name.split("-")[1:]
        C = int(c[1:])
        g = load(d)
        key = "base/sglang" if case == "base" and pol == "sglang" else case
        cl = clean[C]
        slow = cl["observed_tok_per_s"] / g["observed_tok_per_s"] - 1
        rows = {r["cause"]: r for r in g["rows"]}
        top = g["rows"][0]
        name = (f"{top['cause']} ({top['size_pct']:.0f}%)" if g["named"] else
                f"nothing big (largest {top['cause']} {top['size_pct']:.0f}%)")
        f = FAULT.get(key)
        grow = "-"
        if f and case != "base" or key == "base/sglang":
            crow = {r["cause"]: r for r in cl["rows"]}
            dm = rows[f]["ms_per_step"] - crow[f]["ms_per_step"]
            ds = g["observed_step_ms"] - cl["observed_step_ms"]
            grow = f"{f}: {dm:+.2f} vs {ds:+.2f} ({dm / ds:.0%})" if abs(ds) > 1e-9 else "-"
        label = f"{case} ({pol})" if case == "base" else case
        print(f"| {label} | {C} | {g['observed_tok_per_s']:.0f} | {slow:+.0%} | {name} | "
              f"{g['unexplained_pct']:+.0f}% | {grow} |")


if __name__ == "__main__":
    main(sys.argv[1])
