"""Check, tune and time the quantised MoE kernels and the MLA decode on one GPU.

Run: `PYTHONPATH=. python3 -m microbench.stage_cost.tune_moe_quant --out DIR` (one CUDA GPU, ~60 GB free
for Kimi K2 dims: bf16, INT4 and FP8 copies of all 384 experts).
1. Checks (relative error, float32 references on dequantised weights, fresh random inputs):
   INT4 and FP8 layers at small and real dims (shared expert bf16 and in-format), at b = 128
   against the bf16 Triton kernel run on the dequantised weights, and the MLA decode.
2. Sweep: each Triton expert kernel alone (gate_up, down) per block config at a few batch
   sizes, the fastest per size used below (`--sweep-budget-s 0`: the modules' CONFIGS); and
   the whole INT4 layer on `moe_int4_mma` per variant (`SWEEP_MMA`: warps per tile and
   register cap per launch; recorded, its CONFIGS table is set from it by hand).
3. Table under CUDA-graph replay, whole layer (router, plan, experts, slot sum): bf16 Triton
   (`moe_triton`, torch router), bf16 Triton with the fused router (`moe_route`),
   `torch._grouped_mm` (bf16 `fast`), INT4 (the default kernel: `moe_int4_mma` where it
   builds), INT4 on the Triton kernel (`moe_int4`, swept config), INT4 on the CUDA-core GEMV
   (`moe_int4_gemv`, its own config table, not swept), FP8; each next to its own format's floor
   (bytes of the distinct experts touched + shared expert + router, spec-sheet bandwidth,
   and the copy bandwidth measured here). MLA attention: torch ops vs `mla_decode`.
Writes DIR/moe_quant.json (`--only-mla`: DIR/mla.json; default DIR results/) as it goes and
prints the table last. The file is a ppscope record (`reports/base/records.py`: probe
`tune_moe_quant`, provenance, status): `partial` while the run goes, `ok` at the end, `error`
with what was kept when a part fails; without a GPU (or, for `--only-mla`, without MLA) a
`waived` one and exit 2.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

PROBE = "tune_moe_quant"   # the record's probe (module docstring)

# (BLOCK_N, BLOCK_K, warps, stages); fp8 steps 128 inputs at a time whatever BLOCK_K says
SWEEP_INT4_GU = ((32, 256, 4, 3), (32, 512, 4, 3), (32, 128, 4, 4), (32, 256, 4, 4),
                 (32, 256, 4, 2), (64, 128, 4, 4), (16, 256, 4, 3), (32, 512, 4, 2))
SWEEP_INT4_DN = ((64, 128, 4, 4), (64, 256, 4, 3), (32, 256, 4, 3), (32, 128, 4, 4),
                 (64, 128, 4, 3), (64, 512, 4, 2), (64, 256, 4, 4), (128, 128, 4, 3))
SWEEP_FP8_GU = ((32, 128, 4, 4), (64, 128, 4, 4), (128, 128, 4, 3), (64, 128, 4, 6))
SWEEP_FP8_DN = ((64, 128, 4, 4), (128, 128, 4, 3), (128, 128, 8, 4), (256, 128, 8, 3))
# moe_int4_mma layer variants: ((gate_up warps per tile, CTAs per SM the registers allow),
# (down ...))
SWEEP_MMA = (((4, 12), (1, 12)), ((1, 12), (1, 12)), ((4, 10), (1, 10)), ((1, 10), (1, 10)),
             ((2, 12), (1, 12)), ((4, 8), (1, 8)), ((1, 1), (1, 1)))
# (heads per program, context block, max splits, warps)
MLA_SWEEP = ((16, 64, 16, 4), (32, 64, 16, 8), (64, 32, 16, 8), (16, 64, 32, 4), (16, 32, 16, 4))


def _kc(t):
    from microbench.kernels.moe_triton import KernelConfig
    return KernelConfig(*t)


def sweep_quant(fmt: str, qw, m, batches, budget_s: float, log) -> dict:
    """Each expert kernel alone, per config and batch size (do_bench, no graph).
    Returns {"points": {proj: {b: [(us, cfg)]}}, "best": {b: {proj: (us, cfg)}}}."""
    import torch

    from microbench.kernels import common
    from microbench.kernels import moe_fp8, moe_int4
    from microbench.kernels import moe_route as R
    from microbench.kit.timing import do_bench

    mod = moe_int4 if fmt == "int4" else moe_fp8
    grids = {"gate_up": SWEEP_INT4_GU if fmt == "int4" else SWEEP_FP8_GU,
             "down": SWEEP_INT4_DN if fmt == "int4" else SWEEP_FP8_DN}
    t0 = time.perf_counter()
    out = {"points": {"gate_up": {}, "down": {}}, "best": {}, "truncated": False}
    dev = torch.device("cuda")
    I, H = m.moe_intermediate, m.hidden
    for b in batches:
        x = common.randn((b, H), 1.0, common.gen(dev, 7), dev)
        if fmt == "int4":
            ids, tw, xp = R.route(qw.base, x, pair_order=True)
        else:
            (ids, tw), xp = R.route(qw.base, x), None
        kk = ids.shape[1]
        plan = R.plan_for(ids, qw.base.n_alloc + qw.base.n_shared, 16, b)
        twf = tw.reshape(-1)
        act = torch.empty(b * kk, I, device=dev, dtype=x.dtype)
        y = torch.empty(b * kk, H, device=dev, dtype=torch.float32)

        def run(proj, kc):
            if fmt == "int4":
                if proj == "gate_up":
                    return moe_int4._launch(xp, x, qw.gate_up_q, qw.gate_up_s, qw.shared_gate_up,
                                            act, plan, twf, I, kk, 2, qw.n_q, kc, 16, True)
                return moe_int4._launch(act, act, qw.down_q, qw.down_s, qw.shared_down, y, plan,
                                        twf, H, kk, 1, qw.n_q, kc, 16, True)
            if proj == "gate_up":
                return moe_fp8._launch(x, qw.gate_up_q, qw.gate_up_s, qw.shared_gate_up, act,
                                       plan, twf, I, kk, 2, qw.n_q, kc, 16)
            return moe_fp8._launch(act, qw.down_q, qw.down_s, qw.shared_down, y, plan, twf, H,
                                   kk, 1, qw.n_q, kc, 16)
        run("gate_up", mod.config_for(b).gate_up)      # act for the down sweep
        for proj, grid in grids.items():
            pts = []
            for t in grid:
                if time.perf_counter() - t0 > budget_s:
                    out["truncated"] = True
                    break
                kc = _kc(t)
                try:
                    tm = do_bench(lambda: run(proj, kc), warmup_ms=5, rep_ms=25)
                    pts.append((tm.median_us, dataclasses.asdict(kc)))
                except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: skip
                    pts.append((None, {**dataclasses.asdict(kc),
                                       "error": f"{type(e).__name__}: {str(e)[:120]}"}))
            out["points"][proj][str(b)] = pts
            ok = [p for p in pts if p[0] is not None]
            if ok:
                out["best"].setdefault(str(b), {})[proj] = min(ok, key=lambda p: p[0])
        if str(b) in out["best"]:
            log(f"sweep {fmt} b={b}: " + ", ".join(
                f"{k} {v[0]:.1f} us {tuple(v[1].values())}" for k, v in out["best"][str(b)].items()))
    return out


def sweep_mma(qw, m, batches, log) -> dict:
    """The whole INT4 layer on `moe_int4_mma` per variant (`SWEEP_MMA`) and batch size, under
    CUDA-graph replay. {"points": {b: [(us, variant)]}, "best": {b: variant}}; a variant
    whose check fails is recorded with its error and never best."""
    from microbench.kernels import layers as L
    from microbench.kernels import moe_int4_mma as MM
    from microbench.kit.timing import do_bench_graph

    out = {"points": {}, "best": {}, "regs": {}}
    for b in batches:
        pts = []
        for gu, dn in SWEEP_MMA:
            cfg = MM.MmaLayerConfig(MM.MmaConfig(gu[0], 1, gu[1]), MM.MmaConfig(dn[0], 1, dn[1]))
            try:
                bl = L.build_moe(m, b, qw.gate_up_q.device, backend="triton", fmt="int4",
                                 weights=qw, triton_config=cfg)
                err = bl.check()
                pts.append((do_bench_graph(bl.fn).median_us, [gu, dn], err))
            except Exception as e:  # noqa: BLE001 - recorded; the others still run
                pts.append((None, [gu, dn], f"{type(e).__name__}: {str(e)[:160]}"))
        out["points"][str(b)] = pts
        ok = [p for p in pts if p[0] is not None]
        if ok:
            out["best"][str(b)] = min(ok, key=lambda p: p[0])
            log(f"mma sweep b={b}: best {out['best'][str(b)][0]:.1f} us {out['best'][str(b)][1]}")
    for gu, dn in SWEEP_MMA:
        for ks, mb in (gu, dn):
            k = MM._kernel(MM.MmaConfig(ks, 1, mb))
            out["regs"][f"ksplit{ks}/minb{mb}"] = [k.num_regs, k.local_size_bytes]
    return out


def best_config(best: dict, b: int, default):
    """MoeConfig from the sweep point nearest to b (ties: the larger), else `default`."""
    from microbench.kernels.moe_triton import KernelConfig, MoeConfig

    if not best:
        return default
    near = min(best, key=lambda s: (abs(int(s) - b), -int(s)))
    d = best[near]
    return MoeConfig(16, KernelConfig(**d["gate_up"][1]) if "gate_up" in d else default.gate_up,
                     KernelConfig(**d["down"][1]) if "down" in d else default.down)


def _parse_args(argv):
    import argparse

    from reports.base.paths import results_dir

    p = argparse.ArgumentParser(prog="python -m microbench.stage_cost.tune_moe_quant", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="kimi-k2")
    p.add_argument("--batches", default="1,2,4,8,16,32,64,128")
    p.add_argument("--sweep-batches", default="1,8,32,128")
    p.add_argument("--sweep-budget-s", type=float, default=150.0, help="0 skips the sweeps")
    p.add_argument("--context-len", type=int, default=2048)
    p.add_argument("--skip-mla", action="store_true")
    p.add_argument("--only-mla", action="store_true",
                   help="time only the MLA decode layer (its check, rows, stages, sweep): mla.json")
    p.add_argument("--out", default=str(results_dir()),
                   help="directory for the record moe_quant.json (default results/)")
    return p.parse_args(argv)


@dataclasses.dataclass
class _Session:
    """What every part of one run shares: the arguments, the result dict (written as it goes),
    the model in its three formats, the GPU's spec, the copy bandwidth measured here, the L2
    size and the SM clock sampler."""
    a: Any
    t_start: float
    dev: Any
    m16: Any
    m4: Any       # routed experts INT4, shared expert bf16, as K2 serves it
    m8: Any       # routed experts FP8
    gpu: Any
    res: dict
    writer: Any = None   # microbench.kit.run_writer.ToolWriter
    bw: float = 0.0
    l2: int = 0
    clocks: Any = None

    def log(self, s: str) -> None:
        print(f"[{time.perf_counter() - self.t_start:6.1f}s] {s}", flush=True)

    def save(self) -> None:
        """The record so far, `partial` (atomic: Ctrl-C keeps what was measured)."""
        r = self.res
        self.writer.record(r, "partial", f"written as the run goes: {len(r['checks'])} checks, "
                           f"{len(r['rows'])} layer rows, {len(r['mla_rows'])} MLA rows")

    def timed(self, fn, copies: int, row: dict, key: str):
        """do_bench_graph with the SM clock sampled while it runs (row[key_sm_clock_mhz] ...)"""
        from microbench.kit.timing import do_bench_graph

        self.clocks.start()
        try:
            return do_bench_graph(fn, copies=copies)
        finally:
            c = self.clocks.stop()
            row[f"{key}_sm_clock_mhz"], row[f"{key}_clock_limits"] = (
                c.sm_mhz_median, ",".join(c.reasons) or None)

    def copies_for(self, floor_us: float) -> int:
        from microbench.kit.timing import graph_copies

        return graph_copies(int(floor_us * self.gpu.mem_bw_gbps * 1e3), self.l2)

    def chk(self, name: str, fn) -> None:
        try:
            self.res["checks"][name] = fn()
        except Exception as e:  # noqa: BLE001 - recorded; the table still runs
            self.res["checks"][name] = f"FAILED {type(e).__name__}: {str(e)[:300]}"
        self.log(f"check {name}: {self.res['checks'][name]}")

    def batches(self) -> list[int]:
        return [int(x) for x in self.a.batches.split(",")]


def _open_session(a, res: dict, writer) -> _Session:
    """The models, the result dict's header (into `res`), the copy bandwidth and L2 size
    measured here."""
    import torch

    from microbench.kit.clocks import ClockSampler
    from microbench.kit.timing import l2_bytes
    from microbench.stage_cost import probe as sc
    from reports.base.model_config import load_model

    t_start = time.perf_counter()
    dev = torch.device("cuda")
    native = load_model(a.model)
    m16 = native.all_formats("bf16")
    m4 = m16.with_formats(routed_experts="int4")           # shared expert bf16, as K2 serves it
    m8 = m16.with_formats(routed_experts="fp8")
    gpu = sc.resolve(sc.StageCostConfig(model=a.model, dtype="bf16"))[1]
    res.update({"gpu": torch.cuda.get_device_name(), "spec": gpu.name, "model": native.name,
                 "mem_bw_spec_gbps": gpu.mem_bw_gbps, "context_len": a.context_len,
                 "torch": torch.__version__, "triton": __import__("triton").__version__,
                 "checks": {}, "sweep": {}, "rows": [], "mla_rows": [],
                 "floor_counts": "bytes of the distinct routed experts touched (packed weights "
                                 "+ scales in their format) + shared expert (bf16) + router "
                                 "(bf16); attention: bf16 projections + norms + KV cache"})
    s = _Session(a, t_start, dev, m16, m4, m8, gpu, res, writer)
    s.bw = sc.measure_mem_bw()
    res["mem_bw_measured_gbps"] = s.bw
    s.l2 = l2_bytes(dev)
    res["l2_bytes"] = s.l2
    res["timing"] = ("CUDA-graph replay; a graph holds `graph_copies` back-to-back calls of the "
                     "layer (4 when its floor bytes are >= 2x the L2 cache, else 1) and figures "
                     "are per call, as inside a decode step's graph")
    s.clocks = ClockSampler(torch.cuda.current_device())
    s.log(f"HBM copy bandwidth {s.bw:.0f} GB/s (spec {gpu.mem_bw_gbps:.0f})")
    return s


def _main(argv=None) -> int:
    """Parse, then check, sweep and time (module docstring), the record written as it goes."""
    import sys
    from pathlib import Path

    from microbench.kit.run_writer import ToolWriter

    argv = sys.argv[1:] if argv is None else list(argv)
    a = _parse_args(argv)
    writer = ToolWriter(Path(a.out, "mla.json" if a.only_mla else "moe_quant.json"), PROBE,
                        ["python3", "-m", "microbench.stage_cost.tune_moe_quant", *argv])

    import torch

    if not torch.cuda.is_available():
        return writer.waive("needs a CUDA GPU")
    return writer.run(lambda res: _run(a, res, writer))


def _run(a, res: dict, writer) -> int:
    import torch

    s = _open_session(a, res, writer)
    if a.only_mla:
        if s.m16.attention != "mla":
            return writer.waive(f"{s.m16.name} has no MLA attention")
        check_mla(s)
        time_mla(s)
        return _print_mla(s)
    run_checks(s)           # 1. checks
    s.save()
    torch.cuda.empty_cache()
    w16, qw4, qw8 = _full_weights(s)
    best = run_sweeps(s, qw4, qw8)       # 2. sweeps
    for b in s.batches():                # 3. table
        row = time_row(s, b, w16, qw4, qw8, best)
        s.res["rows"].append(row)
        s.save()
        _log_row(s, row)
    if not a.skip_mla and s.m16.attention == "mla":
        time_mla(s)
    _print_table(s.res["rows"])
    return _print_mla(s)


# ---- 1. checks

def check_mla(s: _Session) -> None:
    """The MLA decode (Triton attention) against its reference at two batch sizes."""
    from microbench.kernels import layers as L

    for b in (1, 3):
        s.chk(f"mla/triton/b{b}", lambda: L.build_attention(
            s.m16, b, s.dev, context_len=s.a.context_len, backend="triton").check())


def run_checks(s: _Session) -> None:
    """Every quantised layer against its float32 reference on the dequantised weights, the
    CUDA-core GEMV INT4 kernel, b = 128 against the bf16 Triton kernel, and the MLA decode."""
    from microbench.kernels import layers as L
    from microbench.kernels import moe_int4_gemv, moe_quant

    m16, m4, dev = s.m16, s.m4, s.dev
    tiny = dataclasses.replace(m16, hidden=512, moe_intermediate=256, n_routed_experts=8,
                               top_k=4)
    # (the CPU tests run every path at tiny sizes; here: the compiled kernels, real dims where
    # the layout matters, the in-format shared expert at a small size)
    for fmt, shared, name, mm, bs in (("int4", "bf16", "real", m16, (1, 5)),
                                      ("int4", "int4", "tiny", tiny, (40,)),
                                      ("fp8", "bf16", "real", m16, (1, 5)),
                                      ("fp8", "fp8", "real", m16, (3,))):
        mf = mm.with_formats(routed_experts=fmt, shared_experts=shared)
        qw = moe_quant.make_weights(mf, fmt, dev, experts_sample=16 if name == "real" else None)
        for b in bs:
            s.chk(f"{fmt}/shared-{shared}/{name}/b{b}",
                  lambda: L.build_moe(mf, b, dev, backend="triton", fmt=fmt, weights=qw).check())
        qw = None   # freed (the checks' lambdas held it)
    # the CUDA-core GEMV INT4 kernel (not the default: see moe_int4.use_gemv), real dims
    qw = moe_quant.make_weights(m4, "int4", dev, experts_sample=16)
    for b in (1, 5, 40):
        s.chk(f"int4_gemv/shared-bf16/real/b{b}", lambda: L.build_moe(
            m4, b, dev, backend="triton", fmt="int4", weights=qw,
            triton_config=moe_int4_gemv.config_for(b)).check())
    qw = None
    # b = 128 at real dims: against the bf16 Triton kernel on the dequantised weights
    for fmt in ("int4", "fp8"):
        s.chk(f"{fmt}/real/b128_vs_bf16_triton_on_dequantised",
              lambda fmt=fmt: _check_b128(s, fmt))
    if not s.a.skip_mla and m16.attention == "mla":
        check_mla(s)


def _check_b128(s: _Session, fmt: str) -> float:
    """Relative error of the `fmt` layer at b = 128 against `moe_triton.fused_moe` (bf16) run
    on its own weights dequantised."""
    import torch

    from microbench.kernels import common, moe_fp8, moe_int4, moe_quant
    from microbench.kernels import moe_route as R
    from microbench.kernels import moe_triton as MT

    dev = s.dev
    qw = moe_quant.make_weights(s.m4 if fmt == "int4" else s.m8, fmt, dev, experts_sample=16)
    if fmt == "int4":
        from microbench.kernels import int4_pack as P
        gu = P.dequantize(qw.gate_up_q, qw.gate_up_s)
        dn = P.dequantize(qw.down_q, qw.down_s)
    else:
        gu = moe_fp8.dequantize_blocks(qw.gate_up_q, qw.gate_up_s).to(torch.bfloat16)
        dn = moe_fp8.dequantize_blocks(qw.down_q, qw.down_s).to(torch.bfloat16)
    w = dataclasses.replace(qw.base, gate_up=torch.cat([gu, qw.shared_gate_up]),
                            down=torch.cat([dn, qw.shared_down]))
    x = common.randn((128, s.m16.hidden), 1.0, common.gen(dev, 5), dev)
    ids, tw = R.route(qw.base, x)
    ref = MT.fused_moe(x, w.gate_up, w.down, ids.long(), tw).float()
    y = (moe_int4 if fmt == "int4" else moe_fp8).moe_forward(qw, x)
    return common.rel_err(y, ref)


# ---- 2. sweeps

def _full_weights(s: _Session):
    """bf16, INT4 and FP8 weights of all experts (same router seed: same routing for every
    format)."""
    from microbench.kernels import layers as L
    from microbench.kernels import moe_quant

    w16 = L.make_moe_weights(s.m16, "fast", s.dev)
    qw4 = moe_quant.make_weights(s.m4, "int4", s.dev)
    qw8 = moe_quant.make_weights(s.m8, "fp8", s.dev)
    s.log(f"weights: bf16 {sum(t.numel() * 2 for t in (w16.gate_up, w16.down)) / 1e9:.1f} GB, "
          f"int4 {qw4.nbytes() / 1e9:.1f} GB, fp8 {qw8.nbytes() / 1e9:.1f} GB")
    return w16, qw4, qw8


def run_sweeps(s: _Session, qw4, qw8) -> dict:
    """The `moe_int4_mma` layer sweep, then each format's per-kernel block-config sweep, half
    the budget each; returns {fmt: {b: {proj: (us, cfg)}}} (empty when the budget is 0)."""
    best: dict = {}
    if s.a.sweep_budget_s <= 0:
        return best
    sb = [int(x) for x in s.a.sweep_batches.split(",")]
    from microbench.kernels import moe_int4_mma
    if why := moe_int4_mma.available():
        s.res["sweep"]["int4_mma"] = f"not run: {why}"
    else:
        s.res["sweep"]["int4_mma"] = sweep_mma(qw4, s.m4, sb, s.log)
    s.save()
    for fmt, qw, mm in (("int4", qw4, s.m4), ("fp8", qw8, s.m8)):
        s.res["sweep"][fmt] = sweep_quant(fmt, qw, mm, sb, s.a.sweep_budget_s / 2, s.log)
        best[fmt] = s.res["sweep"][fmt]["best"]
        s.save()
    return best


# ---- 3. table

def fused_bf16(s: _Session, w16, b: int):
    """The bf16 Triton layer with the fused router (`moe_route`): route, plan, gate_up, down,
    slot sum, as one callable for graph capture."""
    from microbench.kernels import common
    from microbench.kernels import moe_route as R
    from microbench.kernels import moe_triton as MT

    x = common.randn((b, s.m16.hidden), 1.0, common.gen(s.dev, 1), s.dev)
    cfg = MT.config_for(b)

    def fn():
        ids, tw = R.route(w16, x)
        plan = R.plan_for(ids, w16.gate_up.shape[0], cfg.block_m, b)
        act = MT.gate_up(x, w16.gate_up, plan, cfg.gate_up, cfg.block_m, ids.shape[1])
        y = MT.down(act, w16.down, tw.reshape(-1), plan, cfg.down, cfg.block_m)
        return y.view(b, ids.shape[1], -1).sum(1).to(x.dtype)
    return fn


def _table_builds(s: _Session, b: int, w16, qw4, qw8, best: dict) -> tuple:
    """(key, build) of each whole-layer variant timed per batch size (None: `fused_bf16`)."""
    from microbench.kernels import layers as L
    from microbench.kernels import moe_fp8, moe_int4, moe_int4_gemv

    m16, m4, m8, dev = s.m16, s.m4, s.m8, s.dev
    return (("bf16_triton", lambda: L.build_moe(m16, b, dev, backend="triton", weights=w16)),
            ("bf16_triton_fused_route", None),
            ("bf16_grouped_mm", lambda: L.build_moe(m16, b, dev, backend="torch",
                                                    variant="fast", weights=w16)),
            ("int4", lambda: L.build_moe(m4, b, dev, backend="triton", fmt="int4",
                                         weights=qw4)),
            ("int4_triton", lambda: L.build_moe(m4, b, dev, backend="triton", fmt="int4",
                                                weights=qw4, triton_config=best_config(
                                                    best.get("int4"), b,
                                                    moe_int4.config_for(b)))),
            ("int4_gemv", lambda: L.build_moe(m4, b, dev, backend="triton", fmt="int4",
                                              weights=qw4,
                                              triton_config=moe_int4_gemv.config_for(b))),
            ("fp8", lambda: L.build_moe(m8, b, dev, backend="triton", fmt="fp8",
                                        weights=qw8, triton_config=best_config(
                                            best.get("fp8"), b, moe_fp8.config_for(b)))))


def time_row(s: _Session, b: int, w16, qw4, qw8, best: dict) -> dict:
    """One batch size's row: every whole-layer variant checked (the quantised ones) and timed
    under graph replay, each format's floor beside it."""
    from microbench.kernels import moe_fp8, moe_int4, moe_int4_gemv
    from microbench.stage_cost import probe as sc

    gpu, bw = s.gpu, s.bw
    row = {"batch": b}
    for key, make in _table_builds(s, b, w16, qw4, qw8, best):
        try:
            if make is None:
                fn, d = fused_bf16(s, w16, b), row.get("bf16_triton_experts")
            else:
                bl = make()
                fn, d = bl.fn, bl.info["distinct_experts"]
                if key in ("int4_triton", "fp8"):
                    mod = moe_int4 if key == "int4_triton" else moe_fp8
                    row[f"{key}_config"] = dataclasses.asdict(
                        best_config(best.get(key[:4]), b, mod.config_for(b)))
                if key == "int4":
                    row["int4_kernel"] = bl.info["kernel"]
                if key == "int4_gemv":
                    row[f"{key}_config"] = dataclasses.asdict(moe_int4_gemv.config_for(b))
                if key in ("int4", "int4_triton", "fp8", "int4_gemv"):
                    row[f"{key}_check_rel_err"] = bl.check()   # the config timed here
            mm = s.m4 if key.startswith("int4") else s.m8 if key.startswith("fp8") else s.m16
            row[f"{key}_graph_copies"] = s.copies_for(sc.moe_floor_us(mm, d, gpu, None))
            t = s.timed(fn, row[f"{key}_graph_copies"], row, key)
            row[f"{key}_us"], row[f"{key}_p20_us"], row[f"{key}_p80_us"] = (
                t.median_us, t.p20_us, t.p80_us)
            row[f"{key}_experts"] = d
        except Exception as e:  # noqa: BLE001 - record and go on
            row[f"{key}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            s.log(f"b={b} {key}: {row[f'{key}_error']}")
    for key, mm in (("bf16", s.m16), ("int4", s.m4), ("fp8", s.m8)):
        d = row.get(f"{key}_experts") or row.get("bf16_triton_experts")
        if d:
            f = sc.moe_floor_us(mm, d, gpu, None)
            row[f"{key}_floor_us"], row[f"{key}_floor_copy_bw_us"] = f, f * gpu.mem_bw_gbps / bw
    return row


def _log_row(s: _Session, row: dict) -> None:
    s.log(f"b={row['batch']}: " + ", ".join(
        f"{k[:-3]} {v:.1f}" for k, v in row.items()
        if k.endswith("_us") and "floor" not in k and "p" not in k[-6:-3]))


def _print_table(rows_in: list[dict]) -> None:
    """The layer table: each variant's time, each format's floor and the share of it reached."""
    from tabulate import tabulate

    hdr = ["b", "experts", "bf16 triton µs", "bf16 +fused route µs", "grouped_mm µs", "int4 µs",
           "int4 triton µs", "int4 gemv µs", "fp8 µs", "floor bf16/int4/fp8 µs", "bf16 %",
           "int4 %", "fp8 %", "int4 % copy-bw", "bf16/int4", "int4 SM MHz"]

    def pct(r, k, f):
        return f"{100 * r[f'{f}_floor_us'] / r[f'{k}_us']:.0f}%" if r.get(f"{k}_us") else "-"
    rows = [[r["batch"], r.get("int4_experts"), *(f"{r[k]:.1f}" if r.get(k) else "-" for k in (
        "bf16_triton_us", "bf16_triton_fused_route_us", "bf16_grouped_mm_us", "int4_us",
        "int4_triton_us", "int4_gemv_us", "fp8_us")),
        "/".join(f"{r.get(f'{k}_floor_us', 0):.0f}" for k in ("bf16", "int4", "fp8")),
        pct(r, "bf16_triton", "bf16"), pct(r, "int4", "int4"), pct(r, "fp8", "fp8"),
        f"{100 * r['int4_floor_copy_bw_us'] / r['int4_us']:.0f}%" if r.get("int4_us") else "-",
        f"{r['bf16_triton_us'] / r['int4_us']:.2f}" if r.get("int4_us") and r.get(
            "bf16_triton_us") else "-",
        (f"{r['int4_sm_clock_mhz']:.0f}" if r.get("int4_sm_clock_mhz") else "-")
        + (f" ({r['int4_clock_limits']})" if r.get("int4_clock_limits") else "")]
        for r in rows_in]
    print(tabulate(rows, headers=hdr))


# ---- MLA attention

def time_mla(s: _Session) -> None:
    """MLA rows (torch ops vs mla_decode), stage costs and the block-size sweep."""
    mla_rows(s)
    mla_stages(s)
    mla_sweep(s)


def mla_rows(s: _Session) -> None:
    """Per batch size: the MLA layer as torch ops and as `mla_decode`, beside its floor."""
    from microbench.kernels import layers as L
    from microbench.kit.timing import do_bench_graph
    from reports.base.roofline import layer_floor

    m16, gpu, ctx = s.m16, s.gpu, s.a.context_len
    for b in s.batches():
        row = {"batch": b}
        fl = layer_floor(m16, "attention", b, gpu, context_len=ctx).floor_us
        row["graph_copies"] = s.copies_for(fl)
        for key in ("torch", "triton"):
            try:
                bl = L.build_attention(m16, b, s.dev, context_len=ctx, backend=key)
                t = s.timed(bl.fn, row["graph_copies"], row, key)
                row[f"{key}_us"] = t.median_us
                if key == "triton" and row["graph_copies"] > 1:   # the one-call graph too
                    row["triton_one_call_graph_us"] = do_bench_graph(bl.fn).median_us
            except Exception as e:  # noqa: BLE001
                row[f"{key}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        row["floor_us"], row["floor_copy_bw_us"] = fl, fl * gpu.mem_bw_gbps / s.bw
        s.res["mla_rows"].append(row)
        s.log(f"mla b={b}: {row}")
        s.save()


def mla_stages(s: _Session) -> None:
    """Where the time goes: each stage's marginal cost (graph replay of stages 1..k)."""
    from microbench.kernels import layers as L
    from microbench.kernels import mla_decode
    from microbench.kit.timing import do_bench_graph

    s.res["mla_stages"] = {}
    for b in (1, 64):
        bt = L.build_attention(s.m16, b, s.dev, context_len=s.a.context_len, backend="triton")
        fwd, (xa, ca) = bt.info["forward"], bt.info["inputs"]
        cum = [do_bench_graph(lambda k=k: fwd(xa, ca, upto=k)).median_us
               for k in range(1, len(mla_decode.STAGES) + 1)]
        s.res["mla_stages"][str(b)] = {n: c - (cum[i - 1] if i else 0.0)
                                       for i, (n, c) in enumerate(zip(mla_decode.STAGES, cum))}
        s.log(f"mla stages b={b}: " + ", ".join(f"{n} {v:.1f}" for n, v in
                                                s.res["mla_stages"][str(b)].items()))
        s.save()


def mla_sweep(s: _Session) -> None:
    """MLA block sizes at two batch sizes (heads/program, context block, splits, warps)."""
    from microbench.kernels import layers as L
    from microbench.kernels import mla_decode
    from microbench.kit.timing import do_bench_graph

    s.res["mla_sweep"] = {}
    default = mla_decode.CONFIG
    for b in (1, 64):
        pts = []
        for t in MLA_SWEEP:
            # the Triton attention's block sizes: at every b, not only where it runs
            mla_decode.CONFIG = mla_decode.MlaConfig(*t, mma_attn_min_b=0)
            try:
                bt = L.build_attention(s.m16, b, s.dev, context_len=s.a.context_len,
                                       backend="triton")
                pts.append((do_bench_graph(bt.fn).median_us, t))
            except Exception as e:  # noqa: BLE001
                pts.append((None, t, f"{type(e).__name__}: {str(e)[:120]}"))
            finally:
                mla_decode.CONFIG = default
        s.res["mla_sweep"][str(b)] = pts
        s.log(f"mla sweep b={b}: {pts}")
        s.save()


def _print_mla(s: _Session) -> int:
    from tabulate import tabulate

    res = s.res
    if res["mla_rows"]:
        print(tabulate([[r["batch"], f"{r.get('torch_us', 0):.1f}", f"{r.get('triton_us', 0):.1f}",
                         f"{r['floor_us']:.1f}",
                         f"{100 * r['floor_us'] / r['triton_us']:.0f}%" if r.get("triton_us")
                         else "-"] for r in res["mla_rows"]],
                       headers=["b", "MLA torch ops µs", "mla_decode µs", "floor µs", "mla_decode %"]))
    res["wall_s"] = time.perf_counter() - s.t_start
    dest, note = s.writer.record(res)
    print(f"record: {dest}" + (f" ({note})" if note else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
