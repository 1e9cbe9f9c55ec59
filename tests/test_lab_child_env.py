"""Every process the lab starts with its Python sees no GPU where that Python's torch is a CUDA
build (microbench/sglang_lab/lab_env.py): bench_serving (run and started in the background), the
model maker, SGLang's import check, the server, the probe of the radix core. With a GPU visible,
bench_serving takes SGLang's CUDA import path and fails at the warm-up
(`ModuleNotFoundError: sgl_kernel.quantization`). A fake interpreter stands for the lab's python:
it answers what `torch.version.cuda` would print and writes down the environment it was run with."""
from __future__ import annotations

import stat
from pathlib import Path

import pytest

from microbench.sglang_lab import drive, lab_env, server, tree_core, venv


def _fake_python(tmp_path: Path, cuda: str = "13.0") -> tuple[Path, Path]:
    """A python whose `-c` query prints `cuda`; any other run appends its GPU environment (and
    its first argument) to a file, and the model maker's run makes the model folder."""
    seen = tmp_path / "seen.txt"
    p = tmp_path / "venv" / "bin" / "python"
    p.parent.mkdir(parents=True)
    p.write_text(f"""#!/bin/sh
if [ "$1" = "-c" ] && [ "${{2#import torch}}" != "$2" ]; then echo {cuda}; exit 0; fi
echo "$1 $2 CUDA_VISIBLE_DEVICES=${{CUDA_VISIBLE_DEVICES-unset}} HF_HUB_OFFLINE=${{HF_HUB_OFFLINE-unset}} PYTHONPATH=${{PYTHONPATH-unset}}" >> {seen}
case "$1" in *_make_model.py) mkdir -p "$2";; esac
exit 0
""")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return p, seen


@pytest.fixture(autouse=True)
def _gpu_visible(monkeypatch):
    lab_env.torch_cuda_version.cache_clear()
    tree_core.probe_tree_core.cache_clear()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("PYTHONPATH", "/somewhere/ppscope")
    yield
    lab_env.torch_cuda_version.cache_clear()
    tree_core.probe_tree_core.cache_clear()


def _bench(py: Path, tmp_path: Path, device: str = "cpu") -> drive.BenchSpec:
    model = tmp_path / "model-llama-4l"
    model.mkdir(exist_ok=True)
    spec = drive.BenchSpec(python=py, url="http://127.0.0.1:1", model=model,
                           dataset=tmp_path / "d.json")
    if device != "cpu":
        from dataclasses import replace
        spec = replace(spec, device=device)
    return spec


def test_bench_serving_run_sees_no_gpu(tmp_path):
    py, seen = _fake_python(tmp_path)
    drive.run_bench(_bench(py, tmp_path), tmp_path / "bench.out", concurrency=1, prompts=1,
                    seed=1, out=tmp_path / "b.jsonl")
    line = seen.read_text().splitlines()[-1]
    assert line.startswith("-m sglang.bench_serving")
    assert "CUDA_VISIBLE_DEVICES= " in line and "HF_HUB_OFFLINE=1" in line
    assert "PYTHONPATH=unset" in line


def test_bench_serving_started_in_the_background_sees_no_gpu(tmp_path):
    py, seen = _fake_python(tmp_path)
    p = drive.start_bench(_bench(py, tmp_path), tmp_path / "bench.out", concurrency=1,
                          prompts=1, seed=1, out=tmp_path / "b.jsonl")
    assert p.wait(timeout=30) == 0
    assert "CUDA_VISIBLE_DEVICES= " in seen.read_text()


def test_model_maker_and_import_check_see_no_gpu(tmp_path):
    py, seen = _fake_python(tmp_path)
    lab = tmp_path / "lab"
    lab.mkdir()
    venv.ensure_model(py, lab)
    venv.check_imports(py, lab / "install.log")
    lines = seen.read_text().splitlines()
    assert len(lines) == 2 and "_make_model.py" in lines[0] and lines[1].startswith("-c import")
    assert all("CUDA_VISIBLE_DEVICES= " in ln and "PYTHONPATH=unset" in ln for ln in lines)


def test_radix_core_probe_sees_no_gpu(tmp_path):
    py, seen = _fake_python(tmp_path)
    tree_core.probe_tree_core(py)
    (line,) = seen.read_text().splitlines()
    assert "probe_tree_core" in line and "CUDA_VISIBLE_DEVICES= " in line


def test_server_and_its_client_get_the_same_hiding(tmp_path):
    py, _ = _fake_python(tmp_path)
    spec = server.ServerSpec(python=py, model=tmp_path / "model-llama-4l", pp=2)
    env = server.launch_env(spec, tmp_path / "traces")
    client = lab_env.child_env(py, "cpu")
    for k in ("CUDA_VISIBLE_DEVICES", "SGLANG_NCCL_SO_PATH", "HF_HUB_OFFLINE"):
        assert env[k] == client[k], k
    assert client["CUDA_VISIBLE_DEVICES"] == ""


def test_cpu_torch_leaves_the_gpu_setting_alone(tmp_path):
    py, seen = _fake_python(tmp_path, cuda="None")
    drive.run_bench(_bench(py, tmp_path), tmp_path / "bench.out", concurrency=1, prompts=1,
                    seed=1, out=tmp_path / "b.jsonl")
    assert "CUDA_VISIBLE_DEVICES=0,1 " in seen.read_text()


def test_gpu_run_client_keeps_the_gpu(tmp_path):
    py, seen = _fake_python(tmp_path)
    drive.run_bench(_bench(py, tmp_path, device="cuda"), tmp_path / "bench.out", concurrency=1,
                    prompts=1, seed=1, out=tmp_path / "b.jsonl")
    assert "CUDA_VISIBLE_DEVICES=0,1 " in seen.read_text()


def test_the_torch_query_is_asked_once_per_interpreter(tmp_path):
    py, _ = _fake_python(tmp_path)
    for _ in range(3):
        lab_env.child_env(py, "cpu")
    assert lab_env.torch_cuda_version.cache_info().misses == 1
