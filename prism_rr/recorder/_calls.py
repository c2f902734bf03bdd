"""The call path of a recording: every call from its entry to its record in the call log.

One path, for every call the program makes on a recorded group (intercept/group.py gives
each as one `Call`):

    enter(call)      the call's ENTER is in the call log before the backend is entered:
                     op, group, sequence, peer or root, shapes and dtypes, the stack, the
                     step, memory, the inputs' payload; False when it is not recorded
    issued(call)     the backend took it (an async call's Work came back)
    complete(call)   it finished: its DONE, with the outputs' payload, read here on the
                     program's thread; from a backend thread (a future's callback) the DONE
                     says that the outputs come later, and `write_outputs` writes them where
                     the program's wait() returns, or at its next call or step
    blocking(call)   enter, run, wait and complete a blocking call in one go (most calls)

Shapes and dtypes, stacks and names are written once to the log's dictionary and named by
id after. Nothing here encodes or compresses: the compactor does, off the program's path.

Two twins, as CPython's accelerated modules have (PEP 399): `PyCallRecorder`, the path in
Python, and, where the C speedups were built, the same on their CallState, whose
`fast_blocking` runs a blocking call's common case in C (prism_rr/_speedups.c). `bind`
gives it, once, the Call it makes and enter's arguments by name, from their one
definition (intercept/group.py's Call, format/calllog.py's CallLog._enter), and refuses
by name what it could not write. `CallRecorder` is the one a recording uses; the tests
run on both (tests/recorder/test_call_path.py).
"""

from __future__ import annotations

import os
import sys
import threading
from time import monotonic_ns

import torch
from torch.autograd import Variable

from prism_rr.format.calllog import (D_FAILED, D_OUT_LATER, D_SOURCED, E_ASYNC, E_IN_LATER, E_P2P, E_RECV, E_SAME_OUT,
                                     CallLog)
from prism_rr.format.records import Marker
from prism_rr.intercept import dispatch
from prism_rr.intercept import payload as _payload
from prism_rr.intercept.group import Call, completed_work, op_names
from prism_rr.intercept.stack import WALK_CACHES, fast_walk, frame_stack

_log_payload = _payload.log_payload

try:  # blocking()'s common case in C, on the same state (prism_rr/_speedups.c); optional
    if os.environ.get("PRISM_RR_PURE_PYTHON"):
        raise ImportError("PRISM_RR_PURE_PYTHON is set")
    from prism_rr import _speedups
except ImportError:
    _speedups = None

__all__ = ["CallRecorder", "PyCallRecorder"]


class DictionaryFull(RuntimeError):
    pass


class PyCallRecorder:
    """Writes one rank's calls into its call log. `rec` is the Recording (its step, its
    memory readings, its per-operator mode, its off switch). All in Python: CallRecorder
    is this on the C speedups' state, where they were built."""

    _walk = None  # the stack walk in C (intercept/stack.fast_walk), where a class takes it

    def __init__(self, rec, log: CallLog, payload: str, stack_depth: int):
        self.rec = rec
        self.log = log
        self.mode = _payload.MODES[payload]
        # What the payload mode keeps: `small` only what calls deliver (their outputs: the
        # data a replay must not make up); the others what goes in too (digest checks it).
        self.inputs = self.mode in (_payload.DIGEST, _payload.FULL)
        self.stack_depth = stack_depth
        self.step = 0
        self.last_return: int | None = None  # when the previous call gave control back
        self.open: dict[int, object] = {}  # id(call) -> call: entered, not completed
        # Calls a backend thread saw complete whose outputs the program's thread has yet
        # to write (their DONE said D_OUT_LATER).
        self.finished: dict[int, object] = {}
        self.memory = None  # () -> (allocated, peak), when memory is read at each call
        self.tracker = None  # the CPU memory tracker (`--memory` on CPU): it sees each call's tensors
        self.ops_mode = None  # the per-operator dispatch mode, while it runs
        self.blob_writer = None  # () -> BlobWriter, for `full` payloads too large for the log
        self.device = None  # the recording's DeviceTimes, when it has a device clock
        self.later = None  # a DevicePayloads (_later.py): CUDA tensors' payloads read without waiting
        self.inline_max = _payload.INLINE_MAX if not log.flight else log.ring_size // 8
        self._lock = threading.Lock()
        self._thread = threading.get_ident()  # the program's thread
        self._ids = 0
        self._descs: dict = {}  # (shape, dtype) or a tuple of them -> dictionary id
        self._stacks: dict = {}
        self._names: dict = {}
        self._graph_task = None  # torch's current autograd graph task id, once looked up
        self._queue_callback = None
        self._task_seen = -1  # the last backward pass that got an end-of-backward reap
        self._log_enter = log.enter
        self._log_done = log.done

    # --- the dictionary -------------------------------------------------------------

    def _define(self, table: dict, key, value) -> int:
        self._ids += 1
        ident = self._ids
        if not self.log.define(ident, value):
            raise DictionaryFull(f"the call log's dictionary is full ({self.log.persist_size:,} bytes)")
        table[key] = ident
        return ident

    def _desc(self, tensors) -> int:
        """The dictionary id of the tensors' shapes, dtypes and bytes."""
        if len(tensors) == 1:
            t = tensors[0]
            key = (t.shape, t.dtype)
        else:
            key = tuple([(t.shape, t.dtype) for t in tensors])
        ident = self._descs.get(key)
        if ident is None:
            ident = self._define(self._descs, key, _payload.describe(tensors))
        return ident

    def _name(self, name) -> int:
        if name is None:
            return 0
        ident = self._names.get(name)
        if ident is None:
            ident = self._define(self._names, name, name)
        return ident

    # --- the path -------------------------------------------------------------------

    def enter(self, call, skip: int = 3) -> bool:
        """Write the call's ENTER; False when it is not recorded (recording failed).
        `skip`: frames from here out to the group's method (for the stack)."""
        try:
            later = self.later
            if later is not None and later._pending:
                later.resolve()  # what the device has passed since
            if self.open or self.finished:
                self.reap()
                self._in_backward()
            elif call.async_op or call.p2p:
                # A blocking collective is complete when it returns: with nothing open,
                # there is nothing to reap at the end of a backward pass. A later call
                # that stays open asks for the reap itself.
                self._in_backward()
            start = monotonic_ns()
            ins = call.ins
            flags, peer, in_desc, out_desc = self._shape_of(call, ins)
            stack = self._stack_id(skip + 1) if self.stack_depth else 0
            names = self._names
            op = names.get(call.op) or self._name(call.op)
            reduce_op = call.reduce_op
            if reduce_op is not None:
                reduce_op = names.get(reduce_op) or self._name(reduce_op)
            else:
                reduce_op = 0
            alloc, peak = (-1, -1) if self.memory is None else self._memory_now()
            step = self.step
            payload = None
            if self.inputs and not call.receives:
                if self._reads_later(ins):
                    flags |= E_IN_LATER
                else:
                    payload = self._payload(ins)
            call.cid = self._log_enter(flags, start, self.last_return or 0, step, call.gid, call.seq, peer, call.tag,
                                       in_desc, out_desc, stack, op, reduce_op, alloc, peak, payload)
            if flags & E_IN_LATER:
                self._take_later(call, ins, True)  # on the stream before the backend: the inputs as given
            self.last_return = None
            call.start = start
            call.step = step
            call.issued = 0
            self.open[id(call)] = call
            if self.device is not None:
                self.device.call_issued(call)  # on the stream, just before the backend
            return True
        except BaseException as exc:
            self.rec.fail(exc)
            return False

    def _shape_of(self, call, ins) -> tuple[int, int, int, int]:
        """(flags, peer or root or -1, input and output descriptor ids) of a call's ENTER."""
        descs = self._descs
        if len(ins) == 1:
            t = ins[0]
            in_desc = descs.get((t.shape, t.dtype)) or self._desc(ins)
        else:
            in_desc = self._desc(ins)
        if call.p2p:
            flags = E_P2P | E_RECV if call.receives else E_P2P
            peer = -1 if call.peer is None else call.peer
            out_desc = 0
        else:
            root = call.root
            peer = -1 if root is None else root
            outs = call.outs
            if outs is ins:
                flags = E_SAME_OUT
                out_desc = 0
            else:
                flags = 0
                out_desc = self._desc(outs)
        if call.async_op:
            flags |= E_ASYNC
        return flags, peer, in_desc, out_desc

    def _stack_id(self, skip: int) -> int:
        """The id of the user's frames `skip` frames out from here (0: none): the C walk,
        its caches hit, else the Python one."""
        walk = self._walk
        depth = self.stack_depth
        frames = False if walk is None else walk(depth, skip, _IS_USER, _TEXTS, _STACKS)
        if frames is False:
            frames = frame_stack(sys._getframe(skip), depth)
        if not frames:
            return 0
        return self._stacks.get(frames) or self._define(self._stacks, frames, frames)

    def _memory_now(self) -> tuple[int, int]:
        """(allocated, peak) bytes as the memory source reads them now, -1 for unknown."""
        alloc, peak = self.memory()
        return -1 if alloc is None else alloc, -1 if peak is None else peak

    def _payload(self, tensors, checked: bool = False):
        """The payload part for a call's tensors (intercept/payload.log_payload), read with
        the per-operator mode looking away."""
        writer = None
        if self.mode == _payload.FULL and self.blob_writer is not None:
            writer = self.blob_writer()
        mode = self.ops_mode
        if mode is None:
            return _log_payload(tensors, self.mode, writer, checked, self.inline_max)
        return dispatch.aside(mode, _log_payload, tensors, self.mode, writer, checked, self.inline_max)

    def blocking(self, call):
        """A blocking call (a collective, or torch's send or recv: torch waits for its Work
        as soon as it has it) forwarded to the real backend: enter, issue, wait, complete,
        all on the program's thread. Returns a Work that is done: a collective's real one;
        for a send or recv, whose gloo Work would wait for another message at a second
        wait(), a completed one."""
        # frames out to the group's method: enter, blocking, the group's _collective or _p2p, the method
        recorded = self.enter(call, 4)
        mode = self.ops_mode
        fn, args = call.fn, call.args
        if not recorded:
            return fn(*args) if mode is None else dispatch.aside(mode, fn, *args)
        device = self.device
        try:
            work = fn(*args) if mode is None else dispatch.aside(mode, fn, *args)
            issued = call.issued = self.last_return = monotonic_ns()
            if work is not None:  # none: NCCL's blocking call, done as far as this thread can tell
                if device is not None:
                    device.keep_work(call, work)
                    device.call_waiting(call)
                work.wait()
        except BaseException as exc:
            self.complete(call, exc)
            raise
        if device is not None:
            device.call_waited(call)  # NCCL's without a Work ran on the stream: its end
        end = monotonic_ns()
        call.done = True
        self.open.pop(id(call), None)
        if self.last_return == issued:
            self.last_return = end  # the caller was waiting until now: not compute
        if self.rec.on:
            try:
                outs = call.outs if self.mode and (not call.p2p or call.receives) else None
                if outs is not None and self._reads_later(outs):
                    self._log_done(call.cid, end, issued, D_OUT_LATER, -1, -1, None)
                    self._take_later(call, outs, False)
                else:
                    self._log_done(call.cid, end, issued, 0, -1, -1, None if outs is None else self._payload(outs))
            except BaseException as exc:
                self.rec.fail(exc)
        if self.tracker is not None:
            self.settle(call)
        else:
            call.ins = call.outs = call.fn = call.args = None
        return _done_work() if call.p2p else work

    def issued(self, call) -> None:
        t = monotonic_ns()
        call.issued = t
        self.last_return = t

    def complete(self, call, error: BaseException | None = None, peer: int | None = None,
                 *, backend: bool = False) -> None:
        """The call finished (from a wait(), a reap, inline, or, with `backend`, from a
        backend thread's future callback).

        A backend thread reads no tensor: the program may free, resize or overwrite the
        outputs at any moment after its wait() returned (FSDP2 frees unsharded parameters
        with `untyped_storage().resize_(0)`), and torch wakes waiters before it runs done
        callbacks. Its DONE says the outputs come later (`write_outputs`, on the program's
        thread: where its wait() returns, else at the next call, step or exit)."""
        end = monotonic_ns()
        with self._lock:
            if call.done:
                return
            call.done = True
            call.end = end
            call.error = error
            self.open.pop(id(call), None)
        flags = 0
        sourced_peer = call_seq = -1
        if peer is not None:
            call.peer = peer
            flags |= D_SOURCED
            sourced_peer, call_seq = peer, call.seq
        if not call.async_op and self.last_return == call.issued:
            self.last_return = end  # the caller was waiting until now: not compute
        if not self.rec.on:
            return
        try:
            payload = None
            later = False
            wants = self.mode and error is None and (not call.p2p or call.receives) and call.outs
            if error is not None:
                flags |= D_FAILED
            elif wants and backend:
                flags |= D_OUT_LATER
                call.out_later = True
                with self._lock:
                    self.finished[id(call)] = call
            elif wants and self._reads_later(call.outs, checked=True):
                flags |= D_OUT_LATER
                later = True
            elif wants:
                payload = self._outputs(call)
            self.log.done(call.cid, end, call.issued, flags, sourced_peer, call_seq, payload)
            if later:
                self._take_later(call, call.outs, False)
            if error is not None:
                self.rec.write(Marker(start_ns=end, end_ns=end, step=call.step, name="call_failed", value=call.seq,
                                      text=f"{call.op}: {type(error).__name__}: {error}"[:500]))
                call.error = None
        except BaseException as exc:
            self.rec.fail(exc)

    def _outputs(self, call, checked: bool = True):
        """The outputs' payload, read on the program's thread; None (and a payload_lost
        marker) when the program freed or resized a storage before it could be read."""
        outs = call.outs
        if checked and not _payload.alive(outs):
            t = call.end or monotonic_ns()
            self.rec.write(Marker(start_ns=t, end_ns=t, step=call.step, name="payload_lost", value=call.seq,
                                  text=f"{call.op}: output storage freed before it was read"))
            return None
        return self._payload(outs, checked)

    def write_outputs(self, call) -> None:
        """On the program's thread, where its wait() for `call` returned (or later): the
        outputs of a call a backend thread saw complete."""
        if not call.out_later:
            return
        with self._lock:
            mine = self.finished.pop(id(call), None) is not None
        if mine:
            call.out_later = False
            try:
                if self.rec.on:
                    if self._reads_later(call.outs, checked=True):
                        self._take_later(call, call.outs, False)
                    else:
                        self.log.out(call.cid, self._outputs(call))
            except BaseException as exc:
                self.rec.fail(exc)

    def write_finished(self) -> None:
        with self._lock:
            calls = list(self.finished.values())
        for call in calls:
            self.write_outputs(call)
            self.settle(call)

    def reap(self) -> None:
        """On the program's thread: write the outputs of calls a backend thread saw
        complete, and complete open calls whose future is done (sooner than their callback,
        which waits for the GIL the main thread holds; the future is marked done first)."""
        if self.finished:
            self.write_finished()
        for call in list(self.open.values()):
            fut = call.future
            if fut is not None and not call.done:
                try:
                    finished = fut.done()
                except Exception:
                    continue
                if finished:
                    self.complete(call)
                    self.settle(call)

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
            if self.rec.on and (self.open or self.finished):
                self.reap()
        except BaseException as exc:
            self.rec.fail(exc)

    def settle(self, call) -> None:
        """On the program's thread, once the call completed for it and its outputs are
        written: its tensors were in use until now (for the memory tracker), and the
        recorder lets go of them (a buffer the program dropped is freed here and now, not
        on a backend thread at a racy moment)."""
        if not call.done or call.out_later:
            return
        tracker = self.tracker
        if tracker is not None and call.ins is not None:
            try:
                tracker.touch(call.ins, call.outs)
            except Exception:
                pass
        # The real backend's method holds the backend: a call kept by anyone past the
        # group's end must not keep it (its destructor, run late, aborts the process).
        call.ins = call.outs = call.future = call.fn = call.args = None

    def _reads_later(self, tensors, checked: bool = False) -> bool:
        """Whether these tensors' payload is read once the device has passed them
        (DevicePayloads.wanted); `checked`: only whole ones (outputs the program may have
        freed since, as _outputs reads them)."""
        later = self.later
        return later is not None and later.wanted(tensors) and (not checked or _payload.alive(tensors))

    def _take_later(self, call, tensors, inputs: bool) -> None:
        """Queue the reading of a call's payload (DevicePayloads.take), with the per-operator
        mode looking away (the reading's operators are not the program's). A failure costs
        that payload (a payload_lost marker says so), not the recording: the call's ENTER is
        in the log already, and failing here would leave it looking hung."""
        try:
            mode = self.ops_mode
            if mode is None:
                self.later.take(call.cid, tensors, inputs)
            else:
                dispatch.aside(mode, self.later.take, call.cid, tensors, inputs)
        except Exception as exc:
            t = monotonic_ns()
            self.rec.write(Marker(start_ns=t, end_ns=t, step=self.step, name="payload_lost", value=call.seq,
                                  text=f"{call.op}: its {'inputs' if inputs else 'outputs'} could not be read: "
                                       f"{type(exc).__name__}: {exc}"[:500]))

    def resolve_later(self, final: bool = False) -> None:
        """Write the payloads the device has passed (DevicePayloads); with `final`, all."""
        later = self.later
        if later is not None and later._pending:
            try:
                later.resolve(final)
            except BaseException as exc:
                self.rec.fail(exc)

    def pending(self) -> list[tuple]:
        """(start_ns, op, group, seq, step, id) of the calls entered and not completed,
        oldest first (the flight watchdog's; no reference to a call or its tensors)."""
        with self._lock:
            calls = [(c.start, c.op, c.gid, c.seq, c.step, id(c)) for c in self.open.values() if not c.done]
        calls.sort()
        return calls


_IS_USER, _TEXTS, _STACKS = WALK_CACHES


def _enter_args() -> tuple[str, ...]:
    """The call log's enter's arguments but the payload, by name: the Python writer's
    (CallLog._enter: flags, then the ENTER's fields but the call id, in their order)."""
    code = CallLog._enter.__code__
    names = code.co_varnames[1 : code.co_argcount]
    if names[-1:] != ("payload",):
        raise TypeError(f"CallLog._enter's last argument is not the payload: {names}")
    return names[:-1]


if _speedups is None:
    CallRecorder = PyCallRecorder
else:
    # A mismatch is an error here, at import, naming what does not agree.
    _speedups.bind(Call, Call("", 0, 0, (), (), None, ()), _enter_args(), _payload.FULL)

    class CallRecorder(_speedups.CallState, PyCallRecorder):
        """PyCallRecorder on the C speedups' CallState: its hot attributes are CallState's
        members (the Python code reads and writes them as any attribute), and `blocking`
        runs there for the common case. The same entries, field for field; what it does
        not handle (p2p in a new backward pass, memory readings, device clock, payloads
        read later, full payloads, open calls, a name or shape or stack not seen yet) it
        hands to the Python path (`_blocking_py`) before writing anything."""

        _walk = fast_walk
        blocking = _speedups.CallState.fast_blocking
        _blocking_py = PyCallRecorder.blocking

        def __init__(self, rec, log: CallLog, payload: str, stack_depth: int):
            super().__init__(rec, log, payload, stack_depth)
            # what fast_blocking writes with and reads from
            self._cursor = log.cur if log.accelerated else None
            self._stack_caches = WALK_CACHES if fast_walk is not None else None
            self._log_payload = _log_payload
            self._done_work = _done_work
            self._op_names, self._op_name, self._reduce_op_type = op_names()
            # log_payload's cases of small plain CPU tensors, tested in C as it tests them
            self._tensor_type, self._strided = _payload.PLAIN_TENSOR, _payload.PLAIN_LAYOUT
            self._keep_small = _payload.KEEP_SMALL
            self._small_what = _payload.small_bytes_what(self.mode)


_DONE: list = []


def _done_work():
    """A Work that is complete (one for all: its wait() returns at once, its result is empty)."""
    if not _DONE:
        _DONE.append(completed_work())
    return _DONE[0]
