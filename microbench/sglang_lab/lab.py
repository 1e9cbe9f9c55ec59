"""Run the lab's plan on SGLang's own server and keep every case's artefacts (see __init__.py).

A case is written into `OUT/.partial/<case>` and moved to `OUT/<case>` only when it finished,
so a failed run never replaces good artefacts. Progress goes to stderr, one line per step.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

from microbench.sglang_lab import drive
from microbench.sglang_lab.cases import Case, Group
from microbench.sglang_lab.server import LabServer, ServerSpec
from microbench.sglang_lab.venv import (LabError, check_sglang_python, claim_lab_dir,
                                        ensure_model, ensure_venv, inject_path, sharegpt_file)
from reports.base.errors import CliError
from reports.base.server_flags import RECIPE_ARGS
from reports.lab.summary import read_case

PROFILE_S = 2.5


@dataclass(frozen=True)
class LabConfig:
    out: Path
    lab_dir: Path
    plan: tuple[Group, ...]
    sglang_python: Path | None = None     # an existing SGLang installation (GPU machine)
    model: Path | None = None             # with sglang_python: a real model folder
    device: str = "cpu"
    only: tuple[str, ...] = ()
    analyse: bool = True


def say(msg: str) -> None:
    print(f"sglang-lab: {msg}", file=sys.stderr, flush=True)


class _Hog:
    """An external CPU hog: one process spinning on one core (another tenant on the host), the
    core the lab pinned the case's rank to (server.py, `rank_cores`)."""

    def __init__(self, core: int | None):
        self.core, self.proc = core, None

    def __enter__(self):
        if self.core is not None:
            code = ("import os\ntry:\n os.sched_setaffinity(0, {%d})\nexcept OSError:\n pass\n"
                    "while True:\n pass\n" % self.core)
            self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        return False


def _choices_line(server: LabServer) -> str:
    c = server.choices
    if c is None or not c.rank_cores:
        return "SGLang's own thread binding and radix core (a GPU run)"
    return (f"ranks pinned to cores {', '.join(map(str, c.rank_cores))}; SGLang's "
            f"{c.tree_core} radix core ({c.tree_core_why})"
            + ("; no GPU visible (a CUDA torch on a CPU run)" if c.gpu_hidden else ""))


def _header(server: LabServer) -> str:
    """The server log up to "fired up": its arguments and start-up lines, which every case's
    log slice carries so that each case reads as a whole server log."""
    text = server.log_text()
    i = text.find("The server is fired up")
    return text[: text.find("\n", i) + 1] if i >= 0 else ""


# Every bench_serving run of a case starts from an empty prefix cache (bench_serving's
# --flush-cache, after its warm-up request): the cases of a group share one server, and without
# it each run found the cache its predecessors left. On the lab's 16-core rounds without it
# (docs/BENCHMARKS.md section 21) the same clean load fell 15-26% from a group's first runs to
# its control case, a drift every fault of the group was measured against.
FLUSH_CACHE = True


def run_case(case: Case, server: LabServer, bench: drive.BenchSpec, fault_file: Path,
             default_mmb: int | None, out: Path, header: str) -> Path:
    # a server without ppscope's recipe (cases.recipe_plan's baseline) has no /metrics and logs
    # one decode line in 40: nothing here reads either from it, and a case that would is refused
    # before it starts (its profiled window waits on decode lines and /metrics, the live probe
    # scrapes /metrics)
    recipe = server.spec.recipe
    if not recipe and (case.profile or case.stacks or case.live):
        raise LabError(f"{case.name}: a profiled window or the live probe on a server started "
                       f"without ppscope's recipe ({' '.join(RECIPE_ARGS)})")
    tmp = out / ".partial" / case.name
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    blog = tmp / "bench.out"
    t0 = time.time()
    fault_file.write_text(case.fault + "\n")
    time.sleep(0.2)                         # the fault module re-reads it within 50 ms
    mmb = case.mmb or default_mmb
    if mmb:
        drive.set_mmb(server.url, mmb)
    start = server.log_size()
    # /metrics holds counters since the server started: a scrape at the case's start and one at
    # its end give the case's own window (`ppscope sglang --metrics A --metrics B`)
    if recipe:
        drive.scrape_metrics(server.url, tmp / "metrics-start.txt")
    seed0 = 1000 + zlib.crc32(case.name.encode()) % 100000
    hog_core = hog_core_of(case, server)
    try:
        with _Hog(hog_core):
            for k in range(case.reps):
                say(f"{case.name}: bench_serving C={case.concurrency} run {k + 1}/{case.reps}")
                drive.run_bench(bench, blog, concurrency=case.concurrency,
                                prompts=2 * case.concurrency + 2, seed=seed0 + k,
                                out=tmp / "bench.jsonl", request_rate=case.request_rate,
                                flush_cache=FLUSH_CACHE)
            windows = ([("traces", case.window_stacks)] if case.profile else []) + (
                [("traces-stacks", True)] if case.stacks else [])
            for sub, stacks in windows:
                say(f"{case.name}: profiling a window ({'SGLang defaults: stacks, shapes' if stacks else 'no stacks, no shapes'})")
                since = server.log_size()
                p = drive.start_bench(bench, blog,
                                      concurrency=case.window_concurrency or case.concurrency,
                                      prompts=2 * case.concurrency + 2, seed=seed0 + 50,
                                      out=tmp / f"bench-{sub}.jsonl",
                                      request_rate=case.request_rate, flush_cache=FLUSH_CACHE)
                try:
                    drive.wait_load(server, since, case.window_concurrency or case.concurrency,
                                    lines=2 * server.spec.pp)
                    drive.profile_window(server, tmp / sub, PROFILE_S, stacks)
                finally:
                    # the window is what this run is for: stop the client (SGLang aborts its
                    # requests when they disconnect) and let the server drain
                    if p.poll() is None:
                        p.terminate()
                        try:
                            p.wait(timeout=20)
                        except subprocess.TimeoutExpired:
                            p.kill()
                            p.wait()
                drive.wait_idle(server)
            if recipe:
                drive.scrape_metrics(server.url, tmp / "metrics.txt")
            if case.live:
                say(f"{case.name}: ppscope's live probe C={case.concurrency}")
                r = subprocess.run([sys.executable, "-m", "reports.cli", "sglang", "--url",
                                    server.url, "--live-concurrency", str(case.concurrency),
                                    "--live-arrival", "burst", "--live-tokens", "64",
                                    "--json", str(tmp / "live.json")],
                                   capture_output=True, text=True, timeout=300)
                (tmp / "live.out").write_text(r.stdout + r.stderr)
                if r.returncode != 0:
                    raise LabError(f"{case.name}: the live probe failed: {r.stderr.strip()[-200:]}")
    finally:
        fault_file.write_text("")
    end = server.log_size()
    (tmp / "server.log").write_text(header + server.log_text(start, end))
    drive.write_json(tmp / "case.json", lab_case({
        "case": asdict(case), "pp": server.spec.pp, "device": server.spec.device,
        "extra_args": list(server.spec.extra_args), "pp_max_micro_batch_size": mmb,
        "env": {k: v for k, v in server.spec.env.items() if k.startswith("SGLANG_")},
        "recipe": recipe,     # started with --enable-metrics --decode-log-interval 1
        "server": asdict(server.choices) if server.choices else None, "hog_core": hog_core,
        "started_unix": t0, "seconds": time.time() - t0,
        "input_len": bench.input_len, "output_len": bench.output_len,
        "flush_cache": FLUSH_CACHE}))
    final = out / case.name
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


def lab_case(d: dict) -> dict:
    """case.json's content, checked as its readers read it (reports/base/payloads/lab_case.py)."""
    from reports.base.payloads.lab_case import LabCase
    from reports.base.schema import from_json, to_json
    return to_json(from_json(LabCase, d, "case.json"))


def hog_core_of(case: Case, server: LabServer) -> int | None:
    """The core of the case's CPU hog: the one its rank is pinned to."""
    if case.hog_rank is None:
        return None
    cores = server.choices.rank_cores if server.choices else ()
    if not 0 <= case.hog_rank < len(cores):
        raise LabError(f"{case.name}: the hog's rank {case.hog_rank} has no pinned core on this "
                       f"server (pp={server.spec.pp}, {server.spec.device})")
    return cores[case.hog_rank]


def _default_mmb(server: LabServer) -> int | None:
    """SGLang's own default cap, to restore after a case that set one: what
    `/get_server_info` reports, else max_running_requests // pp."""
    try:
        info = json.loads(drive.http_call(server.url, "GET", "/get_server_info", None, 30.0))
    except (LabError, ValueError):
        return None
    states = info.get("internal_states") or [{}]
    st = states[0] if isinstance(states, list) and states else {}
    v = st.get("pp_max_micro_batch_size") or info.get("pp_max_micro_batch_size")
    if isinstance(v, int) and v > 0:
        return v
    mrr = st.get("max_running_requests") or info.get("max_running_requests")
    return max(1, int(mrr) // server.spec.pp) if isinstance(mrr, int) else None


def analyse_case(case_dir: Path) -> dict:
    """`ppscope sglang` then `ppscope report` on one case's artefacts; their verdict."""
    try:
        c = read_case(case_dir).case
    except CliError as e:
        return {"error": str(e)}
    py = [sys.executable, "-m", "reports.cli"]
    start = case_dir / "metrics-start.txt"
    metrics = ([str(start)] if start.exists() else []) + [str(case_dir / "metrics.txt")]
    args = py + ["sglang", "--log", str(case_dir / "server.log"), "--traces",
                 str(case_dir / "traces"), "--metrics", *metrics,
                 "--bench", str(case_dir / "bench.jsonl"), "--concurrency", str(c.concurrency),
                 "--json", str(case_dir / "sglang.json")]
    if c.layer_partition:     # the layers each rank runs (cases.py), for the split
        args += ["--layer-partition", c.layer_partition]
    out = {}
    report = py + ["report", "--results", str(case_dir)]
    base = case_dir.parent / (c.baseline or "") / "report.json"
    if c.baseline and base.exists():   # what the fault changed: reports/model/compare.py
        report += ["--baseline", str(base)]
    # a case brought back without its traces (a copy of the results): its sglang.json is read
    steps = (("sglang", args), ("report", report))
    if not (case_dir / "traces").is_dir() and (case_dir / "sglang.json").is_file():
        steps = steps[1:]
    for name, cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        (case_dir / f"{name}.out").write_text(r.stdout + r.stderr)
        out[f"{name}_rc"] = r.returncode
        if r.returncode != 0:
            out["error"] = f"ppscope {name}: {(r.stderr.strip().splitlines() or ['?'])[-1]}"
            return out
    return out


def _baseline(case_dir: Path) -> str:
    """The case's baseline case's name ("" for none), from its case.json."""
    return read_case(case_dir).case.baseline or ""


def _ready(case_dir: Path) -> bool:
    """A measured case can be read now: it has traces, and its baseline (if any) its report."""
    if not (case_dir / "traces").is_dir():
        return False
    base = _baseline(case_dir)
    return not base or (case_dir.parent / base / "report.json").exists()


def _analyse(case_dir: Path) -> None:
    say(f"{case_dir.name}: ppscope sglang + ppscope report")
    drive.write_json(case_dir / "analysis.json", analyse_case(case_dir))


def order_for_analysis(dirs: list[Path]) -> list[Path]:
    """Baselines (cases with none) first: the others are read against their report."""
    return sorted(dirs, key=lambda d: bool(_baseline(d)))


def _stop_on_sigterm() -> None:
    """SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so the server and the hog are
    stopped by their PIDs on the way out instead of outliving the lab."""
    import signal

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:      # not the main thread: leave the default
        pass


def run_lab(cfg: LabConfig) -> int:
    from dataclasses import replace
    _stop_on_sigterm()
    cfg = replace(cfg, out=cfg.out.resolve(), lab_dir=cfg.lab_dir.resolve())
    claim_lab_dir(cfg.lab_dir)
    if cfg.sglang_python:      # driven as it is: checked, never written into
        python = cfg.sglang_python
        say(f"using SGLang {check_sglang_python(python)} at {python} (nothing installed into it)")
    else:
        python = ensure_venv(cfg.lab_dir, say)
    cfg.out.mkdir(parents=True, exist_ok=True)
    model = cfg.model or ensure_model(python, cfg.lab_dir)
    dataset = sharegpt_file(cfg.lab_dir)
    fault_file = cfg.lab_dir / "fault"
    fault_file.write_text("")
    done: list[Path] = []       # measured, not read yet
    failed: list[str] = []
    for g in cfg.plan:
        cases = [c for c in g.cases if not cfg.only or c.name in cfg.only]
        if not cases:
            continue
        spec = ServerSpec(python=python, model=model, pp=g.pp, device=cfg.device,
                          extra_args=g.extra_args, env={"PPSCOPE_LAB_FAULT_FILE": str(fault_file),
                                                          "PYTHONPATH": str(inject_path()),
                                                          **dict(g.env)}, recipe=g.recipe)
        logdir = cfg.out / ".partial"
        shown = list(g.extra_args) + [f"{k}={v}" for k, v in g.env] + (
            [] if g.recipe else ["SGLang's defaults (no recipe)"])
        say(f"starting SGLang (pp={g.pp}, {cfg.device}{', ' + ' '.join(shown) if shown else ''})")
        with LabServer(spec, logdir / f"server-{g.name}.log", logdir / f"traces-{g.name}") as server:
            bench = drive.BenchSpec(python=python, url=server.url, model=model, dataset=dataset,
                                    device=cfg.device)
            say(_choices_line(server))
            header = _header(server)
            say("warm-up")
            drive.run_bench(bench, logdir / "warmup.out", concurrency=4, prompts=4, seed=1, out=logdir / "warmup.jsonl")
            mmb0 = _default_mmb(server)
            for case in cases:
                try:
                    done.append(run_case(case, server, bench, fault_file, mmb0, cfg.out, header))
                except LabError as e:     # one case's failure: said, the plan goes on
                    say(f"{case.name}: failed, nothing kept: {e}")
                    failed.append(case.name)
                    continue
                if cfg.analyse and _ready(done[-1]):   # each case read as soon as it can be
                    _analyse(done.pop())
        say(f"server stopped (group {g.name})")
    if cfg.analyse:
        for d in order_for_analysis([d for d in done if (d / "traces").is_dir()]):
            _analyse(d)
    from reports.lab.summary import summarise, render
    rows = summarise(cfg.out)
    drive.write_json(cfg.out / "summary.json", rows)
    print(render(rows))
    if failed:
        say(f"{len(failed)} case(s) failed and were not kept: {', '.join(failed)}")
        return 1
    return 0
