"""The exact Shapley split of a change over named players, shared by both splits of the model:
the scenario's causes (reports/model/attribution.py) and the observed server's
(reports/model/observed/diagnose.py, reports/model/change_split.py).

A player's value is the average, over all orders of turning the players on, of the change it
makes: sum over subsets S not holding it of |S|!(n-|S|-1)!/n! * (v(S+i) - v(S)). The values add
up to v(all) - v(none) exactly and do not depend on any order.
"""
from __future__ import annotations

from itertools import combinations
from math import factorial
from typing import Callable, Hashable, Sequence


def shapley(players: Sequence[Hashable], value: Callable[[frozenset], float]
            ) -> dict[Hashable, float]:
    """Exact Shapley values (2^n evaluations; fine for n <= 10)."""
    n = len(players)
    if n > 10:
        raise ValueError(f"exact Shapley over {n} players is too slow; use <= 10")
    memo: dict[frozenset, float] = {}

    def v(s: frozenset) -> float:
        if s not in memo:
            memo[s] = value(s)
        return memo[s]

    w = [factorial(k) * factorial(n - k - 1) / factorial(n) for k in range(n)]
    out = {}
    for p in players:
        others = [q for q in players if q != p]
        tot = 0.0
        for k in range(n):
            for s in combinations(others, k):
                fs = frozenset(s)
                tot += w[k] * (v(fs | {p}) - v(fs))
        out[p] = tot
    return out
