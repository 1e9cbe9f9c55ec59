"""The server the evidence comes from: its deployment, from its own artefacts, labelled observed.

`sglang.json` can say what server it describes, and when it does the report's headline is that
server, never the built-in scenario. Per setting, the first source that states it wins:

| setting | from |
|---|---|
| pipeline size | the log's `server_args`; bench_serving's `server_info`; else at least the ranks seen (traces, log PP tags) |
| device | the traces (`cpu`: SGLang's CPU backend, no GPU events); `server_args` / `server_info` `device` |
| CUDA graphs | `disable_cuda_graph` (or a CPU device): "off by setting"; else the log's graph share, else the traces' |
| async depth, `pp_max_micro_batch_size`, `max_running_requests`, chunked prefill, graph max bs | `server_args`, then `server_info` (a value SGLang resolved at start is named as such) |
| C | bench_serving's `max_concurrency` (the cap the client set), else `ppscope sglang --concurrency` |
| prompt / output length | bench_serving's per-request means (totals / completed) |

Each entry is `{"value", "source"}`; a setting no source states is left out (the scenario
fills it, and says so). `differs_from(scenario)` names where the scenario is another deployment.
"""
from __future__ import annotations

from typing import Any

from reports.base.payloads.sglang import SglangData

_SETTINGS = ("pp_async_batch_depth", "pp_max_micro_batch_size", "max_running_requests",
             "chunked_prefill_size", "cuda_graph_max_bs", "attention_backend", "tp_size")


def _entry(value: Any, source: str) -> dict[str, Any]:
    return {"value": value, "source": source}


def _first_bench_info(sg: SglangData):
    for b in sg.bench:
        if getattr(b, "server_info", None) is not None:
            return b.server_info
    return None


def observed_server(sg: SglangData | None) -> dict[str, Any] | None:
    """The observed deployment (module docstring), or None when the evidence names none."""
    if sg is None:
        return None
    log_set = dict((sg.log.server_settings if sg.log else None) or {})
    info = _first_bench_info(sg)
    out: dict[str, Any] = {}
    loop_ranks = sorted((sg.loop.ranks if sg.loop else {}), key=lambda r: int(r))
    trace_ranks = [r for r in ((sg.traces.ranks if sg.traces else None) or {}) if str(r).isdigit()]
    log_ranks = [r for r in sg.ranks if str(r).isdigit()]
    if sg.metrics_window is not None:   # /metrics' pp_rank labels: ranks seen, as the log's
        log_ranks = max(log_ranks, [r for r in sg.metrics_window.ranks if r.isdigit()], key=len)
    if log_set.get("pp_size"):
        out["pp"] = _entry(int(log_set["pp_size"]), "observed: server log start-up arguments")
    elif info is not None and info.pp_size:
        out["pp"] = _entry(info.pp_size, "observed: bench_serving's server_info")
    elif loop_ranks or trace_ranks or log_ranks:
        # ranks seen are a lower bound: a user may trace or log only some of them
        n = max(len(loop_ranks), len(trace_ranks), len(log_ranks))
        out["pp"] = {**_entry(n, "observed: ranks seen in the traces / log (at least)"),
                     "at_least": True}
    dev = None
    if sg.loop is not None and sg.loop.device == "cpu":
        dev = _entry("cpu", "observed: traces without GPU events (SGLang's CPU backend)")
    elif log_set.get("device"):
        dev = _entry(str(log_set["device"]), "observed: server log start-up arguments")
    elif info is not None and info.device:
        dev = _entry(info.device, "observed: bench_serving's server_info")
    if dev:
        out["device"] = dev
    for key in _SETTINGS:
        if log_set.get(key) is not None:
            out[key] = _entry(log_set[key], "observed: server log start-up arguments")
        elif info is not None and getattr(info, key, None) is not None:
            resolved = key in (info.resolved or ())
            out[key] = _entry(getattr(info, key), "observed: bench_serving's server_info"
                              + (" (resolved by SGLang at start)" if resolved else ""))
    off = log_set.get("disable_cuda_graph")
    if off is None and info is not None:
        off = info.disable_cuda_graph
    if off or (dev and dev["value"] == "cpu"):
        why = "--disable-cuda-graph" if off else "device cpu"
        out["cuda_graphs"] = _entry(f"off by setting ({why})", dev["source"] if not off and dev
                                    else "observed: server start-up arguments")
    elif off is False:
        out["cuda_graphs"] = _entry("on", "observed: server start-up arguments")
    if info is not None and info.model:
        out["model"] = _entry(info.model, "observed: bench_serving's server_info")
    caps = sorted({b.max_concurrency for b in sg.bench if b.max_concurrency})
    if caps:
        out["concurrency"] = _entry(caps, "observed: bench_serving --max-concurrency")
    elif sg.loop is not None and sg.loop.concurrency:
        out["concurrency"] = _entry([sg.loop.concurrency], "given: ppscope sglang --concurrency")
    lens = [(b.mean_input_len, b.mean_output_len) for b in sg.bench
            if getattr(b, "mean_output_len", None)]
    if lens:
        out["prompt_len"] = _entry(round(sum(a or 0 for a, _ in lens) / len(lens), 1),
                                   "observed: bench_serving (tokens per request)")
        out["output_len"] = _entry(round(sum(b for _, b in lens) / len(lens), 1),
                                   "observed: bench_serving (tokens per request)")
    return out or None


def headline(obs: dict[str, Any] | None) -> str | None:
    """One line naming the observed pipeline size, device and C."""
    if not obs or "pp" not in obs:
        return None
    v = {k: e["value"] for k, e in obs.items()}
    parts = [f"PP{'>=' if obs['pp'].get('at_least') else ''}{v['pp']}"]
    if "device" in v:
        parts.append(f"on {v['device']}")
    if "model" in v:
        parts.append(str(v["model"]))
    if "concurrency" in v:
        parts.append("C=" + ",".join(str(c) for c in v["concurrency"]))
    if "cuda_graphs" in v:
        parts.append(f"CUDA graphs {v['cuda_graphs']}")
    if "pp_async_batch_depth" in v:
        parts.append(f"async depth {v['pp_async_batch_depth']}")
    return ", ".join(parts)


def differs_from(obs: dict[str, Any] | None, *, pp: int, gpu: str, scenario: str) -> str | None:
    """Why the scenario's model is not the traced server, or None when nothing says so."""
    if not obs:
        return None
    why = []
    p_obs = obs.get("pp") or {}
    if p_obs and (p_obs["value"] > pp if p_obs.get("at_least") else p_obs["value"] != pp):
        why.append(f"PP{obs['pp']['value']}, not PP{pp}")
    if "device" in obs and obs["device"]["value"] == "cpu":
        why.append(f"the CPU, not {gpu}")
    if not why:
        return None
    return (f"your server runs {'; '.join(why)}: the scenario model ({scenario}) and its what-ifs describe another deployment; "
            "only the diagnosis above describes your server")
