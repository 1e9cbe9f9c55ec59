"""A rendered table: what every table builder returns and every renderer (Markdown, HTML,
terminal) draws."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: tuple[bool, ...]           # right-align this column
