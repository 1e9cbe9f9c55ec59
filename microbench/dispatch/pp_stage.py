"""The work one rank of the PP-loop probe runs per forward (microbench/dispatch/pp_loop.py): real
Kimi-K2-dims MoE layers (`build_moe_stage`, the backend chosen as stage-cost chooses it and
checked first) or a calibrated sleep kernel following a cost curve (`build_work`), the fault
switches' calibration and the CUDA graphs per SGLang capture size. Everything here imports
torch lazily; it runs only inside torchrun ranks (and the CPU tests at tiny sizes)."""
from __future__ import annotations

from microbench.kit.graph_capture import capture_graph
from reports.base.cuda_graphs import capture_sizes, padded  # SGLang's decode capture rule
from reports.base.interp import interp_linear
from microbench.dispatch.rank_config import RankConfig, rank_config

def interp_cost(pts: list[tuple[int, float]], b: float) -> float:
    """Linear interpolation in batch size; constant below the first point, linear
    extrapolation (last segment's slope) above the last."""
    return interp_linear(pts, b)


def stage_forward(L, weights: list, experts):
    """fwd(x) for a stack of MoE layers: x [b, H] bf16 -> x + MoE(x), layer after layer.
    `fwd.weights` / `fwd.experts` expose the layers so a check can compare each one with its
    reference on the same routed ids."""
    def fwd(x):
        for w in weights:
            ids, tw = L.moe_route(w, x)          # [b, k] expert ids, fp32 weights
            x = x + experts(w, x, ids, tw)
        return x
    fwd.weights, fwd.experts = weights, experts
    return fwd


MOE_VARIANTS = ("auto", "triton", "fast", "plain")


def moe_candidates(requested: str, *, on_cuda: bool, triton_reason: str | None,
                   grouped_mm_reason: str | None) -> list[str]:
    """The MoE backends to try, in order, for `--moe-variant requested` (the first that builds
    and passes its float32 reference check runs). `auto` = stage-cost's pick on an H200: our
    fused Triton decode kernel where this is a CUDA device and triton imports (its check
    decides), else torch `fast` where `torch._grouped_mm` runs, else the per-expert `loop`
    (correct everywhere, not graph-capturable). A forced name is tried alone: it runs as asked
    or the rank fails with the reason, never a silent substitute."""
    if requested == "auto":
        out = ["triton"] if on_cuda and triton_reason is None else []
        return out + (["fast"] if grouped_mm_reason is None else ["loop"])
    if requested in ("fast", "plain"):
        if grouped_mm_reason is not None:
            raise RuntimeError(f"--moe-variant {requested}: {grouped_mm_reason}")
        return [requested]
    if requested == "triton":
        if triton_reason is not None:
            raise RuntimeError(f"--moe-variant triton: {triton_reason}")
        return ["triton"]
    raise ValueError(f"unknown --moe-variant {requested!r}; known: {', '.join(MOE_VARIANTS)}")


def _backend_of(name: str) -> tuple[str, str]:
    """candidate name -> (layers.build_moe backend, variant)."""
    return ("triton", "fast") if name == "triton" else ("torch", name)


def loop_max_rows(cfg: RankConfig | dict) -> int:
    """Most rows one forward of the loop sees: a prefill of every stream at once within the
    prefill token budget of a visit (chunked prefill; without it max_prefill_tokens, or one
    whole prompt beyond it), or the largest decode micro-batch padded to its capture size."""
    cfg = rank_config(cfg)
    c = max(cfg.concurrency)
    max_b = max(1, min(cfg.max_micro_batch or c, c))
    full = capture_sizes(max(512, 2 * max_b))
    plen = cfg.prompt_len
    budget = cfg.server.chunk_budget or max(cfg.server.max_prefill_tokens, plen)
    return max(min(c * plen, budget), padded(max_b, full[-1]) or max_b)


def triton_check_batches(max_rows: int) -> list[int]:
    """One micro-batch size per block-size row of moe_triton.CONFIGS that the loop can reach
    (the smallest size of each row), so every kernel configuration the loop will run is checked
    (and JIT-compiled) before timing."""
    from microbench.kernels import moe_triton as MT

    out, lo = [], 1
    for bound, _ in MT.CONFIGS:
        if lo <= max_rows:
            out.append(lo)
        lo = bound + 1
    return out


def _check_rows(L, w, experts, b: int, dev, seed: int) -> float:
    """Run `experts` on b fresh random rows; compare the first (up to) 5 rows with the float32
    per-expert reference (rows are independent, so this checks the kernel config used at b)."""
    x = L.randn((b, w.router.shape[1]), 1.0, L.gen(dev, seed), dev)
    ids, tw = L.moe_route(w, x)
    y = experts(w, x, ids, tw)[:5]
    return L.assert_close(f"moe experts at b={b}", y, L.moe_reference(w, x[:5], ids[:5],
                                                                       tw[:5]))


def _first_layer(torch, L, m, name: str, cfg: RankConfig, rank: int, dev) -> tuple:
    """Build layer 0 with backend `name` and check it before timing (fresh random input vs the
    float32 per-expert loop; for triton at every block-size row the loop reaches).
    Returns (weights, experts fn, backend string, max relative error, checked batches)."""
    backend, variant = _backend_of(name)
    # built for 5 tokens so that its check runs on 5 (it checks min(b, 5))
    built = L.build_moe(m, 5, dev, backend=backend, variant=variant, seed=1000 * rank)
    if built.backend != f"{backend}/{variant}":  # layers fell back on its own: not what we asked
        raise RuntimeError(f"asked for {backend}/{variant}, layers built {built.backend}")
    err, checked = built.check(), [5]  # raises layers.CheckFailed
    w = built.info.pop("weights")
    if name == "triton":
        from microbench.kernels import moe_triton as MT

        def experts(w_, x, ids, tw):
            return MT.moe_experts(w_, x, ids, tw)
        for b in triton_check_batches(loop_max_rows(cfg)):
            err = max(err, _check_rows(L, w, experts, b, dev, seed=77 + b))
            checked.append(b)
    else:
        experts = {"fast": L.moe_experts_fast, "plain": L.moe_experts_plain,
                   "loop": L.moe_experts_loop}[name]
    return w, experts, built.backend, err, sorted(set(checked))


def build_moe_stage(torch, cfg: RankConfig | dict, rank: int, dev, model=None,
                    free_bytes: int | None = None):
    """`layers_per_stage` MoE layers from microbench.kernels.layers, the layer stage-cost times (same
    weights layout and router), as many as fit in 85% of free memory (`free_bytes`, default:
    what the GPU reports). Backend: `cfg.moe_variant` through `moe_candidates` (auto: triton
    if it passes its check here, else torch fast, else loop); a candidate that fails to build
    or check is recorded in `moe_fallbacks` and the next one is tried. Returns
    (fwd(x) -> x + MoE(x) per layer, info). `model` overrides the preset (tests: small dims)."""
    from microbench.kernels import layers as L
    from microbench.kernels import moe_triton as MT
    from reports.base.model_config import load_model

    cfg = rank_config(cfg)
    m = (model or load_model(cfg.model)).all_formats("bf16")  # INT4/FP8 not executed
    per_layer = L.moe_weight_bytes(m)
    free = torch.cuda.mem_get_info(dev)[0] if free_bytes is None else free_bytes
    n = min(cfg.layers_per_stage, int(0.85 * free // per_layer))
    if n < 1:
        raise RuntimeError(f"rank {rank}: one MoE layer needs {per_layer / 1e9:.1f} GB, "
                           f"{free / 1e9:.1f} GB free; use --work busy")
    requested = cfg.moe_variant
    names = moe_candidates(requested, on_cuda=torch.device(dev).type == "cuda",
                           triton_reason=MT.available(),
                           grouped_mm_reason=L.grouped_mm_available(dev))
    fallbacks, first = {}, None
    for k, name in enumerate(names):
        try:
            first = _first_layer(torch, L, m, name, cfg, rank, dev)
            break
        except Exception as e:  # noqa: BLE001 - failed build/check: next candidate, reason kept
            if k == len(names) - 1:
                raise RuntimeError(f"rank {rank}: MoE backend {name}: "
                                   f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
                                   + (f" (earlier: {fallbacks})" if fallbacks else "")) from e
            fallbacks[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        # here the failed candidate's exception (and the weights its frames held) is gone
        if torch.device(dev).type == "cuda":
            torch.cuda.empty_cache()
    w0, experts, backend, err, checked = first
    name = names[len(fallbacks)]
    if cfg.graphs and name == "loop":
        raise RuntimeError(f"rank {rank}: MoE backend {backend} syncs the host and cannot be "
                           "captured in a CUDA graph; run with --no-graphs")
    weights = [w0]
    bk, var = _backend_of(name)
    for i in range(1, n):  # same backend; checked once on layer 0 (same code, other weights)
        built = L.build_moe(m, 1, dev, backend=bk, variant=var, seed=1000 * rank + i)
        weights.append(built.info.pop("weights"))
        del built
    fwd = stage_forward(L, weights, experts)
    note = None if n == cfg.layers_per_stage else \
        f"only {n} of {cfg.layers_per_stage} layers fit in GPU memory"
    return fwd, {"layers_used": n, "moe_backend": backend, "moe_variant_requested": requested,
                 "moe_candidates": names, "moe_fallbacks": fallbacks,
                 "moe_check_rel_err": err, "moe_checked_batches": checked,
                 "layer_bytes": per_layer, "note": note}


def build_work(torch, cfg: RankConfig | dict, rank: int, dev):
    """Returns (fwd(x) -> y, info). `fwd` enqueues the stage forward on the current stream."""
    cfg = rank_config(cfg)
    H = cfg.hidden
    if cfg.work == "busy" and torch.device(dev).type == "cpu":
        # SGLang's CPU backend runs the forward on the scheduler's thread: the CPU is busy
        # for the curve's time, then the loop goes on (no kernel queue to check)
        from microbench.dispatch.pp_device import spin_us
        pts = list(cfg.cost_points)

        def fwd_cpu(x):
            spin_us(interp_cost(pts, x.shape[0]))
            return x + 1.0
        return fwd_cpu, {"busy_spin": "cpu", "layers_used": 0}
    if cfg.work == "busy":
        pts = list(cfg.cost_points)
        # calibrate cycles per microsecond of torch.cuda._sleep with the shared timer
        from microbench.kit.timing import do_bench
        cyc = 1_000_000
        t = do_bench(lambda: torch.cuda._sleep(cyc), warmup_ms=5, rep_ms=30).median_us
        cyc_per_us = cyc / t

        def fwd(x):
            torch.cuda._sleep(max(1, int(interp_cost(pts, x.shape[0]) * cyc_per_us)))
            return x + 1.0

        checks = []
        for b in sorted({pts[0][0], pts[-1][0]}):  # check the calibration before timing
            x = torch.randn(b, H, device=dev, dtype=torch.bfloat16)
            got = do_bench(lambda: fwd(x), warmup_ms=5, rep_ms=30).median_us
            want = interp_cost(pts, b)
            checks.append({"batch": b, "target_us": want, "measured_us": got})
            if abs(got - want) > 0.15 * want + 20:
                raise RuntimeError(f"rank {rank}: busy kernel calibration off at b={b}: "
                                   f"{got:.0f} us measured vs {want:.0f} us wanted")
        return fwd, {"busy_cycles_per_us": cyc_per_us, "busy_check": checks,
                     "layers_used": 0}
    return build_moe_stage(torch, cfg, rank, dev)


def calibrate_injection(torch, ctx: dict, sizes: list[int], H: int, dev) -> dict:
    """What --inject needs, measured once before the loop: sleep-kernel cycles per microsecond
    and, for slow-stage, this rank's forward time per batch size (graph replay where the loop
    replays, eager otherwise), so the extra sleep is (FACTOR - 1) x the forward."""
    inj = ctx["inject"]
    if not (inj["slow_stage"] or inj["hop_delay_us"]):
        return {"cyc_per_us": 0.0, "fwd_us": lambda b: 0.0}
    if torch.device(dev).type == "cpu":   # busy work only: its forward time is the curve
        pts = list(rank_config(ctx["cfg"]).cost_points)
        return {"cyc_per_us": 0.0, "fwd_us": lambda b: interp_cost(pts, b)}
    from microbench.kit.timing import do_bench
    cyc = 1_000_000
    cyc_per_us = cyc / do_bench(lambda: torch.cuda._sleep(cyc), warmup_ms=5, rep_ms=30).median_us
    table: dict[int, float] = {}
    if ctx["rank"] in inj["slow_stage"]:
        for b in (sizes or [1, 8, 32]):
            if ctx["graphs"] and b in ctx["graphs"]:
                g = ctx["graphs"][b][0]
                table[b] = do_bench(g.replay, warmup_ms=5, rep_ms=20).median_us
            else:
                x = torch.randn(b, H, device=dev, dtype=torch.bfloat16)
                table[b] = do_bench(lambda: ctx["fwd"](x), warmup_ms=5, rep_ms=20).median_us
    pts = sorted(table.items())
    return {"cyc_per_us": cyc_per_us, "fwd_us_table": pts,
            "fwd_us": (lambda b: interp_cost(pts, b)) if pts else (lambda b: 0.0)}


def capture_graphs(torch, fwd, sizes: list[int], H: int, dev):
    """One CUDA graph per size, largest first, sharing one memory pool (as SGLang does)."""
    graphs, pool = {}, torch.cuda.graph_pool_handle()
    for b in sorted(sizes, reverse=True):
        x = torch.randn(b, H, device=dev, dtype=torch.bfloat16)
        g, y = capture_graph(lambda: fwd(x), warmup=2, pool=pool)
        graphs[b] = (g, x, y)
    return graphs
