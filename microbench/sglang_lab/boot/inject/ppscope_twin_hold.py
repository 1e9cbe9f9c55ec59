"""The twin's emulated device time, inside SGLang's own processes (loaded by `sitecustomize.py`
beside this file when `PPSCOPE_TWIN_COSTS` names a cost file). SGLang's loop runs as it is; only
waits are added, each a sleep (no CPU taken from the other ranks). Host work, on every rank's
CPU, as on the deployment:

- `Scheduler.get_next_batch_to_run` is followed by k x the deployment's host work of a visit
  (scheduling, and one gloo message of the request relay), the empty visit's when it has no batch;
- `Scheduler.process_batch_result` by k x the deployment's result processing;
- `ModelRunner.forward` takes k x the CPU launch cost of a forward.

Device time, two ways (the cost file's `mode`):

- `async` (a GPU deployment): each rank has an emulated device that runs its forwards one after
  another. A forward launched at t starts at max(t, the device's previous end, its hidden states'
  arrival, the previous hidden-state send's end) and lasts k x the stage time for that batch; the
  CPU goes on at once, as SGLang's does after launching on a GPU. The times travel with SGLang's
  own messages (a `__ppscope_ready__` entry in the tensor dicts it sends, SGLang 0.5.23
  managers/scheduler_pp_mixin.py `_pp_send_dict_to_next_stage`): hidden states are ready at the
  forward's end plus the hop, sampled tokens at the last rank's end plus a token hop per relay.
  The CPU waits only where SGLang's does on a GPU: before processing a slot's results
  (`d2h_event.synchronize()` in `event_loop_pp`), until those tokens are ready.
- `sync` (SGLang's CPU backend): `ModelRunner.forward` lasts k x the stage time from its start,
  and the hidden-state send is held k x the hop before it is posted.

Stage times: decode by micro-batch size (`forward_batch.batch_size`), prefill by its tokens
(`extend_num_tokens`) and sequences.

The cost file (written by `microbench/sglang_lab/twin.py` from the model's own figures) holds,
per rank: `decode_us` (index = micro-batch size), `prefill_tokens` / `prefill_us` (a table over
tokens, interpolated), `lm_head_seq_us`, and `host_us`, `empty_us`, `process_us`, `launch_us`;
`hop_us` (index = micro-batch size) and `k` (0: no emulated time, the calibration). The rank is SGLang's own (`pp_group.rank_in_group`).

With `PPSCOPE_TWIN_STATS` set, each rank counts its decode and prefill forwards in the `sync`
mode and those the hold lengthened (the real forward ended before the emulated time), with the
seconds held, and writes them to `<PPSCOPE_TWIN_STATS>.<rank>` (JSON, at most every 0.5 s): a
twin whose real forwards outlast the emulated times emulates nothing, and the counts say so.
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


READY = "__ppscope_ready__"
# one rank's emulated device: when it is free, when each slot's last forward ends, the slot being
# launched, its hidden states' arrival, and the end of the last hidden-state send
_DEV = {"free": 0.0, "end": {}, "cur": None, "in_ready": 0.0, "send_done": 0.0}


def _async():
    return _costs().get("mode", "sync") == "async"


def _ready_of(tensors):
    d = getattr(tensors, "tensors", tensors)
    v = d.get(READY) if hasattr(d, "get") else None
    return float(v) if isinstance(v, (int, float)) else None


def _sleep_until(t):
    left = t - time.monotonic()
    if left > 0:
        time.sleep(left)


def _hold(t0, us):
    """Until k x `us` after t0."""
    _sleep_until(t0 + _costs()["k"] * us / 1e6)


_STATS = {"forwards": 0, "held": 0, "held_s": 0.0, "written": 0.0}


def _count(rank, t_end):
    """One sync forward that should end at `t_end` (monotonic s): counted, held or not."""
    path = os.environ.get("PPSCOPE_TWIN_STATS")
    if not path:
        return
    st, now = _STATS, time.monotonic()
    st["forwards"] += 1
    if t_end > now:
        st["held"] += 1
        st["held_s"] += t_end - now
    if now - st["written"] > 0.5:
        st["written"] = now
        tmp = f"{path}.{rank}.tmp"
        with open(tmp, "w") as f:
            json.dump({k: v for k, v in st.items() if k != "written"}, f)
        os.replace(tmp, f"{path}.{rank}")


def _forward(fn):
    @functools.wraps(fn)
    def wrapped(self, forward_batch, *a, **k):
        t0 = time.monotonic()
        out = fn(self, forward_batch, *a, **k)
        rank = rank_of(self)
        if rank is None:
            return out
        if not _async():
            us = forward_us(rank, forward_batch)
            _count(rank, t0 + _costs()["k"] * us / 1e6)
            _hold(t0, us)
            return out
        c = _costs()
        launch = c["ranks"][rank]["launch_us"]
        _hold(t0, launch)                                   # the CPU's part: launching it
        dev = _DEV
        start = max(time.monotonic(), dev["free"], dev["in_ready"], dev["send_done"])
        dev["free"] = start + c["k"] * (forward_us(rank, forward_batch) - launch) / 1e6
        if dev["cur"] is not None:
            dev["end"][dev["cur"]] = dev["free"]
        return out
    return wrapped


def _launch(fn):
    """`_pp_launch_batch(mb_id, cur_batch, pp_proxy_tensors, ...)`: which slot is launched and
    when its hidden states arrive."""
    @functools.wraps(fn)
    def wrapped(self, mb_id, cur_batch, pp_proxy_tensors, *a, **k):
        _DEV["cur"] = mb_id
        _DEV["in_ready"] = _ready_of(pp_proxy_tensors) or 0.0
        return fn(self, mb_id, cur_batch, pp_proxy_tensors, *a, **k)
    return wrapped


def _prepare_outputs(fn):
    """The last rank's sampled tokens of the slot just launched: ready at its forward's end."""
    @functools.wraps(fn)
    def wrapped(self, *a, **k):
        d = fn(self, *a, **k)
        if _async() and isinstance(d, dict):
            d[READY] = _DEV["end"].get(_DEV["cur"], time.monotonic())
        return d
    return wrapped


def _results(fn):
    """`_pp_commit_send_output_work_and_preprocess_output_tensors(next_first_rank_mb_id,
    next_mb_id)`: SGLang then syncs on the next slot's outputs when that slot has a batch."""
    @functools.wraps(fn)
    def wrapped(self, next_first_rank_mb_id, next_mb_id, *a, **k):
        out = fn(self, next_first_rank_mb_id, next_mb_id, *a, **k)
        if _async() and self.mbs[next_mb_id] is not None:
            ready = _ready_of(out[0]) if out and out[0] is not None else None
            if ready is None:
                ready = _DEV["end"].get(next_mb_id)
            if ready is not None:
                _sleep_until(ready)
        return out
    return wrapped


def _after(key_of):
    def make(fn):
        @functools.wraps(fn)
        def wrapped(self, *a, **k):
            out = fn(self, *a, **k)
            rank = rank_of(self)
            if rank is not None:
                _hold(time.monotonic(), key_of(_costs()["ranks"][rank], out))
            return out
        return wrapped
    return make


def _send(fn):
    @functools.wraps(fn)
    def wrapped(self, tensor_dict, *a, **k):
        kind = k.get("msg_type")
        if kind in ("proxy", "output") and rank_of(self) is not None and hasattr(tensor_dict, "get"):
            c = _costs()
            if kind == "proxy":
                h = tensor_dict.get("hidden_states")
                b = int(h.shape[0]) if h is not None and getattr(h, "ndim", 0) else 1
                hop = _row(c["hop_us"], max(1, b))
                if not _async():
                    _hold(time.monotonic(), hop)
                else:
                    ready = _DEV["end"].get(_DEV["cur"], time.monotonic()) + c["k"] * hop / 1e6
                    tensor_dict[READY] = ready
                    _DEV["send_done"] = ready
            elif _async() and _ready_of(tensor_dict) is not None:   # sampled tokens, one hop on
                tensor_dict[READY] = _ready_of(tensor_dict) + c["k"] * _row(c["hop_us"], 1) / 1e6
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
        ("Scheduler", "_pp_launch_batch", _launch),
        ("Scheduler", "_pp_prepare_tensor_dict", _prepare_outputs),
        ("Scheduler", "_pp_commit_send_output_work_and_preprocess_output_tensors", _results),
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
