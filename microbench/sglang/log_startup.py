"""What SGLang prints when it starts: the resolved settings, `server_args=`, the MoE kernel and
its config file, the attention backend, graphs disabled by a setting (microbench/sglang/log.py)."""
from __future__ import annotations

import ast
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator


from microbench.sglang.log_scan import MAX_LINE_BYTES, clean_block, open_blocks
from reports.base.server_flags import GRAPH_MAX_BS_FLAG, LOOP_FLAGS, SERVER_FLAGS, SHAPE_FLAGS


# The scheduler's start-up line (SGLang 0.5.23 managers/scheduler.py, `Scheduler.__init__`):
# "max_total_num_tokens=N, chunked_prefill_size=N, max_prefill_tokens=N,
#  max_running_requests=N, context_len=N, available_gpu_mem=X GB"
# (the settings' keys from reports/base/server_flags.py, where each setting's names are)
_STARTUP_KEYS = ("max_total_num_tokens", *(f.startup for f in SERVER_FLAGS if f.startup),
                 "context_len")
_SETTINGS_RE = re.compile(rb"\b(" + "|".join(_STARTUP_KEYS).encode() + rb")=(-?\d{1,12})\b")
SETTINGS_BYTES = 8 << 20     # the start-up line is among a log's first lines: read no further


def _startup_blocks(path: Path) -> Iterator[bytes]:
    """The first SETTINGS_BYTES of a log as blocks of whole lines (a line cut by a block edge is
    completed by the next blocks: the server_args line alone is ~20 kB); nothing for a file the
    scan already found unreadable."""
    seen = 0
    tail = b""
    try:
        for block in open_blocks(path):
            seen += len(block)
            cut = block.rfind(b"\n")
            if cut < 0:      # no line ends in this block: the line goes on in the next
                tail = tail + block if len(tail) + len(block) <= MAX_LINE_BYTES else b""
            else:
                block, tail = tail + block[:cut + 1], block[cut + 1:]
                if len(tail) > MAX_LINE_BYTES:
                    tail = b""
                yield clean_block(block)
            if seen >= SETTINGS_BYTES:
                return
        if tail:
            yield clean_block(tail)
    except (EOFError, OSError, zlib.error):  # the scan already said what is wrong with it
        return


def _settings_in(block: bytes) -> dict[str, int] | None:
    if b"max_running_requests=" not in block:
        return None
    for line in block.splitlines():
        if b"max_running_requests=" in line:
            return {k.decode(): int(v) for k, v in _SETTINGS_RE.findall(line)}
    return None


# Which MoE kernel the server runs, from its start-up lines (SGLang 0.5.23):
# - layers/quantization/compressed_tensors/compressed_tensors.py logs the scheme it picks for a
#   compressed-tensors MoE once, `Using CompressedTensorsWNA16MarlinMoEMethod` (INT4 W4A16 on
#   CUDA by default: Marlin) or `Using CompressedTensorsWNA16TritonMoE (<reason>)` (Triton:
#   `--moe-runner-backend triton`, SM100/SM103 by default, ROCm), `Using
#   CompressedTensorsW8A8Fp8MoE`, ...;
# - layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py, when the Triton fused MoE
#   loads its block config: `Using MoE kernel config from <file>.` (tuned for this GPU and
#   shape), a warning `Config file not found at <file>. Fallback to triton version <v> and use
#   MoE kernel config from <file>. ...`, or `Using default MoE kernel config. Performance might
#   be sub-optimal! Config file not found at <file>, ...` (untuned).
_MOE_SCHEME_RE = re.compile(rb"\bUsing ([A-Za-z0-9_]*Mo[Ee](?:Method)?)\b(?: \(([^)\n]{0,80})\))?")
_CFG_FILE = rb"(\S{1,400}?\.json|\S{1,400}?)"          # the file names hold commas and dots
_MOE_TUNED_RE = re.compile(rb"Using MoE kernel config from " + _CFG_FILE + rb"\.?\s*$")
_MOE_FALLBACK_RE = re.compile(rb"Fallback to triton version (\S{1,40}) and use MoE kernel config "
                              rb"from " + _CFG_FILE + rb"\.(?:\s|$)")
_MOE_DEFAULT_RE = re.compile(rb"Using default MoE kernel config\.(?:.*?Config file not found at "
                             + _CFG_FILE + rb"[,.]?(?:\s|$))?")


def _moe_kind(scheme: str) -> str:
    s = scheme.lower()
    return "marlin" if "marlin" in s else "triton" if "triton" in s else "other"


def _moe_in(block: bytes, out: dict[str, str]) -> None:
    """Fill `out` (see `startup_moe_kernel`) from the MoE lines of `block`; first line wins."""
    if b"MoE" not in block and b"Moe" not in block:
        return
    for line in block.splitlines():
        if b"Mo" not in line:
            continue
        line = line.rstrip()
        m = _MOE_SCHEME_RE.search(line)
        if m and "scheme" not in out and m.group(1) != b"MoE":   # not "Using MoE kernel..."
            out["scheme"] = m.group(1).decode()
            out["kernel"] = _moe_kind(out["scheme"])
            if m.group(2):
                out["reason"] = m.group(2).decode(errors="replace")
        if "triton_config" in out:
            continue
        if (m := _MOE_FALLBACK_RE.search(line)):
            out["triton_config"] = "fallback"
            out["config_file"] = m.group(2).decode(errors="replace")
        elif (m := _MOE_DEFAULT_RE.search(line)):
            out["triton_config"] = "default"
            if m.group(1):
                out["config_file"] = m.group(1).decode(errors="replace")
        elif (m := _MOE_TUNED_RE.search(line)):
            out["triton_config"] = "tuned"
            out["config_file"] = m.group(1).decode(errors="replace")


# The resolved server arguments, logged once by the launching process (SGLang 0.5.23
# srt/entrypoints/engine.py: "server_args={'model_path': ..., 'pp_size': 2, ...}", a dict repr;
# "server_args=ServerArgs(model_path=..., pp_size=2, ...)" in releases before the argument
# groups). The few that decide how a PP deployment batches, and whether decode may run on
# graphs, are kept (`LoggedServerArgs`); the dict is read with ast.literal_eval, each key by a regular
# expression where that fails (a value whose repr is not a literal) and in the old form.
_SERVER_ARGS_WORD = b"server_args="


@dataclass(frozen=True)
class LoggedServerArgs:
    """What the `server_args=` line says (None: not in it, or not that type). `None` for
    max_running_requests / pp_max_micro_batch_size / chunked_prefill_size means SGLang chose the
    value at start-up (the scheduler line, `server_settings`, has what it chose)."""
    form: str                                  # "dict" (0.5.23) | "ServerArgs(...)" (older)
    pp_size: int | None = None
    tp_size: int | None = None
    device: str | None = None
    attention_backend: str | None = None
    disable_cuda_graph: bool | None = None
    # 0.5.23 resolves graph use per phase: cuda_graph_config['decode']['backend'] ("disabled"
    # when --disable-cuda-graph, --cuda-graph-backend-decode=disabled or an auto-disable rule)
    decode_graph_backend: str | None = None
    cuda_graph_max_bs: int | None = None       # the largest decode batch captured
    enable_torch_compile: bool | None = None   # on CPU, the only way to a CPU graph
    pp_async_batch_depth: int | None = None
    pp_max_micro_batch_size: int | None = None
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None


_SA_SCALAR = rb"(None|True|False|-?\d{1,12}(?:\.\d{1,12})?|'[^'\n]{0,200}')"


def _sa_key(text: bytes, key: str):
    """One `'key': value` / `key=value` of the line as a Python value (not found: ...)."""
    m = re.search(rb"(?<![A-Za-z0-9_])'?" + key.encode() + rb"'?(?:=|: )" + _SA_SCALAR, text)
    if m is None:
        return ...
    try:
        return ast.literal_eval(m.group(1).decode())
    except (ValueError, SyntaxError):
        return ...


def _typed(v, tp: type):
    """v when it is a `tp` (an int is not a bool here, nor a bool an int), else None."""
    if tp is int and isinstance(v, bool):
        return None
    return v if isinstance(v, tp) else None


def _server_args_in(block: bytes) -> LoggedServerArgs | None:
    i = block.find(_SERVER_ARGS_WORD)
    if i < 0:
        return None
    end = block.find(b"\n", i)
    text = block[i + len(_SERVER_ARGS_WORD):end if end >= 0 else len(block)].strip()
    d = None
    if text.startswith(b"{"):
        try:
            d = ast.literal_eval(text.decode("utf-8", errors="replace"))
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            d = None
    elif not text.startswith(b"ServerArgs("):
        return None
    get = (lambda k: d.get(k, ...)) if isinstance(d, dict) else (lambda k: _sa_key(text, k))
    graph = get("cuda_graph_config")
    dec = graph.get("decode") if isinstance(graph, dict) else None
    if not isinstance(dec, dict):   # the regular-expression read, or no such argument
        m = re.search(rb"'cuda_graph_config': \{'decode': \{([^{}]{0,400})", text)
        dec = {k: _sa_key(m.group(1), k) for k in ("backend", "max_bs")} if m else {}
    # resolved into cuda_graph_config (0.5.23), else the flag's own field, else the older key
    g = GRAPH_MAX_BS_FLAG
    max_bs = next((v for v in (dec.get("max_bs"), get(g.server_arg), get(g.older_arg))
                   if _typed(v, int) is not None), None)
    backend = dec.get("backend")
    if _typed(backend, str) is None:
        backend = get("cuda_graph_backend_decode")
    return LoggedServerArgs(
        form="dict" if text.startswith(b"{") else "ServerArgs(...)",
        device=_typed(get("device"), str), attention_backend=_typed(get("attention_backend"), str),
        disable_cuda_graph=_typed(get("disable_cuda_graph"), bool),
        decode_graph_backend=_typed(backend, str), cuda_graph_max_bs=max_bs,
        enable_torch_compile=_typed(get("enable_torch_compile"), bool),
        **{f.setting: _typed(get(f.server_arg), int) for f in LOOP_FLAGS + SHAPE_FLAGS})


# Start-up lines that say decode graphs are off by a setting (SGLang 0.5.23 srt/arg_groups/):
# "Cuda graph is disabled because of using torch native attention backend" (attention_hook.py;
# also flex attention, deepep_mode=`normal` in moe_hook.py, "CUDA graph is disabled because
# --enable-mis is set.", "Cuda graph is disabled for diffusion LLM inference on AMD GPUs"), and
# argparse_actions.py's warning that the flag was given, "'--disable-cuda-graph' is deprecated
# and will be removed ..." (printed between ANSI colour codes).
_GRAPH_OFF_RE = re.compile(rb"(?i)\bcuda graph is disabled\b[^\n\x1b]{0,200}")
_GRAPH_FLAG_RE = re.compile(rb"'--disable-cuda-graph' is deprecated")


def _graph_notes_in(block: bytes, out: list[str]) -> None:
    """Append (once each) the lines of `block` that say decode graphs are off by a setting."""
    if b"raph is disabled" not in block and b"--disable-cuda-graph" not in block:
        return
    for m in _GRAPH_OFF_RE.finditer(block):
        note = m.group(0).decode("utf-8", errors="replace").strip()
        if note not in out:
            out.append(note)
    flag = "--disable-cuda-graph given (SGLang's deprecation warning for it)"
    if _GRAPH_FLAG_RE.search(block) and flag not in out:
        out.append(flag)


def graph_setting(sa: LoggedServerArgs | None, notes: Iterable[str]) -> dict:
    """Whether decode graphs are off BY SETTING, and why: `off_by_setting` True (with
    `reasons`), False (the server arguments leave them on: a decode line with `graph: False`
    then is a real fallback), None (the log says neither). SGLang 0.5.23 decides it in
    model_runner_components/cuda_graph_setup.py `capture_decode_graph`: on CPU a graph is
    captured only with --enable-torch-compile (the CUDA switches are not read there); on other
    devices not when cuda_graph_config's decode backend is "disabled", which
    --disable-cuda-graph and the auto-disable rules of the notes above set."""
    notes = list(notes)
    reasons: list[str] = []
    if sa is not None and sa.device == "cpu":
        if sa.enable_torch_compile:
            return {"off_by_setting": False, "reasons": []}
        reasons.append("device cpu without --enable-torch-compile: SGLang captures no CPU graph")
    if sa is not None and sa.disable_cuda_graph:
        reasons.append("server_args disable_cuda_graph=True")
    if sa is not None and sa.decode_graph_backend == "disabled":
        reasons.append("server_args cuda_graph_config decode backend 'disabled'")
    reasons += [n if n.startswith("--") else f"SGLang: {n}" for n in notes]
    if reasons:
        return {"off_by_setting": True, "reasons": reasons}
    said = sa is not None and (sa.decode_graph_backend, sa.disable_cuda_graph) != (None, None)
    return {"off_by_setting": False if said else None, "reasons": []}


@dataclass(frozen=True)
class Startup:
    """What a log's start-up lines say (see `startup`)."""
    settings: dict
    moe_kernel: dict
    attention_backend: dict
    server_args: LoggedServerArgs | None
    graph_notes: tuple[str, ...]


def startup(paths: Iterable[str | Path]) -> Startup:
    """The start-up lines, one read of at most SETTINGS_BYTES per file: the settings of the
    first file that has the line (every rank logs the same), the MoE lines of the first file
    that has any, the attention backend of the first file that names one, the server arguments
    of the first file that has them, and every graph note (once each)."""
    settings: dict[str, int] = {}
    moe: dict[str, str] = {}
    attn: dict[str, str] = {}
    sa: LoggedServerArgs | None = None
    notes: list[str] = []
    for p in paths:
        file_moe: dict[str, str] = {}
        file_attn: dict[str, str] = {}
        for block in _startup_blocks(Path(p)):
            if not settings:
                settings = _settings_in(block) or {}
            if not moe:
                _moe_in(block, file_moe)
            if not attn:
                _attn_in(block, file_attn)
            if sa is None:
                sa = _server_args_in(block)
            _graph_notes_in(block, notes)
            if settings and (moe or ("scheme" in file_moe and "triton_config" in file_moe)) \
                    and (attn or file_attn.get("source", "").startswith("--")) and sa is not None:
                break
        moe = moe or file_moe
        attn = attn or file_attn
        if settings and moe and attn and sa is not None:
            break
    return Startup(settings, moe, attn, sa, tuple(notes))


# Which attention backend decodes (SGLang 0.5.23): with none given, srt/arg_groups/overrides.py
# `_attention_backend_default` logs "Attention backend not specified. Use <backend> backend by
# default." (for MLA models: fa3 on Hopper, flashinfer on SM100, triton on other CUDA GPUs,
# `get_default_attn_backend`); the engine logs the resolved arguments once, "server_args={...,
# 'attention_backend': 'triton', ..., 'decode_attention_backend': None, ...}" (a dict since the
# argument groups; "ServerArgs(..., attention_backend='triton', ...)" in older releases). A
# decode backend given apart (--decode-attention-backend) is the one decode runs.
_ATTN_DEFAULT_RE = re.compile(rb"Attention backend not specified\. Use ([A-Za-z0-9_]{1,40}) "
                              rb"backend by default")
_ATTN_ARG_RE = re.compile(rb"(?<![A-Za-z0-9_])'?(decode_attention_backend|attention_backend)'?"
                          rb"(?:=|: )'([A-Za-z0-9_]{1,40})'")


def _attn_in(block: bytes, out: dict[str, str]) -> None:
    """Fill `out` (see `startup_attention_backend`) from `block`: a decode backend given apart
    wins over the backend for both, which wins over the default SGLang says it picked."""
    if b"ttention backend" not in block and b"attention_backend" not in block:
        return
    rank = {"--decode-attention-backend": 3, "--attention-backend": 2, "default": 1}
    for line in block.splitlines():
        found = []
        if (m := _ATTN_DEFAULT_RE.search(line)):
            found.append(("default", m.group(1)))
        if b"server_args" in line or b"ServerArgs(" in line:
            for k, v in _ATTN_ARG_RE.findall(line):
                found.append(("--decode-attention-backend" if k.startswith(b"decode")
                              else "--attention-backend", v))
        for src, v in found:
            if rank[src] > rank.get(out.get("source", ""), 0):
                out["backend"], out["source"] = v.decode(), src


def startup_moe_kernel(paths: Iterable[str | Path]) -> dict[str, str]:
    """What the log says about the server's MoE kernel (the lines above), from at most
    SETTINGS_BYTES of each file: `scheme` (the quantisation scheme SGLang picked), `kernel`
    (marlin / triton / other), `reason` (why Triton, when SGLang says), `triton_config` (tuned /
    fallback / default: the Triton fused MoE's block config), `config_file`. Empty when the log
    has none of them (a bf16 model, or logged below info level)."""
    return startup(paths).moe_kernel


def startup_attention_backend(paths: Iterable[str | Path]) -> dict[str, str]:
    """Which attention backend decodes, from the start-up lines (above): `backend` (as SGLang
    names it: triton, fa3, flashinfer, flashmla, trtllm_mla, ...) and `source`
    (--decode-attention-backend / --attention-backend: the resolved arguments; default: SGLang's
    line saying it picked its default). Empty when the log names none."""
    return startup(paths).attention_backend
