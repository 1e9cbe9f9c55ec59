"""The twin's emulated device time, inside SGLang's own processes (loaded by `sitecustomize.py`
beside this file when `PPSCOPE_TWIN_COSTS` names a cost file). SGLang's loop runs as it is; only
these waits are added, each a sleep (no CPU taken from the other ranks):

- `ModelRunner.forward` lasts, from its start, k x the deployment's stage time for that batch:
  decode by micro-batch size (`forward_batch.batch_size`), prefill by its tokens
  (`extend_num_tokens`) and sequences, plus the CPU launch cost of a forward;
- `Scheduler.get_next_batch_to_run` is followed by k x the deployment's host work of a visit
  (scheduling, and one gloo message of the request relay), the empty visit's when it has no batch;
- `Scheduler.process_batch_result` by k x the deployment's result processing;
- the hidden-state send (`_pp_send_dict_to_next_stage`, `msg_type="proxy"`) is held k x the
  hop's cost before it is posted.

The cost file (written by `microbench/sglang_lab/twin.py` from the model's own figures) holds,
per rank: `decode_us` (index = micro-batch size), `prefill_tokens` / `prefill_us` (a table over
tokens, interpolated), `lm_head_seq_us`, and `host_us`, `empty_us`, `process_us`, `launch_us`;
`hop_us` (index = micro-batch size) and `k` (0: no emulated time, the calibration). The rank is SGLang's own (`pp_group.rank_in_group`).
"""
import bisect
import functools
import json
import os
import time

from ppscope_lab_faults import PatchOnImport, apply_patches, rank_of

_STATE = {"costs": None, "mtime": None, "checked": 0.0}


def _costs():
    """The cost file, re-read when it changes (checked at most every 0.5 s), so one running
    server goes from the calibration (k = 0) to the emulated deployment without a restart."""
    st = _STATE
    now = time.monotonic()
    if st["costs"] is None or now - st["checked"] > 0.5:
        st["checked"] = now
        path = os.environ["PPSCOPE_TWIN_COSTS"]
        mtime = os.stat(path).st_mtime_ns
        if mtime != st["mtime"]:
            with open(path) as f:
                st["costs"] = json.load(f)
            st["mtime"] = mtime
    return st["costs"]


def _row(table, b):
    """A cost by batch size; past the table's end, its last step continued linearly."""
    if b < len(table):
        return table[b]
    n = len(table) - 1
    return table[n] + (b - n) * max(0.0, table[n] - table[n - 1] if n > 1 else table[n])


def _interp(xs, ys, x):
    if x <= xs[0]:
        return ys[0] * x / xs[0]
    i = min(bisect.bisect_left(xs, x), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 != x0 else y1


def forward_us(rank, forward_batch):
    r = _costs()["ranks"][rank]
    mode = forward_batch.forward_mode
    n = int(getattr(forward_batch, "batch_size", 0) or 0)
    if mode.is_decode() or getattr(forward_batch, "extend_num_tokens", None) is None:
        us = _row(r["decode_us"], max(1, n))
    else:
        tokens = int(forward_batch.extend_num_tokens)
        us = _interp(r["prefill_tokens"], r["prefill_us"], tokens) + r["lm_head_seq_us"] * n
    return us + r["launch_us"]


def _hold(t0, us):
    left = t0 + _costs()["k"] * us / 1e6 - time.perf_counter()
    if left > 0:
        time.sleep(left)


def _forward(fn):
    @functools.wraps(fn)
    def wrapped(self, forward_batch, *a, **k):
        t0 = time.perf_counter()
        out = fn(self, forward_batch, *a, **k)
        rank = rank_of(self)
        if rank is not None:
            _hold(t0, forward_us(rank, forward_batch))
        return out
    return wrapped


def _after(key_of):
    def make(fn):
        @functools.wraps(fn)
        def wrapped(self, *a, **k):
            out = fn(self, *a, **k)
            rank = rank_of(self)
            if rank is not None:
                _hold(time.perf_counter(), key_of(_costs()["ranks"][rank], out))
            return out
        return wrapped
    return make


def _send(fn):
    @functools.wraps(fn)
    def wrapped(self, tensor_dict, *a, **k):
        if k.get("msg_type") == "proxy" and rank_of(self) is not None:
            h = tensor_dict.get("hidden_states") if hasattr(tensor_dict, "get") else None
            b = int(h.shape[0]) if h is not None and getattr(h, "ndim", 0) else 1
            _hold(time.perf_counter(), _row(_costs()["hop_us"], max(1, b)))
        return fn(self, tensor_dict, *a, **k)
    return wrapped


PATCHES = {
    "sglang.srt.model_executor.model_runner": [("ModelRunner", "forward", _forward)],
    "sglang.srt.managers.scheduler": [
        ("Scheduler", "get_next_batch_to_run", _after(
            lambda r, plan: r["host_us"] if getattr(plan, "batch_to_run", None) is not None
            else r["empty_us"])),
        ("Scheduler", "process_batch_result", _after(lambda r, _: r["process_us"])),
        ("Scheduler", "_pp_send_dict_to_next_stage", _send),
    ],
}

_installed = False


def install():
    global _installed
    if _installed:
        return
    _installed = True
    _costs()                        # a bad cost file fails at start-up, not mid-run
    import sys
    for module, patches in PATCHES.items():
        if module in sys.modules:
            apply_patches(sys.modules[module], patches)
        else:
            sys.meta_path.insert(0, PatchOnImport(module, patches))
