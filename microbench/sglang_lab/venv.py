"""The lab's own venv: SGLang 0.5.23 for CPU, its import shims, a tiny local model.

Never the user's environment: `.lab/venv` is made without system site packages. torch goes
first on its own (`PPSCOPE_LAB_TORCH`, default `torch==2.13.0`: a CPU build where pip finds one),
then every package of `requirements-cpu.txt` with `--no-deps`, so nothing can pull a CUDA torch or
`sglang-kernel`. The CPU shims of `boot/` are copied into that venv's site-packages and loaded by
a `.pth` file (see `boot/ppscope_lab_boot.py`; copied again on every run), only ever into a venv
that holds the lab's stamp. A stamp holds a hash of the list: an unchanged venv is reused with no
network. Any failed step raises LabError with one line and the log path.

Own only what you made: the lab folder carries a marker (`.ppscope-lab`); a folder holding
anything the lab does not make is refused, and only a venv with the lab's stamp is ever deleted.
An SGLang you installed (`--sglang-python`) is only checked and run: the fault module reaches its
server through `PYTHONPATH` (`inject_path`), never through its site-packages.
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from microbench.sglang_lab.lab_env import child_env

HERE = Path(__file__).resolve().parent
BOOT = HERE / "boot"
REQUIREMENTS = HERE / "requirements-cpu.txt"
MODEL_LAYERS = 4
MODEL_VERSION = 3       # boot/ppscope_lab_make_model.py VERSION: the recipe of the model folder
# boot/ scripts the lab runs in its Python, never loaded there: not copied into the venv
RUN_ONLY = ("_make_model.py", "_probe_tree_core.py")
MARKER = ".ppscope-lab"
STAMP = ".ppscope-lab-stamp"
# What the lab makes in its folder, and nothing else: the venv, its install log, the fault control
# file, the bench dataset, the tiny models (and their half-made `.tmp` folders), the twin's files.
KNOWN = ("venv", "install.log", "fault", "sharegpt-local.json", "model-*", "twin-*")


class LabError(Exception):
    """A lab step failed; the message is one line for the user."""


def _fingerprint() -> str:
    """What the installed packages depend on (the boot files are copied again on every run)."""
    h = hashlib.sha256(REQUIREMENTS.read_bytes())
    h.update(os.environ.get("PPSCOPE_LAB_TORCH", "torch==2.13.0").encode())
    return h.hexdigest()[:16]


BUNDLE_STAMP = "bundle-"


def bundle_fingerprint() -> str:
    """The stamp of a venv made from an offline bundle over the host's torch
    (bundle_install.py): the lab's pins, whatever torch the host has."""
    return BUNDLE_STAMP + hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]


def run_step(cmd: list[str], log: Path, what: str, timeout: float,
         env: dict[str, str] | None = None) -> None:
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                                stdin=subprocess.DEVNULL, env=env).returncode
        except subprocess.TimeoutExpired:
            raise LabError(f"{what}: no answer within {timeout:.0f} s (log: {log})") from None
        except OSError as e:
            raise LabError(f"{what}: {e.strerror or e} (log: {log})") from None
    if rc != 0:
        tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-1:]
        raise LabError(f"{what} failed (exit {rc}): {tail[0][:200] if tail else ''} (log: {log})")


def claim_lab_dir(lab_dir: Path) -> Path:
    """The lab's folder, made or checked before anything is written there. Raises LabError when
    it holds anything the lab does not make (it would be the user's), or a venv without the lab's
    stamp in a folder the lab has not marked as its own."""
    if lab_dir.exists() and not lab_dir.is_dir():
        raise LabError(f"--lab-dir {lab_dir} is a file, not a folder")
    if not lab_dir.exists():
        try:
            lab_dir.mkdir(parents=True)
        except OSError as e:
            raise LabError(f"--lab-dir {lab_dir}: cannot make it ({e.strerror or e})") from None
    names = sorted(n for n in os.listdir(lab_dir) if n != MARKER)
    foreign = [n for n in names if not any(fnmatch.fnmatchcase(n, k) for k in KNOWN)]
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise LabError(f"--lab-dir {lab_dir} holds files the lab did not make ({shown}); "
                       "give a new or empty folder")
    marker = lab_dir / MARKER
    if not marker.exists():
        venv = lab_dir / "venv"
        if venv.exists() and not (venv / STAMP).exists():
            raise LabError(f"--lab-dir {lab_dir}: {venv} is not a venv the lab made (no stamp); "
                           "give a new or empty folder")
        try:
            marker.write_text("a folder of ppscope's SGLang lab: it may delete and remake what "
                              "it holds\n")
        except OSError as e:
            raise LabError(f"--lab-dir {lab_dir}: cannot write into it ({e.strerror or e})") from None
    return lab_dir


def check_sglang_python(python: Path) -> str:
    """An SGLang installation given with --sglang-python: it must be a Python that imports
    sglang. Returns SGLang's version; raises LabError in one line. Nothing in it is written."""
    try:
        out = subprocess.run([str(python), "-c", "import sglang; print(sglang.__version__)"],
                             capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                             env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    except subprocess.TimeoutExpired:
        raise LabError(f"--sglang-python {python}: `import sglang` gave no answer within 300 s") from None
    except OSError as e:
        raise LabError(f"--sglang-python {python}: cannot run it ({e.strerror or e})") from None
    version = out.stdout.strip().splitlines()[-1:] if out.returncode == 0 else []
    if not version or not version[0][:1].isdigit():
        why = (out.stderr.strip().splitlines() or ["it printed no version"])[-1][:160]
        raise LabError(f"--sglang-python {python} is not a Python with SGLang ({why})")
    return version[0]


def inject_path() -> Path:
    """The folder put first on every lab server's PYTHONPATH: its `sitecustomize` loads the fault
    module (boot/inject/); an environment's own sitecustomize still runs after it."""
    return BOOT / "inject"


def _lab_site_packages(python: Path, lab_dir: Path) -> Path:
    """The site-packages of the lab's own venv, and only of it."""
    venv = (lab_dir / "venv").resolve()
    if Path(python).parent.parent.resolve() != venv or not (venv / STAMP).exists():
        raise LabError(f"{python} is not the lab's own venv; its site-packages are not the lab's")
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         capture_output=True, text=True, timeout=60)
    sp = Path(out.stdout.strip()) if out.returncode == 0 else None
    if sp is None or not sp.is_absolute() or venv not in sp.resolve().parents:
        raise LabError(f"{python} does not run: {out.stderr.strip()[-200:]}")
    return sp


def install_shims(python: Path, lab_dir: Path) -> Path:
    """Copy the CPU shims (boot/: the torchvision schemas, the sgl_kernel stand-in) into the
    lab's own venv and load them from a .pth file. Never any other installation."""
    sp = _lab_site_packages(python, lab_dir)
    for p in BOOT.iterdir():
        if p.name in ("__pycache__", "inject") or p.name.endswith(RUN_ONLY):
            continue
        dst = sp / p.name
        if p.is_dir():
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(p, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(p, dst)
    (sp / "ppscope_lab_faults.py").unlink(missing_ok=True)   # an older lab put it here
    (sp / "ppscope_lab.pth").write_text("import ppscope_lab_boot; ppscope_lab_boot.install()\n")
    return sp


def ensure_venv(lab_dir: Path, say=print) -> Path:
    """The lab venv's python, installed if needed. Raises LabError."""
    claim_lab_dir(lab_dir)
    venv = lab_dir / "venv"
    python = venv / "bin" / "python"
    stamp = venv / STAMP
    want = _fingerprint()
    have = stamp.read_text().strip() if python.exists() and stamp.exists() else ""
    if have in (want, bundle_fingerprint()):
        install_shims(python, lab_dir)
        return python
    if have.startswith(BUNDLE_STAMP):    # made offline: another install would need an index
        raise LabError(f"{venv} was made from a bundle of other lab pins than this ppscope's; "
                       "make a new bundle (--bundle) and install it (--from-bundle)")
    log = lab_dir / "install.log"
    log.write_text("")
    if venv.exists():    # the lab's own (claim_lab_dir: stamped, or in the lab's marked folder)
        shutil.rmtree(venv)
    say(f"installing SGLang 0.5.23 for CPU into {venv} (a few minutes; log: {log})")
    try:
        run_step([sys.executable, "-m", "venv", str(venv)], log, "making the lab venv", 300)
        stamp.write_text("installing\n")    # the lab's from here on, whatever happens next
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        run_step(pip + [os.environ.get("PPSCOPE_LAB_TORCH", "torch==2.13.0")], log,
             "installing torch into the lab venv", 1200)
        run_step(pip + ["--no-deps", "-r", str(REQUIREMENTS)], log,
             "installing SGLang's packages into the lab venv", 1200)
        install_shims(python, lab_dir)
        check_imports(python, log)
    except BaseException:
        shutil.rmtree(venv, ignore_errors=True)     # never a half-made venv taken for a good one
        raise
    stamp.write_text(want + "\n")
    return python


def check_imports(python: Path, log: Path) -> None:
    """SGLang's server and bench_serving import in the lab's Python, as the lab runs them."""
    run_step([str(python), "-c", "import sglang.srt.entrypoints.http_server, sglang.bench_serving"],
         log, "importing SGLang in the lab venv", 600, env=child_env(python))


def ensure_model(python: Path, lab_dir: Path, layers: int = MODEL_LAYERS) -> Path:
    """The tiny Llama folder (config + a tokenizer trained here), made once; a folder an earlier
    ppscope made to another recipe (boot/ppscope_lab_make_model.py VERSION) is made again."""
    model = lab_dir / f"model-llama-{layers}l"
    if _model_version(model) == MODEL_VERSION:
        return model
    log = lab_dir / "install.log"
    tmp = model.with_name(model.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    run_step([str(python), str(BOOT / "ppscope_lab_make_model.py"), str(tmp), str(layers)], log,
         "making the lab model", 300, env=child_env(python))
    shutil.rmtree(model, ignore_errors=True)
    tmp.rename(model)
    return model


def _model_version(model: Path) -> int | None:
    import json
    try:
        return int(json.loads((model / "ppscope-model.json").read_text())["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def sharegpt_file(lab_dir: Path) -> Path:
    """bench_serving's random dataset samples ShareGPT conversations from a file: a small local
    one (generated text, fixed seed) so nothing comes from the hub."""
    import json
    import random
    p = lab_dir / "sharegpt-local.json"
    if p.exists():
        return p
    rnd = random.Random(1)
    words = ["pipeline", "stage", "token", "batch", "decode", "the", "of", "and", "cache", "slot"]
    rows = [{"id": str(i), "conversations": [
        {"from": "human", "value": " ".join(rnd.choice(words) for _ in range(80))},
        {"from": "gpt", "value": " ".join(rnd.choice(words) for _ in range(80))}]} for i in range(300)]
    p.write_text(json.dumps(rows))
    return p
