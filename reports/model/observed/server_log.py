"""The server's scheduler-log figures as the report shows them, DP attention included.

With `--enable-dp-attention` SGLang runs one scheduler per DP rank inside each PP rank, and each
logs its own batches (`[time DP1 TP1 PP0] Decode batch, ...`). The log reader keeps every DP
rank's lines (microbench/sglang/log.py): `LogRank.by_dp` holds each DP rank's own figures and the
PP rank's own figures pool all of them. What the report adds here: one row per DP rank, and the
PP rank's combined figures with the rule each follows (`DP_RULES`, printed in the report), so no
figure stands for DP0 alone.

Combining rules (each DP rank's batches are real, separate batches):
- decode and prefill lines: summed over the DP ranks;
- slot size min / median / max and the CUDA-graph share: over every DP rank's decode lines taken
  together (one line = one batch of one scheduler);
- gen tok/s: SGLang logs each scheduler's own generated tokens per second, so the PP rank's
  throughput is the sum over its DP ranks (of their medians: the lines of two DP ranks are not
  logged at the same instants, so no per-instant sum exists);
- slot-imbalance index: windows of consecutive lines of one DP rank (never mixing two), pooled;
  coefficient of variation = the median of the DP ranks' own.

Also here: the log's start-up and run-time settings in words (server arguments, decode graphs
off by setting with SGLang's reasons, settings changed at run time) and each PP rank's prefill
waves, for `ppscope sglang`'s printout and the report's CUDA-graph verdict.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from reports.base.payloads.sglang import (ConfigOverride, Dist, LogRank, LogServerArgs,
                                          LogSummary, SglangData)

DP_RULES = ("DP attention: every DP rank runs its own scheduler and logs its own batches, so "
            "all DP ranks' lines count. Per PP rank, decode and prefill lines are summed over "
            "the DP ranks; slot sizes and the CUDA-graph share are taken over all their decode "
            "lines together (each line one batch); gen tok/s is the sum of the DP ranks' "
            "medians (each scheduler logs its own tokens); the slot-imbalance index pools "
            "windows of each DP rank (a window never mixes two) and takes the median of their "
            "coefficients of variation.")


@dataclass(frozen=True)
class DpFigures:
    """One DP rank's own log figures, as report.json's `server.ranks[].dp[]` has them."""
    dp: int
    decode_lines: int
    prefill_lines: int
    running_req: Dist
    cuda_graph_frac: float | None
    gen_tok_per_s_median: float | None


def dp_rows(lg: LogRank) -> list[DpFigures]:
    """One row per DP rank of a PP rank (empty without DP attention), DP order."""
    return [DpFigures(int(k), d.decode_lines, d.prefill_lines, d.running_req, d.cuda_graph_frac,
                      d.gen_throughput_tok_s.median)
            for k, d in sorted(lg.by_dp.items(), key=lambda kv: int(kv[0]))]


def log_figures(lg: LogRank | None) -> dict[str, Any]:
    """A PP rank's log figures for report.json's `server.ranks[]` (None where no log)."""
    if lg is None:
        return {"decode_lines": None, "prefill_lines": None, "cuda_graph_frac": None,
                "running_req": None, "gen_tok_per_s_median": None, "dp": [],
                "gen_tok_per_s_dp_sum": None}
    dps = dp_rows(lg)
    meds = [r.gen_tok_per_s_median for r in dps]
    return {"decode_lines": lg.decode_lines, "prefill_lines": lg.prefill_lines,
            "cuda_graph_frac": lg.cuda_graph_frac, "running_req": lg.running_req,
            "gen_tok_per_s_median": lg.gen_throughput_tok_s.median, "dp": dps,
            "gen_tok_per_s_dp_sum": (sum(meds) if dps and None not in meds else None)}


def dp_count(sg: SglangData) -> int:
    """The most DP ranks any PP rank logged (0: no DP attention in the log)."""
    return max((len(r.by_dp) for r in sg.ranks.values()), default=0)


def graph_shares(sg: SglangData) -> list[tuple[str, float, int]]:
    """(scheduler, share of decode batches on the graph path, decode lines) per scheduler that
    logged the field: "0" per PP rank, "0 DP 7" per DP rank of it, so every DP rank counts."""
    out = []
    for r, d in sorted(sg.ranks.items(), key=lambda kv: int(kv[0])):
        if d.by_dp:
            out += [(f"{r} DP {k}", x.cuda_graph_frac, x.decode_lines)
                    for k, x in sorted(d.by_dp.items(), key=lambda kv: int(kv[0]))
                    if x.cuda_graph_frac is not None]
        elif d.cuda_graph_frac is not None:
            out.append((r, d.cuda_graph_frac, d.decode_lines))
    return out


def moe_kernel_lines(mk: dict[str, str] | None) -> list[str]:
    """What the server log says about its MoE kernel (microbench/sglang/log.py
    `startup_moe_kernel`), in words, with what ppscope can and cannot compare it with. Empty when
    the log named none. Observed: SGLang's own start-up lines."""
    if not mk:
        return []
    out = []
    scheme, kind = mk.get("scheme"), mk.get("kernel")
    if scheme:
        what = {"marlin": "the Marlin kernel (sgl-kernel CUDA; SGLang 0.5.23's default for "
                          "compressed-tensors INT4 W4A16 MoE on CUDA GPUs other than SM100/SM103)",
                "triton": "SGLang's Triton fused MoE"
                          + (f" (SGLang's reason: {mk['reason']})" if mk.get("reason") else ""),
                }.get(kind or "", "a kernel ppscope does not classify")
        out.append(f"MoE kernel [log]: SGLang picked {scheme}, i.e. {what}.")
        if kind == "marlin":
            out.append("To time this kernel beside ppscope's own, run `ppscope stage-cost "
                       "--moe-backends triton,sglang` on the server's machine: the sglang backend "
                       "runs SGLang's Marlin MoE where that is SGLang's default for the GPU (the "
                       "record's kernel label says which ran). Without it, the kernel "
                       "efficiency fed into the model is ppscope's, and the implied efficiency "
                       "says how far the server's kernels are from it.")
    cfg = mk.get("triton_config")
    if cfg == "default":
        out.append("SGLang warned that its Triton fused MoE runs with the default block config "
                   "(no tuned config for this GPU and expert shape"
                   + (f": {mk['config_file']} not found" if mk.get("config_file") else "")
                   + "; 'Performance might be sub-optimal'): tuning it with SGLang's "
                     "benchmark/kernels/fused_moe_triton writes that file.")
    elif cfg == "fallback":
        out.append("SGLang's Triton fused MoE uses a block config tuned for another Triton "
                   "version (" + mk.get("config_file", "file not named") + "): SGLang warns "
                   "performance might be sub-optimal.")
    elif cfg == "tuned":
        out.append("SGLang's Triton fused MoE uses a tuned block config ("
                   + mk.get("config_file", "file not named") + ").")
    return out


def attention_lines(ab: dict[str, str] | None, mla: bool | None = None) -> list[str]:
    """What the server log says about its attention backend (microbench/sglang/log.py
    `startup_attention_backend`), in words, and how to time that kernel beside ppscope's. Empty
    when the log named none. `mla`: the report's model has MLA attention (None: unknown)."""
    if not ab or not ab.get("backend"):
        return []
    be, src = ab["backend"], ab.get("source")
    how = {"default": "SGLang's default for this model and GPU",
           "--attention-backend": "from the server's arguments",
           "--decode-attention-backend": "the decode backend given apart"}.get(src or "", "")
    out = [f"Attention backend [log]: {be}" + (f" ({how})" if how else "") + "."]
    if be == "triton" and mla is not False:
        out.append("For an MLA model (DeepSeek-V3, Kimi K2) that is SGLang's Triton MLA decode "
                   "(`decode_attention_fwd`), which ppscope's stage cost does not time: on an "
                   "H200 it ran 2.8-4.2x slower than ppscope's attention on the same cache "
                   "(docs/BENCHMARKS.md section 13). `python3 -m microbench.stage_cost.sglang_anchor` "
                   "times both on the server's GPU.")
    elif be != "triton":
        out.append(f"ppscope's stage cost times its own attention kernels, not {be}'s; the "
                   "implied efficiency says how far the server's kernels are from them.")
    return out


# -- what the log says about the server's settings, its graph path and its prefill waves
# (microbench/sglang/log.py: `server_args`, `graph_setting`, `config_overrides`, and per PP rank
# `graph_device` and `prefill_*`). Each function takes plain values or the typed payload, so the
# CLI's printout and the report say the same words.

_SA_ORDER = ("pp_size", "tp_size", "device", "attention_backend", "disable_cuda_graph",
             "decode_graph_backend", "cuda_graph_max_bs", "enable_torch_compile",
             "pp_async_batch_depth", "pp_max_micro_batch_size", "max_running_requests",
             "chunked_prefill_size", "max_prefill_tokens")


def server_args_line(sa: LogServerArgs | None) -> str | None:
    """The server arguments ppscope reads (`server_args=` start-up line), in one line; None
    when the log has no such line. "default": not given, SGLang picks at start-up."""
    if sa is None:
        return None
    vals = ", ".join(f"{k} {'default' if getattr(sa, k) is None else getattr(sa, k)}"
                     for k in _SA_ORDER)
    return f"Server args [log]: {vals}."


def graph_off_text(reasons: Sequence[str]) -> str:
    """Decode graphs off by setting, with SGLang's reasons (never a fallback)."""
    return "off by setting (" + "; ".join(reasons) + ")"


def graph_setting_line(off_by_setting: bool | None, reasons: Sequence[str],
                       device: str | None = None) -> str | None:
    """What the start-up lines say about decode graphs, beside the share of decode batches on
    the graph path (`{device} graph: B`); None when they say nothing."""
    path = f"`{device} graph`" if device else "graph"
    if off_by_setting:
        return (f"Decode graphs [log]: {graph_off_text(reasons)}: decode runs eager on purpose, "
                f"so decode batches off the {path} path are this setting, not a fallback.")
    if off_by_setting is False:
        return (f"Decode graphs [log]: on by setting; a decode batch logged with {path}: False "
                "fell off the graph path (e.g. larger than the largest captured batch).")
    return None


def prefill_waves_line(rank: str, new_seq: Sequence[int], prefills: int, admitted: int,
                       hist: Mapping[str, int]) -> str | None:
    """A PP rank's prefill waves: how many requests each prefill admitted (`#new-seq`), in
    order, and how many prefills admitted each number. None without prefill lines."""
    if not prefills:
        return None
    seq = " ".join(str(x) for x in new_seq) + (" ..." if len(new_seq) < prefills else "")
    sizes = ", ".join(f"{k}: {v}" for k, v in sorted(hist.items(), key=lambda kv: int(kv[0])))
    return (f"Prefill waves [log], PP rank {rank}: {prefills} prefills admitted {admitted} "
            f"requests; #new-seq per prefill: {seq} (prefills per #new-seq {sizes}).")


def config_override_lines(overrides: Sequence[ConfigOverride]) -> list[str]:
    """Settings changed while the server ran (POST /set_internal_state), one line each."""
    out = []
    for o in overrides:
        what = ", ".join(f"{k}={v}" for k, v in o.overrides.items()) or o.text
        ranks = ", ".join(str(r) for r in o.ranks)
        out.append(f"Setting changed at run time [log] {o.clock or 'at an unknown time'} "
                   f"(PP rank {ranks}): {what}.")
    return out


def log_setting_lines(log: LogSummary, ranks: Mapping[str, LogRank]) -> list[str]:
    """The lines above for `ppscope sglang`'s printout, from the record's `log` and `ranks`."""
    out = []
    if (line := server_args_line(log.server_args)):
        out.append(line)
    gs = log.graph_setting
    devices = sorted({d.graph_device for d in ranks.values() if d.graph_device})
    if (line := graph_setting_line(gs.off_by_setting, gs.reasons, ",".join(devices) or None)):
        out.append(line)
    for r, d in ranks.items():
        line = prefill_waves_line(r, [w.new_seq for w in d.prefill_waves], d.prefill_lines,
                                  d.prefill_new_seq_total, d.prefill_new_seq_hist)
        if line:
            out.append(line)
    return out + config_override_lines(log.config_overrides)


def graph_off_number(reasons: Sequence[str], shares: Sequence[tuple[str, float, int]]) -> str:
    """The CUDA-graph verdict's number when decode graphs are off by setting (the log's
    `graph_setting`): the setting and SGLang's reasons, then the share of decode batches on
    graphs per scheduler (`graph_shares`), which that setting explains."""
    out = f"Decode graphs {graph_off_text(reasons)}: decode runs eager on purpose, not a fallback"
    if shares:
        r, lo, _ = min(shares, key=lambda x: x[1])
        out += f"; log: lowest per-rank share of decode batches on graphs {lo:.0%} (rank {r})"
    return out
