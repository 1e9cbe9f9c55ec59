"""The twin: a deployment's PP loop on SGLang's own scheduler, with only the device time emulated.

SGLang's own server (the lab's venv, CPU) runs at the deployment's settings: its pipeline size,
async depth, chunked-prefill budget, request rows and per-slot cap, and a tiny Llama with the
deployment's layer count, so SGLang splits the layers itself (`get_pp_indices`). Every rank's
forward is held to the deployment's stage time for that batch, every hidden-state send to the hop
cost, and every visit to the deployment's host work (reports/model/scenario/twin_costs.py: the figures
the pipeline model uses; boot/inject/ppscope_twin_hold.py holds them inside SGLang's processes).
All of it is multiplied by a dilation k so that this machine's own host work (eight schedulers
on a few cores) stays a small share of the emulated step; times are divided by k again.

k comes from a calibration on the same server: bench_serving at C = 1 with no emulated time
(k = 0) gives this machine's own step; k is the smallest that keeps it under `HOST_SHARE` of the
model's emulated step at C = 1 (capped by `--max-k`; the share reached is recorded). Then, per
setting and concurrency, one bench_serving run (the scenario's prompt length, a short output
stated in the record, `--flush-cache` so that the warm-up prompt's prefill is no cache hit): the
undilated TPOT beside the model's, and the micro-batches SGLang formed (its log's `Prefill batch,
#new-seq` waves) beside the model's burst. With repetitions, the settings are interleaved: each
repetition starts every setting's server once more, in the same order, with its own seeds.

The device time is emulated as a GPU's (`async`, boot/inject/ppscope_twin_hold.py): each rank's
forwards run on an emulated device while its CPU goes on; the PP sends and receives are ordered
on SGLang's schedule stream as torch's NCCL point-to-point ops order them on its default path
(a receive holds the stream until the data arrives, a forward waits for the stream), and the CPU
waits only where SGLang's waits on a GPU (`d2h_event.synchronize()` before it processes a slot's
results: the tokens and everything queued on the schedule stream before them). Prefill times
are estimates.
"""
from __future__ import annotations

import math
import re
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from microbench.sglang_lab import drive
from microbench.sglang_lab.server import LabServer, ServerSpec
from microbench.sglang_lab.twin.steady import steady_decode
from reports.base.payloads.twin import TwinData
from microbench.sglang_lab.venv import (claim_lab_dir, ensure_model, ensure_venv,
                                        inject_path, sharegpt_file)

HOST_SHARE = 0.10          # this machine's own step at C = 1 over the emulated one, at most
# bench_serving sends its first prompt once alone before the run (`--warmup-requests`, default 1,
# SGLang 0.5.23 benchmark/serving.py); its Prefill line is the slice's first, and it is left out
WARMUP_REQUESTS = 1
_PREFILL = re.compile(r"PP0\] Prefill batch, #new-seq: (\d+),")


@dataclass(frozen=True)
class TwinSetting:
    """One server the twin starts: a name, SGLang flags, and the model's changes for it
    (reports/model/settings_change.py)."""
    name: str
    flags: tuple[str, ...] = ()
    changes: tuple = ()
    source: str = "SGLang's defaults at the deployment's settings"


def say(msg: str) -> None:
    print(f"twin: {msg}", file=sys.stderr, flush=True)


def with_flag(flags: tuple[str, ...], name: str, value: str) -> tuple[str, ...]:
    out, i = list(flags), 0
    while i < len(out):
        if out[i] == name:
            del out[i:i + 2]
        else:
            i += 1
    return tuple(out + [name, value])


def calibrated_k(host_tpot_ms: float, model_tpot_ms: float, max_k: float) -> tuple[float, float]:
    """(k, the share of the emulated step that this machine's own step is at that k)."""
    need = host_tpot_ms / (HOST_SHARE * model_tpot_ms) if model_tpot_ms > 0 else max_k
    k = float(min(max_k, max(1, math.ceil(need))))
    return k, host_tpot_ms / (k * model_tpot_ms) if model_tpot_ms > 0 else float("nan")


def waves(log_text: str) -> list[int]:
    """`#new-seq` of each `Prefill batch` line of rank 0 (chunk continuations show as 0)."""
    return [int(m.group(1)) for m in _PREFILL.finditer(log_text)]


def _bench(server: LabServer, bench: drive.BenchSpec, out: Path, C: int, prompts: int,
           seed: int) -> tuple[dict, list[int], str]:
    """bench_serving's result, the waves SGLang admitted and the log of the run."""
    start = server.log_size()
    drive.run_bench(bench, out / "bench.out", timeout_s=3600.0, concurrency=C, prompts=prompts,
                    seed=seed, out=out / "bench.jsonl", flush_cache=True)
    import json
    line = [ln for ln in (out / "bench.jsonl").read_text().splitlines() if ln.strip()][-1]
    text = server.log_text(start)
    return json.loads(line), waves(text)[WARMUP_REQUESTS:], text


def _run_model(inp, C: int, completed: int, output_len: int, logged: list[int], changes,
               cached_prompts: int = 0) -> float | None:
    """The model of this very run (reports/model/scenario/bench_transient.py): SGLang's first logged
    wave admitted first, every prompt prefilled whole (the twin flushes the cache after the
    warm-up request; a run without the flush has `WARMUP_REQUESTS` prompts cached); None when
    the run cannot be modelled."""
    from reports.model.scenario.bench_transient import model_bench, waves_of
    try:
        return model_bench(inp, C, max(completed, 1), output_len, waves_of(logged, C),
                           changes=changes, cached_prompts=cached_prompts).tpot_ms
    except ValueError:
        return None


def run_twin(inp, settings: list[TwinSetting], concurrency: list[int], out: Path, lab_dir: Path,
             output_len: int, max_k: float, k: float | None = None,
             mode: str = "async", keep=None, reps: int = 1) -> TwinData:
    """Calibrate, then run each setting at each concurrency, `reps` times with the settings
    interleaved; then the model of every run (`model_figures`); returns the record's data.
    `keep(data)`: called after every finished run with the record so far (write as you go: its
    runs modelled as it is written, each run once)."""
    from reports.base.payloads.twin import write_costs
    from reports.model.scenario.twin_costs import costs
    claim_lab_dir(lab_dir)
    python = ensure_venv(lab_dir, say)
    model = ensure_model(python, lab_dir, layers=inp.model.num_layers)
    dataset = sharegpt_file(lab_dir)
    out.mkdir(parents=True, exist_ok=True)
    cost_file = out / "twin-costs.json"      # the run's own: two twins never share one
    table = costs(inp, max(64, max(concurrency)), mode=mode)
    # nothing emulated (k = 0) until the calibration has chosen k; a given k from the start
    written = write_costs(cost_file, table, 0.0 if k is None else k)
    tokens = max(concurrency) * (inp.prompt_len + output_len) + 4096
    measured: list[tuple[TwinSetting, dict]] = []
    rows: list[dict] = []       # the measured runs with their model, in run order

    def record(done: bool) -> TwinData:
        for st, run in measured[len(rows):]:
            rows.append(run | model_figures(inp, st, run, output_len))
        return _data(inp, calib, output_len, rows, written, mode, reps, done=done,
                     choices=choices)
    calib = None if k is None else {"k": k, "given": True}
    choices = None
    for rep in range(reps):
        for si, st in enumerate(settings):
            spec = ServerSpec(python=python, model=model, pp=inp.pp, device="cpu",
                              extra_args=st.flags, max_total_tokens=max(16384, tokens),
                              env={"PYTHONPATH": str(inject_path()),
                                   "PPSCOPE_TWIN_COSTS": str(cost_file),
                                   # the steady window is timed on the log's clock
                                   "SGLANG_LOG_MS": "1"})
            sdir = out / st.name / f"rep{rep + 1}" if reps > 1 else out / st.name
            sdir.mkdir(parents=True, exist_ok=True)
            say(f"starting SGLang pp={inp.pp} {' '.join(st.flags)} ({inp.pp} ranks on this "
                f"machine: 1-3 min)" + (f"; repetition {rep + 1} of {reps}" if reps > 1 else ""))
            with LabServer(spec, sdir / "server.log", sdir / "traces") as server:
                choices = server.choices
                bench = drive.BenchSpec(python=python, url=server.url, model=model,
                                        dataset=dataset, input_len=inp.prompt_len,
                                        output_len=output_len)
                if calib is None:
                    calib = _calibrate(inp, server, bench, out / "calibration", max_k)
                    written = write_costs(cost_file, table, calib["k"])
                    time.sleep(1.0)              # the hold module re-reads the file within 0.5 s
                for C in concurrency:
                    seed = (100 + si * 1000 + C + zlib.crc32(st.name.encode()) % 97
                            + rep * 7919)
                    measured.append((st, _one_run(inp, st, C, server, bench, sdir / f"c{C}",
                                                  seed, calib["k"], output_len)
                                     | {"rep": rep + 1}))
                    if keep is not None:
                        keep(record(done=False))
                    drive.wait_idle(server, timeout_s=600.0)
    return record(done=True)


def _calibrate(inp, server: LabServer, bench: drive.BenchSpec, cdir: Path, max_k: float) -> dict:
    """bench_serving at C = 1 with no emulated time: this machine's own step, and k."""
    from reports.model.scenario import loop_builder as lb
    say("calibration: C=1 with no emulated time (k = 0)")
    cdir.mkdir(parents=True, exist_ok=True)
    b, _, _ = _bench(server, bench, cdir, 1, 2, seed=7)
    model_tpot = lb.run(inp, 1).tpot_ms
    kk, share = calibrated_k(b["median_tpot_ms"], model_tpot, max_k)
    say(f"this machine's own step {b['median_tpot_ms']:.0f} ms at C=1; model "
        f"{model_tpot:.1f} ms: k = {kk:g} (own step {share:.0%} of the emulated one)")
    return {"host_tpot_ms": b["median_tpot_ms"], "model_tpot_ms_c1": model_tpot, "k": kk,
            "host_share": share, "target_share": HOST_SHARE, "max_k": max_k}


def _one_run(inp, st: TwinSetting, C: int, server: LabServer, bench: drive.BenchSpec,
             cdir: Path, seed: int, k: float, output_len: int) -> dict:
    """One bench_serving run at C on a started server: the record's row as measured,
    undilated (the model's figures are set beside it after the runs: `model_figures`)."""
    say(f"{st.name}: C={C}, {max(2, C)} prompts of {inp.prompt_len} tokens, {output_len} out "
        f"(k = {k:g})")
    cdir.mkdir(parents=True, exist_ok=True)
    b, w, log = _bench(server, bench, cdir, C, max(2, C), seed)
    steady = steady_decode(log, C)
    row = {
        "setting": st.name, "flags": list(st.flags), "concurrency": C,
        "twin_tpot_ms": b["median_tpot_ms"] / k,
        "twin_output_tok_per_s": b["output_throughput"] * k,
        "twin_decode_tok_per_s": C * 1000.0 * k / b["median_tpot_ms"],
        "twin_ttft_ms": b["median_ttft_ms"] / k, "completed": b["completed"],
        # bench_serving counts a token when its chunk carries text: the tokens it re-counted
        # from the text beside those SGLang made (the lab model gives every token text)
        "bench_text_tokens": b.get("total_output_tokens_retokenized"),
        "bench_output_tokens": b.get("total_output_tokens"),
        "waves": w,
        # the decode loop alone, all C requests decoding (SGLang's log; the model's quantity)
        "twin_steady_tpot_ms": steady.tpot_ms / k if steady else None,
        "steady_cycles": steady.cycles if steady else 0,
        "steady_slots": list(steady.slots) if steady else [],
    }
    st_text = (f", steady decode {row['twin_steady_tpot_ms']:.1f} over {steady.cycles} rounds"
               if steady else ", no steady window in the log")
    say(f"{st.name} C={C}: TPOT {row['twin_tpot_ms']:.1f} ms undilated{st_text}; SGLang "
        f"admitted {w}")
    return row


def model_figures(inp, st: TwinSetting, run: dict, output_len: int) -> dict:
    """The model's figures for one finished run (`_one_run`'s row): its steady loop at the
    run's C and setting, that loop with the forward holding the CPU (`model_of_twin`), and the
    model of this very run from the waves SGLang admitted (`_run_model`)."""
    from reports.model.scenario import loop_builder as lb
    from reports.model.scenario.twin_costs import model_of_twin
    C = run["concurrency"]
    pred = lb.run(inp, C, changes=st.changes)
    return {"model_tpot_ms": pred.tpot_ms,
            "model_cpu_forward_tpot_ms": model_of_twin(inp, C, changes=st.changes).tpot_ms,
            "model_tok_per_s": pred.tok_per_s,
            "model_slots": [s for s in pred.slot_sizes if s],
            "run_model_tpot_ms": _run_model(inp, C, run["completed"], output_len, run["waves"],
                                            st.changes)}


def _data(inp, calib, output_len, rows, written, mode, reps: int, done: bool,
          choices=None) -> TwinData:
    """The record's data, checked as every reader reads it (reports/base/payloads/twin.py)."""
    from dataclasses import asdict
    from reports.base.schema import from_json, to_json
    return from_json(TwinData, {"scenario": inp.name, "pp": inp.pp, "calibration": calib, "output_len": output_len,
            "prompt_len": inp.prompt_len, "rows": list(rows), "costs": to_json(written),
            "complete": done,
            "mode": mode, "reps": reps, "flush_cache": True, "hold": "stream",
            "emulated": "every forward, hop and host visit held to the deployment's time x k "
                        "(reports/model/scenario/twin_costs.py); "
                        + ("device time as a GPU's: the CPU runs ahead of the forward, "
                           "the PP messages ordered on SGLang's schedule stream"
                           if mode == "async" else "the forward holds its rank's CPU")
                        + "; prefill times estimated",
            "observed": [list(p) for p in inp.observed],
            # the lab's choices for its servers: ranks' cores, radix core, GPU hidden (server.py)
            "server": asdict(choices) if choices else None})

