"""Per-operator Compute records and the CPU memory tracker, from one dispatch mode."""

from __future__ import annotations

import threading
from time import monotonic_ns

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from prism_rr.format.records import Compute

__all__ = ["start"]


def _shapes(args) -> tuple:
    return tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))


class _OpsMode(TorchDispatchMode):
    def __init__(self, rec):
        super().__init__()
        self.rec = rec
        self.per_op = rec.options.ops
        self.tracker = rec.cpu_memory
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
        rec = self.rec
        try:
            tracker = self.tracker
            if tracker is not None:
                tracker.track(args)
                tracker.track(out)
            if self.per_op and rec.active:
                alloc, peak = rec.memory() if tracker is not None or rec.cuda else (None, None)
                rec.writer.append(Compute(start_ns=t0, end_ns=t1, step=rec.step, name=func.__name__,
                                          shapes=_shapes(args), mem_alloc=alloc, mem_peak=peak))
        except BaseException as exc:
            self.enabled = False
            rec.fail(exc)
        return out

    def stop(self) -> None:
        self.enabled = False
        try:
            from torch.utils._python_dispatch import _get_current_dispatch_mode

            if _get_current_dispatch_mode() is self:
                self.__exit__(None, None, None)
        except Exception:
            pass


def start(rec) -> _OpsMode:
    mode = _OpsMode(rec)
    mode.__enter__()
    return mode
