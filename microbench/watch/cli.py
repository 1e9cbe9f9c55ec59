"""`ppscope sglang --watch`: the GPU watch's command side (microbench/watch/sampler.py samples;
this module checks the arguments, runs the sampler beside the load, writes the record with its
Perfetto counter tracks, and prints the watch card, rendered by reports/render/watch_plot.py from
reports/model/observed/watch_summary.py's summary)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

from microbench.watch import dcgm as D
from microbench.watch import sampler as S   # by module: tests patch its names
from reports.base.payloads.watch import WatchData


def record_path(args) -> Path:
    """results/watch.json, or watch.json beside the --json path given for sglang.json."""
    from reports.base.paths import default_record_path
    j = getattr(args, "json", None)
    return Path(j).with_name("watch.json") if j else default_record_path("watch")


def trace_path(record: Path) -> Path:
    """watch.json -> watch.trace.json (watch.partial.json -> watch.partial.trace.json)."""
    return record.with_name(record.stem + ".trace.json")


def save(data: WatchData | None, path: Path, *, status: str = "ok", reason: str | None = None,
         argv=None, provenance=None, trace: bool = True) -> tuple[Path, str | None]:
    """The record through the one writer (status rule), and the Perfetto counter tracks beside
    the file the record went to."""
    from reports.base.records import make_record, save_record, write_atomic
    from reports.render.watch_plot import counter_trace
    rec = make_record("watch", data, status=status, reason=reason, argv=argv,
                      provenance=provenance)
    # compact: the trace is for Perfetto, not for reading by eye
    text = (json.dumps(counter_trace(data), separators=(",", ":"))
            if trace and data is not None and data.gpus else None)
    # the trace is committed with its record (one write_files); a run kept beside a good
    # record gets its own trace beside it (watch.partial.trace.json)
    dest, note = save_record(rec, path, with_files=[(trace_path(Path(path)), text)] if text else [])
    if text and dest != Path(path):
        write_atomic(trace_path(dest), text)
    return dest, note


def check_args(args) -> S.WatchConfig:
    from reports.base.errors import CliError
    secs, hz = args.watch, args.watch_hz
    if not 0 < hz <= 1000:
        raise CliError(f"--watch-hz must be in (0, 1000], got {hz}")
    if secs < 0 or secs > 7 * 86400:
        raise CliError(f"--watch SECONDS must be between 0 and 604800, got {secs}")
    source = getattr(args, "watch_source", "auto")
    if source == "dcgm" and D.dcgmi_path() is None:
        raise CliError("--watch-source dcgm: dcgmi is not on PATH (install DCGM, or use "
                       "--watch-source auto to fall back to NVML)")
    if getattr(args, "url", None):
        return S.WatchConfig(hz=hz, duration_s=None, load=f"live probe of {args.url}",
                           source=source)
    if secs == 0:
        raise CliError("--watch needs SECONDS (how long to sample) unless --url gives a load "
                       "to cover")
    return S.WatchConfig(hz=hz, duration_s=secs, source=source)


def run_watch(args, evidence: Callable | None) -> int:
    """`ppscope sglang --watch`: alone (sample SECONDS), after the file readers, or around the
    live probe (`--url`: started before the load, stopped after it)."""
    from reports.base.records import Record, collect_provenance, save_record, write_json_atomic
    from reports.base.schema import to_json
    cfg = check_args(args)
    path = record_path(args)
    argv = getattr(args, "argv", None)
    if getattr(args, "url", None) and args.watch:
        print(f"note: --watch {args.watch:g}: with --url the watch lasts as long as the live "
              "load; SECONDS is not used", file=sys.stderr)
    why = S.available()
    if why:
        dest, note = save(None, path, status="waived", reason=why, argv=argv)
        print(f"watch waived: {why}; {note or f'wrote {dest}'}", file=sys.stderr)
        return evidence(args) if evidence else 0
    prov = collect_provenance(argv)
    last: dict[str, Path] = {}

    def partial(d: WatchData) -> None:
        # In-progress snapshots skip make_record's checks (three passes over every series, ~2 s
        # of CPU for 8 GPUs x 10 min): the payload comes from the typed dataclass, and the final
        # record is checked. The first goes through save_record (the status rule decides where);
        # later ones replace it there.
        rec = Record(probe="watch", status="partial", data=to_json(d), provenance=prov,
                     reason=f"watch in progress: {d.duration_s:.0f} s sampled so far",
                     schema_version=WatchData.SCHEMA_VERSION)
        if "path" in last:
            write_json_atomic(last["path"], rec)
        else:
            last["path"], _ = save_record(rec, path)

    w = S.Watch(cfg, on_save=partial)
    rc = 0
    try:
        w.open()
        if cfg.duration_s is None:           # --url: the sampler brackets the load
            w.start()
            try:
                rc = evidence(args)
            finally:
                w.stop()
        else:
            if evidence:
                rc = evidence(args)
            w.start()
            w.wait()
            w.stop()
    except KeyboardInterrupt:
        w.stop()
        d = w.data()
        dest, note = save(d, path, status="partial", argv=argv, provenance=prov,
                          reason=f"interrupted after {d.duration_s:.1f} s; what was sampled is "
                                 "kept")
        print(f"watch: {note or f'wrote {dest} (partial)'}", file=sys.stderr)
        raise
    except BaseException as e:
        w.stop()
        if w.ticks:
            d = w.data()
            save(d, path, status="partial", argv=argv, provenance=prov,
                 reason=f"the load it watched failed ({type(e).__name__}); the "
                        f"{d.duration_s:.1f} s sampled are kept")
        raise
    d = w.data()
    lost = d.lost_gpus
    reason = ("; ".join(f"GPU {i} lost at {t:.1f} s" for i, t in lost.items()) if lost else None)
    dest, note = save(d, path, status="ok", reason=reason, argv=argv, provenance=prov)
    print(render(d))
    print(f"\n{note or f'wrote {dest} and {trace_path(dest).name}'}", file=sys.stderr)
    return rc


def render(d: WatchData) -> str:
    """The watch as a terminal card: per-GPU table, k busy at once, the wave lag, the hints."""
    from reports.base.schema import to_json
    from reports.model.observed.watch_summary import summarize
    from reports.render.watch_plot import watch_lines, watch_table
    from tabulate import tabulate
    s = to_json(summarize(d))
    head, rows, _ = watch_table(s)
    src = "NVML + DCGM dmon" if d.dcgm_used else "NVML"
    extra = [d.dcgm_note] if d.dcgm_note and d.source.dcgm_command else []
    return "\n".join([f"GPU watch ({src}): {len(d.gpus)} GPU(s), {d.duration_s:.1f} s, "
                      f"{d.achieved_hz or 0:.1f} Hz achieved of {d.requested_hz:g} requested, "
                      f"sampler CPU {d.cpu_pct_of_core or 0:.2f}% of one core",
                      tabulate(list(rows), headers=list(head), disable_numparse=True)]
                     + watch_lines(s) + extra)
