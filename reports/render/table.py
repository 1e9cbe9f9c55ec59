"""A rendered table: what every table builder returns and every renderer (Markdown, HTML,
terminal) draws."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: tuple[bool, ...]           # right-align this column


def md_cell(v: Any) -> str:
    """One table cell as GitHub markdown reads it: a `|` (a file name, a flag value) escaped so
    that it stays in its cell, a line break folded to a space."""
    if v is None:
        return ""
    return " ".join(str(v).split("\n")).replace("\\|", "|").replace("|", "\\|")


def md_grid(headers, rows, numeric) -> str:
    """A GitHub-markdown table of these cells (report.md's tables)."""
    from tabulate import tabulate
    return tabulate([[md_cell(v) for v in r] for r in rows], headers=[md_cell(h) for h in headers],
                    tablefmt="github", disable_numparse=True,
                    colalign=["right" if n else "left" for n in numeric])
