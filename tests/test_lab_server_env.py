"""The lab's CPU server environment where the lab venv's torch is a CUDA build: no GPU visible and
SGLang's PyNccl kept off through SGLang's own SGLANG_NCCL_SO_PATH (as with a CPU torch). A fake
interpreter stands for the venv's python: it answers what `torch.version.cuda` would print."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from microbench.sglang_lab import server


def _fake_python(tmp_path: Path, name: str, body: str) -> Path:
    p = tmp_path / name / "bin" / "python"
    p.parent.mkdir(parents=True)
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return p


@pytest.fixture(autouse=True)
def _fresh_cache():
    server.torch_cuda_version.cache_clear()
    yield
    server.torch_cuda_version.cache_clear()


def _env(python: Path, device: str = "cpu") -> dict[str, str]:
    spec = server.ServerSpec(python=python, model=Path("model-llama-4l"), pp=2, device=device)
    return server.launch_env(spec, Path("traces"))


def test_cuda_torch_on_cpu_server_hides_gpus_and_nccl(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    py = _fake_python(tmp_path, "cuda", "echo 13.0")
    env = _env(py)
    assert server.torch_cuda_version(py) == "13.0"
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["SGLANG_NCCL_SO_PATH"] == server.NO_NCCL
    assert not Path(server.NO_NCCL).exists()           # a library that is not there
    assert env["SGLANG_USE_CPU_ENGINE"] == "1"


@pytest.mark.parametrize("body", ["echo None", "echo 'ModuleNotFoundError: torch' >&2; exit 1",
                                  "echo; echo garbage", "kill -9 $$"])
def test_cpu_torch_or_unreadable_leaves_env_alone(tmp_path, monkeypatch, body):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.delenv("SGLANG_NCCL_SO_PATH", raising=False)
    env = _env(_fake_python(tmp_path, "cpu", body))
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert "SGLANG_NCCL_SO_PATH" not in env


def test_missing_interpreter_reads_as_cpu(tmp_path):
    assert server.torch_cuda_version(tmp_path / "nope" / "python") is None


def test_gpu_server_never_asks_or_hides(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    marker = tmp_path / "asked"
    env = _env(_fake_python(tmp_path, "gpu", f"touch {marker}; echo 13.0"), device="cuda")
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert "SGLANG_NCCL_SO_PATH" not in env and not marker.exists()


def test_spec_env_still_wins(tmp_path):
    py = _fake_python(tmp_path, "cuda", "echo 12.8")
    spec = server.ServerSpec(python=py, model=Path("m"), env={"SGLANG_NCCL_SO_PATH": "/x/libnccl.so.2"})
    assert server.launch_env(spec, Path("t"))["SGLANG_NCCL_SO_PATH"] == "/x/libnccl.so.2"
    assert os.environ.get("SGLANG_NCCL_SO_PATH") != server.NO_NCCL
