"""SGLang's radix-tree core for the lab's CPU server (microbench/sglang_lab/tree_core.py): its
Python core where the Rust core fails the probe with the installed torch (SGLang 0.5.23's Rust
core panics at the first insert under torch 2.11: `Rust TreeCore panicked: ... UnknownKind(20)`),
said in the server's choices that every case records. Fake interpreters stand for the lab's
python; the probe script itself runs against a fake SGLang binding in this process."""
from __future__ import annotations

import importlib.util
import stat
import sys
import types
from pathlib import Path

import pytest

from microbench.sglang_lab import lab_env, server, tree_core
from microbench.sglang_lab.tree_core import TREE_CORE_ENV

PANIC = "rust fails: PanicException: Rust TreeCore panicked: called `Result::unwrap()` on an `Err` value: UnknownKind(20)"


def _fake_python(tmp_path: Path, probe_answer: str, name: str = "venv") -> Path:
    p = tmp_path / name / "bin" / "python"
    p.parent.mkdir(parents=True)
    p.write_text(f"""#!/bin/sh
if [ "$1" = "-c" ]; then echo None; exit 0; fi
{probe_answer}
""")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return p


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(TREE_CORE_ENV, raising=False)
    lab_env.torch_cuda_version.cache_clear()
    tree_core.probe_tree_core.cache_clear()
    yield
    tree_core.probe_tree_core.cache_clear()
    lab_env.torch_cuda_version.cache_clear()


def _spec(py: Path, **kw) -> server.ServerSpec:
    return server.ServerSpec(python=py, model=Path("model-llama-4l"), pp=2, **kw)


def test_rust_core_that_panics_picks_the_python_core(tmp_path):
    py = _fake_python(tmp_path, f"echo '{PANIC}'")
    spec = _spec(py)
    choices = server.server_choices(spec)
    assert choices.tree_core == "python" and "UnknownKind(20)" in choices.tree_core_why
    assert server.launch_env(spec, Path("t"), choices)[TREE_CORE_ENV] == "python"


def test_probe_killed_by_a_panic_picks_the_python_core(tmp_path):
    py = _fake_python(tmp_path, "echo 'thread panicked' >&2; kill -6 $$")
    core = tree_core.probe_tree_core(py)
    assert core.backend == "python" and "signal 6" in core.why and "thread panicked" in core.why


@pytest.mark.parametrize("answer", ["exit 3", "echo garbage", "sleep 0"])
def test_any_other_answer_picks_the_python_core(tmp_path, answer):
    core = tree_core.probe_tree_core(_fake_python(tmp_path, answer))
    assert core.backend == "python" and core.why


def test_rust_core_that_runs_is_left_to_sglang(tmp_path):
    py = _fake_python(tmp_path, "echo 'rust ok'")
    spec = _spec(py)
    choices = server.server_choices(spec)
    assert choices.tree_core == "rust" and "probe" in choices.tree_core_why
    assert TREE_CORE_ENV not in server.launch_env(spec, Path("t"), choices)


def test_a_value_you_set_is_kept_and_never_probed(tmp_path, monkeypatch):
    marker = tmp_path / "probed"
    py = _fake_python(tmp_path, f"touch {marker}; echo 'rust ok'")
    monkeypatch.setenv(TREE_CORE_ENV, "rust")
    choices = server.server_choices(_spec(py))
    assert choices.tree_core == "rust" and "set by you" in choices.tree_core_why
    group = _spec(py, env={TREE_CORE_ENV: "python"})
    monkeypatch.delenv(TREE_CORE_ENV)
    c2 = server.server_choices(group)
    assert c2.tree_core == "python" and "set by you" in c2.tree_core_why
    assert server.launch_env(group, Path("t"), c2)[TREE_CORE_ENV] == "python"
    assert not marker.exists()


def test_gpu_run_is_left_to_sglang(tmp_path):
    marker = tmp_path / "probed"
    py = _fake_python(tmp_path, f"touch {marker}; echo '{PANIC}'")
    choices = server.server_choices(_spec(py, device="cuda"))
    assert choices.tree_core is None and choices.rank_cores == ()
    assert not marker.exists()


def test_missing_interpreter_picks_the_python_core(tmp_path):
    core = tree_core.probe_tree_core(tmp_path / "nope" / "python")
    assert core.backend == "python" and "did not start" in core.why


# the probe script against a fake binding: what it does with SGLang's answers


class _Tensor:
    def __init__(self, values):
        self.values = list(values)

    def flatten(self):
        return self

    def tolist(self):
        return list(self.values)


class PanicException(BaseException):        # pyo3's panic type derives from BaseException
    pass


def _fake_sglang(monkeypatch, insert=None, read_back=(40, 41, 42, 43), matched=4):
    class Core:
        def __init__(self, params, components):
            self.pending = False

        def begin_insert(self, params):
            if insert:
                insert(params)
            self.values = params.value.values

        def has_ongoing_insert(self):
            return False

        def end_insert(self):
            return []

        def match_prefix(self, params):
            return types.SimpleNamespace(device_prefix_len=matched, last_device_node_id=7)

        def root_node_handle(self, extra_key):
            return 0

        def collect_full_device_indices(self, a, b):
            return _Tensor(read_back)

    def params(**kw):
        return types.SimpleNamespace(**kw)
    bindings = types.SimpleNamespace(RustUnifiedTreeCoreBinding=Core,
                                     TreeCoreInitParamsBinding=params,
                                     InsertParamsBinding=params, MatchParamsBinding=params)
    mods = {
        "torch": types.SimpleNamespace(tensor=lambda v, dtype=None: _Tensor(v), int64="int64"),
        "sglang": types.ModuleType("sglang"), "sglang.srt": types.ModuleType("sglang.srt"),
        "sglang.srt.mem_cache": types.ModuleType("m"),
        "sglang.srt.mem_cache.rust_tree_core": types.ModuleType("r"),
        "sglang.srt.mem_cache.rust_tree_core.extension": types.SimpleNamespace(bindings=bindings),
        "sglang.srt.mem_cache.unified_cache": types.ModuleType("u"),
        "sglang.srt.mem_cache.unified_cache.component_type":
            types.SimpleNamespace(ComponentType=types.SimpleNamespace(FULL=0)),
    }
    for k, v in mods.items():
        monkeypatch.setitem(sys.modules, k, v)


def _probe_module():
    spec = importlib.util.spec_from_file_location("ppscope_probe_t", tree_core.PROBE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _last_line(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_probe_script_says_ok_when_the_values_come_back(monkeypatch, capsys):
    _fake_sglang(monkeypatch)
    assert _probe_module().main() == 0
    assert _last_line(capsys) == "rust ok"


def test_probe_script_catches_a_panic(monkeypatch, capsys):
    def panic(params):
        raise PanicException("Rust TreeCore panicked: UnknownKind(20)")
    _fake_sglang(monkeypatch, insert=panic)
    _probe_module().main()
    line = _last_line(capsys)
    assert line.startswith("rust fails: PanicException:") and "UnknownKind(20)" in line


@pytest.mark.parametrize("kw", [{"read_back": (1, 2, 3, 4)}, {"matched": 2}])
def test_probe_script_fails_on_wrong_answers(monkeypatch, capsys, kw):
    _fake_sglang(monkeypatch, **kw)
    _probe_module().main()
    assert _last_line(capsys).startswith("rust fails: ")


def test_probe_script_without_sglang_fails_in_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sglang", None)
    _probe_module().main()
    assert _last_line(capsys).startswith("rust fails: ")
