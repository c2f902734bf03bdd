"""What a divergence is: the one rule that replay, `tui --compare` and `diff` decide by.

A call diverges from the recorded one when it is another kind of call (collective or
point-to-point) or another op, or differs in what makes it the same call on the same
rank: the shapes and dtypes its members must agree on (for an op whose members may pass
different shapes, all_to_all and ops this version does not know, both its inputs' and its
outputs'), its reduce op and root, a point-to-point call's peer and tag; and, only where
the replay ran on the recorded data up to that call, its input data (digests or payload
ids, where both sides hold them). Timing never counts.

Why data counts only so far: a replay whose virtual peers' contributions were not
recorded (`--payload digest`, say) makes them up, and from that call on the real rank
computes on other numbers; its digests part from the recording's as they must, and that
is no divergence. The replay knows when it made data up and says so in its own recording
(`replay -o`: the run facts' `replay_of.data_made_up_from_ns`, each real rank's monotonic
time of the first call whose result it made up), so that `tui --compare` and `diff`
compare data where the replay itself did, and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prism_rr.format import ops
from prism_rr.format.reader import Bundle
from prism_rr.format.records import Collective, PointToPoint
from prism_rr.text import shown

__all__ = ["CallDivergence", "call_divergence", "call_divergences", "call_structure", "data_checked",
           "replay_data", "structure_of"]

Call = Collective | PointToPoint

# The fields that make a call the same call on the same rank, in the order a difference is
# named; a collective's per `ops` table's `same` (see structure_of).
_SIDES = {"in": ("in_shapes", "in_dtypes"), "out": ("out_shapes", "out_dtypes"),
          None: ("in_shapes", "in_dtypes", "out_shapes", "out_dtypes")}
_P2P_FIELDS = ("op", "peer", "tag", "shapes", "dtypes")
# Input data: a digest of each tensor, or each tensor's payload id. A receive's data is
# what its peer sent: the sender's side is where it is checked.
_DATA = {Collective: ("digest_in", "blob_in"), PointToPoint: ("digest", "blob")}
_TOPICS = {"in_shapes": "shapes", "out_shapes": "shapes", "in_dtypes": "dtypes", "out_dtypes": "dtypes",
           "digest_in": "data", "blob_in": "data", "digest": "data", "blob": "data"}


@dataclass(frozen=True, slots=True, kw_only=True)
class CallDivergence:
    """How a replayed (or other) call differs from the recorded one: the first field."""

    field: str  # the record's field: "kind", "op", "in_shapes", ..., "digest_in", "blob"
    expected: Any  # the recorded call's value
    got: Any  # the other call's

    @property
    def topic(self) -> str:
        """What differs, in the words `diff` lists: kind, op, shapes, dtypes, reduce_op,
        root, peer, tag or data."""
        return _TOPICS.get(self.field, self.field)

    def text(self) -> str:
        """In words, safe for a terminal: `in_shapes: recorded ((3,),), replayed ((4,),)`."""
        return f"{self.field}: recorded {_value(self.field, self.expected)}, replayed {_value(self.field, self.got)}"


def _value(field: str, v: Any) -> str:
    if _TOPICS.get(field) == "data" and v is not None:
        return "[" + ", ".join(x.hex() if isinstance(x, bytes) else f"{x:016x}" for x in v) + "]"
    return shown(v)


def _fields(call: Call) -> tuple[str, ...]:
    if type(call) is PointToPoint:
        return _P2P_FIELDS
    known = ops.lookup(call.op)
    return ("op", *_SIDES[known.same if known is not None else None], "reduce_op", "root")


def _data_compared(call: Call) -> tuple[str, ...]:
    if type(call) is PointToPoint and ops.receives(call.op):
        return ()
    return _DATA[type(call)]


def call_divergences(recorded: Call, other: Call, *, data: bool = False,
                     shapes: bool = True) -> list[CallDivergence]:
    """Every field in which `other` differs from `recorded` (see the module's rule), in
    order; empty when they are the same call. `data`: compare input data too (where the
    replay ran on the recorded data); `shapes` False: leave shapes out (`scale` predicted
    them: the live ones stand)."""
    if type(recorded) is not type(other):
        return [CallDivergence(field="kind", expected=type(recorded).__name__, got=type(other).__name__)]
    out = []
    for name in _fields(recorded):
        if not shapes and name.endswith("shapes"):
            continue
        a, b = getattr(recorded, name), getattr(other, name)
        if a != b:
            out.append(CallDivergence(field=name, expected=a, got=b))
    if data:
        for name in _data_compared(recorded):
            a, b = getattr(recorded, name), getattr(other, name)
            if a is not None and b is not None and tuple(a) != tuple(b):
                out.append(CallDivergence(field=name, expected=a, got=b))
    return out


def call_divergence(recorded: Call, other: Call, *, data: bool = False,
                    shapes: bool = True) -> CallDivergence | None:
    """The first field in which `other` differs from `recorded`, or None: what replay
    stops at, `tui --compare` names and `diff` counts (see `call_divergences`)."""
    found = call_divergences(recorded, other, data=data, shapes=shapes)
    return found[0] if found else None


def structure_of(op: str, in_shapes, in_dtypes, out_shapes, out_dtypes, reduce_op, root) -> tuple:
    """A collective's fields that `call_divergence` compares without data, as one value:
    two collectives of one op are the same call exactly when these are equal (what `diff`
    compares a million calls by, as interned ids)."""
    known = ops.lookup(op)
    same = known.same if known is not None else None
    if same == "in":
        return (op, in_shapes, in_dtypes, reduce_op, root)
    if same == "out":
        return (op, out_shapes, out_dtypes, reduce_op, root)
    return (op, (in_shapes, out_shapes), (in_dtypes, out_dtypes), reduce_op, root)


def call_structure(call: Call) -> tuple:
    """`structure_of` a collective, or a point-to-point call's op, peer, tag, shapes and
    dtypes: equal exactly when `call_divergence(a, b)` (without data) is None."""
    if type(call) is Collective:
        return ("collective", *structure_of(call.op, call.in_shapes, call.in_dtypes, call.out_shapes,
                                            call.out_dtypes, call.reduce_op, call.root))
    return ("p2p", call.op, call.peer, call.tag, call.shapes, call.dtypes)


def replay_data(recorded: Bundle, replayed: Bundle) -> dict[int, int | None]:
    """Where `replayed` is the recording of a replay of `recorded` (`replay -o`): for each
    real rank, the monotonic time (ns, the replayed process's clock, as its records' times)
    from which the replay made its data up, None where it ran on the recorded data
    throughout. Empty for any other pair: data is then never compared."""
    run = replayed.manifest.get("run")
    of = run.get("replay_of") if type(run) is dict else None
    if type(of) is not dict or type(of.get("bundle")) is not str:
        return {}
    if of["bundle"].replace("\\", "/").rsplit("/", 1)[-1] != recorded.path.name:
        return {}
    made_up = of.get("data_made_up_from_ns")
    if type(made_up) is not dict:
        return {}  # a replay that does not say: its data may be made up anywhere
    out: dict[int, int | None] = {}
    for rank, t in made_up.items():
        if type(rank) is str and rank.isdigit() and (t is None or type(t) is int):
            out[int(rank)] = t
    return out


def data_checked(made_up: dict[int, int | None], rank: int, call: Call) -> bool:
    """Whether the replay compared `call`'s data (a call of its own recording, made on
    `rank`): it ran on the recorded data when it made it (see `replay_data`)."""
    if rank not in made_up:
        return False
    t = made_up[rank]
    return t is None or call.start_ns < t
