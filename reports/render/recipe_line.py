"""The report's line on ppscope's recipe (report.json `recipe`, reports/model/report_type.py
`RecipeNote`): where a report reads the server's log, what the recipe that log needs costs the
server as the lab measured it, or that it is not measured; and whether the figures include it.
The recipe's cost is never taken off the diagnosis: where its interval holds zero the line says
so, where the interval excludes zero it says the figures include it. `recipe_line` for report.md
and report.html, `recipe_terminal_line` within TERMINAL_CHARS for the terminal's answer."""
from __future__ import annotations

from reports.model.report_type import RecipeNote

TERMINAL_CHARS = 100


def _change(rc) -> str:
    ci = rc.cost_ci
    return f"{rc.cost_pct:+.1f}%" + (f" ({ci[0]:+.1f} to {ci[1]:+.1f}%)" if ci else "")


def _included(rc) -> str:
    if rc.significant:
        return "the interval excludes zero, so the figures here include it (not taken off)"
    if rc.cost_ci is None:
        return "one run on a side, no interval; not taken off the diagnosis"
    return "no significant change; not taken off the diagnosis"


def recipe_line(note: RecipeNote) -> str:
    flags = " ".join(note.flags)
    head = f"ppscope's recipe ({flags}, which the server log's readings need)"
    rc = note.measured
    if rc is None:
        return (f"{head}: its cost to the server is not measured (no {note.record}; the lab "
                "measures it: `ppscope sglang-lab --recipe`, then `python -m "
                "reports.lab.recipe`); not taken off the diagnosis.")
    return (f"{head}: {_change(rc)} decode step against SGLang's defaults "
            f"({rc.level:.0%} interval), measured in the lab on {rc.machine} over "
            f"{len(rc.rounds)} round{'s' if len(rc.rounds) != 1 else ''} at C={rc.concurrency} "
            f"({note.record}): {_included(rc)}.")


def recipe_terminal_line(note: RecipeNote) -> str:
    """One line of at most TERMINAL_CHARS."""
    rc = note.measured
    if rc is None:
        return "ppscope's recipe (metrics, a log line per step): cost not measured; not taken off"
    tail = "the figures include it" if rc.significant else "not taken off"
    # within TERMINAL_CHARS for any figure a record may hold (recipe_cost.py `COST_RANGE`)
    return f"ppscope's recipe: {_change(rc)} decode step in the lab; {tail}"
