"""The twin's emulated device time, inside SGLang's own processes (loaded by `sitecustomize.py`
beside this file when `PPSCOPE_TWIN_COSTS` names a cost file). SGLang's loop runs as it is; only
waits are added, each a sleep (no CPU taken from the other ranks). Host work, on every rank's
CPU, as on the deployment:

- `Scheduler.get_next_batch_to_run` is followed by k x the deployment's host work of a visit
  (scheduling, and one gloo message of the request relay), the empty visit's when it has no batch;
- `Scheduler.process_batch_result` by k x the deployment's result processing;
- `ModelRunner.forward` takes k x the CPU launch cost of a forward.

Device time, two ways (the cost file's `mode`):

- `async` (a GPU deployment): each rank has an emulated device with SGLang's two streams of its
  default PP path (SGLang 0.5.23 managers/scheduler_pp_mixin.py, `SGLANG_PP_COMM_OVERLAP` off:
  every PP send and receive runs on the schedule stream, the scheduler's current stream). The
  times travel with SGLang's own messages (a `__ppscope_ready__` entry in the tensor dicts it
  sends, `_pp_send_dict_to_next_stage`), and each rank keeps when its schedule stream's queued
  work ends (`sched`), as torch's NCCL point-to-point ops order it:
  - a receive (`recv_tensor_dict`: `irecv` then `work.wait()`) holds the stream until the data
    has arrived: the hidden states of the slot being run (`_pp_recv_proxy_tensors`), the outputs
    of the next slot (`_pp_send_recv_and_preprocess_output_tensors`);
  - a send leaves once the stream's earlier work is done (the hidden states also wait for this
    forward's end, `ready_event=launch_event`; the last rank's held tokens for the end of the
    forward that made them, `q_event`) and arrives a hop later; the stream waits for it only
    when SGLang commits it (`_pp_commit_proxy_send_work`, and the output send's commit at the
    next exchange);
  - a forward (`_pp_wait_forward_dependencies`: the forward stream waits for the schedule
    stream) starts at max(its launch, the device's previous end, `sched`) and lasts k x the
    stage time for that batch; the CPU goes on at once, as SGLang's does after launching on a
    GPU;
  - the CPU waits where SGLang's does on a GPU: at `d2h_event.synchronize()` before processing
    the next slot's results (`event_loop_pp`), until the copy stream's event, recorded after the
    schedule stream's work at the outputs' receive (`copy_stream.wait_stream(schedule_stream)`),
    has passed. So it waits for those tokens, for the hidden states of the slot just run, and
    for this rank's previous forward, whose hidden-state send sits on the same stream; not for
    an output send queued after the receive (odd ranks receive first), so the last rank at
    depth 0 does not wait for the forward it just launched.
- `sync` (SGLang's CPU backend): `ModelRunner.forward` lasts k x the stage time from its start,
  and the hidden-state send is held k x the hop before it is posted.

Stage times: decode by micro-batch size (`forward_batch.batch_size`), prefill by its tokens
(`extend_num_tokens`) and sequences.

The cost file (reports/base/payloads/twin.py `TwinCosts`, written by its `write_costs` from the
model's own figures; this module runs inside SGLang's processes and reads it as JSON) holds,
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
# one rank's emulated device: when the forward stream is free, when each slot's last forward
# ends, the slot being launched, when the schedule stream's queued work ends, the hidden-state
# and output sends not yet committed (their arrival), and the next slot's device-to-host event
def _idle_device() -> dict:
    return {"free": 0.0, "end": {}, "cur": None, "sched": 0.0, "proxy_sent": None,
            "out_sent": None, "d2h": None, "received": False}


_DEV = _idle_device()


def reset_device():
    _DEV.update(_idle_device())


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
        start = max(time.monotonic(), dev["free"], dev["sched"])
        dev["free"] = start + c["k"] * (forward_us(rank, forward_batch) - launch) / 1e6
        if dev["cur"] is not None:
            dev["end"][dev["cur"]] = dev["free"]
        return out
    return wrapped


def _launch(fn):
    """`_pp_launch_batch(mb_id, cur_batch, ...)`: which slot is launched."""
    @functools.wraps(fn)
    def wrapped(self, mb_id, *a, **k):
        _DEV["cur"] = mb_id
        return fn(self, mb_id, *a, **k)
    return wrapped


def _recv_proxy(fn):
    """`_pp_recv_proxy_tensors()`: the hidden states' receive holds the schedule stream until
    they arrive."""
    @functools.wraps(fn)
    def wrapped(self, *a, **k):
        out = fn(self, *a, **k)
        if _async() and out is not None:
            ready = _ready_of(out)
            if ready is not None:
                _DEV["sched"] = max(_DEV["sched"], ready)
        return out
    return wrapped


def _commit_proxy(fn):
    """`_pp_commit_proxy_send_work()`: the schedule stream waits for the last hidden-state
    send."""
    @functools.wraps(fn)
    def wrapped(self, *a, **k):
        if _async() and _DEV["proxy_sent"] is not None:
            _DEV["sched"] = max(_DEV["sched"], _DEV["proxy_sent"])
            _DEV["proxy_sent"] = None
        return fn(self, *a, **k)
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
    next_mb_id)`: the last output send committed, then this iteration's send and, when the next
    slot has a batch, its outputs' receive, in SGLang's order by rank parity (even ranks send
    first, odd ranks receive first: `_pp_send_recv_and_preprocess_output_tensors`). The receive
    (`_recv_outputs`) records the device-to-host event; a receive whose outputs carry no time
    (SGLang skipped the output message) records it here, behind the stream's work."""
    @functools.wraps(fn)
    def wrapped(self, next_first_rank_mb_id, next_mb_id, *a, **k):
        dev = _DEV
        if _async() and dev["out_sent"] is not None:
            dev["sched"] = max(dev["sched"], dev["out_sent"])
            dev["out_sent"] = None
        dev["received"] = False
        out = fn(self, next_first_rank_mb_id, next_mb_id, *a, **k)
        if _async() and self.mbs[next_mb_id] is not None and not dev["received"]:
            dev["sched"] = max(dev["sched"], dev["end"].get(next_mb_id, 0.0))
            dev["d2h"] = dev["sched"]
        return out
    return wrapped


def _recv_outputs(fn):
    """`_pp_recv_dict_from_prev_stage()`: the next slot's outputs. Their receive holds the
    schedule stream until they arrive, and the device-to-host event is recorded right behind
    it (`copy_stream.wait_stream(schedule_stream)` in `_do_recv`), before anything queued later:
    on an odd rank, before this iteration's output send, which on the last rank at depth 0
    waits for the forward just launched (`q_event`)."""
    @functools.wraps(fn)
    def wrapped(self, *a, **k):
        out = fn(self, *a, **k)
        if _async():
            ready = _ready_of(out[0] if isinstance(out, tuple) and out else out)
            if ready is not None:
                dev = _DEV
                dev["sched"] = max(dev["sched"], ready)
                dev["d2h"] = dev["sched"]
                dev["received"] = True
        return out
    return wrapped


def _process(fn):
    """`_pp_process_batch_result(...)`: SGLang has just called `d2h_event.synchronize()`."""
    @functools.wraps(fn)
    def wrapped(self, *a, **k):
        if _async() and _DEV["d2h"] is not None:
            _sleep_until(_DEV["d2h"])
            _DEV["d2h"] = None
        return fn(self, *a, **k)
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
            dev, now = _DEV, time.monotonic()
            if kind == "proxy":
                h = tensor_dict.get("hidden_states")
                b = int(h.shape[0]) if h is not None and getattr(h, "ndim", 0) else 1
                hop = _row(c["hop_us"], max(1, b))
                if not _async():
                    _hold(now, hop)
                else:                               # behind this forward (`launch_event`)
                    dev["sched"] = max(dev["sched"], dev["end"].get(dev["cur"], now))
                    dev["proxy_sent"] = max(dev["sched"], now) + c["k"] * hop / 1e6
                    tensor_dict[READY] = dev["proxy_sent"]
            elif _async():                          # sampled tokens: the last rank's own
                made = _ready_of(tensor_dict)       # (`q_event`: their forward's end), or a relay
                if made is not None and rank_of(self) == len(c["ranks"]) - 1:
                    dev["sched"] = max(dev["sched"], made)
                dev["out_sent"] = max(dev["sched"], now) + c["k"] * _row(c["hop_us"], 1) / 1e6
                tensor_dict[READY] = dev["out_sent"]
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
        ("Scheduler", "_pp_recv_proxy_tensors", _recv_proxy),
        ("Scheduler", "_pp_commit_proxy_send_work", _commit_proxy),
        ("Scheduler", "_pp_process_batch_result", _process),
        ("Scheduler", "_pp_prepare_tensor_dict", _prepare_outputs),
        ("Scheduler", "_pp_commit_send_output_work_and_preprocess_output_tensors", _results),
        ("Scheduler", "_pp_recv_dict_from_prev_stage", _recv_outputs),
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
