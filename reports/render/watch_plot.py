"""The GPU watch drawn: a per-GPU table, text lines, a PNG timeline and Perfetto counter tracks.

Table and lines render the JSON summary (`reports/model/observed/watch_summary.py`, as report.json keeps
it under `watch.summary`), so the terminal, report.md and report.html say the same thing. The
timeline (`plot_watch`) stacks one utilization strip per GPU over a power panel; it takes the
caller's pyplot (Agg) and returns the figure. `counter_trace` writes `watch.trace.json` for
ui.perfetto.dev: one process per GPU, one counter track per metric (DCGM's too, where it ran).
"""
from __future__ import annotations

from typing import Any

from reports.base.payloads.watch import WatchData

# (payload series, Perfetto counter name, arg name -> track "name arg")
TRACKS = (("util_pct", "util", "%"), ("mem_util_pct", "mem util", "%"), ("power_w", "power", "W"),
          ("sm_mhz", "SM clock", "MHz"), ("pcie_tx_gbps", "PCIe TX", "GB/s"),
          ("pcie_rx_gbps", "PCIe RX", "GB/s"),
          # DCGM's profiling fields (empty series where DCGM was not used: no event)
          ("sm_active", "SM active (DCGM)", "ratio"),
          ("sm_occupancy", "SM occupancy (DCGM)", "ratio"),
          ("dram_active", "DRAM active (DCGM)", "ratio"),
          ("pcie_tx_bytes_per_s", "PCIe TX (DCGM)", "B/s"),
          ("pcie_rx_bytes_per_s", "PCIe RX (DCGM)", "B/s"),
          ("nvlink_tx_bytes_per_s", "NVLink TX (DCGM)", "B/s"),
          ("nvlink_rx_bytes_per_s", "NVLink RX (DCGM)", "B/s"))


def counter_trace(d: WatchData) -> dict[str, Any]:
    """Chrome trace JSON (Perfetto opens it): `C` counter events, ts in us from the watch start.
    A counter track is a step function, so an event is written only where the value changes
    (and at the last tick, so the track spans the watch); a value NVML did not give is left
    out; a lost GPU gets an instant event."""
    ev: list[dict[str, Any]] = []
    for g in d.gpus:
        pid = g.index
        ev.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                   "args": {"name": f"GPU {g.index} {g.name}".strip()}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                   "args": {"sort_index": g.index}})
        for attr, name, unit in TRACKS:
            pts = [(t, v) for t, v in zip(g.t_s, getattr(g, attr)) if v is not None]
            for k, (t, v) in enumerate(pts):
                if k == 0 or v != pts[k - 1][1] or k == len(pts) - 1:
                    ev.append({"ph": "C", "name": name, "pid": pid, "tid": 0,
                               "ts": round(t * 1e6, 1), "args": {unit: v}})
        if g.lost_at_s is not None:
            ev.append({"ph": "i", "name": f"GPU lost: {g.lost_reason}", "pid": pid, "tid": 0,
                       "s": "p", "ts": round(g.lost_at_s * 1e6, 1)})
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"source": "ppscope watch (NVML + DCGM dmon)" if d.dcgm_used
                          else "ppscope watch (NVML)", "started_utc": d.started_utc,
                          "requested_hz": d.requested_hz, "achieved_hz": d.achieved_hz}}


def _f(x: Any, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def watch_table(s: dict[str, Any]) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...],
                                             tuple[bool, ...]]:
    """(headers, rows, numeric columns) of the per-GPU table, from the JSON summary."""
    head = ("GPU", "util mean %", "util p10/p50/p90 %", "power mean W", "power p10/p50/p90 W",
            "SM MHz p50", "PCIe TX / RX mean GB/s", "% of link", "link GB/s", "note")
    num = (False, True, True, True, True, True, True, True, False, False)
    dcgm = any(g["sm_active_pct"]["n"] or g["pcie_source"] == "dcgm" or
               g["nvlink_tx_gbps"]["n"] or g["nvlink_rx_gbps"]["n"] for g in s["gpus"])
    if dcgm:   # DCGM's columns before the note; PCIe says which source it read
        head = head[:6] + ("SM active mean %", "SM occ mean %", "DRAM active mean %",
                           "NVLink TX / RX mean GB/s") + head[6:]
        num = num[:6] + (True, True, True, True) + num[6:]
    rows = []
    for g in s["gpus"]:
        u, p = g["util_pct"], g["power_w"]
        note = []
        if g["lost_at_s"] is not None:
            note.append(f"lost at {g['lost_at_s']:.1f} s")
        if g["unsupported"]:
            note.append("unsupported: " + ", ".join(g["unsupported"]))
        if dcgm:
            note.append(f"PCIe from {g['pcie_source'].upper()}")
        row = (f"{g['index']} {g['name']}".strip(), _f(u["mean"]),
               f"{_f(u['p10'], 0)}/{_f(u['p50'], 0)}/{_f(u['p90'], 0)}", _f(p["mean"]),
               f"{_f(p['p10'], 0)}/{_f(p['p50'], 0)}/{_f(p['p90'], 0)}",
               _f(g["sm_mhz"]["p50"], 0))
        if dcgm:
            row += (_f(g["sm_active_pct"]["mean"]), _f(g["sm_occupancy_pct"]["mean"]),
                    _f(g["dram_active_pct"]["mean"]),
                    f"{_f(g['nvlink_tx_gbps']['mean'], 3)} / "
                    f"{_f(g['nvlink_rx_gbps']['mean'], 3)}")
        rows.append(row + (
            f"{_f(g['pcie_tx_gbps']['mean'], 3)} / {_f(g['pcie_rx_gbps']['mean'], 3)}",
            _f(g["pcie_pct_of_link"], 2), _f(g["link_gbps"]) + (
                f" ({g['link_source']})" if g["link_source"] else ""), "; ".join(note)))
    return head, tuple(rows), num


def watch_lines(s: dict[str, Any]) -> list[str]:
    """Plain lines under the table: k busy at once, the lag per neighbour, hints, the caveat."""
    out = []
    kb = s["k_busy_frac"]
    if kb:
        what = "DCGM SM active" if s["busy_source"] == "dcgm sm_active" else "util"
        out.append(f"GPUs busy at once ({what} >= {s['busy_threshold_pct']:g}%, share of "
                   f"{s['ticks_used']} ticks): " + ", ".join(
                       f"{k}: {f:.0%}" for k, f in enumerate(kb)))
    if s["lags"]:
        what = ("SM active" if s["busy_source"] == "dcgm sm_active" else "utilization")
        out.append(f"lag of each GPU behind the previous one ({what} cross-correlation): "
                   + ", ".join(f"{x['src']}->{x['dst']} "
                               f"{'-' if x['lag_s'] is None else format(x['lag_s'], '.2f') + ' s'}"
                               f" (r {_f(x['r'], 2)})" for x in s["lags"]))
    for h in s["hints"]:
        verdict = {True: "holds", False: "does not hold", None: "not enough samples"}[h["holds"]]
        out.append(f"{h['name']} [{h['label']}]: {verdict}: {h['text']}")
    out += s["notes"]
    if s["achieved_hz"] is not None:
        out.append(f"sampler: {s['achieved_hz']:.1f} Hz achieved, "
                   f"{_f(s['cpu_pct_of_core'], 2)}% of one CPU core")
    out.append(s["caveat"])
    return out


def watch_md(sec: dict[str, Any]) -> list[str]:
    """report.md's GPU watch section (rep["watch"])."""
    from reports.render.table import md_grid
    head, rows, num = watch_table(sec["summary"])
    out = [f"## GPU watch ({sec['source']}, {sec['evidence']}: {sec['duration_s']:.0f} s on "
           f"{sec['host']}{', during ' + sec['load'] if sec['load'] else ''})", "",
           md_grid(head, rows, num), ""]
    return out + [f"{line}  " for line in watch_lines(sec["summary"])] + [""]


def plot_watch(sec: dict[str, Any], plt) -> Any:
    """Utilization per GPU (one strip each, stacked) over mean power per GPU; returns the fig."""
    gpus = sec["timeline"]["gpus"]
    n = max(1, len(gpus))
    fig, axes = plt.subplots(n + 1, 1, sharex=True, figsize=(10, 0.55 * n + 2.2),
                             gridspec_kw={"height_ratios": [1] * n + [max(2, n // 2)]})
    cmap = plt.get_cmap("tab10")
    for ax, g in zip(axes[:-1], gpus):
        xs = g["t_s"][:len(g["activity_pct"])]
        ys = [0 if v is None else v for v in g["activity_pct"]]
        ax.fill_between(xs, ys, step="post", color=cmap(g["index"] % 10), lw=0)
        ax.set_ylim(0, 100)
        ax.set_yticks([])
        ax.set_ylabel(f"GPU {g['index']}", rotation=0, ha="right", va="center", fontsize=8)
        ax.grid(False)
        if g["lost_at_s"] is not None:
            ax.axvline(g["lost_at_s"], color="#cf222e", lw=1)
    axes[0].set_title(f"{sec['timeline']['activity']} per GPU (strip height 0-100%)", fontsize=9,
                      loc="left")
    pa = axes[-1]
    for g in gpus:
        xs = g["t_s"][:len(g["power_w"])]
        pa.step(xs, [float("nan") if v is None else v for v in g["power_w"]], where="post", lw=1,
                color=cmap(g["index"] % 10), label=f"GPU {g['index']}")
    pa.set_ylabel("power W")
    pa.set_xlabel("s from the watch's start")
    pa.legend(frameon=False, ncol=min(8, n), fontsize=7)
    fig.tight_layout()
    return fig
