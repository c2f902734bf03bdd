"""Encode and decode event chunks: columnar msgpack inside one zstd frame (FORMAT.md)."""

from __future__ import annotations

import operator
import threading
from dataclasses import MISSING, fields
from collections import Counter, defaultdict
from functools import lru_cache
from itertools import accumulate, repeat
from typing import Any, Callable, Iterable, Sequence

import msgpack
import zstandard

from prism_rr.errors import FormatError
from prism_rr.format import layout
from prism_rr.text import safe
from prism_rr.format.records import (
    K_END,
    K_RANKS,
    K_START,
    RECORD_TYPES,
    DeviceTime,
    GroupInfo,
    Marker,
    Record,
    Step,
)

__all__ = ["ChunkSummary", "compress", "decode_chunk", "decompress", "encode_chunk", "field_check", "row_maker",
           "row_start", "unpack"]

# Top-level keys of a chunk payload.
C_ORDER = 0  # kind of each record, in record order
C_TABLES = 1  # {kind: [columns {key: [values]}, constants {key: value}]}



def _column_reader(cls) -> Callable[[Sequence], tuple[list, ...]]:
    """A function giving the columns of a list of `cls` records, one list a field in wire
    order, each a list comprehension: Python 3.11 specialises `r.field` on a slot, twice
    as fast as an attrgetter mapped over them. The generated code names only our own
    field names."""
    body = "".join(f"[r.{name} for r in rs], " for name, _ in cls.WIRE)
    env: dict[str, Any] = {}
    exec(f"def read(rs):\n    return ({body})\n", env)
    return env["read"]


# (name, key) of each field of each record type in wire order, and its column reader
_FIELDS: dict[type, tuple[tuple[str, int], ...]] = {cls: tuple(cls.WIRE) for cls in RECORD_TYPES.values()}
_READ_COLUMNS = {cls: _column_reader(cls) for cls in RECORD_TYPES.values()}

# zstandard's contexts are not thread-safe: the spool's writer thread, the program's thread
# (payload blobs) and a reader's worker each need their own.
_local = threading.local()


def compress(data: bytes, level: int = 3) -> bytes:
    """A zstd frame of `data` (declaring its size); one compressor per thread and level."""
    made = getattr(_local, "compressors", None)
    if made is None:
        made = _local.compressors = {}
    c = made.get(level)
    if c is None:
        c = made[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return c.compress(data)


def declared_size(data, limit: int, where: str, *, budget: str | None = None) -> int:
    """The size a zstd frame declares, checked against `limit` and the budget (see
    decompress); FormatError if it declares none or too much."""
    try:
        size = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise FormatError(f"{where}: not a zstd frame ({exc})") from None
    if size < 0:
        raise FormatError(f"{where}: zstd frame does not declare its size")
    layout.bounded(size, limit, "decompressed size", where)
    if budget is not None:
        ratio = layout.ratio_limit(len(data), blob=budget == "blob")
        if size > ratio:
            raise FormatError(
                f"{where}: zstd frame of {len(data)} bytes declares {size} bytes, more than "
                f"its size can justify (limit {ratio})"
            )
    return size


def decompress(data, limit: int, where: str, *, budget: str | None = None) -> bytes:
    """One zstd frame whose declared size is at most `limit`; else FormatError.

    `budget="frame"` or `"blob"` also bounds the declared size by the frame's own stored
    length (`layout.ratio_limit`), before anything is allocated: what a reader of a
    stranger's bundle asks for. Writers decompressing their own blobs leave it out.
    """
    size = declared_size(data, limit, where, budget=budget)
    d = getattr(_local, "decompressor", None)
    if d is None:  # making one costs more than decompressing a small frame
        d = _local.decompressor = zstandard.ZstdDecompressor()
    try:
        out = d.decompress(data, max_output_size=size)
    except zstandard.ZstdError as exc:
        raise FormatError(f"{where}: corrupt zstd data ({exc})") from None
    if len(out) != size:
        raise FormatError(f"{where}: zstd frame holds {len(out)} bytes, declared {size}")
    return out


class _OverBudget(Exception):
    pass


# Bytes that may begin an array or a map (fixarray, fixmap, array16/32, map16/32).
_CONTAINER_HEADS = bytes(
    1 if 0x80 <= b <= 0x9F or 0xDC <= b <= 0xDF else 0 for b in range(256)
)


def _within(data, budget: int) -> bool:
    """True when `data` cannot decode to more than `budget` objects: every object is at
    least one byte and every container begins with one of _CONTAINER_HEADS, so the bytes
    plus 4 per such byte bound the count (a real chunk is far within; counting as they
    are made costs a function call per array)."""
    n = len(data)
    if n > budget:
        return False
    if type(data) is not bytes:
        data = bytes(data)
    return n + 4 * data.translate(_CONTAINER_HEADS).count(1) <= budget


def unpack(data, where: str, *, budget: int | None = None) -> Any:
    """msgpack decoding that turns every failure into FormatError.

    Every length is bounded by the input's. `budget` bounds the objects decoded (see
    layout.objects_limit): no array or map may hold more than half of it, and each one
    made is counted (its elements, 1 more for an array, 4 more for a map), so decoding
    stops within 1.5 times the budget.
    """
    n = len(data)
    list_hook = object_hook = None
    longest = n
    if budget is not None and not _within(data, budget):
        left = [budget]
        longest = min(n, budget // 2)

        def list_hook(a):
            left[0] -= len(a) + 1
            if left[0] < 0:
                raise _OverBudget
            return a

        def object_hook(d):
            left[0] -= 2 * len(d) + 4
            if left[0] < 0:
                raise _OverBudget
            return d

    try:
        return msgpack.unpackb(
            data,
            raw=False,
            use_list=False,
            strict_map_key=False,
            list_hook=list_hook,
            object_hook=object_hook,
            max_str_len=n,
            max_bin_len=n,
            max_array_len=longest,
            max_map_len=longest // 2 if budget is not None else n,
            max_ext_len=0,
        )
    except _OverBudget:
        raise FormatError(f"{where}: more than {budget} values, more than its size can justify") from None
    except MemoryError:
        raise  # not the input's fault alone: a budget above was too generous
    except ValueError as exc:
        if budget is not None and "exceeds max" in str(exc):
            raise FormatError(f"{where}: an array or map longer than its size can justify ({exc})") from None
        raise FormatError(f"{where}: malformed msgpack ({type(exc).__name__}: {exc})") from None
    except Exception as exc:  # msgpack raises many types; all mean "malformed"
        raise FormatError(f"{where}: malformed msgpack ({type(exc).__name__}: {exc})") from None


_SCALARS = frozenset({int, str, bool, type(None)})


def check_plain(value: Any, where: str, *, depth: int = layout.MAX_DEPTH) -> Any:
    """`value` if it is plain metadata: maps with str or int keys, arrays, str, int,
    bool, nil and finite floats, nested at most `depth` deep; else FormatError.

    Iterative, so a value nested 1000 deep costs no Python recursion.
    """
    stack = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        v, d = pop()
        t = type(v)
        if t in _SCALARS:
            continue
        if d > depth:
            raise FormatError(f"{where}: a value is nested more than {depth} deep")
        if t is tuple:
            for x in v:
                if type(x) not in _SCALARS:
                    push((x, d + 1))
        elif t is dict:
            for k, x in v.items():
                if type(k) is not str and type(k) is not int:
                    raise FormatError(f"{where}: a map key is a {type(k).__name__}, not a string or integer")
                if type(x) not in _SCALARS:
                    push((x, d + 1))
        elif t is float:
            if v != v or v in (float("inf"), float("-inf")):
                raise FormatError(f"{where}: a number is not finite")
        else:
            raise FormatError(f"{where}: a value is {t.__name__}, which metadata never holds")
    return value


def unpack_plain(data, where: str, stored: int) -> Any:
    """A metadata frame (manifest, summaries, rank info, groups) decoded within its
    budget (`layout.objects_limit` of its `stored` length) and checked by check_plain."""
    return check_plain(unpack(data, where, budget=layout.objects_limit(stored)), where)


class ChunkSummary:
    """What a chunk's frame header and summary say without decompressing it."""

    __slots__ = ("count", "t_first", "t_last", "step_first", "step_last", "summary")

    def __init__(self, count, t_first, t_last, step_first, step_last, summary):
        self.count = count
        self.t_first = t_first
        self.t_last = t_last
        self.step_first = step_first
        self.step_last = step_last
        self.summary = summary


def _all_same(column: Sequence) -> bool:
    # the ends differ in most varying columns: a cheap test before the full scan
    return column[-1] == column[0] and column.count(column[0]) == len(column)


def pack_ranks(ranks: Sequence[int]):
    """A list of ranks as it goes on the wire: an arithmetic run as {0: start, 1: stop, 2: step}."""
    n = len(ranks)
    ranks = tuple(ranks)
    if n >= 4:
        step = ranks[1] - ranks[0]
        # compared with the run as a whole, in C: a group of 4096 is in every first chunk
        if step > 0 and ranks[-1] == ranks[0] + step * (n - 1) and ranks == tuple(range(ranks[0], ranks[-1] + 1, step)):
            return {0: ranks[0], 1: ranks[-1] + 1, 2: step}
    return ranks


def ranks_len(value, where: str, world: int = layout.MAX_WORLD) -> int:
    """How many ranks `value` (a list of ranks as it is on the wire) names, checking that
    each is below `world` without expanding a run: FormatError on anything else."""
    if type(value) is tuple:
        if value and not (all(type(r) is int for r in value) and 0 <= min(value) and max(value) < world):
            raise FormatError(f"{where}: a list of ranks holds something other than ranks below {world}")
        return len(value)
    if type(value) is dict and len(value) == 3 and all(type(value.get(k)) is int for k in (0, 1, 2)):
        start, stop, step = value[0], value[1], value[2]
        if 0 <= start < stop <= world and 0 < step:
            return len(range(start, stop, step))
    raise FormatError(f"{where}: a list of ranks is malformed (or names ranks at or above {world})")


def unpack_ranks(value, where: str, world: int = layout.MAX_WORLD) -> tuple[int, ...]:
    """The inverse of pack_ranks, bounded by `world`: FormatError on anything else."""
    ranks_len(value, where, world)
    if type(value) is tuple:
        return value
    return tuple(range(value[0], value[1], value[2]))


_TO_WIRE = {K_RANKS: pack_ranks}


# --- rows: records the recorder makes on the program's thread ----------------------

# A row is a record as a plain tuple: (KIND, every field in wire order). The recorder
# makes two a call, and a spool holds thousands before its writer encodes them: a row
# costs one tuple (a record, a call per field), and a tuple of numbers, strings and
# tuples of them is untracked by Python's garbage collector at its first collection,
# where records stay tracked and, held that long, are promoted and swept again by the
# old generations' collections of the whole program's objects. encode_chunk takes
# rows and records alike, and encodes a row as it would the same record.
ROW_TYPES = (1, 2, 3)  # Collective, PointToPoint, Compute: what the recorder makes per call


def row_maker(cls, names: tuple[str, ...]):
    """A function of the values of `names` by position (fields not named take their
    defaults) giving the `cls` record they make as a row."""
    if cls.KIND not in ROW_TYPES:
        raise ValueError(f"{cls.__name__} records are not made as rows")
    defaults = _DEFAULTS[cls]
    env: dict[str, Any] = {}
    values = []
    for name, _ in cls.WIRE:
        if name in names:
            values.append(name)
        else:
            env[f"default_{name}"] = defaults[name]
            values.append(f"default_{name}")
    exec(f"def row({', '.join(names)}):\n    return ({cls.KIND}, {', '.join(values)})\n", env)
    return env["row"]


def _row_reader(cls) -> Callable[[Any], tuple]:
    """A function giving a `cls` record as a row."""
    body = "".join(f"r.{name}, " for name, _ in cls.WIRE)
    env: dict[str, Any] = {}
    exec(f"def row(r):\n    return ({cls.KIND}, {body})\n", env)
    return env["row"]


_ROW_OF = {cls: _row_reader(cls) for cls in RECORD_TYPES.values()}


def as_row(record) -> tuple:
    """A record as a row (its kind, then its fields in wire order); a row as it is."""
    if type(record) is tuple:
        return record
    return _ROW_OF[type(record)](record)


def row_record(row) -> Record:
    """The record a row stands for."""
    cls = RECORD_TYPES[row[0]]
    return _builder(cls, tuple(name for name, _ in cls.WIRE), ())(*row[1:])


def row_start(r) -> tuple[int, int]:
    """(start_ns, step) of a record or a row."""
    if type(r) is tuple:
        return r[1], r[3]
    return r.start_ns, r.step


# Keys of a frame's summary map.
S_KINDS = 0  # {kind: count}
S_STEPS = 1  # [[step, start, end, mem_peak], ...] from Step records
S_DROPPED = 2  # records dropped before this chunk
S_GROUPS = 3  # [[group, ranks, name, desc, backend], ...]
S_MEM_PEAK = 4  # largest mem_peak in the chunk
S_OPEN = 5  # calls that never completed
S_DEVICE_STEPS = 6  # [[step, dev_start, dev_end], ...] from DeviceTime records of steps (format 1.3)


def encode_chunk(records: Sequence[Record]) -> tuple[bytes, ChunkSummary]:
    """A chunk's msgpack payload (before compression) and its summary.

    Each column is read by a list comprehension over its kind's records (_column_reader),
    not by transposing a tuple of every field of every record: what decides the
    recorder's writer's throughput."""
    order = []
    by_kind = defaultdict(list)  # each kind's records in order, kinds as they first come
    rows = set()  # kinds with rows among their records
    for r in records:
        if type(r) is tuple:
            kind = r[0]
            rows.add(kind)
        else:
            kind = r.KIND
        order.append(kind)
        by_kind[kind].append(r)
    counts = {kind: len(recs) for kind, recs in by_kind.items()}
    buckets = {RECORD_TYPES[kind]: by_kind[kind] for kind in sorted(by_kind)}
    tables = {}
    extent = _Extent()
    group_ranks = ()
    for cls, bucket in buckets.items():
        tables[cls.KIND], ranks = _encode_table(cls, bucket, cls.KIND in rows, extent)
        if ranks is not None:
            group_ranks = ranks  # the summary's groups take them as they are
    payload = msgpack.packb({C_ORDER: order, C_TABLES: tables}, use_bin_type=True)
    summary = _summarise(buckets, counts, group_ranks)
    if extent.peak:
        summary[S_MEM_PEAK] = extent.peak
    if extent.open_calls:
        summary[S_OPEN] = extent.open_calls
    return payload, ChunkSummary(
        len(records), extent.t_first or 0, extent.t_last or 0, extent.step_lo or 0, extent.step_hi or 0, summary
    )


def _encode_table(cls, bucket: list, has_rows: bool, extent: _Extent) -> tuple[list, list | None]:
    """One kind's table, [columns, constants] (a column whose values are all one is a
    constant; starts as deltas, ends as durations), and its group ranks if it has them;
    `extent` widened by its times, steps and peaks."""
    columns = {}
    constants = {}
    peaks = group_ranks = None
    if has_rows:  # the rows' columns by one transposition (records made rows first)
        as_row = _ROW_OF[cls]
        read = list(zip(*[r if type(r) is tuple else as_row(r) for r in bucket]))[1:]
    else:
        read = _READ_COLUMNS[cls](bucket)
    for (name, key), column in zip(_FIELDS[cls], read):
        if key == K_START:
            starts = column
            continue
        if key == K_END:
            ends = column
            continue
        if name == "step":
            steps = column
        elif name == "mem_peak":
            peaks = column
        to_wire = _TO_WIRE.get(key)
        if to_wire is not None:
            column = list(map(to_wire, column))
            if key == K_RANKS:
                group_ranks = column
        if _all_same(column):
            constants[key] = column[0]
        else:
            columns[key] = column
    open_here = extent.add(starts, ends, steps, peaks)
    columns[K_START] = [starts[0], *map(operator.sub, starts[1:], starts[:-1])]
    if open_here:
        durations = [None if e is None else e - s for s, e in zip(starts, ends)]
    else:
        durations = list(map(operator.sub, ends, starts))
    if _all_same(durations):
        constants[K_END] = durations[0]
    else:
        columns[K_END] = durations
    return [columns, constants], group_ranks


class _Extent:
    """What a chunk's records span: first and last time, lowest and highest step, the
    largest mem_peak, and how many calls never completed."""

    __slots__ = ("open_calls", "peak", "step_hi", "step_lo", "t_first", "t_last")

    def __init__(self) -> None:
        self.t_first = self.t_last = self.step_lo = self.step_hi = None
        self.peak = 0
        self.open_calls = 0

    def add(self, starts: Sequence, ends: Sequence, steps: Sequence, peaks: Sequence | None) -> int:
        """Widen it by one kind's columns; how many of that kind's calls are open."""
        open_here = ends.count(None)
        self.open_calls += open_here
        lo, hi = min(starts), max(starts)
        if open_here < len(ends):
            hi = max(hi, max(e for e in ends if e is not None) if open_here else max(ends))
        self.t_first = lo if self.t_first is None else min(self.t_first, lo)
        self.t_last = hi if self.t_last is None else max(self.t_last, hi)
        s_lo, s_hi = min(steps), max(steps)
        self.step_lo = s_lo if self.step_lo is None else min(self.step_lo, s_lo)
        self.step_hi = s_hi if self.step_hi is None else max(self.step_hi, s_hi)
        if peaks is not None:
            if None not in peaks:
                self.peak = max(self.peak, max(peaks))
            elif peaks.count(None) < len(peaks):
                self.peak = max(self.peak, max(p for p in peaks if p is not None))
        return open_here


def _summarise(buckets: dict[type, list], counts: dict[int, int], group_ranks: Sequence) -> dict:
    summary: dict[int, Any] = {S_KINDS: dict(counts)}
    steps = buckets.get(Step)
    if steps:
        summary[S_STEPS] = [[s.step, s.start_ns, s.end_ns, s.mem_peak] for s in steps]
    markers = buckets.get(Marker)
    if markers:
        dropped = sum(m.value or 0 for m in markers if m.name == "records_dropped")
        if dropped:
            summary[S_DROPPED] = dropped
    device = buckets.get(DeviceTime)
    if device:
        rows = [[d.step, d.dev_start_ns, d.dev_end_ns] for d in device if d.name == "step"]
        if rows:
            summary[S_DEVICE_STEPS] = rows
    groups = buckets.get(GroupInfo)
    if groups:
        summary[S_GROUPS] = [[g.group, ranks, g.name, g.text, g.backend] for g, ranks in zip(groups, group_ranks)]
    return summary


# --- decoding -----------------------------------------------------------------------

def _is_int(v) -> bool:
    return type(v) is int


def _opt_int(v) -> bool:
    return v is None or type(v) is int


def _is_str(v) -> bool:
    return type(v) is str


def _opt_str(v) -> bool:
    return v is None or type(v) is str


def _is_bool(v) -> bool:
    return type(v) is bool


def _shapes(v) -> bool:
    return type(v) is tuple and all(
        type(s) is tuple and all(type(d) is int for d in s) for s in v
    )


def _opt_shapes(v) -> bool:
    return v is None or _shapes(v)


def _strs(v) -> bool:
    return type(v) is tuple and all(type(s) is str for s in v)


def _opt_strs(v) -> bool:
    return v is None or _strs(v)


def _ints(v) -> bool:
    return type(v) is tuple and all(type(s) is int for s in v)


def _opt_ints(v) -> bool:
    return v is None or _ints(v)


def _opt_blobs(v) -> bool:
    return v is None or (
        type(v) is tuple and all(type(b) is bytes and len(b) == layout.BLOB_ID_LEN for b in v)
    )


_CHECKS: dict[str, Callable[[Any], bool]] = {
    "step": _is_int, "op": _is_str, "group": _is_int, "seq": _is_int,
    "in_shapes": _shapes, "in_dtypes": _strs, "in_bytes": _is_int,
    "out_shapes": _shapes, "out_dtypes": _strs, "out_bytes": _is_int,
    "reduce_op": _opt_str, "root": _opt_int, "peer": _is_int, "tag": _is_int,
    "async_op": _is_bool, "issued_ns": _opt_int,
    "digest_in": _opt_ints, "digest_out": _opt_ints, "digest": _opt_ints,
    "blob_in": _opt_blobs, "blob_out": _opt_blobs, "blob": _opt_blobs,
    "mem_alloc": _opt_int, "mem_peak": _opt_int, "name": _opt_str, "value": _opt_int,
    "text": _opt_str, "stack": _opt_strs, "shapes": _opt_shapes,
    "dtypes": _strs, "nbytes": _is_int,
}
# Fields whose type is narrower in one record than the table above allows.
_NARROW = {(Marker, "name"): _is_str, (GroupInfo, "text"): _is_str, (GroupInfo, "name"): _is_str}
_NARROW.update({(GroupInfo, "backend"): _is_str})
_CHECKS["backend"] = _is_str
_CHECKS.update({"dev_start_ns": _opt_int, "dev_end_ns": _opt_int, "dev_wait_ns": _opt_int, "dev_duration_ns": _opt_int})
# A DeviceTime names a step ("step") or a call ("call", with the call's op, group, seq, peer)
_NARROW.update({(DeviceTime, "name"): _is_str, (DeviceTime, "op"): _opt_str, (DeviceTime, "group"): _opt_int,
                (DeviceTime, "seq"): _opt_int, (DeviceTime, "peer"): _opt_int})


def field_check(cls: type, name: str) -> Callable[[Any], bool]:
    """The check a decoded value of field `name` of record `cls` must pass (the one
    decode_chunk applies), for readers of their own."""
    return _NARROW.get((cls, name)) or _CHECKS[name]


def _not_none(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is not None and check(v)


# A field whose declared type has no None (PointToPoint.shapes, Memory.mem_alloc, ...) is
# never nil, though a field of the same name elsewhere may be.
for _cls in RECORD_TYPES.values():
    for _f in fields(_cls):
        if _f.name not in _CHECKS or "None" in str(_f.type):
            continue
        _check = _NARROW.get((_cls, _f.name)) or _CHECKS[_f.name]
        if _check(None):
            _NARROW[(_cls, _f.name)] = _not_none(_check)
del _cls, _f, _check


_DEFAULTS = {
    cls: {f.name: f.default for f in fields(cls) if f.default is not MISSING}
    for cls in RECORD_TYPES.values()
}
_MISSING = object()


# Times are ns of a monotonic clock: bounded so that differences of two stay within
# int64 (the wire's delta coding); steps are int32 (the frame header's step_first/last).
MAX_TIME = 1 << 62
MIN_STEP, MAX_STEP = -(1 << 31), (1 << 31) - 1


def decode_chunk(payload: bytes, count: int, where: str, *, world: int = layout.MAX_WORLD,
                 stored: int | None = None) -> list[Record]:
    """Records of one chunk payload; FormatError on anything malformed.

    `stored`, the payload's compressed length, bounds the objects it may decode to
    (layout.objects_limit); a reader of a bundle gives it.

    `world` bounds how many ranks the chunk's GroupInfo records may expand their
    arithmetic runs to (`layout.GROUP_RANKS_*`); each rank is below layout.MAX_WORLD (a
    bundle packed without rank info may have a world smaller than its groups).
    """
    chunk = unpack(payload, where, budget=None if stored is None else layout.objects_limit(stored))
    if type(chunk) is not dict:
        raise FormatError(f"{where}: chunk is not a map")
    order = chunk.get(C_ORDER)
    tables = chunk.get(C_TABLES)
    if type(order) is not tuple or type(tables) is not dict:
        raise FormatError(f"{where}: chunk lacks its order or tables")
    if len(order) != count:
        raise FormatError(f"{where}: chunk holds {len(order)} records, header says {count}")
    if not all(map(_is_int, order)):
        raise FormatError(f"{where}: a record kind in the chunk's order is not an integer")
    counts = Counter(order)
    decoded: dict[int, Iterable[Record]] = {}
    budget = [layout.GROUP_RANKS_FLOOR + layout.GROUP_RANKS_PER_RANK * world]
    for kind, n in counts.items():
        cls = RECORD_TYPES.get(kind)
        if cls is None:
            continue  # a record kind from a newer minor version: skipped
        table = tables.get(kind)
        if type(table) is not tuple or len(table) < 2:
            raise FormatError(f"{where}: table of record kind {kind} is missing or malformed")
        decoded[kind] = iter(_decode_table(cls, table[0], table[1], n, f"{where}, kind {kind}", world, budget))
    out = []
    for kind in order:
        it = decoded.get(kind)
        if it is not None:
            out.append(next(it))
    return out


def _decode_table(cls, columns, constants, n: int, where: str, world: int = layout.MAX_WORLD,
                  budget: list[int] | None = None) -> list[Record]:
    """The `n` records of one kind's table, every value checked; `budget` is what is left
    of the ranks a chunk's groups may name (one per world, shared by the chunk's kinds)."""
    varying, fixed = _table_fields(cls, columns, constants, n, where)
    starts, ends = _table_times(varying, fixed, n, where)
    steps = varying.get("step")
    lo, hi = (min(steps), max(steps)) if steps is not None else (fixed["step"],) * 2
    if n and not MIN_STEP <= lo <= hi <= MAX_STEP:
        raise FormatError(f"{where}: a step number is out of bounds (int32)")
    if budget is None:
        budget = [layout.GROUP_RANKS_FLOOR + layout.GROUP_RANKS_PER_RANK * world]
    if "ranks" in varying or "ranks" in fixed:
        _table_ranks(varying, fixed, n, where, world, budget)
    names = ("start_ns", "end_ns", *varying)
    build = _builder(cls, names, tuple(fixed))
    consts = tuple(fixed.values())
    return list(map(build, starts, ends, *varying.values(), *map(repeat, consts)))


def _table_fields(cls, columns, constants, n: int, where: str) -> tuple[dict[str, Sequence], dict[str, Any]]:
    """({field: column} of the fields that vary, {field: value} of those that do not,
    defaults filled in), each value's type checked but for times and group ranks."""
    if type(columns) is not dict or type(constants) is not dict:
        raise FormatError(f"{where}: columns or constants are not maps")
    varying: dict[str, Sequence] = {}
    fixed: dict[str, Any] = {}
    for name, key in cls.WIRE:
        col = columns.get(key, _MISSING)
        if col is not _MISSING:
            if type(col) is not tuple or len(col) != n:
                raise FormatError(f"{where}: column {key} ({name}) has the wrong length")
            varying[name] = col
            if name == "ranks":  # may hold maps; unpack_ranks checks them below
                continue
            distinct = _distinct(col, where, name)
        else:
            const = constants.get(key, _MISSING)
            if const is _MISSING:
                if name not in _DEFAULTS[cls]:
                    raise FormatError(f"{where}: required field {key} ({name}) is missing")
                const = _DEFAULTS[cls][name]
            fixed[name] = const
            if name == "ranks":
                continue
            distinct = (const,)
        if name == "start_ns" or name == "end_ns":
            continue
        check = field_check(cls, name)
        if not all(map(check, distinct)):
            raise FormatError(f"{where}: field {name} has a value of the wrong type")
        if name in _TEXT_FIELDS[cls] and not all(map(_printable, distinct)):
            if name in varying:  # display-safe as read (prism_rr.text.safe): rare, a stranger's bundle
                varying[name] = tuple(map(safe, varying[name]))
            else:
                fixed[name] = safe(fixed[name])
    return varying, fixed


def _printable(value) -> bool:
    """A string field's value (a string, strings, or None) holds only printable text."""
    if value is None:
        return True
    if type(value) is str:
        return value.isprintable()
    return all(v.isprintable() for v in value)


# Each record kind's fields that hold text (a string or strings): made display-safe as read.
_TEXT_FIELDS = {cls: frozenset(f.name for f in fields(cls) if "str" in str(f.type)) for cls in RECORD_TYPES.values()}


def _table_times(varying: dict, fixed: dict, n: int, where: str) -> tuple[list, list]:
    """(starts, ends) of a table's records, from start deltas and durations (taken out of
    `varying` and `fixed`), checked to be integers within +-2^62 ns."""
    if "start_ns" in varying:
        starts = varying.pop("start_ns")
    else:
        starts = (fixed.pop("start_ns"),) * n
    if not all(type(v) is int for v in _distinct(starts, where, "start_ns")):
        raise FormatError(f"{where}: start times are not integers")
    starts = list(accumulate(starts))
    if "end_ns" in varying:
        durations = varying.pop("end_ns")
    else:
        durations = (fixed.pop("end_ns", None),) * n
    if not all(v is None or type(v) is int for v in _distinct(durations, where, "end_ns")):
        raise FormatError(f"{where}: durations are not integers")
    if None in durations:
        ends = [None if d is None else s + d for s, d in zip(starts, durations)]
        bounds = [e for e in ends if e is not None]
    else:
        ends = bounds = list(map(operator.add, starts, durations))
    if n and not (-MAX_TIME <= min(starts) and max(starts) <= MAX_TIME
                  and (not bounds or (-MAX_TIME <= min(bounds) and max(bounds) <= MAX_TIME))):
        raise FormatError(f"{where}: a time is out of bounds (limit +-2^62 ns)")
    fixed.pop("start_ns", None)
    fixed.pop("end_ns", None)
    return starts, ends


def _table_ranks(varying: dict, fixed: dict, n: int, where: str, world: int, budget: list[int]) -> None:
    """A group table's ranks unpacked in place, once what they name is taken from `budget`."""
    if "ranks" in varying:
        col = varying["ranks"]
        budget[0] -= sum(ranks_len(v, where) for v in col)
        if budget[0] < 0:
            raise FormatError(f"{where}: groups name more ranks than a world of {world} can justify")
        varying["ranks"] = [unpack_ranks(v, where) for v in col]
    if "ranks" in fixed:
        budget[0] -= n * ranks_len(fixed["ranks"], where)
        if budget[0] < 0:
            raise FormatError(f"{where}: groups name more ranks than a world of {world} can justify")
        fixed["ranks"] = unpack_ranks(fixed["ranks"], where)


@lru_cache(maxsize=256)
def _builder(cls, names: tuple[str, ...], fixed: tuple[str, ...]):
    """A function making `cls` records from positional values, setting slots directly.

    Several times faster than the dataclass __init__ with keywords; fields not named
    take their defaults. The generated code names only our own field names.
    """
    given = names + fixed
    defaults = _DEFAULTS[cls]
    lines = [f"def build({', '.join(given)}):", "    o = new(cls)"]
    env = {"new": object.__new__, "cls": cls}
    for f in fields(cls):
        env[f"set_{f.name}"] = getattr(cls, f.name).__set__
        if f.name in given:
            lines.append(f"    set_{f.name}(o, {f.name})")
        else:
            env[f"default_{f.name}"] = defaults[f.name]
            lines.append(f"    set_{f.name}(o, default_{f.name})")
    lines.append("    return o")
    exec("\n".join(lines), env)
    return env["build"]


def _distinct(col: Sequence, where: str, name: str):
    try:
        return set(col)
    except TypeError:  # a map where a value belongs
        raise FormatError(f"{where}: field {name} has a value of the wrong type") from None
