"""One injected fault inside SGLang's own processes. SGLang's files are never edited and nothing
is installed: the lab puts this folder on the server's `PYTHONPATH`, and `sitecustomize.py` beside
this file loads it. Chosen by `PPSCOPE_LAB_FAULT`, one of:

  host-delay=R:US      rank R's scheduler takes US microseconds longer in every
                       `get_next_batch_to_run`
  slow-stage=R:F       rank R's model forward (`ModelRunner.forward`) takes F times as long
                       (the forward runs, then the rank waits (F - 1) x its time)
  hop-delay=R:US       rank R's hidden-state send to the next stage is held US microseconds
                       inside SGLang's `send_proxy_dict_to_next_stage` range, before the
                       send is posted, as a slow link holds a blocking send

The wrap goes on SGLang's classes right after their module is imported, and acts only in the
process whose pipeline rank is R (`pp_group.rank_in_group`), so the other ranks run unchanged.
Every delay is a sleep, not a spin: on a small lab machine (2 cores for two ranks, SGLang's
tokenizer and detokenizer, and the client) a spinning delay would also starve those processes,
a cost of the machine, not of the loop; the external CPU hog case measures contention apart.

`PPSCOPE_LAB_FAULT_FILE=PATH` instead: every target is wrapped, and the fault is whatever line
PATH holds (none when it is empty or absent), re-read at most every 50 ms, so one running
server goes through the lab's cases without a restart. The active fault is logged once per change
through SGLang's own logger format (`ppscope lab fault: ...`), so the server log says when it began.
"""
import functools
import importlib.abc
import os
import sys
import time

TARGETS = {   # fault -> (module, class, method)
    "host-delay": ("sglang.srt.managers.scheduler", "Scheduler", "get_next_batch_to_run"),
    "slow-stage": ("sglang.srt.model_executor.model_runner", "ModelRunner", "forward"),
    "hop-delay": ("sglang.srt.managers.scheduler", "Scheduler", "_pp_send_dict_to_next_stage"),
}


def parse(spec: str):
    kind, _, arg = spec.partition("=")
    rank, _, value = arg.partition(":")
    if kind not in TARGETS or not rank.isdigit():
        raise ValueError(f"PPSCOPE_LAB_FAULT: expected one of {sorted(TARGETS)}=R:VALUE, got {spec!r}")
    return kind, int(rank), float(value)


def rank_of(obj):
    g = getattr(obj, "pp_group", None)
    return getattr(g, "rank_in_group", None)


class _Switch:
    """The fault now in force: fixed (PPSCOPE_LAB_FAULT) or read from a file (PPSCOPE_LAB_FAULT_FILE)."""

    def __init__(self, fixed=None, path=None):
        self.fixed, self.path = fixed, path
        self.current, self.checked, self.mtime = fixed, 0.0, None

    def get(self):
        if self.path is None:
            return self.current
        now = time.monotonic()
        if now - self.checked > 0.05:
            self.checked = now
            try:
                st = os.stat(self.path)
                if st.st_mtime_ns != self.mtime:
                    self.mtime = st.st_mtime_ns
                    with open(self.path) as f:
                        text = f.read().strip()
                    new = parse(text) if text else None
                    if new != self.current:
                        print(f"ppscope lab fault: {text or 'none'} (pid {os.getpid()})",
                              file=sys.stderr, flush=True)
                    self.current = new
            except FileNotFoundError:
                self.current, self.mtime = None, None
            except (OSError, ValueError) as e:
                print(f"ppscope lab fault: ignored ({e})", file=sys.stderr, flush=True)
        return self.current


def wrap(target: str, switch: _Switch, fn):
    @functools.wraps(fn)
    def wrapped(self, *a, **k):
        f = switch.get()
        if f is None or f[0] != target or rank_of(self) != f[1] or (
                target == "hop-delay" and k.get("msg_type") != "proxy"):
            return fn(self, *a, **k)
        kind, rank, value = f
        if kind == "host-delay":
            time.sleep(value / 1e6)
            return fn(self, *a, **k)
        if kind == "slow-stage":
            t0 = time.perf_counter()
            out = fn(self, *a, **k)
            time.sleep(max(0.0, (value - 1.0) * (time.perf_counter() - t0)))
            return out
        time.sleep(value / 1e6)            # hop-delay: the send is held
        return fn(self, *a, **k)
    wrapped.__ppscope_fault__ = target
    return wrapped


class PatchOnImport(importlib.abc.MetaPathFinder):
    def __init__(self, module, patches):
        self.module, self.patches = module, patches     # [(class, method, make)]

    def find_spec(self, name, path=None, target=None):
        if name != self.module:
            return None
        sys.meta_path.remove(self)
        import importlib.util
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader, finder = spec.loader, self

        class _Loader(importlib.abc.Loader):
            def create_module(self, s):
                return loader.create_module(s)

            def exec_module(self, module):
                loader.exec_module(module)
                apply_patches(module, finder.patches)

        spec.loader = _Loader()
        return spec


_installed = False


def install() -> None:
    """Idempotent: a process that finds this module twice (an older lab venv still loading it
    from its own site-packages) wraps SGLang's methods once."""
    global _installed
    if _installed:
        return
    _installed = True
    path = os.environ.get("PPSCOPE_LAB_FAULT_FILE")
    fixed = None if path else parse(os.environ["PPSCOPE_LAB_FAULT"])
    switch = _Switch(fixed, path)
    by_module: dict = {}
    for target, (module, cls, method) in TARGETS.items():
        if fixed is None or target == fixed[0]:
            by_module.setdefault(module, []).append(
                (cls, method, functools.partial(wrap, target, switch)))
    for module, patches in by_module.items():
        if module in sys.modules:
            apply_patches(sys.modules[module], patches)
        else:
            sys.meta_path.insert(0, PatchOnImport(module, patches))


def apply_patches(module, patches) -> None:
    for cls, method, make in patches:
        c = getattr(module, cls)
        setattr(c, method, make(getattr(c, method)))
