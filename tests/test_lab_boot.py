"""The lab venv's torchvision shim (microbench/sglang_lab/boot/ppscope_lab_boot.py): it declares
torchvision's two operator schemas only where torchvision's own library does not load. Where it
loads (a torchvision built for the venv's torch), declaring them first would make torchvision's
registration abort the process ("Tried to register an operator ... multiple times")."""
import importlib
import importlib.util
from types import SimpleNamespace

import pytest

from microbench.sglang_lab.venv import BOOT


@pytest.fixture
def boot():
    spec = importlib.util.spec_from_file_location("ppscope_lab_boot_t", BOOT / "ppscope_lab_boot.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def fake_torchvision(tmp_path, monkeypatch):
    """A torchvision folder first on the path, its compiled library a placeholder file."""
    pkg = tmp_path / "torchvision"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    return pkg


def _torch(load):
    loaded = []

    def load_library(path):
        loaded.append(path)
        load(path)
    return SimpleNamespace(ops=SimpleNamespace(load_library=load_library)), loaded


def test_own_library_loads_so_nothing_is_declared(boot, fake_torchvision):
    (fake_torchvision / "_C.so").write_bytes(b"")
    torch, loaded = _torch(lambda p: None)
    assert boot._torchvision_loads(torch) is True
    assert loaded == [str(fake_torchvision / "_C.so")]


def test_cuda_linked_library_fails_so_schemas_are_declared(boot, fake_torchvision):
    (fake_torchvision / "_C.so").write_bytes(b"")

    def fail(path):
        raise OSError("libcudart.so.13: cannot open shared object file")
    torch, loaded = _torch(fail)
    assert boot._torchvision_loads(torch) is False
    assert len(loaded) == 1


def test_no_compiled_library(boot, fake_torchvision):
    torch, loaded = _torch(lambda p: None)
    assert boot._torchvision_loads(torch) is False
    assert loaded == []


def test_no_torchvision(boot, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    torch, loaded = _torch(lambda p: None)
    assert boot._torchvision_loads(torch) is False
    assert loaded == []
