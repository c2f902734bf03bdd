"""Outputs built from members in parts (a role's thousands of replicas) equal those built
member by member, and the timing model keeps one state per part."""

import pytest
import torch

from prism_rr.format import ops
from prism_rr.format.records import Collective
from prism_rr.replayer._data import build_grouped, build_outputs
from prism_rr.replayer._timing import PeerClock

N, ME = 6, 1
# parts: this rank, a "real" peer with its own data, a role of replicas, a role with recorded data
_POS = [[ME], [0], [2, 4, 5], [3]]


def _parts(ins_fn):
    g = torch.Generator().manual_seed(0)
    own = ins_fn(g)
    return own, [(_POS[0], own), (_POS[1], ins_fn(g)), (_POS[2], None), (_POS[3], ins_fn(g))]


def _contrib(parts):
    c = [None] * N
    for pos, t in parts:
        for j in pos:
            c[j] = t
    return c


_CASES = [
    ("all_reduce", "SUM", lambda g: [torch.randn(3, 4, generator=g)], lambda: [torch.empty(3, 4)]),
    ("all_reduce", "AVG", lambda g: [torch.randn(5, generator=g)], lambda: [torch.empty(5)]),
    ("all_reduce", "MAX", lambda g: [torch.randn(5, generator=g)], lambda: [torch.empty(5)]),
    ("all_reduce", "PRODUCT", lambda g: [torch.rand(5, generator=g) + 0.5], lambda: [torch.empty(5)]),
    ("all_reduce", "BXOR", lambda g: [torch.randint(0, 99, (5,), generator=g)],
     lambda: [torch.empty(5, dtype=torch.int64)]),
    ("all_gather_into_tensor", None, lambda g: [torch.randn(7, generator=g)], lambda: [torch.empty(7 * N)]),
    ("all_gather", None, lambda g: [torch.randn(2, generator=g)], lambda: [torch.empty(2) for _ in range(N)]),
    ("reduce_scatter_tensor", "SUM", lambda g: [torch.randn(4 * N, generator=g)], lambda: [torch.empty(4)]),
    ("reduce_scatter", "SUM", lambda g: [torch.randn(3, generator=g) for _ in range(N)], lambda: [torch.empty(3)]),
    ("broadcast", None, lambda g: [torch.randn(3, generator=g)], lambda: [torch.empty(3)]),
    ("all_to_all", None, lambda g: [torch.randn(2, generator=g) for _ in range(N)],
     lambda: [torch.empty(2) for _ in range(N)]),
    # the other ops of the table, one at least per form
    ("all_reduce_coalesced", "SUM", lambda g: [torch.randn(3, generator=g), torch.randn(2, generator=g)],
     lambda: [torch.empty(3), torch.empty(2)]),
    ("all_gather_coalesced", None, lambda g: [torch.randn(2, generator=g), torch.randn(3, generator=g)],
     lambda: [torch.empty(2 if i % 2 == 0 else 3) for i in range(2 * N)]),
    ("all_gather_into_tensor_coalesced", None, lambda g: [torch.randn(3, generator=g), torch.randn(2, generator=g)],
     lambda: [torch.empty(3 * N), torch.empty(2 * N)]),
    ("reduce_scatter_tensor_coalesced", "SUM", lambda g: [torch.randn(2 * N, generator=g)] * 2,
     lambda: [torch.empty(2), torch.empty(2)]),
    ("all_to_all_single", None, lambda g: [torch.randn(N, 3, generator=g)], lambda: [torch.empty(N, 3)]),
    ("reduce", "SUM", lambda g: [torch.randn(4, generator=g)], lambda: [torch.empty(4)]),
    ("gather", None, lambda g: [torch.randn(2, generator=g)], lambda: [torch.empty(2) for _ in range(N)]),
    ("scatter", None, lambda g: [torch.randn(2, generator=g) for _ in range(N)], lambda: [torch.empty(2)]),
    ("barrier", None, lambda g: [], lambda: []),
    ("monitored_barrier", None, lambda g: [], lambda: []),
]


@pytest.mark.parametrize("op,reduce_op,ins_fn,outs_fn", _CASES)
def test_grouped_outputs_equal_member_by_member(op, reduce_op, ins_fn, outs_fn):
    own, parts = _parts(ins_fn)
    # a replica broadcasts what this rank holds; this rank is the root that reduces and gathers
    root = {"broadcast": 4, "reduce": ME, "gather": ME, "scatter": 0}.get(op)
    want, got = outs_fn(), outs_fn()
    build_outputs(op, ME, N, own, want, _contrib(parts), reduce_op=reduce_op, root=root)
    build_grouped(op, ME, N, own, got, parts, reduce_op=reduce_op, root=root)
    for a, b in zip(want, got):
        torch.testing.assert_close(b, a)


def test_every_collective_of_the_table_has_a_rule():
    """build_outputs fills every collective form; a send or an unknown op is refused."""
    forms = {op.form for op in ops.OPS.values() if not op.p2p}
    tested = {ops.lookup(case[0]).form for case in _CASES}
    assert forms <= tested, forms - tested
    for name in [n for n, op in ops.OPS.items() if op.p2p] + ["frobnicate"]:
        with pytest.raises(ValueError, match="no virtual-member rule"):
            build_outputs(name, ME, N, [], [], [None] * N)
        with pytest.raises(ValueError, match="no virtual-member rule"):
            build_grouped(name, ME, N, [], [], [(list(range(N)), None)])


def _c(start, end, seq=0):
    return Collective(start_ns=start, end_ns=end, step=0, op="all_reduce", group=0, seq=seq)


def test_one_clock_state_per_role_and_pure_transfer():
    clock = PeerClock(0, {}, pure_transfer=True)
    clock.anchor(1_000, _c(0, 10))
    first = _c(100, 150)
    e = clock.entry("r0", first, 0)
    assert e == 1_100
    done = clock.completion({0: _c(0, 10), "r0": first}, {0: 1_000, "r0": e}, {"r0": 0})
    assert done == {0: 1_110, "r0": 1_150}  # latest entry + each record's own span
    clock.completed("r0", first, e, done["r0"])
    assert clock.entry("r0", _c(400, 450, seq=1), 0) == 1_150 + 250
    assert set(clock._resume) == {"r0"}  # one state for the whole role
