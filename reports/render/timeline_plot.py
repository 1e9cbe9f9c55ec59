"""The herd, drawn: the modelled loop as a stage x time timeline at the concurrency where the
herd's share of the gap is largest, as deployed and under the recommended setting, one time axis.

What it shows: one lane per PP rank, one bar per GPU forward, one colour per micro-batch slot,
the number in a bar = requests in that micro-batch. With a burst of C requests in one slot, one
bar walks down the lanes while the other GPUs wait; with the recommended setting the same
requests fill more slots and the lanes fill up.

Where it comes from: `reports/report_run.py` `HerdPair` (the pipeline model's spans, the same
simulator runs as report.json's numbers). The window is one stretch of the steady loop taken from
the middle of the simulated run (the first rounds fill the pipeline, the last drain it), two
decode steps of the loop as deployed long, the same length in both panels.

Plots use matplotlib's Agg canvas (no pyplot), imported only when a figure is drawn; the PNG is kept in the
disk cache (reports/base/disk_cache.py) keyed by the spans and this module's code.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

from reports.model.sim.pipeline_model import Span
from reports.report_run import HerdPair, Lanes

STEPS_SHOWN = 2          # decode steps of the loop as deployed in the window


def step_ms(x: Lanes) -> float:
    """One decode step (every request advances one token) of the modelled loop, ms."""
    return sum(x.slot_sizes) / x.tok_per_s * 1e3 if x.tok_per_s > 0 else 0.0


def window(spans: tuple[Span, ...], width_ms: float) -> tuple[Span, ...]:
    """The forwards in a `width_ms` window from a rank-0 forward near the middle of the run
    (steady state), shifted to start at 0 and clipped to the window."""
    if not spans or width_ms <= 0:
        return ()
    end = max(s.end_us for s in spans)
    mid = max(0.0, (end - width_ms * 1e3) / 2)
    starts = [s.start_us for s in spans if s.rank == 0] or [min(s.start_us for s in spans)]
    t0 = min(starts, key=lambda t: abs(t - mid))
    t1 = t0 + width_ms * 1e3
    return tuple(Span(s.rank, s.slot, s.batch, max(s.start_us, t0) - t0, min(s.end_us, t1) - t0)
                 for s in spans if s.end_us > t0 and s.start_us < t1)


def slots_text(sizes: tuple[int, ...]) -> str:
    """Occupied slots: "1 slot of 8", "8 slots of 1", or the sizes listed."""
    occ = [n for n in sizes if n]
    if not occ:
        return "no occupied slot"
    if len(set(occ)) == 1:
        return f"{len(occ)} slot{'s' if len(occ) > 1 else ''} of {occ[0]}"
    return "slots of " + " ".join(map(str, occ))


def panel_title(x: Lanes) -> str:
    return f"{x.label}: {slots_text(x.slot_sizes)}, {x.tok_per_s:.1f} tok/s (modelled)"


def herd_caption(pair: HerdPair, source: str) -> str:
    """What the figure shows, with each panel's tok/s and where the numbers come from."""
    b, a = pair.before, pair.after
    share = f" (the herd is {pair.share:.0%} of the gap there)" if pair.share is not None else ""
    pp = 1 + max((s.rank for s in b.spans), default=0)
    occ = [n for n in b.slot_sizes if n]
    walk = (f": one micro-batch of {occ[0]} walks down the {pp} GPUs and each waits for it"
            if len(occ) == 1 and pp > 1 else "")
    after = (f"; under {a.label}, {slots_text(a.slot_sizes)}, {a.tok_per_s:.1f} tok/s "
             f"({a.tok_per_s / b.tok_per_s - 1:+.0%})" if a and b.tok_per_s else
             "; no setting is recommended, so no second panel")
    return (f"The herd at C={pair.concurrency}{share}. As deployed, {slots_text(b.slot_sizes)}, "
            f"{b.tok_per_s:.1f} tok/s{walk}{after}. Modelled ({source}): one lane per PP rank, "
            f"one bar per forward, colour = micro-batch slot, number = requests in it; "
            f"{STEPS_SHOWN} decode steps as deployed ({STEPS_SHOWN * step_ms(b):.0f} ms) of the "
            "steady loop, same time axis in both panels.")


def herd_png(pair: HerdPair) -> bytes:
    """The figure as PNG bytes (drawn afresh: `cached_herd_png` keeps it)."""
    panels = [pair.before] + ([pair.after] if pair.after else [])
    width = STEPS_SHOWN * step_ms(pair.before)
    return lanes_png([(panel_title(x), window(x.spans, width)) for x in panels], width,
                     "ms (modelled, steady loop)")


def lanes_png(panels: list[tuple[str, tuple[Span, ...]]], width_ms: float, xlabel: str) -> bytes:
    """Stacked stage x time panels on one time axis [0, width_ms]: (title, spans from 0) each;
    one lane per PP rank, colour = slot, number = requests in the micro-batch."""
    import matplotlib
    # matplotlib's defaults whatever the process set before (report.html's plots set their own
    # rcParams): the same spans always give the same bytes. A Figure of its own, no pyplot:
    # nothing global is left behind, and pyplot's import is not paid
    with matplotlib.rc_context(matplotlib.rcParamsDefault):
        return _draw(panels, width_ms, xlabel)


def _draw(panels, width, xlabel) -> bytes:
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure
    pp = 1 + max((s.rank for _, spans in panels for s in spans), default=0)
    fig = Figure(figsize=(10, len(panels) * (0.15 * pp + 0.5) + 0.3))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)
    cmap = colormaps["tab20"]
    for ax, (title, spans) in zip(axes[:, 0], panels):
        # every bar of a panel in one collection (a call per bar cost most of the drawing)
        boxes, colours = [], []
        for s in spans:
            x0, x1, y0, y1 = s.start_us / 1e3, s.end_us / 1e3, s.rank - 0.42, s.rank + 0.42
            boxes.append(((x0, y0), (x0, y1), (x1, y1), (x1, y0)))
            colours.append(cmap(s.slot % 20))
            w = x1 - x0
            if w > width / 90:
                ax.text(x0 + w / 2, s.rank, str(s.batch), ha="center", va="center", fontsize=7)
        ax.add_collection(PolyCollection(boxes, facecolors=colours, edgecolors="white",
                                         linewidths=0.4))
        ax.set_title(title, fontsize=9, loc="left")
        ax.set_ylim(pp - 0.5, -0.5)
        ax.set_yticks(range(pp))
        ax.set_ylabel("PP rank", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.spines[["top", "right"]].set_visible(False)
    axes[-1, 0].set_xlim(0, width)
    axes[-1, 0].set_xlabel(xlabel, fontsize=8)
    fig.tight_layout(h_pad=0.6)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def cached_png(kind: str, key, draw, use_cache: bool = True) -> bytes:
    """draw() kept in the disk cache under `key` and matplotlib's version; a PNG, drawn or read
    back (reports/render/png_data.py), or ValueError."""
    from importlib.metadata import PackageNotFoundError, version

    from reports.base.disk_cache import cached
    from reports.render.png_data import checked_png
    try:
        mpl = version("matplotlib")
    except PackageNotFoundError:
        mpl = None
    return cached(kind, (key, mpl), draw, "png", decode=checked_png, enabled=use_cache)


def cached_herd_png(pair: HerdPair, use_cache: bool = True) -> bytes:
    return cached_png("herd-png", pair, lambda: herd_png(pair), use_cache)


@dataclass(frozen=True)
class Figure:
    """A figure the report shows at its top: PNG bytes, the file report.md links, the caption."""
    png: bytes
    file: str
    caption: str


def figure_source(rep) -> str:
    """Where the drawn numbers come from, for the caption."""
    inputs = ("every input estimated or transferred" if rep.all_estimated else
              "measured inputs where records exist, the rest estimated")
    return f"pipeline model, scenario {rep.scenario}; {inputs}"


def herd_figure(rep, pair: HerdPair | None, file: str = "report.herd.png",
                use_cache: bool = True) -> Figure | None:
    # a traced server that is not the scenario's deployment: the scenario's loop is not the
    # server's, so it does not head that server's report (its own lanes: observed_herd.py)
    if pair is None or not pair.before.spans or rep.scenario_differs:
        return None
    return Figure(cached_herd_png(pair, use_cache), file, herd_caption(pair, figure_source(rep)))
