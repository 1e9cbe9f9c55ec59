"""Evidence checked together: the pieces `ppscope sglang` reads must describe one server and one
window, or the diagnosis mixes two servers without a word.

- Per-rank traces (`check_trace_ranks`, called by trace.py `read_traces`): the rank a file's
  name gives (`-PP-{p}`) must be the one its `distributedInfo` gives (SGLang 0.5.23's global
  rank is `tp_size * pp_rank + tp_rank`, srt/model_executor/model_runner.py, and its PP group
  holds ranks `range(i, world, world // pp)`, srt/distributed/parallel_state.py
  `initialize_model_parallel`); the ranks' windows on the host clock must overlap; the clocks
  must agree, or their offset be estimated from the messages the ranks exchanged
  (clock_offset.py) and corrected in the loop reader; an offset that cannot be told is said
  (one clock assumed), not refused: real one-host recordings give that too.
- A record's parts (`check_parts`, called by cli.py before a record is written): the log's
  `server_args`, the bench runs' `server_info` and the traces must name one model, PP size and
  device (cpu or a GPU); a log without its `server_args` line names its device by its batch
  lines (`cuda graph: B` / `cpu graph: B`, SGLang 0.5.23 scheduler_metrics_mixin.py). No part
  (log, traces, /metrics window) may hold a PP rank at or beyond a stated PP size. Only what
  two parts both state is compared; a part that does not say is not a mismatch. Time is not compared across parts: the log's clock has no time zone and
  bench_serving writes no time.

A mismatch is a one-line error naming both sides (TraceError / CliError: exit 2).
"""
from __future__ import annotations

import re
from pathlib import Path

from reports.base.errors import CliError
from reports.base.payloads.sglang import BenchServerInfo, LogServerArgs, SglangData

_PP_NAME = re.compile(r"-PP-(\d+)")


def _pp_from_dist(d: dict) -> int | None:
    """The PP rank `distributedInfo` gives: the rank's place in its PP group; None unknown."""
    r, g = d.get("dist_rank"), d.get("pp_group")
    if r is None or not g or r not in g:
        return None
    return g.index(r)


def _name_fits(r: int, tp: int, pp: int) -> bool:
    """Without the PP group: can global rank r be TP rank `tp` of PP rank `pp` for some TP
    size (r = tp_size * pp + tp, tp < tp_size)?"""
    if pp == 0:
        return r == tp
    return r > tp and (r - tp) % pp == 0 and (r - tp) // pp > tp


def _fmt_s(t: float) -> str:
    import datetime as dt
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def check_trace_ranks(ranks: dict[str, dict], paths: dict[str, Path]) -> dict | None:
    """Check one profile's rank traces against each other (module docstring) and estimate
    their clock offsets. Mutates `ranks`: drops the private `_comm`, sets `clock_offset_us`
    where a rank's clock is corrected. Returns the `clock` part ({offsets_us, notes}) or None
    when every rank shares one clock without a word to say. Raises TraceError (one line)."""
    from microbench.sglang.clock_offset import estimate
    TraceError = CliError      # trace.py's own error is a CliError; importing it is a cycle
    comm = {k: d.pop("_comm", None) or {} for k, d in ranks.items()}
    keys = sorted((k for k in ranks if k.isdigit()), key=int)
    # 1. the name's PP rank against distributedInfo's
    for k in keys:
        d, p = ranks[k], paths.get(k)
        if p is None or not _PP_NAME.search(p.name) or d.get("dist_rank") is None:
            continue
        q = _pp_from_dist(d)
        tp = d.get("name_tp") or 0
        if q is None and _name_fits(d["dist_rank"], tp, int(k)):
            continue
        if q is not None and q == int(k):
            continue
        says = (f"PP rank {q}" if q is not None else "another rank")
        other = next((paths[o] for o in keys if q is not None and o == str(q) and o != k), None)
        raise TraceError(f"{p.parent}: {p.name} is named PP rank {k} but its distributedInfo.rank "
                         f"{d['dist_rank']} is {says}" + (f", as is {other.name}" if other else "")
                         + ": a renamed or mixed-up file; pass one profile's traces")
    # 2. one world: world size and device kind alike
    for field, what in (("world_size", "distributedInfo.world_size"),):
        seen = {k: ranks[k].get(field) for k in keys if ranks[k].get(field) is not None}
        if len(set(seen.values())) > 1:
            a, b = sorted(seen, key=lambda k: seen[k])[0], sorted(seen, key=lambda k: -seen[k])[0]
            raise TraceError(f"{paths[a]} and {paths[b]}: {what} {seen[a]} and {seen[b]}: "
                             "traces of two servers; pass one profile's traces")
    kinds = {k: ("cpu" if not ranks[k].get("gpu_events") else "gpu") for k in keys}
    if len(set(kinds.values())) > 1:
        a = next(k for k in keys if kinds[k] == "cpu")
        b = next(k for k in keys if kinds[k] == "gpu")
        raise TraceError(f"{paths[a]} (no GPU event: a CPU server) and {paths[b]} (GPU "
                         "events): traces of two servers; pass one profile's traces")
    # 3. windows on the host clock overlap
    win = {k: ranks[k].get("window_unix_s") for k in keys if ranks[k].get("window_unix_s")}
    for a in win:
        for b in win:
            if a < b and (win[a][1] < win[b][0] or win[b][1] < win[a][0]):
                first, later = (a, b) if win[a][0] <= win[b][0] else (b, a)
                gap = win[later][0] - win[first][1]
                raise TraceError(
                    f"{paths[first]} ends at {_fmt_s(win[first][1])}, {gap:.1f} s before "
                    f"{paths[later]} starts: the ranks' windows do not overlap (another run's "
                    "trace, or clocks apart by more than a window); pass one profile's traces")
    # 4. clock offsets between neighbouring ranks, chained from the first
    offsets, notes, unaligned = {keys[0]: 0.0} if keys else {}, [], []
    for a, b in zip(keys, keys[1:]):
        e = estimate(comm[a], comm[b])
        st = e["status"]
        if st in ("ambiguous", "unknown"):
            unaligned.append(f"{a}-{b}")
        if st == "ambiguous":
            # not refused: on one host too, gloo's eager sends can complete before the peer
            # posts its receive, and then no shift of the matching fits zero (SGLang 0.5.23
            # lab recordings: whatif/wi-d2-c1, wl-base-c8.1); said, naming both files
            notes.append(f"{paths[a].name} and {paths[b].name}: the ranks' clocks may differ "
                         "(no matching of their sends and receives fits one clock) and the "
                         "offset cannot be told (several fit): one clock assumed, cross-rank "
                         "hops may be off")
        delta = e["offset_us"] if st == "offset" else 0.0
        offsets[b] = offsets[a] + delta
        if st == "offset":
            notes.append(f"rank {b}'s clock is {delta / 1e3:+.3f} ms (+-{e['pm_us'] / 1e3:.3f}) "
                         f"against rank {a}'s, from {e['pairs']} matched sends and receives: "
                         "corrected before the ranks are compared")
        elif st == "unknown":
            notes.append(f"the clock offset between ranks {a} and {b} was not estimated (their "
                         "sends and receives agree on no one offset): one clock assumed")
    for k, v in offsets.items():
        if v:
            ranks[k]["clock_offset_us"] = v
    if not notes:
        return None
    # unaligned: neighbouring ranks ("0-1") whose offset was not corrected (one clock
    # assumed): the report carries it into its answer (reports/model/summaries.py)
    return {"offsets_us": {k: v for k, v in offsets.items() if v}, "notes": notes,
            "unaligned": unaligned}


def _dev_class(v) -> str | None:
    if not v:
        return None
    s = str(v).strip().lower()
    return "cpu" if s == "cpu" else "gpu" if s in ("cuda", "gpu") or s.startswith(
        ("cuda:", "nvidia", "amd")) else s


def _said(args: LogServerArgs | BenchServerInfo | None,
          with_model: bool = False) -> dict[str, str]:
    """Model (bench_serving's server_info only), pp and device, as SGLang's arguments name them."""
    said = {}
    if args is None:
        return said
    if with_model and getattr(args, "model", None):
        said["model"] = str(args.model)
    if args.pp_size:
        said["pp"] = f"PP{args.pp_size}"
    if args.device:
        said["device"] = str(args.device)
    return said


def _part_ids(data: SglangData) -> list[tuple[str, dict[str, str], dict[str, str]]]:
    """(part, {key: value as compared}, {key: value as said}) of each part that says any of
    model, pp, device."""
    out = []
    said = _said(data.log.server_args if data.log else None)
    if "device" not in said:   # no server_args line: the batch lines' `{device} graph: B`
        devs = sorted({d.graph_device for d in data.ranks.values() if d.graph_device})
        if len(devs) == 1:
            said["device"] = devs[0]
    if said:
        out.append(("log", said))
    for run in data.bench:
        said = _said(run.server_info, with_model=True)
        if said:
            out.append(("bench", said))
            break                  # bench_serving.py `_one_server`: one server per file
    tr = data.traces.ranks if data.traces else {}
    said = {}
    if tr:
        if all(not d.gpu_events for d in tr.values()):
            said["device"] = "cpu"
        else:
            names = sorted({d.device for d in tr.values() if d.device})
            said["device"] = names[0] if names else "gpu"
        groups = [d.pp_group for d in tr.values() if d.pp_group]
        if groups:
            said["pp"] = f"PP{len(groups[0])}"
    if said:
        out.append(("traces", said))
    return [(p, {k: (_dev_class(v) if k == "device" else v) for k, v in s.items()}, s)
            for p, s in out]


def _where(data: SglangData, part: str) -> str:
    """The part's files by name (not their folders: the line stays short enough to be read
    whole under the CLI's cap on an error line)."""
    def name(p) -> str:
        return Path(str(p)).name or str(p)
    if part == "log":
        return ", ".join(name(f) for f in (data.log.log_files if data.log else ())) \
            or "the log"
    if part == "bench":
        f = data.bench_source.file if data.bench_source else None
        return name(f) if f else "the bench file"
    d = data.traces.dir if data.traces else None
    return ", ".join(name(x) for x in str(d).split(", ")) if d else "the traces"


def _ranks_seen(data: SglangData) -> list[tuple[str, list[int]]]:
    """(part, PP ranks it holds) of each part that holds ranks."""
    out = []
    for part, keys in (("log", data.ranks), ("traces", data.traces.ranks if data.traces else {}),
                       ("metrics", data.metrics_window.ranks if data.metrics_window else {})):
        ranks = sorted(int(k) for k in keys if str(k).isdigit())
        if ranks:
            out.append((part, ranks))
    return out


def _check_ranks(data: SglangData, ids, kept: list[str], path: Path) -> None:
    """No part holds a PP rank the server does not have: a rank at or beyond the PP size a
    part states (the log's server_args, bench_serving's server_info, the traces' PP group)."""
    for pa, ca, sa in ids:
        if "pp" not in ca:
            continue
        pp = int(str(ca["pp"])[2:])
        for pb, ranks in _ranks_seen(data):
            beyond = [r for r in ranks if r >= pp]
            if beyond:
                where = (lambda p: f"the {p} ({_where(data, p) if p != 'metrics' else 'the /metrics window'}"
                         + (f", kept in {Path(path).name}" if p in kept else "") + ")")
                says = "its own start-up arguments say" if pa == pb else f"{where(pa)} says"
                raise CliError(f"{where(pb)}: PP rank(s) {', '.join(map(str, ranks))}, but "
                               f"{says} {sa['pp']}: rank {beyond[0]} is not of that server; "
                               "read each server into its own --json")


def check_parts(data: SglangData, kept: list[str], path: Path) -> None:
    """The record's parts (this run's and those kept from the record at `path`) name one
    model, PP size and device, and hold no PP rank beyond that size; else a one-line CliError
    naming both parts (module docstring)."""
    ids = _part_ids(data)
    _check_ranks(data, ids, kept, path)
    for i, (pa, ca, sa) in enumerate(ids):
        for pb, cb, sb in ids[i + 1:]:
            diff = [k for k in ("model", "device", "pp") if k in ca and k in cb and ca[k] != cb[k]]
            if not diff:
                continue
            a_kept, b_kept = pa in kept, pb in kept
            side = (lambda p, s, k: f"the {p} ({_where(data, p)}"
                    + (f", kept in {Path(path).name}" if k else "") + "): "
                    + ", ".join(f"{x} {s[x]}" for x in diff))
            raise CliError(f"{side(pa, sa, a_kept)}; {side(pb, sb, b_kept)}: two servers' "
                           "evidence in one record; read each server into its own --json")
