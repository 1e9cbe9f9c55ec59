"""Each rank of a lab CPU server on a core of its own (server.py `rank_cores`, boot/inject/
ppscope_lab_pin.py), the cores recorded, and the CPU-hog case on its rank's core. SGLang's own
binding is off with the lab's `sgl_kernel` stand-in, so on a many-core host the OS moved the ranks
and a hog on one core slowed nothing (458 tok/s against a clean 407). A stand-in scheduler module
takes SGLang's place: the boot hook runs in a real Python process started as the lab starts its
server (the inject folder first on its PYTHONPATH)."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from microbench.sglang_lab import lab, lab_env, server, tree_core
from microbench.sglang_lab.cases import Case, default_plan
from microbench.sglang_lab.venv import LabError, inject_path


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    lab_env.torch_cuda_version.cache_clear()
    tree_core.probe_tree_core.cache_clear()
    monkeypatch.setenv(tree_core.TREE_CORE_ENV, "python")      # no probe: not what is tested
    yield
    lab_env.torch_cuda_version.cache_clear()
    tree_core.probe_tree_core.cache_clear()


def _fake_python(tmp_path: Path) -> Path:
    p = tmp_path / "venv" / "bin" / "python"
    p.parent.mkdir(parents=True)
    p.write_text("#!/bin/sh\necho None\n")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return p


def test_each_rank_gets_a_core_of_its_own(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {6, 2, 9, 4})
    assert server.rank_cores(2) == (2, 4)
    assert server.rank_cores(4) == (2, 4, 6, 9)
    assert server.rank_cores(6) == (2, 4, 6, 9, 2, 4)     # fewer cores than ranks: shared


def test_cpu_server_env_names_each_ranks_core(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 5, 8})
    spec = server.ServerSpec(python=_fake_python(tmp_path), model=Path("m"), pp=2)
    choices = server.server_choices(spec)
    env = server.launch_env(spec, Path("t"), choices)
    assert choices.rank_cores == (3, 5)
    assert env[server.RANK_CORES_ENV] == "3,5"
    assert env["SGLANG_CPU_OMP_THREADS_BIND"] == "3|5"


def test_gpu_server_pins_nothing(tmp_path):
    spec = server.ServerSpec(python=_fake_python(tmp_path), model=Path("m"), pp=2, device="cuda")
    assert server.RANK_CORES_ENV not in server.launch_env(spec, Path("t"))


def _server_with(cores: tuple[int, ...], pp: int = 2):
    choices = server.ServerChoices(False, "python", "x", cores)
    return SimpleNamespace(choices=choices, spec=SimpleNamespace(pp=pp, device="cpu"))


def test_the_hog_is_on_its_ranks_pinned_core():
    case = Case("cpu-hog", 8, hog_rank=1)
    assert lab.hog_core_of(case, _server_with((4, 7))) == 7
    assert lab.hog_core_of(Case("clean-c8", 8), _server_with((4, 7))) is None
    with pytest.raises(LabError, match="no pinned core"):
        lab.hog_core_of(Case("cpu-hog", 8, hog_rank=2), _server_with((4, 7)))


def test_the_plans_hog_targets_the_last_rank():
    for pp in (2, 4):
        (g,) = default_plan(pp)
        (hog,) = [c for c in g.cases if c.name == "cpu-hog"]
        assert hog.hog_rank == pp - 1


# the boot hook in a real process, SGLang's scheduler module stood in for


SCHEDULER = '''
import os
class _Parallel:
    pp_rank = int(os.environ["FAKE_PP_RANK"])
def get_parallel():
    return _Parallel()
class Scheduler:
    def __init__(self, server_args, port_args):
        self.seen = sorted(os.sched_getaffinity(0))
        self.pp_group = type("G", (), {"rank_in_group": _Parallel.pp_rank})()
'''


def _run_scheduler(tmp_path: Path, cores: str, rank: int, get_parallel: bool = True):
    pkg = tmp_path / "fake" / "sglang" / "srt" / "managers"
    pkg.mkdir(parents=True, exist_ok=True)
    for d in (pkg, pkg.parent, pkg.parent.parent):
        (d / "__init__.py").write_text("")
    text = SCHEDULER if get_parallel else SCHEDULER.replace("def get_parallel", "def _gp")
    (pkg / "scheduler.py").write_text(text)
    code = ("from sglang.srt.managers.scheduler import Scheduler\n"
            "import os\ns = Scheduler(None, None)\n"
            "print('init saw', s.seen, 'now', sorted(os.sched_getaffinity(0)))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PPSCOPE_")}
    env.update(PYTHONPATH=f"{inject_path()}{os.pathsep}{tmp_path / 'fake'}",
               PPSCOPE_LAB_RANK_CORES=cores, FAKE_PP_RANK=str(rank))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=60)


needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"),
                                    reason="no sched_setaffinity on this platform")


@needs_affinity
def test_the_scheduler_process_pins_itself_before_its_init(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    cores = f"{allowed[0]},{allowed[-1]}"
    r = _run_scheduler(tmp_path, cores, rank=1)
    assert r.returncode == 0, r.stderr
    want = allowed[-1]
    assert f"init saw [{want}] now [{want}]" in r.stdout
    assert f"ppscope lab: rank 1 pinned to core {want}" in r.stderr


@needs_affinity
def test_without_sglangs_rank_it_pins_after_init_by_the_pp_group(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    r = _run_scheduler(tmp_path, f"{allowed[-1]},{allowed[0]}", rank=0, get_parallel=False)
    assert r.returncode == 0, r.stderr
    assert f"now [{allowed[-1]}]" in r.stdout
    assert f"rank 0 pinned to core {allowed[-1]}" in r.stderr


@needs_affinity
def test_a_core_it_may_not_use_is_said_not_fatal(tmp_path):
    r = _run_scheduler(tmp_path, "0,100000", rank=1)
    assert r.returncode == 0, r.stderr
    assert "rank 1 not pinned to core 100000" in r.stderr


@needs_affinity
def test_a_rank_without_a_core_is_said(tmp_path):
    r = _run_scheduler(tmp_path, "0", rank=3)
    assert r.returncode == 0, r.stderr
    assert "rank 3 not pinned: no core for it" in r.stderr


def test_no_cores_named_no_hook(tmp_path):
    r = _run_scheduler(tmp_path, "", rank=0)
    assert r.returncode == 0, r.stderr
    assert "ppscope lab" not in r.stderr
