"""Each PP rank of a lab server on a core of its own (loaded by `sitecustomize.py` beside this
file when `PPSCOPE_LAB_RANK_CORES` is set: "C0,C1,...", the core of rank r at place r).

SGLang binds a CPU rank's threads itself only with its own `sgl_kernel` on an AMX or arm64 host
(`_init_cpu_threads_env`, SGLang 0.5.23 distributed/bootstrap.py); with the lab's stand-in it logs
"init_cpu_threads_env ... disabled" and `SGLANG_CPU_OMP_THREADS_BIND` does nothing. So this does
what its binding would: `Scheduler.__init__` is wrapped, and before it runs, the scheduler
process (one per rank) moves all its threads to its rank's core with `os.sched_setaffinity`;
the threads it starts later inherit the core. The rank is SGLang's own: `get_parallel().pp_rank`,
which `run_scheduler_process` has set before it makes the Scheduler; where it cannot be read,
the pipeline group's `rank_in_group` once the Scheduler is made. One line per rank goes to the
server log (`ppscope lab: rank R pinned to core C`, or why not).
"""
import functools
import os
import sys

from ppscope_lab_faults import PatchOnImport, apply_patches, rank_of

ENV = "PPSCOPE_LAB_RANK_CORES"


def cores() -> list:
    return [int(c) for c in os.environ[ENV].split(",") if c.strip()]


def _say(msg: str) -> None:
    print(f"ppscope lab: {msg} (pid {os.getpid()})", file=sys.stderr, flush=True)


def pin(rank) -> None:
    """This process and every thread it has to rank `rank`'s core."""
    table = cores()
    if rank is None or not 0 <= rank < len(table):
        _say(f"rank {rank} not pinned: no core for it in {ENV}={os.environ[ENV]}")
        return
    core = table[rank]
    tids = [0]
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        pass
    try:
        for tid in tids:
            os.sched_setaffinity(tid, {core})
    except (AttributeError, OSError) as e:
        _say(f"rank {rank} not pinned to core {core}: {e}")
        return
    _say(f"rank {rank} pinned to core {core}")


def _rank_now():
    """SGLang's pipeline rank of this scheduler process before its Scheduler is made."""
    mod = sys.modules.get("sglang.srt.managers.scheduler")
    get = getattr(mod, "get_parallel", None)
    try:
        return int(get().pp_rank) if get is not None else None
    except Exception:
        return None


def _init(fn):
    @functools.wraps(fn)
    def wrapped(self, *a, **k):
        rank = _rank_now()
        if rank is not None:
            pin(rank)
        out = fn(self, *a, **k)
        if rank is None:
            pin(rank_of(self))
        return out
    return wrapped


PATCHES = {"sglang.srt.managers.scheduler": [("Scheduler", "__init__", _init)]}
_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    for module, patches in PATCHES.items():
        if module in sys.modules:
            apply_patches(sys.modules[module], patches)
        else:
            sys.meta_path.insert(0, PatchOnImport(module, patches))
