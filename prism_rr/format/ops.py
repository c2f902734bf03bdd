"""The one table of the calls a bundle can name: every op name the recorder writes, and
what each means to the code that reads records (matching, cost model, scale, replay,
terminal UI). No other module keeps a list of op names: it asks this table.

An op's
- `family`: how it moves bytes. The cost model's algorithm factor and latency steps,
  the TUI's colours and `scale`'s size rules are per family.
- `form`: how its outputs follow from the members' inputs (below), which `scale` and
  the replay use to size and fill them.
- `same`: what every member of one call must pass alike: "in" (its inputs' shapes and
  dtypes), "out" (its outputs': scatter, where only the root has inputs), or None (an
  all_to_all's splits differ by rank).
- `p2p`: a point-to-point call (PointToPoint record), not a collective.

Forms, one per way of filling the outputs from the members' inputs:
- "reduce_all": every output is the reduction of the members' inputs (all_reduce);
- "reduce_root": the same, at the root only (reduce);
- "copy_root": every output is the root's input (broadcast);
- "gather_list": one output per member and input, input-major (all_gather);
- "gather_list_by_rank": the same, rank-major (all_gather_coalesced);
- "gather_root": one output per member, at the root only (gather);
- "gather_tensor": one output per input, the members' inputs end to end;
- "reduce_scatter_list": one input per member; this rank's output is their reduction;
- "reduce_scatter_tensor": one input, n outputs' worth, reduced and split;
- "scatter_root": the root's inputs, one per member (scatter);
- "all_to_all": a list each way; "all_to_all_single": one tensor each way, split by rows;
- "none": no tensors (barriers); "p2p": a send or a receive.
"""

from __future__ import annotations

from math import ceil, log2
from typing import NamedTuple

__all__ = [
    "BACKEND_NAMES", "FAMILIES", "FAMILY_NAMES", "FORMS", "FR_ALIASES", "FR_SEQS", "OPS", "Op", "algorithm_factor", "family",
    "from_backend", "is_p2p", "joined", "latency_steps", "lookup", "receives", "shard_side",
]


class Op(NamedTuple):
    name: str
    family: str
    form: str
    same: str | None
    p2p: bool = False


# Families, in the order the TUI's legend lists them, with the names people read there.
FAMILY_NAMES = {
    "all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
    "all_to_all": "all_to_all", "broadcast": "broadcast/reduce", "gather_scatter": "gather/scatter",
    "barrier": "barrier", "p2p": "send/recv",
}
FAMILIES = tuple(FAMILY_NAMES)
# Forms, as the module's docstring lists them.
FORMS = (
    "reduce_all", "reduce_root", "copy_root", "gather_list", "gather_list_by_rank", "gather_root",
    "gather_tensor", "reduce_scatter_list", "reduce_scatter_tensor", "scatter_root", "all_to_all",
    "all_to_all_single", "none", "p2p",
)

# Per form, the side that holds one member's share, the other side holding all n shares:
# a gather's input, a scatter's output.
_SHARD_SIDE = {
    "gather_list": "in", "gather_list_by_rank": "in", "gather_root": "in", "gather_tensor": "in",
    "reduce_scatter_list": "out", "reduce_scatter_tensor": "out", "scatter_root": "out",
}


def shard_side(form: str) -> str | None:
    """"in" or "out": the side of a call of this form that holds one member's share (the
    other side holds n of them, as a list or, where `joined`, end to end); else None."""
    return _SHARD_SIDE.get(form)


def joined(form: str) -> bool:
    """Whether the n shares of this form are one tensor end to end (the *_tensor forms),
    rather than a list of n tensors."""
    return form in ("gather_tensor", "reduce_scatter_tensor")


OPS: dict[str, Op] = {o.name: o for o in (
    Op("all_reduce", "all_reduce", "reduce_all", "in"),
    Op("all_reduce_coalesced", "all_reduce", "reduce_all", "in"),
    Op("all_gather", "all_gather", "gather_list", "in"),
    Op("all_gather_coalesced", "all_gather", "gather_list_by_rank", "in"),
    Op("all_gather_into_tensor", "all_gather", "gather_tensor", "in"),
    Op("all_gather_into_tensor_coalesced", "all_gather", "gather_tensor", "in"),
    Op("reduce_scatter", "reduce_scatter", "reduce_scatter_list", "in"),
    Op("reduce_scatter_tensor", "reduce_scatter", "reduce_scatter_tensor", "in"),
    Op("reduce_scatter_tensor_coalesced", "reduce_scatter", "reduce_scatter_tensor", "in"),
    Op("all_to_all", "all_to_all", "all_to_all", None),
    Op("all_to_all_single", "all_to_all", "all_to_all_single", None),
    # a tree from or to one root: broadcast's cost, whatever the reduction
    Op("broadcast", "broadcast", "copy_root", "in"),
    Op("reduce", "broadcast", "reduce_root", "in"),
    Op("gather", "gather_scatter", "gather_root", "in"),
    Op("scatter", "gather_scatter", "scatter_root", "out"),
    Op("barrier", "barrier", "none", "in"),
    Op("monitored_barrier", "barrier", "none", "in"),
    Op("send", "p2p", "p2p", None, True),
    Op("recv", "p2p", "p2p", None, True),
    Op("isend", "p2p", "p2p", None, True),
    Op("irecv", "p2p", "p2p", None, True),
)}


# The names torch's backends and Flight Recorder's profiling names give calls (ProcessGroup
# methods, NCCL's), for the op names records use: what `import fr` reads.
BACKEND_NAMES: dict[str, str] = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce_coalesced",
    "allgather": "all_gather", "_allgather_base": "all_gather_into_tensor",
    "_all_gather_base": "all_gather_into_tensor", "all_gather_single": "all_gather_into_tensor",
    "all_gather_base": "all_gather_into_tensor", "ALLGATHER_coalesced": "all_gather_into_tensor_coalesced",
    "_reduce_scatter_base": "reduce_scatter_tensor", "reduce_scatter_single": "reduce_scatter_tensor",
    "reduce_scatter_base": "reduce_scatter_tensor", "REDUCE_SCATTER_coalesced": "reduce_scatter_tensor_coalesced",
    "alltoall": "all_to_all", "alltoall_base": "all_to_all_single", "all_to_allv": "all_to_all_single",
    "all_to_all_v_single": "all_to_all_single", "_broadcast_oop": "broadcast", "_reduce_oop": "reduce",
    "all_reduce_barrier": "barrier",
}


# Calls a backend's Flight Recorder writes under another op's name, as `import fr` reads
# that entry: gloo records an all_gather_into_tensor as all_gather, a reduce_scatter_tensor
# as the all_reduce it runs, an all_to_all_single as all_to_all and an all_reduce_coalesced
# as all_reduce (measured on torch 2.13). A replay of a dump matches a call to an entry of
# its own name or of one of these.
FR_ALIASES: dict[str, tuple[str, ...]] = {
    "all_gather_into_tensor": ("all_gather",),
    "reduce_scatter_tensor": ("all_reduce",),
    "all_to_all_single": ("all_to_all",),
    "all_reduce_coalesced": ("all_reduce",),
}
# Sequence numbers a call takes in its backend's Flight Recorder, where not one: gloo's
# monitored_barrier takes two and writes no entry (measured on torch 2.13).
FR_SEQS: dict[str, int] = {"monitored_barrier": 2}


def from_backend(name: str) -> str:
    """The op name of records for a backend's name of a call (`allreduce` -> all_reduce);
    a name that is none of those stays as it is."""
    return BACKEND_NAMES.get(name, name)


def lookup(name: str) -> Op | None:
    """The op called `name`, or None for a name this version does not know (a bundle
    from a newer recorder, or a stranger's)."""
    return OPS.get(name)


def family(name: str) -> str:
    """The family of op `name`; an unknown op is a family of its own."""
    op = OPS.get(name)
    return op.family if op is not None else name


def is_p2p(name: str) -> bool:
    """Whether op `name` is a point-to-point call (a send or a receive)."""
    op = OPS.get(name)
    return op is not None and op.p2p


_RECEIVES = frozenset({"recv", "irecv"})


def receives(name: str) -> bool:
    """Whether op `name` is a receive, blocking or not."""
    return name in _RECEIVES


def algorithm_factor(fam: str, n: int) -> float:
    """f(n): how the bandwidth term of one family grows with the group size."""
    if n <= 1:
        return 0.0 if fam != "p2p" else 1.0
    if fam == "all_reduce":
        return 2.0 * (n - 1) / n
    if fam in ("all_gather", "reduce_scatter", "all_to_all", "gather_scatter"):
        return (n - 1) / n
    if fam == "broadcast":
        return float(max(1, ceil(log2(n))))
    if fam == "barrier":
        return 0.0
    return 1.0  # p2p and anything unknown: bytes cross once


def latency_steps(fam: str, n: int) -> float:
    """Sequential message steps of the algorithm (the textbook alpha-beta model): ring
    all_reduce 2(n-1); ring all_gather, reduce_scatter, all_to_all, gather, scatter n-1;
    tree broadcast, reduce, barrier ceil(log2 n); p2p 1."""
    if n <= 1:
        return 1.0
    if fam == "all_reduce":
        return 2.0 * (n - 1)
    if fam in ("all_gather", "reduce_scatter", "all_to_all", "gather_scatter"):
        return float(n - 1)
    if fam in ("broadcast", "barrier"):
        return float(max(1, ceil(log2(n))))
    return 1.0
