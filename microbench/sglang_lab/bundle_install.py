"""The lab's own venv from an offline bundle (bundle.py), over the host's torch, with no network.

`ppscope sglang-lab --from-bundle FILE [--host-python PATH]` on the target:
1. the bundle is read and checked: a tar holding `manifest.json`, its pins and every wheel the
   manifest names with that sha256, nothing outside it; made for this Python's version and from
   the lab's pins of this ppscope (a bundle of other pins is refused: make a new one);
2. the host's Python (default: the one running ppscope) must import torch;
3. `.lab/venv` is made from that Python (`-m venv --without-pip`); a `.pth` file in its
   site-packages adds the host's site-packages after its own (`site.addsitedir`), so the host's
   torch, torchvision and triton are seen, and a package the bundle holds at the lab's pin wins
   over the host's copy of another version;
4. pip (the host's, seen through that `.pth`; else the venv's own from `ensurepip`, which needs
   no network) installs the wheels with `--no-index --no-deps --ignore-installed --find-links`,
   every pip configuration file switched off (`PIP_CONFIG_FILE=/dev/null`), so no index is ever
   asked and nothing outside the venv is touched;
5. the lab's shims are copied in and SGLang's server and bench_serving imported (no GPU
   visible, as the lab runs them); only then the venv gets the lab's stamp for a bundle
   (`venv.bundle_fingerprint`), so `ensure_venv`, the lab and the twin take it as their own.
Any failure removes the half-made venv and says why in one line.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from microbench.sglang_lab.bundle import (MANIFEST, PINS, WHEELS, Manifest, pins_hash,
                                          sha256_file)
from microbench.sglang_lab.lab_env import own_env
from microbench.sglang_lab.venv import (STAMP, LabError, bundle_fingerprint, check_imports,
                                        claim_lab_dir, install_shims, run_step)

HOST_PTH = "ppscope_lab_host.pth"


def read_bundle(path: Path, dest: Path) -> Manifest:
    """Unpack the bundle into `dest` (an empty folder) and check it; LabError in one line."""
    what = f"--from-bundle {path}"
    if not path.is_file():
        raise LabError(f"{what}: no such file")
    try:
        with tarfile.open(path) as tf:
            names = tf.getnames()
            m = tf.extractfile(MANIFEST) if MANIFEST in names else None
            if m is None:
                raise LabError(f"{what}: not a lab bundle (no {MANIFEST} in it)")
            try:
                manifest = Manifest.from_json(m.read(1 << 20).decode())
            except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
                raise LabError(f"{what}: not a lab bundle's manifest ({e})") from None
            want = {MANIFEST, PINS} | {f"{WHEELS}/{p.file}" for p in manifest.packages}
            extra = sorted(set(names) - want - {WHEELS})
            absent = sorted(want - set(names))
            if extra or absent:
                raise LabError(f"{what}: its contents differ from its manifest ("
                               + (f"missing {absent[0]}" if absent else f"unlisted {extra[0]}")
                               + ")")
            for member in tf.getmembers():
                if member.name == WHEELS:
                    continue
                if not member.isfile():
                    raise LabError(f"{what}: {member.name} is not a plain file")
                src = tf.extractfile(member)
                out = dest / member.name
                out.parent.mkdir(parents=True, exist_ok=True)
                with open(out, "wb") as f:
                    shutil.copyfileobj(src, f)
    except (tarfile.TarError, EOFError, OSError) as e:
        why = (str(e).splitlines() or [""])[0].rstrip(":")[:160]
        raise LabError(f"{what}: not a readable bundle ({e.__class__.__name__}: {why})") from None
    for p in manifest.packages:
        if sha256_file(dest / WHEELS / p.file) != p.sha256:
            raise LabError(f"{what}: {p.file} does not match its sha256 in the manifest "
                           "(a damaged copy)")
    return manifest


def host_facts(python: Path) -> dict:
    """The host Python's version, its torch and its site-packages folders."""
    code = ("import json, site, sys, sysconfig\n"
            "dirs = list(site.getsitepackages()) + [sysconfig.get_path('purelib'), "
            "sysconfig.get_path('platlib')]\n"
            "try:\n import torch; tv = torch.__version__\nexcept Exception as e:\n"
            " tv = 'no torch: ' + type(e).__name__ + ': ' + str(e)\n"
            "print(json.dumps({'version': '%d.%d' % sys.version_info[:2], 'torch': tv, "
            "'dirs': list(dict.fromkeys(dirs))}))\n")
    try:
        out = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                             timeout=300, stdin=subprocess.DEVNULL,
                             env=own_env() | {"CUDA_VISIBLE_DEVICES": ""})
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LabError(f"--host-python {python}: cannot run it ({e})") from None
    try:
        facts = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        why = (out.stderr.strip().splitlines() or ["no answer"])[-1][:200]
        raise LabError(f"--host-python {python} is not a Python that answers ({why})") from None
    return facts


def install_from_bundle(bundle: Path, lab_dir: Path, host_python: Path, say=print) -> Path:
    """The lab venv's python, made from the bundle over the host's torch. Raises LabError."""
    t0 = time.monotonic()
    claim_lab_dir(lab_dir)
    bundle = bundle.resolve()
    with tempfile.TemporaryDirectory(prefix="ppscope-bundle-") as tmp:
        say(f"reading {bundle} ({bundle.stat().st_size / 1e6:.1f} MB)" if bundle.is_file()
            else f"reading {bundle}")
        manifest = read_bundle(bundle, Path(tmp))
        if manifest.lab_pins_sha256 != pins_hash():
            raise LabError(f"--from-bundle {bundle} was made from other lab pins than this "
                           "ppscope's; make a new one with --bundle")
        if manifest.target_other:
            say(f"this host's own copies stand in for {len(manifest.target_other)} pinned "
                f"package(s) at other versions: {', '.join(manifest.target_other)}")
        if manifest.trimmed:
            say(f"a compact bundle: left out of it {'; '.join(manifest.trimmed)}")
        facts = host_facts(host_python)
        if facts["version"] != manifest.python_version:
            raise LabError(f"--from-bundle {bundle} holds wheels for Python "
                           f"{manifest.python_version}; --host-python {host_python} is "
                           f"{facts['version']}")
        if str(facts["torch"]).startswith("no torch"):
            raise LabError(f"--host-python {host_python} has no torch the lab can use "
                           f"({facts['torch'][:160]})")
        say(f"{len(manifest.packages)} wheels checked; making the lab venv over "
            f"{host_python} (Python {facts['version']}, torch {facts['torch']})")
        return _make_venv(lab_dir, Path(host_python), Path(tmp), facts, manifest, say, t0)


def _make_venv(lab_dir: Path, host_python: Path, unpacked: Path, facts: dict,
               manifest: Manifest, say, t0: float) -> Path:
    venv = lab_dir / "venv"
    python = venv / "bin" / "python"
    log = lab_dir / "install.log"
    log.write_text("")
    if venv.exists():     # the lab's own (claim_lab_dir: stamped, or in the lab's marked folder)
        shutil.rmtree(venv)
    try:
        run_step([str(host_python), "-m", "venv", "--without-pip", str(venv)], log,
             "making the lab venv", 300)
        (venv / STAMP).write_text("installing\n")
        sp = _site_packages(python)
        dirs = [d for d in facts["dirs"] if d and Path(d).is_dir()
                and Path(d).resolve() != sp.resolve()]
        (sp / HOST_PTH).write_text(
            "# the host's site-packages after the lab venv's own (ppscope's bundle install)\n"
            + "".join(f"import site; site.addsitedir({d!r})\n" for d in dirs))
        pip_env = {k: v for k, v in own_env().items() if not k.startswith("PIP_")}
        pip_env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INPUT="1")
        if subprocess.run([str(python), "-m", "pip", "--version"], capture_output=True,
                          env=pip_env, stdin=subprocess.DEVNULL, timeout=120).returncode != 0:
            run_step([str(python), "-m", "ensurepip", "--default-pip"], log,
                 "making pip in the lab venv (ensurepip)", 600, env=pip_env)
        say(f"installing {len(manifest.packages)} wheels with no network "
            "(pip --no-index; a minute or two)")
        run_step([str(python), "-m", "pip", "install", "--no-index", "--no-deps",
              "--ignore-installed", "--no-warn-script-location", "--disable-pip-version-check",
              "-q", "--find-links", str(unpacked / WHEELS), "-r", str(unpacked / PINS)], log,
             "installing the bundle's wheels", 1800, env=pip_env)
        install_shims(python, lab_dir)
        say("importing SGLang in the lab venv")
        check_imports(python, log)
    except BaseException:
        shutil.rmtree(venv, ignore_errors=True)      # never a half-made venv taken for a good one
        raise
    (venv / STAMP).write_text(bundle_fingerprint() + "\n")
    say(f"lab venv ready from the bundle in {time.monotonic() - t0:.0f} s: {venv}")
    return python


def _site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         capture_output=True, text=True, timeout=60, env=own_env())
    if out.returncode != 0 or not out.stdout.strip():
        raise LabError(f"the new lab venv's python does not run: {out.stderr.strip()[-200:]}")
    return Path(out.stdout.strip())


def default_host_python() -> Path:
    return Path(sys.executable)
