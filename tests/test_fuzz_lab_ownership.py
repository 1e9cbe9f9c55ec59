"""The lab owns only what it made (fuzz tier, issue class "destructive steps"): an SGLang you
installed is driven as it is, a folder of yours given as `--lab-dir` is refused, a program that is
not a Python with SGLang is refused, and nothing is written outside the lab's folder and the
results. Each case runs the CLI as a user does, in a temporary folder, and compares every file
of the user's side before and after. No SGLang and no network are needed: the "installation" is
a venv made here with a stand-in `sglang` package whose launcher says what it was given.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_fuzz_bad_inputs import one_line_error as fuzz_one_line_error, run

LAUNCHER = '''\
import json, os, sys
faults = sys.modules.get("ppscope_lab_faults")
json.dump({"pythonpath": os.environ.get("PYTHONPATH", ""),
           "faults_loaded": faults is not None and getattr(faults, "_installed", False),
           "own_sitecustomize_ran": os.environ.get("USER_SITECUSTOMIZE_RAN") == "1"
                                    or "user_sitecustomize_marker" in sys.modules},
          open(os.environ["FAKE_SGLANG_REPORT"], "w"))
sys.exit(3)
'''


def tree(root: Path) -> dict[str, str]:
    """Every file under root (links included) with a hash of its bytes."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            out[rel] = ("link:" + os.readlink(p)) if p.is_symlink() else \
                hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def one_line_error(rc: int, err: str, *words: str) -> str:
    """The fuzz tier's contract, the lab's progress lines (`sglang-lab: ...`) left out."""
    return fuzz_one_line_error(rc, "\n".join(ln for ln in err.splitlines()
                                              if not ln.startswith("sglang-lab: ")), *words)


@pytest.fixture
def user_sglang(tmp_path) -> Path:
    """A user's SGLang installation: a venv with `sglang` (a launcher that reports and exits) and
    its own `sgl_kernel`, which the lab must never replace."""
    venv = tmp_path / "user-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    py = venv / "bin" / "python"
    sp = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip())
    (sp / "sglang").mkdir()
    (sp / "sglang" / "__init__.py").write_text('__version__ = "0.5.23"\n')
    (sp / "sglang" / "launch_server.py").write_text(LAUNCHER)
    (sp / "sgl_kernel").mkdir()
    (sp / "sgl_kernel" / "__init__.py").write_text("USERS_OWN_BUILD = True\n")
    return py


def test_an_installed_sglang_is_driven_as_it_is(user_sglang, tmp_path, capsys, monkeypatch):
    venv = user_sglang.parent.parent
    before = tree(venv)
    report = tmp_path / "launcher.json"
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    monkeypatch.setenv("FAKE_SGLANG_REPORT", str(report))
    rc, _, err = run(["sglang-lab", "--sglang-python", user_sglang, "--model-path", model,
                   "--lab-dir", tmp_path / "lab", "--out", tmp_path / "out",
                   "--cases", "clean-c8"], capsys)
    one_line_error(rc, err, "SGLang exited with 3")
    assert tree(venv) == before, "the lab wrote into the user's SGLang installation"
    seen = __import__("json").loads(report.read_text())
    # the fault module reached the server through PYTHONPATH, not the installation
    assert seen["faults_loaded"], seen
    assert seen["pythonpath"].split(os.pathsep)[0].endswith("inject"), seen


def test_a_program_that_is_not_sglang_is_refused_and_nothing_written(tmp_path, capsys,
                                                                      monkeypatch):
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    true = "/bin/true" if Path("/bin/true").exists() else "/usr/bin/true"
    rc, _, err = run(["sglang-lab", "--sglang-python", true, "--lab-dir", tmp_path / "lab",
                   "--out", tmp_path / "out", "--cases", "clean-c8"], capsys)
    one_line_error(rc, err, "not a Python with SGLang")
    assert list(here.iterdir()) == []


def test_a_lab_dir_holding_a_venv_of_yours_is_refused_and_kept(tmp_path, capsys, monkeypatch):
    lab = tmp_path / "work"
    (lab / "venv" / "bin").mkdir(parents=True)
    (lab / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (lab / "venv" / "bin" / "python").write_text("#!/bin/sh\n")
    before = tree(lab)
    # were the venv taken, the install would fail fast here, not fetch anything
    monkeypatch.setenv("PPSCOPE_LAB_TORCH", "ppscope-no-such-package==0")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    rc, _, err = run(["sglang-lab", "--lab-dir", lab, "--out", tmp_path / "out",
                   "--cases", "clean-c8"], capsys)
    one_line_error(rc, err, "not a venv the lab made")
    assert tree(lab) == before


def test_a_lab_dir_holding_files_the_lab_does_not_make_is_refused(tmp_path, capsys):
    lab = tmp_path / "home"
    lab.mkdir()
    (lab / "thesis.tex").write_text("mine\n")
    before = tree(lab)
    rc, _, err = run(["sglang-lab", "--lab-dir", lab, "--out", tmp_path / "out",
                   "--cases", "clean-c8"], capsys)
    one_line_error(rc, err, "did not make", "thesis.tex")
    assert tree(lab) == before


def test_a_lab_dir_of_an_earlier_lab_is_adopted(tmp_path):
    from microbench.sglang_lab.venv import MARKER, STAMP, claim_lab_dir
    lab = tmp_path / "lab"
    (lab / "venv").mkdir(parents=True)
    (lab / "venv" / STAMP).write_text("0123\n")
    (lab / "install.log").write_text("")
    (lab / "model-llama-4l").mkdir()
    claim_lab_dir(lab)
    assert (lab / MARKER).exists()
    claim_lab_dir(tmp_path / "new" / "lab")           # a new folder is made and marked
    assert (tmp_path / "new" / "lab" / MARKER).exists()


def test_shims_go_only_into_the_labs_own_venv(user_sglang, tmp_path):
    from microbench.sglang_lab.venv import LabError, claim_lab_dir, install_shims
    lab = claim_lab_dir(tmp_path / "lab")
    before = tree(user_sglang.parent.parent)
    with pytest.raises(LabError, match="not the lab's own venv"):
        install_shims(user_sglang, lab)
    assert tree(user_sglang.parent.parent) == before


def test_the_inject_folder_loads_faults_and_keeps_the_environments_sitecustomize(tmp_path):
    from microbench.sglang_lab.venv import inject_path
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = '1'\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(inject_path()), str(own)]),
               PPSCOPE_LAB_FAULT_FILE=str(tmp_path / "fault"))
    out = subprocess.run([sys.executable, "-c",
                          "import os, sys; print(getattr(sys.modules.get('ppscope_lab_faults'), "
                          "'_installed', False), os.environ.get('USER_SITECUSTOMIZE_RAN'))"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.split() == ["True", "1"], out.stderr
    env.pop("PPSCOPE_LAB_FAULT_FILE")                 # no fault asked: the module stays out
    out = subprocess.run([sys.executable, "-c", "import sys; print('ppscope_lab_faults' in sys.modules)"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
