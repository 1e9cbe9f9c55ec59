"""Tests read their inputs from tests/ only (tests/fixtures/): docs/ is documentation, free to
change without breaking a test. Static: reads the test sources with `ast`, imports nothing. A
path into docs/ is a string `"docs"` (as in `ROOT / "docs" / ...`) or one without spaces that
begins `docs/`."""
from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
DOCS_PATH = re.compile(r"(\.\./)*docs(/\S*)?")   # a path, not prose: no spaces


def _docs_paths(f: Path) -> list[str]:
    return [f"{f.name}:{node.lineno}: {node.value!r}"
            for node in ast.walk(ast.parse(f.read_text(), str(f)))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and DOCS_PATH.fullmatch(node.value)]


def test_no_test_reads_from_docs():
    bad = [hit for f in sorted(TESTS.rglob("*.py")) if "fixtures" not in f.parts
           for hit in _docs_paths(f)]
    assert not bad, "tests read from docs/ (copy the file into tests/fixtures/):\n" + "\n".join(bad)


def test_the_check_sees_both_ways_of_naming_docs(tmp_path):
    f = tmp_path / "t.py"
    f.write_text('ROOT / "docs" / "runs"\nopen("docs/runs/x.json")\n"""docs/ are prose."""\n'
                 '"see docs/BENCHMARKS.md"\n')
    assert sorted(h.split(":")[1] for h in _docs_paths(f)) == ["1", "2"]
