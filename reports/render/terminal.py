"""The report in the terminal: the answer table and its sentences (reports/render/answer_table.py),
one line on the user's server when sglang.json is there (with the cost of ppscope's recipe where
its log is read), and where the rest is. At most 25 lines
at 100 columns for the built-in scenario and a server's evidence (tests/test_report_render.py);
the what-ifs, the attribution and the timelines are in report.md and report.html.
"""
from __future__ import annotations

import textwrap

from reports.model.report_type import Report


def server_line(rep: Report) -> str | None:
    """One line on the user's server (sglang.json), every number observed with its source."""
    srv = rep.server
    if not srv or not srv.ranks:
        return None
    rs = srv.ranks
    parts = []
    if any(r.compute_pct is not None for r in rs):
        parts.append("GPU compute % per PP rank [traces] " + " ".join(
            "-" if r.compute_pct is None else f"{r.compute_pct:.0f}" for r in rs))
    sz = [r.running_req for r in rs if r.running_req and r.running_req.max is not None]
    if sz:
        parts.append("slot size median/max [log] " + " ".join(
            f"{x.median:g}/{x.max:g}" for x in sz))
    cg = [r.cuda_graph_frac for r in rs if r.cuda_graph_frac is not None]
    if cg:
        parts.append("decode on CUDA graph [log] " + " ".join(f"{x:.0%}" for x in cg))
    if srv.dp_ranks:   # DP attention: the figures above count every DP rank's batches
        parts.append(f"DP attention, {srv.dp_ranks} DP ranks per PP rank, all counted; gen "
                     "tok/s summed over DP ranks [log] " + " ".join(
                         "-" if r.gen_tok_per_s_dp_sum is None
                         else f"{r.gen_tok_per_s_dp_sum:.0f}" for r in rs))
    return ("your server (sglang.json, observed): " + "; ".join(parts)) if parts else None


def terminal_summary(rep: Report, width: int = 100, results_label: str = "results") -> str:
    """The answer table, its sentences and the server line (`server_line`), wrapped to width."""
    from reports.render.answer_table import terminal_answer
    where = results_label.rstrip("/")
    out = []   # what the figures rest on first, one line (it names the results folder)
    if rep.scenario_aside is not None:   # the estimates are the set-aside scenario's
        pass
    elif rep.all_estimated and rep.server:
        out.append(f"every model input is estimated (no probe records in {where}/); observed: "
                   "sglang.json")
    elif rep.all_estimated:
        tr = any(p.source == "transferred" for p in rep.params)
        out.append(f"every figure is estimated{' or transferred' if tr else ''} (no records in "
                   f"{where}/)")
    out += terminal_answer(rep, width)
    srv = server_line(rep)
    if rep.recipe is not None:   # the log's readings need the recipe: what it costs
        from reports.render.recipe_line import recipe_clause
        srv = (srv + "; " if srv else "") + recipe_clause(rep.recipe)
    if srv:
        out += textwrap.wrap(srv, width, subsequent_indent="  ")
    return "\n".join(out)
