"""The lab's offline bundle: one file with the wheels a host without network needs for the lab.

GPU servers often have no network, and the lab's venv installs SGLang 0.5.23's pinned packages
(`requirements-cpu.txt`) from an index. So, on a machine with an index,
`ppscope sglang-lab --bundle FILE [--python-version 3.12] [--platform TAG ...]
[--target-freeze FREEZE.txt]` downloads those wheels for the target (`pip download --no-deps
--only-binary=:all:`, the target's Python and platform where given, this machine's otherwise)
and writes them with a manifest into one tar file. Left out:
- torch, torchvision and triton: the host's own are used (they are built together: a
  torchvision or triton of the lab's pins would not match the host's torch);
- every package the target already has at the pinned version (`pip freeze` of the target's
  Python, `--target-freeze`); with `--target-copies`, every package it has at any version (its
  own copy is used: the manifest lists each version that differs from SGLang's pin, and the
  install's import check of SGLang's server and bench_serving decides whether they serve).
The manifest (`manifest.json`) names each wheel with its package, version, size and sha256, what
was left out and why, the Python and platforms it was made for, and a hash of the lab's pins.

`--compact` makes the file about a third of the size, for a carry limit (a device's upload, a
ticket's attachment): every wheel is repacked with its files stored uncompressed (the same files,
so each wheel's RECORD hashes still hold), the parts of SGLang's wheel that a language-model
server started as the lab starts it never loads are left out (TRIM, each with its reason; the
install's import check and the lab's runs are the proof), and the tar is xz-compressed. Wheels
are deflate-compressed one file at a time; xz over the stored files of all of them finds far more
to share. The manifest lists what was left out.

On the target, `ppscope sglang-lab --from-bundle FILE` (bundle_install.py) makes the lab's own
venv over the host's torch with no network, then runs as usual.

Platform tags: pip (before 24) takes a `manylinux_2_N` tag literally, while wheels name the
oldest glibc they need (SGLang's own wheel is `manylinux_2_34`). A `manylinux_2_N_ARCH` or
`manylinux2014_ARCH` given here is widened to every manylinux tag a glibc 2.N host accepts.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from microbench.sglang_lab.venv import REQUIREMENTS, LabError

KIND = "ppscope-sglang-lab-bundle"
FORMAT = 1
MANIFEST = "manifest.json"
PINS = "requirements.txt"           # the bundle's own pins: what the target installs
WHEELS = "wheels"
HOST_OWNED = ("torch", "torchvision", "triton")
DOWNLOAD_TIMEOUT_S = 3600.0
XZ_PRESET = 6                       # --compact: xz -9 gains 2% for twice the time here

# --compact: what of a wheel the lab never loads, by package, with the reason. SGLang 0.5.23:
# `sglang.launch_server` (HTTP, no --grpc-port, SGLANG_RUST_SERVER unset) and
# `sglang.bench_serving` (Python client) import none of these.
TRIM: dict[str, tuple[tuple[str, str], ...]] = {
    "sglang": (
        ("sglang/multimodal_gen/", "the diffusion runtime (sglang.multimodal_gen)"),
        ("sglang/srt/rust_extensions/_server.", "the Rust HTTP server (SGLANG_RUST_SERVER)"),
        ("sglang/srt/rust_extensions/_grpc.", "the gRPC server (--grpc-port)"),
        ("sglang/srt/rust_extensions/_bench.", "the Rust bench client (sglang.benchmark)"),
        ("sglang/srt/rust_extensions/_multimodal.", "the multimodal processors' Rust code"),
    ),
}


def norm(name: str) -> str:
    """A package name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def lab_pins() -> list[tuple[str, str]]:
    """(name, version) of every `name==version` line of the lab's requirements."""
    out = []
    for line in REQUIREMENTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out.append((name.strip(), version.strip()))
    return out


def pins_hash() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]


def read_freeze(path: Path) -> dict[str, str]:
    """`pip freeze` / `pip list --format=freeze` of the target: normalised name -> version.
    Lines that pin no version (editable installs, `name @ URL`) say nothing about a wheel."""
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        raise LabError(f"--target-freeze {path}: cannot read it ({e.strerror or e})") from None
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or line.startswith("-e ") or " @ " in line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if m:
            out[norm(m.group(1))] = m.group(2)
    if not out:
        raise LabError(f"--target-freeze {path}: no `name==version` line in it; give the output "
                       "of `python -m pip freeze` on the target")
    return out


@dataclass(frozen=True)
class Selection:
    wanted: tuple[tuple[str, str], ...]          # (name, version) to download
    host_owned: tuple[str, ...]                  # left out: the host's torch and its companions
    target_has: tuple[str, ...]                  # left out: the target has it at this version
    target_other: tuple[str, ...] = ()           # left out: "name==pin (target: version)"


def select(pins: list[tuple[str, str]], freeze: dict[str, str] | None,
           any_version: bool = False) -> Selection:
    """What to download; `any_version` (--target-copies): the target's copy of a package at
    another version is used too."""
    wanted, host, has, other = [], [], [], []
    for name, version in pins:
        theirs = freeze.get(norm(name)) if freeze is not None else None
        if norm(name) in HOST_OWNED:
            host.append(f"{name}=={version}")
        elif theirs == version:
            has.append(f"{name}=={version}")
        elif theirs is not None and any_version:
            other.append(f"{name}=={version} (target: {theirs})")
        else:
            wanted.append((name, version))
    return Selection(tuple(wanted), tuple(host), tuple(has), tuple(other))


def widen_platform(tag: str) -> list[str]:
    """Every manylinux tag a host of `tag`'s glibc accepts (newest first); other tags as given."""
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", tag)
    legacy = {"manylinux2014": (2, 17), "manylinux2010": (2, 12), "manylinux1": (2, 5)}
    if m is None:
        m2 = re.fullmatch(r"(manylinux2014|manylinux2010|manylinux1)_(\w+)", tag)
        if m2 is None:
            return [tag]
        (major, minor), arch = legacy[m2.group(1)], m2.group(2)
    else:
        major, minor, arch = int(m.group(1)), int(m.group(2)), m.group(3)
    if major != 2:
        return [tag]
    out = [f"manylinux_2_{n}_{arch}" for n in range(minor, 4, -1)]
    out += [f"{name}_{arch}" for name, (_, n) in legacy.items() if n <= minor]
    return out


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    file: str                  # wheels/<file> in the bundle
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """manifest.json: the bundle's contents and what it was made for."""
    python_version: str
    platforms: tuple[str, ...]
    lab_pins_sha256: str       # pins_hash() of the requirements it was made from
    packages: tuple[Package, ...]
    host_owned: tuple[str, ...]
    target_has: tuple[str, ...]
    made_unix: float
    trimmed: tuple[str, ...] = ()    # --compact: "<package>: <path> (<reason>), N files, X MB"
    target_other: tuple[str, ...] = ()   # --target-copies: "name==pin (target: version)"
    compression: str = ""            # "xz" for --compact
    kind: str = KIND
    format: int = FORMAT

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @staticmethod
    def from_json(text: str) -> "Manifest":
        """Raises ValueError (KeyError, TypeError) when it is not a lab bundle's manifest."""
        d = json.loads(text)
        if not isinstance(d, dict) or d.get("kind") != KIND:
            raise ValueError("not a lab bundle's manifest")
        if d.get("format") != FORMAT:
            raise ValueError(f"bundle format {d.get('format')!r}, this ppscope reads {FORMAT}")
        pk = tuple(Package(str(p["name"]), str(p["version"]), str(p["file"]), int(p["bytes"]),
                           str(p["sha256"])) for p in d["packages"])
        if any("/" in p.file or not p.file.endswith(".whl") for p in pk):
            raise ValueError("a package file that is not a wheel's name")
        return Manifest(str(d["python_version"]), tuple(map(str, d["platforms"])),
                        str(d["lab_pins_sha256"]), pk, tuple(map(str, d["host_owned"])),
                        tuple(map(str, d["target_has"])), float(d["made_unix"]),
                        trimmed=tuple(map(str, d.get("trimmed", ()))),
                        compression=str(d.get("compression", "")),
                        target_other=tuple(map(str, d.get("target_other", ()))))


@dataclass(frozen=True)
class BundleSpec:
    out: Path
    python_version: str | None = None            # "3.12": the target's; None: this Python's
    platforms: tuple[str, ...] = ()              # the target's; (): this machine's
    target_freeze: Path | None = None
    compact: bool = False                        # stored wheels, TRIM left out, xz
    target_copies: bool = False                  # the target's copy at any version is used


def _check_spec(spec: BundleSpec) -> None:
    if spec.python_version is not None and not re.fullmatch(r"3\.\d{1,2}", spec.python_version):
        raise LabError(f"--python-version must be like 3.12, got {spec.python_version!r}")
    for p in spec.platforms:
        if not re.fullmatch(r"[a-z0-9_]+", p):
            raise LabError(f"--platform must be a wheel platform tag like "
                           f"manylinux_2_34_x86_64, got {p!r}")
    if spec.out.exists() and (spec.out.is_dir() or not is_bundle(spec.out)):
        raise LabError(f"--bundle {spec.out} exists and is not a lab bundle; give a new name")
    if not spec.out.parent.is_dir():
        raise LabError(f"--bundle {spec.out}: no folder {spec.out.parent}")


def is_bundle(path: Path) -> bool:
    try:
        with tarfile.open(path) as tf:
            m = tf.extractfile(MANIFEST)
            return m is not None and Manifest.from_json(m.read(1 << 20).decode()) is not None
    except (OSError, tarfile.TarError, KeyError, ValueError, TypeError, UnicodeDecodeError):
        return False


def _wheel_name_version(filename: str) -> tuple[str, str]:
    parts = filename[:-len(".whl")].split("-")
    return norm(parts[0]), parts[1]


def sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def repack(wheel: Path, name: str) -> list[str]:
    """--compact: rewrite `wheel` in place with its files stored, less TRIM[name]; returns what
    was left out, one line per TRIM entry that matched. RECORD loses the lines of the files
    left out, so the installed package's record lists only what is there."""
    drop = TRIM.get(norm(name), ())
    tmp = wheel.with_name(wheel.name + ".repack")
    gone: dict[str, list[zipfile.ZipInfo]] = {prefix: [] for prefix, _ in drop}
    with zipfile.ZipFile(wheel) as zin:
        infos = zin.infolist()
        for info in infos:
            for prefix, _ in drop:
                if info.filename.startswith(prefix):
                    gone[prefix].append(info)
        dropped = {i.filename for lst in gone.values() for i in lst}
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zout:
            for info in infos:
                if info.filename in dropped:
                    continue
                data = zin.read(info)
                if dropped and info.filename.endswith(".dist-info/RECORD"):
                    data = "".join(ln for ln in data.decode().splitlines(True)
                                   if ln.split(",", 1)[0] not in dropped).encode()
                out = zipfile.ZipInfo(info.filename, info.date_time)
                out.external_attr = info.external_attr
                zout.writestr(out, data, zipfile.ZIP_STORED)
    os.replace(tmp, wheel)
    return [f"{name}: {prefix}* ({why}), {len(gone[prefix])} files, "
            f"{sum(i.file_size for i in gone[prefix]) / 1e6:.1f} MB"
            for prefix, why in drop if gone[prefix]]


def download(sel: Selection, spec: BundleSpec, dest: Path, log: Path) -> None:
    reqs = dest.parent / "wanted.txt"
    reqs.write_text("".join(f"{n}=={v}\n" for n, v in sel.wanted))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(dest), "-r", str(reqs)]
    if spec.python_version:
        cmd += ["--python-version", spec.python_version]
    for tag in spec.platforms:
        for t in widen_platform(tag):
            cmd += ["--platform", t]
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                timeout=DOWNLOAD_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            raise LabError(f"pip download gave no answer within {DOWNLOAD_TIMEOUT_S:.0f} s "
                           f"(log: {log})") from None
    if rc != 0:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("ERROR")]
        why = lines[0][:200] if lines else f"exit {rc}"
        raise LabError(f"downloading the lab's wheels failed: {why} (log: {log})")


def build_bundle(spec: BundleSpec, say=print) -> Manifest:
    """Download, check and pack; returns the manifest. The file appears only when complete."""
    _check_spec(spec)
    freeze = read_freeze(spec.target_freeze) if spec.target_freeze else None
    if spec.target_copies and freeze is None:
        raise LabError("--target-copies needs --target-freeze: the target's packages")
    sel = select(lab_pins(), freeze, spec.target_copies)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ppscope-bundle-") as tmp:
        wheels = Path(tmp) / WHEELS
        wheels.mkdir()
        log = Path(tmp) / "pip.log"
        say(f"downloading {len(sel.wanted)} wheels for Python "
            f"{spec.python_version or '%d.%d (this one)' % sys.version_info[:2]}"
            f" on {', '.join(spec.platforms) or 'this platform'} (left out: the host's "
            f"{', '.join(p.partition('==')[0] for p in sel.host_owned) or 'torch'} and "
            f"{len(sel.target_has)} the target has"
            + (f", {len(sel.target_other)} it has at another version" if sel.target_other else "")
            + ")")
        try:
            download(sel, spec, wheels, log)
        except LabError as e:
            keep = spec.out.with_name(spec.out.name + ".pip.log")
            keep.write_bytes(log.read_bytes())
            raise LabError(str(e).replace(str(log), str(keep))) from None
        files = {_wheel_name_version(p.name): p for p in wheels.glob("*.whl")}
        by_name = {n: (v, p) for (n, v), p in files.items()}
        missing = [f"{n}=={v}" for n, v in sel.wanted if by_name.get(norm(n), (None,))[0] != v]
        if missing:
            raise LabError(f"pip download gave no wheel for {', '.join(missing[:3])}")
        say(f"downloaded {len(files)} wheels in {time.monotonic() - t0:.0f} s; "
            + ("repacking them stored" if spec.compact else "hashing and packing"))
        trimmed: list[str] = []
        if spec.compact:
            for n, _ in sel.wanted:
                trimmed += repack(by_name[norm(n)][1], n)
            say(f"left out: {'; '.join(trimmed) or 'nothing'}; xz-compressing "
                f"{sum(p.stat().st_size for _, p in by_name.values()) / 1e6:.0f} MB "
                "(about a minute per 100 MB)")
        packages = tuple(Package(n, v, by_name[norm(n)][1].name,
                                 by_name[norm(n)][1].stat().st_size, sha256_file(by_name[norm(n)][1]))
                         for n, v in sel.wanted)
        manifest = Manifest(
            python_version=spec.python_version or "%d.%d" % sys.version_info[:2],
            platforms=spec.platforms, lab_pins_sha256=pins_hash(), packages=packages,
            host_owned=sel.host_owned, target_has=sel.target_has, made_unix=time.time(),
            trimmed=tuple(trimmed), compression="xz" if spec.compact else "",
            target_other=sel.target_other)
        (Path(tmp) / MANIFEST).write_text(manifest.to_json())
        (Path(tmp) / PINS).write_text("".join(f"{n}=={v}\n" for n, v in sel.wanted))
        part = spec.out.with_name(spec.out.name + ".partial")
        try:
            with (tarfile.open(part, "w:xz", preset=XZ_PRESET) if spec.compact
                  else tarfile.open(part, "w")) as tf:
                tf.add(Path(tmp) / MANIFEST, MANIFEST)
                tf.add(Path(tmp) / PINS, PINS)
                for pkg in packages:
                    tf.add(wheels / pkg.file, f"{WHEELS}/{pkg.file}")
            os.replace(part, spec.out)
        finally:
            part.unlink(missing_ok=True)
    size = spec.out.stat().st_size
    say(f"wrote {spec.out}: {len(packages)} wheels, {size / 1e6:.1f} MB, in "
        f"{time.monotonic() - t0:.0f} s")
    return manifest
