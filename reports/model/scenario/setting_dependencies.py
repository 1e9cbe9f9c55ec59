"""What depends on a server setting the user did not give: the smallest max_running_requests
with the same slot split at every modelled concurrency (a bisection)."""
from __future__ import annotations


from reports.model.scenario import loop_builder as lb
from reports.model.scenario.inputs import Inputs
from reports.base.slots import burst_sizes


def setting_dependencies(inp: Inputs) -> dict[str, str]:
    """For max_running_requests not given by the user: whether the slot split (and so any
    verdict or what-if) changes with it, at the concurrencies modelled."""
    src = inp.src("max_running_requests")[0]
    if src in ("given", "observed") or inp.max_running_requests is None:
        return {}
    from reports.model.settings_change import Change

    def split(mrr: int) -> list[list[int]]:
        cfg = lb.Changed.of(inp, (Change("--max-running-requests", mrr),)).slot_config
        return [burst_sizes(C, cfg, inp.prompt_len)
                for C in inp.concurrency]

    now = split(inp.max_running_requests)
    lo, hi = 1, inp.max_running_requests   # the smallest value with the same split (bisection:
    while lo < hi:                          # a larger pool never splits a burst further)
        mid = (lo + hi) // 2
        if split(mid) == now:
            hi = mid
        else:
            lo = mid + 1
    return {"max_running_requests (dependencies)": (
        f"not given, so {inp.max_running_requests} is SGLang's default derived from an "
        f"estimated KV pool. Every modelled slot split ({', '.join(f'C={C}: ' + ' '.join(map(str, [x for x in sz if x])) for C, sz in zip(inp.concurrency, now))}) "
        f"is the same for any max_running_requests >= {lo}: no verdict or what-if depends on "
        f"the value above that. Below it the per-slot cap (max_running_requests // {inp.pp}) "
        "splits bursts further and the herd verdict, the attribution and every what-if at the "
        "concurrencies it changes would move; the --max-running-requests what-if rows show how.")}
