"""How the commands ppscope prints should call ppscope and Python on this machine, so that they
run as pasted: `ppscope` when the `ppscope` on PATH belongs to the running environment, else
that environment's own script (relative to the working folder when it lies inside it, as
`.venv/bin/ppscope` does after `make`), else `<python> -m reports.cli`."""
from __future__ import annotations

import shutil
import sys
import sysconfig
from pathlib import Path


def _shown(p: Path) -> str:
    try:
        rel = str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(p)
    return rel if "/" in rel else f"./{rel}"


def ppscope_command() -> str:
    own = Path(sysconfig.get_path("scripts")).absolute() / "ppscope"
    on_path = shutil.which("ppscope")
    if on_path and own.exists() and Path(on_path).absolute() == own:
        return "ppscope"
    if own.exists():
        return _shown(own)
    return f"{python_command()} -m reports.cli"


def python_command() -> str:
    """`python3` when the python3 on PATH is this environment's (a venv's python and python3
    sit side by side), else this interpreter's path."""
    exe = Path(sys.executable).absolute()
    on_path = shutil.which("python3")
    if on_path and Path(on_path).absolute().parent == exe.parent:
        return "python3"
    return _shown(exe)
