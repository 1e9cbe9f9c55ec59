"""What every kernel check shares: seeded random inputs (never zeros) and the relative-error test
against a float32 reference (STYLE rule 4). Imports torch only inside functions."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

REL_TOL = 2e-2  # ||y - ref|| / ||ref|| allowed for bf16 vs fp32 reference


class CheckFailed(RuntimeError):
    pass


def rel_err(y, ref) -> float:
    y, ref = y.float(), ref.float()
    return float((y - ref).norm() / ref.norm().clamp_min(1e-30))


def assert_close(name: str, y, ref, tol: float = REL_TOL) -> float:
    err = rel_err(y, ref)
    if not err <= tol:  # also catches NaN
        raise CheckFailed(f"{name}: relative error {err:.3g} > {tol} against float32 reference")
    return err


def randn(shape, scale: float, gen, device, dtype=None):
    import torch

    t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32 if dtype is None
                    else dtype)
    return t.mul_(scale).to(torch.bfloat16)


def gen(device, seed: int):
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def rmsnorm(x, w, eps: float = 1e-6):
    import torch

    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


@dataclass(frozen=True)
class Built:
    kind: str
    batch: int
    backend: str
    fn: Callable[[], Any]
    check: Callable[[], float]          # returns relative error, raises CheckFailed
    graphable: bool = True
    weight_bytes: int = 0               # bytes allocated for weights
    info: dict = field(default_factory=dict)  # distinct_experts, notes


def cached_for(cache: dict, src: tuple, make: Callable[[], Any], keep: int = 2):
    """make() for the tensors `src` (e.g. weights repacked for a kernel), cached while they
    live. Entries hold weak references to `src`: a freed weight set's id or address can never
    hand a later one its stale entry, and dead entries are dropped on every call; at most
    `keep` entries."""
    import weakref

    for k in [k for k, (refs, _) in cache.items() if any(r() is None for r in refs)]:
        del cache[k]
    key = tuple(id(t) for t in src)
    hit = cache.get(key)
    if hit is not None and all(r() is t for r, t in zip(hit[0], src)):
        return hit[1]
    if len(cache) >= keep:
        cache.clear()
    val = make()
    cache[key] = (tuple(weakref.ref(t) for t in src), val)
    return val
