""""Measure your server": the next commands for the user's deployment, chosen by which evidence
the report is missing. Each step says what it adds and is written for the deployment the report
describes (its pipeline size, the concurrencies the user measured). SGLang flags and endpoints
as in SGLang 0.5.x (`python/sglang/srt/server_args.py`: `--enable-metrics`,
`--pp-max-micro-batch-size`; `python/sglang/srt/entrypoints/http_server.py`: `/start_profile`,
`/stop_profile`, `/metrics`, `/set_internal_state`; the profiler writes one Kineto trace per
rank under `SGLANG_TORCH_PROFILER_DIR`); `python -m sglang.bench_serving --output-file`
appends one JSON line per run.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    why: str          # what evidence it adds, and which part of the report it decides
    commands: tuple[str, ...]


def next_steps(rep: dict, concurrencies: list[int], pp: int, model: str = "kimi-k2",
               mla: bool = True) -> list[Step]:
    """The steps still worth taking, first the ones that change the most of the report.
    `model`: the preset (or config path) the commands name; `mla`: it has MLA attention."""
    srv = rep.get("server") or {}
    ranks = srv.get("ranks") or []
    has_log = any(r.get("decode_lines") for r in ranks)
    has_traces = any(r.get("trace_span_ms") for r in ranks)
    has_bench = bool(srv.get("bench")) or bool(rep.get("observed_source"))
    dg = rep.get("diagnosis") or {}
    diagnosed = dg.get("status") == "ok"
    cs = ",".join(str(c) for c in concurrencies) or "1,8,32"
    c_hi = max(concurrencies or [8])
    out: list[Step] = []
    if not (has_log and has_traces):
        out.append(Step(
            "Start the server with metrics and a profiler directory, and log every decode step: "
            "the traces and logs are what the diagnosis reads (per-rank forward, host and "
            "communication time; slot sizes; CUDA-graph share).",
            ("export SGLANG_TORCH_PROFILER_DIR=/srv/sglang_traces",
             f"python -m sglang.launch_server ... --pp-size {pp} --enable-metrics "
             "--decode-log-interval 1 2>&1 | tee server.log")))
    if not has_bench:
        out.append(Step(
            "Measure throughput at each concurrency you care about; the report takes the "
            "observed tok/s from this file (never fits the model to it).",
            tuple(f"python -m sglang.bench_serving --backend sglang --dataset-name random "
                  f"--random-input-len 1000 --random-output-len 256 --num-prompts {4 * c} "
                  f"--max-concurrency {c} --output-file bench.jsonl" for c in
                  (concurrencies or [1, 8, 32]))))
    if not diagnosed:
        out.append(Step(
            f"Profile the server under load at C={c_hi} and read its traces: this is what "
            "turns the report from the scenario's estimate into a diagnosis of your server.",
            (f"ppscope sglang --url http://127.0.0.1:30000 --live-concurrency {c_hi} --profile "
             f"--trace-dir /srv/sglang_traces --model {model} --watch 60",
             "ppscope sglang --log server.log --traces /srv/sglang_traces/<profile id> "
             f"--bench bench.jsonl --model {model} --concurrency {c_hi}")))
    eff = next((p for p in rep.get("params") or [] if p.get("name") == "kernel_efficiency"), {})
    if eff and eff.get("source") != "measured":
        what = ("the per-stage decode cost of this model in its served format on that GPU, "
                "with SGLang's own fused MoE kernel timed beside ppscope's")
        cmds = [f"ppscope stage-cost --model {model} --pp {pp} --moe-backends triton,sglang"]
        if mla:
            what += (", and the MLA decode attention SGLang runs by default off Hopper and "
                     "SM100 (its Triton backend) beside ppscope's")
            cmds.append(f"python3 -m microbench.sglang_anchor --model {model}")
        out.append(Step(
            f"Measure the kernels on one of your server's GPUs: the kernel efficiency here is "
            f"{eff.get('source')}, not measured there. This times {what}; the report then "
            "uses the stage cost in place of the estimate.",
            (*cmds, "ppscope report --results results")))
    out.append(Step(
        "Try the micro-batch cap live, without a restart, and see which setting holds up at "
        "every concurrency (the what-ifs predict it; this measures it).",
        (f"ppscope sglang --url http://127.0.0.1:30000 --mmb-sweep "
         f"{','.join(str(x) for x in sorted({max(1, c_hi // pp), max(1, c_hi // (2 * pp)), c_hi}))} "
         f"--live-concurrency {c_hi}",
         "curl -s -X POST http://127.0.0.1:30000/set_internal_state -H 'Content-Type: "
         "application/json' -d '{\"server_args\": {\"pp_max_micro_batch_size\": N}}'")))
    out.append(Step("Then read everything again in one report.",
                    (f"ppscope report --bench bench.jsonl   # observed at C = {cs}",)))
    return out
