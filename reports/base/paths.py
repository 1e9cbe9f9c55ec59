"""Where ppscope finds its shipped configs and writes its results."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS = REPO_ROOT / "configs"


def results_dir() -> Path:
    """`results/` in the current directory unless PPSCOPE_RESULTS says otherwise."""
    return Path(os.environ.get("PPSCOPE_RESULTS", "results"))


def default_record_path(probe: str) -> Path:
    return results_dir() / f"{probe}.json"
