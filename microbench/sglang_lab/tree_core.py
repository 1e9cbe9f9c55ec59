"""Which radix-tree core the lab's CPU server runs: SGLang's Rust core where it runs with the
installed torch, else SGLang's Python core, through SGLang's own switch
`SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND` (sglang/srt/environ.py, default "rust").

SGLang falls back to its Python core by itself only for the gaps it knows (a torch outside 2.11 to
2.14, no extension; `_rust_fallback_reason` in mem_cache/unified_cache/tree_core_registry.py).
Its bundled extension is built against the torch it pins (2.14.1), and under torch 2.11 it loads
and then panics at the first insert (`Rust TreeCore panicked: ... UnknownKind(20)`), which kills
the scheduler at the first request. No rule on the version tells where it runs, so the lab asks:
`boot/ppscope_lab_probe_tree_core.py` runs one insert and match through the Rust core in the
lab's Python (a few seconds, once per interpreter and run); anything but `rust ok` picks the
Python core, with the probe's reason. A value you set yourself (in the environment, or a plan
group's env) is kept and said to be yours.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from microbench.sglang_lab.lab_env import child_env

TREE_CORE_ENV = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"
PROBE = Path(__file__).resolve().parent / "boot" / "ppscope_lab_probe_tree_core.py"
PROBE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class TreeCore:
    backend: str      # "rust" (SGLang's default) or "python"
    why: str          # one line: the probe's answer, or that the value was given


def choose_tree_core(python: Path, given: str | None = None) -> TreeCore:
    """The core a CPU server of `python` runs; `given`: a value set in the server's own env."""
    given = given or os.environ.get(TREE_CORE_ENV)
    if given:
        return TreeCore(given, f"{TREE_CORE_ENV}={given} set by you")
    return probe_tree_core(Path(python))


@lru_cache(maxsize=8)
def probe_tree_core(python: Path) -> TreeCore:
    try:
        out = subprocess.run([str(python), str(PROBE)], capture_output=True, text=True,
                             timeout=PROBE_TIMEOUT_S, env=child_env(python, "cpu"),
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return TreeCore("python", f"the probe of SGLang's Rust core gave no answer within "
                                  f"{PROBE_TIMEOUT_S:.0f} s")
    except OSError as e:
        return TreeCore("python", f"the probe of SGLang's Rust core did not start "
                                  f"({e.strerror or e})")
    last = (out.stdout.strip().splitlines() or [""])[-1].strip()
    if out.returncode == 0 and last == "rust ok":
        return TreeCore("rust", "SGLang's Rust core ran the probe's insert and match with this "
                                "torch")
    if out.returncode == 0 and last.startswith("rust fails: "):
        return TreeCore("python", f"SGLang's Rust core failed the probe: "
                                  f"{last[len('rust fails: '):]}")
    err = (out.stderr.strip().splitlines() or [last or "no output"])[-1].strip()
    how = (f"was killed by signal {-out.returncode}" if out.returncode < 0
           else f"exited with {out.returncode}")
    return TreeCore("python", f"the probe of SGLang's Rust core {how}: {err[:200]}")
