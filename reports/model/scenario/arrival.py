"""How the requests reach the scheduler: a modelling uncertainty, stated and, where the server's
log has it, decided by evidence.

SGLang's scheduler takes whatever requests have arrived at each loop iteration
(managers/scheduler.py `recv_requests`), and under PP each iteration schedules one slot
(managers/scheduler_pp_mixin.py `event_loop_pp`). So C streams opened at once land in one slot
if they all reach the scheduler before its next visit (`burst`), and in consecutive slots if
they reach it one per visit (`trickle`: the tokenizer hands a burst over one by one, or the
client opens its streams one after another). The model runs both; where they differ the report
shows both and says what decides: the server log's Prefill lines, whose `#new-seq` is how many
waiting requests each prefill admitted (8 sent at once and admitted as 6 then 2: two slots).
"""
from __future__ import annotations

from dataclasses import dataclass

ARRIVALS = ("burst", "trickle")
DIFFERS = 0.05        # burst and trickle differ at C when their tok/s differ by more than this
WAVES = 16            # the first prefill lines read for the arrival
DECIDES = ("the server log's Prefill lines (`#new-seq`: requests admitted per prefill), read "
           "by `ppscope sglang --log server.log`")


def arrival_from_log(sg) -> tuple[str, str] | None:
    """(`burst` | `trickle`, the numbers) from the first prefill lines of the first PP rank
    that logged any: `burst` when at least half of the requests they admitted came in prefills
    of two or more, else `trickle`. None when the log has no prefill lines."""
    if sg is None:
        return None
    ranks = sorted((r for r, d in (sg.ranks or {}).items() if d.prefill_waves),
                   key=lambda r: int(r) if str(r).isdigit() else 1 << 30)
    if not ranks:
        return None
    seq = [w.new_seq for w in sg.ranks[ranks[0]].prefill_waves[:WAVES] if w.new_seq > 0]
    if not seq:
        return None
    grouped = sum(n for n in seq if n >= 2) / sum(seq)
    kind = "burst" if grouped >= 0.5 else "trickle"
    return kind, (f"#new-seq of the first {len(seq)} prefills on PP rank {ranks[0]}: "
                  f"{', '.join(map(str, seq[:8]))}{', ...' if len(seq) > 8 else ''} "
                  f"({grouped:.0%} of the requests admitted in groups of two or more)")


@dataclass(frozen=True)
class ArrivalAt:
    """Both arrivals at one concurrency: modelled tok/s and occupied slot sizes of each."""
    concurrency: int
    tok_per_s: dict[str, float]                # arrival -> modelled tok/s
    slot_sizes: dict[str, tuple[int, ...]]     # arrival -> occupied slots' sizes
    observed: float | None
    observed_fits: str | None                  # the arrival the observed tok/s is nearer


@dataclass(frozen=True)
class Alternatives:
    """report.json's `arrival`: the one assumed, where it came from, and both at every C."""
    assumed: str
    source: str
    evidence: str
    differs_at: tuple[int, ...]                # concurrencies where the arrival changes tok/s
    decides: str
    by_concurrency: tuple[ArrivalAt, ...]


def alternatives(inp, observed: dict[int, float], run) -> Alternatives:
    """Modelled tok/s under each arrival at every concurrency; which one the observed tok/s
    is nearer; the concurrencies where the arrival changes the answer. `run(C, arrival)`: the
    pipeline model's result (reports/model/scenario/loop_builder.py `run`)."""
    rows, differs = [], []
    for C in inp.concurrency:
        res = {a: run(C, a) for a in ARRIVALS}
        tok = {a: r.tok_per_s for a, r in res.items()}
        sizes = {a: [s for s in r.slot_sizes if s] for a, r in res.items()}
        obs = observed.get(C)
        fits = (min(ARRIVALS, key=lambda a: abs(tok[a] - obs)) if obs else None)
        rows.append(ArrivalAt(C, tok, sizes, obs, fits))
        if abs(tok["trickle"] / tok["burst"] - 1) > DIFFERS:
            differs.append(C)
    src, ev = inp.src("arrival")
    return Alternatives(inp.arrival, src, ev, tuple(differs), DECIDES, tuple(rows))


def sentence(arr: Alternatives) -> str | None:
    """One line for the answer where the arrival changes it."""
    rows = [r for r in arr.by_concurrency if r.concurrency in arr.differs_at]
    if not rows:
        return None
    parts = []
    for r in rows:
        t = r.tok_per_s
        fit = (f"; the observed {r.observed:.1f} fits {r.observed_fits}"
               if r.observed_fits else "")
        parts.append(f"C={r.concurrency} {t['burst']:.1f} tok/s if the requests reach the "
                     f"scheduler together (burst: slots {list(r.slot_sizes['burst'])}), "
                     f"{t['trickle']:.1f} if one per slot visit (trickle: "
                     f"{len(r.slot_sizes['trickle'])} slots){fit}")
    if arr.source == "observed":
        how = f"the model uses {arr.assumed}, from {arr.evidence}"
    else:
        how = (f"the model assumes {arr.assumed} ({arr.source}); what decides it is "
               f"{DECIDES}")
    return "The answer hangs on how requests arrive: " + "; ".join(parts) + f". {how[0].upper()}{how[1:]}."
