"""report.json -> one self-contained HTML file: the Markdown tables plus plots as base64 PNGs.

Plots (matplotlib, Agg backend, imported only here): per-stage cost vs roofline floor;
tok/s vs concurrency (ideal / modelled / observed); the simulated pipeline timeline; a heatmap
of measured hop cost between GPUs when topology.json has `hops`. No external URLs.
"""
from __future__ import annotations

import base64
import html
import io
from typing import Any

from reports.pipeline_model import Span


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def plots(rep: dict[str, Any], spans: tuple[Span, ...], hops: list[dict] | None) -> list[tuple[str, str]]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    sc = rep["stage_cost"][-1]
    fig, ax = plt.subplots(figsize=(7, 3))
    x = range(len(sc["modelled_us"]))
    ax.bar([i - 0.2 for i in x], [v / 1e3 for v in sc["floor_us"]], 0.4, label="roofline floor")
    ax.bar([i + 0.2 for i in x], [v / 1e3 for v in sc["modelled_us"]], 0.4, label="modelled")
    ax.set_xlabel("PP stage")
    ax.set_ylabel(f"ms per forward (b={sc['batch']})")
    ax.legend()
    out.append(("Per-stage cost vs floor", _png(fig)))

    c = rep["concurrency"]
    fig, ax = plt.subplots(figsize=(7, 3))
    xs = [r["concurrency"] for r in c]
    ax.plot(xs, [r["ideal_tok_per_s"] for r in c], "o--", label="ideal")
    ax.plot(xs, [r["predicted"] for r in c], "o-", label="modelled")
    ob = [(r["concurrency"], r["observed"]) for r in c if r["observed"]]
    if ob:
        ax.plot(*zip(*ob), "s", label="observed")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("decode tok/s")
    ax.legend()
    out.append(("tok/s vs concurrency", _png(fig)))

    if spans:
        fig, ax = plt.subplots(figsize=(9, 3))
        t0 = min(s.start_us for s in spans)
        cmap = plt.get_cmap("tab20")
        for s in spans:
            ax.broken_barh([((s.start_us - t0) / 1e3, (s.end_us - s.start_us) / 1e3)],
                           (s.rank - 0.4, 0.8), color=cmap(s.slot % 20))
        ax.set_xlabel("ms (simulated)")
        ax.set_ylabel("PP rank")
        ax.invert_yaxis()
        out.append((f"Simulated pipeline timeline (C={max(xs)}, colour = slot)", _png(fig)))

    if hops:
        n = 1 + max(max(int(h["src"]), int(h["dst"])) for h in hops)
        grid = [[float("nan")] * n for _ in range(n)]
        for h in hops:
            if h.get("hop_us") is not None:
                grid[int(h["src"])][int(h["dst"])] = float(h["hop_us"])
        fig, ax = plt.subplots(figsize=(4, 3.5))
        im = ax.imshow(grid, cmap="viridis")
        fig.colorbar(im, ax=ax, label="hop us")
        ax.set_xlabel("dst GPU")
        ax.set_ylabel("src GPU")
        out.append(("Measured PP hop cost between GPUs", _png(fig)))
    return out


def render_html(rep: dict[str, Any], md: str, spans: tuple[Span, ...] = (),
                hops: list[dict] | None = None) -> str:
    imgs = "\n".join(f"<h2>{html.escape(t)}</h2><img alt=\"{html.escape(t)}\" src=\"{src}\">"
                     for t, src in plots(rep, spans, hops))
    return ("<!doctype html><html><head><meta charset=\"utf-8\">"
            f"<title>ppscope report: {html.escape(rep['scenario'])}</title>"
            "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
            "pre{white-space:pre-wrap;font-size:13px}</style></head><body>"
            f"{imgs}<h2>Report</h2><pre>{html.escape(md)}</pre></body></html>\n")
