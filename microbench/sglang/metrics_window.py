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

Two scrapes must be of one server and one process lifetime, or the differences mix two
servers (a second scrape behind a load balancer, a restart, a page saved elsewhere). Refused,
one line each: a counter that went down; start-up durations (`sglang:startup_time_seconds
{phase}`) or a `process_start_time_seconds` that differ; other PP ranks in the second scrape, or
pp_rank labels that are not 0..N-1; a counter SGLang creates at start-up present in one scrape
only (one created at its first increment, a `cuda_graph_passes_total{mode}` or a stage with
forward_overlap "full" / "partial", counts from 0); a series the window reads whose value is not
a number (a counter reading NaN too); a rank whose loop worked longer than the window
(`--metrics-window`, an export). Said in the window's `caveats`, never differenced: an export's
series that starts late or ends early (the window is cut to the span where every counter has
samples), its NaN samples (gaps), idle time beyond the window (a sleeping scheduler adds it when
it wakes), ranks whose loop seconds disagree in a window of unknown length.
"""
from __future__ import annotations

import json
import math
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


# the counters the window differences, per rank; SGLang 0.5.23 creates the idle and process
# CPU counters and each stage category with forward_overlap="none" when the scheduler starts
# (metrics_collector.py `SchedulerMetricsCollector.__init__`); a `cuda_graph_passes_total{mode}`
# or a stage with forward_overlap "full" / "partial" only at its first increment, from 0
COUNTERS = ("scheduler_stage_seconds_total", "scheduler_idle_seconds_total",
            "cuda_graph_passes_total")
READ = COUNTERS + ("fwd_occupancy", "graph_memory_usage_gb", "startup_cuda_graph_time_seconds")
# a window's loop seconds against its wall time: each rank adds its loop time to the counters
# once a second or more (metrics_reporter.py `_SCHEDULER_TIME_ACCOUNTING_INTERVAL_NS`, 1 s), so
# a scrape can see up to about a second that began before the window; a scrape's own request
# adds a little
FLUSH_S, WALL_TOL = 2.5, 0.05


def lazy(key: str) -> bool:
    """Whether SGLang creates this counter series at its first increment (a series absent in
    the first scrape then stood at 0 there), rather than when the scheduler starts."""
    name, labels = _split(key)
    return name == "cuda_graph_passes_total" or (
        name == "scheduler_stage_seconds_total" and labels.get("forward_overlap", "none") != "none")


def _rank_order(r: str) -> int:
    return int(r) if r.isdigit() else 1 << 30


def _not_numbers(page: dict, which: str, source: str) -> None:
    """A series the window reads whose value is not a number: refused, never differenced (a
    NaN counter too; fwd_occupancy reads NaN outside a timed window and is said, not refused)."""
    for r, names in sorted((page.get("bad") or {}).items()):
        hit = [n for n in names if n in READ]
        if hit:
            raise CliError(f"{source}: {hit[0]} of PP rank {r} is not a number >= 0 in the {which} "
                           "scrape: a window of it cannot be differenced; take the scrapes again")
    for r, names in sorted((page.get("nan") or {}).items()):
        hit = [n for n in names if n in COUNTERS]
        if hit:
            raise CliError(f"{source}: {hit[0]} of PP rank {r} reads NaN in the {which} scrape: "
                           "a counter with no value cannot be differenced; take the scrapes again")


def _one_lifetime(first: dict, last: dict, source: str) -> None:
    """Both scrapes of one server process: the process start time where the page publishes it
    (`process_start_time_seconds`), and SGLang's start-up durations (`sglang:startup_time_
    seconds{phase}`, set once per launch, tokenizer_manager.py `set_startup_time`), which two
    launches do not repeat to the microsecond."""
    a, b = first.get("process_start_s") or [], last.get("process_start_s") or []
    if a and b and a != b:
        raise CliError(f"{source}: process_start_time_seconds {a[0]:.0f} in the first scrape, "
                       f"{b[0]:.0f} in the second: two processes (a restart, or another server "
                       "behind the same address); take both scrapes of one server's run")
    sa = {k: v for k, v in first["ranks"].get("0", {}).items() if k.startswith("startup_time_s")}
    sb = {k: v for k, v in last["ranks"].get("0", {}).items() if k.startswith("startup_time_s")}
    for k in sorted(sa.keys() & sb.keys()):
        if abs(sa[k] - sb[k]) > 1e-6 * max(1.0, abs(sa[k])):
            raise CliError(f"{source}: sglang:{k} {sa[k]:g} in the first scrape, {sb[k]:g} in the "
                           "second: two launches of a server (a restart, or another server "
                           "behind the same address); take both scrapes of one server's run")


def _loop_ranks(page: dict) -> list[str]:
    return sorted((r for r, d in page["ranks"].items()
                   if any(_split(k)[0] in COUNTERS for k in d)), key=_rank_order)


def _same_ranks(first: dict | None, last: dict, source: str) -> None:
    """One server's PP ranks: 0..N-1 (a page holds every scheduler of its host, and PP ranks
    are laid out from 0), the same in both scrapes."""
    b = _loop_ranks(last)
    if first is not None:
        a = _loop_ranks(first)
        if a != b:
            raise CliError(f"{source}: PP ranks {', '.join(a) or 'none'} in the first scrape, "
                           f"{', '.join(b) or 'none'} in the second: not two scrapes of one "
                           "server; take both of one server's run")
    if b and b != [str(i) for i in range(len(b))]:
        raise CliError(f"{source}: pp_rank labels {', '.join(b)}: not the ranks 0..N-1 of one "
                       "server (a page of two servers, or edited); give one server's scrapes")


def _late_series(a: dict, b: dict, r: str, source: str) -> None:
    """A counter series in one scrape only: one created at its first increment stood at 0 in
    the first (counted from there); any other starts late or ended: never differenced."""
    for key in sorted(set(b) - set(a)):
        if _split(key)[0] in COUNTERS and not lazy(key) and a:
            raise CliError(f"{source}: {key} of PP rank {r} is in the second scrape only (SGLang "
                           "creates it at start-up): a series that starts late is not "
                           "differenced; take both scrapes of one server's run")
    for key in sorted(set(a) - set(b)):
        if _split(key)[0] in COUNTERS:
            raise CliError(f"{source}: {key} of PP rank {r} is in the first scrape only: a "
                           "counter that vanished (a restart, or another server); take both "
                           "scrapes of one server's run")


def _fits_wall(ranks: dict, seconds: float | None, source: str) -> list[str]:
    """The window's differences against its duration: no rank's loop works longer than the
    window (a refusal); idle seconds beyond it are said (SGLang may add a long idle stretch at
    once when the scheduler wakes). Without a duration, ranks whose loop seconds disagree
    are said: each rank's loop runs the whole window."""
    notes = []
    loops = {r: sum(d["stage_s"].values()) for r, d in ranks.items() if d["stage_s"]}
    if seconds is not None:
        cap = seconds * (1 + WALL_TOL) + FLUSH_S
        for r, d in ranks.items():
            busy = sum(v for c, v in d["stage_s"].items() if c != "idle")
            if busy > cap:
                raise CliError(
                    f"{source}: PP rank {r} worked {busy:.1f} s of scheduler loop in a "
                    f"{seconds:.1f} s window: the two scrapes are not of one server (a load "
                    "balancer in front, or another server's page); scrape the server itself")
            idle = max(d["stage_s"].get("idle", 0.0), d["idle_s"] or 0.0)
            if loops.get(r, 0.0) > cap or idle > cap:
                notes.append(f"PP rank {r}: {max(loops.get(r, 0.0), idle):.1f} s of loop time "
                             f"in a {seconds:.1f} s window, the excess idle (SGLang adds a "
                             "sleeping scheduler's idle time when it wakes): its idle and "
                             "bubble shares are overstated")
    elif len(loops) > 1:
        lo, hi = min(loops, key=loops.get), max(loops, key=loops.get)
        if loops[hi] - loops[lo] > WALL_TOL * loops[hi] + FLUSH_S:
            notes.append(f"the ranks' loop seconds disagree (PP rank {lo} {loops[lo]:.1f} s, PP "
                         f"rank {hi} {loops[hi]:.1f} s) though each rank's loop runs the whole "
                         "window: scrapes of one server?")
    return notes


def window(pages: list[dict], source: str, seconds: float | None = None) -> dict:
    """The window between the first and last parsed page (metrics.py `parse_metrics`), as
    reports/base/payloads/sglang.py `MetricsWindow` writes it. Two scrapes must be of one
    server and one process lifetime, their series alike and their differences must fit the
    window (module docstring); else a one-line CliError."""
    two = len(pages) > 1
    first, last = (pages[0], pages[-1]) if two else ({"ranks": {}}, pages[0])
    for page, which in ((first, "first"), (last, "second" if two else "one")):
        _not_numbers(page, which, source)
    if two:
        _one_lifetime(first, last, source)
    _same_ranks(first if two else None, last, source)
    ranks = {}
    for r in sorted(last["ranks"], key=_rank_order):
        a, b = first["ranks"].get(r, {}), last["ranks"][r]
        if two:
            _late_series(a, b, r, source)
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
    caveats = list(last.get("caveats") or ())
    caveats += _fits_wall(ranks, seconds, source) if two else []
    cap = [v for k, v in _sum(last["ranks"].get("0", {}), "startup_cuda_graph_time_seconds",
                              phase="decode").items()]
    return {"source": source, "scrapes": min(2, len(pages)), "seconds": seconds,
            "ranks": ranks, "graph_capture_s": cap[0] if cap else None,
            "caveats": caveats}


def _esc(v) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"')


def _samples(name: str, vals, src: str) -> list[tuple[float, float, str]]:
    """A series' [time, "value"] pairs as (time, value, text), in time order; a value that is
    not a number of a series the window reads is refused (Prometheus writes NaN, +Inf as such)."""
    out = []
    for pair in vals:
        try:
            t, raw = pair
            t = float(t)
        except (TypeError, ValueError):
            raise CliError(f"{src}: a series of {name} has samples that are not "
                           "[time, \"value\"] pairs") from None
        try:
            v = float(raw)
        except (TypeError, ValueError):
            if name[len("sglang:"):] in READ:
                raise CliError(f"{src}: a sample of {name} at t={t:g} is {str(raw)[:40]!r}, not a "
                               "number: the window cannot be differenced; export it again"
                               ) from None
            v = math.nan
        out.append((t, v, str(raw)))
    return sorted(out, key=lambda x: x[0])


def _at(pts: list[tuple[float, float, str]], t: float) -> tuple[float, float, str] | None:
    """The last sample at or before t."""
    got = [p for p in pts if p[0] <= t + 1e-9]
    return got[-1] if got else None


def _prom_pages(doc, src: str) -> tuple[list[str], float | None, list[str]]:
    """A Prometheus query_range answer (or a list of them) -> two text pages, the seconds
    between them and what was said of the series. The window is the span where every counter
    the window reads (but those SGLang creates at their first increment) has samples: a series
    that starts late or ends early cuts it, and is said; NaN samples of a counter are gaps (said,
    never differenced); a counter that falls inside the export is refused (a restart)."""
    docs = doc if isinstance(doc, list) else [doc]
    series = []      # (name, label text, samples, key for words)
    for d in docs:
        data = d.get("data") if isinstance(d, dict) else None
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise CliError(f"{src}: JSON but not a Prometheus /api/v1/query_range answer "
                           "(data.resultType \"matrix\")")
        for one in data.get("result") or ():
            m = (one.get("metric") if isinstance(one, dict) else None) or {}
            vals = (one.get("values") if isinstance(one, dict) else None) or []
            name = m.get("__name__") if isinstance(m, dict) else None
            if not name or not vals:
                continue
            pts = _samples(name, vals, src)
            labels = ",".join(f'{k}="{_esc(v)}"' for k, v in m.items() if k != "__name__")
            word = f"{name}{{{','.join(f'{k}={v}' for k, v in sorted(m.items()) if k in ('pp_rank', 'category', 'mode', 'forward_overlap'))}}}"
            series.append((name, labels, pts, word))
    if not series:
        raise CliError(f"{src}: the Prometheus answer holds no series with samples")
    notes: list[str] = []
    t0 = min(p[0] for _, _, pts, _ in series for p in pts)
    t1 = max(p[0] for _, _, pts, _ in series for p in pts)
    spans = []       # (first, last, word) of each counter that must span the window
    for i, (name, labels, pts, word) in enumerate(series):
        if name[len("sglang:"):] not in COUNTERS:
            continue
        nan = sum(1 for p in pts if math.isnan(p[1]))
        if nan:
            notes.append(f"{nan} NaN sample(s) of {word} skipped (gaps, never differenced)")
        pts = [p for p in pts if not math.isnan(p[1])]
        series[i] = (name, labels, pts, word)
        for (ta, va, _), (tb, vb, _) in zip(pts, pts[1:]):
            if vb + 1e-9 < va:
                raise CliError(f"{src}: {word} went down at t={tb:g} ({va:g} -> {vb:g}): the "
                               "server restarted inside the export; export one run's window")
        if pts and not lazy(name[len("sglang:"):] + "{" + labels.replace('"', "") + "}"):
            spans.append((pts[0][0], pts[-1][0], word))
    if not spans:
        ta, tb = t0, t1
    else:
        ta, tb = max(s[0] for s in spans), min(s[1] for s in spans)
        if tb <= ta:
            raise CliError(f"{src}: no span where every counter has samples (the latest to "
                           f"start, {max(spans)[2]}, starts after the first to end stops): "
                           "export one window of one server")
        if ta > t0 + 1e-6:
            late = max(spans, key=lambda s: s[0])
            notes.append(f"{late[2]} starts {ta - t0:.0f} s after the export's first sample: "
                         f"the window is cut to the {tb - ta:.0f} s where every series has "
                         "samples")
        if tb < t1 - 1e-6:
            early = min(spans, key=lambda s: s[1])
            notes.append(f"{early[2]} ends {t1 - tb:.0f} s before the export's last sample: "
                         f"the window is cut to the {tb - ta:.0f} s where every series has "
                         "samples")
    lines: tuple[list[str], list[str]] = ([], [])
    for name, labels, pts, word in series:
        a, b = _at(pts, ta), _at(pts, tb)
        if a is None and b is not None and name[len("sglang:"):] in COUNTERS and b[0] > ta:
            notes.append(f"{word} first seen {b[0] - ta:.0f} s into the window: counted from 0 "
                         "(SGLang creates it at its first increment)")
        for out, p in zip(lines, (a, b)):
            if p is not None:
                out.append(f"{name}{{{labels}}} {p[2]}")
    if not lines[1]:
        raise CliError(f"{src}: the Prometheus answer holds no series with samples")
    return ["\n".join(x) for x in lines], tb - ta, notes


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
        pages, seconds, notes = _prom_pages(doc, src)
        parsed = [parse_metrics(p) for p in pages]
        parsed[-1]["caveats"] = notes
        return parsed, f"{src} (Prometheus query_range)", seconds
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
