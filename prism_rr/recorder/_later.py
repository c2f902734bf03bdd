"""Payloads read from a CUDA device without waiting for it (issue 27: no host
synchronization on the program's path).

Under `small` and `digest` a call's payload needs a few bytes of its tensors on the host:
the whole of a small call's, two int64 sums and the last few bytes of each larger tensor
(intercept/payload.py). Read at once, each is a synchronization: the host waits for the
device to drain its queue, at every call, for its inputs and again for its outputs. On an
H200 the DDP trainer's recorded step took 7.76 ms with digests against 5.97 ms without
(12 host syncs a step against 2), the recording slowed by its own reading.

Here the device takes the sums on the call's stream (where the synchronous path takes them
too), and copies them with the bytes into pinned host memory without blocking, behind an
event. Once the event has passed (polled at each call and step boundary and at a flight
dump; waited for at the recording's clean end, _device.FINAL_WAIT_S at most) the payload
is made from the host copies and written as an OUT entry: the call's ENTER said
E_IN_LATER, its DONE D_OUT_LATER (format/calllog.py). The payload's bytes are the
synchronous path's, so a bundle cannot tell which made them.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

import torch

from prism_rr.format.blobs import KEEP_SMALL
from prism_rr.format.calllog import P_BYTES, P_DIGEST_BYTES, P_DIGESTS, payload_tail
from prism_rr.intercept import payload as _payload
from prism_rr.recorder._device import Passing

__all__ = ["DevicePayloads"]

log = logging.getLogger("prism_rr.recorder")

_BYTES, _SUMS = 0, 1


class DevicePayloads:
    """A recording's payloads of CUDA tensors, read later (see the module's docstring),
    into call log `log` under payload mode `mode` (intercept/payload's SMALL or DIGEST).
    `device`: the tensors' device type it takes ("cpu" only in tests of the entries it
    writes: there the copies are plain and complete at once)."""

    def __init__(self, log, mode: int, device: str = "cuda"):
        if mode not in (_payload.SMALL, _payload.DIGEST):
            raise ValueError(f"payload mode {mode} is read at once")
        self.log = log
        self.mode = mode
        self.device = device
        self._cuda = device == "cuda"
        # (event or None, call id, inputs?, what, parts): parts per tensor, (_BYTES, host
        # copy) or (_SUMS, host copy of the sums, host copy of the last bytes or None, nbytes)
        self._pending: deque = deque()
        self._lock = threading.Lock()  # a flight dump resolves from the watchdog's thread
        self.taken = 0  # payloads taken this way (for tests and benches)

    def wanted(self, tensors) -> bool:
        """Whether `tensors`' payload is read later: all on this device, something of them
        to read (under `small`, a call of more than KEEP_SMALL bytes keeps nothing, read at
        once for free), and no CUDA graph being captured."""
        if not tensors:
            return False
        total = 0
        on = tensors[0].device
        if on.type != self.device:
            return False
        for t in tensors:
            if t.device != on or t.layout is not torch.strided:
                return False  # tensors of two devices: read at once
            total += t.numel() * t.element_size()
        if self.mode == _payload.SMALL and total > KEEP_SMALL:
            return False
        if self._cuda:
            with torch.cuda.device(on):
                return not torch.cuda.is_current_stream_capturing()
        return True

    def take(self, cid: int, tensors, inputs: bool) -> None:
        """Queue the reading of call `cid`'s inputs (or outputs) on the tensors' device's
        current stream (the current device's may be another: a program that never called
        set_device); its OUT entry is written once the device has passed it. On a failure
        an OUT without a payload is written at once (the call's record is made without it)
        and the error raised. A call the log dropped (cid -1) has nothing to read."""
        if cid < 0:
            return
        if self._cuda:
            with torch.cuda.device(tensors[0].device):
                return self._take(cid, tensors, inputs)
        return self._take(cid, tensors, inputs)

    def _take(self, cid: int, tensors, inputs: bool) -> None:
        try:
            sizes = [t.numel() * t.element_size() for t in tensors]
            parts = []
            if sum(sizes) <= KEEP_SMALL:
                what = P_BYTES | P_DIGEST_BYTES
                parts = [(_BYTES, self._copy(_flat(t))) for t in tensors]
            else:  # digest (wanted() refused small's)
                what = P_DIGESTS
                for t, n in zip(tensors, sizes):
                    if n <= _payload._SMALL:
                        parts.append((_BYTES, self._copy(_flat(t))))
                    else:
                        sums, tail = _payload.digest_parts(t)
                        parts.append((_SUMS, self._copy(sums), None if tail is None else self._copy(tail), n))
            event = None
            if self._cuda:
                event = torch.cuda.Event()
                event.record()
            with self._lock:
                self._pending.append((event, cid, inputs, what, parts))
                self.taken += 1
        except BaseException:
            self.log.out(cid, None, inputs=inputs)
            raise

    def _copy(self, src: torch.Tensor) -> torch.Tensor:
        if not self._cuda:
            return src.clone()
        host = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)  # torch's pinned cache
        host.copy_(src, non_blocking=True)
        # the source may be another stream's (FSDP2's all-gather outputs): its memory is not
        # handed out again before this stream has read it
        src.record_stream(torch.cuda.current_stream())
        return host

    def resolve(self, final: bool = False) -> int:
        """Write the payloads the device has passed, in the order taken; with `final`, wait
        for the rest, up to FINAL_WAIT_S (a device stuck in a hung collective must not hang
        the exit: what it never passed stays unread, its calls' records without it). The
        number written. Not `final`, it gives way to a resolve in progress (a signal's stop
        may land on the thread that runs one)."""
        if not self._lock.acquire(blocking=final):
            return 0
        pending = self._pending
        n = 0
        waiting = Passing(final)
        try:
            while pending:
                event, cid, inputs, what, parts = pending[0]
                if event is not None and not waiting.passed(event):
                    break
                pending.popleft()
                self.log.out(cid, _made(what, parts), inputs=inputs)
                n += 1
        finally:
            self._lock.release()
        return n

    @property
    def pending(self) -> int:
        return len(self._pending)


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes, as a flat uint8 tensor on its device (a view where it can be)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _made(what: int, parts) -> bytes:
    """The payload part (intercept/payload.log_payload's bytes) from the host copies."""
    if what != P_DIGESTS:
        return payload_tail(len(parts), what, datas=[bytes(p[1].numpy()) for p in parts])
    digests = []
    for p in parts:
        if p[0] == _BYTES:
            digests.append(_payload._small_digest(bytes(p[1].numpy())))
        else:
            s0, s1 = p[1].tolist()
            digests.append(_payload.digest_of(s0, s1, p[3], b"" if p[2] is None else bytes(p[2].numpy())))
    return payload_tail(len(parts), P_DIGESTS, digests=digests)
