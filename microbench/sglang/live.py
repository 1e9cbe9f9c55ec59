"""Live probe against a running OpenAI-compatible server (SGLang; vLLM works the same).

What it measures: C concurrent streaming requests (`/v1/completions`, or `/v1/chat/completions`
with `--chat`), fixed `max_tokens` (with `ignore_eos` so every stream runs to length), started all
at once (`burst`, what bench clients do) or `staggered` (one every `stagger_s`). Every streamed
chunk's arrival time is recorded (host clock, `time.perf_counter`). From them:
- ITL distribution (gaps between chunks of one stream), ms;
- output tok/s (chunks / wall time from the first request to the last chunk);
- the **lockstep index** (our definition): for each chunk of each stream, the fraction of the
  other streams that delivered a chunk within ±delta (delta = 0.1 × median ITL); averaged over all
  chunks this "coincidence" c is 1 when all streams tick together and about 2·delta/ITL = 0.2 for
  streams with unrelated phases. The index rescales it: (c - 0.2) / (1 - 0.2), clipped to [0, 1]
  (0 = independent, 1 = perfect lockstep). Under SGLang PP a herd (all requests in one
  micro-batch slot) gives an index near 1. Streams spaced closer than delta cannot be told apart
  from lockstep (with 32 evenly spread streams, ITL/32 < delta): read it with C in mind.
- optionally a `pp_max_micro_batch_size` sweep through `POST /set_internal_state`, when the
  server accepts it, and `--profile`: `/start_profile` (bounded `num_steps`), the load,
  `/stop_profile`, wait for the per-rank traces in `--trace-dir`, then the trace reader.

Bounded: at most C requests per run, each run under `timeout_s`. An unreachable server or an
HTTP error is a one-line CliError (exit 2). Stdlib only (http.client + threads).
How to run: `ppscope sglang --url http://host:30000 --live-concurrency 8 --live-tokens 64`
(against SGLang, or against the PP-loop probe served by `ppscope dispatch --serve 30000`).
"""
from __future__ import annotations

import bisect
import http.client
import json
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from microbench.sglang.http import connect as http_connect
from microbench.sglang.http import reach_error
from microbench.sglang.http import request as http_request
from reports.base.errors import CliError

DELTA_FRAC = 0.1  # delta = DELTA_FRAC x median ITL
_CHANCE = 2 * DELTA_FRAC


@dataclass(frozen=True)
class LiveConfig:
    url: str
    concurrency: int = 8
    max_tokens: int = 64
    arrival: str = "burst"           # "burst" | "staggered" | "both"
    stagger_s: float = 0.05
    timeout_s: float = 120.0
    model: str | None = None
    chat: bool = False
    prompt: str = "Write a long story about a lighthouse keeper."
    mmb_sweep: tuple[int, ...] = ()  # pp_max_micro_batch_size values to try
    profile: bool = False
    trace_dir: str | None = None
    profile_steps: int = 20
    profile_stacks: bool = False     # SGLang's own defaults (with_stack, record_shapes) when True


def _conn(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    return http_connect(url, timeout)


class BadReply(ValueError):
    """A reply that cannot be believed (not UTF-8, not JSON, NaN / Infinity in it, a field of
    the wrong type): the message is one line and never holds the reply's bytes."""


def _no_constant(c: str):
    raise BadReply(f"{c} in a JSON reply (JSON has no such number)")


def parse_reply(raw: bytes, what: str):
    """A JSON reply, checked: UTF-8, JSON, finite numbers only. BadReply otherwise."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadReply(f"{what}: the reply is not UTF-8 text") from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise BadReply(f"{what}: the reply nests too deeply") from None
    except json.JSONDecodeError:
        raise BadReply(f"{what}: the reply is not JSON") from None


def request_json(url: str, method: str, path: str, body: dict | None = None,
                 timeout: float = 30.0) -> tuple[int, dict | str]:
    """One bounded request (microbench/sglang/http.py): JSON when the reply is JSON (checked by
    parse_reply), else its text (for an error message: at most one line of it is shown)."""
    st, raw = http_request(url, method, path, body, timeout=timeout)
    try:
        return st, parse_reply(raw, f"{url}{path}")
    except BadReply:
        return st, raw.decode("utf-8", errors="replace")


def _model(cfg: LiveConfig) -> str:
    if cfg.model:
        return cfg.model
    st, d = request_json(cfg.url, "GET", "/v1/models", timeout=min(10.0, cfg.timeout_s))
    if st == 200 and isinstance(d, dict) and isinstance(d.get("data"), list) and d["data"] \
            and isinstance(d["data"][0], dict):
        m = d["data"][0].get("id", "default")
        if isinstance(m, str) and m.isprintable() and 0 < len(m) <= 512:
            return m
        raise CliError(f"{cfg.url}/v1/models: the model id is not a name; give --model-name")
    return "default"


def _chunk_text(payload: bytes, path: str) -> str | None:
    """The text of one streamed chunk (`data: {...}`), checked: BadReply when it is not an
    OpenAI-style chunk (not UTF-8 / JSON, NaN or Infinity in it, `choices` not a list of
    objects, text that is not a string). A chunk without choices (usage) gives None."""
    d = parse_reply(payload, path)
    if not isinstance(d, dict):
        raise BadReply(f"{path}: a streamed chunk is not a JSON object")
    if "error" in d and "choices" not in d:
        msg = d["error"].get("message") if isinstance(d["error"], dict) else d["error"]
        raise BadReply(f"{path}: the server sent an error in the stream: {str(msg)[:120]}")
    choices = d.get("choices")
    if choices is None or choices == []:
        return None
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise BadReply(f"{path}: a streamed chunk's choices are not objects (null choice?)")
    ch = choices[0]
    text = ch.get("text") if "text" in ch else (ch.get("delta") or {}).get("content") \
        if isinstance(ch.get("delta") or {}, dict) else None
    if text is not None and not isinstance(text, str):
        raise BadReply(f"{path}: a streamed chunk's text is not a string")
    return text


def _stream_one(cfg: LiveConfig, model: str, t0: float, out: list, errors: list,
                bad: list, firsts: list | None = None, reached=None) -> None:
    """One stream, run in a worker thread: its arrivals onto `out`; what went wrong onto
    `errors` (the server could not be reached, HTTP errors) or `bad` (a reply that cannot be
    believed), one line each, for the main thread to report. Never raises."""
    try:
        _stream(cfg, model, t0, out, errors, firsts, reached)
    except BadReply as e:
        bad.append(str(e))
    except (OSError, http.client.HTTPException) as e:
        errors.append(reach_error(e))
    except Exception as e:  # noqa: BLE001 - a worker thread's error reaches the user as a line
        bad.append(f"unexpected {type(e).__name__} reading the stream: {str(e)[:120]}")


def _stream(cfg: LiveConfig, model: str, t0: float, out: list, errors: list,
            firsts: list | None = None, reached=None) -> None:
    """One stream's arrivals; `reached` (an Event) is set once every stream of the run has
    its first token, i.e. all C requests are decoding (`firsts` counts them)."""
    path = "/v1/chat/completions" if cfg.chat else "/v1/completions"
    body = {"model": model, "max_tokens": cfg.max_tokens, "stream": True, "temperature": 0.0,
            "ignore_eos": True}
    if cfg.chat:
        body["messages"] = [{"role": "user", "content": cfg.prompt}]
    else:
        body["prompt"] = cfg.prompt
    c, base = _conn(cfg.url, cfg.timeout_s)
    try:
        start = time.perf_counter() - t0
        c.request("POST", base + path, body=json.dumps(body).encode(),
                  headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        r = c.getresponse()
        if r.status != 200:
            msg = r.read(300).decode("utf-8", errors="replace").splitlines()
            line = "".join(ch for ch in (msg[0] if msg else "") if ch.isprintable())[:120]
            errors.append(f"HTTP {r.status} from {path}: {line}")
            return
        ctype = (r.getheader("Content-Type") or "").split(";")[0].strip().lower()
        if ctype != "text/event-stream":   # an HTML page, a JSON error: not a token stream
            shown_type = "".join(ch for ch in ctype if ch.isprintable())[:60] or "none"
            raise BadReply(f"{path}: the reply is not a token stream (Content-Type "
                           f"{shown_type}, not text/event-stream)")
        arrivals = []
        deadline = t0 + cfg.timeout_s
        while True:
            line = r.readline(1 << 20)
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            if _chunk_text(payload, path):
                arrivals.append(time.perf_counter() - t0)
                if len(arrivals) == 1 and firsts is not None:
                    firsts.append(1)          # list.append is atomic: one per stream
                    if reached is not None and len(firsts) >= cfg.concurrency:
                        reached.set()
            if time.perf_counter() > deadline:
                errors.append(f"stream exceeded {cfg.timeout_s:g} s")
                break
        out.append({"start_s": start, "arrivals_s": arrivals})
    finally:
        try:
            c.close()
        except Exception:  # noqa: BLE001 - closing a broken connection
            pass


def lockstep_index(streams: list[list[float]]) -> dict:
    """See the module docstring. `streams`: per-stream arrival times (s)."""
    itl = [b - a for s in streams for a, b in zip(s, s[1:])]
    live = [s for s in streams if s]
    if len(live) < 2 or not itl:
        return {"index": None, "coincidence": None, "delta_ms": None}
    med = statistics.median(itl)
    delta = DELTA_FRAC * med
    total = hits = 0
    for i, s in enumerate(live):
        for t in s:
            n = 0
            for j, o in enumerate(live):
                if j == i:
                    continue
                k = bisect.bisect_left(o, t - delta)
                if k < len(o) and o[k] <= t + delta:
                    n += 1
            hits += n / (len(live) - 1)
            total += 1
    c = hits / total
    return {"index": max(0.0, min(1.0, (c - _CHANCE) / (1 - _CHANCE))), "coincidence": c,
            "delta_ms": delta * 1e3}


def _pcts(v: list[float]) -> dict:
    if not v:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "max": None, "mean": None}
    s = sorted(v)
    def q(p: float) -> float:
        return s[min(len(s) - 1, int(round(p * (len(s) - 1))))]
    return {"n": len(s), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": s[-1],
            "mean": statistics.fmean(s)}


def run_load(cfg: LiveConfig, arrival: str, model: str, reached=None) -> dict:
    """One run: C streams with the given arrival pattern; `reached` (a threading.Event) is set
    once all C streams are decoding."""
    out: list = []
    firsts: list = []
    errors: list = []
    bad: list = []
    t0 = time.perf_counter()
    threads = []
    for i in range(cfg.concurrency):
        if arrival == "staggered" and i:
            time.sleep(cfg.stagger_s)
        th = threading.Thread(target=_stream_one,
                              args=(cfg, model, t0, out, errors, bad, firsts, reached),
                              daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join(max(0.1, t0 + cfg.timeout_s + 5 - time.perf_counter()))
    # a reply that cannot be believed fails the run: its numbers would be the server's noise
    if bad:
        more = f" (and {len(bad) - 1} more stream(s))" if len(bad) > 1 else ""
        raise CliError(f"{cfg.url}: {bad[0]}{more}")
    if errors and not out:
        raise CliError(f"{cfg.url}: {errors[0]}")
    streams = [sorted(s["arrivals_s"]) for s in out]
    chunks = sum(len(s) for s in streams)
    if not chunks:
        raise CliError(f"{cfg.url}: {len(out)} stream(s) answered but none streamed a token "
                       f"({arrival} run); is it an OpenAI-compatible completions server?")
    end = max((s[-1] for s in streams if s), default=0.0)
    itl_ms = [(b - a) * 1e3 for s in streams for a, b in zip(s, s[1:])]
    ttft_ms = [(s["arrivals_s"][0] - s["start_s"]) * 1e3 for s in out if s["arrivals_s"]]
    return {"arrival": arrival, "concurrency": cfg.concurrency, "max_tokens": cfg.max_tokens,
            "streams_ok": len(out), "errors": errors[:5], "chunks": chunks,
            "wall_s": end, "tok_per_s": chunks / end if end > 0 else None,
            "itl_ms": _pcts(itl_ms), "ttft_ms": _pcts(ttft_ms),
            "lockstep": lockstep_index(streams)}


def refused(status: int, reply) -> bool:
    """Whether a `/set_internal_state` reply refuses the update: an HTTP error, or SGLang
    0.5.23's `[false]` (one boolean per scheduler, HTTP 200: entrypoints/http_server.py,
    managers/tokenizer_control_mixin.py), or a `{"success": false}` object."""
    if status != 200:
        return True
    if isinstance(reply, list):
        return not reply or not all(x is True for x in reply)
    return isinstance(reply, dict) and reply.get("success") is False


def _set_mmb(cfg: LiveConfig, n: int) -> str | None:
    """None when the server took it, else the reason."""
    st, d = request_json(cfg.url, "POST", "/set_internal_state",
                         {"server_args": {"pp_max_micro_batch_size": n}}, timeout=30.0)
    if refused(st, d):
        return f"HTTP {st}: {str(d)[:120]}"
    return None


def _wait_traces(d: Path, timeout_s: float, quiet_s: float = 1.0) -> list[Path]:
    """Traces appear when each rank finishes writing: wait until the set and sizes have not
    changed for `quiet_s`."""
    deadline = time.monotonic() + timeout_s
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        files = sorted(p for p in d.glob("*.json*") if p.is_file())
        sig = [(p.name, p.stat().st_size) for p in files]
        if sig != last:
            last, since = sig, time.monotonic()
        elif files and time.monotonic() - since >= quiet_s:
            return files
        time.sleep(0.2)
    return sorted(p for p in d.glob("*.json*") if p.is_file())


def _read_written_trace(path: Path, deadline: float, link_gbps: float | None):
    """A rank's trace read once its writer has finished: a file cut short (a writer that paused
    longer than _wait_traces waited) is read again until `deadline`; then its error stands."""
    from microbench.sglang import trace as sglang_trace
    while True:
        try:
            return sglang_trace.read_trace(path, link_gbps=link_gbps)
        except sglang_trace.TruncatedTrace:
            if time.monotonic() >= deadline:
                raise
        time.sleep(0.5)


def run_live(cfg: LiveConfig, link_gbps: float | None = None) -> dict:
    model = _model(cfg)
    arrivals = ("burst", "staggered") if cfg.arrival == "both" else (cfg.arrival,)
    out: dict = {"url": cfg.url, "model": model, "runs": [], "mmb_sweep": [], "profile": None}
    for a in arrivals:
        out["runs"].append(run_load(cfg, a, model))
    for n in cfg.mmb_sweep:
        why = _set_mmb(cfg, n)
        if why:
            out["mmb_sweep"].append({"pp_max_micro_batch_size": n, "status": "waived",
                                     "reason": f"server refused set_internal_state ({why})"})
            break
        r = run_load(cfg, arrivals[0], model)
        out["mmb_sweep"].append({"pp_max_micro_batch_size": n, "status": "ok", **r})
    if cfg.profile:
        out["profile"] = _profile(cfg, model, arrivals[0], link_gbps)
    return out


def _profile(cfg: LiveConfig, model: str, arrival: str, link_gbps: float | None) -> dict:
    if not cfg.trace_dir:
        raise CliError("--profile needs --trace-dir (where the server writes its traces)")
    d = Path(cfg.trace_dir)
    before = {p.name for p in d.glob("*.json*")} if d.is_dir() else set()
    # the window opens only once the load has reached C (every stream decoding): a window
    # opened before it holds the ramp (a warm-up's micro-batches of 1), not the load measured
    reached = threading.Event()
    box: dict = {}

    def load() -> None:
        try:
            box["run"] = run_load(cfg, arrival, model, reached)
        except CliError as e:
            box["error"] = e
        finally:
            reached.set()
    th = threading.Thread(target=load, daemon=True)
    th.start()
    reached.wait(cfg.timeout_s)
    if "error" in box:
        raise box["error"]
    st, resp = request_json(cfg.url, "POST", "/start_profile",
                            {"output_dir": str(d), "num_steps": cfg.profile_steps,
                             "activities": ["CPU", "GPU"],
                             # SGLang's defaults turn both on; the Python tracer behind
                             # with_stack inflates every host time the loop profile reads
                             "with_stack": cfg.profile_stacks,
                             "record_shapes": cfg.profile_stacks}, timeout=60.0)
    if st != 200:
        raise CliError(f"{cfg.url}: /start_profile answered HTTP {st}: {str(resp)[:120]}")
    th.join(cfg.timeout_s + 10)
    if "error" in box:
        raise box["error"]
    run = box.get("run")
    if run is None:
        raise CliError(f"{cfg.url}: the profiled load did not finish within {cfg.timeout_s:g} s")
    st, resp = request_json(cfg.url, "POST", "/stop_profile", {}, timeout=120.0)
    stop = "ok" if st == 200 else f"HTTP {st} (already stopped after num_steps?)"
    if not d.is_dir():
        raise CliError(f"{d}: trace directory does not exist (is it on the server's machine?)")
    files = [p for p in _wait_traces(d, min(120.0, cfg.timeout_s)) if p.name not in before]
    if not files:
        raise CliError(f"{d}: no new traces appeared after /stop_profile")
    tmp = {}
    deadline = time.monotonic() + min(120.0, cfg.timeout_s)
    for i, p in enumerate(files):
        r, a = _read_written_trace(p, deadline, link_gbps)
        tmp[str(r if r is not None else i)] = a
    return {"trace_dir": str(d), "files": [p.name for p in files], "stop_profile": stop,
            "run": run, "traces": {"ranks": tmp}}
