"""The event records a rank writes, and their wire keys (FORMAT.md, "Records").

Every record is a frozen, slotted, keyword-only dataclass. On the wire each field has a
small integer key that is never reused; readers ignore keys they do not know.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar, Union

__all__ = [
    "Collective",
    "Compute",
    "DeviceTime",
    "GroupInfo",
    "Marker",
    "Memory",
    "PointToPoint",
    "RECORD_TYPES",
    "Record",
    "Shape",
    "Step",
]

Shape = tuple[int, ...]

# Wire keys of record fields. Never renumber, never reuse a retired key.
K_START = 1  # delta-coded within a chunk's table
K_END = 2  # stored as end - start; nil means the call never completed
K_STEP = 3
K_OP = 4
K_GROUP = 5
K_SEQ = 6
K_IN_SHAPES = 7
K_IN_DTYPES = 8
K_IN_BYTES = 9
K_OUT_SHAPES = 10
K_OUT_DTYPES = 11
K_OUT_BYTES = 12
K_REDUCE_OP = 13
K_PEER = 14
K_TAG = 15
K_ASYNC = 16
K_DIGEST_IN = 17
K_DIGEST_OUT = 18
K_BLOB_IN = 19
K_BLOB_OUT = 20
K_MEM_ALLOC = 21
K_MEM_PEAK = 22
K_NAME = 23
K_VALUE = 24
K_TEXT = 25
K_STACK = 26
K_RANKS = 27
K_ISSUED = 28  # when the call returned to its caller (async ops)
K_BACKEND = 29
K_DEV_START = 30  # device times: ns from the rank's device epoch (FORMAT.md, "Device time")
K_DEV_END = 31
K_DEV_WAIT = 32
K_DEV_DURATION = 33


@dataclass(frozen=True, slots=True, kw_only=True)
class Collective:
    """One collective call on one rank: all_reduce, all_gather, barrier, ..."""

    KIND: ClassVar[int] = 1
    start_ns: int
    end_ns: int | None  # None: entered and never completed (a hang)
    step: int
    op: str
    group: int
    seq: int
    in_shapes: tuple[Shape, ...] = ()
    in_dtypes: tuple[str, ...] = ()
    in_bytes: int = 0
    out_shapes: tuple[Shape, ...] = ()
    out_dtypes: tuple[str, ...] = ()
    out_bytes: int = 0
    reduce_op: str | None = None
    root: int | None = None  # global rank of the root, where the op has one
    async_op: bool = False
    issued_ns: int | None = None  # when the call returned to the caller
    digest_in: tuple[int, ...] | None = None  # one 64-bit digest per tensor
    digest_out: tuple[int, ...] | None = None
    blob_in: tuple[bytes, ...] | None = None  # content ids of full payloads
    blob_out: tuple[bytes, ...] | None = None
    mem_alloc: int | None = None
    mem_peak: int | None = None
    stack: tuple[str, ...] | None = None

    WIRE: ClassVar[tuple[tuple[str, int], ...]]


@dataclass(frozen=True, slots=True, kw_only=True)
class PointToPoint:
    """One send or receive: `op` is send, recv, isend or irecv."""

    KIND: ClassVar[int] = 2
    start_ns: int
    end_ns: int | None
    step: int
    op: str
    group: int
    seq: int  # n-th message in this direction between this rank and `peer` in `group`
    peer: int  # global rank of the other side
    tag: int = 0
    shapes: tuple[Shape, ...] = ()
    dtypes: tuple[str, ...] = ()
    nbytes: int = 0
    async_op: bool = False
    issued_ns: int | None = None
    digest: tuple[int, ...] | None = None
    blob: tuple[bytes, ...] | None = None
    mem_alloc: int | None = None
    mem_peak: int | None = None
    stack: tuple[str, ...] | None = None

    WIRE: ClassVar[tuple[tuple[str, int], ...]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Compute:
    """Time between communication calls, or one operator when `name` is set."""

    KIND: ClassVar[int] = 3
    start_ns: int
    end_ns: int | None
    step: int
    name: str | None = None
    shapes: tuple[Shape, ...] | None = None
    mem_alloc: int | None = None
    mem_peak: int | None = None

    WIRE: ClassVar[tuple[tuple[str, int], ...]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One training step on one rank, from its start to its boundary."""

    KIND: ClassVar[int] = 4
    start_ns: int
    end_ns: int | None
    step: int
    mem_peak: int | None = None  # peak bytes during the step

    WIRE: ClassVar[tuple[tuple[str, int], ...]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Memory:
    """A memory sample: allocated and peak bytes at one moment."""

    KIND: ClassVar[int] = 5
    start_ns: int
    end_ns: int | None
    step: int
    mem_alloc: int
    mem_peak: int
    name: str | None = None  # device or source, e.g. "cuda:0", "cpu-tracker"

    WIRE: ClassVar[tuple[tuple[str, int], ...]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Marker:
    """A named moment: records dropped, recording off, a user mark, ..."""

    KIND: ClassVar[int] = 6
    start_ns: int
    end_ns: int | None
    step: int
    name: str
    value: int | None = None
    text: str | None = None

    WIRE: ClassVar[tuple[tuple[str, int], ...]]


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupInfo:
    """A process group as this rank created it; `group` ids are creation order."""

    KIND: ClassVar[int] = 7
    start_ns: int
    end_ns: int | None
    step: int
    group: int
    ranks: tuple[int, ...]
    name: str = ""  # torch's group name
    text: str = ""  # torch's group description
    backend: str = ""

    WIRE: ClassVar[tuple[tuple[str, int], ...]]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceTime:
    """Device times of one step or one call on one rank (format 1.3, FORMAT.md "Device
    time"): events on the program's stream, read back after the fact. `start_ns` and
    `end_ns` are the host times of the Step or call it describes (the call's entry, the
    last mark); the `dev_` fields are ns from the rank's device epoch (its rank info's
    `device_time`), None where a mark was not made or never resolved.

    A step's marks are its boundaries; a call's, its issue (before the backend is
    entered), where the program began waiting for it and where that wait returned. A
    call is its Collective (group, seq) or PointToPoint (group, op, peer, seq) record;
    one may have two DeviceTime records, the second with the marks of a wait that came
    after the first was written: readers take each field from the first that has it."""

    KIND: ClassVar[int] = 8
    start_ns: int
    end_ns: int | None
    step: int
    name: str  # "step" or "call"
    op: str | None = None  # a call's op, group, seq and peer (point-to-point) as its record's
    group: int | None = None
    seq: int | None = None
    peer: int | None = None
    dev_start_ns: int | None = None  # a step's start; a call's issue
    dev_end_ns: int | None = None  # a step's end; where the program's wait for a call returned
    dev_wait_ns: int | None = None  # where the program began waiting for a call
    dev_duration_ns: int | None = None  # the collective's own time by its backend (NCCL's timing)

    WIRE: ClassVar[tuple[tuple[str, int], ...]]


Record = Union[Collective, PointToPoint, Compute, Step, Memory, Marker, GroupInfo, DeviceTime]

_KEYS = {
    "start_ns": K_START,
    "end_ns": K_END,
    "step": K_STEP,
    "op": K_OP,
    "group": K_GROUP,
    "seq": K_SEQ,
    "in_shapes": K_IN_SHAPES,
    "in_dtypes": K_IN_DTYPES,
    "in_bytes": K_IN_BYTES,
    "out_shapes": K_OUT_SHAPES,
    "out_dtypes": K_OUT_DTYPES,
    "out_bytes": K_OUT_BYTES,
    "reduce_op": K_REDUCE_OP,
    "root": K_PEER,
    "peer": K_PEER,
    "tag": K_TAG,
    "async_op": K_ASYNC,
    "issued_ns": K_ISSUED,
    "digest_in": K_DIGEST_IN,
    "digest": K_DIGEST_IN,
    "digest_out": K_DIGEST_OUT,
    "blob_in": K_BLOB_IN,
    "blob": K_BLOB_IN,
    "blob_out": K_BLOB_OUT,
    "mem_alloc": K_MEM_ALLOC,
    "mem_peak": K_MEM_PEAK,
    "name": K_NAME,
    "value": K_VALUE,
    "text": K_TEXT,
    "stack": K_STACK,
    "ranks": K_RANKS,
    "shapes": K_IN_SHAPES,
    "dtypes": K_IN_DTYPES,
    "nbytes": K_IN_BYTES,
    "backend": K_BACKEND,
    "dev_start_ns": K_DEV_START,
    "dev_end_ns": K_DEV_END,
    "dev_wait_ns": K_DEV_WAIT,
    "dev_duration_ns": K_DEV_DURATION,
}

RECORD_TYPES: dict[int, type] = {}
for _cls in (Collective, PointToPoint, Compute, Step, Memory, Marker, GroupInfo, DeviceTime):
    _cls.WIRE = tuple((f.name, _KEYS[f.name]) for f in fields(_cls))
    RECORD_TYPES[_cls.KIND] = _cls
del _cls
