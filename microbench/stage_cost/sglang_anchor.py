"""SGLang's own MLA decode attention timed beside ppscope's, on the same queries and cache.

Why: `stage-cost` times ppscope's kernels and the report carries their fraction of the floor
over to the user's GPU. For MLA models (DeepSeek-V3, Kimi K2) SGLang 0.5.23 picks its Triton
attention backend by default on every CUDA GPU that is neither Hopper (fa3) nor SM100
(flashinfer) (`get_default_attn_backend`, srt/arg_groups/model_override_base.py): the user's
RTX PRO 6000 (sm_120) runs SGLang's `decode_attention_fwd` (kernels/ops/attention/
decode_attention.py) at every decode step. This probe calls that function (SGLang's code, not a
copy) and ppscope's attention (`mla_decode.make_attention`: the attention and the merge of the
context splits) on one set of absorbed queries and one latent cache, checks both against a
float32 softmax, and times both the same way, so the user sees how far the kernel their server
runs is from ppscope's and from the floor.

What SGLang is handed is what its Triton backend hands it at decode: q [b, h, kv_lora + rope],
the key buffer [slots, 1, kv_lora + rope] and the value buffer as its first kv_lora columns (the
MLA token pool's views), page size 1, the per-request split counts from its own
`get_num_kv_splits_triton` (kernels/ops/attention/metadata.py; run once per step in the
backend's metadata, so outside the timed call) under the backend's split cap
(`max_kv_splits`: max(--triton-attention-num-kv-splits = 8, min(next power of two of the SM
count, next power of two of ceil(context length / 32))), triton_backend.py
`_mla_decode_kv_splits_cap`), PDL where SGLang's `is_arch_support_pdl` says the GPU supports it (sm_90 and up).

Timing: CUDA-graph replay (`do_bench_graph`); each graph calls the kernel on enough copies of
the cache in turn that they span twice the L2 cache, so every call reads its cache from HBM as
a served step does; figures per call. Floor: the cache bytes of the batch (b x ctx x
(kv_lora + rope) x 2) at the spec-sheet bandwidth; queries and outputs are left out (< 1%).

Run where SGLang is installed (the user's server machine):
    python3 -m microbench.stage_cost.sglang_anchor --batches 1,8,32,128 --json results/sglang_anchor.json
The record is ppscope's (`reports/base/records.py`: probe `sglang_anchor`, provenance, status):
a `partial` one after each batch size, `ok` at the end, a batch size that fails recorded with its
error; without a GPU or SGLang a `waived` one and exit 2. Only an `ok` run replaces a good
record. It never writes a figure it did not time.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time

from microbench.stage_cost.cli import int_list
from reports.base.paths import default_record_path, json_path

PROBE = "sglang_anchor"
DEFAULT_SPLITS = 8          # SGLang's --triton-attention-num-kv-splits default (0.5.23)
MIN_BLOCK_KV = 32           # triton_backend.py _MLA_DECODE_MIN_BLOCK_KV (0.5.23)


def _p2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def max_kv_splits(sms: int, max_context: int, base: int = DEFAULT_SPLITS) -> int:
    """The split cap SGLang 0.5.23's Triton backend sets for an MLA model
    (`_mla_decode_kv_splits_cap`): the base (--triton-attention-num-kv-splits) raised to the
    smaller of the SM count and the context's 32-row blocks, each to a power of two."""
    if sms <= 0:
        return base
    return max(base, min(_p2(sms), _p2(-(-max_context // MIN_BLOCK_KV))))


def sglang_kernels():
    """(decode_attention_fwd, get_num_kv_splits_triton, pdl_ok, version), or a reason string
    when SGLang (or the part of it these live in) does not import here."""
    try:
        from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
        from sglang.kernels.ops.attention.metadata import get_num_kv_splits_triton
    except Exception as e:  # noqa: BLE001 - not installed, another release, missing deps
        return f"SGLang's Triton MLA decode does not import here ({type(e).__name__}: {e})"
    pdl = False   # the backend's own test (triton_backend.py imports it from sgl_kernel)
    for mod in ("sgl_kernel.utils", "sglang.kernels.jit.utils.arch"):
        try:
            pdl = bool(__import__(mod, fromlist=["x"]).is_arch_support_pdl())
            break
        except Exception:  # noqa: BLE001 - not there, or no GPU to ask: no PDL
            continue
    try:
        from importlib.metadata import version
        ver = version("sglang")
    except Exception:  # noqa: BLE001 - a source tree without metadata
        ver = getattr(sys.modules.get("sglang"), "__version__", "unknown")
    return decode_attention_fwd, get_num_kv_splits_triton, pdl, ver


def sglang_attention(decode_fwd, n_splits_fn, q_lat, q_rope, ctx: int, sm: float, cap: int,
                     sms: int, pdl: bool = False, fixed: int | None = None):
    """call(cache [b, ctx, kv_lora + rope]) -> o [b, h, kv_lora]: SGLang's `decode_attention_fwd`
    handed what its Triton backend hands it at decode (module docstring), for absorbed queries
    q_lat [h, b, kv_lora] and q_rope [b, h, rope]. The split counts are SGLang's, computed once
    here (outside the timed call, as in the backend's per-step metadata); `call.splits` lists
    them. `fixed`: every request split into that many parts instead (<= cap): SGLang's kernel
    under a split count its scheduler would not pick, to see what the count costs."""
    import torch
    import triton

    h, b, kl = q_lat.shape
    row, dev = kl + q_rope.shape[-1], q_lat.device
    q = torch.cat([q_lat.transpose(0, 1), q_rope], -1).contiguous()       # [b, h, kl + rope]
    kv_indptr = torch.arange(0, (b + 1) * ctx, ctx, device=dev, dtype=torch.int32)
    kv_indices = torch.arange(b * ctx, device=dev, dtype=torch.int32)
    seq_lens = torch.full((b,), ctx, device=dev, dtype=torch.int32)
    n_splits = torch.empty(b, device=dev, dtype=torch.int32)
    if fixed is not None:
        if not 1 <= fixed <= cap:
            raise ValueError(f"fixed split count {fixed} outside 1..{cap}")
        n_splits.fill_(fixed)
    else:
        n_splits_fn[(1,)](n_splits, seq_lens, b, 1, h, 1, cap, sms,
                          MAX_NUM_SEQ=max(256, triton.next_power_of_2(b)))
    logits = torch.empty(b, h, cap, kl, device=dev, dtype=torch.float32)
    lse = torch.empty(b, h, cap, device=dev, dtype=torch.float32)
    o = torch.empty(b, h, kl, device=dev, dtype=q.dtype)

    def call(cache):
        k = cache.view(b * ctx, 1, row)                # the MLA pool's key buffer, page size 1
        decode_fwd(q, k, k[..., :kl], o, kv_indptr, kv_indices, logits, lse, n_splits, cap,
                   sm, 1.0, 1.0, has_mla=True, use_pdl=pdl)
        return o
    call.splits = sorted(set(n_splits.tolist()))
    return call


def reference(q_lat, q_rope, cache, kl: int, sm: float):
    """float32 softmax attention over the latent cache: [b, h, kl]."""
    import torch

    c = cache.float()
    s = (torch.einsum("hbk,bck->bhc", q_lat.float(), c[..., :kl])
         + torch.einsum("bhr,bcr->bhc", q_rope.float(), c[..., kl:])) * sm
    return torch.einsum("bhc,bck->bhk", torch.softmax(s, -1), c[..., :kl])


def rel_err(out, ref) -> float:
    import torch
    return float(torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref))


def _argv() -> list[str]:
    return ["python3", "-m", "microbench.stage_cost.sglang_anchor", *sys.argv[1:]]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m microbench.stage_cost.sglang_anchor", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="kimi-k2", help="preset name or HF config.json path "
                   "(an MLA model; default kimi-k2)")
    p.add_argument("--batches", type=int_list, default=(1, 2, 4, 8, 16, 32, 64, 128),
                   help="micro-batch sizes, e.g. 1,8,32,128")
    p.add_argument("--context-len", type=int, default=2048,
                   help="tokens of latent cache per request (default 2048)")
    p.add_argument("--server-context", type=int, default=None,
                   help="the server's --context-length, which caps SGLang's split count "
                   "(default: the model's max_position_embeddings)")
    p.add_argument("--forced-splits", type=int_list, default=(8, 32),
                   help="also time SGLang's kernel with every request split into this many "
                   "parts (not a server setting: what its split count costs; default 8,32)")
    p.add_argument("--json", default=str(default_record_path(PROBE)),
                   help="the record (default results/sglang_anchor.json; ppscope's record "
                   "envelope and status rule: only a finished run replaces a good record)")
    return p


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    prog = PROBE
    if a.context_len < 2:
        print(f"{prog}: --context-len must be >= 2, got {a.context_len}", file=sys.stderr)
        return 2
    from reports.base.model_config import load_model
    try:
        m = load_model(a.model)
    except (ValueError, OSError) as e:
        print(f"{prog}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if m.attention != "mla":
        print(f"{prog}: {m.name} has no MLA attention", file=sys.stderr)
        return 2
    import torch
    why = "needs a CUDA GPU" if not torch.cuda.is_available() else None
    sg = None if why else sglang_kernels()
    if isinstance(sg, str):
        why = sg
    if why:   # cannot run here: a waived record (beside a good one, never over it), exit 2
        from microbench.kit.run_writer import ToolWriter
        return ToolWriter(a.json, PROBE, _argv()).waive(why)
    decode_fwd, n_splits_fn, pdl, sg_ver = sg
    return _run(a, m, decode_fwd, n_splits_fn, pdl, sg_ver)


def _run(a, m, decode_fwd, n_splits_fn, pdl: bool, sg_ver: str) -> int:
    import torch
    import triton
    from tabulate import tabulate
    from tqdm import tqdm

    from microbench.kernels import mla_decode
    from microbench.kit.clocks import ClockSampler
    from microbench.kit.timing import do_bench_graph, l2_bytes
    from reports.base.gpu_specs import match_gpu
    from microbench.kit.run_writer import ToolWriter

    dev = torch.device("cuda")
    h, kl, rope, nope = m.num_heads, m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim
    sm = (nope + rope) ** -0.5
    ctx, row = a.context_len, kl + rope
    props = torch.cuda.get_device_properties(dev)
    sms, l2 = props.multi_processor_count, l2_bytes(dev)
    spec = match_gpu(props.name)
    bw = spec.mem_bw_gbps if spec else None
    server_ctx = a.server_context or m.max_position_embeddings or ctx
    cap = max_kv_splits(sms, server_ctx)
    partials, merge = mla_decode.make_attention(h, kl, rope, nope, dev)
    # ppscope's Triton attention alone: what runs where mla_attn_mma cannot (sm_120's 99 KiB)
    tri_partials, _ = mla_decode.make_attention(
        h, kl, rope, nope, dev, dataclasses.replace(mla_decode.CONFIG, mma_attn_min_b=0))
    clocks = ClockSampler(torch.cuda.current_device())
    res = {"gpu": props.name, "spec": spec.name if spec else None, "model": m.name,
           "heads": h, "kv_lora": kl, "rope": rope, "context_len": ctx,
           "server_context": server_ctx, "sglang": sg_ver, "sglang_max_kv_splits": cap,
           "sglang_pdl": pdl, "torch": torch.__version__, "triton": triton.__version__,
           "mem_bw_spec_gbps": bw, "l2_bytes": l2,
           "timing": "CUDA-graph replay over cache copies spanning 2x L2; per call",
           "floor_counts": "the batch's latent cache (kv_lora + rope, bf16) at the spec "
                           "bandwidth", "rows": []}
    out = json_path(a.json, default_record_path(PROBE))
    t0 = time.perf_counter()
    g = torch.Generator(device=dev).manual_seed(0)

    def one(b: int) -> dict:
        """Check and time every variant at micro-batch b (fresh inputs)."""
        cache_b = b * ctx * row * 2
        n = max(1, min(64, math.ceil(2 * l2 / cache_b))) if l2 else 1
        caches = [torch.randn(b, ctx, row, device=dev, generator=g).to(torch.bfloat16)
                  for _ in range(n)]
        q_lat = torch.randn(h, b, kl, device=dev, generator=g).to(torch.bfloat16)
        q3 = torch.randn(b, h, nope + rope, device=dev, generator=g).to(torch.bfloat16)
        theirs = sglang_attention(decode_fwd, n_splits_fn, q_lat, q3[:, :, nope:], ctx, sm,
                                  cap, sms, pdl)

        def ours(c):
            o, ml = partials(q_lat, q3, c, ctx)
            return merge(o, ml, torch.bfloat16)

        ref = reference(q_lat, q3[:, :, nope:], caches[0], kl, sm)
        r = {"b": b, "cache_mb": cache_b / 1e6, "cache_copies": n,
             "ppscope_kernel": mla_decode.kernel_name(b, heads=h, kv_lora=kl, rope=rope)
             .split(";")[0].replace("mla_decode (", ""),
             "sglang_splits": theirs.splits,
             "floor_us": cache_b / (bw * 1e3) if bw else None}
        r["ppscope_rel_err"] = rel_err(ours(caches[0]).transpose(0, 1), ref)
        r["sglang_rel_err"] = rel_err(theirs(caches[0]), ref)
        variants = [("ppscope", ours), ("sglang", theirs)]
        if mla_decode.mma_attention(b) and "mla_attn_mma" in r["ppscope_kernel"]:
            def ours_triton(c):
                o, ml = tri_partials(q_lat, q3, c, ctx)
                return merge(o, ml, torch.bfloat16)
            variants.append(("ppscope_triton", ours_triton))
            r["ppscope_triton_rel_err"] = rel_err(ours_triton(caches[0]).transpose(0, 1), ref)
        for k in a.forced_splits:
            if k <= cap:
                variants.append((f"sglang_{k}splits", sglang_attention(
                    decode_fwd, n_splits_fn, q_lat, q3[:, :, nope:], ctx, sm, cap, sms, pdl,
                    fixed=k)))
                r[f"sglang_{k}splits_rel_err"] = rel_err(variants[-1][1](caches[0]), ref)
        del ref
        for key, fn in variants:
            if r[f"{key}_rel_err"] > 2e-2 or not math.isfinite(r[f"{key}_rel_err"]):
                r[f"{key}_us"] = None        # wrong answers are not timed
                continue
            clocks.start()
            try:
                t = do_bench_graph(lambda: [fn(c) for c in caches][-1]).scaled(n)
            finally:
                c = clocks.stop()
            r.update({f"{key}_us": t.median_us, f"{key}_p20_us": t.p20_us,
                      f"{key}_p80_us": t.p80_us, f"{key}_sm_clock_mhz": c.sm_mhz_median,
                      f"{key}_clock_limits": ",".join(c.reasons) or None})
            if r["floor_us"]:
                r[f"{key}_pct_floor"] = 100 * r["floor_us"] / t.median_us
        if r.get("ppscope_us") and r.get("sglang_us"):
            r["sglang_over_ppscope"] = r["sglang_us"] / r["ppscope_us"]
        caches = None   # freed (the timed lambdas held it)
        return r

    writer = ToolWriter(out, PROBE, _argv())
    for i, b in enumerate(tqdm(a.batches, desc="sglang anchor", unit="batch", file=sys.stderr)):
        try:
            r = one(b)
        except (RuntimeError, ValueError) as e:   # CUDA out of memory, a kernel that fails
            r = {"b": b, "error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"}
            print(f"{PROBE}: b={b}: {r['error']}", file=sys.stderr)
        torch.cuda.empty_cache()
        res["rows"].append(r)
        res["wall_s"] = time.perf_counter() - t0
        if i + 1 < len(a.batches):   # what is timed so far, kept if the run stops here
            writer.record(res, "partial", f"{i + 1} of {len(a.batches)} batch sizes")
    good = [r for r in res["rows"] if "error" not in r]
    failed = [f"b={r['b']}: {r['error']}" for r in res["rows"] if "error" in r]
    dest, note = (writer.record(res) if good else
                  writer.record(res, "error", "; ".join(failed)))
    if not good:
        print(f"{PROBE}: nothing timed ({failed[0]}); error record: {dest}", file=sys.stderr)
        return 1

    def f(v, d=1):
        return "-" if v is None else f"{v:.{d}f}"
    forced = [k for k in a.forced_splits if k <= cap]
    rows = [[r["b"], f(r["floor_us"]), f(r.get("ppscope_us")), f(r.get("ppscope_pct_floor"), 0),
             r["ppscope_kernel"], f(r.get("sglang_us")), f(r.get("sglang_pct_floor"), 0),
             f(r.get("sglang_over_ppscope"), 2), ",".join(map(str, r["sglang_splits"]))]
            + [f(r.get(f"sglang_{k}splits_us")) for k in forced]
            + [f(r.get("ppscope_triton_us"))]
            + [f"{r['ppscope_rel_err']:.1e} / {r['sglang_rel_err']:.1e}"] for r in good]
    print(f"{props.name}: MLA decode attention, {h} heads, {ctx} tokens of cache per request; "
          f"SGLang {sg_ver} (split cap {cap}, PDL {'on' if pdl else 'off'})")
    print(tabulate(rows, headers=["b", "floor us", "ppscope us", "% floor", "ppscope kernel",
                                  "SGLang us", "% floor", "SGLang / ppscope", "SGLang splits"]
                   + [f"SGLang, {k} splits us" for k in forced]
                   + ["ppscope Triton us"]
                   + ["rel. err (ours / SGLang)"]))
    for line in failed:
        print(f"not timed: {line}")
    print(f"record: {dest}" + (f" ({note})" if note else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
