"""One rank's recording: its spool, step counter, open calls, and the off switch.

Everything here runs inside a training rank. Any failure in the recorder logs one
warning and turns recording off; the training run goes on as if nothing were watching.
"""

from __future__ import annotations

import atexit
import logging
import threading
from pathlib import Path
from time import monotonic_ns

import torch

from prism_rr.format.codec import row_maker
from prism_rr.format.records import Collective, Compute, GroupInfo, Marker, Memory, PointToPoint, Step
from prism_rr.format.spool import SpoolWriter, spool_path
from prism_rr.intercept import dispatch
from prism_rr.intercept import payload as _payload
from prism_rr.intercept.stack import caller_stack
from prism_rr.intercept.steps import OptimizerSteps
from prism_rr.recorder import _signals
from prism_rr.recorder._options import RecordOptions

__all__ = ["Call", "Recording", "current"]

log = logging.getLogger("prism_rr.recorder")

_current: Recording | None = None


def current() -> Recording | None:
    return _current


# Records made by position, as rows (codec.row_maker): the recorder makes two per call,
# and the dataclasses' keyword __init__ costs microseconds each.
_compute = row_maker(Compute, ("start_ns", "end_ns", "step", "mem_alloc", "mem_peak"))
_collective = row_maker(Collective, (
    "start_ns", "end_ns", "step", "op", "group", "seq", "in_shapes", "in_dtypes", "in_bytes", "out_shapes",
    "out_dtypes", "out_bytes", "reduce_op", "root", "async_op", "issued_ns", "digest_in", "digest_out",
    "blob_in", "blob_out", "mem_alloc", "mem_peak", "stack"))
_point_to_point = row_maker(PointToPoint, (
    "start_ns", "end_ns", "step", "op", "group", "seq", "peer", "tag", "shapes", "dtypes", "nbytes",
    "async_op", "issued_ns", "digest", "blob", "mem_alloc", "mem_peak", "stack"))
_NO_MEM = (None, None)


_DONE: list = []


def _done_work():
    """A Work that is complete (one for all: its wait() returns at once, its result is empty)."""
    if not _DONE:
        from prism_rr.intercept.group import completed_work

        _DONE.append(completed_work())
    return _DONE[0]


class Call:
    """A communication call between entry and completion."""

    __slots__ = (
        "p2p", "receives", "op", "group", "seq", "start", "issued", "step", "ins", "outs", "in_desc",
        "digest_in", "blob_in", "reduce_op", "root", "peer", "tag", "async_op", "stack",
        "mem", "done", "work", "written", "end", "error",
    )

    def __init__(self, op=None, group=None, seq=None, start=None, step=None, ins=None, outs=None, p2p=False,
                 receives=False, reduce_op=None, root=None, peer=None, tag=0, async_op=False):
        self.op = op
        self.group = group
        self.seq = seq
        self.start = start
        self.step = step
        self.ins = ins
        self.outs = outs
        self.p2p = p2p
        self.receives = receives
        self.reduce_op = reduce_op
        self.root = root
        self.peer = peer
        self.tag = tag
        self.async_op = async_op
        self.issued = None
        self.in_desc = None
        self.digest_in = self.blob_in = None
        self.stack = None
        self.mem = _NO_MEM
        self.done = False
        self.written = False
        self.work = None  # the real Work's future, polled for completion
        self.end = None  # when it completed
        self.error = None  # why it failed, if it did

    def release(self) -> None:
        """Let go of the call's tensors (and the future that holds its outputs) once its
        record is written. Done on the program's thread, so a buffer the program has
        dropped is freed there and then: a backend thread's callback holds the GIL only
        when the main thread lets go of it, which would free it at a racy moment."""
        if self.written:
            self.ins = self.outs = self.work = None


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
        self.flight = None  # a Flight (recorder/_flight.py) in flight mode, from start()
        if options.flight is not None:
            from prism_rr.recorder._flight import FlightWriter

            self.writer = FlightWriter(self.spool_dir, rank, options.flight_budget, info=info)
        else:
            self.writer = SpoolWriter(spool_path(self.spool_dir, rank), rank, info=info)
        self.on = True
        self.step = 0
        self.step_start = monotonic_ns()
        self.active = options.in_window(0)
        self.digest = options.payload == "digest"
        self.full = options.payload == "full"
        self.stack_depth = options.stack_depth
        self.last_return: int | None = None  # when the previous comm call gave control back
        self.open: dict[int, Call] = {}
        # Calls a backend thread saw complete, whose record (and so whose output
        # tensors' digests and payloads) the program's thread has yet to write.
        self.finished: dict[int, Call] = {}
        self.failure: tuple[int, str] | None = None  # (step, reason) once the recorder failed
        self.blob_writer = None  # a BlobWriter, from the first payload on
        self._graph_task = None  # torch's current autograd graph task id, once looked up
        self._queue_callback = None
        self._task_seen = -1  # the last backward pass that got an end-of-backward reap
        self.cuda = False  # read CUDA allocator statistics at each event
        self.cpu_memory = None  # a CpuMemoryTracker when options.memory on CPU
        self.ops_mode = None
        self._lock = threading.Lock()
        self._thread = threading.get_ident()  # the program's thread
        self._steps = OptimizerSteps(self.mark_step)
        self._closed = False
        self.slice_pending = options.slice_later
        self._groups: list[dict] = []  # every group created: what a layout is found from

    # --- life cycle ---------------------------------------------------------------

    def start(self) -> None:
        global _current
        _current = self
        self._steps.start()
        atexit.register(self.close, "exit")
        _signals.install(self)
        if self.options.flight is not None:
            from prism_rr.recorder._flight import Flight

            self.flight = Flight(self)
            self.flight.start()
        if self.active:
            self._begin_window()

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
            self.writer.append(Marker(start_ns=t, end_ns=t, step=self.step, name="recorder_failed",
                                      text=reason))
            self.writer.flush()
            # Also in the rank's info, which `prism-rr info` reads without reading chunks.
            self.writer.add_info({"recorder_failed": {"step": self.step, "reason": reason}})
        except BaseException:
            pass

    def close(self, reason: str = "closed") -> None:
        """Write calls still open (end_ns None), flush, close the spool. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.active = False
        if self.on and self.finished:
            # Calls a backend thread saw complete: their outputs are read only here on
            # the program's thread (atexit); from a signal watcher, they are written
            # without them.
            self._write_finished(read=threading.get_ident() == self._thread)
        if self.blob_writer is not None:
            self.blob_writer.close(timeout=5.0)  # every payload on disk before the spool ends
            if self.blob_writer.error is not None:
                self.fail(self.blob_writer.error)
        self.on = False
        global _current
        if _current is self:
            _current = None
        try:
            self._steps.stop()
            self._stop_modes()
            t = monotonic_ns()
            with self._lock:
                hung = list(self.open.values())
                self.open.clear()
            for call in hung:
                self.writer.append(self._record(call, None))
            self.writer.append(Marker(start_ns=t, end_ns=t, step=self.step, name="recording_end",
                                      value=len(hung), text=reason))
            if self.flight is not None:
                self.flight.closing(reason)  # the run ends: dump if asked, then stop watching
            self.writer.close(timeout=5.0)
        except BaseException as exc:
            log.warning("prism-rr: could not close the spool of rank %d: %s", self.rank, exc)

    def emergency_flush(self, reason: str) -> None:
        """From a signal: get every record, open calls included, onto the disk."""
        self.close(reason)

    # --- steps --------------------------------------------------------------------

    def mark_step(self) -> None:
        """A step boundary (OptimizerSteps says when)."""
        if not self.on:
            self.step += 1
            return
        try:
            if self.open or self.finished:
                self.reap()
            if getattr(self.writer, "error", None) is not None:  # the spool's thread could not write
                raise self.writer.error
            t = monotonic_ns()
            if self.active:
                if self.last_return is not None and t > self.last_return:
                    self.writer.append(Compute(start_ns=self.last_return, end_ns=t, step=self.step))
                peak = self._step_peak()
                self.writer.append(Step(start_ns=self.step_start, end_ns=t, step=self.step, mem_peak=peak))
                if self.flight is not None:
                    self.flight.step_ended(self.step, t - self.step_start)
            self.step += 1
            self.step_start = t
            self.last_return = t
            was = self.active
            self.active = self.options.in_window(self.step)
            if self.active and not was:
                self._begin_window()
            elif was and not self.active:
                self._stop_modes()
                self.writer.append(Marker(start_ns=t, end_ns=t, step=self.step, name="window_end"))
                self.writer.flush()
        except BaseException as exc:
            self.fail(exc)
        if self.slice_pending:
            self.settle_slice(None)

    def _begin_window(self) -> None:
        t = monotonic_ns()
        self.last_return = t
        self.writer.append(Marker(start_ns=t, end_ns=t, step=self.step, name="window_start"))
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()
        if self.options.ops or self.cpu_memory is not None:
            self.ops_mode = dispatch.start(self.cpu_memory, self._operator_ran if self.options.ops else None,
                                           self.fail)

    def _stop_modes(self) -> None:
        if self.ops_mode is not None:
            mode, self.ops_mode = self.ops_mode, None
            try:
                mode.stop()
            except BaseException:
                pass

    def _step_peak(self) -> int | None:
        if self.cuda:
            from prism_rr.intercept.memory import cuda_step_peak

            return cuda_step_peak()
        if self.cpu_memory is not None:
            return self.cpu_memory.take_peak()
        return None

    def memory(self) -> tuple[int | None, int | None]:
        if self.cuda:
            import torch

            return int(torch.cuda.memory_allocated()), int(torch.cuda.max_memory_allocated())
        if self.cpu_memory is not None:
            return self.cpu_memory.allocated, self.cpu_memory.peak
        return None, None

    # --- slicing ------------------------------------------------------------------

    def settle_slice(self, mesh=None) -> None:
        """`--slice roles` without `--mesh`: the layout is now known (the DeviceMesh the
        program built, else, at the first step boundary, the groups it made). A rank that
        stands for no role stops recording and removes its spool; the others note the
        layout for the manifest. Every rank sees the same groups, so all decide alike."""
        if not self.slice_pending:
            return
        self.slice_pending = False
        groups, self._groups = self._groups, []
        try:
            from prism_rr.topology.roles import Mesh, mesh_from_groups, slice_ranks

            by = "mesh"
            if isinstance(mesh, dict):
                mesh = Mesh.from_dict(mesh)
            if mesh is None or mesh.world_size != self.world_size:
                mesh, by = mesh_from_groups(self.world_size, groups), "groups"
            if mesh is None:
                if self.rank == 0:
                    log.warning("prism-rr: --slice roles: the groups form no mesh; recording every rank "
                                "(give the layout with --mesh dp=..,tp=..)")
                return
            keep = slice_ranks(self.world_size, mesh, self.options.ranks or ())
        except Exception as exc:
            log.warning("prism-rr: --slice roles: no layout (%s: %s); recording every rank", type(exc).__name__, exc)
            return
        if self.rank in keep:
            self.writer.add_info({"slice_mesh": mesh.to_dict(), "slice_by": by})
            return
        self.close("stands for no role")
        try:
            self.writer.path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("prism-rr: could not remove the spool of rank %d: %s", self.rank, exc)

    # --- groups -------------------------------------------------------------------

    def group_seen(self, ranks, desc: str) -> None:
        """A group the program made (this rank in it or not), while the layout is sought."""
        self._groups.append({"ranks": tuple(int(r) for r in ranks), "desc": str(desc)})

    def group_created(self, gid: int, ranks, name: str, desc: str, backend: str) -> None:
        if not self.on:
            return
        try:
            t = monotonic_ns()
            self.writer.append(GroupInfo(start_ns=t, end_ns=t, step=self.step, group=gid,
                                         ranks=tuple(int(r) for r in ranks), name=str(name),
                                         text=str(desc), backend=str(backend)))
        except BaseException as exc:
            self.fail(exc)

    # --- calls --------------------------------------------------------------------

    def enter(self, op, gid, seq, ins, outs, *, reduce_op=None, root=None, peer=None, tag=0,
              async_op=False, p2p=False, receives=False) -> Call | None:
        """Note a call's entry; None when recording is off or fails."""
        # frames: caller_stack, _enter, enter, the observer's enter, the group's _run
        return self._enter(op, gid, seq, ins, outs, reduce_op, root, peer, tag, async_op, p2p, receives, 4)

    def _enter(self, op, gid, seq, ins, outs, reduce_op, root, peer, tag, async_op, p2p, receives,
               skip: int) -> Call | None:
        """enter(), by position; `skip`: the frames from caller_stack's to the group's."""
        try:
            if self.open or self.finished:
                self.reap()
                self._in_backward()
            elif async_op or p2p:
                # A blocking collective is complete when it returns: with nothing open,
                # there is nothing to reap at the end of a backward pass. A later call
                # that stays open asks for the reap itself.
                self._in_backward()
            start = monotonic_ns()
            call = Call(op, gid, seq, start, self.step, ins, outs, p2p, receives, reduce_op, root, peer, tag,
                        async_op)
            call.in_desc = _payload.describe(ins)
            if not receives and (self.digest or self.full):
                call.digest_in, call.blob_in = self.outside(self._payload_of, ins)
            if self.stack_depth:
                call.stack = caller_stack(self.stack_depth, skip)
            if self.cuda or self.cpu_memory is not None:
                call.mem = self.memory()
            last = self.last_return
            if last is not None and start > last:
                mem_alloc, mem_peak = call.mem
                self.writer.append(_compute(last, start, call.step, mem_alloc, mem_peak))
            self.last_return = None
            with self._lock:
                self.open[id(call)] = call
            return call
        except BaseException as exc:
            self.fail(exc)
            return None

    def blocking(self, gid, op, seq, ins, outs, fn, args, reduce_op, root, peer, tag, receives):
        """A blocking call (a collective, or torch's send or recv: torch waits for its Work as
        soon as it has it), forwarded to the real backend as RecordingPolicy does: enter,
        issue, wait here, and write its record, in one call on the program's thread. What
        enter, track and complete do for any call, without a Call object of the group's or
        their round trips: most of a step's calls are these (the cost per call,
        bench/call_overhead.py). Returns a Work that is done: a collective's real one; for a
        send or recv, whose gloo Work would wait for another message at a second wait(), a
        completed one."""
        p2p = peer is not None
        # frames: caller_stack, _enter, blocking, the group's _collective or _p2p, its method
        # (ours too)
        call = self._enter(op, gid, seq, ins, outs, reduce_op, root, peer, tag, False, p2p, receives, 5)
        # Without a per-operator mode, the real call and the record's write go straight
        # (aside and outside would only call through: a microsecond a call, measured).
        mode = self.ops_mode
        if call is None:
            return fn(*args) if mode is None else dispatch.aside(mode, fn, *args)
        try:
            work = fn(*args) if mode is None else dispatch.aside(mode, fn, *args)
            issued = call.issued = monotonic_ns()
            self.last_return = issued
            if work is not None:  # none: NCCL's blocking call, done as far as this thread can tell
                work.wait()
        except BaseException as exc:
            self.complete(call, exc)
            raise
        end = monotonic_ns()
        with self._lock:
            call.done = True
            call.end = end
            self.open.pop(id(call), None)
        if self.last_return == issued:
            self.last_return = end  # the caller was waiting until now: not compute
        if self.on:  # (a signal's close() wrote it as open and turned recording off)
            try:
                if mode is None:
                    self.writer.append(self._record(call, end))
                else:
                    self.outside(self._write_record, call, True)
            except BaseException as exc:
                self.fail(exc)
        call.written = True
        self.settle(call)
        return _done_work() if p2p else work

    def reap(self) -> None:
        """On the program's thread: write the calls a backend thread saw complete, and
        complete open calls whose future is done (sooner than their callback, which waits
        for the GIL the main thread holds; the future is marked done first)."""
        if self.finished:
            self._write_finished()
        for call in list(self.open.values()):
            fut = call.work
            if fut is not None and not call.done:
                try:
                    finished = fut.done()
                except Exception:
                    continue
                if finished:
                    self.complete(call)

    def _in_backward(self) -> None:
        """A call made inside a backward pass (DDP's bucket all_reduce) may be consumed
        only through its future, by C++ (DDP's reducer waits for it at the end of the
        backward pass), and its results changed in place before the program's next call
        or step (gradient clipping on gradients that are views of the buckets). So, once
        per backward pass, reap at its very end: an engine callback that queues another,
        which runs after the ones frameworks queued (DDP's finalize), on the backward
        pass's thread, before the program has its results."""
        task = self._graph_task
        if task is None:
            import torch
            from torch.autograd import Variable

            task = self._graph_task = torch._C._current_graph_task_id
            self._queue_callback = Variable._execution_engine.queue_callback
        tid = task()
        if tid != -1 and tid != self._task_seen:
            self._task_seen = tid
            self._queue_callback(self._after_backward)

    def _after_backward(self) -> None:
        try:
            self._queue_callback(self._reap_after_backward)
        except BaseException:
            self._reap_after_backward()

    def _reap_after_backward(self) -> None:
        try:
            if self.on and (self.open or self.finished):
                self.reap()
        except BaseException as exc:
            self.fail(exc)

    def issued(self, call: Call) -> None:
        t = monotonic_ns()
        call.issued = t
        self.last_return = t

    def complete(self, call: Call, error: BaseException | None = None, peer: int | None = None,
                 *, backend: bool = False) -> None:
        """The call finished (from a wait(), a reap, inline, or, with `backend`, from a
        backend thread's future callback).

        A backend thread only notes when: the program may free, resize or overwrite the
        outputs at any moment after its wait() returned (FSDP2 frees unsharded parameters
        with `untyped_storage().resize_(0)`), and torch wakes waiters before it runs done
        callbacks. The record, with the outputs' digests and payloads, is written on the
        program's thread: where its wait() returns, else at the next call, step or exit.
        """
        end = monotonic_ns()
        with self._lock:
            if call.done:
                return
            call.done = True
            call.end = end
            call.error = error
            self.open.pop(id(call), None)
            if backend:
                self.finished[id(call)] = call
        if peer is not None:
            call.peer = peer
        if not call.async_op and self.last_return == call.issued:
            self.last_return = end  # the caller was waiting until now: not compute
        if not backend:
            self._write(call)

    def write_finished(self, call: Call) -> None:
        """On the program's thread, where its wait() for `call` returned: write the call's
        record if a backend thread saw it complete first."""
        if call.written or not self.finished:
            return
        with self._lock:
            mine = self.finished.pop(id(call), None) is not None
        if mine:
            self._write(call)

    def _write_finished(self, read: bool = True) -> None:
        with self._lock:
            calls = list(self.finished.values())
            self.finished.clear()
        for call in calls:
            self._write(call, read)

    def _write(self, call: Call, read: bool = True) -> None:
        """Write a completed call's record. On the program's thread only, unless `read`
        is false: it reads the outputs' memory (digests, payloads)."""
        try:
            if self.on:
                self.outside(self._write_record, call, read)
        except BaseException as exc:
            self.fail(exc)
        finally:
            call.error = None
            call.written = True
            if threading.get_ident() == self._thread:
                self.settle(call)

    def _write_record(self, call: Call, read: bool) -> None:
        end = call.end
        self.writer.append(self._record(call, end, read))
        error = call.error
        if error is not None:
            self.writer.append(Marker(start_ns=end, end_ns=end, step=call.step, name="call_failed",
                                      value=call.seq, text=f"{call.op}: {type(error).__name__}: {error}"[:500]))

    def outside(self, fn, *args):
        """fn(*args), which is not the program's work (the backend's, or the recorder's own:
        digests, payload copies): the per-operator mode (memory tracker, --ops) looks away,
        as the replayer's does from its own."""
        return dispatch.aside(self.ops_mode, fn, *args)

    def _payload_of(self, tensors) -> tuple:
        """(digests, blobs) of a call's tensors (inputs, or outputs once they hold results), as
        the payload option asks."""
        if self.digest and _payload.small(tensors):  # one copy of the bytes for both
            return _payload.blobs(self._blob_writer(), tensors, True)
        return (_payload.digests(tensors) if self.digest else None), self._blobs(tensors)

    def settle(self, call: Call) -> None:
        """On the program's thread, once the call completed for it: its tensors were in
        use until now (for the memory tracker), and the recorder lets go of them."""
        if not call.written:
            return
        tracker = self.cpu_memory
        if tracker is not None and call.ins is not None:
            try:
                tracker.touch(call.ins, call.outs)
            except Exception:
                pass
        call.release()

    def _blobs(self, tensors):
        """The tensors' bytes as blobs: always with `full`; with `digest`, when the call's
        tensors are small (control data such as sizes, flags, a loss: a replay that made
        them up could take another branch)."""
        if self.full or (self.digest and _payload.small(tensors)):
            return _payload.blobs(self._blob_writer(), tensors)
        return None

    def _blob_writer(self):
        if self.blob_writer is None:
            from prism_rr.format.blobs import BlobWriter

            # a flight ring keeps blobs in memory, beside the records that name them
            self.blob_writer = BlobWriter(self.spool_dir, sink=getattr(self.writer, "store_blob", None))
            self.writer.blobs = self.blob_writer  # no record on disk before its blobs
        return self.blob_writer

    def _record(self, call: Call, end: int | None, read: bool = True):
        read = read and end is not None  # the outputs hold results
        mem_alloc, mem_peak = call.mem
        payloads = self.digest or self.full
        if call.p2p:
            digest = call.digest_in
            blob = call.blob_in
            if payloads and call.receives and read and self._readable(call, call.outs):
                digest, blob = self._payload_of(call.outs)
            shapes, dtypes, nbytes = call.in_desc
            return _point_to_point(
                call.start, end, call.step, call.op, call.group, call.seq, -1 if call.peer is None else call.peer,
                call.tag, shapes, dtypes, nbytes, call.async_op, call.issued, digest, blob, mem_alloc, mem_peak,
                call.stack)
        in_desc = call.in_desc
        outs = call.outs
        out_desc = in_desc if outs is call.ins else _payload.describe(outs)
        digest_out = blob_out = None
        if payloads and read and self._readable(call, outs):
            digest_out, blob_out = self._payload_of(outs)
        return _collective(
            call.start, end, call.step, call.op, call.group, call.seq, in_desc[0], in_desc[1], in_desc[2],
            out_desc[0], out_desc[1], out_desc[2], call.reduce_op, call.root, call.async_op, call.issued,
            call.digest_in, digest_out, call.blob_in, blob_out, mem_alloc, mem_peak, call.stack)

    def _readable(self, call: Call, tensors) -> bool:
        """Whether the outputs still hold their data; if not (the program freed or resized
        a storage before the record could be written), say so with a `payload_lost` marker
        and record no digest or payload for the call (a replay builds its outputs)."""
        if not (self.digest or self.full) or _payload.alive(tensors):
            return True
        end = call.end if call.end is not None else monotonic_ns()
        self.writer.append(Marker(start_ns=end, end_ns=end, step=call.step, name="payload_lost",
                                  value=call.seq, text=f"{call.op}: output storage freed before it was read"))
        return False

    def _operator_ran(self, func, args, t0: int, t1: int) -> None:
        """--ops: one Compute record per operator of the program, in the window."""
        if self.active:
            alloc, peak = self.memory()
            shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
            self.writer.append(Compute(start_ns=t0, end_ns=t1, step=self.step, name=func.__name__,
                                       shapes=shapes, mem_alloc=alloc, mem_peak=peak))

    def marker(self, name: str, value: int | None = None, text: str | None = None) -> None:
        if not self.on:
            return
        t = monotonic_ns()
        self.writer.append(Marker(start_ns=t, end_ns=t, step=self.step, name=name, value=value, text=text))

    def sample_memory(self, name: str) -> None:
        alloc, peak = self.memory()
        if alloc is not None:
            t = monotonic_ns()
            self.writer.append(Memory(start_ns=t, end_ns=t, step=self.step, mem_alloc=alloc,
                                      mem_peak=peak, name=name))
