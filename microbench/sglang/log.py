"""Read SGLang server logs: every `Decode batch` / `Prefill batch` line, per pipeline rank.

What it measures: for each PP rank, how many decode/prefill lines were logged, the distribution
of `#running-req` (under PP this is the size of the one micro-batch slot just processed, so its
spread *is* the slot imbalance), the fraction of decode steps on the graph path (and which
device's label, `graph_device`: SGLang writes `cpu graph:` on CPU, `cuda graph:` on CUDA),
generated tokens/s over time, the queue length, and the prefill waves: `#new-seq` of each
prefill, i.e. how a burst of arrivals was admitted (8 requests as 6 then 2). From the start-up
lines, the server arguments that shape PP batching and graph use (`server_args`) and whether
decode graphs are off BY SETTING (`graph_setting`, with SGLang's reasons: then eager decode is
the setting, never a fallback); from anywhere in the log, settings changed at run time
(`config_overrides`, POST /set_internal_state). Why: a user with a slow PP deployment already
has this log; it shows whether requests piled into a few slots (the "herd") and whether decode
fell off the graph path.

How to run: `ppscope sglang --log server.log [rank1.log.gz ...]`.

Formats handled (checked against SGLang 0.5.23's srt/managers/scheduler_components/
metrics_reporter.py and scheduler.py `configure_scheduler_process`, and the 0.4.3 / 0.4.6 / 0.5.2
releases' scheduler.py / scheduler_metrics_mixin.py):
- prefix `[YYYY-mm-dd HH:MM:SS{tags}]`, `.mmm` milliseconds with SGLANG_LOG_MS, tags in any
  order among ` DP{d}`, ` PP{p}`, ` TP{t}`, ` EP{e}`, ` ATTN_CP{c}`, ` MOE_DP{m}` (the order
  changed across versions); 2024 releases printed `[HH:MM:SS TP0]` without the date (read as
  seconds of day, a wrap past midnight adds a day); anything before the bracket (a Ray actor's
  `(pid=…)`, a progress bar) is ignored;
- a custom logging format (SGLANG_LOGGING_CONFIG_PATH replaces SGLang's format, prefix and rank
  tags included), e.g. `INFO 1234 [metrics_reporter.py:1070] Decode batch, …`: the line is
  read; its time is taken from a `YYYY-mm-dd HH:MM:SS[,mmm]` anywhere before `Decode`, else it
  has none (no span, no time series), and without rank tags the file's index is its rank;
- `Decode batch[ [N]], #running-req: N, #token: N, token usage: X, [#cached-token: N, ]
  [accept len: X, accept rate: X, ]cuda graph: B, gen throughput (token/s): X, #queue-req: N[, ]`
  (`cpu graph` / `npu graph` / `musa graph` on other devices, hybrid models log `#full token`
  instead of `#token`; `[N]` appears with SGLANG_LOG_FORWARD_ITERS); early-2025 releases write
  `Decode batch.` and end with `, ` (sgl-project/sglang#3909, #4407), some with fields between
  `gen throughput` and `#queue-req`; the fields in any other order are read too;
- `Prefill batch[ [N]][,.] #new-seq: N, #new-token: N, #cached-token: N, token usage: X,
  #running-req: N, #queue-req: N, …`; a prefill server of a disaggregated deployment logs no
  `#running-req` (`#unbootstrapped-req`, `#transferring-req` instead) and is read without it;
  NPU builds write `npu graph`.
Several files: a line with a `PP{p}` tag belongs to rank p; a file whose lines carry no PP tag is
taken as rank <file index>.
Start-up lines (the first SETTINGS_BYTES of each file): the settings line (`server_settings`:
max_running_requests, chunked_prefill_size, ...), which MoE kernel the server picked and how
its Triton config was found (`moe_kernel`, `startup_moe_kernel`), which attention backend
decodes (`attention_backend`, `startup_attention_backend`), the `server_args=` line
(`server_args`, `LoggedServerArgs`) and the lines saying graphs are disabled (`graph_setting`).
Checked on a real log: SGLang 0.5.23's own server, PP2 on CPU (tests/fixtures/sglang_lab/).

Which lines are the same batch and which are different batches (SGLang 0.5.23 logs only from
schedulers with attention-TP rank 0 and attention-CP rank 0, `is_stats_logging_rank`; older
releases logged from every TP rank): within one PP rank, each DP rank (`DP{d}`) runs its own
scheduler and its own batches, so every DP rank's lines count (data-parallel attention: all 8
DP ranks of a TP8/DP8 deployment log their own batch). The TP and attention-CP ranks of one
(PP, DP) scheduler log the same batch, so only the lowest (ATTN_CP, TP) rank's lines are kept;
the others are counted in `lines_other_tp`. Per PP rank, `by_dp` gives each DP rank's own
numbers; the rank's own numbers pool all its DP ranks' lines (slot windows never mix two DP
ranks).

How to read it: `lines_unrecognised` counts batch lines that could not be parsed (a line cut
mid-way, an unknown layout); `lines_other` counts everything else (HTTP access lines...). Neither
is fatal, neither is silently dropped; a file with no batch line at all is listed in
`files_without_batch_lines`. Unreadable files (missing, a directory, truncated gzip, empty,
binary, a "line" over 1 MB such as /dev/zero) and a set of files with no batch line at all (not a
server log, or logged below info level) raise a one-line CliError.

Streaming: files are read in 8 MB blocks and each batch line is reduced to a few numbers in
numpy arrays, so memory grows with the number of batch lines (~30 bytes each), not with the file.
A block is read with whole-block operations (split, regular expressions over all its decode
lines at once, fixed-width numpy decoding of the standard `[date time tags]` prefix); lines
those do not fit (another layout, a custom prefix, a cut line) are read one by one, in their
place. Large plain files are split into byte ranges read by worker processes when the machine
has cores to spare. See microbench/bench/log_reader.py and docs/BENCHMARKS.md for MB/s
and peak memory.

Slot-imbalance index (our definition): the log samples one decode step every
`--decode-log-interval` steps of a rank, each naming the size of the slot it ran. Over windows of
`window` consecutive decode lines of one scheduler (default 16 = PP8 + async depth 8; `pp +
depth` is the number of slots), we take max / mean of `#running-req` (1.0 = every sampled slot
the same size; `window` = all requests in one slot) and report the median over windows, plus the
coefficient of variation (population std / mean) of all sampled sizes. With several DP ranks the
windows of all of them are pooled and `cv` is the median of their cvs. It is a sampled
estimate: with interval 40 and 16 slots the log visits only the slots 40·k mod 16 apart.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Iterable

from reports.base.payloads.sglang import SglangData
from reports.base.schema import from_json

from microbench.sglang.log_scan import (BatchLine, LogScan, parse_line, scan_logs,  # noqa: F401
                                        worker_count)
from microbench.sglang.log_startup import (LoggedServerArgs, Startup, graph_setting,  # noqa: F401
                                           startup, startup_attention_backend,
                                           startup_moe_kernel)
from microbench.sglang.log_summary import (PREFILL_WAVES, config_overrides,  # noqa: F401
                                           slot_imbalance, summarize)

# The reader is carved by job: log_scan.py (the batch lines, scanned), log_summary.py (per-rank
# summaries), log_startup.py (start-up lines); this module is what the commands call.


def read_logs(paths: Iterable[str | Path], window: int = 16, bin_s: float = 10.0,
              workers: int | None = None) -> SglangData:
    """The log's part of sglang.json, typed (reports/base/payloads/sglang.py): `ranks`,
    `slot_imbalance` and `log` (LogSummary) of an SglangData; its other parts are left empty."""
    paths = list(paths)
    out = summarize(scan_logs(paths, workers=workers), window=window, bin_s=bin_s)
    st = startup(paths)
    ranks, imbalance = out.pop("ranks"), out.pop("slot_imbalance")
    out["server_settings"], out["moe_kernel"], out["attention_backend"] = \
        st.settings, st.moe_kernel, st.attention_backend
    out["server_args"] = None if st.server_args is None else asdict(st.server_args)
    out["graph_setting"] = graph_setting(st.server_args, st.graph_notes)
    return from_json(SglangData, {"ranks": ranks, "slot_imbalance": imbalance, "log": out})
