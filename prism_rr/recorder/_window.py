"""The step window of a recording (`--steps A:B`) and the memory it reads.

A step ends where the program's optimizer steps (or `prism_rr.step()`): the window's
records of it (the compute gap before the boundary, the Step with its peak memory) are
written, and the next step starts. Outside the window no call is recorded; entering it
starts the per-operator mode (`--ops`, the CPU memory tracker), leaving it stops it.
"""

from __future__ import annotations

from time import monotonic_ns

import torch

from prism_rr.format.records import Compute, Marker, Step
from prism_rr.intercept import dispatch
from prism_rr.intercept.memory import cuda_step_peak

__all__ = ["MemoryReadings", "StepWindow"]


class MemoryReadings:
    """Allocated and peak bytes as a recording reads them: the CUDA allocator's
    statistics on a GPU, a CpuMemoryTracker's counts on CPU (`--memory`), else none."""

    def __init__(self, cuda: bool = False, cpu_tracker=None):
        self.cuda = cuda
        self.cpu = cpu_tracker

    @property
    def reads(self) -> bool:
        return self.cuda or self.cpu is not None

    def now(self) -> tuple[int | None, int | None]:
        if self.cuda:
            return int(torch.cuda.memory_allocated()), int(torch.cuda.max_memory_allocated())
        if self.cpu is not None:
            return self.cpu.allocated, self.cpu.peak
        return None, None

    def step_peak(self) -> int | None:
        if self.cuda:
            return cuda_step_peak()
        if self.cpu is not None:
            return self.cpu.take_peak()
        return None

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()


class StepWindow:
    """Steps and the window of a Recording `rec` (its calls' step and last return live in
    `rec.calls`, which every call reads)."""

    def __init__(self, rec):
        self.rec = rec
        self.options = rec.options
        self.start_ns = monotonic_ns()  # of the current step
        self.ops_mode = None

    def begin(self) -> None:
        """The window opens (at the start, or at its first step)."""
        rec = self.rec
        t = monotonic_ns()
        rec.calls.last_return = t
        rec.write(Marker(start_ns=t, end_ns=t, step=rec.calls.step, name="window_start"))
        device = rec.device_times
        if device is not None:
            device.step_started(rec.calls.step, self.start_ns)
        rec.memory.reset()
        if self.options.ops or rec.memory.cpu is not None:
            self.ops_mode = dispatch.start(rec.memory.cpu, rec.operator_ran if self.options.ops else None, rec.fail)
            rec.calls.ops_mode = self.ops_mode

    def stop_modes(self) -> None:
        if self.ops_mode is not None:
            mode, self.ops_mode = self.ops_mode, None
            self.rec.calls.ops_mode = None
            try:
                mode.stop()
            except BaseException:
                pass

    def boundary(self) -> None:
        """A step boundary: write the step's records if it was in the window; the next
        step starts now (and the window may open or close)."""
        rec = self.rec
        calls = rec.calls
        t = monotonic_ns()
        step = calls.step
        if rec.active:
            device = rec.device_times
            if device is not None:
                device.step_ended(step, t)
            last = calls.last_return
            if last is not None and t > last:
                rec.write(Compute(start_ns=last, end_ns=t, step=step))
            rec.write(Step(start_ns=self.start_ns, end_ns=t, step=step, mem_peak=rec.memory.step_peak()))
            if rec.flight is not None:
                rec.flight.step_ended(step, t - self.start_ns)
        calls.step = step + 1
        self.start_ns = t
        calls.last_return = t
        was = rec.active
        rec.active = self.options.in_window(step + 1)
        device = rec.device_times
        if rec.active and not was:
            self.begin()
        elif was and not rec.active:
            self.stop_modes()
            rec.write(Marker(start_ns=t, end_ns=t, step=step + 1, name="window_end"))
        elif rec.active and device is not None:
            device.step_started(step + 1, t)
        rec.read_device()  # what the device has passed by now: a step or so back
