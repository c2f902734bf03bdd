"""Device clocks: marks on the program's stream, read back as device times in batches.

A clock `mark(key)`s a moment of the program's work as the device will reach it (an event
on the current stream), and `resolve()` later gives the marks the device has passed, in
the order they were made, each as ns from the clock's epoch (a mark recorded when the
clock began, at host monotonic time `epoch_host_ns`). Resolving never waits for the
device, except `resolve(final=True)` at the end of a recording, which waits for the
marks left (a bounded while: a device stuck in a collective never holds the exit).

    CudaClock       CUDA events on the current stream (issue 27: on a GPU, time is the
                    device's)
    HostEventClock  a stand-in with the same behaviour whose "device" time is the host's
                    at the mark, resolved a round late as a device that runs behind the
                    host would be: PRISM_RR_DEVICE_CLOCK=host selects it on any device,
                    and tests on CPU exercise the whole path with it

`clock_for(device)` picks one; on CPU, without the variable, none: a recording then does
nothing more per call than test that it has no clock.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from time import monotonic_ns

import torch

from prism_rr.intercept.device_reads import Passing

__all__ = ["ENV_VAR", "CudaClock", "DeviceClock", "HostEventClock", "NOT_YET", "clock_for",
           "collective_duration_ns"]

ENV_VAR = "PRISM_RR_DEVICE_CLOCK"  # "host": HostEventClock; "off": none, even on CUDA
NOT_YET = object()  # collective_duration_ns: the backend's end event is not reached yet


class DeviceClock:
    """Marks on the program's stream, resolved to device times in batches.

    `mark` may be called from any thread (a backward pass's, a wait() from C++);
    `resolve` from one thread at a time (the recording's device times hold a lock)."""

    name = "device"  # what the rank info and `prism-rr info` call it
    epoch_host_ns: int | None = None  # host monotonic time at the epoch mark (None: not begun)
    device: str | None = None

    def mark(self, key) -> None:
        raise NotImplementedError

    def resolve(self, final: bool = False) -> list[tuple[object, int | None]]:
        """[(key, ns from the epoch)] of the marks the device has passed, oldest first;
        with `final`, every mark left that the device reaches within
        device_reads.FINAL_WAIT_S. A mark the clock could not make (before a CudaClock
        began, in a CUDA graph's capture) comes in its place as None."""
        raise NotImplementedError

    @property
    def epoch(self) -> dict | None:
        """What the rank info says of the clock (`device_time`), once it has begun."""
        if self.epoch_host_ns is None:
            return None
        return {"clock": self.name, "epoch_host_ns": self.epoch_host_ns, "device": self.device}


class HostEventClock(DeviceClock):
    """The host's monotonic clock at each mark, given out only at a resolve `lag` resolves
    after the mark was made (0: the next one): the plumbing of device time without a
    device, its batches as late as a device one step behind the host would make them."""

    name = "host-events"

    def __init__(self, lag: int = 1):
        self.lag = lag
        self.epoch_host_ns = monotonic_ns()
        self.device = "host"
        self._marks: deque = deque()  # (key, host ns, resolves before it)
        self._resolves = 0

    def mark(self, key) -> None:
        self._marks.append((key, monotonic_ns(), self._resolves))

    def resolve(self, final: bool = False) -> list[tuple[object, int]]:
        self._resolves += 1
        done = self._resolves - self.lag
        marks, epoch = self._marks, self.epoch_host_ns
        out = []
        while marks and (final or marks[0][2] < done):
            key, t, _ = marks.popleft()
            out.append((key, t - epoch))
        return out


class CudaClock(DeviceClock):
    """CUDA events (timing enabled) recorded on the current stream of one device, taken
    from a pool and given back once read.

    The clock begins at its first mark made once the program has initialised CUDA (a
    mark before resolves as None): by then the program has chosen its device, which it often
    does after `init_process_group`, when the recording begins. Events are read with
    `query()` (no synchronization) in the order they were made. A device time is the
    time from a reference event whose device time is known (the epoch, then the last
    event read): `elapsed_time` is a float32 of milliseconds, exact to a fraction of a
    microsecond between two marks, not over the hours since the epoch."""

    name = "cuda-events"

    def __init__(self, device=None):
        self._cuda = torch.cuda
        self._asked = None if device is None or getattr(device, "index", None) is None else device.index
        self._index: int | None = None
        self._pending: deque = deque()  # (key, event), in the order recorded
        self._pool: list = []
        self._ref = None  # the event device times are read from, and its device time
        self._ref_ns = 0
        self._begin_lock = threading.Lock()

    def _begin(self) -> bool:
        cuda = self._cuda
        if not cuda.is_initialized():
            return False
        with self._begin_lock:
            if self._ref is None:
                index = cuda.current_device() if self._asked is None else self._asked
                epoch = cuda.Event(enable_timing=True)
                epoch.record(cuda.current_stream(index))
                self.epoch_host_ns = monotonic_ns()
                self._index = index
                self.device = f"cuda:{index}"
                self._ref, self._ref_ns = epoch, 0
        return True

    def mark(self, key) -> None:
        cuda = self._cuda
        if (self._ref is None and not self._begin()) or cuda.is_current_stream_capturing():
            # before the clock began, or in a CUDA graph being captured (an event there
            # would be the graph's): no time, said in its place
            self._pending.append((key, None))
            return
        try:
            event = self._pool.pop()
        except IndexError:
            event = cuda.Event(enable_timing=True)
        event.record(cuda.current_stream(self._index))
        self._pending.append((key, event))

    def resolve(self, final: bool = False) -> list[tuple[object, int]]:
        pending = self._pending
        out = []
        ref, ref_ns = self._ref, self._ref_ns
        waiting = Passing(final)
        while pending:
            key, event = pending[0]
            if event is None:
                pending.popleft()
                out.append((key, None))
                continue
            if not waiting.passed(event):
                break
            pending.popleft()
            ns = ref_ns + round(ref.elapsed_time(event) * 1e6)
            out.append((key, ns))
            self._pool.append(ref)  # each event read is the reference of the next
            ref, ref_ns = event, ns
        self._ref, self._ref_ns = ref, ref_ns
        return out


def clock_for(device) -> DeviceClock | None:
    """The clock of a recording on `device` (a torch.device, or "cuda", "cpu"): a
    CudaClock on CUDA, a HostEventClock where PRISM_RR_DEVICE_CLOCK=host, else None."""
    choice = os.environ.get(ENV_VAR, "").strip().lower()
    if choice in ("off", "none", "0"):
        return None
    if choice == "host":
        return HostEventClock()
    kind = device if isinstance(device, str) else getattr(device, "type", None)
    if kind is not None and str(kind).split(":")[0] == "cuda":
        if torch.cuda.is_available():
            return CudaClock(device if not isinstance(device, str) else None)
    return None


def collective_duration_ns(work):
    """A collective's own time on the device by its backend's timing (ns): NCCL's start
    and end events around its kernel, which torch keeps with TORCH_NCCL_ENABLE_TIMING=1
    or once the group's `_enable_collectives_timing()` ran (WorkNCCL.getDuration, in ms).
    NOT_YET before its end event is reached; None where there is no such figure (gloo's
    works raise, as does NCCL's without timing)."""
    try:
        ms = work._get_duration()
    except Exception as exc:  # RuntimeError, ValueError, or no such method
        return NOT_YET if "must be completed" in str(exc) else None
    if ms != ms or ms < 0:
        return None
    return round(ms * 1e6)
