"""InterceptGroup: every entry point becomes one Call, numbered in one place, for a policy."""

import torch
from torch._C._distributed_c10d import AllreduceOptions, BroadcastOptions, ReduceOp

from prism_rr.format import ops
from prism_rr.intercept.group import InterceptGroup, Policy, completed_work


class _Backend:
    """No real backend: the policies below never forward."""

    def name(self) -> str:
        return "none"

    def __getattr__(self, attr):
        return lambda *args: None


class _Keep(Policy):
    forwards = False  # it handles every call itself

    def __init__(self):
        self.calls = []

    def run(self, group, call):
        self.calls.append(call)
        return completed_work(call.outs)


class _Observer:
    live = True

    def __init__(self):
        self.seen, self.tracked = [], []

    def enter(self, call):
        self.seen.append(call.op)
        return call

    def failed(self, token, exc):
        raise AssertionError(exc)

    def track(self, token, work, group):
        self.tracked.append(token)
        return work


def _group(observer=None):
    policy = _Keep()
    # group rank 1 of 3; global ranks 4, 5, 6
    return InterceptGroup({"cpu": _Backend()}, 1, 3, gid=2, ranks=[4, 5, 6], policy=policy,
                          observer=observer), policy


def test_collectives_are_numbered_per_group_with_the_recorders_names():
    group, policy = _group()
    x = torch.ones(4)
    opts = AllreduceOptions()
    opts.reduceOp = ReduceOp.MAX
    group.allreduce([x], opts).wait()
    b = BroadcastOptions()
    b.rootRank = 2
    group.broadcast([x], b).wait()
    group.barrier().wait()
    group.monitored_barrier()
    names = [c.op for c in policy.calls]
    assert names == ["all_reduce", "broadcast", "barrier", "monitored_barrier"]
    assert all(n in ops.OPS for n in names)
    assert [c.seq for c in policy.calls] == [0, 1, 2, 3] and {c.gid for c in policy.calls} == {2}
    assert policy.calls[0].reduce_op == "MAX" and policy.calls[1].root == 6  # a global rank


def test_point_to_point_is_numbered_per_direction_and_peer():
    group, policy = _group()
    x = torch.ones(2)
    for _ in range(2):
        group.send([x], 0)
    group.recv([x], 0)
    group.send([x], 2)
    got = [(c.op, c.peer, c.seq, c.receives) for c in policy.calls]
    # not called from torch.distributed.send/recv: non-blocking
    assert got == [("isend", 4, 0, False), ("isend", 4, 1, False), ("irecv", 4, 0, True), ("isend", 6, 0, False)]
    assert group.next_p2p_seq(False, 4) == 2 and group.next_p2p_seq(True, 4) == 1
    assert group.sourced(0) == (4, 1) and group.next_p2p_seq(True, 4) == 2


def test_the_observer_sees_every_call_whichever_policy_runs_it():
    observer = _Observer()
    group, policy = _group(observer)
    x = torch.ones(2)
    group.allreduce([x]).wait()
    group.send([x], 0)
    assert observer.seen == ["all_reduce", "isend"] and observer.tracked == policy.calls


def test_coalesced_point_to_point_reaches_the_policy_at_the_end():
    class Coalescing(_Keep):
        def start_coalescing(self, group, device):
            self.started = True

        def end_coalescing(self, group, device, works):
            self.works = works
            return completed_work()

    policy = Coalescing()
    group = InterceptGroup({"cpu": _Backend()}, 0, 2, gid=0, ranks=[0, 1], policy=policy)
    x = torch.ones(2)
    group._start_coalescing(torch.device("cpu"))
    group.send([x], 1)
    group.recv([x], 1)
    group._end_coalescing(torch.device("cpu")).wait()
    assert policy.started and len(policy.works) == 2
    group.send([x], 1)  # outside: not collected
    assert len(policy.works) == 2


def test_a_forwarding_policy_with_no_one_looking_builds_no_call_but_counts():
    """The recorder outside its step window: calls go straight to the real backend, and
    the numbering goes on, so the window's first call has the number production gave it."""

    class Real(_Backend):
        def __init__(self):
            self.called = []

        def __getattr__(self, attr):
            return lambda *args: self.called.append(attr) or completed_work()

    observer = _Observer()
    observer.live = False
    real = Real()
    group = InterceptGroup({"cpu": real}, 0, 2, gid=0, ranks=[0, 1], policy=Policy(), observer=observer)
    x = torch.ones(2)
    group.allreduce([x]).wait()
    group.send([x], 1)
    group.recv([x], 1)
    assert real.called == ["allreduce", "send", "recv"] and observer.seen == []
    observer.live = True
    group.allreduce([x]).wait()
    group.send([x], 1)
    assert observer.seen == ["all_reduce", "isend"]
    assert group.next_p2p_seq(False, 1) == 2 and group.next_p2p_seq(True, 1) == 1


def test_a_receive_from_any_source_no_one_records_still_counts_its_sender():
    from torch._C._distributed_c10d import Work

    class FromRank1(Work):
        def wait(self, timeout=None):
            return True

        def _source_rank(self):
            return 1

    class Real(_Backend):
        def recv_anysource(self, tensors, tag):
            return FromRank1()

    observer = _Observer()
    observer.live = False
    group = InterceptGroup({"cpu": Real()}, 0, 2, gid=0, ranks=[0, 1], policy=Policy(), observer=observer)
    work = group.recv_anysource([torch.ones(2)])
    work.wait()
    work.wait()  # counted once
    assert work._source_rank() == 1 and group.next_p2p_seq(True, 1) == 1


def test_torch_finds_a_stand_in_where_a_group_has_no_real_backend_for_a_device():
    """init_process_group(device_id=cuda) reads `_get_backend(device).supports_splitting` of
    the group it made: a replayed group with virtual members has no real backend there (the
    CUDA path failed on this before it ever ran on a GPU)."""
    group, _ = _group()
    stand_in = group._get_backend(torch.device("cuda", 0))
    assert stand_in.supports_splitting is False and stand_in.supports_coalescing is False
    assert stand_in.name() == "none" and not stand_in.supports_tensor_alloc(torch.device("cuda", 0))
    assert not hasattr(stand_in, "comm_split_count")  # torch probes with hasattr: an AttributeError


def test_a_bound_device_is_kept_but_not_shown_so_device_mesh_makes_groups_we_take():
    """With bound_device_id set, DeviceMesh makes its sub-groups with split_group, in C++,
    past the recorder; None sends it to new_group, which we take, numbered as on CPU."""
    group, _ = _group()
    group.bound_device_id = torch.device("cuda", 0)
    assert group.bound_device_id is None and group.bound_device == torch.device("cuda", 0)
    try:
        group.split_group([0, 1])
    except RuntimeError as exc:
        assert "split_group" in str(exc) and "new_group" in str(exc)
    else:
        raise AssertionError("split_group went past the recorder")
