"""Read SGLang's Prometheus `/metrics` (server started with `--enable-metrics`), per `pp_rank`.

What it gives per PP rank: the `sglang:` gauges and counters as plain numbers (running requests,
gen throughput, queue length, CUDA-graph passes by mode, seconds per scheduler stage category)
and, for histograms (`inter_token_latency_seconds`, `time_to_first_token_seconds`...), count, mean
and p50 / p99 estimated from the buckets (linear inside a bucket, as Prometheus's
histogram_quantile does). Why: on a live server this shows which stage spends its time idle.
How to run: `ppscope dispatch --from-sglang --sglang-metrics http://host:port/metrics` or a saved
text file. Series without a `pp_rank` label go under rank "0"; the `tp_rank`, `moe_ep_rank`,
`model_name` and `engine_type` labels are dropped, other labels stay in the key
(`num_requests_total{is_streaming=true}`). Lines that are not samples
(including NaN, infinite or negative values and buckets whose `le` is not a number) are
counted in `lines_other`, never fatal (the names that read NaN are kept per rank in `nan`:
SGLang 0.5.23 publishes `fwd_occupancy` as NaN outside a timed window; those whose value is not
a number, infinite or negative in `bad`, for metrics_window.py to refuse a window of them);
`process_start_s` holds the page's `process_start_time_seconds` values, where an exporter
publishes them (SGLang 0.5.23's own multiprocess registry does not); a file that is missing, a directory, binary or over
64 MB is a one-line CliError.

The text parser is ppscope's own, not prometheus_client's: that library is SGLang's dependency,
not ppscope's (whose dependencies are fixed), so tests/test_metrics_window.py holds this parser
against prometheus_client's `text_string_to_metric_families` on SGLang's own pages, run in the
lab's SGLang environment.
"""
from __future__ import annotations

import math
import re

from reports.base.errors import CliError
from reports.base.paths import read_input

MAX_BYTES = 64 << 20   # a /metrics page of a large deployment is well under 1 MB
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def fetch_text(src: str, timeout_s: float = 10.0) -> str:
    if re.match(r"^https?://", src):
        from microbench.sglang.http import request, split_url
        url = src if "/metrics" in src else src.rstrip("/") + "/metrics"
        host, port, path, tls = split_url(url)
        origin = f"{'https' if tls else 'http'}://{host}:{port}"
        try:
            st, raw = request(origin, "GET", path or "/metrics", timeout=timeout_s,
                              max_bytes=MAX_BYTES)
        except CliError as e:
            raise CliError(f"{url}: cannot read metrics ({str(e).split(': ', 1)[-1]})") from None
        if st != 200:
            raise CliError(f"{url}: HTTP {st}, not a /metrics page")
        return raw.decode("utf-8", errors="replace")
    raw = read_input(src, "/metrics page", MAX_BYTES)
    if b"\x00" in raw:
        raise CliError(f"{src}: binary data, not a /metrics page")
    return raw.decode("utf-8", errors="replace")


def _quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus histogram_quantile over cumulative (le, count) buckets."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_c) / (c - prev_c) if c > prev_c else 0)
        prev_le, prev_c = le, c
    return prev_le


def parse_metrics(text: str) -> dict:
    ranks: dict[str, dict] = {}
    hist: dict[tuple[str, str], dict] = {}
    other = bad_le = 0
    nan: dict[str, set[str]] = {}
    bad: dict[str, set[str]] = {}
    started: set[float] = set()
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m and m.group(1) == "process_start_time_seconds":
            # prometheus_client's process collector (not on SGLang 0.5.23's multiprocess
            # registry, but on other exporters' pages): one process lifetime, one value
            try:
                started.add(float(m.group(3)))
            except ValueError:
                pass
        if not m or not m.group(1).startswith("sglang:"):
            other += 1
            continue
        name, labels, val = m.group(1)[len("sglang:"):], dict(_LABEL.findall(m.group(2) or "")), m.group(3)
        try:
            v = float(val)
        except ValueError:
            other += 1
            bad.setdefault(labels.get("pp_rank", "0"), set()).add(name)
            continue
        if not (math.isfinite(v) and 0 <= v < 1e18):   # NaN, +Inf, negative, absurd: skipped
            other += 1
            if math.isnan(v):   # a gauge with no reading (fwd_occupancy between windows)
                nan.setdefault(labels.get("pp_rank", "0"), set()).add(name)
            else:               # no counter or gauge SGLang exports reads so
                bad.setdefault(labels.get("pp_rank", "0"), set()).add(name)
            continue
        rank = labels.pop("pp_rank", "0")
        for k in ("tp_rank", "moe_ep_rank", "model_name", "engine_type"):
            labels.pop(k, None)
        r = ranks.setdefault(rank, {})
        for suf in ("_bucket", "_sum", "_count"):
            if name.endswith(suf):
                h = hist.setdefault((rank, name[: -len(suf)]), {"buckets": {}, "sum": 0.0, "count": 0.0})
                if suf == "_bucket":
                    # several series of one histogram on a PP rank (one per TP rank): their
                    # cumulative counts add up per bucket bound (Prometheus `sum by (le)`)
                    try:
                        le = float(labels.get("le", "inf"))
                    except ValueError:   # le="abc": a bucket with no bound, skipped
                        bad_le += 1
                        break
                    if math.isnan(le) or le == -math.inf:
                        bad_le += 1
                        break
                    h["buckets"][le] = h["buckets"].get(le, 0.0) + v
                else:
                    h[suf[1:]] += v
                break
        else:
            extra = ",".join(f"{k}={labels[k]}" for k in sorted(labels))
            key = f"{name}{{{extra}}}" if extra else name
            r[key] = r.get(key, 0.0) + v if key in r and name.endswith("_total") else v
    for (rank, name), h in hist.items():
        # no observation (`_count` 0 or absent): no mean and no percentiles, whatever the
        # buckets say (a scrape taken between a bucket's and the count's update)
        seen = h["count"] > 0
        ranks.setdefault(rank, {})[name] = {
            "count": h["count"], "mean": h["sum"] / h["count"] if seen else None,
            "p50": _quantile(list(h["buckets"].items()), 0.5) if seen else None,
            "p99": _quantile(list(h["buckets"].items()), 0.99) if seen else None}
    if not ranks:
        raise CliError("no sglang: metrics found (is the server started with --enable-metrics?)")
    return {"ranks": ranks, "lines_other": other + bad_le,
            "nan": {r: sorted(v) for r, v in sorted(nan.items())},
            "bad": {r: sorted(v) for r, v in sorted(bad.items())},
            "process_start_s": sorted(started)}


def read_metrics(src: str) -> dict:
    """One page (a file or URL) parsed, with its `source`."""
    out = parse_metrics(fetch_text(src))
    out["source"] = src
    return out
