"""The device the PP-loop probe runs on: `cuda` (NCCL, CUDA streams and events) or `cpu` (gloo).

SGLang runs its PP loop on a CPU too (`--device cpu`: gloo between the ranks, the forward inside
`run_batch` on the host thread). The probe does the same with `ppscope dispatch --device cpu`
under `torchrun`, so its loop, its messages and its trace can be checked against SGLang's on a
machine without a GPU. The loop code is the same on both: it calls `api.Event`, `api.Stream`,
`api.stream(...)`, `api.synchronize()` where `api` is `torch.cuda` itself on a GPU and the host
stand-ins below on the CPU, where there is one thread and no stream: an event is the host time
at which it was recorded (the work before it has finished, since it ran on that thread) and
waiting on a stream or an event is nothing to do.
"""
from __future__ import annotations

import contextlib
import time


class HostEvent:
    """A CUDA event's interface on the host clock (perf_counter)."""

    def __init__(self, enable_timing: bool = False):
        self.t: float | None = None

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: "HostEvent") -> float:
        """Milliseconds from this event to `other`, as torch.cuda.Event.elapsed_time."""
        return (other.t - self.t) * 1e3


class HostStream:
    def wait_stream(self, other) -> None:
        pass

    def wait_event(self, ev) -> None:
        pass


class _Host:
    """The part of torch.cuda the loop uses, on the CPU."""
    Event = HostEvent
    Stream = HostStream
    is_host = True

    @staticmethod
    def current_stream(*a) -> HostStream:
        return HostStream()

    @staticmethod
    def stream(s) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    @staticmethod
    def synchronize(*a) -> None:
        pass


HOST = _Host()


def device_api(torch, dev):
    """`torch.cuda` on a CUDA device, the host stand-ins on the CPU."""
    return torch.cuda if dev.type == "cuda" else HOST


def is_host(api) -> bool:
    return getattr(api, "is_host", False)


def spin_us(us: float) -> None:
    """Keep the CPU busy for `us` microseconds (the CPU forward, an injected delay)."""
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass
