"""Start SGLang's own server for the lab, and stop it by its PID.

`sglang.launch_server` on 127.0.0.1 with `--pp-size N --enable-metrics --decode-log-interval 1`.
On a CPU (`device="cpu"`): SGLang's CPU engine (`SGLANG_USE_CPU_ENGINE=1`), gloo between the PP
ranks, `--attention-backend torch_native --disable-cuda-graph`, random weights
(`--load-format dummy`), one OpenMP thread per rank (`OMP_NUM_THREADS=1`: on an AVX2-only host
SGLang ignores its thread binding and each rank would otherwise run torch's default threads; with
one thread per rank repeated runs agree closely). On GPUs: the given installation, CUDA graphs on.

A CPU server whose torch is a CUDA build (pip's default torch on Linux, so a lab venv made on a GPU
host has one) sees no GPU (`CUDA_VISIBLE_DEVICES` empty) and finds no NCCL library: SGLang makes a
PyNccl communicator for every group whose NCCL library loads (`init_model_parallel_group` in
sglang/srt/distributed/parallel_state.py) and, with `--device cpu`, stops there ("Expected a cuda
device, but got: cpu", device_communicators/pynccl.py). With a CPU torch SGLang finds no library
and goes on without PyNccl; SGLang's own `SGLANG_NCCL_SO_PATH`, naming a library that is not there,
makes it do the same (it logs one "Failed to load NCCL library" line per group and rank).

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
from functools import lru_cache
from pathlib import Path

from microbench.sglang_lab.venv import LabError

READY = "The server is fired up and ready to roll"
NO_NCCL = "ppscope-lab-cpu-server-has-no-nccl"    # SGLANG_NCCL_SO_PATH on a CPU server: no such library


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

    @property
    def cwd(self) -> Path:
        """The server runs in its model's parent folder and is given the model by its bare
        name, so its log and bench_serving's server_info name no path of this machine."""
        return self.model.parent


def launch_args(spec: ServerSpec, port: int) -> list[str]:
    args = [str(spec.python), "-m", "sglang.launch_server", "--model-path", spec.model.name,
            "--pp-size", str(spec.pp), "--tp-size", "1", "--host", "127.0.0.1", "--port", str(port),
            "--enable-metrics", "--decode-log-interval", "1"]
    if spec.device == "cpu":
        args += ["--load-format", "dummy", "--device", "cpu", "--disable-cuda-graph",
                 "--attention-backend", "torch_native", "--max-total-tokens",
                 str(spec.max_total_tokens)]
    return args + list(spec.extra_args)


def _own_env() -> dict[str, str]:
    """This environment without ppscope's Python settings: the lab's interpreter runs as itself."""
    env = dict(os.environ)
    for k in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
        env.pop(k, None)
    return env


def launch_env(spec: ServerSpec, trace_dir: Path) -> dict[str, str]:
    env = _own_env()
    env.update(HF_HUB_OFFLINE="1", SGLANG_TORCH_PROFILER_DIR=str(trace_dir))
    if spec.device == "cpu":
        cores = os.cpu_count() or 1
        env.update(SGLANG_USE_CPU_ENGINE="1", OMP_NUM_THREADS="1",
                   SGLANG_CPU_OMP_THREADS_BIND="|".join(str(r % cores) for r in range(spec.pp)))
        if torch_cuda_version(spec.python):     # see the module's docstring
            env.update(CUDA_VISIBLE_DEVICES="", SGLANG_NCCL_SO_PATH=NO_NCCL)
    env.update(spec.env)
    return env


@lru_cache(maxsize=8)
def torch_cuda_version(python: Path) -> str | None:
    """The CUDA version the torch of `python` was built for (torch.version.cuda), None for a CPU
    build or where it cannot be read (then the server starts as on a CPU torch)."""
    try:
        out = subprocess.run([str(python), "-c", "import torch; print(torch.version.cuda)"],
                             capture_output=True, text=True, timeout=300, env=_own_env(),
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    last = (out.stdout.strip().splitlines() or [""])[-1]
    return last if out.returncode == 0 and last[:1].isdigit() else None


class LabServer:
    """One running SGLang server; a context manager that always stops it."""

    def __init__(self, spec: ServerSpec, log_path: Path, trace_dir: Path):
        self.spec, self.log_path, self.trace_dir = spec, log_path, trace_dir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 420.0) -> None:
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(launch_args(self.spec, self.port), stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=launch_env(self.spec, self.trace_dir),
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
