"""Start SGLang's own server for the lab, and stop it by its PID.

`sglang.launch_server` on 127.0.0.1 with `--pp-size N` and ppscope's recipe, `--enable-metrics
--decode-log-interval 1` (reports/base/server_flags.py `RECIPE_ARGS`), unless the server is the
recipe's own baseline (`ServerSpec.recipe` False: SGLang's defaults, no /metrics, a decode log
line every 40 steps; cases.py `recipe_plan`).
On a CPU (`device="cpu"`): SGLang's CPU engine (`SGLANG_USE_CPU_ENGINE=1`), gloo between the PP
ranks, `--attention-backend torch_native --disable-cuda-graph`, random weights
(`--load-format dummy`), one OpenMP thread per rank (`OMP_NUM_THREADS=1`: on an AVX2-only host
SGLang ignores its thread binding and each rank would otherwise run torch's default threads; with
one thread per rank repeated runs agree closely). On GPUs: the given installation, CUDA graphs on.

What the lab chooses for a CPU server (`ServerChoices`, recorded in every case's case.json):
- no GPU visible where its torch is a CUDA build (`lab_env.py`, the same for every process the
  lab starts);
- SGLang's radix-tree core: its Python core where its Rust core fails a probe with this torch
  (`tree_core.py`);
- a core of its own for each rank (`rank_cores`): SGLang binds a CPU rank's threads only with its
  own `sgl_kernel` on an AMX or arm64 host (`_init_cpu_threads_env`, distributed/bootstrap.py;
  with the lab's stand-in it logs "init_cpu_threads_env ... disabled" and
  `SGLANG_CPU_OMP_THREADS_BIND` has no effect), so the lab's boot code pins each scheduler
  process to its rank's core (`boot/inject/ppscope_lab_pin.py`, `PPSCOPE_LAB_RANK_CORES`).
  Unpinned, the OS moves the ranks between a many-core host's cores, and a CPU hog on one core
  slows no rank.

Stopping: SIGTERM to the launch process (SGLang drains and exits its children, ~20 s), then
SIGKILL to its process group after a bounded wait, so no process of the lab outlives it.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from microbench.sglang_lab.lab_env import NO_NCCL, child_env, hides_gpu, torch_cuda_version  # noqa: F401
from microbench.sglang_lab.tree_core import TREE_CORE_ENV, choose_tree_core
from microbench.sglang_lab.venv import LabError
from reports.base.server_flags import RECIPE_ARGS

READY = "The server is fired up and ready to roll"
RANK_CORES_ENV = "PPSCOPE_LAB_RANK_CORES"     # "C0,C1,...": the core of each rank (boot/inject/)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerSpec:
    python: Path
    model: Path
    pp: int = 2
    device: str = "cpu"
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    max_total_tokens: int = 16384
    # started with ppscope's recipe (RECIPE_ARGS); False: SGLang's defaults, whose server has no
    # /metrics and logs one decode line in 40, so nothing of the lab may read either from it
    recipe: bool = True

    @property
    def cwd(self) -> Path:
        """The server runs in its model's parent folder and is given the model by its bare
        name, so its log and bench_serving's server_info name no path of this machine."""
        return self.model.parent


def launch_args(spec: ServerSpec, port: int) -> list[str]:
    args = [str(spec.python), "-m", "sglang.launch_server", "--model-path", spec.model.name,
            "--pp-size", str(spec.pp), "--tp-size", "1", "--host", "127.0.0.1", "--port", str(port)]
    if spec.recipe:
        args += RECIPE_ARGS
    if spec.device == "cpu":
        args += ["--load-format", "dummy", "--device", "cpu", "--disable-cuda-graph",
                 "--attention-backend", "torch_native", "--max-total-tokens",
                 str(spec.max_total_tokens)]
    return args + list(spec.extra_args)


@dataclass(frozen=True)
class ServerChoices:
    """What the lab chose for one server (see the module's docstring); in every case.json."""
    gpu_hidden: bool              # CUDA_VISIBLE_DEVICES empty for the server and its clients
    tree_core: str | None         # SGLang's radix core: "rust" or "python"; None: SGLang's own
    tree_core_why: str
    rank_cores: tuple[int, ...]   # the core rank r is pinned to; () where none is pinned


def rank_cores(pp: int) -> tuple[int, ...]:
    """A core of its own for each rank, in the order of the cores this process may use; with
    fewer cores than ranks they are shared, round robin."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = list(range(os.cpu_count() or 1))
    return tuple(cores[r % len(cores)] for r in range(pp))


def server_choices(spec: ServerSpec) -> ServerChoices:
    if spec.device != "cpu":
        return ServerChoices(False, None, "a GPU run: SGLang's own choice", ())
    core = choose_tree_core(spec.python, spec.env.get(TREE_CORE_ENV))
    return ServerChoices(hides_gpu(spec.python, spec.device), core.backend, core.why,
                         rank_cores(spec.pp))


def launch_env(spec: ServerSpec, trace_dir: Path,
               choices: ServerChoices | None = None) -> dict[str, str]:
    choices = choices or server_choices(spec)
    env = child_env(spec.python, spec.device)
    env["SGLANG_TORCH_PROFILER_DIR"] = str(trace_dir)
    if spec.device == "cpu":
        cores = ",".join(map(str, choices.rank_cores))
        env.update(SGLANG_USE_CPU_ENGINE="1", OMP_NUM_THREADS="1",
                   SGLANG_CPU_OMP_THREADS_BIND=cores.replace(",", "|"),
                   **{RANK_CORES_ENV: cores})
        if choices.tree_core == "python":
            env[TREE_CORE_ENV] = "python"
    env.update(spec.env)
    return env


class LabServer:
    """One running SGLang server; a context manager that always stops it."""

    def __init__(self, spec: ServerSpec, log_path: Path, trace_dir: Path):
        self.spec, self.log_path, self.trace_dir = spec, log_path, trace_dir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.choices: ServerChoices | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 420.0) -> None:
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.choices = self.choices or server_choices(self.spec)
        env = launch_env(self.spec, self.trace_dir, self.choices)
        log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(launch_args(self.spec, self.port), stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env,
                                         start_new_session=True, cwd=str(self.spec.cwd))
        except OSError as e:
            log.close()
            raise LabError(f"cannot start SGLang with {self.spec.python}: {e.strerror or e}") from None
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LabError(f"SGLang exited with {self.proc.returncode} before it was ready: "
                               f"{self.last_error()} (log: {self.log_path})")
            if READY in self.log_text(tail=64 << 10):
                return
            time.sleep(1.0)
        self.stop()
        raise LabError(f"SGLang was not ready within {timeout_s:.0f} s (log: {self.log_path})")

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def log_text(self, start: int = 0, end: int | None = None, tail: int | None = None) -> str:
        try:
            with open(self.log_path, "rb") as f:
                if tail is not None:
                    f.seek(max(0, self.log_size() - tail))
                else:
                    f.seek(start)
                data = f.read() if end is None else f.read(max(0, end - start))
        except FileNotFoundError:
            return ""
        return data.decode("utf-8", "replace")

    def last_error(self) -> str:
        lines = [ln for ln in self.log_text(tail=16 << 10).splitlines() if ln.strip()]
        for ln in reversed(lines):
            if "Error" in ln or "error" in ln:
                return ln.strip()[:200]
        return lines[-1].strip()[:200] if lines else "no output"

    def stop(self, grace_s: float = 60.0) -> None:
        p = self.proc
        if p is None:
            return
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGTERM)
                p.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
            except ProcessLookupError:
                pass
        try:   # whatever SGLang left of its process group (schedulers, detokenizer)
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.proc = None

    def __enter__(self):
        try:
            self.start()
        except BaseException:     # Ctrl-C / SIGTERM while it starts: never left running
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()
        return False
