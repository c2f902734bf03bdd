"""The recording policy and the recording observer of an InterceptGroup.

The policy forwards every call unchanged to the real backend (gloo, NCCL). The observer
records it: it notes the entry; a blocking collective it waits for at once and returns
completed; any other call's real Work it returns wrapped in a `TimedWork` that notes
completion at wait() (or at the real future's callback, if sooner; gloo's send, recv and
reduce_scatter_tensor have no future). A replay that records itself (`replay -o`)
runs the replay policy with this observer. Outside the step window the observer is not
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
        return aside(self.rec.ops_mode, fn, *args)


class RecordingObserver:
    """Records the calls of a group into `rec` (a Recording)."""

    def __init__(self, rec):
        self.rec = rec
        self._futureless: set[tuple[int, str]] = set()  # (group, op) whose Works have no future
        # A blocking collective of the recording policy (which forwards), whole: see
        # Recording.blocking. A replay that records itself runs its own policy: no.
        self.blocking = rec.blocking

    @property
    def live(self) -> bool:
        return self.rec.active

    def enter(self, call):
        rec = self.rec
        if not rec.active:
            return None
        return rec.enter(call.op, call.gid, call.seq, call.ins, call.outs, reduce_op=call.reduce_op,
                         root=call.root, peer=call.peer, tag=call.tag, async_op=call.async_op,
                         p2p=call.p2p, receives=call.receives)

    def failed(self, token, exc: BaseException) -> None:
        self.rec.complete(token, exc)

    def track(self, token, work, group):
        rec = self.rec
        rec.issued(token)
        if work is None:
            # No Work: NCCL returns none for a blocking call (asyncOp false: it runs in
            # order on the program's stream, seen on torch 2.11 with an H200), nor inside a
            # coalescing block; torch's all_reduce and the others accept that. The call is
            # done as far as the program's CPU thread can tell: its time is the launch's.
            rec.complete(token, None)
            rec.settle(token)
            return None
        if token.p2p and token.peer is None:  # a receive from any source: its sender comes at wait()
            return TimedWork(work, rec, token, sourced=group.sourced)
        if not token.async_op and not token.p2p:
            # torch's blocking collectives (async_op=False) call wait() as soon as the call
            # returns: wait here, and hand back the real Work, completed. No wrapper, no
            # future, no trip from C++ back into Python for wait(): a call costs the program
            # less. Not a point-to-point call: gloo's send and recv Works wait for another
            # message at each wait().
            _finish(work, rec, token, timedelta(0))
            return work
        if not token.async_op:  # torch's blocking send or recv: its wait() comes next
            return TimedWork(work, rec, token)
        fut = None
        kind = (token.group, token.op)
        if kind not in self._futureless:
            try:
                fut = work.get_future()
            except RuntimeError:  # gloo's send, recv, reduce_scatter_tensor: an exception
                self._futureless.add(kind)  # from C++ costs ~20 us; ask once per group and op
        if fut is not None:
            token.work = fut  # a reap completes it if no wait() comes first
            fut.add_done_callback(lambda f: _done(rec, token, f))
        return TimedWork(work, rec, token)

    def group_created(self, gid: int, ranks, name: str, desc: str, backend: str) -> None:
        self.rec.group_created(gid, ranks, name, desc, backend)


class TimedWork(ForwardingWork):
    """The real Work, noting completion at wait() (or at its future's callback, if sooner).

    A future callback needs the GIL, which a busy main thread holds for up to the
    switch interval (5 ms), so a blocking call's completion is taken where wait()
    returns; an async call's at whichever comes first. Either way the record, which
    reads the outputs, is written here, where the program's wait() returns and its
    outputs are alive and final (a callback only notes the time).
    """

    def __init__(self, inner, rec, call, sourced=None):
        super().__init__(inner)
        self._rec = rec
        self._call = call
        self._sourced = sourced  # group rank of the sender -> (global peer, seq)

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        return _finish(self._inner, self._rec, self._call, timeout, self._sourced)


def _finish(work, rec, call, timeout: timedelta, sourced=None) -> bool:
    """work.wait(timeout), then the call's record, written where the program's wait returns."""
    try:
        ok = work.wait(timeout)
    except BaseException as exc:
        rec.complete(call, exc)
        rec.write_finished(call)
        raise
    if not call.done:
        peer = None
        if sourced is not None:
            try:
                peer, call.seq = sourced(work._source_rank())
            except Exception:
                peer = None
        rec.complete(call, None, peer)
    elif not call.written:
        rec.write_finished(call)
    rec.settle(call)
    return ok


def _done(rec, call, fut) -> None:
    """A backend thread's future callback: note when, read no tensor (see complete)."""
    error = None
    try:
        fut.value()
    except BaseException as exc:  # the call failed: still record when
        error = exc
    rec.complete(call, error, backend=True)
