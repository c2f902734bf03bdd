"""CPU memory: live tensor storages as seen by a dispatch mode, with per-step peaks.

A storage is counted from the first operator that produces or reads it until it is
freed (a weakref finalizer on the storage, whose Python object torch keeps alive as
long as the storage lives). Storages no operator touched inside the window are not seen.

Frees made by another thread are placed where the program let go. A backend's worker
thread (gloo's) holds a collective's tensors until just after the call completes; when the
program has already dropped them, the last reference goes on that thread, and the
finalizer runs whenever the main thread next lets go of the GIL: milliseconds later, at a
moment that differs from run to run. Counting the storage until then would put a racy
buffer in the peak. So the tracker keeps the step's running totals, and a free from
another thread is applied from the program's last use of the storage (the last operator
that touched it, or the wait() that completed its collective: `touch`) onwards.
The step's peak is taken over the corrected totals. The same rule holds while
recording and while replaying, so the two count the same program the same way.
"""

from __future__ import annotations

import threading
import weakref

import torch

__all__ = ["CpuMemoryTracker", "CudaPeaks", "cuda_step_peak"]


class CpuMemoryTracker:
    def __init__(self):
        self.allocated = 0
        self.peak = 0  # since the step began (running, before late frees), as CUDA's max_memory_allocated
        self._live: dict[int, int] = {}  # id(storage) -> bytes
        self._touch: dict[int, int] = {}  # id(storage) -> event of the program's last use
        self._lock = threading.Lock()
        self._owner: int | None = None  # the program's thread: the first to track
        self._event = 0  # events so far (allocations and the owner's frees)
        self._first = 0  # the event the current step's trace starts at
        self._trace: list[int] = [0]  # allocated after each event of this step; [0]: at its start
        self._late: list[tuple[int, int, int]] = []  # (last use, event when freed, bytes)

    def track(self, obj) -> None:
        """Count the CPU storages of `obj` (a tensor, or lists and tuples of them) from
        now on; those already counted were in use until now."""
        live = self._live
        for st in _storages(obj):
            key = id(st)
            if key in live:
                self._touch[key] = self._event
                continue
            size = st.nbytes()
            if not size:  # nothing to count (FSDP2 pads a shard list with thousands of these)
                continue
            if self._owner is None:
                self._owner = threading.get_ident()
            with self._lock:
                self._live[key] = size
                self.allocated += size
                self._event += 1
                self._touch[key] = self._event
                self._trace.append(self.allocated)
                if self.allocated > self.peak:
                    self.peak = self.allocated
            weakref.finalize(st, self._free, key)

    def touch(self, *objs) -> None:
        """The program used these tensors until now (a wait() that completed their call).
        Only storages already counted are noted; ignored on any other thread."""
        if self._owner is not None and threading.get_ident() != self._owner:
            return
        for st in _storages(objs):
            key = id(st)
            if key in self._live:
                self._touch[key] = self._event

    def _free(self, key: int) -> None:
        with self._lock:
            size = self._live.pop(key, 0)
            used = self._touch.pop(key, self._event)
            self.allocated -= size
            if self._owner is None or threading.get_ident() == self._owner:
                self._event += 1
                self._trace.append(self.allocated)
            elif size:
                self._late.append((used, self._event, size))

    def take_peak(self) -> int:
        """The peak since the last call (frees by other threads placed at the program's
        last use); the next period starts at what is live now."""
        with self._lock:
            first, trace, late = self._first, self._trace, self._late
            n = len(trace)
            if late:
                # Event first + i holds trace[i]; a late free counts from event used + 1
                # through the event at which it came (later events already lack it).
                diff = [0] * (n + 1)
                for used, until, size in late:
                    lo = max(used + 1 - first, 0)
                    hi = min(until - first, n - 1)
                    if lo <= hi:
                        diff[lo] += size
                        diff[hi + 1] -= size
                peak, cut = 0, 0
                for i in range(n):
                    cut += diff[i]
                    v = trace[i] - cut
                    if v > peak:
                        peak = v
            else:
                peak = max(trace)
            self._event += 1  # the next period's start: after every use so far
            self._first = self._event
            self._trace = [self.allocated]
            self._late = []
            # the running peak the records carry starts again from what is live, as the
            # CUDA allocator's does at a step (cuda_step_peak's reset)
            self.peak = self.allocated
        return peak


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _storages(obj, out: list | None = None) -> list:
    """The untyped storages of the dense CPU tensors in `obj` (a tensor, or lists and
    tuples of them; tensor subclasses such as DTensor through their inner tensors).

    Called on every operator's arguments and results: plain tensors take the short way."""
    if out is None:
        out = []
    kind = type(obj)
    if kind is list or kind is tuple or (kind not in _PLAIN and isinstance(obj, (list, tuple))):
        for o in obj:
            k = type(o)
            if k in _PLAIN:
                if o.is_cpu and not o.is_sparse:
                    try:
                        out.append(o.untyped_storage())
                    except (RuntimeError, NotImplementedError):
                        pass
            elif k is list or k is tuple or isinstance(o, (list, tuple, torch.Tensor)):  # return_types too
                _storages(o, out)
        return out
    if not isinstance(obj, torch.Tensor):
        return out
    if kind not in _PLAIN:
        flatten = getattr(obj, "__tensor_flatten__", None)
        if flatten is not None:
            names, _ = flatten()
            for n in names:
                _storages(getattr(obj, n), out)
            return out
    if obj.is_cpu and not obj.is_sparse:
        try:
            out.append(obj.untyped_storage())
        except (RuntimeError, NotImplementedError):
            pass
    return out


def cuda_step_peak() -> int:
    """The CUDA allocator's peak since the last call (or reset), which starts the next period:
    how the recorder and the replayer both read a step's peak."""
    peak = int(torch.cuda.max_memory_allocated())
    torch.cuda.reset_peak_memory_stats()
    return peak


class CudaPeaks:
    """CUDA memory: the caching allocator's peak per step, read as the recorder reads it
    (max_memory_allocated, then a reset), so a replay on a GPU compares like with like.

    The first period starts here if CUDA is already in use, else at the process's first
    allocation: nothing here makes a CUDA context on a device the program did not choose."""

    def __init__(self):
        if torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()

    def take_peak(self) -> int:
        return cuda_step_peak()

    def touch(self, *objs) -> None:
        pass  # the allocator knows when memory is freed
