"""The report's disk cache (reports/base/disk_cache.py, reports/report_run.py): a report made
from the cache is byte for byte the one made without it, and no change of input or code can
read an entry made before the change."""
import pytest

from reports.base import disk_cache
from reports.cli import main

FILES = ("report.json", "report.md", "report.html", "report.trace.json", "report.herd.png")


def _report(tmp_path, name, *extra):
    out = tmp_path / name
    assert main(["report", "--results", str(tmp_path / "none"), "--out", str(out), *extra]) == 0
    return {f: (out / f).read_bytes() for f in FILES}


def test_cached_report_is_the_uncached_one(tmp_path, monkeypatch):
    (tmp_path / "none").mkdir()
    monkeypatch.setenv("PPSCOPE_CACHE", str(tmp_path / "cache"))
    first = _report(tmp_path, "a")
    entries = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert any(n.startswith("ppscope-model-run-") for n in entries)
    assert any(n.startswith("ppscope-herd-png-") for n in entries)
    again = _report(tmp_path, "b")
    fresh = _report(tmp_path, "c", "--no-cache")
    assert again == first == fresh
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == entries
    # other inputs: other entries, other numbers
    _report(tmp_path, "d", "--observed", "1:30,8:70")
    assert len(list((tmp_path / "cache").iterdir())) > len(entries)


def test_key_follows_code_and_inputs(monkeypatch):
    k = disk_cache.key_of("x", (1, 2.0), "a")
    assert k == disk_cache.key_of("x", (1, 2.0), "a")
    assert k != disk_cache.key_of("x", (1, 2.0000001), "a") != disk_cache.key_of("y", (1, 2.0), "a")
    monkeypatch.setattr(disk_cache, "code_version", lambda: "another version")
    assert disk_cache.key_of("x", (1, 2.0), "a") != k
    with pytest.raises(ValueError, match="no value repr"):
        disk_cache.key_of("x", object())


def test_a_broken_entry_is_recomputed(tmp_path, monkeypatch):
    monkeypatch.setenv("PPSCOPE_CACHE", str(tmp_path))
    calls = []

    def compute():
        calls.append(1)
        return b'{"v": 1}'
    import json
    get = lambda: disk_cache.cached("t", (1,), compute, "json", decode=json.loads)  # noqa: E731
    assert get() == {"v": 1} and get() == {"v": 1} and len(calls) == 1
    (entry,) = tmp_path.glob("ppscope-t-*.json")
    entry.write_bytes(b'{"v": ')          # cut short
    assert get() == {"v": 1} and len(calls) == 2
    monkeypatch.setenv("PPSCOPE_CACHE", "off")
    assert get() == {"v": 1} and len(calls) == 3
    monkeypatch.setenv("PPSCOPE_CACHE", str(tmp_path))    # no value repr: never cached
    assert disk_cache.cached("t", (object(),), compute, "json", decode=json.loads) == {"v": 1}
    assert len(calls) == 4 and len(list(tmp_path.glob("ppscope-t-*"))) == 1
