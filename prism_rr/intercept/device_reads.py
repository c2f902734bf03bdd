"""Tensors' digests and small bytes, read from a CUDA device without waiting for it.

A digest (intercept/payload.py) needs a few bytes of a tensor on the host: all of a small
tensor's, two int64 sums and the last few bytes of a larger one. Read at once, each is a
host synchronization: the host waits for the device to drain its queue. Here the device
takes the sums on the current stream (where the synchronous path takes them too) and
copies them, with the bytes, into pinned host memory without blocking, behind an event;
once the event has passed, the digests and bytes are made from the host copies, the same
values the synchronous path makes.

The recorder reads payloads this way (recorder/_later.py), and the replayer checks a
replayed call's inputs against the recorded digests this way (replayer/_policy.py).

`device` "cpu" runs the same path on CPU tensors (plain copies, complete at once): how the
tests on a machine without a GPU exercise everything but the stream; "cpu-late" the same,
each read passed only at its second query, as by a device one step behind the host.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import torch

from prism_rr.intercept import payload as _payload

__all__ = ["FINAL_WAIT_S", "DeviceReads", "Passing", "Read"]

FINAL_WAIT_S = 5.0  # what a final reading waits, at most, for the device to pass what is left

_BYTES, _SUMS = 0, 1


class Passing:
    """Device events read in order: passed(event) once the device has passed it; with
    `final`, waiting for it, FINAL_WAIT_S at most over all the events of one reading."""

    def __init__(self, final: bool):
        self.final = final
        self._deadline = None

    def passed(self, event) -> bool:
        while not event.query():
            if not self.final:
                return False
            if self._deadline is None:
                self._deadline = time.monotonic() + FINAL_WAIT_S
            if time.monotonic() > self._deadline:
                return False
            time.sleep(0.0005)
        return True


class Read:
    """What one `take` read, once the device has passed it: per tensor, its bytes (a small
    tensor, or every tensor of a `whole` take) or its digest's sums and last bytes."""

    __slots__ = ("key", "parts")

    def __init__(self, key, parts):
        self.key = key
        self.parts = parts

    def datas(self) -> list[bytes]:
        """Each tensor's bytes (a `whole` take's)."""
        return [bytes(p[1].numpy()) for p in self.parts]

    def digests(self) -> list[int]:
        """Each tensor's digest, as intercept/payload.digests makes it."""
        out = []
        for p in self.parts:
            if p[0] == _BYTES:
                data = bytes(p[1].numpy())
                if len(data) <= _payload._SMALL:
                    out.append(_payload._small_digest(data))
                else:  # a large tensor of a `whole` take: its digest from its bytes, as on the device
                    out.append(_payload._digest(torch.frombuffer(bytearray(data), dtype=torch.uint8)))
            else:
                s0, s1 = p[1].tolist()
                out.append(_payload.digest_of(s0, s1, p[3], b"" if p[2] is None else bytes(p[2].numpy())))
        return out


class DeviceReads:
    """Reads queued on a device's current stream and handed back, in order, once it has
    passed them (see the module's docstring)."""

    def __init__(self, device: str = "cuda"):
        self.device = device
        self._cuda = device == "cuda"
        self._late = device == "cpu-late"
        self._type = "cpu" if self._late else device  # the tensors' device type
        self._pending: deque = deque()  # (event or None, Read)
        self._lock = threading.Lock()  # a reading from another thread (a flight dump's watchdog)
        self.taken = 0  # reads taken (for tests and benches)

    def wanted(self, tensors) -> bool:
        """Whether these tensors can be read this way: all on this device, strided, and no
        CUDA graph being captured."""
        if not tensors:
            return False
        on = tensors[0].device
        if on.type != self._type:
            return False
        for t in tensors:
            if t.device != on or t.layout is not torch.strided:
                return False  # tensors of two devices: read at once
        if self._cuda:
            with torch.cuda.device(on):
                return not torch.cuda.is_current_stream_capturing()
        return True

    def take(self, key, tensors, whole: bool) -> None:
        """Queue the reading of `tensors` on their device's current stream (the current
        device's may be another: a program that never called set_device): every tensor's
        bytes with `whole`, else small tensors' bytes and larger ones' digest sums."""
        if self._cuda:
            with torch.cuda.device(tensors[0].device):
                return self._take(key, tensors, whole)
        return self._take(key, tensors, whole)

    def _take(self, key, tensors, whole: bool) -> None:
        parts = []
        for t in tensors:
            if whole or t.numel() * t.element_size() <= _payload._SMALL:
                parts.append((_BYTES, self._copy(_flat(t))))
            else:
                sums, tail = _payload.digest_parts(t)
                parts.append((_SUMS, self._copy(sums), None if tail is None else self._copy(tail),
                              t.numel() * t.element_size()))
        event = _Late() if self._late else None
        if self._cuda:
            event = torch.cuda.Event()
            event.record()
        with self._lock:
            self._pending.append((event, Read(key, parts)))
            self.taken += 1

    def _copy(self, src: torch.Tensor) -> torch.Tensor:
        if not self._cuda:
            return src.clone()
        host = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)  # torch's pinned cache
        host.copy_(src, non_blocking=True)
        # the source may be another stream's (FSDP2's all-gather outputs): its memory is not
        # handed out again before this stream has read it
        src.record_stream(torch.cuda.current_stream())
        return host

    def drain(self, each, final: bool = False) -> int | None:
        """each(read) for the reads the device has passed, in the order taken, under this
        reader's lock (so a final drain returns only once every read before it is handled);
        with `final`, waiting for the rest, up to FINAL_WAIT_S (a device stuck in a hung
        collective must not hang an exit: what it never passed stays). The number handled;
        not `final`, None where a drain is in progress on another thread or this one (a
        signal's stop may land on the thread that runs one)."""
        if not self._lock.acquire(blocking=final):
            return None
        n = 0
        pending = self._pending
        waiting = Passing(final)
        try:
            while pending:
                event, read = pending[0]
                if event is not None and not waiting.passed(event):
                    break
                pending.popleft()
                each(read)
                n += 1
        finally:
            self._lock.release()
        return n

    @property
    def pending(self) -> int:
        return len(self._pending)


class _Late:
    """An event a device one step behind the host passes: at the second query."""

    def __init__(self):
        self.asked = 0

    def query(self) -> bool:
        self.asked += 1
        return self.asked > 1


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes, as a flat uint8 tensor on its device (a view where it can be)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)
