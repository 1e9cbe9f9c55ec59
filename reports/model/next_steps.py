""""Measure your server": the next commands for the user's deployment, chosen by which evidence
the report is missing. Each step says what it adds and is written for the deployment the report
describes (its pipeline size, the concurrencies the user measured, the concurrency where the
herd is modelled), with every value filled in and ppscope called the way it runs here
(reports/base/invocation.py), so that each command runs as pasted or stops with one line
naming what is missing (a GPU, a server, SGLang). SGLang flags and endpoints as in SGLang 0.5.x
(`srt/server_args.py`: `--pp-max-micro-batch-size`; ppscope's recipe flags from
reports/base/server_flags.py `RECIPE_ARGS`;
`srt/entrypoints/http_server.py`: `/start_profile`, `/stop_profile`, `/metrics`,
`/set_internal_state`; the profiler writes one Kineto trace per rank under
`SGLANG_TORCH_PROFILER_DIR`); `python3 -m sglang.bench_serving --output-file` appends one JSON
line per run.
"""
from __future__ import annotations

from reports.base.invocation import ppscope_command, python_command
from reports.base.server_flags import RECIPE_ARGS
from reports.model.report_type import Report, ServerDiagnosis, Step

URL = "http://127.0.0.1:30000"
TRACES = '"$PWD/sglang_traces"'   # the server and ppscope run from the same folder


def herd_concurrency(rep: Report, concurrencies: list[int]) -> int:
    """The concurrency where the herd verdict is strongest (its largest share), else the
    largest measured one."""
    herd = next((v for v in rep.verdicts if v.cause == "herd"), None)
    at = [a for a in (herd.at if herd else ()) if a.concurrency
          and a.concurrency in concurrencies and a.share is not None]
    if at:
        return max(at, key=lambda a: a.share).concurrency
    return max(concurrencies or [8])


def _lengths(rep: Report) -> tuple[int, int, float]:
    """The request lengths the report models (prompt, output, range ratio), for bench_serving."""
    p = {x.name: x.value for x in rep.params}
    ratio = p.get("range_ratio")
    return (int(p.get("prompt_len") or 1000), int(p.get("output_len") or 256),
            1.0 if ratio is None else float(ratio))


def bench_command(c: int, prompt: int = 1000, output: int = 256, ratio: float = 1.0) -> str:
    """bench_serving at concurrency c. `--flush-cache`: its warm-up request is the run's first
    prompt, and without a flush SGLang's radix cache serves that prompt's prefill, which moves
    the first admission with the arrival order (SGLang 0.5.23 sglang/benchmark/serving.py
    `benchmark`; docs/BENCHMARKS.md section 17: +50% or +99% for the same setting)."""
    return (f"python3 -m sglang.bench_serving --backend sglang --base-url {URL} "
            f"--dataset-name random --random-input-len {prompt} --random-output-len {output} "
            f"--random-range-ratio {ratio:g} --num-prompts {4 * c} --max-concurrency {c} "
            "--flush-cache --output-file bench.jsonl")


def next_steps(rep: Report, concurrencies: list[int], pp: int, model: str = "kimi-k2",
               mla: bool = True) -> list[Step]:
    """The steps still worth taking, first the ones that change the most of the report.
    `model`: the preset (or config path) the commands name; `mla`: it has MLA attention."""
    ppscope, py = ppscope_command(), python_command()
    ranks = rep.server.ranks if rep.server else ()
    has_log = any(r.decode_lines for r in ranks)
    has_traces = any(r.trace_span_ms for r in ranks)
    diagnosed = isinstance(rep.diagnosis, ServerDiagnosis)
    cs = list(concurrencies) or [1, 8, 32]
    c_herd = herd_concurrency(rep, cs)
    out: list[Step] = []
    if not (has_log and has_traces):
        out.append(Step(
            "Start the server with metrics and a profiler directory, and log every decode step: "
            "the traces and logs are what the diagnosis reads (per-rank forward, host and "
            "communication time; slot sizes; CUDA-graph share; the prefill waves that say how "
            "requests arrived). Set MODEL_PATH to your model first.",
            (f"export SGLANG_TORCH_PROFILER_DIR={TRACES}",
             'python3 -m sglang.launch_server --model-path "${MODEL_PATH:?set MODEL_PATH to '
             f'your model}}" --pp-size {pp} --host 127.0.0.1 --port 30000 '
             f"{' '.join(RECIPE_ARGS)} 2>&1 | tee server.log")))
    out.append(Step(
        "Measure throughput at each concurrency you care about (one bench_serving run per C, "
        "appended to bench.jsonl); the report takes the observed tok/s from this file (never "
        "fits the model to it).",
        tuple(bench_command(c, *_lengths(rep)) for c in cs)))
    if not diagnosed:
        out.append(Step(
            f"Profile the server under load at C={c_herd}, where the herd is modelled, and read "
            "its per-rank traces in the same run (--profile records them into the profiler "
            "directory and reads them); then add the server log and the bench runs: each "
            "`ppscope sglang` run adds its own part to results/sglang.json, the others stay.",
            (f"{ppscope} sglang --url {URL} --live-concurrency {c_herd} --profile "
             f"--trace-dir {TRACES} --model {model}",
             f"{ppscope} sglang --log server.log --bench bench.jsonl --model {model} "
             f"--concurrency {c_herd}")))
    eff = next((p for p in rep.params if p.name == "kernel_efficiency"), None)
    if eff and eff.source != "measured":
        what = ("the per-stage decode cost of this model in its served format on that GPU, "
                "with SGLang's own fused MoE kernel timed beside ppscope's")
        cmds = [f"{ppscope} stage-cost --model {model} --pp {pp} --moe-backends triton,sglang"]
        if mla:
            what += (", and the MLA decode attention SGLang runs by default off Hopper and "
                     "SM100 (its Triton backend) beside ppscope's")
            cmds.append(f"{py} -m microbench.stage_cost.sglang_anchor --model {model}")
        out.append(Step(
            f"Measure the kernels on one of your server's GPUs: the kernel efficiency here is "
            f"{eff.source}, not measured there. This times {what}; the report then "
            "uses the stage cost in place of the estimate.",
            (*cmds, f"{ppscope} report --results results")))
    caps = [w for w in rep.what_ifs
            if w.knob == "--pp-max-micro-batch-size" and str(w.setting).isdigit()]
    cap = int(caps[0].setting) if caps else max(1, c_herd // pp)   # the best cap modelled
    sweep = sorted({max(1, -(-c_herd // m)) for m in (1, 2, 4, pp)} | {cap})
    out.append(Step(
        "Try the micro-batch cap live, without a restart, and see which setting holds up at "
        f"every concurrency (the what-ifs predict it; this measures it); the second command "
        f"sets it by hand to {cap}, the best cap the what-ifs model.",
        (f"{ppscope} sglang --url {URL} --mmb-sweep {','.join(map(str, sweep))} "
         f"--live-concurrency {c_herd}",
         f"curl -sS -X POST {URL}/set_internal_state -H 'Content-Type: application/json' "
         f"-d '{{\"server_args\": {{\"pp_max_micro_batch_size\": {cap}}}}}'")))
    out.append(Step("Then read everything again in one report (results/sglang.json holds the "
                    "bench runs, the log and the traces).",
                    (f"{ppscope} report --results results",)))
    return out
