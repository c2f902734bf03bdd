"""A recording's device times: marks at its steps and calls, written as DeviceTime records
once the device has passed them (FORMAT.md, "Device time").

    step_started / step_ended   a step's boundaries (the step window, _window.py)
    call_issued                 before the backend is entered (CallRecorder.enter)
    call_waiting / call_waited  around the program's wait for a call, or after a blocking
                                call that returns no Work (NCCL's, run on the stream)
    keep_work                   the real Work, for the backend's own timing (NCCL)
    resolve                     at each step boundary, a flight dump, the recording's stop
                                (final at a clean one): what the clock has resolved, as
                                records into the call log

A step's record is written once both its marks are resolved; a call's once its marks are
resolved and it is complete. A wait that comes after that (an async call whose future
completed it before the program's wait()) is written as a second record of the same
call. A failure here turns device time off, never the recording.
"""

from __future__ import annotations

import logging
import threading
from time import monotonic_ns

from prism_rr.format.records import DeviceTime
from prism_rr.recorder._device import NOT_YET, collective_duration_ns

__all__ = ["DeviceTimes"]

log = logging.getLogger("prism_rr.recorder")

STEP, CALL = "step", "call"
START, END = "start", "end"
ISSUE, WAIT, DONE = "issue", "wait", "done"


class _Marked:
    """A step or a call with marks on the device: how many are unresolved, their device
    times, and the host times its record carries."""

    __slots__ = ("call", "step", "start_ns", "last_ns", "ended", "marks", "dev", "work")

    def __init__(self, call, step: int, start_ns: int):
        self.call = call  # None for a step
        self.step = step
        self.start_ns = start_ns
        self.last_ns = start_ns
        self.ended = False  # a step: its end is marked
        self.marks = 0
        self.dev: dict[str, int] = {}
        self.work = None


class DeviceTimes:
    """The device times of a Recording `rec` on `clock` (recorder/_device.py).
    `durations`: keep each call's real Work until it resolves, for the backend's timing
    (NCCL's start and end events); given up at the first Work without it."""

    def __init__(self, rec, clock, *, durations: bool = False):
        self.rec = rec
        self.clock = clock
        self.durations = durations
        self._durations_seen = False  # a Work gave its duration once: keep asking
        self._lock = threading.RLock()  # a signal handler on the program's thread may resolve
        self._steps: dict[int, _Marked] = {}
        self._calls: dict[int, _Marked] = {}  # call id (CallRecorder's cid) -> its marks
        self._epoch_said = False

    # --- marks ------------------------------------------------------------------------

    def step_started(self, step: int, t: int) -> None:
        try:
            with self._lock:
                m = self._steps[step] = _Marked(None, step, t)
                m.marks += 1
                self.clock.mark((STEP, step, START))
        except BaseException as exc:
            self.fail(exc)

    def step_ended(self, step: int, t: int) -> None:
        try:
            with self._lock:
                m = self._steps.get(step)
                if m is None:
                    m = self._steps[step] = _Marked(None, step, t)
                m.last_ns = t
                m.ended = True
                m.marks += 1
                self.clock.mark((STEP, step, END))
        except BaseException as exc:
            self.fail(exc)

    def call_issued(self, call) -> None:
        """Before the backend is entered (after the call's ENTER is in the log)."""
        if call.cid < 0:
            return
        try:
            with self._lock:
                m = self._calls[call.cid] = _Marked(call, call.step, call.start)
                m.marks += 1
                self.clock.mark((CALL, call.cid, ISSUE))
        except BaseException as exc:
            self.fail(exc)

    def call_waiting(self, call) -> None:
        self._call_mark(call, WAIT)

    def call_waited(self, call) -> None:
        self._call_mark(call, DONE)

    def _call_mark(self, call, what: str) -> None:
        cid = call.cid
        if cid < 0:
            return
        try:
            with self._lock:
                m = self._calls.get(cid)
                if m is None:  # its record is written: this wait makes a second one
                    m = self._calls[cid] = _Marked(call, call.step, call.start)
                m.last_ns = monotonic_ns()
                m.marks += 1
                self.clock.mark((CALL, cid, what))
        except BaseException as exc:
            self.fail(exc)

    def keep_work(self, call, work) -> None:
        """The call's real Work, asked for its backend's timing when the call resolves."""
        if not self.durations or work is None or call.cid < 0:
            return
        with self._lock:
            m = self._calls.get(call.cid)
            if m is not None:
                m.work = work

    # --- resolution ---------------------------------------------------------------------

    def resolve(self, final: bool = False) -> None:
        """Write what the device has passed as DeviceTime records; with `final`, wait
        (bounded) for the rest and write everything, resolved or not."""
        try:
            with self._lock:
                records = self._resolved(final)
            write = self.rec.write
            for r in records:
                write(r)
        except BaseException as exc:
            self.fail(exc)

    def _resolved(self, final: bool) -> list[DeviceTime]:
        for (kind, ident, what), ns in self.clock.resolve(final):
            m = (self._steps if kind == STEP else self._calls).get(ident)
            if m is not None:
                if ns is not None:  # None: a mark the clock could not make
                    m.dev[what] = ns
                m.marks -= 1
        if not self._epoch_said and self.clock.epoch is not None:
            self._epoch_said = True
            self.rec.add_info({"device_time": self.clock.epoch})
        out = []
        for step, m in list(self._steps.items()):
            if final or (m.ended and not m.marks):
                del self._steps[step]
                out.append(DeviceTime(start_ns=m.start_ns, end_ns=m.last_ns, step=step, name=STEP,
                                      dev_start_ns=m.dev.get(START), dev_end_ns=m.dev.get(END)))
        for cid, m in list(self._calls.items()):
            call = m.call
            if not final and (m.marks or not call.done):
                continue
            duration = None
            if m.work is not None:
                duration = collective_duration_ns(m.work)
                if duration is NOT_YET:
                    if not final:
                        continue
                    duration = None
                elif duration is None and not self._durations_seen:
                    self.durations = False  # this backend, or this run, has no such timing
                else:
                    self._durations_seen = True
                m.work = None
            del self._calls[cid]
            out.append(DeviceTime(start_ns=m.start_ns, end_ns=m.last_ns, step=m.step, name=CALL, op=call.op,
                                  group=call.gid, seq=call.seq, peer=call.peer if call.p2p else None,
                                  dev_start_ns=m.dev.get(ISSUE), dev_end_ns=m.dev.get(DONE),
                                  dev_wait_ns=m.dev.get(WAIT), dev_duration_ns=duration))
        return out

    def release(self) -> None:
        """Let go of every Work held (a group's end: a Work kept past it must not keep its
        backend); their durations are lost."""
        with self._lock:
            for m in self._calls.values():
                m.work = None

    def fail(self, exc: BaseException) -> None:
        """Device time stops here (said once); the recording goes on without it."""
        rec = self.rec
        if rec.device_times is not self:
            return
        rec.device_times = None
        rec.calls.device = None
        log.warning("prism-rr: device time is off on rank %d from step %d: %s: %s", rec.rank, rec.step,
                    type(exc).__name__, exc)
        try:
            rec.marker("device_time_failed", text=f"{type(exc).__name__}: {exc}"[:500])
        except BaseException:
            pass
