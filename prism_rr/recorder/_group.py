"""The recording process group: a Python ProcessGroup that wraps the real backend.

Every method forwards its arguments unchanged to the real backend (gloo, NCCL) and
returns the real Work where it has a future (completion is taken from a future
callback), or a thin Work that notes completion at wait() where it has none (gloo's
send, recv and reduce_scatter_tensor). Outside the step window a call costs one
counter increment and one attribute test.
"""

from __future__ import annotations

from datetime import timedelta

import torch
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ProcessGroup,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    Work,
    _create_work_from_future,
)

from prism_rr.recorder._stack import p2p_api

__all__ = ["ForwardingWork", "RecordingGroup"]

_BACKEND_TYPES = {"gloo": ProcessGroup.BackendType.GLOO, "nccl": ProcessGroup.BackendType.NCCL}


def _opts(opts, cls, field=None):
    """Accept the options object, None, or a bare ReduceOp (the old calling style)."""
    if isinstance(opts, cls):
        return opts
    o = cls()
    if opts is not None and field is not None:
        setattr(o, field, opts)
    return o


def _op_name(op) -> str:
    try:
        return op.op.name if isinstance(op, ReduceOp) else ReduceOp(op).op.name
    except Exception:
        return str(op)


def _forward(rec, fn, args):
    """Call the real backend. What it allocates on this thread (gloo's staging buffers)
    is the backend's, not the program's: the memory tracker and per-operator records skip
    it, as the replayer skips its own work."""
    mode = getattr(rec, "ops_mode", None)
    if mode is None or not mode.enabled:
        return fn(*args)
    mode.enabled = False
    try:
        return fn(*args)
    finally:
        mode.enabled = True


def _flat(lists) -> list:
    return [t for ts in lists for t in ts]


class ForwardingWork(Work):
    """A Work that hands every question to another (the real backend's)."""

    def __init__(self, inner):
        super().__init__()
        self._inner = inner

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        return self._inner.wait(timeout)

    def get_future(self):
        return self._inner.get_future()

    def is_completed(self) -> bool:
        return self._inner.is_completed()

    def is_success(self) -> bool:
        return self._inner.is_success()

    def exception(self):
        return self._inner.exception()

    def source_rank(self) -> int:
        return self._inner.source_rank()

    def _source_rank(self) -> int:
        return self._inner._source_rank()

    def result(self):
        return self._inner.result()

    def synchronize(self):
        return self._inner.synchronize()

    def block_current_stream(self):
        return self._inner.block_current_stream()

    def get_future_result(self):
        return self._inner.get_future_result()


class _TimedWork(ForwardingWork):
    """The real Work, noting completion at wait() (or at its future's callback, if sooner).

    A future callback needs the GIL, which a busy main thread holds for up to the
    switch interval (5 ms), so a blocking call's completion is taken where wait()
    returns; an async call's at whichever comes first. Either way the record, which
    reads the outputs, is written here, where the program's wait() returns and its
    outputs are alive and final (a callback only notes the time).
    """

    def __init__(self, inner, rec, call, anysource_group=None):
        super().__init__(inner)
        self._rec = rec
        self._call = call
        self._anysource = anysource_group

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        try:
            ok = self._inner.wait(timeout)
        except BaseException as exc:
            self._rec.complete(self._call, exc)
            self._rec.write_finished(self._call)
            raise
        call = self._call
        if not call.done:
            peer = None
            if self._anysource is not None:
                try:
                    peer = self._anysource._count_anysource(self._inner._source_rank(), call)
                except Exception:
                    peer = None
            self._rec.complete(call, None, peer)
        elif not call.written:
            self._rec.write_finished(call)
        self._rec.settle(call)
        return ok


class _JoinedWork(Work):
    """Several real works that make one recorded call (coalesced ops looped on gloo)."""

    def __init__(self, works):
        super().__init__()
        self._works = works
        self._future = None

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        for w in self._works:
            w.wait(timeout)
        return True

    def get_future(self):
        if self._future is None:
            self._future = torch.futures.collect_all([w.get_future() for w in self._works])
        return self._future

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)


def _join(works):
    if len(works) == 1:
        return works[0]
    try:
        futs = [w.get_future() for w in works]
    except RuntimeError:
        return _JoinedWork(works)
    return _create_work_from_future(torch.futures.collect_all(futs))


class RecordingGroup(ProcessGroup):
    """A process group that forwards to `real` and records every call in `rec`."""

    def __init__(self, real: dict, rank: int, size: int, *, gid: int, ranks, rec):
        super().__init__(rank, size)
        self._real_by_device = real  # device type -> real Backend
        self._real = next(iter(real.values()))
        self._rank = rank
        self._size = size
        self._gid = gid
        self._ranks = tuple(ranks)  # group rank -> global rank
        self._peer_map = {g: i for i, g in enumerate(self._ranks)}
        self._rec = rec
        self._seq = 0
        self._p2p_seq: dict[tuple[str, int], int] = {}
        self._name = ""
        self._desc = ""
        # C++ code that asks for the backend by type (DDP's logger, ...) finds the real
        # one. Calls it makes there bypass us; the tests check no collective does.
        for device, backend in real.items():
            kind = _BACKEND_TYPES.get(backend.name())
            if kind is not None:
                self._register_backend(torch.device(device), kind, backend)
        kind = _BACKEND_TYPES.get(self._real.name())
        if kind is not None:
            self._set_default_backend(kind)

    # --- identity -----------------------------------------------------------------

    def getBackendName(self) -> str:
        return self._real.name()

    def getRank(self) -> int:
        return self._rank

    def getSize(self) -> int:
        return self._size

    def getGroupName(self) -> str:
        return self._name

    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupDesc(self) -> str:
        return self._desc

    def setGroupDesc(self, desc: str) -> None:
        self._desc = desc

    @property
    def group_name(self) -> str:
        return self._name

    @property
    def group_desc(self) -> str:
        return self._desc

    def name(self) -> str:
        return self._real.name()

    def abort(self) -> None:
        for b in self._real_by_device.values():
            if hasattr(b, "abort"):
                b.abort()

    def shutdown(self) -> None:
        for b in self._real_by_device.values():
            if hasattr(b, "shutdown"):
                b.shutdown()

    def _backend_for(self, tensors):
        if len(self._real_by_device) > 1 and tensors:
            return self._real_by_device.get(tensors[0].device.type, self._real)
        return self._real

    # --- the generic path ---------------------------------------------------------

    def _collective(self, op, ins, outs, fn, args, *, reduce_op=None, root=None, async_op=False):
        seq = self._seq
        self._seq = seq + 1
        rec = self._rec
        if not rec.active:
            return _forward(rec, fn, args)
        call = rec.enter(op, self._gid, seq, ins, outs, reduce_op=reduce_op, root=root, async_op=async_op)
        if call is None:
            return _forward(rec, fn, args)
        try:
            work = _forward(rec, fn, args)
        except BaseException as exc:
            rec.complete(call, exc)
            raise
        return self._track(rec, call, work)

    def _track(self, rec, call, work, anysource=False):
        rec.issued(call)
        if anysource:
            return _TimedWork(work, rec, call, anysource_group=self)
        try:
            fut = work.get_future()
        except RuntimeError:  # gloo's send, recv, reduce_scatter_tensor
            fut = None
        if fut is not None:
            call.work = fut
            fut.add_done_callback(lambda f: _done(rec, call, f))
        return _TimedWork(work, rec, call)

    def _p2p(self, op, tensors, group_peer, tag, fn, args):
        peer = self._ranks[group_peer]
        key = (op, peer)
        seq = self._p2p_seq.get(key, 0)
        self._p2p_seq[key] = seq + 1
        rec = self._rec
        if not rec.active:
            return _forward(rec, fn, args)
        async_op = p2p_api(3) not in ("send", "recv")
        name = ("i" + op) if async_op else op
        call = rec.enter(name, self._gid, seq, tensors, tensors, peer=peer, tag=tag,
                         async_op=async_op, p2p=True)
        if call is None:
            return _forward(rec, fn, args)
        try:
            work = _forward(rec, fn, args)
        except BaseException as exc:
            rec.complete(call, exc)
            raise
        return self._track(rec, call, work)

    # --- collectives --------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        opts = _opts(opts, AllreduceOptions, "reduceOp")
        real = self._backend_for(tensors)
        return self._collective("all_reduce", tensors, tensors, real.allreduce, (tensors, opts),
                                reduce_op=_op_name(opts.reduceOp), async_op=opts.asyncOp)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = _opts(opts, AllreduceCoalescedOptions, "reduceOp")
        real = self._backend_for(tensors)
        return self._collective("all_reduce_coalesced", tensors, tensors, real.allreduce_coalesced,
                                (tensors, opts), reduce_op=_op_name(opts.reduceOp), async_op=opts.asyncOp)

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = _opts(opts, AllgatherOptions)
        real = self._backend_for(input_tensors)
        return self._collective("all_gather", input_tensors, _flat(output_tensors), real.allgather,
                                (output_tensors, input_tensors, opts), async_op=opts.asyncOp)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        opts = _opts(opts, AllgatherOptions)
        real = self._backend_for(input_list)
        return self._collective("all_gather_coalesced", input_list, _flat(output_lists),
                                real.allgather_coalesced, (output_lists, input_list, opts),
                                async_op=opts.asyncOp)

    def all_gather_single(self, output, input, opts=None):
        opts = _opts(opts, AllgatherOptions)
        real = self._backend_for([input])
        return self._collective("all_gather_into_tensor", [input], [output], real._allgather_base,
                                (output, input, opts), async_op=opts.asyncOp)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        opts = _opts(opts, AllgatherOptions)
        real = self._backend_for(inputs)
        # Functional collectives come this way with one tensor: record what it means.
        op = "all_gather_into_tensor" if len(inputs) == 1 else "all_gather_into_tensor_coalesced"
        return self._collective(op, inputs, outputs,
                                self._looped, (real._allgather_base, outputs, inputs, opts),
                                async_op=opts.asyncOp)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        opts = _opts(opts, ReduceScatterOptions, "reduceOp")
        real = self._backend_for(output_tensors)
        return self._collective("reduce_scatter", _flat(input_lists), output_tensors, real.reduce_scatter,
                                (output_tensors, input_lists, opts), reduce_op=_op_name(opts.reduceOp),
                                async_op=opts.asyncOp)

    def reduce_scatter_single(self, output, input, opts=None):
        opts = _opts(opts, ReduceScatterOptions, "reduceOp")
        real = self._backend_for([input])
        return self._collective("reduce_scatter_tensor", [input], [output], real._reduce_scatter_base,
                                (output, input, opts), reduce_op=_op_name(opts.reduceOp),
                                async_op=opts.asyncOp)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = _opts(opts, ReduceScatterOptions, "reduceOp")
        real = self._backend_for(inputs)
        op = "reduce_scatter_tensor" if len(inputs) == 1 else "reduce_scatter_tensor_coalesced"
        return self._collective(op, inputs, outputs, self._looped,
                                (real._reduce_scatter_base, outputs, inputs, opts),
                                reduce_op=_op_name(opts.reduceOp), async_op=opts.asyncOp)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    @staticmethod
    def _looped(fn, outputs, inputs, opts):
        return _join([fn(o, i, opts) for o, i in zip(outputs, inputs)])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = _opts(opts, AllToAllOptions)
        real = self._backend_for(input_tensors)
        return self._collective("all_to_all", input_tensors, output_tensors, real.alltoall,
                                (output_tensors, input_tensors, opts), async_op=opts.asyncOp)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = _opts(opts, AllToAllOptions)
        real = self._backend_for([input])
        return self._collective("all_to_all_single", [input], [output], real.alltoall_base,
                                (output, input, output_split_sizes, input_split_sizes, opts),
                                async_op=opts.asyncOp)

    alltoall_base = all_to_all_single

    def broadcast(self, tensors, opts=None):
        opts = _opts(opts, BroadcastOptions, "rootRank")
        real = self._backend_for(tensors)
        return self._collective("broadcast", tensors, tensors, real.broadcast, (tensors, opts),
                                root=self._ranks[opts.rootRank], async_op=opts.asyncOp)

    def reduce(self, tensors, opts=None):
        opts = _opts(opts, ReduceOptions)
        real = self._backend_for(tensors)
        return self._collective("reduce", tensors, tensors, real.reduce, (tensors, opts),
                                reduce_op=_op_name(opts.reduceOp), root=self._ranks[opts.rootRank],
                                async_op=opts.asyncOp)

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = _opts(opts, GatherOptions)
        real = self._backend_for(input_tensors)
        return self._collective("gather", input_tensors, _flat(output_tensors), real.gather,
                                (output_tensors, input_tensors, opts), root=self._ranks[opts.rootRank],
                                async_op=opts.asyncOp)

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = _opts(opts, ScatterOptions)
        real = self._backend_for(output_tensors)
        return self._collective("scatter", _flat(input_tensors), output_tensors, real.scatter,
                                (output_tensors, input_tensors, opts), root=self._ranks[opts.rootRank],
                                async_op=opts.asyncOp)

    def barrier(self, opts=None):
        opts = _opts(opts, BarrierOptions)
        return self._collective("barrier", [], [], self._real.barrier, (opts,), async_op=opts.asyncOp)

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        seq = self._seq
        self._seq = seq + 1
        rec = self._rec
        call = rec.enter("monitored_barrier", self._gid, seq, [], []) if rec.active else None
        try:
            if timeout is None:
                self._real.monitored_barrier(wait_all_ranks=wait_all_ranks)
            else:
                self._real.monitored_barrier(timeout, wait_all_ranks)
        except BaseException as exc:
            if call is not None:
                rec.complete(call, exc)
            raise
        if call is not None:
            rec.issued(call)
            rec.complete(call)

    # --- point to point -----------------------------------------------------------

    def send(self, tensors, dst, tag=0):
        real = self._backend_for(tensors)
        return self._p2p("send", tensors, dst, tag, real.send, (tensors, dst, tag))

    def recv(self, tensors, src, tag=0):
        real = self._backend_for(tensors)
        return self._p2p("recv", tensors, src, tag, real.recv, (tensors, src, tag))

    def recv_anysource(self, tensors, tag=0):
        real = self._backend_for(tensors)
        rec = self._rec
        if not rec.active:
            return _forward(rec, real.recv_anysource, (tensors, tag))
        async_op = p2p_api(2) != "recv"
        # The peer, and so the per-peer sequence number, is known only at completion.
        call = rec.enter("irecv" if async_op else "recv", self._gid, -1, tensors, tensors,
                         peer=None, tag=tag, async_op=async_op, p2p=True)
        if call is None:
            return _forward(rec, real.recv_anysource, (tensors, tag))
        try:
            work = _forward(rec, real.recv_anysource, (tensors, tag))
        except BaseException as exc:
            rec.complete(call, exc)
            raise
        return self._track(rec, call, work, anysource=True)

    def _count_anysource(self, group_src: int, call) -> int:
        peer = self._ranks[group_src]
        key = ("recv", peer)
        call.seq = self._p2p_seq.get(key, 0)
        self._p2p_seq[key] = call.seq + 1
        return peer

    # --- coalescing (the old per-call style: forward to the real backend) ---------

    def _start_coalescing(self, device):
        self._real_by_device.get(torch.device(device).type, self._real)._start_coalescing()

    def _end_coalescing(self, device):
        return self._real_by_device.get(torch.device(device).type, self._real)._end_coalescing()


def _done(rec, call, fut) -> None:
    """A backend thread's future callback: note when, read no tensor (see complete)."""
    error = None
    try:
        fut.value()
    except BaseException as exc:  # the call failed: still record when
        error = exc
    rec.complete(call, error, backend=True)
