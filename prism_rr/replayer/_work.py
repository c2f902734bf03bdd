"""The Work a replayed call with virtual members returns: done at a time on the model clock.

wait() sleeps on the calling thread until then (live timing) rather than on a future that
another thread completes: that thread would need the GIL, which a busy main thread holds
for up to the switch interval, and a wake-up on a loaded machine is late by milliseconds.
The future, when someone asks for it (DDP's comm hook, `then` chains), is completed by
the session's alarm thread at the same time, or by wait(), whichever comes first.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import torch
from torch._C._distributed_c10d import Work

__all__ = ["ReplayWork"]


class ReplayWork(Work):
    def __init__(self, session, done_ns: int, value, *, blocking: bool, inputs=None, ticket=None):
        super().__init__()
        self._ticket = ticket  # a wait the session's waiter queued (_device_wait), or None
        self._inputs = inputs  # a real backend's Work holds its inputs as long as it lives
        self._session = session
        self._done = done_ns  # on the model clock
        self._value = value
        self._blocking = blocking  # the caller waits at once: its wait is not compute
        self._fut = None
        self._fired = False
        self._waited = False
        self._lock = threading.Lock()

    def _fire(self) -> None:
        with self._lock:
            if self._fired:
                return
            self._fired = True
            fut = self._fut
        if fut is not None and self._ticket is not None:
            self._ticket.follow()  # what the future's user queues runs after the wait
        if fut is not None:
            fut.set_result(self._value)

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        if not self._waited:
            self._waited = True
            self._session.wait_until(self._done, blocking=self._blocking, ticket=self._ticket)
            self._session.touched(self._inputs, self._value)
        self._fire()
        return True

    def get_future(self):
        with self._lock:
            if self._fut is None:
                self._fut = torch.futures.Future()
                fired = self._fired
            else:
                return self._fut
        if fired:
            self._fut.set_result(self._value)
        else:
            self._session.fire_at(self._done, self._fire)
        return self._fut

    def is_completed(self) -> bool:
        return self._fired or self._session.passed(self._done)

    def is_success(self) -> bool:
        return self.is_completed()

    def exception(self):
        return None

    def result(self):
        self.wait()
        return self._value

    def synchronize(self):
        pass

    def block_current_stream(self):
        pass
