"""The report's disk cache owns only what it wrote and trusts no entry unchecked (fuzz tier, issue
classes "data loss" and "the report cache trusts any entry that decodes";
reports/base/disk_cache.py). Each case runs `ppscope report` as a user does, in its own
interpreter (an entry that blocks fails the test instead of hanging it, and a read of /dev/zero
stops at an address-space limit), with $PPSCOPE_CACHE a folder made here and then tampered with,
and asserts: the report is byte for byte the one `--no-cache` makes, and no file but the cache's
own was deleted or replaced. Entries are found and edited by their kind (`*model-run-*.json`),
so each case also runs against the cache's earlier layout, where it fails.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_fuzz_lab_ownership import tree

from reports.base import disk_cache

ROOT = Path(__file__).resolve().parents[1]
FILES = ("report.json", "report.html", "report.herd.png")
SCRIPT = 'x" onerror="alert(1)"><script>alert(document.cookie)</script>'
PNG = b"\x89PNG\r\n\x1a\n"


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))   # a report needs under 1 GiB


def _report(base: Path, cache: Path | None, name: str, *extra: str,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """`ppscope report` of no records into base/name, with the cache at `cache` (None:
    --no-cache)."""
    (base / "none").mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PPSCOPE_CACHE=str(cache) if cache else "off")
    argv = ["report", "--results", str(base / "none"), "--out", str(base / name), *extra,
            *([] if cache else ["--no-cache"])]
    return subprocess.run([sys.executable, "-c", "import sys; from reports.cli import main; "
                           "sys.exit(main())", *argv], cwd=base, env=env, capture_output=True,
                          text=True, timeout=timeout, preexec_fn=_limit_memory)


def _files(out: Path) -> dict[str, bytes]:
    return {f: (out / f).read_bytes() for f in FILES}


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    """The report made without a cache, a cache filled by the same report and one filled by
    another user's report (their own scenario, PP4, and their --observed)."""
    base = tmp_path_factory.mktemp("made")
    scenario = json.loads((ROOT / "configs" / "scenarios" / "seed-pp8.json").read_text())
    (base / "theirs.json").write_text(json.dumps({**scenario, "name": "theirs", "pp": 4, "tp": 2}))
    other = ("--scenario", str(base / "theirs.json"), "--observed", "1:10,8:20,32:30")
    for cache, name, extra in ((None, "fresh", ()), (base / "seed", "seeded", ()),
                               (base / "other", "other", other)):
        p = _report(base, cache, name, *extra)
        assert p.returncode == 0, p.stderr
    fresh = _files(base / "fresh")
    assert _files(base / "seeded") == fresh
    return {"fresh": fresh, "seed": base / "seed", "other": base / "other"}


@pytest.fixture
def cache(made, tmp_path) -> Path:
    """A copy of the filled cache, to tamper with."""
    return Path(shutil.copytree(made["seed"], tmp_path / "cache", symlinks=True))


def entry(folder: Path, kind: str, ext: str) -> Path:
    """The one entry of this kind (named `[ppscope-]<kind>-<hex>.<ext>`)."""
    (p,) = [q for q in folder.iterdir() if q.name.endswith("." + ext) and
            q.name.removeprefix("ppscope-").startswith(kind + "-")]
    return p


def rewrite(path: Path, payload: bytes, checksum: bool) -> None:
    """Give an entry another payload, keeping its header line if it has one; with `checksum`
    the header's checksum is made to fit (one who knows the format), else it is left as it was
    (an edit by hand)."""
    head, sep, _ = path.read_bytes().partition(b"\n")
    if not head.startswith(b"ppscope-cache "):
        path.write_bytes(payload)
        return
    if checksum:
        head = head.rsplit(b" ", 1)[0] + b" " + hashlib.sha256(payload).hexdigest().encode()
    path.write_bytes(head + sep + payload)


def _payload(path: Path) -> bytes:
    data = path.read_bytes()
    return data.partition(b"\n")[2] if data.startswith(b"ppscope-cache ") else data


def _scaled(obj, k: float):
    """Every float in a JSON value times k."""
    if isinstance(obj, float):
        return obj * k
    if isinstance(obj, list):
        return [_scaled(v, k) for v in obj]
    if isinstance(obj, dict):
        return {key: _scaled(v, k) for key, v in obj.items()}
    return obj


def same_report(made: dict, tmp_path: Path, cache: Path, timeout: float = 120) -> str:
    """The report made with this cache is the one made without it; its stderr."""
    p = _report(tmp_path, cache, "out", timeout=timeout)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    got = _files(tmp_path / "out")
    for f in FILES:
        assert got[f] == made["fresh"][f], f"{f} differs from the --no-cache report"
    return p.stderr


def no_temp_files(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


class TestTheCacheDeletesOnlyItsOwnFiles:
    def test_a_folder_of_the_users_files_is_refused_and_kept(self, made, tmp_path):
        d = tmp_path / "photos"
        d.mkdir()
        for i in range(300):
            (d / f"photo-{i:03d}.jpg").write_bytes(b"\xff\xd8\xff photo %d" % i)
        (d / "thesis-final.v3.tex").write_text("\\documentclass{book}\n")
        old = time.time() - 86400 * 365
        for p in d.iterdir():
            os.utime(p, (old, old))
        before = tree(d)
        err = same_report(made, tmp_path, d)
        assert tree(d) == before                # nothing deleted, nothing added
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and "cache off" in lines[0] and "PPSCOPE_CACHE" in lines[0], err
        assert str(d) in lines[0] and "empty or new folder" in lines[0]

    def test_eviction_removes_only_the_caches_own_regular_files(self, tmp_path, monkeypatch):
        d = tmp_path / "c"
        monkeypatch.setenv("PPSCOPE_CACHE", str(d))
        monkeypatch.setattr(disk_cache, "MAX_ENTRIES", 2)
        get = lambda i: disk_cache.cached("t", (i,), lambda: b'{"v": 1}', "json",  # noqa: E731
                                          decode=json.loads)
        assert get(0) == {"v": 1}               # makes the folder: the cache's own
        mine = tmp_path / "mine.txt"
        mine.write_text("keep")
        users = {"notes-1.txt": "notes", "a-b.json": "{}", "ppscope-t-notes.json": "x",
                 "ppscope-t-" + "0" * 64 + ".json.bak": "x"}
        for name, text in users.items():
            (d / name).write_text(text)
            os.utime(d / name, (1, 1))          # older than any entry
        (d / ("ppscope-t-" + "1" * 64 + ".json")).symlink_to(mine)
        (d / ("ppscope-t-" + "2" * 64 + ".json")).mkdir()
        os.utime(d / ("ppscope-t-" + "1" * 64 + ".json"), (1, 1), follow_symlinks=False)
        for i in range(1, 6):
            assert get(i) == {"v": 1}
        names = {p.name for p in d.iterdir()}
        assert set(users) <= names and all((d / n).read_text() == t for n, t in users.items())
        assert ("ppscope-t-" + "1" * 64 + ".json") in names and mine.read_text() == "keep"
        assert (d / ("ppscope-t-" + "2" * 64 + ".json")).is_dir()
        own = [p for p in d.iterdir() if p.is_file() and not p.is_symlink()
               and p.name not in users and p.name != disk_cache.MARKER]
        assert len(own) == 2                     # the two most recent entries

    def test_stale_temp_files_of_its_own_are_swept_and_no_others(self, made, tmp_path, cache):
        entry(cache, "plot-plot_timeline", "uri").unlink()     # a miss: the report writes
        stale = cache / f".ppscope-model-run-{'a' * 64}.json.k3j_x9q2.tmp"
        recent = cache / f".ppscope-model-run-{'b' * 64}.json.p0q1r2s3.tmp"
        users = cache / ".photo-001.jpg.k3j_x9q2.tmp"
        for p in (stale, recent, users):
            p.write_bytes(b"partial")
        hour_ago = time.time() - 3600
        for p in (stale, users):
            os.utime(p, (hour_ago, hour_ago))
        same_report(made, tmp_path, cache)
        assert not stale.exists() and recent.exists() and users.exists()

    def test_a_failed_write_leaves_no_temp_file(self, tmp_path, monkeypatch):
        """A full cache folder: the rename into place fails (no room for the entry)."""
        monkeypatch.setenv("PPSCOPE_CACHE", str(tmp_path / "c"))

        def full(*a, **k):
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(os, "replace", full)
        assert disk_cache.cached("t", (1,), lambda: b'{"v": 1}', "json",
                                 decode=json.loads) == {"v": 1}
        no_temp_files(tmp_path / "c")


class TestAnEntryIsUsedOnlyWhenItIsThisKeysOwn:
    def test_an_edited_model_run_entry_is_recomputed(self, made, tmp_path, cache):
        p = entry(cache, "model-run", "json")
        rewrite(p, json.dumps(_scaled(json.loads(_payload(p)), 3.0)).encode(), checksum=False)
        same_report(made, tmp_path, cache)

    def test_an_entry_copied_from_another_report_is_recomputed(self, made, tmp_path, cache):
        p = entry(cache, "model-run", "json")
        p.write_bytes(entry(made["other"], "model-run", "json").read_bytes())
        same_report(made, tmp_path, cache)

    def test_a_swapped_herd_picture_is_recomputed(self, made, tmp_path, cache):
        p, theirs = entry(cache, "herd-png", "png"), entry(made["other"], "herd-png", "png")
        assert _payload(p) != _payload(theirs)
        p.write_bytes(theirs.read_bytes())
        same_report(made, tmp_path, cache)

    def test_a_herd_picture_that_is_not_a_png_is_recomputed(self, made, tmp_path, cache):
        rewrite(entry(cache, "herd-png", "png"), b"GIF89a" + bytes(64), checksum=True)
        same_report(made, tmp_path, cache)

    @pytest.mark.parametrize("uri", [
        SCRIPT, "data:image/png;base64,AAAA" + SCRIPT,
        "data:image/png;base64,R0lGODlhAQABAAAAACw=",            # base64, but a GIF
        "data:image/png;base64,iVBORw0KGgo="])       # a PNG's signature alone
    def test_a_plot_uri_is_checked_before_it_reaches_the_page(self, made, tmp_path, cache, uri):
        plots = [p for p in cache.iterdir() if "plot-" in p.name and p.name.endswith(".uri")]
        assert plots
        for p in plots:
            rewrite(p, uri.encode(), checksum=True)
        same_report(made, tmp_path, cache)
        assert "<script>" not in (tmp_path / "out" / "report.html").read_text()

    def test_a_fifo_entry_does_not_block_and_is_kept(self, made, tmp_path, cache):
        p = entry(cache, "model-run", "json")
        p.unlink()
        os.mkfifo(p)
        same_report(made, tmp_path, cache, timeout=60)
        assert p.is_fifo()
        no_temp_files(cache)

    def test_a_link_to_dev_zero_is_not_read(self, made, tmp_path, cache):
        for kind, ext in (("model-run", "json"), ("herd-png", "png"), ("plot-plot_timeline", "uri")):
            p = entry(cache, kind, ext)
            p.unlink()
            p.symlink_to("/dev/zero")
        same_report(made, tmp_path, cache, timeout=60)
        links = [p for p in cache.iterdir() if p.is_symlink()]
        assert len(links) == 3 and all(os.readlink(p) == "/dev/zero" for p in links)
        no_temp_files(cache)

    def test_a_folder_entry_is_a_miss_and_leaves_no_temp_file(self, made, tmp_path, cache):
        p = entry(cache, "herd-png", "png")
        p.unlink()
        p.mkdir()
        (p / "yours.txt").write_text("keep")
        same_report(made, tmp_path, cache)
        assert (p / "yours.txt").read_text() == "keep"
        no_temp_files(cache)
