"""The one process group: every torch entry point normalised into a `Call` for a policy.

torch reaches a Python ProcessGroup through many entry points (the classic API,
functional collectives, DDP's reducer, FSDP2). Each becomes one `Call`: the op name the
recorder writes, the group id, its sequence number (per group for collectives, per
direction and peer for point-to-point, counted here and nowhere else), inputs, outputs,
reduce op, root, peer, tag, and the real backend's function and arguments. A `Policy`
turns the call into a Work: the recorder's forwards it to the real backend, the
replayer's checks it against a bundle and builds its results. An observer (the
recording), when there is one, sees every call whichever policy runs it, as the same
`Call` object (it keeps its own notes in the call's observer slots):

    observer.live  # False: it looks away from every call now (outside a step window)
    observer.enter(call) -> bool  # False: it looks away from this call
    observer.failed(call, exc)  # the policy raised
    observer.track(call, work, group) -> the Work the program gets
    observer.blocking(call) -> Work  # optional: a blocking call of a forwarding policy
                                     # (a collective, or torch's blocking send or recv),
                                     # entered, run and completed in one step
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

from prism_rr.intercept.stack import blocking_p2p

__all__ = ["Call", "ForwardingWork", "FromPeer", "InterceptGroup", "NoBackend", "Policy", "completed_work",
           "op_names"]

_BACKEND_TYPES = {"gloo": ProcessGroup.BackendType.GLOO, "nccl": ProcessGroup.BackendType.NCCL}


def _opts(opts, cls, field=None):
    """Accept the options object, None, or a bare ReduceOp (the old calling style)."""
    if isinstance(opts, cls):
        return opts
    o = cls()
    if opts is not None and field is not None:
        setattr(o, field, opts)
    return o


_OP_NAMES: dict = {}  # ReduceOp.RedOpType's value -> "SUM", ... (an int hashes for free; the enum does not)
# hash(a ReduceOp) -> its name: a ReduceOp hashes as its RedOpType's value, one C call
# where `.op.value` is two pybind properties (1.5 us a call). Filled only where the hash
# was seen to be that value, so a torch that hashes otherwise takes the long way.
_BY_HASH: dict = {}


def _op_name(op) -> str:
    if type(op) is ReduceOp:
        name = _BY_HASH.get(hash(op))
        if name is not None:
            return name
    try:
        kind = op.op if isinstance(op, ReduceOp) else ReduceOp(op).op
        value = kind.value
        name = _OP_NAMES.get(value)
        if name is None:
            name = _OP_NAMES[value] = kind.name
        if type(op) is ReduceOp and hash(op) == value:
            _BY_HASH[value] = name
        return name
    except Exception:
        return str(op)


def op_names():
    """(the names of ReduceOps by hash, the function that names any op, torch's ReduceOp):
    what the recorder's C path names a reduce op with, as _op_name does."""
    return _BY_HASH, _op_name, ReduceOp


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


class FromPeer(ForwardingWork):
    """A receive's work that names its sender (a receive from any source)."""

    def __init__(self, inner, group_src: int):
        super().__init__(inner)
        self._src = group_src

    def source_rank(self) -> int:
        return self._src

    def _source_rank(self) -> int:
        return self._src


class _SourcedWork(ForwardingWork):
    """A receive from any source that no one records: its sender is counted at wait(), so
    the calls after it keep the sequence numbers production gave them."""

    def __init__(self, inner, group: InterceptGroup):
        super().__init__(inner)
        self._group = group

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        ok = self._inner.wait(timeout)
        group, self._group = self._group, None
        if group is not None:
            try:
                group.sourced(self._inner._source_rank())
            except Exception:
                pass
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


def completed_work(value=None):
    """A Work that is already complete, with `value` as its future's result."""
    fut = torch.futures.Future()
    fut.set_result([] if value is None else value)
    return _create_work_from_future(fut)


class Call:
    """One call of the program on a group, as every entry point is normalised.

    The slots after `args` are the observer's: where it wrote the call (`cid`), when it
    was entered, issued and completed, and what completion brought."""

    __slots__ = ("op", "gid", "seq", "ins", "outs", "fn", "args", "reduce_op", "root", "peer", "tag", "async_op",
                 "p2p", "receives",
                 "cid", "start", "step", "issued", "end", "done", "error", "future", "out_later")

    def __init__(self, op: str, gid: int, seq: int, ins, outs, fn, args, reduce_op=None, root=None, peer=None,
                 tag=0, async_op=False, p2p=False, receives=False):
        self.op = op  # the name the recorder writes (format/ops.py)
        self.gid = gid
        self.seq = seq  # -1: a receive from any source, counted once its sender is known
        self.ins = ins
        self.outs = outs
        self.fn = fn  # the real backend's method, and its arguments
        self.args = args
        self.reduce_op = reduce_op  # its name ("SUM"), or None
        self.root = root  # global rank
        self.peer = peer  # global rank; None: any source
        self.tag = tag
        self.async_op = async_op
        self.p2p = p2p
        self.receives = receives  # a point-to-point receive
        self.cid = -1  # the observer's id of the call; -1: not observed
        self.done = False
        self.future = None  # the real Work's future, polled for completion
        self.out_later = False  # completed on a backend thread: its outputs are read later
        self.error = None


class Policy:
    """What a group does with its calls. This one forwards every call to the real backend."""

    # Every call is only forwarded (`forward`): while no observer looks, the group builds
    # no Call at all (the recorder outside its step window costs a counter and two tests).
    forwards = True

    def forward(self, fn, args):
        return fn(*args)

    def run(self, group: InterceptGroup, call: Call):
        return self.forward(call.fn, call.args)

    def anysource(self, group: InterceptGroup) -> int | None:
        """The group rank a receive from any source takes its message from, when known before
        it arrives; None: the real backend finds out."""
        return None

    def start_coalescing(self, group: InterceptGroup, device) -> None:
        group.backend_for_device(device)._start_coalescing()

    def end_coalescing(self, group: InterceptGroup, device, works: list):
        """`works`: the point-to-point calls made since `start_coalescing`."""
        return group.backend_for_device(device)._end_coalescing()

    def shutdown(self, group: InterceptGroup) -> None:
        for b in group.backends.values():
            if hasattr(b, "shutdown"):
                b.shutdown()

    def abort(self, group: InterceptGroup) -> None:
        for b in group.backends.values():
            if hasattr(b, "abort"):
                b.abort()


class NoBackend:
    """What `InterceptGroup._get_backend` answers for a device type with no real backend:
    it supports nothing optional (splitting, coalescing, time estimates, tensor
    allocation), and every other use says why it fails."""

    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False

    def __init__(self, name: str, device):
        self._name = name
        self._device = device

    def name(self) -> str:
        return self._name

    def supports_tensor_alloc(self, device) -> bool:
        return False

    def _set_sequence_number_for_group(self) -> None:
        pass

    def __getattr__(self, attr):
        raise AttributeError(f"prism-rr: the group has no real backend for {self._device} ({attr})")


class InterceptGroup(ProcessGroup):
    """A process group of `size` (this rank `rank`) that hands every call to `policy`.

    `backends`: device type -> real backend (gloo, NCCL), or a stand-in for one where
    there is none; `ranks`: group rank -> global rank; `gid`: the group's id, counted
    from the world group (0) on by every rank alike."""

    def __init__(self, backends: dict, rank: int, size: int, *, gid: int, ranks, policy: Policy,
                 observer=None, backend_name: str | None = None):
        super().__init__(rank, size)
        self.backends = backends
        self._real = next(iter(backends.values()))
        self._rank = rank
        self._size = size
        self.gid = gid
        self.ranks = tuple(ranks)
        self.position = {g: i for i, g in enumerate(self.ranks)}  # global rank -> group rank
        self.policy = policy
        self.observer = observer
        self._blocking = getattr(observer, "blocking", None)
        # a blocking collective's Call made and run in C (the recorder's, where built)
        self._blocking_collective = getattr(observer, "collective", None)
        self._seq = 0
        self._p2p_seq: dict[tuple[bool, int], int] = {}  # (receives, global peer) -> next seq
        self._coalesced: list | None = None
        self._name = ""
        self._desc = ""
        self.bound_device = None  # init_process_group's device_id (bound_device_id says None)
        self._backend_name = backend_name or self._real.name()
        # C++ code that asks for the backend by type (DDP's logger, ...) finds the real
        # one. Calls it makes there bypass us; the tests check no collective does.
        self._registered = False
        for device, backend in backends.items():
            kind = _BACKEND_TYPES.get(backend.name())
            if kind is not None:
                self._register_backend(torch.device(device), kind, backend)
                self._registered = True
        kind = _BACKEND_TYPES.get(self._real.name())
        if kind is not None:
            self._set_default_backend(kind)

    # --- identity -----------------------------------------------------------------

    def getBackendName(self) -> str:
        # Torch's C++ side (DDP's logger) looks a backend up by this name: only a group
        # with a real backend registered names it.
        return self._backend_name if self._registered else self._real.name()

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
        return self._backend_name

    def abort(self) -> None:
        self.policy.abort(self)

    def shutdown(self) -> None:
        self.policy.shutdown(self)

    # --- what torch's Python side asks of a group -------------------------------------

    def _get_backend(self, device):
        """The backend registered for `device`'s type, or a stand-in where there is none.

        torch asks from Python: `init_process_group(device_id=...)` reads
        `_get_backend(device_id).supports_splitting` of the group it made (ours), and a
        replayed group with virtual members has no real backend to register."""
        try:
            return super()._get_backend(device)
        except RuntimeError:
            return NoBackend(self._backend_name, device)

    @property
    def bound_device_id(self):
        """None, whatever `init_process_group(device_id=...)` bound: torch then makes
        DeviceMesh's sub-groups with `new_group`, which we take, instead of
        `split_group`, which the C++ side would run past us (and which numbers groups
        differently from a CPU run of the same program). The device is kept in
        `bound_device`."""
        return None

    @bound_device_id.setter
    def bound_device_id(self, device) -> None:
        self.bound_device = device

    def split_group(self, *args, **kwargs):
        raise RuntimeError(
            "prism-rr: split_group() of a recorded or replayed group is not supported: its sub-groups "
            "would bypass the recorder; make them with new_group() or a DeviceMesh")

    def backend_for_device(self, device):
        return self.backends.get(torch.device(device).type, self._real)

    def _backend_for(self, tensors):
        if len(self.backends) > 1 and tensors:
            t = tensors[0]
            # (is_cpu first: `device.type` makes its string anew, ~1 us a call)
            return self.backends.get("cpu" if t.is_cpu else t.device.type, self._real)
        return self._real

    # --- the generic path ---------------------------------------------------------

    def _run(self, call: Call):
        observer = self.observer
        if observer is None or not observer.enter(call):
            return self.policy.run(self, call)
        try:
            work = self.policy.run(self, call)
        except BaseException as exc:
            observer.failed(call, exc)
            raise
        return observer.track(call, work, self)

    def _collective(self, op, ins, outs, fn, args, *, reduce_op=None, root=None, async_op=False):
        seq = self._seq
        self._seq = seq + 1
        observer = self.observer
        policy = self.policy
        if policy.forwards:
            if observer is None or not observer.live:
                return policy.forward(fn, args)
            if not async_op and self._blocking is not None:
                fast = self._blocking_collective
                if fast is not None:
                    return fast(op, self.gid, seq, ins, outs, fn, args, reduce_op, root)
                return self._blocking(Call(op, self.gid, seq, ins, outs, fn, args,
                                           None if reduce_op is None else _op_name(reduce_op), root))
        # `reduce_op`: the options' ReduceOp, named only for a call that is built
        return self._run(Call(op, self.gid, seq, ins, outs, fn, args,
                              None if reduce_op is None else _op_name(reduce_op), root, async_op=async_op))

    def _p2p(self, receives, tensors, group_peer, tag, fn, args):
        """`send`, `recv` and a receive whose sender is known: called by them (the frame
        depth tells torch's blocking send and recv from isend and irecv)."""
        peer = self.ranks[group_peer]
        key = (receives, peer)
        seq = self._p2p_seq.get(key, 0)
        self._p2p_seq[key] = seq + 1
        policy = self.policy
        observer = self.observer
        if policy.forwards and (observer is None or not observer.live):
            work = policy.forward(fn, args)
        else:
            async_op = not blocking_p2p(3)
            op = ("irecv" if async_op else "recv") if receives else ("isend" if async_op else "send")
            call = Call(op, self.gid, seq, tensors, tensors, fn, args, None, None, peer, tag, async_op, True, receives)
            if not async_op and policy.forwards and self._blocking is not None and self._coalesced is None:
                # torch's send or recv, which waits for the Work as soon as it has it
                return self._blocking(call)
            work = self._run(call)
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    def next_p2p_seq(self, receives: bool, peer: int) -> int:
        """The sequence number the next message with global rank `peer` will have."""
        return self._p2p_seq.get((receives, peer), 0)

    def skip_to(self, seq: int, receives: bool | None = None, peer: int | None = None) -> None:
        """Number the next collective (with `receives` and `peer`: the next message that
        way with `peer`) `seq`, where it would be lower: a replay whose program is the
        bundle makes only the recorded calls, and a recording's window (or a ring) begins
        after calls it does not hold. Never backwards."""
        if receives is None:
            self._seq = max(self._seq, seq)
        else:
            key = (receives, peer)
            self._p2p_seq[key] = max(self._p2p_seq.get(key, 0), seq)

    def sourced(self, group_src: int) -> tuple[int, int]:
        """A receive from any source learnt its sender: count it as `_p2p` would have;
        (global peer, seq)."""
        peer = self.ranks[group_src]
        key = (True, peer)
        seq = self._p2p_seq.get(key, 0)
        self._p2p_seq[key] = seq + 1
        return peer, seq

    # --- collectives --------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        opts = _opts(opts, AllreduceOptions, "reduceOp")
        real = self._backend_for(tensors)
        return self._collective("all_reduce", tensors, tensors, real.allreduce, (tensors, opts),
                                reduce_op=opts.reduceOp, async_op=opts.asyncOp)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = _opts(opts, AllreduceCoalescedOptions, "reduceOp")
        real = self._backend_for(tensors)
        return self._collective("all_reduce_coalesced", tensors, tensors, real.allreduce_coalesced,
                                (tensors, opts), reduce_op=opts.reduceOp, async_op=opts.asyncOp)

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
                                (output_tensors, input_lists, opts), reduce_op=opts.reduceOp,
                                async_op=opts.asyncOp)

    def reduce_scatter_single(self, output, input, opts=None):
        opts = _opts(opts, ReduceScatterOptions, "reduceOp")
        real = self._backend_for([input])
        return self._collective("reduce_scatter_tensor", [input], [output], real._reduce_scatter_base,
                                (output, input, opts), reduce_op=opts.reduceOp,
                                async_op=opts.asyncOp)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = _opts(opts, ReduceScatterOptions, "reduceOp")
        real = self._backend_for(inputs)
        op = "reduce_scatter_tensor" if len(inputs) == 1 else "reduce_scatter_tensor_coalesced"
        return self._collective(op, inputs, outputs, self._looped,
                                (real._reduce_scatter_base, outputs, inputs, opts),
                                reduce_op=opts.reduceOp, async_op=opts.asyncOp)

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
                                root=self.ranks[opts.rootRank], async_op=opts.asyncOp)

    def reduce(self, tensors, opts=None):
        opts = _opts(opts, ReduceOptions)
        real = self._backend_for(tensors)
        return self._collective("reduce", tensors, tensors, real.reduce, (tensors, opts),
                                reduce_op=opts.reduceOp, root=self.ranks[opts.rootRank],
                                async_op=opts.asyncOp)

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = _opts(opts, GatherOptions)
        real = self._backend_for(input_tensors)
        return self._collective("gather", input_tensors, _flat(output_tensors), real.gather,
                                (output_tensors, input_tensors, opts), root=self.ranks[opts.rootRank],
                                async_op=opts.asyncOp)

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = _opts(opts, ScatterOptions)
        real = self._backend_for(output_tensors)
        return self._collective("scatter", _flat(input_tensors), output_tensors, real.scatter,
                                (output_tensors, input_tensors, opts), root=self.ranks[opts.rootRank],
                                async_op=opts.asyncOp)

    def barrier(self, opts=None):
        opts = _opts(opts, BarrierOptions)
        return self._collective("barrier", [], [], self._real.barrier, (opts,), async_op=opts.asyncOp)

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        real = self._real

        def barrier():
            if timeout is None:
                real.monitored_barrier(wait_all_ranks=wait_all_ranks)
            else:
                real.monitored_barrier(timeout, wait_all_ranks)
            return completed_work()

        self._collective("monitored_barrier", [], [], barrier, ()).wait()

    # --- point to point -----------------------------------------------------------

    # torch's blocking send and recv call isend and irecv, which reach the group: the
    # caller's frames say which the program used (stack.blocking_p2p).

    def send(self, tensors, dst, tag=0):
        real = self._backend_for(tensors)
        return self._p2p(False, tensors, dst, tag, real.send, (tensors, dst, tag))

    def recv(self, tensors, src, tag=0):
        real = self._backend_for(tensors)
        return self._p2p(True, tensors, src, tag, real.recv, (tensors, src, tag))

    def recv_anysource(self, tensors, tag=0):
        real = self._backend_for(tensors)
        src = self.policy.anysource(self)
        if src is not None:
            return FromPeer(self._p2p(True, tensors, src, tag, real.recv, (tensors, src, tag)), src)
        policy = self.policy
        observer = self.observer
        if policy.forwards and (observer is None or not observer.live):
            return _SourcedWork(policy.forward(real.recv_anysource, (tensors, tag)), self)
        async_op = not blocking_p2p(2)
        op = "irecv" if async_op else "recv"
        # The peer, and so the per-peer sequence number, is known only at completion (`sourced`).
        return self._run(Call(op, self.gid, -1, tensors, tensors, real.recv_anysource, (tensors, tag), None, None,
                              None, tag, async_op, True, True))

    # --- coalescing (the old per-call style) ----------------------------------------

    def _start_coalescing(self, device):
        self._coalesced = []
        self.policy.start_coalescing(self, device)

    def _end_coalescing(self, device):
        works, self._coalesced = self._coalesced or [], None
        return self.policy.end_coalescing(self, device, works)
