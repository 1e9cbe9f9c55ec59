"""How SGLang splits a model's layers over pipeline stages (SGLang 0.5.23
srt/distributed/utils.py, `get_pp_indices`; checked by tests/test_sglang_oracle.py).

Even split; the last `L % P` ranks get one layer more (Kimi K2, 61 layers, PP8 ->
7,7,7,8,8,8,8,8). An override "a,b,..." (SGLang's `SGLANG_PP_LAYER_PARTITION`, ppscope's
`--partition`) must have P positive entries summing to L. The embedding lives on stage 0;
final norm, `lm_head` and sampling on the last stage.

Stage imbalance is max / mean stage cost (`imbalance`): 1.0 when balanced; in a pipeline every
stage waits for the slowest, so it is how much longer a step takes than a balanced split.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Stage:
    index: int
    first_layer: int
    num_layers: int
    embedding: bool
    lm_head: bool

    @property
    def layers(self) -> range:
        return range(self.first_layer, self.first_layer + self.num_layers)


def layer_counts(num_layers: int, pp: int, override: str | None = None) -> list[int]:
    if pp < 1:
        raise ValueError(f"pp must be >= 1, got {pp}")
    if override is not None and override.strip():
        try:
            counts = [int(x) for x in override.split(",")]
        except ValueError:
            raise ValueError(f"partition {override!r}: entries must be integers "
                             "like 7,7,7,8,8,8,8,8") from None
        if len(counts) != pp:
            raise ValueError(f"partition {override!r} has {len(counts)} entries; pp is {pp}")
        if any(c < 1 for c in counts):
            raise ValueError(f"partition {override!r}: every stage needs at least one layer")
        if sum(counts) != num_layers:
            raise ValueError(f"partition {override!r} sums to {sum(counts)}; "
                             f"the model has {num_layers} layers")
        return counts
    if num_layers < pp:
        raise ValueError(f"{num_layers} layers cannot be split over pp={pp} stages")
    base, extra = divmod(num_layers, pp)
    return [base + (1 if i >= pp - extra else 0) for i in range(pp)]


def pp_partition(num_layers: int, pp: int, override: str | None = None) -> tuple[Stage, ...]:
    """The stages, in order. Raises ValueError with a one-line message on a bad override."""
    counts = layer_counts(num_layers, pp, override)
    stages, first = [], 0
    for i, n in enumerate(counts):
        stages.append(Stage(index=i, first_layer=first, num_layers=n, embedding=i == 0,
                            lm_head=i == pp - 1))
        first += n
    return tuple(stages)


def imbalance(costs: Sequence[float]) -> float:
    """max / mean of the stages' costs (any unit): 1.0 when every stage costs the same."""
    return max(costs) / (sum(costs) / len(costs))
