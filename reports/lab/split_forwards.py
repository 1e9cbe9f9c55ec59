"""Each rank's forward before and after a layer split, as SGLang ran them: the check of the
split what-if's one assumption (reports/model/observed/layer_split.py, "from the forward":
rank r's forward becomes its observed forward x n'_r / n_r, every part of it layer work).

For each pair of profiled lab cases whose servers differ only in `SGLANG_PP_LAYER_PARTITION`
(an "after" case whose `baseline` is the "before" case, both with a loop profile in their
sglang.json: the `--fixes` plan's split cases), per rank and per decode micro-batch size both
windows ran:

- the forward before (n layers) and after (n' layers), measured (mean us, CPU view; where
  the after window ran no micro-batch of a size the before window ran, interpolated between
  the sizes on either side of it in log b, as the model interpolates a curve, and said);
- the forward after as the what-if predicts it from the before window alone (x n'/n);
- one layer's cost as the two servers imply it: (after - before) / (n' - n), and the part of
  the before forward that is not layer work: before - n x that layer (SGLang's own work per
  forward, the embedding or lm_head and logits), as a share of the before forward.

    python -m reports.lab.split_forwards OUT [--md]

Read-only. A folder with no such pair is a one-line error (exit 2).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from reports.base.errors import CliError
from reports.base.partition import layer_counts
from reports.lab.summary import read_case
from reports.model.observed.deployment import at_size

USAGE = "usage: python -m reports.lab.split_forwards OUT [--md]"


@dataclass(frozen=True)
class RankForward:
    """One rank at one micro-batch size, before and after a split (times in us)."""
    pair: str                 # "before -> after"
    rank: int
    batch: int
    layers: tuple[int, int]   # n, n'
    before_us: float
    after_us: float
    predicted_us: float       # before x n'/n (the what-if's "from the forward" estimate)
    layer_us: float | None    # (after - before) / (n' - n); None where n' == n
    other_share: float | None  # (before - n x layer) / before
    interpolated: bool = False  # the after window ran no micro-batch of this size: its forward
    #                             interpolated between the sizes on either side it ran

    @property
    def error_pct(self) -> float:
        return 100 * (self.predicted_us / self.after_us - 1)


def _forwards(d: Path) -> dict[int, dict[int, float]] | None:
    """rank -> {decode batch size: mean forward us} of a case's sglang.json; None without one."""
    from reports.base.records import RecordError, read_record
    p = d / "sglang.json"
    if not p.exists():
        return None
    try:
        rec = read_record(p)
    except RecordError as e:
        raise CliError(f"{p}: {e}") from None
    loop = rec.payload.loop if rec.payload is not None else None
    if loop is None or not loop.ranks:
        return None
    return {int(r): (x.curve("forward_effective_us_by_batch", None)
                     or x.curve("forward_us_by_batch", None)) for r, x in loop.ranks.items()}


def _split(partition: str, pp: int) -> tuple[int, ...]:
    """The layers per rank of a case's SGLANG_PP_LAYER_PARTITION, checked as SGLang checks it."""
    n = [int(x) for x in partition.split(",") if x.strip().isdigit()]
    return tuple(layer_counts(sum(n), pp, partition))


def rows(out: Path) -> list[RankForward]:
    if not out.is_dir():
        raise CliError(f"{out} is not a lab results folder")
    dirs = {d.name: d for d in sorted(out.iterdir()) if (d / "case.json").exists()}
    cases = {n: read_case(d) for n, d in dirs.items()}
    found: list[RankForward] = []
    for name, lc in cases.items():
        base = lc.case.baseline
        if not (base in cases and lc.case.layer_partition
                and cases[base].case.layer_partition):
            continue
        before, after = _forwards(dirs[base]), _forwards(dirs[name])
        if not before or not after:
            continue
        pp = len(before)
        try:
            n0 = _split(cases[base].case.layer_partition, pp)
            n1 = _split(lc.case.layer_partition, pp)
        except ValueError as e:
            raise CliError(f"{dirs[name]}: {e}") from None
        if n0 == n1 or sum(n0) != sum(n1):
            continue
        for r in sorted(before):
            a = after.get(r, {})
            for b in sorted(before[r]):
                if b not in a and not (a and min(a) < b < max(a)):
                    continue
                fb, fa = before[r][b], (a[b] if b in a else at_size(a, b))
                dn = n1[r] - n0[r]
                layer = (fa - fb) / dn if dn else None
                other = (fb - n0[r] * layer) / fb if layer is not None and fb else None
                found.append(RankForward(f"{base} -> {name}", r, b, (n0[r], n1[r]), fb, fa,
                                         fb * n1[r] / n0[r], layer, other, b not in a))
    if not found:
        raise CliError(f"{out}: no profiled pair of cases that differ only in their layer "
                       "split (`ppscope sglang-lab --fixes` runs them)")
    return found


def render(rs: list[RankForward], fmt: str = "simple") -> str:
    from tabulate import tabulate
    return tabulate(
        [[r.pair, r.rank, r.batch, f"{r.layers[0]} -> {r.layers[1]}",
          f"{r.before_us / 1e3:.2f}",
          f"{r.after_us / 1e3:.2f}" + (" (interpolated)" if r.interpolated else ""),
          f"{r.predicted_us / 1e3:.2f} ({r.error_pct:+.0f}%)",
          "-" if r.layer_us is None else f"{r.layer_us / 1e3:.2f}",
          "-" if r.other_share is None else f"{100 * r.other_share:.0f}%"] for r in rs],
        headers=["pair", "rank", "batch", "layers", "forward before ms", "after ms",
                 "after as predicted (x n'/n)", "one layer ms (implied)",
                 "not layer work (before)"], tablefmt=fmt)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    md = "--md" in argv
    rest = [a for a in argv if a != "--md"]
    if any(a.startswith("--") for a in rest) or len(rest) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    print(render(rows(Path(rest[0])), "github" if md else "simple"))
    return 0


if __name__ == "__main__":
    from reports.cli import run_guarded
    sys.exit(run_guarded("split_forwards", main))
