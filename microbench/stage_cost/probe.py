"""What each pipeline stage costs per decode step, against its roofline floor.

Measured: one decode forward of each layer kind the model has (MoE, attention, dense MLP,
lm_head + sampling) at its real dimensions with random bf16 weights, for every micro-batch
size in `batches` (default 1..128) plus one prefill chunk (eager, MoE and dense MLP only).
Each op is checked against a float32 reference before it is timed. Decode layers are timed as
CUDA-graph replays (SGLang decodes from graphs), with `microbench.kit.timing.do_bench_graph`.
MoE backends (`moe_backends`, default `triton` = ppscope's fused decode kernel and `plain` =
the straightforward `torch._grouped_mm` layer; also `fast`, `sglang`) are all timed in the
same run (`layers.moe_<backend>`); `layers.moe` and the stage figures use, per batch size,
the fastest backend that passed its check, and name it (`backend`, `moe_backend_by_batch`).
The GPU's HBM bandwidth is measured once (1 GiB device-to-device copy, bytes read + written)
and every efficiency is reported against both the spec sheet (`efficiency`) and that copy
bandwidth (`efficiency_measured_bw`): spec bandwidth is rarely reachable.

Stage cost = Σ over its layers (attention + MoE or dense MLP) + extras (lm_head on the last
stage; the embedding lookup is costed by the roofline only). Efficiency = floor / measured;
imbalance = max / mean stage cost. Formats: MoE routed experts run in the model's own format
(`--dtype native`, the default: INT4 W4A16 on a CUDA kernel that dequantises into MMA
registers (Triton where it cannot build), FP8 block-scaled on Triton;
microbench/kernels/moe_quant.py), the shared expert too when it shares that format, else
bf16; attention, dense MLP, router and lm_head run in bf16. `measured_formats` says what ran,
every floor and efficiency uses those formats, and each layer entry names its `kernel`
(`kernel_by_layer` lists the distinct ones, in batch order). MLA attention runs `mla_decode`
(attention on Triton, from a micro-batch of 16 on the CUDA kernel `mla_attn_mma`; its
projections on `gemv_mma` at the micro-batches where that was faster, cuBLAS else). Decode
layers are timed as per-call figures from graphs holding 4 back-to-back calls when a call
streams >= 2x the L2 cache (`graph_copies` per entry; `microbench.kit.timing.graph_copies`), as
a layer runs inside a decode step's graph.

Run: `ppscope stage-cost --model kimi-k2 --pp 8` on one GPU (`--dtype bf16`: every layer in
bf16; `--plan` anywhere: floors only). Read: `stages[i].by_batch["8"]` is stage i's cost for a
micro-batch of 8.
"""
from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from microbench.kit.run_writer import RunWriter
from reports.base.gpu_specs import GpuSpec, load_gpu, match_gpu
from reports.base.model_config import ModelConfig, load_model
from reports.base.partition import Stage, pp_partition
from reports.base.partition import imbalance as stage_imbalance
from reports.base.payloads.stage_cost import (Imbalance, LayerPoint, Prefill, PrefillPoint,
                                              Routing, RoutingPoint, StageCost, StageCostData,
                                              StagePoint)
from reports.base.records import Record, make_record, write_atomic
from reports.base.roofline import (DEFAULT_CONTEXT, floor_us, layer_floor, moe_fixed_bytes,
                                   moe_weight_bytes, routed_expert_bytes, stage_floor)

PROBE = "stage_cost"
DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
# name -> (layers.build_moe backend, variant)
MOE_BACKENDS = {"triton": ("triton", "fast"), "plain": ("torch", "plain"),
                "fast": ("torch", "fast"), "sglang": ("sglang", "fast")}
COPY_BYTES = 1 << 30


def measure_mem_bw(nbytes: int = COPY_BYTES) -> float:
    """HBM bandwidth, GB/s (1e9 B/s), of a device-to-device copy: (bytes read + bytes written)
    / median time over `do_bench` repetitions. What a streaming kernel can really get, as
    opposed to the spec sheet's figure."""
    import torch

    from microbench.kit.timing import do_bench

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    t = do_bench(lambda: dst.copy_(src), warmup_ms=25, rep_ms=200)
    src = dst = None   # freed before the cache is emptied (the timed lambda holds them)
    torch.cuda.empty_cache()
    return 2 * nbytes / (t.median_us * 1e-6) / 1e9


def pick_fastest(layers: dict[str, dict[str, LayerPoint]], names) -> dict[str, str]:
    """Sets layers["moe"][b] to the fastest `moe_<name>` entry that has a measurement (a
    failed check leaves none), tagged with `backend_name`; returns {b: name}. Where no backend
    succeeded, the first backend's error entry stands."""
    chosen: dict[str, str] = {}
    moe: dict[str, LayerPoint] = {}
    for name in names:
        for b, e in (layers.get(f"moe_{name}") or {}).items():
            us, cur = e.measured_us, moe.get(b)
            if us is not None and (cur is None or cur.measured_us is None
                                   or us < cur.measured_us):
                moe[b], chosen[b] = replace(e, backend_name=name), name
            elif cur is None:
                moe[b] = e
    layers["moe"] = moe
    return chosen


@dataclass(frozen=True)
class StageCostConfig:
    model: str = "kimi-k2"
    pp: int = 8
    partition: str | None = None
    gpu: str | None = None            # spec sheet name; None: match the GPU here, else rtx-pro-6000
    dtype: str = "native"             # native (model's formats) | bf16 | fp8 | int4 (plan floors)
    moe_backends: tuple[str, ...] = ("triton", "plain")   # MOE_BACKENDS; fastest verified wins
    batches: tuple[int, ...] = DEFAULT_BATCHES
    prefill_chunk: int = 2048         # 0: skip
    context_len: int = DEFAULT_CONTEXT
    zipf_s: float = 0.0
    experts_sample: int | None = None
    mem_bw_gbps: float | None = None  # measured HBM bandwidth; None: spec sheet
    attention_backend: str = "auto"   # auto: triton (mla_decode) for MLA, else torch
    plan: bool = False
    out: Path | None = None
    argv: tuple[str, ...] = ()


def available() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible"
    return None


def resolve(cfg: StageCostConfig) -> tuple[ModelConfig, GpuSpec]:
    m = load_model(cfg.model)
    if cfg.dtype != "native":
        m = m.all_formats(cfg.dtype)
    if cfg.gpu:
        return m, load_gpu(cfg.gpu)
    if not cfg.plan and available() is None:
        import torch
        spec = match_gpu(torch.cuda.get_device_name())
        if spec:
            return m, spec
    return m, load_gpu("rtx-pro-6000")


def measured_model(m: ModelConfig) -> ModelConfig:
    """The formats `_measure` executes: routed experts in their own format (bf16, int4, fp8
    kernels), the shared expert in its format when that is the routed one or bf16, else bf16;
    everything else bf16 (no quantised attention / dense / lm_head kernels here)."""
    f = m.formats
    shared = f.shared_experts if f.shared_experts in ("bf16", f.routed_experts) else "bf16"
    return m.all_formats("bf16").with_formats(routed_experts=f.routed_experts,
                                              shared_experts=shared)


def moe_floor_us(m: ModelConfig, distinct: float, gpu: GpuSpec, bw: float | None) -> float:
    """Floor of one MoE layer given the distinct routed experts actually touched."""
    return floor_us(moe_fixed_bytes(m) + distinct * routed_expert_bytes(m), 0.0, gpu, bw)


def plan_stages(m: ModelConfig, gpu: GpuSpec, cfg: StageCostConfig) -> list[StageCost]:
    """Every stage's roofline floor per batch size; nothing measured yet."""
    out = []
    for st in pp_partition(m.num_layers, cfg.pp, cfg.partition):
        by_batch = {}
        for b in cfg.batches:
            f = stage_floor(m, st, b, gpu, context_len=cfg.context_len, zipf_s=cfg.zipf_s,
                            mem_bw_gbps=cfg.mem_bw_gbps)
            by_batch[str(b)] = StagePoint(
                floor_us=f.floor_us, weight_bytes=f.weight_bytes, kv_bytes=f.kv_bytes,
                flops=f.flops, components={k: None for k in f.components_us},
                floor_components_us=dict(f.components_us))
        out.append(StageCost(**dataclasses.asdict(st), by_batch=by_batch))
    return out


ROUTING_ZIPF = (0.0, 0.5, 1.0, 1.5)


def routing_plan(m: ModelConfig, cfg: StageCostConfig, draws: int = 200, seed: int = 0
                 ) -> Routing | None:
    """Routing skew under PP (roofline Monte-Carlo, `reports.base.roofline.skew_spread`): for each
    Zipf exponent and batch, distinct experts per MoE layer (exact formula and Monte-Carlo),
    MoE bytes per token per layer, and the stage bytes spread max/mean (mean over draws) next
    to the spread of the mean bytes (the layer split alone). None for a dense model."""
    from reports.base.roofline import skew_spread

    if not m.is_moe:
        return None
    stages = pp_partition(m.num_layers, cfg.pp, cfg.partition)
    by_s = {}
    for s in ROUTING_ZIPF:
        r = skew_spread(m, stages, cfg.batches, s, draws=draws, seed=seed,
                        context_len=cfg.context_len)
        by_s[f"{s:g}"] = {str(b): RoutingPoint(
            distinct_experts=x.distinct_expected, distinct_experts_mc=x.distinct_mean,
            moe_bytes_per_token=x.moe_bytes_per_token,
            stage_bytes_mean=tuple(x.stage_bytes_mean),
            stage_bytes_p10=tuple(x.stage_bytes_p10),
            stage_bytes_p90=tuple(x.stage_bytes_p90),
            stage_spread_max_over_mean=x.max_over_mean,
            stage_spread_of_means=x.max_over_mean_of_means,
            slowest_stage_loss=x.slowest_stage_loss) for b, x in r.items()}
    return Routing(source="estimated (roofline Monte-Carlo)", draws=draws, seed=seed,
                   experts=m.n_routed_experts, top_k=m.top_k, by_zipf=by_s)


def _counts(m: ModelConfig, st: StageCost) -> dict[str, int]:
    layers = range(st.first_layer, st.first_layer + st.num_layers)
    n_moe = sum(1 for i in layers if m.layer_is_moe(i))
    return {"attention": st.num_layers, "moe": n_moe, "dense_mlp": st.num_layers - n_moe,
            "lm_head": int(st.lm_head)}


def _imbalance(costs: list[float | None], floors: list[float]) -> Imbalance:
    return Imbalance(measured=stage_imbalance(costs) if all(costs) else None,
                     floor=stage_imbalance(floors))


def fill_stage_costs(m: ModelConfig, stages: list[StageCost],
                     layers: dict[str, dict[str, LayerPoint]]
                     ) -> tuple[list[StageCost], dict[str, Imbalance]]:
    """Stage cost = Σ count x measured layer time; returns the stages with it filled in and
    the imbalance per batch."""
    by_stage: list[dict[str, StagePoint]] = [{} for _ in stages]
    imbalance = {}
    for b in stages[0].by_batch:
        costs = []
        for k, st in enumerate(stages):
            comps, total = {}, 0.0
            for kind, n in _counts(m, st).items():
                if n == 0:
                    continue
                e = (layers.get(kind) or {}).get(b)
                meas = e.measured_us if e is not None else None
                comps[kind] = None if meas is None else n * meas
                total = None if (meas is None or total is None) else total + n * meas
            p = st.by_batch[b]
            by_stage[k][b] = replace(p, components=comps, measured_us=total,
                                     efficiency=(p.floor_us / total) if total else None)
            costs.append(total)
        imbalance[b] = _imbalance(costs, [st.by_batch[b].floor_us for st in stages])
    return [replace(st, by_batch=bb) for st, bb in zip(stages, by_stage)], imbalance


def _data(cfg, m, m_meas, gpu, stages, layers, prefill, notes, imbalance) -> StageCostData:
    return StageCostData(
        model=m.name, pp=cfg.pp, gpu=gpu.name, gpu_source=gpu.source,
        mem_bw_gbps=cfg.mem_bw_gbps or gpu.mem_bw_gbps,
        mem_bw_from="measured" if cfg.mem_bw_gbps else "spec sheet",
        moe_backends=tuple(cfg.moe_backends), dtype=cfg.dtype,
        formats=dataclasses.asdict(m.formats),
        measured_formats=dataclasses.asdict(m_meas.formats) if m_meas else None,
        timing=None if cfg.plan else "cuda_graph_replay",
        batches=tuple(cfg.batches), context_len=cfg.context_len, zipf_s=cfg.zipf_s,
        experts_sample=cfg.experts_sample, partition=cfg.partition,
        stages=tuple(stages), layers=layers, prefill=prefill, imbalance=imbalance,
        notes=tuple(notes))


def run(cfg: StageCostConfig, progress=None) -> tuple[Record, str | None]:
    """Plan (floors) or measure; saves `cfg.out` as it goes when given (the status rule of
    `save_record`: only an ok run replaces a good record). Returns the record and the writer's
    note (set when the record went beside a good one)."""
    m, gpu = resolve(cfg)
    stages = plan_stages(m, gpu, cfg)
    notes: list[str] = []
    writer = RunWriter(cfg.out) if cfg.out else None
    if cfg.plan:
        imb = {b: _imbalance([None], [s.by_batch[b].floor_us for s in stages])
               for b in map(str, cfg.batches)}
        data = replace(_data(cfg, m, None, gpu, stages, {}, None,
                             ["plan: roofline floors only, nothing measured"], imb),
                       routing=routing_plan(m, cfg))
        rec = make_record(PROBE, data, argv=list(cfg.argv))
    elif reason := available():
        rec = make_record(PROBE, _data(cfg, m, None, gpu, stages, {}, None, [], {}),
                          status="waived", reason=f"needs a GPU: {reason}", argv=list(cfg.argv))
    else:
        return _measure(cfg, m, gpu, stages, notes, progress, writer)
    return rec, writer.save(rec, plan=cfg.plan)[1] if writer else None


def _fits(nbytes: int, what: str, m: ModelConfig, cfg: StageCostConfig) -> str | None:
    import torch

    free, _ = torch.cuda.mem_get_info()
    need = nbytes * 1.1 + 2e9   # weights + activations/workspace margin
    if need <= free:
        return None
    msg = f"{what} needs {need / 1e9:.1f} GB, {free / 1e9:.1f} GB free"
    if what.startswith("moe") and m.is_moe:
        per = 2 * 3 * m.hidden * m.moe_intermediate
        n = int((free - 2e9 - 2 * m.n_routed_experts * m.hidden) / 1.1 // per) - m.n_shared_experts
        msg += (f": use --experts-sample {max(n, m.top_k)} (allocate fewer experts) or a smaller "
                "weight format")
    else:
        msg += ": use a GPU with more memory or a smaller model"
    return msg


@dataclass
class _Measurement:
    """One measuring run's state, shared by its parts: what is timed (layer kinds, MoE backends,
    formats), what has been measured so far (`layers`, `prefill`, `done` of `total` points),
    and how it is saved (`save`: the record as it stands, `partial` until the end)."""
    cfg: StageCostConfig
    m: ModelConfig
    m_meas: ModelConfig          # the formats that run (`measured_model`)
    gpu: GpuSpec
    stages: list[StageCost]
    notes: list[str]
    progress: Any
    writer: RunWriter | None
    att_backend: str
    moe_names: list[str]
    moe_kinds: list[str]
    kinds: list[str]
    layers: dict[str, dict[str, LayerPoint]]
    prefill: dict[str, Any] | None
    bw_meas: float | None
    done: int = 0
    chosen: dict[str, str] = dataclasses.field(default_factory=dict)
    slowed: list = dataclasses.field(default_factory=list)  # clocks of points below full SM clock

    @property
    def total(self) -> int:
        return len(self.kinds) * len(self.cfg.batches)

    def count(self) -> None:
        self.done += 1
        if self.progress:
            self.progress.update(1)

    def save(self, final: bool = False) -> tuple[Record, str | None]:
        cfg, m_meas, layers, prefill = self.cfg, self.m_meas, self.layers, self.prefill
        chosen = self.chosen
        if self.moe_kinds:
            chosen.clear()
            chosen.update(pick_fastest(layers, self.moe_names))
        st, imb = fill_stage_costs(m_meas, self.stages, layers)
        names = sorted(set(chosen.values()))
        data = replace(
            _data(cfg, self.m, m_meas, self.gpu,
                  with_measured_bw(st, m_meas, self.gpu, cfg, self.bw_meas),
                  {k: dict(v) for k, v in layers.items()},
                  Prefill(**{**prefill, "layers": dict(prefill["layers"])})
                  if prefill is not None else None, self.notes, imb),
            mem_bw_measured_gbps=self.bw_meas, moe_backend_by_batch=dict(chosen),
            backend=",".join(names) if names else None,
            kernel_by_layer={k: " | ".join(dict.fromkeys(e.kernel for e in d.values()
                                                         if e.kernel)) or None
                             for k, d in layers.items()})
        errs = [f"{k}: {v.error}" for k, d in layers.items() if k != "moe"
                for v in d.values() if v.error]
        # a failed optional MoE backend is fine as long as another one measured every batch
        moe_ok = not self.moe_kinds or all(b in chosen for b in map(str, cfg.batches))
        hard = [x for x in errs if not x.startswith("moe_") or not moe_ok]
        if final:
            status = "ok" if not hard else "error"
            reason = None if not errs else "; ".join(sorted(set(errs)))[:500]
        else:  # what Ctrl-C or a crash leaves: the points measured so far
            status, reason = "partial", (f"incomplete: {self.done} of {self.total} points "
                                         "measured (interrupted, or still running)")
        rec = make_record(PROBE, data, status=status, reason=reason, argv=list(cfg.argv))
        return rec, self.writer.save(rec)[1] if self.writer else None


@dataclass
class _LayerKind:
    """One layer kind being timed (`attention`, `moe_<backend>`, `dense_mlp`, `lm_head`), and
    the MoE weights its builds share (built once, reused at every batch size)."""
    kind: str
    is_moe: bool
    base: str                    # layers.build's kind: moe for every MoE backend
    backend: str
    variant: str | None
    weights: Any = None

    @classmethod
    def of(cls, kind: str) -> "_LayerKind":
        is_moe = kind.startswith("moe_")
        backend, variant = MOE_BACKENDS[kind[4:]] if is_moe else ("torch", None)
        return cls(kind, is_moe, "moe" if is_moe else kind, backend, variant)


def _moe_names(cfg: StageCostConfig, fmt: str, notes: list[str]) -> list[str]:
    """The MoE backends to time: those asked for that run the routed experts' format."""
    unknown = [n for n in cfg.moe_backends if n not in MOE_BACKENDS]
    if unknown:
        raise ValueError(f"unknown MoE backend(s) {unknown}; known: {sorted(MOE_BACKENDS)}")
    moe_names = list(cfg.moe_backends)
    if fmt != "bf16":   # ppscope's Triton kernels and SGLang's own run int4 / fp8
        skipped = [n for n in moe_names if n not in ("triton", "sglang")]
        if skipped:
            notes.append(f"MoE backend(s) {', '.join(skipped)} not timed: they run bf16 only "
                         f"and the routed experts are {fmt}")
        moe_names = [n for n in moe_names if n in ("triton", "sglang")] or ["triton"]
    return moe_names


def _plan_measurement(cfg, m, gpu, stages, notes, progress, writer) -> _Measurement:
    """What this GPU will time (formats, backends, layer kinds), with the notes saying what
    differs from the model as served; measures the HBM copy bandwidth."""
    m_meas = measured_model(m)
    fmt = m_meas.formats.routed_experts
    if m.formats != m_meas.formats:
        bf = [c for c, v in dataclasses.asdict(m.formats).items()
              if v != getattr(m_meas.formats, c)]
        notes.append(f"run in bf16 instead of the model's format: {', '.join(bf)} (no kernel "
                     "here); floors and efficiencies use the formats that ran "
                     "(measured_formats); --plan gives the native-format floors")
    # efficiencies are computed against the floors of what actually ran
    stages = plan_stages(m_meas, gpu, cfg) if m.formats != m_meas.formats else stages
    att_backend = (("triton" if m.attention == "mla" else "torch")
                   if cfg.attention_backend == "auto" else cfg.attention_backend)
    if cfg.experts_sample:
        notes.append(f"MoE layers allocate {cfg.experts_sample} of {m.n_routed_experts} routed "
                     "experts (ids folded modulo that); floors use the distinct experts touched")
    moe_names = _moe_names(cfg, fmt, notes)
    moe_kinds = [f"moe_{n}" for n in moe_names] if m.is_moe else []
    kinds = ["attention"] + moe_kinds + (["dense_mlp"] if m.first_k_dense > 0 else []) + \
        ["lm_head"]
    prefill: dict[str, Any] | None = {"chunk_tokens": cfg.prefill_chunk, "timing": "eager",
                                      "layers": {}} if cfg.prefill_chunk else None
    try:
        bw_meas = measure_mem_bw()
    except Exception as e:  # noqa: BLE001 - out of memory etc.: efficiencies vs spec only
        bw_meas = None
        notes.append(f"HBM copy bandwidth not measured ({type(e).__name__})")
    return _Measurement(cfg, m, m_meas, gpu, stages, notes, progress, writer, att_backend,
                        moe_names, moe_kinds, kinds, {k: {} for k in kinds}, prefill, bw_meas)


def _measure(cfg, m, gpu, stages, notes, progress, writer) -> tuple[Record, str | None]:
    """Every layer kind at every batch size (then its prefill chunk), saved after each point."""
    import torch

    from microbench.kit.clocks import ClockSampler
    from microbench.kit.timing import l2_bytes

    dev = torch.device("cuda")
    clocks = ClockSampler(torch.cuda.current_device() if torch.cuda.is_available() else 0)
    l2 = l2_bytes(dev)        # 0 without CUDA: every point then records the error below
    run = _plan_measurement(cfg, m, gpu, stages, notes, progress, writer)
    for kind in run.kinds:
        _measure_kind(run, _LayerKind.of(kind), dev, clocks, l2)
    if run.prefill is not None:
        run.prefill["note"] = "attention prefill not measured (decode kernel only); eager timing"
    clocks.stop()
    if run.slowed:
        notes.append(clock_note(run.slowed, run.done))
    return run.save(final=True)


def _measure_kind(run: _Measurement, lk: _LayerKind, dev, clocks, l2: int) -> None:
    """One layer kind: each batch size in turn (a failed check or build fails the rest the
    same way), then its prefill chunk; MoE weights that cannot fit fail every point at once."""
    import torch

    cfg, layers, kind = run.cfg, run.layers, lk.kind
    if lk.is_moe:
        fmt = run.m_meas.formats.routed_experts
        nb = moe_weight_bytes(run.m_meas, fmt, cfg.experts_sample)
        n_exp = cfg.experts_sample or run.m_meas.n_routed_experts
        too_big = _fits(nb, f"moe layer ({n_exp} experts, {fmt})", run.m_meas, cfg)
        if too_big:
            for b in cfg.batches:
                layers[kind][str(b)] = LayerPoint(error=too_big)
            run.done += len(cfg.batches)
            run.save()
            return
    check_err = None
    for i, b in enumerate(cfg.batches):
        entry, check_err = _time_decode_point(run, lk, b, i == 0, dev, clocks, l2)
        layers[kind][str(b)] = point = LayerPoint(**entry)
        run.count()
        run.save()
        if check_err:  # a failed check or build fails every batch the same way
            for b2 in cfg.batches[i + 1:]:
                layers[kind][str(b2)] = point
                run.count()
            break
    if run.prefill is not None and lk.base in ("moe", "dense_mlp") and not check_err:
        run.prefill["layers"][kind] = _time_prefill(run, lk, dev)
    lk.weights = None
    torch.cuda.empty_cache()


def _time_decode_point(run: _Measurement, lk: _LayerKind, b: int, first: bool, dev, clocks,
                       l2: int) -> tuple[dict[str, Any], str | None]:
    """One decode layer at micro-batch b: built, checked against its float32 reference (the
    first batch size of each implementation, on fresh inputs), timed as a graph replay (eager
    where it cannot be captured) with the SM clock sampled, beside its floors. Returns the
    LayerPoint fields and the error that stopped it (then the fields are just that error)."""
    import torch

    from microbench.kernels import layers as L
    from microbench.kit.timing import do_bench, do_bench_graph, graph_copies

    cfg, m_meas, gpu, bw, bw_meas = run.cfg, run.m_meas, run.gpu, run.cfg.mem_bw_gbps, run.bw_meas
    entry: dict[str, Any] = {}
    check_err = None
    try:
        kw = dict(context_len=cfg.context_len, seed=0, attention_backend=run.att_backend)
        if lk.is_moe:
            kw.update(backend=lk.backend, variant=lk.variant, zipf_s=cfg.zipf_s,
                      experts_sample=cfg.experts_sample, weights=lk.weights,
                      fmt=m_meas.formats.routed_experts)
        built = L.build(lk.base, m_meas, b, dev, **kw)
        if lk.is_moe:
            lk.weights = built.info.pop("weights")
        if first:  # check once per layer implementation, on fresh inputs
            entry["check_rel_err"] = built.check()
        if lk.is_moe:
            d = built.info["distinct_experts"]
            floor = moe_floor_us(m_meas, d, gpu, bw)
            floor_m = moe_floor_us(m_meas, d, gpu, bw_meas) if bw_meas else None
            entry.update(distinct_experts=d, experts_allocated=built.info["experts_allocated"])
        else:
            floor = layer_floor(m_meas, lk.base, b, gpu, context_len=cfg.context_len,
                                mem_bw_gbps=bw).floor_us
            floor_m = layer_floor(m_meas, lk.base, b, gpu, context_len=cfg.context_len,
                                  mem_bw_gbps=bw_meas).floor_us if bw_meas else None
        copies = 1
        clocks.start()
        if built.graphable:   # the layer's bytes (its floor) against the L2 cache
            copies = graph_copies(int(floor * (bw or gpu.mem_bw_gbps) * 1e3), l2)
            t = do_bench_graph(built.fn, copies=copies)
        else:
            t = do_bench(built.fn)
        cs = clocks.stop()
        entry.update(cs.as_record())
        if cs.slowed():
            run.slowed.append(cs)
        entry.update(measured_us=t.median_us, p20_us=t.p20_us, p80_us=t.p80_us,
                     floor_us=floor, efficiency=floor / t.median_us,
                     floor_measured_bw_us=floor_m,
                     efficiency_measured_bw=floor_m and floor_m / t.median_us,
                     backend=built.backend, kernel=built.info.get("kernel"),
                     timing="cuda_graph_replay" if built.graphable else "eager",
                     graph_copies=copies)
        del built
    except L.CheckFailed as e:
        check_err = str(e)
    except torch.cuda.OutOfMemoryError:
        check_err = "out of memory: try --experts-sample N or fewer/lower batches"
    except Exception as e:  # noqa: BLE001 - unsupported op/backend: record, go on
        check_err = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
    if check_err:
        entry = {"error": check_err}
    return entry, check_err


def _time_prefill(run: _Measurement, lk: _LayerKind, dev) -> PrefillPoint:
    """One prefill chunk of an MoE or dense MLP layer, eager, against its floor (bytes, and for
    the MoE FLOPs too: prefill is compute-heavy)."""
    from microbench.kernels import layers as L
    from microbench.kit.timing import do_bench

    cfg, m_meas, gpu, bw = run.cfg, run.m_meas, run.gpu, run.cfg.mem_bw_gbps
    T = cfg.prefill_chunk
    try:
        kw = dict(seed=0)
        if lk.is_moe:
            kw.update(backend=lk.backend, variant=lk.variant,
                      experts_sample=cfg.experts_sample, weights=lk.weights,
                      fmt=m_meas.formats.routed_experts)
        built = L.build(lk.base, m_meas, T, dev, **kw)
        t = do_bench(built.fn)
        floor = (moe_floor_us(m_meas, built.info["distinct_experts"], gpu, bw)
                 if lk.is_moe else layer_floor(m_meas, lk.base, T, gpu,
                                               mem_bw_gbps=bw).floor_us)
        if lk.is_moe:  # prefill is compute-heavy: the floor takes FLOPs into account
            fl = layer_floor(m_meas, "moe", T, gpu, mem_bw_gbps=bw)
            floor = max(floor, fl.flops / (gpu.bf16_tflops * 1e12) * 1e6)
        point = PrefillPoint(measured_us=t.median_us, floor_us=floor,
                             efficiency=floor / t.median_us, backend=built.backend)
        del built
        return point
    except Exception as e:  # noqa: BLE001 - record it; decode figures still stand
        return PrefillPoint(error=f"{type(e).__name__}: "
                            f"{(str(e).splitlines() or [''])[0][:200]}")


def clock_note(slowed: list, points: int) -> str:
    """The run note for timed points whose SM clock fell (`ClockSummary` each)."""
    lows = [c.sm_mhz_min for c in slowed if c.sm_mhz_min is not None]
    top = next((c.sm_mhz_max_spec for c in slowed if c.sm_mhz_max_spec), None)
    why = sorted({r for c in slowed for r in c.reasons})
    return (f"SM clock below 90% of its max{f' ({top:.0f} MHz)' if top else ''} or limited "
            f"while {len(slowed)} of {points} points were timed"
            + (f" (lowest {min(lows):.0f} MHz" if lows else " (")
            + (f"; {', '.join(why)})" if why else ")")
            + ": latency-bound kernels (e.g. INT4 dequantisation) slow with the clock, so "
            "those efficiencies hold at that clock (per point: sm_clock_mhz, clock_limits)")


def with_measured_bw(stages: list[StageCost], m: ModelConfig, gpu: GpuSpec,
                     cfg: StageCostConfig, bw_meas: float | None) -> list[StageCost]:
    """Each measured stage point also against the floor at the measured copy bandwidth."""
    if not bw_meas:
        return stages
    out = []
    for st in stages:
        stage = Stage(**{f.name: getattr(st, f.name) for f in dataclasses.fields(Stage)})
        by_batch = {}
        for b, e in st.by_batch.items():
            if e.measured_us:
                f = stage_floor(m, stage, int(b), gpu, context_len=cfg.context_len,
                                zipf_s=cfg.zipf_s, mem_bw_gbps=bw_meas).floor_us
                e = replace(e, floor_measured_bw_us=f, efficiency_measured_bw=f / e.measured_us)
            by_batch[b] = e
        out.append(replace(st, by_batch=by_batch))
    return out


def plot(d: StageCostData, path: str | Path, batch: int) -> Path:
    """PNG (written atomically): per-stage cost stacked by component (measured, else floor)
    with each stage's floor."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b = str(batch)
    points = [s.by_batch[b] for s in d.stages]
    kinds = ["attention", "moe", "dense_mlp", "lm_head"]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    bottoms = [0.0] * len(points)
    measured = all(e.measured_us is not None for e in points)
    for k in kinds:
        vals = [(e.components if measured else e.floor_components_us).get(k) or 0.0
                for e in points]
        if any(vals):
            ax.bar(range(len(points)), vals, bottom=bottoms, label=k)
            bottoms = [x + y for x, y in zip(bottoms, vals)]
    ax.plot(range(len(points)), [e.floor_us for e in points], "k_", markersize=28, mew=2,
            label="roofline floor")
    ax.set_xticks(range(len(points)),
                  [f"{s.index}\n{s.num_layers}L" + ("+lm" if s.lm_head else "") for s in d.stages])
    ax.set_xlabel("pipeline stage (layers)")
    ax.set_ylabel("time per decode step (µs)")
    ax.set_title(f"{d.model} PP{d.pp} on {d.gpu}, micro-batch {batch}"
                 + ("" if measured else " (roofline only)"))
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return write_atomic(path, buf.getvalue())
