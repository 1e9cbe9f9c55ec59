"""Packages import one way (reports/base <- microbench/kit <- topology <- probes; reports never
imports torch, microbench or topology; microbench never imports topology), no module imports
itself through others, and no private name (`_x`) is imported across modules. Static: reads the
source with `ast`, imports nothing."""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKGS = ("reports", "microbench", "topology")
# package -> packages it must never import (at module level or inside a function)
FORBIDDEN = {"reports": ("torch", "microbench", "topology", "cupy"), "microbench": ("topology",)}


@lru_cache(maxsize=None)
def _modules() -> dict[str, Path]:
    """Every module of the tree, read once for the whole file (`_imports` is cached too)."""
    out = {}
    for pkg in PKGS:
        for f in (ROOT / pkg).rglob("*.py"):
            name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = f
    return out


@lru_cache(maxsize=None)
def _imports(f: Path) -> list[tuple[str, list[str]]]:
    out = []
    for node in ast.walk(ast.parse(f.read_text(), str(f))):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [a.name for a in node.names]))
    return out


def test_packages_import_one_way_and_reports_never_imports_torch():
    bad = []
    for name, f in _modules().items():
        for mod, _ in _imports(f):
            for banned in FORBIDDEN.get(name.split(".")[0], ()):
                if mod == banned or mod.startswith(banned + "."):
                    bad.append(f"{name} imports {mod}")
    assert not bad, bad


def test_no_module_cycle():
    mods = _modules()
    edges = {m: set() for m in mods}
    for m, f in mods.items():
        for mod, names in _imports(f):
            for cand in [mod] + [f"{mod}.{n}" for n in names]:
                if cand in mods and cand != m:
                    edges[m].add(cand)
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in edges[m]:
            if state.get(n) == 1:
                raise AssertionError(" -> ".join(path[path.index(n):] + [n]) if n in path
                                     else f"{m} -> {n}")
            if n not in state:
                visit(n, path + [n])
        state[m] = 2
    for m in mods:
        if m not in state:
            visit(m, [m])


def test_no_private_name_crosses_modules():
    bad = []
    for name, f in _modules().items():
        for mod, names in _imports(f):
            if mod.split(".")[0] in PKGS and mod != name:
                bad += [f"{name}: from {mod} import {n}" for n in names if n.startswith("_")]
    assert not bad, bad


# The probe side (microbench/, topology/) measures and reads; the model and the renderers are
# the analysis side. A probe reaches them only from its command module (where it prints a card
# or a table), the benchmarks that print figures (microbench/bench/), and the lab
# driver (`LAB_DRIVER`), which drives SGLang's server and ppscope's own commands end to end;
# its tables of what they found are the analysis side (reports/lab/).
ANALYSIS = ("reports.model", "reports.render", "reports.report_build", "reports.report_cli",
            "reports.answer", "reports.lab")

# The lab's driver: it starts SGLang's server and runs ppscope's own model beside it (lab,
# twin, the twin's held-out check); rounds reads a traced window with microbench/sglang's
# reader and hands it to its analysis (reports/lab/rounds.py).
LAB_DRIVER = ("microbench.sglang_lab.lab", "microbench.sglang_lab.twin.run",
              "microbench.sglang_lab.twin.observed", "microbench.sglang_lab.rounds")


def _command_module(name: str) -> bool:
    from reports.base.probes import cli_modules
    leaf = name.rsplit(".", 1)[-1]
    return (name in cli_modules() or leaf == "cli" or leaf.endswith("_cli")
            or name.startswith("microbench.bench.") or name in LAB_DRIVER)


def test_probe_side_reaches_the_analysis_only_from_its_command_module():
    bad = []
    for name, f in _modules().items():
        if name.split(".")[0] not in ("microbench", "topology") or _command_module(name):
            continue
        for mod, names in _imports(f):
            for cand in [mod] + [f"{mod}.{n}" for n in names]:
                if cand.startswith(ANALYSIS):
                    bad.append(f"{name} imports {cand}")
    assert not bad, bad


def test_every_registered_command_is_a_module_that_obeys_the_layering():
    """reports/cli.py loads its sub-commands by name (reports/base/probes.py): each name is a
    module of this tree, and the one-way rule holds for it like for any import."""
    from reports.base.probes import cli_modules
    mods = _modules()
    for name in cli_modules():
        assert name in mods, f"{name}: registered but not a module"
        top = name.split(".")[0]
        for banned in FORBIDDEN.get(top, ()):
            assert not any(m == banned or m.startswith(banned + ".")
                           for m, _ in _imports(mods[name])), f"{name} imports {banned}"
    # and the console script imports nothing of the probe side by itself: only by these names
    assert not [m for m, _ in _imports(mods["reports.cli"])
                if m.split(".")[0] in ("microbench", "topology")]


# reports/model's floors, bottom up. A module imports only its own floor or one below; of the
# two pipelines on floor 1, the scenario's and the observed server's, neither imports the other.
# The top files not named here (the report's type, verdicts, attribution, compare, next steps,
# summaries) are the top floor; causes.py and settings_change.py import nothing of the model,
# and both pipelines and the simulator name causes and settings changes, so they are the ground.
MODEL = "reports.model"
FLOORS = {"sim": 0, "causes": 0, "settings_change": 0,
          "scenario": 1, "observed": 1,
          "checks": 2}
TOP = 3


def _room(name: str) -> str:
    """The folder of reports/model a module sits in, or its own name for a top file."""
    return name.split(".")[2]


def _floor(name: str) -> int:
    return FLOORS.get(_room(name), TOP)


def _model_arrows() -> set[tuple[str, str]]:
    """Every import inside reports/model between two of its modules (a function's imports too):
    `from pkg import mod` points at the module, `from mod import name` at mod."""
    mods = _modules()
    out = set()
    for name, f in mods.items():
        if not name.startswith(MODEL + "."):
            continue
        for mod, names in _imports(f):
            for t in [f"{mod}.{n}" if f"{mod}.{n}" in mods else mod for n in names] or [mod]:
                if t.startswith(MODEL + ".") and t in mods and t != name:
                    out.add((name, t))
    return out


def test_the_model_imports_down_its_floors_and_the_pipelines_never_each_other():
    bad = []
    for a, b in sorted(_model_arrows()):
        if _room(a) == _room(b):
            continue
        if _floor(b) > _floor(a):
            bad.append(f"{a} imports {b}: up from floor {_floor(a)} to {_floor(b)}")
        elif _floor(a) == _floor(b) == 1:
            bad.append(f"{a} imports {b}: the two pipelines never import each other")
    assert not bad, bad


