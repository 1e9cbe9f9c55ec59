"""The lab's own venv: SGLang 0.5.23 for CPU, its import shims, a tiny local model.

Never the user's environment: `.lab/venv` is made without system site packages. torch goes
first on its own (`PPSCOPE_LAB_TORCH`, default `torch==2.13.0`: a CPU build where pip finds one),
then every package of `requirements-cpu.txt` with `--no-deps`, so nothing can pull a CUDA torch or
`sglang-kernel`. `boot/` is copied into site-packages and loaded by a `.pth` file (see
`boot/ppscope_lab_boot.py`; copied again on every run). A stamp holds a hash of the list: an
unchanged venv is reused with no network. Any failed step raises LabError with one line and the log path.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BOOT = HERE / "boot"
REQUIREMENTS = HERE / "requirements-cpu.txt"
MODEL_LAYERS = 4


class LabError(Exception):
    """A lab step failed; the message is one line for the user."""


def _fingerprint() -> str:
    """What the installed packages depend on (the boot files are copied again on every run)."""
    h = hashlib.sha256(REQUIREMENTS.read_bytes())
    h.update(os.environ.get("PPSCOPE_LAB_TORCH", "torch==2.13.0").encode())
    return h.hexdigest()[:16]


def _run(cmd: list[str], log: Path, what: str, timeout: float) -> None:
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                                stdin=subprocess.DEVNULL).returncode
        except subprocess.TimeoutExpired:
            raise LabError(f"{what}: no answer within {timeout:.0f} s (log: {log})") from None
        except OSError as e:
            raise LabError(f"{what}: {e.strerror or e} (log: {log})") from None
    if rc != 0:
        tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-1:]
        raise LabError(f"{what} failed (exit {rc}): {tail[0][:200] if tail else ''} (log: {log})")


def site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise LabError(f"{python} does not run: {out.stderr.strip()[-200:]}")
    return Path(out.stdout.strip())


def install_boot(python: Path) -> Path:
    """Copy the shims and the fault module into that venv and load them from a .pth file."""
    sp = site_packages(python)
    for p in BOOT.iterdir():
        if p.name == "__pycache__":
            continue
        dst = sp / p.name
        if p.is_dir():
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(p, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(p, dst)
    (sp / "ppscope_lab.pth").write_text("import ppscope_lab_boot; ppscope_lab_boot.install()\n")
    return sp


def ensure_venv(lab_dir: Path, say=print) -> Path:
    """The lab venv's python, installed if needed. Raises LabError."""
    venv = lab_dir / "venv"
    python = venv / "bin" / "python"
    stamp = venv / ".ppscope-lab-stamp"
    want = _fingerprint()
    if python.exists() and stamp.exists() and stamp.read_text().strip() == want:
        install_boot(python)
        return python
    lab_dir.mkdir(parents=True, exist_ok=True)
    log = lab_dir / "install.log"
    log.write_text("")
    if venv.exists():
        shutil.rmtree(venv)
    say(f"installing SGLang 0.5.23 for CPU into {venv} (a few minutes; log: {log})")
    try:
        _run([sys.executable, "-m", "venv", str(venv)], log, "making the lab venv", 300)
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        _run(pip + [os.environ.get("PPSCOPE_LAB_TORCH", "torch==2.13.0")], log,
             "installing torch into the lab venv", 1200)
        _run(pip + ["--no-deps", "-r", str(REQUIREMENTS)], log,
             "installing SGLang's packages into the lab venv", 1200)
        install_boot(python)
        _run([str(python), "-c", "import sglang.srt.entrypoints.http_server, sglang.bench_serving"],
             log, "importing SGLang in the lab venv", 600)
    except BaseException:
        shutil.rmtree(venv, ignore_errors=True)     # never a half-made venv taken for a good one
        raise
    stamp.write_text(want + "\n")
    return python


def ensure_model(python: Path, lab_dir: Path, layers: int = MODEL_LAYERS) -> Path:
    """The tiny Llama folder (config + a tokenizer trained here), made once."""
    model = lab_dir / f"model-llama-{layers}l"
    if (model / "tokenizer.json").exists() and (model / "config.json").exists():
        return model
    log = lab_dir / "install.log"
    tmp = model.with_name(model.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    _run([str(python), str(BOOT / "ppscope_lab_make_model.py"), str(tmp), str(layers)], log,
         "making the lab model", 300)
    tmp.rename(model)
    return model


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
