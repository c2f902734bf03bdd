"""One rank's recording: its call log, its spool, and the off switch.

A Recording is made of small parts, each with one job:

    calls      the call path (CallRecorder, _calls.py): every call into the call log
    window     the steps and the step window (StepWindow, _window.py)
    device_times  steps and calls on the device's clock (DeviceTimes, _device_times.py),
               where there is one (CUDA, or PRISM_RR_DEVICE_CLOCK=host), else None
    memory     the memory it reads at each call and step (MemoryReadings)
    slicing    `--slice roles`: which ranks go on recording (Slicing, _slicing.py)
    flight     flight mode's triggers and dumps (Flight, _flight.py), or None
    compactor  the call log into the spool, off the program's path (format/compactor.py);
               none in flight mode, whose log is a ring a dump reads

Everything here runs inside a training rank. Any failure in the recorder logs one
warning and turns recording off; the training run goes on as if nothing were watching.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from pathlib import Path
from time import monotonic_ns

import torch

from prism_rr.format import codec
from prism_rr.format.blobs import BlobWriter
from prism_rr.format.calllog import CallLog, log_path
from prism_rr.format.compactor import Compactor
from prism_rr.format.names import claim_attempt
from prism_rr.format.records import Compute, GroupInfo, Marker, Memory
from prism_rr.format.spool import spool_path
from prism_rr.intercept import dispatch
from prism_rr.intercept.payload import DIGEST, SMALL
from prism_rr.intercept.steps import OptimizerSteps
from prism_rr.recorder import _exits, _manifest, _signals
from prism_rr.recorder._calls import CallRecorder
from prism_rr.recorder._device import clock_for
from prism_rr.recorder._device_times import DeviceTimes
from prism_rr.recorder._flight import Flight
from prism_rr.recorder._later import DevicePayloads
from prism_rr.recorder._options import RecordOptions
from prism_rr.recorder._slicing import Slicing
from prism_rr.recorder._window import MemoryReadings, StepWindow

__all__ = ["Recording", "current"]

log = logging.getLogger("prism_rr.recorder")

_current: Recording | None = None


def current() -> Recording | None:
    return _current


PERSIST_SIZE = 8 << 20  # a call log's persistent region: its dictionary, rank info, groups
MIN_SIZE = 64 << 10


def _restart_count() -> int | None:
    """TorchElastic's restart count of this worker (torchrun --max-restarts), if it has one."""
    try:
        return int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    except (KeyError, ValueError):
        return None


def _log_sizes(spool_dir: Path, ring: int) -> tuple[int, int]:
    """(ring, persistent region) of a call log: the ring the smallest power of two of at
    least `ring` bytes, both halved while they would take more than a sixteenth of the
    file system's free space (its blocks are allocated at once: a small disk still
    records, and fills with spools and payloads, which the recorder survives)."""
    ring = 1 << max(16, (int(ring) - 1).bit_length())
    persist = PERSIST_SIZE
    try:
        spool_dir.mkdir(parents=True, exist_ok=True)
        st = os.statvfs(spool_dir)
        budget = st.f_bavail * st.f_frsize // 16
    except OSError:
        return ring, persist
    while ring + persist > budget and (ring > MIN_SIZE or persist > MIN_SIZE):
        ring, persist = max(MIN_SIZE, ring // 2), max(MIN_SIZE, persist // 2)
    return ring, persist


class Recording:
    """The recorder state of this process; at most one at a time."""

    def __init__(self, options: RecordOptions, rank: int, info: dict):
        self.options = options
        self.rank = rank
        self.world_size = int(info.get("world_size", 0))
        self.mesh: dict | None = None
        self.fsdp_layouts: dict[str, dict[str, list]] = {}  # see _install._note_fsdp_layout
        self.fsdp_seen: set[tuple] = set()
        self.spool_dir = Path(options.spool_dir)
        flight = options.flight is not None
        ring, persist = _log_sizes(self.spool_dir, options.flight_budget if flight else options.ring_size)
        # This incarnation of the rank: its own files, whatever came before in this directory
        # (a TorchElastic restart, a harness's fresh process for the same rank).
        restarts = _restart_count()
        self.attempt = claim_attempt(self.spool_dir, rank, restarts or 0, "log" if flight else "spool")
        self.log = CallLog(log_path(self.spool_dir, rank, self.attempt), rank, ring_size=ring, persist_size=persist,
                           flight=flight, attempt=self.attempt)
        info = {**info,
                # which writer (the C speedups, or the pure-Python path) and how much room
                "call_log": {"speedups": self.log.accelerated, "ring": ring, "persistent": persist},
                # rank 0's number for this attempt replaces it once the world is made (_install)
                "attempt": self.attempt,
                "incarnation": {"file_attempt": self.attempt, "restart_count": restarts, "pid": os.getpid()}}
        if flight:
            self.compactor = None
            self.log.info(info)
        else:
            self.compactor = Compactor(self.log, spool_path(self.spool_dir, rank, self.attempt), rank, info=info)
        self.on = True
        self.active = options.in_window(0)
        self.failure: tuple[int, str] | None = None  # (step, reason) once the recorder failed
        self.memory = MemoryReadings()
        self.calls = CallRecorder(self, self.log, options.payload, options.stack_depth)
        self.device_times = None  # a DeviceTimes, from time_device()
        self.window = StepWindow(self)
        self.slicing = Slicing(self)
        self.flight = None  # a Flight (recorder/_flight.py) in flight mode, from start()
        self.blob_writer = None  # a BlobWriter, from the first payload on
        self.calls.blob_writer = self._blob_writer
        self._steps = OptimizerSteps(self.mark_step)
        self._stopped = False
        self._closed = False
        self._thread = threading.get_ident()  # the program's thread
        if not flight and options.payload != "none":
            self.compactor.blobs = self._blob_writer()

    # --- what other parts read ----------------------------------------------------

    @property
    def step(self) -> int:
        return self.calls.step

    @property
    def cpu_memory(self):
        return self.memory.cpu

    def track_memory(self, cuda: bool = False, cpu_tracker=None) -> None:
        """Read memory at each call and step: the CUDA allocator's, or a CPU tracker's."""
        self.memory = MemoryReadings(cuda, cpu_tracker)
        self.calls.memory = self.memory.now if self.memory.reads else None
        self.calls.tracker = cpu_tracker

    def read_payloads_later(self, device: str = "cuda") -> None:
        """Read `device` tensors' payloads once the device has passed them, not at once
        (recorder/_later.py), where the payload mode reads any (small, digest). Before start()."""
        if self.calls.mode in (SMALL, DIGEST):
            self.calls.later = DevicePayloads(self.log, self.calls.mode, device)

    def read_device(self, final: bool = False) -> None:
        """Into the call log, what the device has passed: the payloads read later
        (_later.py) and the device times (_device_times.py); with `final`, all of them,
        each wait bounded (device_reads.FINAL_WAIT_S)."""
        self.calls.resolve_later(final)
        if self.device_times is not None:
            self.device_times.resolve(final=final)

    def time_device(self, device, durations: bool = False) -> None:
        """Mark steps and calls on `device`'s clock (recorder/_device.py: none on CPU unless
        PRISM_RR_DEVICE_CLOCK=host); `durations`: ask each call's Work for its backend's
        own timing (NCCL). Before start()."""
        clock = clock_for(device)
        if clock is not None:
            self.device_times = DeviceTimes(self, clock, durations=durations)
            self.calls.device = self.device_times

    # --- life cycle ---------------------------------------------------------------

    def start(self) -> None:
        global _current
        _current = self
        self._steps.start()
        atexit.register(self.close, "exit")
        _signals.install(self)
        _exits.watch(self)
        if self.options.flight is not None:
            self.flight = Flight(self)
            self.flight.start()
        if self.active:
            self.window.begin()

    def fail(self, exc: BaseException) -> None:
        """Log once, turn recording off, keep training."""
        if not self.on:
            return
        self.on = False
        self.active = False
        reason = f"{type(exc).__name__}: {exc}"[:500]
        self.failure = (self.step, reason)
        log.warning("prism-rr: recording stopped on rank %d at step %d: %s", self.rank, self.step, reason)
        try:
            t = monotonic_ns()
            self.log.record(codec.as_row(Marker(start_ns=t, end_ns=t, step=self.step, name="recorder_failed",
                                                text=reason)))
            # Also in the rank's info, which `prism-rr info` reads without reading chunks.
            self.log.info({"recorder_failed": {"step": self.step, "reason": reason}})
        except BaseException:
            pass

    def stop(self, reason: str = "closed") -> None:
        """Recording ends here: the calls still open stay open in the log, a
        `recording_end` marker says why. Nothing is compacted: safe from a signal's
        thread while the program's thread may still be in a call. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self.active = False
        calls = self.calls
        if self.on and calls.finished and threading.get_ident() == self._thread:
            calls.write_finished()  # outputs read on the program's thread only
        if self.on:
            # what the device has passed; all of it (a bounded wait) at a clean end on the
            # program's thread, never from a signal
            self.read_device(final=threading.get_ident() == self._thread and not reason.startswith("SIG"))
        was_on = self.on
        self.on = False
        global _current
        if _current is self:
            _current = None
        try:
            self._steps.stop()
            self.window.stop_modes()
            # threads as the program left them (it may set them after init_process_group)
            self.log.info({"exit": _exits.how(reason, self.options.stack_depth), "cpu": _manifest.cpu_info()})
            if calls.later is not None:  # payloads read once the device passed them (_later.py)
                self.log.info({"payloads_later": {"device": calls.later.device, "taken": calls.later.taken,
                                                  "unread": calls.later.pending}})
            if was_on or self.failure is not None:
                t = monotonic_ns()
                self.log.record(codec.as_row(Marker(start_ns=t, end_ns=t, step=self.step, name="recording_end",
                                                    value=len(calls.pending()), text=reason)))
            if self.flight is not None:
                self.flight.closing(reason)  # the run ends: dump if asked, then stop watching
        except BaseException as exc:
            log.warning("prism-rr: could not end the recording of rank %d: %s", self.rank, exc)

    def close(self, reason: str = "closed") -> None:
        """Stop, then write the call log into the spool (flight: keep or remove the ring).
        Idempotent."""
        self.stop(reason)
        if self._closed:
            return
        self._closed = True
        try:
            if self.blob_writer is not None:
                self.blob_writer.close(timeout=5.0)  # every payload on disk before the spool ends
            if self.compactor is not None:
                self.compactor.close()
            else:
                self.log.close(remove=not self.flight.keep_log if self.flight is not None else True)
        except BaseException as exc:
            log.warning("prism-rr: could not close the spool of rank %d: %s", self.rank, exc)

    def emergency_flush(self, reason: str) -> None:
        """From a signal (SIGTERM, SIGINT): the records are on disk already (the call log);
        say why the recording ends."""
        self.stop(reason)

    def remove_spool(self) -> None:
        for path in (spool_path(self.spool_dir, self.rank, self.attempt), log_path(self.spool_dir, self.rank, self.attempt)):
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("prism-rr: could not remove %s: %s", path, exc)

    # --- records ------------------------------------------------------------------

    def write(self, record) -> None:
        """A record other than a call's (a step, a marker, ...) into the call log."""
        self.log.record(codec.as_row(record))

    def add_info(self, info: dict) -> None:
        """Add to this rank's info (argv, versions, clock offset, the mesh, ...)."""
        if not self.log.info(info):
            raise RuntimeError("the call log's persistent region is full")

    def mark_step(self) -> None:
        """A step boundary (OptimizerSteps says when)."""
        if not self.on:
            self.calls.step += 1
            return
        try:
            calls = self.calls
            if calls.open or calls.finished:
                calls.reap()
            compactor = self.compactor
            if compactor is not None and compactor.error is not None:  # its thread could not write
                raise compactor.error
            self.window.boundary()
        except BaseException as exc:
            self.fail(exc)
        if self.slicing.pending:
            self.slicing.settle(None)

    def settle_slice(self, mesh=None) -> None:
        self.slicing.settle(mesh)

    @property
    def slice_pending(self) -> bool:
        return self.slicing.pending

    def group_seen(self, ranks, desc: str) -> None:
        self.slicing.group_seen(ranks, desc)

    def group_created(self, gid: int, ranks, name: str, desc: str, backend: str) -> None:
        if not self.on:
            return
        try:
            t = monotonic_ns()
            self.log.persist_record(codec.as_row(GroupInfo(
                start_ns=t, end_ns=t, step=self.step, group=gid, ranks=tuple(int(r) for r in ranks), name=str(name),
                text=str(desc), backend=str(backend))))
        except BaseException as exc:
            self.fail(exc)

    def operator_ran(self, func, args, t0: int, t1: int) -> None:
        """--ops: one Compute record per operator of the program, in the window."""
        if self.active:
            alloc, peak = self.memory.now()
            shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
            self.write(Compute(start_ns=t0, end_ns=t1, step=self.step, name=func.__name__, shapes=shapes,
                               mem_alloc=alloc, mem_peak=peak))

    def marker(self, name: str, value: int | None = None, text: str | None = None) -> None:
        if not self.on:
            return
        t = monotonic_ns()
        self.write(Marker(start_ns=t, end_ns=t, step=self.step, name=name, value=value, text=text))

    def sample_memory(self, name: str) -> None:
        alloc, peak = self.memory.now()
        if alloc is not None:
            t = monotonic_ns()
            self.write(Memory(start_ns=t, end_ns=t, step=self.step, mem_alloc=alloc, mem_peak=peak, name=name))

    def outside(self, fn, *args):
        """fn(*args), which is not the program's work (the recorder's own): the
        per-operator mode (memory tracker, --ops) looks away."""
        return dispatch.aside(self.window.ops_mode, fn, *args)

    def _blob_writer(self):
        if self.blob_writer is None:
            self.blob_writer = BlobWriter(self.spool_dir)
            if self.compactor is not None:
                self.compactor.blobs = self.blob_writer
        return self.blob_writer
