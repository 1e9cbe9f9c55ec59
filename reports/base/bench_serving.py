"""Read `sglang.bench_serving` results: the JSONL it appends (`--output-file`, one run per line,
any version's keys) or the printed "Serving Benchmark Result" block(s) copied from a terminal.

What it gives: for each run, the observed output tok/s, TTFT, TPOT and ITL at its concurrency,
keyed and sorted by the concurrency cap the user set (`max_concurrency`; the measured mean,
bench_serving's `concurrency`, is kept as `mean_concurrency` and is the sort key only for an
uncapped run, marked `concurrency_from: "measured"`). bench_serving's `max_concurrent_requests`
("Peak concurrent requests") is neither: it is the most requests seen in any one-second bucket,
a request counted in every second it touches, so 16 under `--max-concurrency 8` is usual; it is
kept as `peak_concurrency`. Pure parsing (no torch, no probe code), so both
`ppscope sglang --bench` (into sglang.json) and `ppscope report --bench` read files here.

Request lengths: `mean_input_len` / `mean_output_len` are the run's totals over its completed
requests (what was served); `random_input_len` / `random_output_len` / `random_range_ratio` are
what was asked for, kept only for the datasets that read them (bench_serving writes its defaults
for every dataset, 1024 for a ShareGPT run too). `server_info`: a few of the server's settings,
summarised from the `server_info` dict SGLang 0.5.x writes on each JSONL line (`_server_info`).

`observed_points` is the one rule that turns runs into the report's observed tok/s per C: only a
capped run is a point for a concurrency (an uncapped run's mean in-flight count is not the C the
model is asked about, so it is left out with a note), and the last run per C wins, as in the file.
`bench_workload` gives the request lengths of those same runs, as the model takes them.
Unreadable input (missing, a directory, binary, over 64 MB) raises a one-line CliError; lines
that are not runs (no numeric output throughput) are counted, not fatal; a field of a run that is
not a finite number >= 0 (a string, a list, NaN...) is None, and so is a count that is not whole.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import math
import re
import typing
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from reports.base.errors import CliError
from reports.base.paths import open_input
from reports.base.payloads.sglang import BenchServerInfo

# printed label -> JSON key (labels as sglang/bench_serving.py prints them)
_LABELS = {
    "Backend": "backend",
    "Traffic request rate": "request_rate",
    "Max request concurrency": "max_concurrency",
    "Maximum request concurrency": "max_concurrency",
    "Successful requests": "completed",
    "Benchmark duration (s)": "duration",
    "Total input tokens": "total_input_tokens",
    "Total generated tokens": "total_output_tokens",
    "Request throughput (req/s)": "request_throughput",
    "Input token throughput (tok/s)": "input_throughput",
    "Output token throughput (tok/s)": "output_throughput",
    "Peak output token throughput (tok/s)": "peak_output_throughput",
    "Peak concurrent requests": "peak_concurrency",
    "Total token throughput (tok/s)": "total_throughput",
    "Total Token throughput (tok/s)": "total_throughput",
    "Total throughput (tok/s)": "total_throughput",
    "Concurrency": "concurrency",
    "Mean E2E Latency (ms)": "mean_e2e_latency_ms",
    "Median E2E Latency (ms)": "median_e2e_latency_ms",
    "Mean TTFT (ms)": "mean_ttft_ms",
    "Median TTFT (ms)": "median_ttft_ms",
    "P99 TTFT (ms)": "p99_ttft_ms",
    "Mean TPOT (ms)": "mean_tpot_ms",
    "Median TPOT (ms)": "median_tpot_ms",
    "P99 TPOT (ms)": "p99_tpot_ms",
    "Mean ITL (ms)": "mean_itl_ms",
    "Median ITL (ms)": "median_itl_ms",
    "P95 ITL (ms)": "p95_itl_ms",
    "P99 ITL (ms)": "p99_itl_ms",
    "Max ITL (ms)": "max_itl_ms",
}
_KEEP = ("max_concurrency", "concurrency", "completed", "duration", "output_throughput",
         "total_throughput", "request_throughput", "mean_ttft_ms", "median_ttft_ms",
         "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
         "median_itl_ms", "p95_itl_ms", "p99_itl_ms", "max_itl_ms", "mean_e2e_latency_ms",
         "median_e2e_latency_ms", "request_rate", "backend", "total_output_tokens",
         "total_input_tokens", "peak_concurrency", "peak_output_throughput", "dataset_name",
         "random_input_len", "random_output_len", "random_range_ratio")
_COUNTS = ("max_concurrency", "completed", "total_input_tokens", "total_output_tokens",
           "peak_concurrency", "random_input_len", "random_output_len")   # integers in sglang.json
# older / other versions' spellings (a line's own spelling wins when it has both)
_ALIASES = {"output_token_throughput": "output_throughput", "num_prompts_completed": "completed",
            "benchmark_duration": "duration", "max_concurrent_requests": "peak_concurrency",
            "max_output_tokens_per_s": "peak_output_throughput"}
_LINE = re.compile(r"^\s*([A-Za-z0-9 ()/]+?):\s+(\S+)\s*$")


MAX_BYTES = 64 << 20    # a bench file with thousands of runs is a few MB
_MAX_VALUE = 1e15       # beyond any rate, latency or count: a corrupted field


def _num(v):
    """A finite number >= 0 as int or float; None for anything else (a string, a list, a bool,
    NaN, inf, a negative or absurd value): records hold None, never NaN or a wrong type."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        f = float(v) if abs(v) < 1e300 else math.inf
        s = None
    elif isinstance(v, str):
        try:
            f = float(v)
        except ValueError:
            return None
        s = v
    else:
        return None
    if not (math.isfinite(f) and 0 <= f < _MAX_VALUE):
        return None
    if isinstance(v, int):
        return v
    return int(f) if s is not None and f.is_integer() and "." not in s and "e" not in s.lower() \
        else f


def _count(v):
    """A whole number >= 0 as int (8.0 -> 8); None otherwise (sglang.json holds integers)."""
    n = _num(v)
    return int(n) if n is not None and float(n).is_integer() else None


def _random_dataset(name) -> bool:
    """Whether --random-input-len / --random-output-len / --random-range-ratio set this dataset's
    lengths (SGLang 0.5.23 benchmark/datasets/: random.py for "random*", image.py); an unnamed
    dataset (older JSONL, printed block) is taken to be one."""
    return not isinstance(name, str) or name.startswith("random") or name == "image"


def _normalise(d: dict) -> dict:
    d = {**{_ALIASES[k]: v for k, v in d.items() if k in _ALIASES},
         **{k: v for k, v in d.items() if k not in _ALIASES}}
    run = {k: _num(d.get(k)) for k in _KEEP}
    for k in _COUNTS:
        run[k] = _count(d.get(k))
    for k in ("backend", "dataset_name"):
        run[k] = d[k] if isinstance(d.get(k), str) else None
    rate = d.get("request_rate")   # bench_serving prints "inf" for all requests at once
    if isinstance(rate, (str, float)) and str(rate).strip().lower() in ("inf", "infinity"):
        run["request_rate"] = "inf"
    elif rate == "trace":          # --use-trace-timestamps
        run["request_rate"] = "trace"
    # bench_serving's own `concurrency` is the measured mean number of requests in flight
    # (e.g. 7.98 under --max-concurrency 8); keep it, and key the run by the cap the user chose
    # (`--max-concurrency`; 0 is "not set", as bench_serving prints it), falling back to the
    # measured mean for an uncapped run
    run["mean_concurrency"] = run.pop("concurrency")
    cap = run["max_concurrency"] = run["max_concurrency"] or None
    run["concurrency"] = cap if cap is not None else run["mean_concurrency"]
    run["concurrency_from"] = "max_concurrency" if cap is not None else (
        "measured" if run["mean_concurrency"] is not None else None)
    if not _random_dataset(run["dataset_name"]):
        run.update(random_input_len=None, random_output_len=None, random_range_ratio=None)
    n = run["completed"]
    for tot, mean in (("total_input_tokens", "mean_input_len"),
                      ("total_output_tokens", "mean_output_len")):
        run[mean] = run[tot] / n if n and run[tot] is not None else None
    run["server_info"] = _server_info(d.get("server_info"))
    return run


# BenchServerInfo field -> the server_info key it is read from, where the names differ
_SERVER_KEYS = {"model": "model_path"}
# (field, its type without None), the summary's shape read once from its one definition
_SERVER_FIELDS = tuple((f, typing.get_args(typing.get_type_hints(BenchServerInfo)[f.name])[0])
                       for f in dataclasses.fields(BenchServerInfo) if f.name != "resolved")


def _fits(v, f: dataclasses.Field, tp: type) -> bool:
    """Whether v may stand in BenchServerInfo field f (of type `tp | None`, f's lower bound)."""
    if tp is int:
        return isinstance(v, int) and not isinstance(v, bool) and \
            f.metadata.get("ge", -math.inf) <= v < _MAX_VALUE
    return isinstance(v, tp)


def _server_info(si) -> dict | None:
    """server_info (the server's arguments plus `version` and `internal_states`, one per DP
    rank) -> BenchServerInfo's fields, each None unless of its type and range. A setting whose
    argument is null (left to SGLang) is the value the server resolved, named in `resolved`:
    the scheduler's own copy in internal_states[0] (0.5.23: pp_max_micro_batch_size 1024 where
    the argument is null), its `effective_max_running_requests_per_dp` for max_running_requests
    (the whole server's only with one DP rank), and for the CUDA-graph max batch size, absent
    as an argument in 0.5.23, `cuda_graph_max_bs_decode` else `cuda_graph_config.decode.max_bs`."""
    if not isinstance(si, dict):
        return None

    def obj(v) -> dict:
        return v if isinstance(v, dict) else {}

    states = si.get("internal_states")
    inner = obj(states[0]) if isinstance(states, list) and states else {}
    graph_bs = si.get("cuda_graph_max_bs_decode")
    fallback = {
        "max_running_requests": inner.get("effective_max_running_requests_per_dp")
        if si.get("dp_size", 1) == 1 else None,
        "cuda_graph_max_bs": graph_bs if graph_bs is not None
        else obj(obj(si.get("cuda_graph_config")).get("decode")).get("max_bs"),
    }
    out: dict = {"resolved": []}
    for f, tp in _SERVER_FIELDS:
        key = _SERVER_KEYS.get(f.name, f.name)
        v, resolved = si.get(key), False
        if v is None:
            v, resolved = fallback.get(f.name, inner.get(key)), True
        if f.name == "model" and isinstance(v, str):   # a path is the user's machine: base name
            v = PurePosixPath(v.rstrip("/")).name or None
        out[f.name] = v if _fits(v, f, tp) else None
        if resolved and out[f.name] is not None:
            out["resolved"].append(f.name)
    return out


def _read_text(path: Path) -> str:
    """The file's text, at most MAX_BYTES (after gunzip): /dev/zero or a gzip bomb is refused,
    not read forever; binary data is refused."""
    try:
        with open_input(path, "bench_serving output") as f:
            raw = f.read(MAX_BYTES + 1)
            if raw[:2] == b"\x1f\x8b":
                f.seek(0)
                try:
                    with gzip.GzipFile(fileobj=f) as g:
                        raw = g.read(MAX_BYTES + 1)
                except (EOFError, OSError, zlib.error) as e:
                    raise CliError(f"{path}: truncated or corrupt gzip ({e})") from None
    except OSError as e:
        raise CliError(f"{path}: cannot read bench file ({e.strerror or e})") from None
    if len(raw) > MAX_BYTES:
        raise CliError(f"{path}: larger than {MAX_BYTES >> 20} MB; not a bench_serving output")
    if b"\x00" in raw:
        raise CliError(f"{path}: binary data, not a bench_serving output")
    text = raw.decode("utf-8-sig", errors="replace")   # a byte-order mark (Windows editors) too
    if not text.strip():
        raise CliError(f"{path}: empty bench file")
    return text


def read_bench(path: str | Path) -> dict:
    """{"runs": [...], "lines_unrecognised": n, "source": "jsonl" | "printed"}."""
    path = Path(path)
    text = _read_text(path)
    runs, bad, said = [], 0, []     # said: each run's output throughput as written
    if text.lstrip().startswith("{"):
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                bad += 1
                continue
            if isinstance(d, dict) and ("output_throughput" in d or "output_token_throughput" in d):
                # a run, with the one number every run has (kept or left out below, said)
                runs.append(_normalise(d))
                said.append(d.get("output_throughput", d.get("output_token_throughput")))
            else:
                bad += 1
        source = "jsonl"
    else:
        cur: dict | None = None
        pending: dict = {}   # settings printed before the block (older clients print
        for line in text.splitlines():   # "Maximum request concurrency: 32" above it)
            if "Serving Benchmark Result" in line:
                if cur:
                    runs.append(_normalise(cur))
                    said.append(cur.get("output_throughput"))
                cur, pending = dict(pending), {}
                continue
            if cur is None:
                m = _LINE.match(line)
                if m and _LABELS.get(m.group(1)) in ("max_concurrency", "request_rate"):
                    pending[_LABELS[m.group(1)]] = m.group(2)
                continue
            m = _LINE.match(line)
            if m and m.group(1) in _LABELS:
                cur[_LABELS[m.group(1)]] = m.group(2)
            elif line.startswith("=" * 10) and cur:
                runs.append(_normalise(cur))
                said.append(cur.get("output_throughput"))
                cur = None
        if cur:
            runs.append(_normalise(cur))
            said.append(cur.get("output_throughput"))
        source = "printed"
    if not runs:
        raise CliError(f"{path}: no bench_serving results found (neither JSONL runs nor a "
                       f"'Serving Benchmark Result' block)")
    notes = _one_server(path, runs)
    if bad:
        notes.append(f"{path}: {bad} line(s) that are not bench_serving runs (not JSON, or no "
                     "output_throughput) skipped")
    done = []
    for i, (r, out) in enumerate(zip(runs, said), 1):
        if r.get("completed") == 0:    # no request finished: its tok/s is no throughput
            notes.append(f"{path}: run {i} (C={r.get('max_concurrency')}) completed 0 "
                         "requests: left out")
        elif not r["output_throughput"]:   # 0, negative, NaN, a string: no throughput either
            notes.append(f"{path}: run {i} (C={r.get('max_concurrency')}) output throughput "
                         f"{str(out)[:24]} tok/s is not a throughput (a number > 0): left out")
        else:
            done.append(r)
    if not done:
        why = ("completed 0 requests" if all(r.get("completed") == 0 for r in runs)
               else "has no throughput (completed 0 requests, or output throughput not > 0)")
        raise CliError(f"{path}: every bench_serving run {why}")
    runs = done
    runs.sort(key=lambda r: (r["concurrency"] is None, r["concurrency"] or 0))
    return {"file": str(path), "source": source, "runs": runs, "lines_unrecognised": bad,
            "notes": notes}


_SERVER_ID = ("model", "device", "pp_size", "tp_size", "dp_size")   # what names one server


def _backend_family(b) -> str | None:
    """bench_serving's --backend without its API flavour: sglang, sglang-oai, sglang-native and
    sglang-oai-chat all talk to an SGLang server; vllm, lmdeploy, trt... to another engine."""
    return b.split("-")[0].lower() if isinstance(b, str) and b else None


def _one_server(path: Path, runs: list[dict]) -> list[str]:
    """One bench file, one server: runs whose server_info names another model, device or
    parallel layout, or whose --backend is another engine, are another server's, and one curve
    of both would be a wrong answer. Runs without server_info cannot be checked: said (notes)."""
    fams = {}
    for i, r in enumerate(runs, 1):
        f = _backend_family(r.get("backend"))
        if f is not None:
            fams.setdefault(f, i)
    if len(fams) > 1:
        (a, i), (b, j) = sorted(fams.items(), key=lambda kv: kv[1])[:2]
        raise CliError(f"{path}: runs of two servers (run {i} --backend {runs[i - 1]['backend']}, "
                       f"run {j} --backend {runs[j - 1]['backend']}); give each server's runs in "
                       "its own file")
    without = [i for i, r in enumerate(runs, 1) if not r.get("server_info")]
    notes = []
    if without and len(runs) > 1:
        who = ("no run carries server_info" if len(without) == len(runs) else
               f"run(s) {_ints(without)} of {len(runs)} carry no server_info")
        notes.append(f"{path}: {who} (SGLang's bench_serving writes the server's arguments "
                     "beside each run): that the runs are of one server is not checked")
    first = None
    for i, r in enumerate(runs, 1):
        si = r.get("server_info")
        if not si:
            continue
        ident = {k: si.get(k) for k in _SERVER_ID if si.get(k) is not None}
        if first is None:
            first = (i, ident)
            continue
        diff = [k for k in ident if k in first[1] and ident[k] != first[1][k]]
        if diff:
            said = ", ".join(f"{k} {first[1][k]} vs {ident[k]}" for k in diff)
            raise CliError(f"{path}: runs of two servers (run {first[0]} and run {i}: {said}); "
                           "give each server's runs in its own file")
    return notes


def _ints(xs: list[int]) -> str:
    return ", ".join(map(str, xs[:8])) + (f" and {len(xs) - 8} more" if len(xs) > 8 else "")


def _points(runs, dup: list | None = None) -> tuple[dict[int, object], list[object]]:
    """({max_concurrency: the last run at it}, uncapped runs): the runs that are observed
    points, by `observed_points`' rule; a run is a dict (`read_bench`) or a typed `BenchRun`.
    `dup`, if given, receives (C, tok/s of the runs at C, in file order) where C has several
    (bench_serving appends: the last is the latest)."""
    points: dict[int, object] = {}
    uncapped: list[object] = []
    seen: dict[int, list] = {}
    for b in runs:
        if _get(b, "output_throughput") is None:
            continue
        c = _get(b, "max_concurrency")
        if c is None:
            uncapped.append(b)
        else:
            points[int(c)] = b
            seen.setdefault(int(c), []).append(float(_get(b, "output_throughput")))
    if dup is not None:
        dup += [(c, v) for c, v in seen.items() if len(v) > 1]
    return points, uncapped


def _get(b, key: str):
    return b.get(key) if isinstance(b, dict) else getattr(b, key)


def observed_points(runs, label: str, repeats: bool = True) -> tuple[dict[int, float], list[str]]:
    """Runs (dicts as `read_bench` gives them, or sglang.json's typed `BenchRun`s) ->
    ({max_concurrency: output tok/s}, notes). Observed numbers only: nothing here feeds the
    model. `repeats`: a note for several runs at one C (`ppscope sglang` says it when it reads
    them; the report says it in its "How sure" line, where they give the point's interval)."""
    dup: list = []
    points, uncapped = _points(runs, dup)
    notes = [f"{label}: bench run without --max-concurrency (mean concurrency "
             f"{_get(b, 'mean_concurrency')}, {float(_get(b, 'output_throughput')):.1f} tok/s) "
             "not used as an observed point" for b in uncapped]
    notes += [f"{label}: {len(v)} runs at C={c} ({', '.join(f'{x:.1f}' for x in v)} tok/s); "
              f"their mean ({sum(v) / len(v):.1f} tok/s) is the observed point, their spread "
              "its interval" for c, v in dup if repeats]
    per_c = runs_by_c(runs)
    return {c: sum(per_c[c]) / len(per_c[c]) for c in points}, notes


def runs_by_c(runs) -> dict[int, list[float]]:
    """{max_concurrency: output tok/s of every run at it, in file order}: the repetitions an
    observed point is the mean of (pyperf's rule: a value is the mean of its runs)."""
    out: dict[int, list[float]] = {}
    for b in runs:
        v, c = _get(b, "output_throughput"), _get(b, "max_concurrency")
        if v is not None and c is not None:
            out.setdefault(int(c), []).append(float(v))
    return out


@dataclass(frozen=True)
class BenchWorkload:
    """The request lengths of the runs that are observed points, as the model takes them
    (reports/base/slots.py `output_lengths`: outputs drawn in [max(int(len * ratio), 1), len],
    prompts all of one length)."""
    prompt_len: int              # mean prompt tokens per completed request
    output_len: int              # --random-output-len (the longest drawn), else the mean
    range_ratio: float | None    # --random-range-ratio; None: the spread is not stated
    note: str                    # where each came from, for the report's parameter table


def _lengths(b) -> tuple[int, int, float | None, str] | None:
    """One run's (prompt_len, output_len, range_ratio, how), or None without lengths. The
    requested output length and ratio stand when the served mean agrees with them: the mean of
    n uniform integer draws on [lo, hi] is (lo + hi) / 2 with standard deviation
    sqrt(((hi - lo + 1)^2 - 1) / 12 / n); beyond 4 of those (+0.5 for rounding) the requests did
    not run to their drawn length (stopped early, or not a --random dataset after all) and the
    mean is used, spread unknown."""
    mean_in, mean_out, n = (_get(b, k) for k in ("mean_input_len", "mean_output_len", "completed"))
    prompt = round(mean_in) if mean_in is not None else _get(b, "random_input_len")
    hi, ratio = _get(b, "random_output_len"), _get(b, "random_range_ratio")
    if prompt is None or (mean_out is None and (hi is None or ratio is None)):
        return None
    if hi is not None and ratio is not None:
        lo = min(max(int(hi * ratio), 1), hi)
        sd = math.sqrt(((hi - lo + 1) ** 2 - 1) / 12 / n) if n else 0.0
        if mean_out is None or abs(mean_out - (lo + hi) / 2) <= 4 * sd + 0.5:
            return prompt, hi, float(ratio), f"--random-output-len {hi}, ratio {ratio:g}"
        return prompt, round(mean_out), None, (
            f"mean {mean_out:.1f} per request, not the {(lo + hi) / 2:g} that --random-output-len "
            f"{hi} at ratio {ratio:g} draws")
    return prompt, round(mean_out), None, f"mean {mean_out:.1f} per request"


def bench_workload(runs, label: str) -> tuple[BenchWorkload | None, list[str]]:
    """Runs (as `observed_points` takes them) -> (the request lengths of its observed points,
    notes). None where no point states its lengths, or where the points differ (then the model
    cannot be given one workload for all of them: a note says so)."""
    points, _ = _points(runs)
    per_c = {c: x for c, x in ((c, _lengths(b)) for c, b in sorted(points.items()))
             if x is not None}
    if not per_c:
        return None, []
    kinds = {x[:3] for x in per_c.values()}
    cs = ", ".join(str(c) for c in per_c)
    if len(kinds) > 1:
        diff = "; ".join(f"C={c}: prompt {p}, output {o}" + (f" ratio {r:g}" if r is not None
                                                              else "")
                         for c, (p, o, r, _) in per_c.items())
        return None, [f"{label}: the bench runs differ in request lengths ({diff}); no one "
                      "workload for every C is taken from them"]
    p, o, r, how = next(iter(per_c.values()))
    return BenchWorkload(p, o, r, f"{label}, bench_serving runs at C={cs}: prompt {p} tokens "
                         f"(mean per completed request), output {o} tokens ({how})"), []
