"""CPU memory: live tensor storages as seen by a dispatch mode, with per-step peaks.

A storage is counted from the first operator that produces or reads it until it is
freed (a weakref finalizer on the storage, whose Python object torch keeps alive as
long as the storage lives). Storages no operator touched inside the window are not seen.
"""

from __future__ import annotations

import threading
import weakref

import torch

__all__ = ["CpuMemoryTracker"]


class CpuMemoryTracker:
    def __init__(self):
        self.allocated = 0
        self.peak = 0  # since the recording started
        self._step_peak = 0
        self._live: dict[int, int] = {}  # id(storage) -> bytes
        self._lock = threading.Lock()

    def track(self, obj) -> None:
        if isinstance(obj, torch.Tensor):
            self._track_tensor(obj)
        elif isinstance(obj, (list, tuple)):
            for o in obj:
                if isinstance(o, (torch.Tensor, list, tuple)):
                    self.track(o)

    def _track_tensor(self, t: torch.Tensor) -> None:
        if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
            flatten = getattr(t, "__tensor_flatten__", None)
            if flatten is not None:
                names, _ = flatten()
                for n in names:
                    self.track(getattr(t, n))
                return
        if t.device.type != "cpu" or t.is_sparse:
            return
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        key = id(st)
        if key in self._live:
            return
        size = st.nbytes()
        with self._lock:
            self._live[key] = size
            self.allocated += size
            if self.allocated > self.peak:
                self.peak = self.allocated
            if self.allocated > self._step_peak:
                self._step_peak = self.allocated
        weakref.finalize(st, self._free, key)

    def _free(self, key: int) -> None:
        with self._lock:
            size = self._live.pop(key, 0)
            self.allocated -= size

    def take_peak(self) -> int:
        """The peak since the last call; the next period starts at what is live now."""
        with self._lock:
            peak, self._step_peak = self._step_peak, self.allocated
        return peak
