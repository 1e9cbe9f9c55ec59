"""The twin's held-out check: the twin of an observed server at k = 1 against that server.

A record of SGLang's CPU server (the lab's: `ppscope sglang` on a lab case) gives each rank's
forward time by micro-batch size, the server's settings and bench_serving's load. SGLang's own
server starts here at those settings with the twin's hold module, and bench_serving runs that
load, alternating (same server, the cost file re-read within 0.5 s):
- `server`: nothing held (k = 0): the server as it runs on this machine now;
- `twin`: every decode forward held to its traced time (k = 1,
  reports/model/observed/twin_costs.py) with the profiled window's own slowdown taken off
  (`--raw`: as traced), everything else SGLang's own.
The twin reproduces the server when its tok/s matches the server's (the issue's target: within
15%). The record's own bench_serving tok/s is set beside both: it ran at another time.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from statistics import median

from microbench.sglang_lab import drive
from microbench.sglang_lab.server import LabServer, ServerSpec
from microbench.sglang_lab.twin.run import say
from reports.base.payloads.twin import write_costs
from reports.base.schema import to_json
from reports.base.server_flags import server_args
from microbench.sglang_lab.venv import (MODEL_LAYERS, claim_lab_dir, ensure_model, ensure_venv,
                                        inject_path, sharegpt_file)

TARGET = 0.15


def held(stats: Path, pp: int) -> dict[str, float]:
    """The hold module's counts summed over the ranks (boot/inject/ppscope_twin_hold.py)."""
    tot = {"forwards": 0.0, "held": 0.0, "held_s": 0.0}
    for r in range(pp):
        p = stats.with_name(f"{stats.name}.{r}")
        if p.exists():
            try:
                d = json.loads(p.read_text())
            except ValueError:
                continue
            for k in tot:
                tot[k] += float(d.get(k) or 0)
    return tot


def _tok(path: Path) -> dict:
    line = [ln for ln in path.read_text().splitlines() if ln.strip()][-1]
    return json.loads(line)


def run_observed_twin(record: Path, out: Path, lab_dir: Path, reps: int = 2,
                      raw: bool = False) -> dict:
    from reports.base.records import read_record
    from reports.model.observed.twin_costs import costs
    from reports.model.observed import bench_run as ow
    sg = read_record(record).payload
    dep, server, load, measured = ow.from_sglang(sg)
    slow = sg.loop.profiler_slowdown if sg.loop is not None else None
    scale = 1.0 / slow if slow and slow > 1.0 and not raw else 1.0
    table = costs(dep, max(64, load.concurrency), scale=scale)
    claim_lab_dir(lab_dir)
    python = ensure_venv(lab_dir, say)
    model = ensure_model(python, lab_dir, layers=sum(dep.layers) or MODEL_LAYERS)
    out.mkdir(parents=True, exist_ok=True)
    cost_file = out / "twin-costs.json"
    written = write_costs(cost_file, table, 0.0)
    flags = server_args(server)     # the cap as the server was set, SGLang derives the rest
    spec = ServerSpec(python=python, model=model, pp=dep.pp, device="cpu", extra_args=flags,
                      env={"PYTHONPATH": str(inject_path()), "PPSCOPE_TWIN_COSTS": str(cost_file),
                           "PPSCOPE_TWIN_STATS": str(out / "hold-stats")})
    runs: dict[str, list[float]] = {"server": [], "twin": []}
    holds: list[dict] = []
    say(f"starting SGLang pp={dep.pp} {' '.join(flags)}")
    with LabServer(spec, out / "server.log", out / "traces") as srv:
        bench = drive.BenchSpec(python=python, url=srv.url, model=model,
                                dataset=sharegpt_file(lab_dir),
                                input_len=load.prompt_len or drive.INPUT_LEN,
                                output_len=load.output_len)
        drive.run_bench(bench, out / "warmup.out", concurrency=4, prompts=4, seed=1,
                        out=out / "warmup.jsonl")
        for rep in range(1, reps + 1):
            for side, k in (("server", 0.0), ("twin", 1.0)):
                written = write_costs(cost_file, table, k)
                time.sleep(1.0)              # the hold module re-reads the file within 0.5 s
                say(f"{side} (k = {k:g}) run {rep}/{reps}: C={load.concurrency}, "
                    f"{load.prompts} prompts")
                dst = out / f"{side}-{rep}.jsonl"
                h0 = held(out / "hold-stats", dep.pp)
                drive.run_bench(bench, out / "bench.out", concurrency=load.concurrency,
                                prompts=load.prompts, seed=100 + rep, out=dst)
                runs[side].append(float(_tok(dst)["output_throughput"]))
                drive.wait_idle(srv)
                time.sleep(0.6)              # the ranks' counts are written every 0.5 s
                if side == "twin":
                    h1 = held(out / "hold-stats", dep.pp)
                    holds.append({k: h1[k] - h0[k] for k in h1})
    s, t = median(runs["server"]), median(runs["twin"])
    return {"record": record.name, "pp": dep.pp, "flags": list(flags),
            "concurrency": load.concurrency, "prompts": load.prompts,
            "input_len": load.prompt_len, "output_len": load.output_len,
            "recorded_tok_per_s": measured,
            "profiler_slowdown": slow, "forward_scale": scale,
            "server_tok_per_s": runs["server"], "twin_tok_per_s": runs["twin"],
            "twin_vs_server_pct": 100.0 * (t / s - 1.0),
            "within_target": abs(t / s - 1.0) <= TARGET, "target_pct": 100 * TARGET,
            # per twin run, summed over the ranks: forwards, those the hold lengthened, seconds
            "holds": holds,
            "costs": to_json(written)}


def render(d: dict) -> str:
    f = ", ".join
    return "\n".join([
        f"held-out twin of {d['record']}: PP{d['pp']} {' '.join(d['flags'])}, C={d['concurrency']}, "
        f"{d['prompts']} prompts of {d['input_len']} tokens, {d['output_len']} out",
        f"  recorded bench_serving: {d['recorded_tok_per_s'] or float('nan'):.1f} tok/s "
        f"(profiled window's slowdown {d['profiler_slowdown'] or float('nan'):.2f}; forwards "
        f"held at x{d.get('forward_scale', 1.0):.2f} of their traced time)",
        f"  server now (k = 0):     {f(f'{x:.1f}' for x in d['server_tok_per_s'])} tok/s",
        f"  twin (k = 1):           {f(f'{x:.1f}' for x in d['twin_tok_per_s'])} tok/s",
        *[f"  twin run {i + 1}: the hold lengthened {h['held']:.0f} of {h['forwards']:.0f} "
          f"forwards by {h['held_s']:.1f} s in all" for i, h in enumerate(d.get("holds") or [])],
        f"  twin against server: {d['twin_vs_server_pct']:+.1f}% (median; target within "
        f"+-{d['target_pct']:.0f}%: {'met' if d['within_target'] else 'not met'})"])
