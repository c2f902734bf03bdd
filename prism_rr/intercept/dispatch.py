"""The per-operator dispatch mode: feeds the CPU memory tracker and per-operator records.

Both sides run one while the program runs (the recorder with `--memory` or `--ops`, the
replayer where the recording tracked CPU memory); each looks away (`aside`) while it does
work of its own inside a call, which is not the program's.
"""

from __future__ import annotations

import threading
from time import monotonic_ns

from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

__all__ = ["OpsMode", "aside", "start"]


_VIEWS: dict = {}  # operator -> whether it returns views of its inputs (split, chunk, view, ...)


class OpsMode(TorchDispatchMode):
    """Counts every operator's tensors in `tracker` and tells `on_op(func, args, t0, t1)`;
    the first error turns it off and goes to `on_error`."""

    def __init__(self, tracker=None, on_op=None, on_error=None):
        super().__init__()
        self.tracker = tracker
        self.on_op = on_op
        self.on_error = on_error
        self.enabled = True
        # The program's thread. A backend's worker thread (gloo's) runs its work under the
        # thread-local state of the call that queued it, this mode included: what it does
        # there is the backend's, not the program's.
        self.owner = threading.get_ident()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.enabled or threading.get_ident() != self.owner:
            return func(*args, **(kwargs or {}))
        t0 = monotonic_ns()
        out = func(*args, **(kwargs or {}))
        t1 = monotonic_ns()
        try:
            tracker = self.tracker
            if tracker is not None:
                tracker.track(args)
                view = _VIEWS.get(func)
                if view is None:
                    view = _VIEWS[func] = bool(getattr(func, "is_view", False))
                if not view:  # a view's outputs share its inputs' storages, just counted
                    tracker.track(out)
            if self.on_op is not None:
                self.on_op(func, args, t0, t1)
        except BaseException as exc:
            self.enabled = False
            if self.on_error is not None:
                self.on_error(exc)
        return out

    def stop(self) -> None:
        self.enabled = False
        try:
            if _get_current_dispatch_mode() is self:
                self.__exit__(None, None, None)
        except Exception:
            pass


def start(tracker=None, on_op=None, on_error=None) -> OpsMode:
    mode = OpsMode(tracker, on_op, on_error)
    mode.__enter__()
    return mode


def aside(mode: OpsMode | None, fn, *args):
    """fn(*args) with `mode` looking away: the backend's or our own work, not the program's."""
    if mode is None or not mode.enabled:
        return fn(*args)
    mode.enabled = False
    try:
        return fn(*args)
    finally:
        mode.enabled = True
