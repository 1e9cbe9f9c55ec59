"""The lab's plan: which server settings, which load, which injected fault, per case.

One server per `Group` (settings that need a restart: the pipeline size, the async depth); in
a group the cases run one after another on the same server, each with its own fault (switched
live through the fault module's control file, `boot/inject/ppscope_lab_faults.py`), its own
`pp_max_micro_batch_size` (SGLang's `POST /set_internal_state`) and its own arrivals.
`clean-c8` is the reference every fault's slowdown is measured against.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Case:
    name: str
    concurrency: int
    fault: str = ""                 # PPSCOPE_LAB_FAULT grammar, e.g. "host-delay=0:3000"
    hog_rank: int | None = None     # an external CPU hog on the core this rank is pinned to
    mmb: int | None = None          # pp_max_micro_batch_size through /set_internal_state
    request_rate: float | None = None   # bench_serving --request-rate (None: all at once)
    reps: int = 1                   # bench_serving repetitions (distinct seeds)
    stacks: bool = False            # also profile a window with SGLang's defaults (stacks, shapes)
    # the profiled window itself with SGLang's defaults (stacks: the decoder layers' module
    # events, which time the layers for the layer split, cpu_steps.py)
    window_stacks: bool = False
    live: bool = False              # also run ppscope's own live probe at this C
    baseline: str = "clean-c8"      # what its slowdown is measured against
    expect: str = ""                # the cause the diagnosis should name first ("" = none big)
    profile: bool = True            # profile a window (the "before" evidence of a what-if)
    # the profiled window's own load, when it is not the benchmark's: a window that holds
    # another C (a warm-up, a tail), which the report must say is not the benchmark's load
    window_concurrency: int | None = None
    # the server's layers per rank ("2,2": SGLANG_PP_LAYER_PARTITION, else SGLang's even split
    # of the model's layers), given to `ppscope sglang --layer-partition` so that the report
    # can offer the layer split from a window without module events ("": not given)
    layer_partition: str = ""


@dataclass(frozen=True)
class Group:
    name: str
    pp: int = 2
    extra_args: tuple[str, ...] = ()
    cases: tuple[Case, ...] = field(default_factory=tuple)
    env: tuple[tuple[str, str], ...] = ()    # the server's environment, e.g. the layer split
    # started with ppscope's recipe (--enable-metrics --decode-log-interval 1, as every lab
    # server); False: SGLang's defaults (server.py `ServerSpec.recipe`): no /metrics and a
    # decode line in 40, so its cases may hold no profiled window and no live probe
    recipe: bool = True

    def __post_init__(self) -> None:
        if not self.recipe:
            reads = [c.name for c in self.cases if c.profile or c.stacks or c.live]
            if reads:
                raise ValueError(f"group {self.name}: {', '.join(reads)} profile or probe the "
                                 "server, which reads /metrics and every decode line: a server "
                                 "without ppscope's recipe has neither")


def default_plan(pp: int = 2, quick: bool = False, depth: int = 0) -> tuple[Group, ...]:
    """Clean runs at C = 1, 8, 16; each fault at C = 8; herd against spread at C = 8.
    `quick`: clean C = 8 and one fault (the CI tier). `depth`: the server's
    `--pp-async-batch-depth` (SGLang's default 0)."""
    extra = ("--pp-async-batch-depth", str(depth)) if depth else ()
    name = f"depth{depth}"
    last = pp - 1
    c8 = 8
    clean8 = Case("clean-c8", c8, reps=3, stacks=True, live=True, baseline="")
    if quick:
        # The CI tier's fault is x3: it checks that the slow stage is named, so the fault must
        # be the largest effect on any machine. On an idle 2-core machine the tiny model's
        # forward took 4-5 ms against 2-3 ms of host per visit, and x2 was named second, behind
        # host work (the full plan keeps x2 and sizes it against the clean run).
        return (Group(name, pp, extra, (Case("clean-c8", c8, reps=2, baseline=""),
                      Case("slow-stage", c8, fault=f"slow-stage={last}:3", expect="slow_stage"))),)
    cases = (
        clean8,
        Case("clean-c1", 1, reps=1, live=True, baseline=""),
        Case("clean-c16", 16, reps=2, live=True, baseline=""),
        Case("host-delay", c8, fault="host-delay=0:4000", expect="host"),
        Case("slow-stage", c8, fault=f"slow-stage={last}:2", expect="slow_stage"),
        Case("hop-delay", c8, fault="hop-delay=0:4000", expect="hop"),
        Case("cpu-hog", c8, hog_rank=last, expect="slow_stage"),
        Case("spread-mmb", c8, mmb=max(1, c8 // pp), baseline="clean-c8"),
        Case("staggered", c8, request_rate=16.0, baseline="clean-c8"),
        # the clean run again at the end: slowdowns are against both (the machine drifts)
        Case("clean-c8-end", c8, reps=2, baseline=""),
    )
    return (Group(name, pp, extra, cases),)


def sizes_plan(pp: int = 2, rounds: int = 1) -> tuple[Group, ...]:
    """Large faults, each sized against the clean run (`--baseline`): the slow stage x1.5 and
    x3 on the last rank, host delays of 4 and 20 ms per `get_next_batch_to_run` on rank 0 and
    on the last rank, and a window profiled at C = 1 while the benchmark runs at C = 8 (a
    warm-up window: its first answer line must say the window is not the benchmark's load).

    `rounds` > 1: the lab measures its own noise. Each round is a clean server, a second clean
    server read against it (a control pair: `--baseline` must say "no significant change"),
    then every fault against that round's clean server; two bench runs on every server, so
    each side of every comparison has a spread (reports/model/compare.py). Cases are named
    `<case>.<round>`; the rounds run one after the other, so a change of the machine's load
    falls on the clean, control and fault servers of a round alike."""
    last = pp - 1
    c8 = 8
    if rounds <= 1:
        cases = [Case("clean-c8", c8, reps=2, baseline="")]
        cases += [Case(f"slow-x{f:g}", c8, fault=f"slow-stage={last}:{f:g}", expect="slow_stage")
                  for f in (1.5, 3)]
        cases += [Case(f"host-r{r}-{ms}ms", c8, fault=f"host-delay={r}:{ms * 1000}",
                       expect="host") for r in (0, last) for ms in (4, 20)]
        cases.append(Case("warmup-window", c8, window_concurrency=1))
        return (Group("sizes", pp, (), tuple(cases)),)
    out = []
    for k in range(1, rounds + 1):
        clean = f"clean-c8.{k}"
        cases = [Case(clean, c8, reps=2, baseline=""),
                 Case(f"control-c8.{k}", c8, reps=2, baseline=clean)]
        cases += [Case(f"slow-x{f:g}.{k}", c8, reps=2, fault=f"slow-stage={last}:{f:g}",
                       expect="slow_stage", baseline=clean) for f in (1.5, 3)]
        cases += [Case(f"host-r{r}-{ms}ms.{k}", c8, reps=2, fault=f"host-delay={r}:{ms * 1000}",
                       expect="host", baseline=clean) for r in (0, last) for ms in (4, 20)]
        out.append(Group(f"sizes-{k}", pp, (), tuple(cases)))
    return tuple(out)


# What-ifs checked on the server itself (reports/model/observed/bench_run.py): every "before" case
# (SGLang's defaults, `wi-base-c<C>`) is profiled; an "after" case changes one setting and is
# only measured (its tok/s against the before case's, the model's prediction from the before
# case's evidence alone). Settings chosen to change something on the lab's tiny server.
WHATIF_C = (1, 8, 16)
WHATIF_REPS = 3
WHATIF_RATE = 16.0          # bench_serving --request-rate (Poisson), against a burst
WHATIF_MRR = 4              # --max-running-requests below C = 8, 16
WHATIF_CHUNK = 64           # --chunked-prefill-size: one 64-token prompt per prefill visit


def whatif_plan(pp: int = 2, reps: int = WHATIF_REPS) -> tuple[Group, ...]:
    """Before (defaults, profiled) and after (one setting changed) at C = 1, 8, 16.

    Live on the default server: `--pp-max-micro-batch-size` C / pp (SGLang's
    `/set_internal_state`) and arrival pacing (`--request-rate`). One server each: async depth
    1 and pp (profiled too: the observed-loop check at every depth), `--max-running-requests`
    below C, `--chunked-prefill-size` one prompt."""
    def base(C):
        return f"wi-base-c{C}"
    g0 = [Case(base(C), C, reps=reps, baseline="") for C in WHATIF_C]
    g0 += [Case(f"wi-mmb-c{C}", C, mmb=C // pp, reps=reps, baseline=base(C), profile=False)
           for C in WHATIF_C if C // pp >= 1]
    g0 += [Case(f"wi-rate-c{C}", C, request_rate=WHATIF_RATE, reps=reps, baseline=base(C),
                profile=False) for C in WHATIF_C]
    groups = [Group("wi-depth0", pp, (), tuple(g0))]
    for d in (1, pp):
        groups.append(Group(f"wi-depth{d}", pp, ("--pp-async-batch-depth", str(d)), tuple(
            Case(f"wi-d{d}-c{C}", C, reps=reps, baseline=base(C)) for C in WHATIF_C)))
    groups.append(Group(f"wi-mrr{WHATIF_MRR}", pp, ("--max-running-requests", str(WHATIF_MRR)),
                        tuple(Case(f"wi-mrr-c{C}", C, reps=reps, baseline=base(C), profile=False)
                              for C in WHATIF_C if C > WHATIF_MRR)))
    groups.append(Group(f"wi-chunk{WHATIF_CHUNK}", pp,
                        ("--chunked-prefill-size", str(WHATIF_CHUNK)),
                        tuple(Case(f"wi-chunk-c{C}", C, reps=reps, baseline=base(C),
                                   profile=False) for C in WHATIF_C)))
    return tuple(groups)


def whatif_live_plan(pp: int = 2, reps: int = WHATIF_REPS) -> tuple[Group, ...]:
    """The live settings (`--pp-max-micro-batch-size`, arrival pacing) on one default server,
    their runs interleaved with the before runs (before, mmb, rate, before, ...: one
    bench_serving run per case `wl-<setting>-c<C>.<k>`), so that a change of the machine's load
    between runs falls on both sides alike. The first before run of each C is profiled. Not at
    C = 1: one stream fills one slot under any cap, and a paced client with one stream sends
    each prompt when the last one finished, as an unpaced one does."""
    cases = []
    for C in (c for c in WHATIF_C if c > 1):   # at C = 1 neither setting can change anything
        for k in range(1, reps + 1):
            cases.append(Case(f"wl-base-c{C}.{k}", C, baseline="", profile=k == 1))
            if C // pp >= 1 and C // pp < C:
                cases.append(Case(f"wl-mmb-c{C}.{k}", C, mmb=C // pp, baseline=f"wl-base-c{C}",
                                  profile=False))
            cases.append(Case(f"wl-rate-c{C}.{k}", C, request_rate=WHATIF_RATE,
                              baseline=f"wl-base-c{C}", profile=False))
    return (Group("wl-depth0", pp, (), tuple(cases)),)


def whatif_restart_plan(pp: int = 2, rounds: int = 2,
                        cs: tuple[int, ...] = WHATIF_C) -> tuple[Group, ...]:
    """The settings that need a restart (`--pp-async-batch-depth` 1 and pp,
    `--chunked-prefill-size`, `--max-running-requests`) against the default, the servers
    alternating (default, depth 1, depth pp, chunk, rows, default, ...; one bench_serving run per
    C on each), so that a change of the machine's load between servers falls on all sides
    alike. Every default server's runs are profiled: they are the before evidence, taken in the
    same pass as the runs they predict, one window per round (reports/lab/whatifs.py
    predicts from each and from the one nearest the benchmark's pace); so are the first round's
    servers of every setting (the model of the observed loop checked at every setting, and the
    after loop to set beside the modelled one)."""
    settings = [(f"d{d}", ("--pp-async-batch-depth", str(d)), cs) for d in (1, pp)]
    settings.append((f"chunk{WHATIF_CHUNK}", ("--chunked-prefill-size", str(WHATIF_CHUNK)),
                     tuple(C for C in cs if C > 1)))
    settings.append((f"mrr{WHATIF_MRR}", ("--max-running-requests", str(WHATIF_MRR)),
                     tuple(C for C in cs if C > WHATIF_MRR)))
    out = []
    for k in range(1, rounds + 1):
        out.append(Group(f"wr-d0-{k}", pp, (), tuple(
            Case(f"wr-base-c{C}.{k}", C, baseline="", profile=True) for C in cs)))
        for tag, extra, at in settings:
            out.append(Group(f"wr-{tag}-{k}", pp, extra, tuple(
                Case(f"wr-{tag}-c{C}.{k}", C, baseline=f"wr-base-c{C}",
                     profile=k == 1)
                for C in at)))
    return tuple(out)


PARTITION_ENV = "SGLANG_PP_LAYER_PARTITION"


def split_plan(pp: int = 2, layers: int = 4, rounds: int = 2, C: int = 8
               ) -> tuple[Group, ...]:
    """SGLang's default layer split against each split one layer away
    (`SGLANG_PP_LAYER_PARTITION`, read by SGLang's `get_pp_indices`), the servers alternating
    (default, each split, default, ...; one bench_serving run each) so that a change of the
    machine's load falls on every side alike. The default server's window is profiled with
    SGLang's defaults (stacks): its decoder layers' module events time one layer on each rank,
    the before evidence of the split's what-if (reports/model/observed/layer_split.py)."""
    from reports.base.partition import layer_counts
    base = layer_counts(layers, pp)
    splits = []
    for r in range(pp - 1):          # one layer moved across each boundary, both ways
        for d in (1, -1):
            c = list(base)
            c[r] += d
            c[r + 1] -= d
            if min(c) >= 1:
                splits.append(",".join(map(str, c)))
    out = []
    for k in range(1, rounds + 1):
        out.append(Group(f"sp-default-{k}", pp, (), (
            Case(f"sp-base-c{C}.{k}", C, baseline="", window_stacks=True),)))
        for sp in splits:
            tag = sp.replace(",", "")
            out.append(Group(f"sp-{tag}-{k}", pp, (), (
                Case(f"sp-{tag}-c{C}.{k}", C, baseline=f"sp-base-c{C}", profile=False),),
                env=((PARTITION_ENV, sp),)))
    return tuple(out)


RECIPE_C = 8
RECIPE_REPS = 2


def recipe_plan(pp: int = 2, rounds: int = 3) -> tuple[Group, ...]:
    """What ppscope's recipe (`--enable-metrics --decode-log-interval 1`, with which every other
    plan starts its servers) costs the server: per round a server with SGLang's defaults
    (neither flag: no /metrics, a decode log line every 40 steps) then one with the recipe,
    the servers alternating so that a change of the machine's load falls on both sides alike;
    C = 8, two bench_serving runs on each, nothing profiled (a window would need the recipe's
    readings, and would cost more than the recipe). Cases `rc-sglang-c8.<k>` and
    `rc-recipe-c8.<k>`, the recipe case read against its round's defaults case
    (`python -m reports.lab.recipe OUT`)."""
    out = []
    for k in range(1, rounds + 1):
        base = f"rc-sglang-c{RECIPE_C}.{k}"
        out.append(Group(f"rc-sglang-{k}", pp, (), (
            Case(base, RECIPE_C, reps=RECIPE_REPS, baseline="", profile=False),), recipe=False))
        out.append(Group(f"rc-recipe-{k}", pp, (), (
            Case(f"rc-recipe-c{RECIPE_C}.{k}", RECIPE_C, reps=RECIPE_REPS, baseline=base,
                 profile=False),)))
    return tuple(out)


def _one_layer_off(base: list[int], rank: int) -> str:
    """`base` with one layer moved off `rank` onto its neighbour (the next rank; the last
    rank's onto the one before it), as SGLANG_PP_LAYER_PARTITION writes it."""
    c = list(base)
    c[rank] -= 1
    c[rank + 1 if rank + 1 < len(c) else rank - 1] += 1
    return ",".join(map(str, c))


def fixes_plan(pp: int = 2, layers: int = 4, rounds: int = 2, C: int = 8
               ) -> tuple[Group, ...]:
    """The report's fix for each fault, applied and measured (reports/lab/fixes.py). Per round,
    the servers alternating so that a change of the machine's load falls on every side alike:
    SGLang's defaults with each fault in turn, two bench runs each, each profiled (the before
    evidence the report's fix is read from: `fx-slow<last>`, `fx-slow0`, `fx-hop`, `fx-host`);
    then the fix the report can give, on a server of its own with the same fault, measured
    against that default case (not profiled): one layer moved off the slow rank
    (SGLANG_PP_LAYER_PARTITION, from the model's `layers` and pp as SGLang splits them), and
    `--pp-async-batch-depth 1` for the slow hop. The host delay has no server setting in the
    report (render/answer_table.py NO_SETTING): nothing is applied to it.

    The default servers' cases carry the even split (`layer_partition`): their windows are
    profiled without stacks, so the layers each rank runs come from SGLang's rule, and one
    layer's cost from each rank's own forward (the slow stage's fault stretches the whole
    forward, reports/model/observed/layer_split.py). The split servers are profiled the same
    way: each rank's forward after the split, against the what-if's estimate of it
    (reports/lab/split_forwards.py)."""
    from reports.base.partition import layer_counts
    last = pp - 1
    base = layer_counts(layers, pp)
    even = ",".join(map(str, base))
    faults = ((f"slow{last}", f"slow-stage={last}:2", "slow_stage"),
              ("slow0", "slow-stage=0:2", "slow_stage"),
              ("hop", "hop-delay=0:4000", "hop"),
              ("host", "host-delay=0:4000", "host"))
    fault_of = {tag: f for tag, f, _ in faults}
    reps = 2
    out = []
    for k in range(1, rounds + 1):
        out.append(Group(f"fx-default-{k}", pp, (), tuple(
            Case(f"fx-{tag}-c{C}.{k}", C, fault=f, reps=reps, baseline="", expect=cause,
                 layer_partition=even) for tag, f, cause in faults)))
        for rank in (last, 0):
            tag, split = f"slow{rank}", _one_layer_off(base, rank)
            out.append(Group(f"fx-{tag}-split-{k}", pp, (), (
                Case(f"fx-{tag}-split-c{C}.{k}", C, fault=fault_of[tag], reps=reps,
                     baseline=f"fx-{tag}-c{C}.{k}", expect="slow_stage",
                     layer_partition=split),), env=((PARTITION_ENV, split),)))
        out.append(Group(f"fx-hop-depth1-{k}", pp, ("--pp-async-batch-depth", "1"), (
            Case(f"fx-hop-depth1-c{C}.{k}", C, fault=fault_of["hop"], reps=reps,
                 baseline=f"fx-hop-c{C}.{k}", expect="hop", profile=False),)))
    return tuple(out)
