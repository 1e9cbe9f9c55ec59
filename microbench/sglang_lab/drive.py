"""What the lab does to a running server, per case: bench_serving, a profiled window, /metrics.

bench_serving is SGLang's own client (`python -m sglang.bench_serving` from the lab venv): the
random dataset over a local ShareGPT-format file, fixed lengths (`--random-range-ratio 1`), one
JSON line per run in the case's `bench.jsonl`. Repetitions use distinct `--seed`s: the same seed
replays the same prompts, which then hit the radix cache.

The profiled window: a bench run in the background; once the server log shows it decoding, the
window opens with `POST /start_profile {"with_stack": false, "record_shapes": false,
"activities": ["CPU", "GPU"], "output_dir": ...}` (SGLang's defaults are `with_stack` and
`record_shapes` on, whose Python tracer inflates host times; the `stacks` window keeps them, to
show how much) and closes with `/stop_profile`. Every HTTP call has a deadline and a size cap
(`microbench/sglang/http.py`).
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from microbench.sglang.http import request as http_request
from microbench.sglang_lab.lab_env import child_env
from microbench.sglang_lab.venv import LabError
from reports.base.server_flags import RECIPE_ARGS

INPUT_LEN = 64
OUTPUT_LEN = 128


@dataclass(frozen=True)
class BenchSpec:
    python: Path
    url: str
    model: Path
    dataset: Path
    input_len: int = INPUT_LEN
    output_len: int = OUTPUT_LEN
    device: str = "cpu"          # the server's: a CPU run's client sees no GPU (lab_env.py)


def bench_cmd(b: BenchSpec, *, concurrency: int, prompts: int, seed: int, out: Path,
              request_rate: float | None = None, flush_cache: bool = False) -> list[str]:
    """bench_serving's command line. `flush_cache`: `--flush-cache`, SGLang's prefix cache emptied
    after the warm-up request (the warm-up prompt is the run's first prompt, SGLang 0.5.23
    benchmark/serving.py; without a flush its prefill is a cache hit)."""
    host, port = b.url.split("//", 1)[1].split(":")
    cmd = [str(b.python), "-m", "sglang.bench_serving", "--backend", "sglang", "--host", host,
           "--port", port, "--dataset-name", "random", "--dataset-path", str(b.dataset),
           "--tokenizer", b.model.name, "--random-input-len", str(b.input_len),
           "--random-output-len", str(b.output_len), "--random-range-ratio", "1",
           "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
           "--output-file", str(out), "--seed", str(seed), "--disable-tqdm"]
    if request_rate:
        cmd += ["--request-rate", str(request_rate)]
    if flush_cache:
        cmd += ["--flush-cache"]
    return cmd


def run_bench(b: BenchSpec, log: Path, timeout_s: float = 600.0, **kw) -> None:
    with open(log, "ab") as f:
        try:
            rc = subprocess.run(bench_cmd(b, **kw), stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=child_env(b.python, b.device),
                                cwd=b.model.parent, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            raise LabError(f"bench_serving did not finish within {timeout_s:.0f} s (log: {log})") from None
    if rc != 0:
        raise LabError(f"bench_serving failed (exit {rc}; log: {log})")


def start_bench(b: BenchSpec, log: Path, **kw) -> subprocess.Popen:
    f = open(log, "ab")
    try:
        return subprocess.Popen(bench_cmd(b, **kw), stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=child_env(b.python, b.device),
                                cwd=b.model.parent)
    finally:
        f.close()


def http_call(url: str, method: str, path: str, body: dict | None, timeout_s: float) -> bytes:
    """The reply's bytes of a 200 answer (deadline and size cap: microbench/sglang/http.py);
    anything else is a LabError."""
    from reports.base.errors import CliError
    try:
        status, reply = http_request(url, method, path, body, timeout=timeout_s)
    except CliError as e:
        raise LabError(f"{method} {path}: {e}") from None
    if status != 200:
        raise LabError(f"{method} {path}: HTTP {status}: {reply[:200]!r}")
    return reply


def post(url: str, path: str, body: dict | None = None, timeout_s: float = 120.0):
    reply = http_call(url, "POST", path, body, timeout_s)
    try:
        return json.loads(reply)
    except ValueError:
        return reply.decode("utf-8", "replace")


def set_mmb(url: str, n: int) -> None:
    reply = post(url, "/set_internal_state", {"server_args": {"pp_max_micro_batch_size": n}})
    def one(r):   # SGLang answers per scheduler: `true`, or {"updated": true, ...}
        return r is True or (isinstance(r, dict) and r.get("updated") is True)
    ok = all(one(r) for r in reply) if isinstance(reply, list) and reply else one(reply)
    if not ok:
        raise LabError(f"SGLang refused pp_max_micro_batch_size={n}: {str(reply)[:200]}")


def scrape_metrics(url: str, dest: Path) -> None:
    dest.write_bytes(http_call(url, "GET", "/metrics", None, 30.0))


def recipe_only(server, what: str) -> None:
    """A LabError when `server` runs without ppscope's recipe (server.py `ServerSpec.recipe`)."""
    if not server.spec.recipe:
        raise LabError(f"{what} needs a server started with ppscope's recipe "
                       f"({' '.join(RECIPE_ARGS)})")


NEW_SEQ_RE = re.compile(r"\bPP0\] Prefill batch.*?#new-seq: (\d+)")


def wait_load(server, since: int, concurrency: int, lines: int, timeout_s: float = 120.0) -> None:
    """Until the load has reached C: rank 0's log shows C + 1 requests admitted after byte
    `since` (`Prefill batch, #new-seq`; bench_serving sends one warm-up request first), then
    `lines` more decode lines. A window opened earlier holds the warm-up's and the ramp's
    micro-batches, not the load the benchmark measures. Refused on a server without
    ppscope's recipe: its decode lines come one in 40 steps (`recipe_only`)."""
    recipe_only(server, "waiting for the load by its decode lines")
    deadline = time.monotonic() + timeout_s
    mark = None
    while time.monotonic() < deadline:
        text = server.log_text(since)
        if mark is None and sum(int(n) for n in NEW_SEQ_RE.findall(text)) >= concurrency + 1:
            mark = text.count("Decode batch")
        if mark is not None and text.count("Decode batch") >= mark + lines:
            return
        time.sleep(0.2)
    raise LabError(f"the load did not reach C={concurrency} within {timeout_s:.0f} s")


def wait_idle(server, timeout_s: float = 60.0) -> None:
    """Until no request runs on any rank (`sglang:num_running_reqs` 0 in /metrics, read by
    microbench/sglang/metrics.py). Refused on a server without ppscope's recipe: it has no
    /metrics, and the wait would end at once on its 404, not when the server is idle."""
    recipe_only(server, "waiting for the server to be idle by /metrics")
    from microbench.sglang.metrics import parse_metrics
    from reports.base.errors import CliError
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ranks = parse_metrics(http_call(server.url, "GET", "/metrics", None, 10.0)
                                  .decode("utf-8", "replace"))["ranks"]
        except (LabError, CliError):
            return
        running = [r.get("num_running_reqs") for r in ranks.values()]
        if running and all(v == 0 for v in running):
            return
        time.sleep(0.5)
    raise LabError(f"requests still running {timeout_s:.0f} s after the client stopped")


def profile_window(server, out_dir: Path, seconds: float, stacks: bool) -> list[Path]:
    """/start_profile, wait, /stop_profile; returns the trace files written into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    body = {"output_dir": str(out_dir.resolve()), "activities": ["CPU", "GPU"]}
    if not stacks:
        body.update(with_stack=False, record_shapes=False)
    post(server.url, "/start_profile", body, timeout_s=60.0)
    time.sleep(seconds)
    post(server.url, "/stop_profile", None, timeout_s=300.0)
    deadline = time.monotonic() + 120.0
    want = server.spec.pp
    while time.monotonic() < deadline:
        files = sorted(out_dir.glob("*.trace.json*"))
        if len(files) >= want and all(_complete(f) for f in files):
            return files
        time.sleep(0.5)
    raise LabError(f"the server wrote {len(list(out_dir.glob('*.trace.json*')))} of {want} "
                   f"traces into {out_dir} within 120 s")


def _complete(p: Path) -> bool:
    """A gzip trace is complete when its size has stopped changing for a moment."""
    try:
        a = p.stat().st_size
        time.sleep(0.2)
        return a > 0 and p.stat().st_size == a
    except FileNotFoundError:
        return False


def write_json(p: Path, obj) -> None:
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    tmp.replace(p)
