"""The herd of an observed server, drawn: its own traced forwards beside the model of the same loop.

What it shows: two panels on one time axis, one lane per PP rank, one bar per forward, colour =
micro-batch slot, number = requests in it. Top: the forwards SGLang ran, as its per-rank traces
recorded them (`LoopProfile.forwards`, kept by microbench/sglang/forward_window.py: a few rounds
from the middle of the traced window). Bottom: the pipeline model of that loop (the diagnosis'
`modelled` run, every observed cause on: reports/report_run.py `ModelRun.observed`), a window of
the same length from the middle of its steady loop.

The slot of a traced forward: SGLang visits its `pp_loop_size` slots round-robin, one per loop
iteration (srt/managers/scheduler_pp_mixin.py `event_loop_pp`, `for mb_id in
range(self.pp_loop_size)`), so rank 0's slot is its iteration modulo the slot count (which slot
is 0 is not known; colours only tell slots apart). A later rank runs the micro-batch the rank
before it sent, so its forward takes the slot of that rank's latest forward that ended before
it started.
"""
from __future__ import annotations

import bisect

from reports.base.payloads.sglang import LoopProfile
from reports.model.sim.pipeline_model import Span
from reports.render.timeline_plot import Figure, cached_png, lanes_png, slots_text, window
from reports.report_run import Lanes

FILE = "report.observed-herd.png"


def traced_spans(loop: LoopProfile, slots: int) -> tuple[Span, ...]:
    """The kept forwards as Spans, each with its slot (module docstring); batch 0 = unknown."""
    by_rank: dict[int, list] = {}
    for f in sorted(loop.forwards, key=lambda f: f.start_us):
        by_rank.setdefault(f.rank, []).append(f)
    out: list[Span] = []
    prev: list[tuple[float, int]] = []      # (end, slot) of the rank before, by end
    for r in sorted(by_rank):
        mine = []
        ends = [e for e, _ in prev]
        for f in by_rank[r]:
            j = bisect.bisect_right(ends, f.start_us) - 1
            slot = prev[j][1] if prev and j >= 0 else f.visit % slots
            mine.append(Span(r, slot, f.batch or 0, f.start_us, f.end_us))
        out += mine
        prev = sorted((s.end_us, s.slot) for s in mine)
    return tuple(sorted(out, key=lambda s: (s.start_us, s.rank)))


def decode_sizes(loop: LoopProfile, spans: tuple[Span, ...]) -> tuple[int, ...]:
    """Requests per slot as rank 0's last decode forward of each slot in the window shows."""
    dec = {(f.rank, f.start_us) for f in loop.forwards if f.mode == "DECODE"}
    last: dict[int, int] = {}
    for s in spans:
        if s.rank == 0 and (s.rank, s.start_us) in dec:
            last[s.slot] = s.batch
    return tuple(last[k] for k in sorted(last))


def observed_herd_figure(rep, loop: LoopProfile | None, model: Lanes | None,
                         use_cache: bool = True) -> Figure | str:
    """The figure, or the one-line reason it is not drawn."""
    if loop is None:
        return ("the traced loop is not drawn: sglang.json has no loop profile (give "
                "`ppscope sglang` the server's traces, --traces)")
    if not loop.forwards:
        return ("the traced loop is not drawn: sglang.json keeps no traced forwards (read "
                "the traces again with this version of `ppscope sglang`)")
    dg = rep.diagnosis
    slots = getattr(getattr(dg, "deployment", None), "slots", None)
    if model is None or not slots:
        return "the traced loop is not drawn: the report could not model it (see the diagnosis)"
    traced = traced_spans(loop, slots)
    width = max(s.end_us for s in traced) / 1e3
    obs = getattr(dg, "observed_tok_per_s", None)
    sizes = decode_sizes(loop, traced)
    top = (f"as traced: {slots_text(sizes)} (rank 0's last decode per slot)"
           + (f", {obs:.1f} tok/s observed" if obs else ""))
    bottom = (f"{model.label}: {slots_text(model.slot_sizes)}, {model.tok_per_s:.1f} tok/s "
              "(modelled)")
    panels = [(top, traced), (bottom, window(model.spans, width))]
    png = cached_png("observed-herd-png", (panels, width),
                     lambda: lanes_png(panels, width, "ms (traced window; model: steady loop)"),
                     use_cache)
    pp = 1 + max(s.rank for s in traced)
    caption = (f"The loop your server ran, from its own traces ({len(traced)} forwards of {pp} "
               f"PP ranks over {width:.0f} ms of the traced window, prefill "
               f"forwards included), beside the model of the same loop ({slots} slots, every "
               "observed cause on), one time axis: one lane per PP rank, colour = micro-batch "
               "slot, number = requests in it. Which slot is which is not in the traces: "
               "colours tell slots apart only.")
    return Figure(png, FILE, caption)
