"""The lab's offline bundle (microbench/sglang_lab/bundle.py, bundle_install.py): what it holds and
leaves out, and the lab venv made from it over the host's torch with pip --no-index. No network:
pip's download is stood in for by a function that writes small real wheels, and the host Python
is this one behind a fake interpreter that says it has torch; SGLang's import check is stood in
for (the live tier runs the real one)."""
from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from microbench.sglang_lab import bundle, bundle_install, venv
from microbench.sglang_lab.venv import LabError

PINS = "# the lab's pins\nalpha-pkg==1.0\ntorch==2.13.0\nbeta==2.5\ntriton==3.7.1\ngamma==0.1\n"


def _wheel(dest: Path, name: str, version: str) -> Path:
    """A small real wheel: one module `<name>_mod` saying its version."""
    dist = name.replace("-", "_")
    p = dest / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    files = {f"{dist}_mod.py": f"VERSION = {version!r}\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{k},,\n" for k in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(p, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
        z.writestr(f"{info}/RECORD", record)
    return p


@pytest.fixture
def pins(tmp_path, monkeypatch) -> Path:
    req = tmp_path / "requirements-cpu.txt"
    req.write_text(PINS)
    monkeypatch.setattr(bundle, "REQUIREMENTS", req)
    monkeypatch.setattr(venv, "REQUIREMENTS", req)
    return req


def _hash(req: Path) -> str:
    return hashlib.sha256(req.read_bytes()).hexdigest()[:16]


@pytest.fixture
def fake_download(monkeypatch):
    calls = []

    def download(sel, spec, dest, log):
        calls.append((sel, spec))
        for n, v in sel.wanted:
            _wheel(dest, n, v)
    monkeypatch.setattr(bundle, "download", download)
    return calls


def _build(tmp_path, **kw) -> tuple[Path, bundle.Manifest]:
    out = tmp_path / "lab.tar"
    m = bundle.build_bundle(bundle.BundleSpec(out=out, **kw), say=lambda s: None)
    return out, m


# what the bundle holds


def test_the_bundle_holds_the_pins_less_the_hosts_torch_and_what_the_target_has(
        tmp_path, pins, fake_download):
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("beta==2.5\ngamma==0.2\n-e git+https://x/y#egg=z\nzeta @ file:///w\n")
    out, m = _build(tmp_path, target_freeze=freeze, python_version="3.12",
                    platforms=("manylinux_2_34_x86_64",))
    assert [(p.name, p.version) for p in m.packages] == [("alpha-pkg", "1.0"), ("gamma", "0.1")]
    assert m.host_owned == ("torch==2.13.0", "triton==3.7.1")
    assert m.target_has == ("beta==2.5",)
    assert m.python_version == "3.12" and m.platforms == ("manylinux_2_34_x86_64",)
    with tarfile.open(out) as tf:
        names = sorted(tf.getnames())
        man = json.loads(tf.extractfile("manifest.json").read())
        pinned = tf.extractfile("requirements.txt").read().decode()
        for p in m.packages:
            data = tf.extractfile(f"wheels/{p.file}").read()
            assert hashlib.sha256(data).hexdigest() == p.sha256 and len(data) == p.bytes
    assert names == ["manifest.json", "requirements.txt", "wheels/alpha_pkg-1.0-py3-none-any.whl",
                     "wheels/gamma-0.1-py3-none-any.whl"]
    assert man["kind"] == bundle.KIND and man["lab_pins_sha256"] == _hash(pins)
    assert pinned == "alpha-pkg==1.0\ngamma==0.1\n"
    assert not list(tmp_path.glob("*.partial"))


def test_target_copies_leave_out_what_the_target_has_at_any_version(tmp_path, pins,
                                                                    fake_download):
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("beta==2.5\ngamma==0.2\n")
    out, m = _build(tmp_path, target_freeze=freeze, target_copies=True)
    assert [p.name for p in m.packages] == ["alpha-pkg"]
    assert m.target_has == ("beta==2.5",) and m.target_other == ("gamma==0.1 (target: 0.2)",)
    with tarfile.open(out) as tf:
        again = bundle.Manifest.from_json(tf.extractfile("manifest.json").read().decode())
    assert again == m
    with pytest.raises(LabError, match="--target-copies needs --target-freeze"):
        _build(tmp_path / "x" if (tmp_path / "x").mkdir() is None else tmp_path, target_copies=True)


def test_without_a_freeze_everything_but_the_hosts_torch(tmp_path, pins, fake_download):
    _, m = _build(tmp_path)
    assert [p.name for p in m.packages] == ["alpha-pkg", "beta", "gamma"]
    assert m.python_version == "%d.%d" % sys.version_info[:2]


def test_platform_tags_are_widened_to_what_the_glibc_accepts():
    tags = bundle.widen_platform("manylinux_2_34_x86_64")
    assert tags[0] == "manylinux_2_34_x86_64" and "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags and "manylinux_2_35_x86_64" not in tags
    assert bundle.widen_platform("manylinux2014_x86_64")[0] == "manylinux_2_17_x86_64"
    assert bundle.widen_platform("linux_x86_64") == ["linux_x86_64"]


def test_pip_is_asked_for_the_targets_python_and_platforms(tmp_path, pins, monkeypatch):
    seen = {}

    def fake_run(cmd, **kw):
        seen["cmd"] = cmd
        dest = Path(cmd[cmd.index("-d") + 1])
        for line in Path(cmd[cmd.index("-r") + 1]).read_text().split():
            n, _, v = line.partition("==")
            _wheel(dest, n, v)
        return subprocess.CompletedProcess(cmd, 0)
    monkeypatch.setattr(bundle.subprocess, "run", fake_run)
    _build(tmp_path, python_version="3.12", platforms=("manylinux_2_28_x86_64",))
    cmd = seen["cmd"]
    assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd
    assert "--only-binary=:all:" in cmd and cmd[cmd.index("--python-version") + 1] == "3.12"
    plats = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--platform"]
    assert plats[0] == "manylinux_2_28_x86_64" and "manylinux2014_x86_64" in plats


# bad inputs of --bundle: one line, nothing replaced


def test_a_file_that_is_not_a_bundle_is_never_replaced(tmp_path, pins, fake_download):
    mine = tmp_path / "lab.tar"
    mine.write_text("my notes\n")
    with pytest.raises(LabError, match="not a lab bundle"):
        _build(tmp_path)
    assert mine.read_text() == "my notes\n"


def test_a_failed_download_leaves_no_file_and_keeps_pips_log(tmp_path, pins, monkeypatch):
    def fail(sel, spec, dest, log):
        log.write_text("ERROR: No matching distribution found for alpha-pkg==1.0\n")
        raise LabError(f"downloading the lab's wheels failed: ERROR: no (log: {log})")
    monkeypatch.setattr(bundle, "download", fail)
    with pytest.raises(LabError, match="lab.tar.pip.log"):
        _build(tmp_path)
    assert not (tmp_path / "lab.tar").exists() and not list(tmp_path.glob("*.partial"))
    assert "No matching" in (tmp_path / "lab.tar.pip.log").read_text()


@pytest.mark.parametrize("text", ["", "garbage\n", "# nothing\n-e git+x#egg=y\n"])
def test_a_freeze_without_pins_is_refused(tmp_path, text):
    p = tmp_path / "freeze.txt"
    p.write_text(text)
    with pytest.raises(LabError, match="no `name==version` line"):
        bundle.read_freeze(p)


@pytest.mark.parametrize("kw,words", [({"python_version": "3"}, "--python-version"),
                                      ({"python_version": "python3.12"}, "--python-version"),
                                      ({"platforms": ("many linux",)}, "--platform")])
def test_bad_target_is_refused(tmp_path, pins, fake_download, kw, words):
    with pytest.raises(LabError, match=words):
        _build(tmp_path, **kw)


# bad bundles on the target: one line, exit 2, nothing made


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _good(tmp_path, pins, fake_download) -> tuple[Path, dict[str, bytes]]:
    out, _ = _build(tmp_path)
    with tarfile.open(out) as tf:
        return out, {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}


def _bad_bundles(tmp_path, members):
    man = json.loads(members["manifest.json"])
    wheel = next(k for k in members if k.startswith("wheels/"))
    other = dict(members)
    other[wheel] = members[wheel] + b"x"
    yield "garbage", (tmp_path / "g.tar"), b"not a tar at all", "not a readable bundle"
    yield "no manifest", _tar(tmp_path / "n.tar", {k: v for k, v in members.items()
                                                   if k != "manifest.json"}), None, "no manifest"
    yield "wrong kind", _tar(tmp_path / "k.tar", members | {"manifest.json": json.dumps(
        man | {"kind": "other"}).encode()}), None, "not a lab bundle's manifest"
    yield "damaged wheel", _tar(tmp_path / "d.tar", other), None, "does not match its sha256"
    yield "extra member", _tar(tmp_path / "e.tar", members | {"../evil.py": b"x"}), None, "unlisted"
    yield "missing wheel", _tar(tmp_path / "m.tar", {k: v for k, v in members.items()
                                                     if k != wheel}), None, "missing"
    yield "truncated", (tmp_path / "t.tar"), b"", "differ from its manifest|not a readable bundle"


def test_bad_bundles_are_one_line_and_make_nothing(tmp_path, pins, fake_download):
    _, members = _good(tmp_path, pins, fake_download)
    for name, path, raw, words in _bad_bundles(tmp_path, members):
        if raw is not None:
            path.write_bytes(raw if name != "truncated" else
                             (tmp_path / "lab.tar").read_bytes()[:3000])
        lab = tmp_path / f"lab-{path.stem}"
        with pytest.raises(LabError, match=words) as e:
            bundle_install.install_from_bundle(path, lab, Path(sys.executable), say=lambda s: None)
        assert "\n" not in str(e.value), name
        assert not (lab / "venv").exists(), name
        assert not (tmp_path / "evil.py").exists()


def test_cli_bad_bundle_exits_2_in_one_line(tmp_path, capsys):
    from test_fuzz_lab_ownership import one_line_error, run
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"\x00" * 700)
    rc, _, err = run(["sglang-lab", "--from-bundle", junk, "--lab-dir", tmp_path / "lab",
                      "--list"], capsys)
    one_line_error(rc, err, "--from-bundle")
    rc, _, err = run(["sglang-lab", "--python-version", "3.12", "--list"], capsys)
    one_line_error(rc, err, "only goes with --bundle")
    rc, _, err = run(["sglang-lab", "--from-bundle", junk, "--sglang-python", sys.executable],
                     capsys)
    one_line_error(rc, err, "give one of them")


# the venv from a bundle, over the host's Python


def _host(tmp_path: Path, torch: str = "2.11.0+cu130", version: str | None = None) -> Path:
    """This Python behind a script that answers the host query with a torch of its own."""
    real = sys.executable
    sp = subprocess.run([real, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                        capture_output=True, text=True, check=True).stdout.strip()
    facts = json.dumps({"version": version or "%d.%d" % sys.version_info[:2], "torch": torch,
                        "dirs": [sp]})
    p = tmp_path / "host" / "python"
    p.parent.mkdir(parents=True)
    p.write_text(f"""#!/bin/sh
case "$2" in *getsitepackages*) echo '{facts}'; exit 0;; esac
exec {real} "$@"
""")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return p


def test_the_venv_is_made_offline_over_the_hosts_site_packages(tmp_path, pins, fake_download,
                                                               monkeypatch):
    out, m = _build(tmp_path)
    checked = []
    monkeypatch.setattr(bundle_install, "check_imports", lambda py, log: checked.append(py))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")    # never asked
    lab = tmp_path / "lab"
    py = bundle_install.install_from_bundle(out, lab, _host(tmp_path), say=lambda s: None)
    assert checked == [py]
    got = subprocess.run([str(py), "-c", "import alpha_pkg_mod, beta_mod, gamma_mod, pip; "
                          "print(alpha_pkg_mod.VERSION, beta_mod.VERSION, gamma_mod.VERSION)"],
                         capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert got.stdout.split() == ["1.0", "2.5", "0.1"], got.stderr      # pip from the host's
    assert (lab / "venv" / venv.STAMP).read_text().strip() == venv.bundle_fingerprint()
    pth = next((lab / "venv").rglob(bundle_install.HOST_PTH)).read_text()
    assert "site.addsitedir(" in pth
    # the lab and the twin take it as their own, with no install and no network
    monkeypatch.setattr(venv, "install_shims", lambda python, lab_dir: None)
    assert venv.ensure_venv(lab, say=lambda s: None) == py


def test_wrong_python_or_no_torch_is_refused_before_anything_is_made(tmp_path, pins,
                                                                       fake_download):
    out, _ = _build(tmp_path)
    with pytest.raises(LabError, match="holds wheels for Python"):
        bundle_install.install_from_bundle(out, tmp_path / "lab1",
                                           _host(tmp_path / "a", version="3.2"), say=print)
    with pytest.raises(LabError, match="has no torch"):
        bundle_install.install_from_bundle(out, tmp_path / "lab2",
                                           _host(tmp_path / "b", torch="no torch: ImportError"),
                                           say=print)
    assert not (tmp_path / "lab1" / "venv").exists() and not (tmp_path / "lab2" / "venv").exists()


def test_a_bundle_of_other_pins_is_refused(tmp_path, pins, fake_download):
    out, _ = _build(tmp_path)
    pins.write_text(PINS + "delta==9\n")
    with pytest.raises(LabError, match="other lab pins"):
        bundle_install.install_from_bundle(out, tmp_path / "lab", _host(tmp_path), say=print)


def test_a_bundle_venv_of_other_pins_is_never_reinstalled_from_an_index(tmp_path, pins):
    lab = tmp_path / "lab"
    (lab / "venv" / "bin").mkdir(parents=True)
    (lab / "venv" / "bin" / "python").write_text("")
    (lab / "venv" / venv.STAMP).write_text(venv.BUNDLE_STAMP + "0000\n")
    (lab / venv.MARKER).write_text("x\n")
    with pytest.raises(LabError, match="make a new bundle"):
        venv.ensure_venv(lab, say=print)
    assert (lab / "venv" / "bin" / "python").exists()


# --compact: stored wheels, SGLang's unused parts left out, xz


def test_a_compact_bundle_is_xz_stored_trimmed_and_installs(tmp_path, pins, monkeypatch):
    pins.write_text(PINS + "sglang==0.5.23\n")
    big = b"0123456789abcdef" * 4096                  # compresses well: stored, then xz

    def download(sel, spec, dest, log):
        for n, v in sel.wanted:
            w = _wheel(dest, n, v)
            if n != "sglang":
                continue
            with zipfile.ZipFile(w) as z:             # add the parts TRIM names, RECORDed
                members = {i.filename: z.read(i) for i in z.infolist()}
            extra = {"sglang/__init__.py": b"", "sglang/multimodal_gen/runtime/big.py": big,
                     "sglang/srt/rust_extensions/_grpc.cpython-312-x86_64-linux-gnu.so": big,
                     "sglang/srt/rust_extensions/loader.py": b"KEPT = 1\n"}
            record_name = next(k for k in members if k.endswith("RECORD"))
            members[record_name] += "".join(f"{k},,\n" for k in extra).encode()
            with zipfile.ZipFile(w, "w", zipfile.ZIP_DEFLATED) as z:
                for k, data in {**members, **extra}.items():
                    z.writestr(k, data)
    monkeypatch.setattr(bundle, "download", download)
    out, m = _build(tmp_path, compact=True)
    assert m.compression == "xz" and len(m.trimmed) == 2
    assert m.trimmed[0].startswith("sglang: sglang/multimodal_gen/* (") and "1 files" in m.trimmed[0]
    with open(out, "rb") as f:
        assert f.read(6) == b"\xfd7zXZ\x00"           # an xz stream
    with tarfile.open(out) as tf:
        sgl = next(p for p in m.packages if p.name == "sglang")
        data = tf.extractfile(f"wheels/{sgl.file}").read()
        assert hashlib.sha256(data).hexdigest() == sgl.sha256
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        names = z.namelist()
        record = z.read(next(k for k in names if k.endswith("RECORD"))).decode()
        assert all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist())
    assert "sglang/srt/rust_extensions/loader.py" in names
    assert not [n for n in names if "multimodal_gen" in n or "_grpc" in n]
    assert "multimodal_gen" not in record and "_grpc" not in record and "loader.py" in record
    # it installs like any bundle: the kept parts there, the trimmed ones not
    monkeypatch.setattr(bundle_install, "check_imports", lambda py, log: None)
    said = []
    py = bundle_install.install_from_bundle(out, tmp_path / "lab", _host(tmp_path), said.append)
    assert any("a compact bundle: left out of it sglang: sglang/multimodal_gen/*" in s
               for s in said)
    got = subprocess.run([str(py), "-c", "import sglang.srt.rust_extensions.loader as l, "
                          "importlib.util as u; print(l.KEPT, "
                          "u.find_spec('sglang.multimodal_gen') is None)"],
                         capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert got.stdout.split() == ["1", "True"], got.stderr


def test_compact_only_goes_with_bundle(capsys):
    from reports.cli import main
    assert main(["sglang-lab", "--compact", "--list"]) == 2
    err = capsys.readouterr().err
    assert "--compact only goes with --bundle" in err and err.count("\n") == 1
