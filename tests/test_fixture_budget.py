"""A size budget for the test fixtures: the lab's recordings (tests/fixtures/sglang_lab/) are
most of the tree's bytes, and every clone and CI run carries them. A new recording that does
not fit is trimmed (a shorter traced window, fewer ranks; its traces `slim`med, as
microbench/sglang_lab/fixtures.py writes them) or replaces an older one."""
from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
LAB_BUDGET = 8 * MiB          # tests/fixtures/sglang_lab/ in all (7.5 MiB when this was set,
                              # its traces `slim`med: microbench/sglang_lab/fixtures.py)
ALL_BUDGET = 15 * MiB         # tests/fixtures/ in all (13.8 MiB)
FILE_BUDGET = 3 * MiB // 2    # any one fixture file (the largest: 1.1 MiB, HTA's sample trace)


def _sizes(under: str) -> dict[str, int]:
    try:
        names = subprocess.run(["git", "ls-files", "-z", under], cwd=ROOT, check=True,
                               capture_output=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):   # not a git checkout: every file there
        names = [str(p.relative_to(ROOT)) for p in (ROOT / under).rglob("*") if p.is_file()]
    return {n: (ROOT / n).stat().st_size for n in names if n and (ROOT / n).is_file()}


def test_lab_fixtures_fit_their_budget():
    lab, every = _sizes("tests/fixtures/sglang_lab"), _sizes("tests/fixtures")
    assert lab and every
    assert sum(lab.values()) <= LAB_BUDGET, f"{sum(lab.values()) / MiB:.1f} MiB of lab fixtures"
    assert sum(every.values()) <= ALL_BUDGET, f"{sum(every.values()) / MiB:.1f} MiB of fixtures"
    big = {n: round(s / MiB, 1) for n, s in every.items() if s > FILE_BUDGET}
    assert not big, f"fixture files over {FILE_BUDGET // MiB} MiB: {big}"
