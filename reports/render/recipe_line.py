"""The report's line on ppscope's recipe (report.json `recipe`, reports/model/report_type.py
`RecipeNote`): where a report reads the server's log, what the recipe that log needs costs the
server as the lab measured it, or that it is not measured; and whether the figures include it.
The recipe's cost is never taken off the diagnosis: where its interval holds zero the line says
so, where the interval excludes zero it says the figures include it. `recipe_line` for report.md
and report.html, `recipe_clause` for the terminal's server line (reports/render/terminal.py)."""
from __future__ import annotations

from reports.model.report_type import RecipeNote

CLAUSE_CHARS = 46


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


def recipe_clause(note: RecipeNote) -> str:
    """The terminal's clause, tagged as the server line tags its sources ([log], [traces]):
    short enough to join that line without adding one to the terminal's answer (at most
    CLAUSE_CHARS for any figure a record may hold, recipe_cost.py `COST_RANGE`)."""
    rc = note.measured
    if rc is None:
        return "recipe's cost [lab]: not measured"
    return (f"recipe's cost [lab] {rc.cost_pct:+.1f}%, "
            + ("in the figures" if rc.significant else "not taken off"))
