"""Payloads read from a CUDA device without waiting for it (issue 27: no host
synchronization on the program's path).

Under `small` and `digest` a call's payload needs a few bytes of its tensors on the host:
the whole of a small call's, two int64 sums and the last few bytes of each larger tensor
(intercept/payload.py). Read at once, each is a synchronization: the host waits for the
device to drain its queue, at every call, for its inputs and again for its outputs. On an
H200 the DDP trainer's recorded step took 7.76 ms with digests against 5.97 ms without
(12 host syncs a step against 2), the recording slowed by its own reading.

Here they are read without waiting (intercept/device_reads.py: the sums taken on the call's
stream, copied with the bytes into pinned host memory behind an event). Once the event has
passed (polled at each call and step boundary and at a flight dump; waited for at the
recording's clean end, device_reads.FINAL_WAIT_S at most) the payload is made from the host
copies and written as an OUT entry: the call's ENTER said
E_IN_LATER, its DONE D_OUT_LATER (format/calllog.py). The payload's bytes are the
synchronous path's, so a bundle cannot tell which made them.
"""

from __future__ import annotations

from prism_rr.format.calllog import P_BYTES, P_DIGEST_BYTES, P_DIGESTS, payload_tail
from prism_rr.intercept import payload as _payload
from prism_rr.intercept.device_reads import DeviceReads

__all__ = ["DevicePayloads"]


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
        self._reads = DeviceReads(device)  # keys (call id, inputs?, what)
        self._pending = self._reads._pending  # what the call path tests for "anything to resolve"

    @property
    def taken(self) -> int:
        """Payloads taken this way (for tests and benches)."""
        return self._reads.taken

    def wanted(self, tensors) -> bool:
        """Whether `tensors`' payload is read later: all on this device, something of them
        to read (under `small`, a call of more than KEEP_SMALL bytes keeps nothing, read at
        once for free), and no CUDA graph being captured."""
        if self.mode == _payload.SMALL and not _payload.small(tensors):
            return False
        return self._reads.wanted(tensors)

    def take(self, cid: int, tensors, inputs: bool) -> None:
        """Queue the reading of call `cid`'s inputs (or outputs) on the tensors' device's
        current stream; its OUT entry is written once the device has passed it. On a
        failure an OUT without a payload is written at once (the call's record is made
        without it) and the error raised. A call the log dropped (cid -1) has nothing to
        read."""
        if cid < 0:
            return
        try:
            whole = _payload.small(tensors)  # a small call keeps its bytes (digest wanted() refused small's)
            what = P_BYTES | P_DIGEST_BYTES if whole else P_DIGESTS
            self._reads.take((cid, inputs, what), tensors, whole)
        except BaseException:
            self.log.out(cid, None, inputs=inputs)
            raise

    def resolve(self, final: bool = False) -> int:
        """Write the payloads the device has passed, in the order taken; with `final`, wait
        for the rest, up to FINAL_WAIT_S (what the device never passed stays unread, its
        calls' records without it). The number written; not `final`, 0 where a resolve is
        in progress (DeviceReads.drain)."""
        return self._reads.drain(self._write, final) or 0

    def _write(self, read) -> None:
        cid, inputs, what = read.key
        if what != P_DIGESTS:
            payload = payload_tail(len(read.parts), what, datas=read.datas())
        else:
            payload = payload_tail(len(read.parts), P_DIGESTS, digests=read.digests())
        self.log.out(cid, payload, inputs=inputs)

    @property
    def pending(self) -> int:
        return self._reads.pending
