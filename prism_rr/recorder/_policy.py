"""The recording policy and the recording observer of an InterceptGroup.

The policy forwards every call unchanged to the real backend (gloo, NCCL). The observer
records it through the recording's call path (`_calls.CallRecorder`): a blocking call
whole (`blocking`); any other call entered, then its real Work returned completed (a
blocking collective of another policy) or wrapped in a `TimedWork` that completes the
call at wait() (or at the real future's callback, if sooner; gloo's send, recv and
reduce_scatter_tensor have no future). A replay that records itself (`replay -o`) runs
the replay policy with this observer. Outside the step window the observer is not
`live`, and the group forwards a call without building one (InterceptGroup._collective).
"""

from __future__ import annotations

from datetime import timedelta

from prism_rr.intercept.dispatch import aside
from prism_rr.intercept.group import ForwardingWork, Policy

__all__ = ["RecordingObserver", "RecordingPolicy", "TimedWork"]


class RecordingPolicy(Policy):
    """Forward to the real backend. What it allocates on this thread (gloo's staging
    buffers) is the backend's, not the program's: the memory tracker and per-operator
    records look away, as the replayer's do from its own work."""

    def __init__(self, rec):
        self.rec = rec

    def forward(self, fn, args):
        return aside(self.rec.calls.ops_mode, fn, *args)

    def shutdown(self, group) -> None:
        device = self.rec.device_times
        if device is not None:  # what has resolved, then no Work kept past its group
            device.resolve()
            device.release()
        super().shutdown(group)


class RecordingObserver:
    """Records the calls of a group into `rec` (a Recording)."""

    def __init__(self, rec):
        self.rec = rec
        self.calls = rec.calls
        self._futureless: set[tuple[int, str]] = set()  # (group, op) whose Works have no future
        # A blocking call of the recording policy (which forwards), whole. A replay that
        # records itself runs its own policy: no.
        self.blocking = rec.calls.blocking
        # ... and a blocking collective's Call made in C too, where the speedups were built
        self.collective = getattr(rec.calls, "fast_collective", None)

    @property
    def live(self) -> bool:
        return self.rec.active

    def enter(self, call) -> bool:
        if not self.rec.active:
            return False
        # frames: caller_stack, CallRecorder.enter, this, the group's _run, its method
        return self.calls.enter(call, 4)

    def failed(self, call, exc: BaseException) -> None:
        self.calls.complete(call, exc)

    def track(self, call, work, group):
        calls = self.calls
        calls.issued(call)
        device = calls.device
        if work is None:
            # No Work: NCCL returns none for a blocking call (asyncOp false: it runs in
            # order on the program's stream, seen on torch 2.11 with an H200), nor inside a
            # coalescing block; torch's all_reduce and the others accept that. The call is
            # done as far as the program's CPU thread can tell: its time is the launch's.
            if device is not None:
                device.call_waited(call)  # on the stream, after the call: its end there
            calls.complete(call)
            calls.settle(call)
            return None
        if device is not None:
            device.keep_work(call, work)
        if call.p2p and call.peer is None:  # a receive from any source: its sender comes at wait()
            return TimedWork(work, calls, call, sourced=group.sourced)
        if not call.async_op and not call.p2p:
            # torch's blocking collectives (async_op=False) call wait() as soon as the call
            # returns: wait here, and hand back the real Work, completed. Not a
            # point-to-point call: gloo's send and recv Works wait for another message at
            # each wait().
            _finish(work, calls, call, timedelta(0))
            return work
        if not call.async_op:  # torch's blocking send or recv: its wait() comes next
            return TimedWork(work, calls, call)
        fut = None
        kind = (call.gid, call.op)
        if kind not in self._futureless:
            try:
                fut = work.get_future()
            except RuntimeError:  # gloo's send, recv, reduce_scatter_tensor: an exception
                self._futureless.add(kind)  # from C++ costs ~20 us; ask once per group and op
        if fut is not None:
            call.future = fut  # a reap completes it if no wait() comes first
            fut.add_done_callback(lambda f: _done(calls, call, f))
        return TimedWork(work, calls, call)

    def group_created(self, gid: int, ranks, name: str, desc: str, backend: str) -> None:
        self.rec.group_created(gid, ranks, name, desc, backend)


class TimedWork(ForwardingWork):
    """The real Work, completing the call at wait() (or at its future's callback, if sooner).

    A future callback needs the GIL, which a busy main thread holds for up to the
    switch interval (5 ms), so a blocking call's completion is taken where wait()
    returns; an async call's at whichever comes first. Either way the outputs are read
    here, where the program's wait() returns and they are alive and final (a callback
    reads none)."""

    def __init__(self, inner, calls, call, sourced=None):
        super().__init__(inner)
        self._calls = calls
        self._call = call
        self._sourced = sourced  # group rank of the sender -> (global peer, seq)

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        return _finish(self._inner, self._calls, self._call, timeout, self._sourced)


def _finish(work, calls, call, timeout: timedelta, sourced=None) -> bool:
    """work.wait(timeout), then the call completed, its outputs read where the program's
    wait returns."""
    device = calls.device
    if device is not None:
        device.call_waiting(call)
    try:
        ok = work.wait(timeout)
    except BaseException as exc:
        calls.complete(call, exc)
        raise
    if device is not None:
        device.call_waited(call)  # NCCL's wait() made the stream wait for the call: past it now
    if not call.done:
        peer = None
        if sourced is not None:
            try:
                peer, call.seq = sourced(work._source_rank())
            except Exception:
                peer = None
        calls.complete(call, None, peer)
    elif call.out_later:
        calls.write_outputs(call)
    calls.settle(call)
    return ok


def _done(calls, call, fut) -> None:
    """A backend thread's future callback: note when, read no tensor (see complete)."""
    error = None
    try:
        fut.value()
    except BaseException as exc:  # the call failed: still record when
        error = exc
    calls.complete(call, error, backend=True)
