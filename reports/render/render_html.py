"""report.json -> one self-contained HTML page (inline CSS, plots as base64 PNG, no URLs).

Built from the report dict (report.json is the truth) in the order of report.md: title, links
to the sections, the measured/estimated split (a banner when every figure is estimated), The
answer (the hypothesis table, the herd drawn, three sentences, the longer answer "In detail"),
what is deployed and the warnings,
Throughput (table + tok/s vs concurrency plot), Verdicts (colour-coded), Your server (with
sglang.json: observed tables and GPU busy over time), Where the time goes
(one attribution table per concurrency, share bars), What-ifs (best first; no-gain rows folded),
Model vs dispatch probe, Micro-batch count, per-stage cost vs roofline floor, the simulated
timeline and (with dispatch.trace.json) the measured one below it, Links between GPUs when
topology.json exists (source label, unknown links, the parser's notes, pipeline hops, link map),
Inputs, Scenario assumptions.
Plots use matplotlib's Agg backend, imported only here. Open the file in any browser.
"""
from __future__ import annotations

import html
import io
import math
from typing import Any

from reports.model.sim.pipeline_model import Span
from reports.model.report_type import (Comparison, Report, ServerDiagnosis, ServerSummary,
                                       TopologySummary)
from reports.render.png_data import checked_png_uri, png_uri
from reports.render.render_md import (DISPATCH_NOTE, MEASURED_NOTE, Table, attribution_table,
                               attribution_title, baseline_table, forward_table, diagnosis_table,
                               observed_loop_line, observed_lines, layer_split_line, time_split_table, banner, dispatch_table, header_lines, report_title,
                               inputs_table, measured_timeline_table, micro_batch_table,
                               observed_line, server_bench_table, server_dp_table,
                               server_gpu_table, server_lines, server_log_table,
                               throughput_table, topology_lines, topology_table, verdict_table,
                               whatif_lines, whatif_table, ATTRIBUTION_TITLE, GLOSSARY_TITLE,
                               IMPLIED_LEAD, MEASURE_LEAD, MEASURE_TITLE, MEASURED_TITLE,
                               STAGE_NOTE, STAGE_TITLE, SERVER_WHATIF_LEAD, server_arrival_line,
                               SERVER_WHATIF_TITLE, bench_run_line, glossary,
                               server_whatif_table, stage_cost_table)

CSS = """
:root{--fg:#1f2328;--mute:#59636e;--line:#d1d9e0;--bg2:#f6f8fa;--acc:#0969da}
*{box-sizing:border-box}
body{font:14px/1.5 -apple-system,"Segoe UI",Helvetica,Arial,sans-serif;color:var(--fg);
 max-width:1180px;margin:0 auto;padding:24px 28px 60px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:34px 0 10px;padding-bottom:4px;
 border-bottom:1px solid var(--line)}h3{font-size:14px;margin:18px 0 6px;color:var(--mute)}
pre{background:var(--bg2);padding:8px 10px;overflow-x:auto;font-size:12px}
.meta{color:var(--mute);margin:2px 0}
nav{margin:12px 0 0;font-size:13px}nav a{color:var(--acc);text-decoration:none;margin-right:14px}
.banner{background:#fff8c5;border:1px solid #d4a72c;border-radius:6px;padding:10px 14px;
 margin:14px 0;font-weight:600}
.warn{background:#fff1e5;border-left:4px solid #bc4c00;padding:6px 12px;margin:4px 0;
 font-size:13px}
.answer{background:#ddf4ff;border:1px solid #54aeff;border-radius:6px;padding:8px 14px;
 margin:8px 0}ol.detail{margin:4px 0;padding-left:20px}ol.detail li{margin:5px 0}
table{border-collapse:collapse;margin:6px 0 10px;font-size:13px}
th,td{border:1px solid var(--line);padding:4px 9px;vertical-align:top}
th{background:var(--bg2);text-align:left;font-weight:600}
tr:nth-child(even) td{background:#fbfcfd}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.total td{font-weight:600;border-top:2px solid var(--mute)}
.pill{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;
 white-space:nowrap}
.v-holds{background:#dafbe1;color:#116329}.v-not{background:#ffebe9;color:#a40e26}
.v-minor{background:#fff8c5;color:#7d4e00}.v-unknown{background:#eaeef2;color:#59636e}
.s-measured{background:#ddf4ff;color:#0550ae}.s-estimated{background:#fff8c5;color:#7d4e00}
.s-observed{background:#fbefff;color:#6e40c9}.s-given{background:#dafbe1;color:#116329}.s-transferred{background:#fff8c5;color:#7d4e00}.s-modelled{background:#ddf4ff;color:#0550ae}
.bar{display:inline-block;height:9px;background:#54aeff;border-radius:2px;margin-left:6px;
 vertical-align:middle}
.gain-pos{color:#116329;font-weight:600}
.row{display:flex;gap:20px;align-items:flex-start;flex-wrap:wrap}
figure{margin:8px 0}figcaption{color:var(--mute);font-size:12px}
img{max-width:100%;border:1px solid var(--line);border-radius:4px}
details summary{cursor:pointer;color:var(--acc);margin:6px 0}
ul.assume li{margin:3px 0}
"""

VERDICT_CLASS = {"holds": "v-holds", "does not hold": "v-not", "minor": "v-minor",
                 "not enough evidence": "v-unknown", "within noise": "v-unknown"}
SOURCE_CLASS = {"measured": "s-measured", "estimated": "s-estimated", "observed": "s-observed",
                "given": "s-given", "transferred": "s-transferred", "modelled": "s-modelled"}


def _e(x: Any) -> str:
    return html.escape(str(x))


def _cell(h: str, v: str, numeric: bool) -> str:
    if h == "verdict" and v in VERDICT_CLASS:
        return f'<td><span class="pill {VERDICT_CLASS[v]}">{_e(v)}</span></td>'
    if h == "source" and v in SOURCE_CLASS:
        return f'<td><span class="pill {SOURCE_CLASS[v]}">{_e(v)}</span></td>'
    if h == "share of gap" and v.endswith("%"):
        w = max(0.0, min(100.0, float(v[:-1])))
        return f'<td class="n">{_e(v)}<span class="bar" style="width:{w * 0.8:.0f}px"></span></td>'
    if h == "gain" and v.startswith("+") and v != "+0%":
        return f'<td class="n gain-pos">{_e(v)}</td>'
    return f'<td class="n">{_e(v)}</td>' if numeric else f"<td>{_e(v)}</td>"


def table_html(t: Table, total_label: str | None = None) -> str:
    """Escaped HTML table; numeric columns right-aligned; verdict/source cells as pills."""
    head = "".join(f"<th>{_e(h)}</th>" for h in t.headers)
    body = []
    for r in t.rows:
        cls = ' class="total"' if total_label and r[0] == total_label else ""
        body.append(f"<tr{cls}>" + "".join(_cell(h, v, n) for h, v, n in
                                           zip(t.headers, r, t.numeric)) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _png(fig) -> str:
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return png_uri(buf.getvalue())


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False,
                         "axes.grid": True, "grid.alpha": 0.3})
    return plt


def plot_throughput(rep: Report) -> str:
    plt = _plt()
    c = rep.concurrency
    xs = [r.concurrency for r in c]
    fig, ax = plt.subplots(figsize=(4.4, 2.9))
    ax.plot(xs, [r.ideal_tok_per_s for r in c], "o--", color="#8c959f", label="ideal")
    ax.plot(xs, [r.predicted for r in c], "o-", color="#0969da", label="modelled")
    ob = [(r.concurrency, r.observed) for r in c if r.observed]
    if ob:
        ax.plot(*zip(*ob), "s", color="#cf222e", ms=7, label="observed")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("concurrency C")
    ax.set_ylabel("decode tok/s")
    ax.legend(frameon=False)
    return _png(fig)


def plot_stage_cost(rep: Report) -> str:
    plt = _plt()
    sc = rep.stage_cost[-1]
    fig, ax = plt.subplots(figsize=(6.5, 2.8))
    x = range(len(sc.modelled_us))
    ax.bar([i - 0.2 for i in x], [v / 1e3 for v in sc.floor_us], 0.4, color="#8c959f",
           label="roofline floor")
    ax.bar([i + 0.2 for i in x], [v / 1e3 for v in sc.modelled_us], 0.4, color="#0969da",
           label="modelled")
    ax.set_xticks(list(x))
    ax.set_xlabel("PP stage")
    ax.set_ylabel(f"ms per forward (b={sc.batch})")
    ax.legend(frameon=False, ncol=2)
    return _png(fig)


def _bars(ax, spans, cmap, label_batch: bool, span_ms: float) -> None:
    from matplotlib.collections import PolyCollection
    boxes = []
    for s in spans:
        x, w = s.start_us / 1e3, (s.end_us - s.start_us) / 1e3
        y0, y1 = s.rank - 0.4, s.rank + 0.4
        boxes.append(((x, y0), (x, y1), (x + w, y1), (x + w, y0)))
        if label_batch and w > span_ms / 60:
            ax.text(x + w / 2, s.rank, str(s.batch), ha="center", va="center", fontsize=7)
    # one collection for every bar (a broken_barh call per bar was most of the drawing)
    ax.add_collection(PolyCollection(boxes, facecolors=[cmap(s.slot % 20) for s in spans],
                                     edgecolors="white", linewidths=0.3))
    ax.autoscale_view()
    ax.set_ylabel("PP rank")
    ax.set_yticks(sorted({s.rank for s in spans}))
    ax.set_ylim(max(s.rank for s in spans) + 0.6, -0.6)
    ax.grid(axis="y", visible=False)


def plot_timeline(spans: tuple[Span, ...], window_ms: float | None = None) -> str:
    """Forwards per rank from the first one, cut at window_ms so a few periods stay legible."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 0.35 * (1 + max(s.rank for s in spans)) + 1.0))
    t0 = min(s.start_us for s in spans)
    spans = tuple(Span(s.rank, s.slot, s.batch, s.start_us - t0, s.end_us - t0) for s in spans)
    if window_ms:
        spans = tuple(s for s in spans if s.start_us / 1e3 < window_ms)
    _bars(ax, spans, plt.get_cmap("tab20"), False, window_ms or 1.0)
    ax.set_xlabel("ms (simulated)")
    return _png(fig)


def plot_measured(timelines) -> str:
    """The dispatch probe's GPU forwards (one panel per probe point, same time axis); colour =
    slot, number = requests in the micro-batch."""
    plt = _plt()
    n_r = 1 + max(s.rank for t in timelines for s in t.spans)
    fig, axes = plt.subplots(len(timelines), 1, sharex=True, squeeze=False,
                             figsize=(10, len(timelines) * (0.35 * n_r + 0.8) + 0.4))
    span_ms = max(t.window_ms for t in timelines)
    cmap = plt.get_cmap("tab20")
    for ax, t in zip(axes[:, 0], timelines):
        _bars(ax, t.spans, cmap, True, span_ms)
        ax.set_title(f"{t.point}: {t.rounds} rounds of {t.slots} slots", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("ms (measured, from the window's first forward)")
    fig.tight_layout()
    return _png(fig)


def plot_server_busy(srv: ServerSummary) -> str | None:
    """Observed share of time any kernel runs, per PP rank (sglang.json traces); NCCL receives
    that wait count here, so the diagnosis's compute / wait / idle split is the one to read."""
    bot = srv.busy_over_time
    if not bot:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 2.6))
    for r, d in bot.items():
        w = (d.bin_us or 0.0) / 1e3
        ys = [100 * v for v in d.busy_frac]
        ax.step([i * w for i in range(len(ys))], ys, where="post", label=f"rank {r}")
    ax.set_ylim(0, 105)
    ax.set_xlabel("ms into the trace")
    ax.set_ylabel("any kernel running %\n(NCCL waits included)")
    ax.legend(frameon=False, ncol=4, fontsize=8)
    return _png(fig)


def plot_links(topo: TopologySummary) -> str | None:
    """GPU x GPU grid: link type per pair (nvidia-smi topo), colour = measured PP hop us."""
    n = len(topo.gpus)
    hops = topo.hops
    if hops:
        n = max(n, 1 + max(max(h.src, h.dst) for h in hops))
    if n < 2:
        return None
    plt = _plt()
    grid = [[math.nan] * n for _ in range(n)]  # NaN: no measured hop (blank cell in imshow)
    for h in hops:
        grid[h.src][h.dst] = h.hop_us
    fig, ax = plt.subplots(figsize=(1.2 + 0.7 * n, 0.9 + 0.6 * n))
    im = ax.imshow(grid, cmap="viridis")
    ax.grid(False)
    for i in range(n):
        for j in range(n):
            link = topo.links.get(f"{min(i, j)}-{max(i, j)}", "?") if i != j else "X"
            measured = not math.isnan(grid[i][j])
            txt = link + (f"\n{grid[i][j]:.0f} us" if measured else "")
            ax.text(j, i, txt, ha="center", va="center", fontsize=8,
                    color="white" if measured else "black")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xlabel("dst GPU")
    ax.set_ylabel("src GPU")
    if any(not math.isnan(v) for row in grid for v in row):
        fig.colorbar(im, ax=ax, label="PP hop us (measured)")
    return _png(fig)


def _cached(use_cache: bool, plot, *args) -> str:
    """plot(*args) (a data URI), kept in the disk cache (reports/base/disk_cache.py) by the
    plot's name, the repr of its arguments, matplotlib's version and the code version: a
    report of the same numbers skips importing matplotlib altogether. The URI is pasted into
    the page raw, so it is checked as a PNG's data URI, drawn or read back."""
    from importlib.metadata import PackageNotFoundError, version

    from reports.base.disk_cache import cached
    try:
        mpl = version("matplotlib")
    except PackageNotFoundError:
        mpl = None
    return cached(f"plot-{plot.__name__}", (args, mpl), lambda: plot(*args).encode(), "uri",
                  decode=lambda b: checked_png_uri(b.decode("ascii")), enabled=use_cache)


def _fig(src: str, caption: str) -> str:
    return f'<figure><img alt="{_e(caption)}" src="{src}"><figcaption>{_e(caption)}</figcaption></figure>'


def server_html(rep: Report) -> list[str]:
    srv = rep.server
    o = ['<h2 id="server">Your server (observed, sglang.json)</h2>']
    o += [f'<p class="meta">{_e(line)}</p>' for line in server_lines(rep)]
    if any(r.trace_span_ms for r in srv.ranks):
        o.append("<h3>GPU time per PP rank (traces) next to the model</h3>")
        o.append(table_html(server_gpu_table(rep)))
        img = plot_server_busy(srv)
        if img:
            o.append(_fig(img, "observed: share of time any kernel runs (NCCL receives that wait "
                          "included, so this is not compute) over the traced window, per PP rank "
                               "(sglang.json traces)"))
    if any(r.running_req is not None for r in srv.ranks):
        o.append("<h3>Scheduler log per PP rank</h3>")
        o.append(table_html(server_log_table(rep)))
    if srv.dp_ranks:
        o.append("<h3>Scheduler log per PP rank and DP rank (DP attention)</h3>")
        o.append(table_html(server_dp_table(rep)))
    if srv.bench:
        o.append("<h3>bench_serving runs</h3>")
        o.append(table_html(server_bench_table(rep)))
    return o


def watch_html(sec: dict[str, Any]) -> list[str]:
    """The GPU watch (watch.json): per-GPU table, timeline, hints, NVML's caveat beside them."""
    from reports.render.watch_plot import plot_watch, watch_lines, watch_table
    o = [f'<h2 id="watch">GPU watch ({_e(sec["source"])}, {_e(sec["evidence"])})</h2>',
         f'<p class="meta">{sec["duration_s"]:.0f} s on {_e(sec["host"])}'
         f'{", during " + _e(sec["load"]) if sec["load"] else ""}</p>',
         table_html(Table(*watch_table(sec["summary"])))]
    if sec["timeline"]["gpus"]:
        o.append(_fig(_png(plot_watch(sec, _plt())), f"{sec['timeline']['activity']} per GPU "
                      "(stacked strips) and power over the watch"))
    return o + [f'<p class="meta">{_e(line)}</p>' for line in watch_lines(sec["summary"])]


def diagnosis_html(rep: Report) -> list[str]:
    """The observed server's diagnosis (reports/model/observed/diagnose.py), as report.md shows it."""
    dg = rep.diagnosis
    if not dg:
        return []
    o = ['<h2 id="diagnosis">Your server: diagnosis from its own evidence</h2>']
    if not isinstance(dg, ServerDiagnosis):
        return o + [f"<p>Not diagnosed: {_e(dg.reason)}</p>"]
    br = bench_run_line(dg)
    o += [f"<p><b>{_e(dg.answer)}</b></p>", f'<p class="meta">{_e(observed_loop_line(dg))}</p>']
    o += [f'<p class="meta">{_e(br)}</p>'] if br else []
    o += [table_html(diagnosis_table(rep)),
          '<p class="meta">Time per rank over the traced window (waiting inside an NCCL receive '
          "is communication wait, never busy):</p>", table_html(time_split_table(rep))]
    notes = list(dg.deployment.notes) + [f"Caveat: {c}" for c in dg.caveats]
    notes += [x for x in (layer_split_line(dg),) if x]
    if notes:
        o.append("<ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
    return o


def server_whatif_html(rep: Report) -> list[str]:
    """The settings tried on the traced server's own loop, as report.md shows them."""
    sw = rep.server_whatifs
    if sw is None:
        return []
    o = [f'<h2 id="server-whatifs">{_e(SERVER_WHATIF_TITLE)}</h2>']
    t = server_whatif_table(rep)
    if t is None:
        return o + [f"<p>Not modelled: {_e(sw.reason or 'no setting to try')}.</p>"]
    return o + [f'<p class="meta">{_e(SERVER_WHATIF_LEAD.format(no_change=sw.no_change_pct))}</p>',
                *([f'<p class="meta">{_e(server_arrival_line(sw))}</p>'] if sw.arrivals else []),
                table_html(t)]


def answer_html(rep: Report, figures=()) -> list[str]:
    """The answer table, the figures (embedded), its sentences, then the longer answer."""
    from reports.render.answer_table import (DETAIL_TITLE, answer_sentences, answer_table)
    o = ['<h2 id="answer" class="first">The answer</h2>', table_html(answer_table(rep))]
    for f in figures:
        o.append(_fig(png_uri(f.png), f.caption))
    o.append('<div class="answer">' + " ".join(_e(s) for s in answer_sentences(rep)) + "</div>")
    return o + [f"<h3>{_e(DETAIL_TITLE)}</h3><ol class=\"detail\">"
                + "".join(f"<li>{_e(s)}</li>" for s in rep.answer) + "</ol>"]


def _toc(rep: Report, aside: bool) -> list[tuple[str, str]]:
    """The page's sections, in the order the navigation bar lists them."""
    toc = [("answer", "The answer")]
    if rep.diagnosis:
        toc.append(("diagnosis", "Diagnosis"))
    if rep.server_whatifs:
        toc.append(("server-whatifs", "What-ifs on your server"))
    scen = [("throughput", "Throughput")]
    toc += [] if aside else scen
    toc.append(("verdicts", "Verdicts"))
    if rep.server:
        toc.append(("server", "Your server"))
    if rep.watch:
        toc.append(("watch", "GPU watch"))
    scen += [("attribution", "Where the time goes"), ("whatifs", "What-ifs")]
    if rep.dispatch_validation:
        scen.append(("dispatch", "Model vs probe"))
    scen.append(("plots", "Stage cost & timeline"))
    links = [("links", "Links")] if rep.topology else []
    scen_tail = [("inputs", "Inputs")]
    measure = [("measure", MEASURE_TITLE)] if rep.measure_your_server else []
    if aside:
        toc += links + measure      # the scenario's sections: before Measure, not in the bar
    else:
        toc += scen[1:] + links + scen_tail + measure
    toc.append(("glossary", GLOSSARY_TITLE))
    return toc


def _throughput_html(rep: Report, use_cache: bool) -> list[str]:
    thr: list[str] = []
    thr.append('<h2 id="throughput">Throughput (decode tok/s per concurrency C)</h2>')
    thr.append(f'<div class="row"><div>{table_html(throughput_table(rep))}</div>'
             f'{_fig(_cached(use_cache, plot_throughput, rep), "tok/s vs concurrency: ideal / modelled / observed")}'
             "</div>")
    if rep.observed_source:
        thr.append(f'<p class="meta">{_e(observed_line(rep))}</p>')
    if rep.implied_efficiency:
        thr.append(f'<p class="meta">{_e(IMPLIED_LEAD)}</p><ul>'
                 + "".join(f"<li>{_e(x.text)}</li>" for x in rep.implied_efficiency)
                 + "</ul>")
    return thr


def _scenario_html(rep: Report, spans, use_cache: bool) -> list[str]:
    scn: list[str] = []
    scn.append(f'<h2 id="attribution">{_e(ATTRIBUTION_TITLE)}</h2><p class="meta">Ideal -> modelled '
             "split over named causes by exact Shapley values (rows add up to the total); "
             "modelled -> observed is the unexplained row. tok/s columns are the change each "
             "cause makes.</p>")
    for a in rep.attribution:
        scn.append(f"<h3>{_e(attribution_title(a))}</h3>")
        scn.append(table_html(attribution_table(a), total_label="total: ideal -> modelled"))

    scn.append('<h2 id="whatifs">What-ifs (one server setting at every concurrency; best '
             'first)</h2>')
    scn += [f'<p class="meta">{_e(line)}</p>' for line in whatif_lines(rep)]
    gain = [w for w in rep.what_ifs if w.gain > 0.005]
    rest = [w for w in rep.what_ifs if w.gain <= 0.005]
    scn.append(table_html(whatif_table(rep, gain)) if gain else
             "<p>No single setting raises the objective by more than 0.5%.</p>")
    if rest:
        scn.append(f"<details><summary>{len(rest)} settings with no gain on the objective"
                 f"</summary>{table_html(whatif_table(rep, rest))}</details>")

    if rep.dispatch_validation:
        scn.append('<h2 id="dispatch">Model vs dispatch probe (same configuration)</h2>')
        scn.append(table_html(dispatch_table(rep)) + f'<p class="meta">{_e(DISPATCH_NOTE)}</p>')
    if rep.dispatch_micro_batches:
        scn.append("<h2>Micro-batch count (dispatch probe's configuration)</h2>")
        scn.append(table_html(micro_batch_table(rep)))

    scn.append(f'<h2 id="plots">{_e(STAGE_TITLE)}</h2><p class="meta">{_e(STAGE_NOTE)}</p>')
    scn.append(table_html(stage_cost_table(rep)))
    sc = rep.stage_cost[-1]
    scn.append(_fig(_cached(use_cache, plot_stage_cost, rep), f"per-stage forward time vs roofline floor, micro-batch "
                                        f"of {sc.batch}"))
    if spans:
        top = max(rep.concurrency, key=lambda c: c.concurrency)
        win = 4 * top.predicted_tpot_ms
        scn.append(_fig(_cached(use_cache, plot_timeline, spans, win),
                      f"simulated PP loop at C={top.concurrency}, first {win:.0f} ms (4 decode "
                      "steps): one bar per forward, colour = slot; full trace in "
                      "report.trace.json (open in Perfetto)"))
    return scn


def _evidence_html(rep: Report, measured) -> list[str]:
    ev: list[str] = []
    if measured:
        ev.append(f"<h2>{_e(MEASURED_TITLE)}</h2>")
        ev.append(_fig(plot_measured(measured),
                      "measured PP loop (dispatch.trace.json): GPU forwards per stage, colour = "
                      "slot, number = requests in the micro-batch"))
        ev.append(table_html(measured_timeline_table(rep)) + f'<p class="meta">{_e(MEASURED_NOTE)}</p>')
    if rep.topology:
        t = rep.topology
        ev.append(f'<h2 id="links">Links between GPUs (topology.json, {_e(t.source)})</h2>')
        items = topology_lines(rep)
        ev += [f'<p class="meta">{_e(x)}</p>' for x in items if not x.startswith("- ")]
        notes = [x[2:] for x in items if x.startswith("- ")]
        if notes:
            ev.append("<ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
        if t.pipeline_hops:
            ev.append(table_html(topology_table(rep)))
        img = plot_links(t)
        if img:
            ev.append(_fig(img, f"link type per GPU pair (nvidia-smi topo, {t.source}; "
                               "? = unknown) and measured PP hop cost at the smallest batch"))
    return ev


def _tail_html(rep: Report) -> tuple[list[str], list[str]]:
    tail: list[str] = []
    if rep.model_differs:
        tail.append('<h2 id="differs">Where the model differs from SGLang</h2><ul>'
                 + "".join(f"<li>{_e(d)}</li>" for d in rep.model_differs) + "</ul>")
    tail.append('<h2 id="inputs">Inputs</h2>')
    tail.append(table_html(inputs_table(rep)))
    if rep.assumptions:
        tail.append("<h2>Scenario assumptions</h2><ul class=\"assume\">"
                 + "".join(f"<li><b>{_e(k)}</b>: {_e(v)}</li>"
                           for k, v in rep.assumptions.items()) + "</ul>")
    meas: list[str] = []
    steps = rep.measure_your_server
    if steps:
        meas.append(f'<h2 id="measure">{_e(MEASURE_TITLE)}</h2><p>{_e(MEASURE_LEAD)}</p><ol>'
                 + "".join(f"<li><p>{_e(st.why)}</p><pre><code>"
                           + "\n".join(_e(c) for c in st.commands) + "</code></pre></li>"
                           for st in steps) + "</ol>")
    return tail, meas


def render_html(rep: Report, spans: tuple[Span, ...] = (), measured=(), figures=(),
                use_cache: bool = True) -> str:
    """`measured`: MeasuredTimeline tuple from reports.render.measured_timeline (may be empty);
    `figures`: reports/render/timeline_plot.py `Figure`s shown under the answer table;
    `use_cache`: the plots drawn from the report's numbers alone come from the disk cache when
    the same numbers were drawn before (`_cached`)."""
    from reports.scenario_aside import ASIDE_TITLE, evidence_banner
    aside = rep.scenario_aside is not None
    toc = _toc(rep, aside)
    o = [f"<h1>{_e(report_title(rep))}</h1>"]
    o.append("<nav>" + "".join(f'<a href="#{a}">{_e(t)}</a>' for a, t in toc) + "</nav>")
    if aside:
        o.append(f'<div class="banner">{_e(evidence_banner(rep))}</div>')
    elif rep.all_estimated:
        o.append(f'<div class="banner">{_e(banner(rep))}</div>')
    else:
        o.append(f'<p class="meta">{_e(banner(rep))}</p>')
    o += answer_html(rep, figures)
    n_obs = len(observed_lines(rep))
    o += [f'<p class="meta">{_e(line)}</p>'
          for line in (observed_lines(rep)[:1] if aside else header_lines(rep))]
    o += [f'<div class="warn">warning: {_e(w)}</div>' for w in rep.warnings]
    cmp_ = rep.baseline_comparison
    if cmp_:
        o.append(f'<h2 id="baseline">Against the baseline</h2><p class="meta">'
                 f'Baseline: {_e(cmp_.baseline)}</p>')
        o.append(f"<p><b>{_e(cmp_.answer)}</b></p>{table_html(baseline_table(cmp_))}"
                 if isinstance(cmp_, Comparison) else f"<p>Not compared: {_e(cmp_.reason)}</p>")
        if isinstance(cmp_, Comparison) and cmp_.forward_rows:
            o.append("<p>Forward time per rank at the same micro-batch size</p>"
                     + table_html(forward_table(cmp_)))

    o += diagnosis_html(rep)
    o += server_whatif_html(rep)

    thr = _throughput_html(rep, use_cache)
    o += [] if aside else thr

    o.append('<h2 id="verdicts">Verdicts on the hypotheses</h2>')
    o.append(table_html(verdict_table(rep)))
    if rep.server:
        o += server_html(rep)
    if rep.watch:
        o += watch_html(rep.watch)

    scn = _scenario_html(rep, spans, use_cache)
    ev = _evidence_html(rep, measured)
    tail, meas = _tail_html(rep)
    if aside:
        o += ev
        o.append(f'<h2 id="scenario">{_e(ASIDE_TITLE)}</h2><p>'
                 f'{_e(rep.scenario_aside[0].upper() + rep.scenario_aside[1:])}. Everything '
                 "from here to the glossary is that scenario's model, not your server (pass "
                 "--scenario with your deployment to model it).</p>")
        o += [f'<p class="meta">{_e(line)}</p>' for line in header_lines(rep)[n_obs:]]
        o += thr + scn + tail + meas   # what to measure: partly the scenario's, after it
    else:
        o += scn + ev + tail + meas
    o.append(f'<h2 id="glossary">{_e(GLOSSARY_TITLE)}</h2><ul class="assume">'
             + "".join(f"<li><b>{_e(k)}</b>: {_e(v)}</li>" for k, v in glossary(rep))
             + "</ul>")
    title = report_title(rep)
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>\n"
            + "\n".join(o) + "\n</body></html>\n")
