"""Launch a multi-process probe under `torchrun` and never hang on it.

The dispatch probe and the topology hop both run one process per GPU under
`python -m torch.distributed.run` (never a home-made launcher). This module builds that command
and runs it in its own process group, so a timeout or Ctrl-C ends every rank: a hung NCCL call
can cost the user the timeout, never their terminal.
`start_rank` is the one rank start-up (device, NCCL and gloo with a timeout) both probes' ranks
run. It also holds the one copy of SGLang's pickled-object message (`send_pyobj` / `recv_pyobj`),
which both probes' ranks send over their gloo group.
"""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Sequence

REPO_ROOT = Path(__file__).resolve().parents[2]


def torchrun_command(nproc: int, module: str, module_args: Sequence[str],
                     torchrun_args: Sequence[str] = ("--standalone",)) -> list[str]:
    """`python -m torch.distributed.run [torchrun_args] --nproc-per-node N -m module args`."""
    return [sys.executable, "-m", "torch.distributed.run", *torchrun_args,
            "--nproc-per-node", str(nproc), "-m", module, *module_args]


def repo_env(**extra: str) -> dict[str, str]:
    """This environment with the repository first on PYTHONPATH (ranks import our modules)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def _stop(proc: subprocess.Popen, sig: int, grace_s: float) -> None:
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def run_group(cmd: Sequence[str], env: dict[str, str], timeout_s: float,
              stdout: IO | None = None, grace_s: float = 20.0) -> tuple[int | None, bool]:
    """Run `cmd` in its own session. Returns (returncode, timed_out); on a timeout the whole
    group gets SIGTERM, then SIGKILL after `grace_s`, and returncode is None. On Ctrl-C the
    group gets SIGINT (ranks keep what they wrote), then SIGKILL, and KeyboardInterrupt is
    re-raised for the caller to save its partial record."""
    proc = subprocess.Popen(list(cmd), env=env, stdout=stdout,
                            stderr=subprocess.STDOUT if stdout is not None else None,
                            start_new_session=True)
    try:
        return proc.wait(timeout=timeout_s), False
    except subprocess.TimeoutExpired:
        _stop(proc, signal.SIGTERM, grace_s)
        return None, True
    except BaseException:
        _stop(proc, signal.SIGINT, grace_s)
        raise


def send_pyobj(dist, obj, dst: int, group) -> None:
    """SGLang's point_to_point_pyobj: the pickled size as a long tensor, then the bytes, over
    `group` (gloo). Ranks call it; torch is imported here so CLI imports stay torch-free."""
    import torch

    data = pickle.dumps(obj)
    dist.send(torch.tensor([len(data)], dtype=torch.long), dst=dst, group=group)
    dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), dst=dst, group=group)


def recv_pyobj(dist, src: int, group):
    """The receiving side of `send_pyobj`."""
    import torch

    size = torch.empty(1, dtype=torch.long)
    dist.recv(size, src=src, group=group)
    buf = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.recv(buf, src=src, group=group)
    return pickle.loads(buf.numpy().tobytes())


@dataclass(frozen=True)
class RankContext:
    """One torchrun rank after `start_rank`: its place in the world, its GPU, its gloo group."""
    rank: int
    world: int
    local_rank: int
    device: Any          # torch.device("cuda", local_rank), or torch.device("cpu")
    gloo: Any            # a gloo group over every rank, for pickled objects and barriers


def start_rank(timeout_s: float, expect_world: int | None = None,
               device: str = "cuda") -> RankContext:
    """Start this torchrun rank: read RANK / WORLD_SIZE / LOCAL_RANK, bind the rank to its GPU,
    init NCCL with `timeout_s` on every collective (a hung peer then errors instead of hanging)
    and open a gloo group with the same timeout. With `expect_world`, a different WORLD_SIZE is a
    RuntimeError before any process group is made. `device="cpu"`: no GPU, the default group is
    gloo as well (SGLang's `--device cpu`). The caller destroys the process group."""
    import datetime

    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if expect_world is not None and world != expect_world:
        raise RuntimeError(f"world size {world} != configured pp {expect_world}")
    timeout = datetime.timedelta(seconds=timeout_s)
    if device == "cpu":
        dist.init_process_group("gloo", timeout=timeout)
        gloo = dist.new_group(backend="gloo", timeout=timeout)
        return RankContext(rank=rank, world=world, local_rank=local,
                           device=torch.device("cpu"), gloo=gloo)
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    try:
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    except TypeError:  # torch without device_id
        dist.init_process_group("nccl", timeout=timeout)
    gloo = dist.new_group(backend="gloo", timeout=timeout)
    return RankContext(rank=rank, world=world, local_rank=local, device=device, gloo=gloo)
