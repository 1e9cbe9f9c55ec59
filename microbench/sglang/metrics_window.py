"""A window of SGLang's `/metrics`: two scrapes of one server and their differences, per PP rank.

What it measures: over the window, per PP rank, the wall seconds of each scheduler stage
(`sglang:scheduler_stage_seconds_total{category=...}`, summed over its `forward_overlap`
label), the idle seconds (`sglang:scheduler_idle_seconds_total`), the decode forward passes on
a CUDA graph against all decode passes (`sglang:cuda_graph_passes_total{mode="decode_cuda_graph"
| "decode_none"}`), and at the second scrape the forward occupancy (`sglang:fwd_occupancy`, a
percentage; NaN when no timed window is open) and whether a decode graph was captured
(`sglang:graph_memory_usage_gb{phase="decode"}`, `sglang:startup_cuda_graph_time_seconds`).
SGLang 0.5.23 defines them in srt/observability/metrics_collector.py (`MetricsCollector`:
`fwd_occupancy`, `cuda_graph_passes_total`, `scheduler_idle_seconds_total`,
`scheduler_stage_seconds_total`, `graph_memory_usage_gb`, `startup_cuda_graph_time_seconds`),
the stage categories in srt/observability/scheduler_stage_metrics.py
(`SCHEDULER_STAGE_CATEGORIES`), the decode pass count in
srt/managers/scheduler_components/batch_result_processor.py (`increment_decode_cuda_graph_pass`,
one per decode batch) and the occupancy in scheduler_components/metrics_reporter.py.

Why: counters are totals since the server started (warm-up, earlier loads); the difference of
two scrapes is the load the user cares about. One scrape alone is taken as the window since
start-up, and said so (`scrapes` 1).

Inputs, each given to `ppscope sglang --metrics` (once or twice):
- a saved `/metrics` text page, or a URL (metrics.py `fetch_text`, its 64 MB cap);
- a Prometheus HTTP API export: the JSON `/api/v1/query_range` returns (`resultType` "matrix"),
  or a JSON list of such answers (one per query). Each series' first and last sample are the
  two scrapes, and the window is the time between them: what a Grafana panel shows.
`ppscope sglang --url URL --metrics-window S` takes both scrapes itself, S seconds apart.

A counter that went down between the scrapes (the server restarted) is a one-line error.
"""
from __future__ import annotations

import json
import re
import time

from reports.base.errors import CliError
from reports.base.paths import read_input
from microbench.sglang.metrics import MAX_BYTES, fetch_text, parse_metrics

_KEY = re.compile(r"^([^{]+)(?:\{(.*)\})?$")
MAX_WINDOW_S = 3600.0


def _split(key: str) -> tuple[str, dict[str, str]]:
    """`name{a=x,b=y}` (metrics.py's key) -> (name, labels)."""
    m = _KEY.match(key)
    labels = dict(kv.split("=", 1) for kv in (m.group(2) or "").split(",") if "=" in kv)
    return m.group(1), labels


def _sum(rank: dict, name: str, **want: str) -> dict[str, float]:
    """Values of `name` on one rank keyed by their other labels as `k=v` text, the labels in
    `want` matched."""
    out: dict[str, float] = {}
    for key, v in rank.items():
        n, labels = _split(key)
        if n == name and isinstance(v, float) and all(labels.get(k) == x for k, x in want.items()):
            out[key] = v
    return out


def _stages(rank: dict) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, v in _sum(rank, "scheduler_stage_seconds_total").items():
        cat = _split(key)[1].get("category", "?")
        out[cat] = out.get(cat, 0.0) + v
    return out


def _passes(rank: dict, mode: str) -> float:
    return sum(_sum(rank, "cuda_graph_passes_total", mode=mode).values())


def _delta(a: float | None, b: float | None, what: str, rank: str) -> float | None:
    if b is None:
        return None
    a = a or 0.0
    if b + 1e-9 < a:
        raise CliError(f"/metrics: {what} of PP rank {rank} went down between the scrapes "
                       f"({a:g} -> {b:g}): the server restarted; take both scrapes of one run")
    return max(0.0, b - a)


def window(pages: list[dict], source: str, seconds: float | None = None) -> dict:
    """The window between the first and last parsed page (metrics.py `parse_metrics`), as
    reports/base/payloads/sglang.py `MetricsWindow` writes it."""
    first, last = (pages[0], pages[-1]) if len(pages) > 1 else ({"ranks": {}}, pages[0])
    ranks = {}
    for r in sorted(last["ranks"], key=lambda k: int(k) if k.isdigit() else 1 << 30):
        a, b = first["ranks"].get(r, {}), last["ranks"][r]
        sa, sb = _stages(a), _stages(b)
        stage = {c: _delta(sa.get(c), v, f"scheduler_stage_seconds_total{{category={c}}}", r)
                 for c, v in sb.items()}
        dec = {m: _delta(_passes(a, m), _passes(b, m), f"cuda_graph_passes_total{{mode={m}}}", r)
               for m in ("decode_cuda_graph", "decode_none")}
        occ = b.get("fwd_occupancy")
        mem = _sum(b, "graph_memory_usage_gb", phase="decode")
        idle = _delta(a.get("scheduler_idle_seconds_total"), b.get("scheduler_idle_seconds_total"),
                      "scheduler_idle_seconds_total", r)
        if not (stage or idle is not None or any(dec.values()) or occ is not None):
            continue      # a rank-less series (no pp_rank label) holds none of the loop's
        ranks[r] = {
            "stage_s": stage, "idle_s": idle,
            "decode_passes": sum(dec.values()), "decode_graph_passes": dec["decode_cuda_graph"],
            "fwd_occupancy_pct": min(100.0, occ) if occ is not None else None,
            "fwd_occupancy_nan": "fwd_occupancy" in (last.get("nan") or {}).get(r, ()),
            "graphs_captured": (any(v > 0 for v in mem.values()) if mem else None)}
    if not ranks:
        raise CliError(f"{source}: no per-rank scheduler series (sglang:scheduler_stage_seconds_"
                       "total, cuda_graph_passes_total, fwd_occupancy): not SGLang 0.5.23's "
                       "/metrics with --enable-metrics?")
    cap = [v for k, v in _sum(last["ranks"].get("0", {}), "startup_cuda_graph_time_seconds",
                              phase="decode").items()]
    return {"source": source, "scrapes": min(2, len(pages)), "seconds": seconds,
            "ranks": ranks, "graph_capture_s": cap[0] if cap else None}


def _esc(v) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"')


def _prom_pages(doc, src: str) -> tuple[list[str], float | None]:
    """A Prometheus query_range answer (or a list of them) -> two text pages (each series' first
    and last sample) and the seconds between them."""
    docs = doc if isinstance(doc, list) else [doc]
    lines: tuple[list[str], list[str]] = ([], [])
    t0, t1 = None, None
    for d in docs:
        data = d.get("data") if isinstance(d, dict) else None
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise CliError(f"{src}: JSON but not a Prometheus /api/v1/query_range answer "
                           "(data.resultType \"matrix\")")
        for series in data.get("result") or ():
            m, vals = series.get("metric") or {}, series.get("values") or []
            name = m.get("__name__")
            if not name or not vals:
                continue
            try:
                (ta, va), (tb, vb) = vals[0], vals[-1]
                ta, tb = float(ta), float(tb)
            except (TypeError, ValueError):
                raise CliError(f"{src}: a series of {name} has samples that are not "
                               "[time, \"value\"] pairs") from None
            t0, t1 = min(t0 if t0 is not None else ta, ta), max(t1 if t1 is not None else tb, tb)
            labels = ",".join(f'{k}="{_esc(v)}"' for k, v in m.items() if k != "__name__")
            for out, v in zip(lines, (va, vb)):
                out.append(f"{name}{{{labels}}} {v}")
    if not lines[1]:
        raise CliError(f"{src}: the Prometheus answer holds no series with samples")
    return ["\n".join(x) for x in lines], (t1 - t0 if t0 is not None else None)


def read_pages(srcs: list[str]) -> tuple[list[dict], str, float | None]:
    """`--metrics` given once or twice: text pages (files or URLs) or one Prometheus export.
    Returns the parsed pages (metrics.py `parse_metrics`), their source in words and the
    seconds between the first and last (None when the files do not say)."""
    if not 1 <= len(srcs) <= 2:
        raise CliError(f"--metrics takes one or two scrapes (a window), got {len(srcs)}")
    texts = []
    for src in srcs:
        if re.match(r"^https?://", src):
            texts.append((src, fetch_text(src)))
            continue
        raw = read_input(src, "/metrics page or Prometheus export", MAX_BYTES)
        if b"\x00" in raw:
            raise CliError(f"{src}: binary data, not a /metrics page")
        texts.append((src, raw.decode("utf-8", errors="replace")))
    if any(t.lstrip().startswith(("{", "[")) for _, t in texts):
        if len(texts) != 1:
            raise CliError("--metrics: a Prometheus export holds its own window; give it alone")
        src, t = texts[0]
        try:
            doc = json.loads(t)
        except ValueError as e:
            raise CliError(f"{src}: not JSON ({e.msg} at line {e.lineno})") from None
        pages, seconds = _prom_pages(doc, src)
        return [parse_metrics(p) for p in pages], f"{src} (Prometheus query_range)", seconds
    return [parse_metrics(t) for _, t in texts], ", ".join(s for s, _ in texts), None


def scrape_pages(url: str, seconds: float, timeout_s: float = 10.0
                 ) -> tuple[list[dict], str, float]:
    """Two scrapes of a live server `seconds` apart (each bounded by `timeout_s` and
    metrics.py's size cap): the window of whatever load it serves meanwhile."""
    if not 1 <= seconds <= MAX_WINDOW_S:
        raise CliError(f"--metrics-window must be 1..{MAX_WINDOW_S:g} seconds, got {seconds:g}")
    src = url if "/metrics" in url else url.rstrip("/") + "/metrics"
    t0 = time.monotonic()
    a = parse_metrics(fetch_text(src, timeout_s))
    time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
    t1 = time.monotonic()          # the window: from the first request to the second
    b = parse_metrics(fetch_text(src, timeout_s))
    return [a, b], f"{src} (two scrapes)", t1 - t0
