"""One rank's records as numpy columns, read straight from its chunks' tables.

A chunk stores each record kind as columns (FORMAT.md); making a Record per event costs
more than all the analysis of it. Here a column that says what a call was (op, shapes,
dtypes, stack, ...) is decoded once per distinct byte string: the ranks of an SPMD run
write the same ones, so 8192 ranks decode them a handful of times. Times are decoded per
chunk into int64 arrays.

This reader never calls a bundle malformed. A chunk it does not find in the shape it
expects (a type, a length, a time out of range) is read through the format's reader,
which says what is wrong with it or reads it as records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import msgpack
import numpy as np

from prism_rr.errors import FormatError
from prism_rr.format import codec, ops
from prism_rr.format.reader import Bundle, ChunkRef
from prism_rr.format.records import (
    Collective, Compute, GroupInfo, K_ASYNC, K_END, K_GROUP, K_IN_DTYPES, K_IN_SHAPES, K_NAME, K_OP,
    K_OUT_DTYPES, K_OUT_SHAPES, K_PEER, K_REDUCE_OP, K_SEQ, K_STACK, K_START, K_STEP, K_TEXT,
    K_VALUE, K_ISSUED, K_TAG, DeviceTime, Marker, Memory, PointToPoint, Step,
)
from prism_rr.text import safe
from prism_rr.analysis._divergence import structure_of

__all__ = ["ColumnReader", "RankColumns", "signature_of"]

_COLL, _P2P, _COMPUTE, _STEP, _MARKER = Collective.KIND, PointToPoint.KIND, Compute.KIND, Step.KIND, Marker.KIND
_KNOWN = (Collective.KIND, PointToPoint.KIND, Compute.KIND, Step.KIND, Memory.KIND, Marker.KIND, GroupInfo.KIND,
          DeviceTime.KIND)
_SKIPPED = (Memory.KIND, GroupInfo.KIND, DeviceTime.KIND)  # counted, not read
_NO_FIGURES = (*_SKIPPED, Compute.KIND)
# the columns read of each kind (the others are skipped unread)
_TIMES = frozenset({K_START, K_END, K_STEP})
_CALL = _TIMES | {K_OP, K_GROUP, K_SEQ, K_PEER, K_ASYNC, K_STACK, K_IN_SHAPES, K_IN_DTYPES}
_READ = {
    Collective.KIND: _CALL | {K_OUT_SHAPES, K_OUT_DTYPES, K_REDUCE_OP}, PointToPoint.KIND: _CALL,
    Compute.KIND: _TIMES | {K_NAME}, Marker.KIND: _TIMES | {K_NAME, K_VALUE, K_TEXT},
}
_MAX_TIME = 1 << 62  # the codec's bound on times
_MIN_STEP, _MAX_STEP = -(1 << 31), (1 << 31) - 1
_MEMO_BYTES = 64 << 20  # decoded columns kept, by the size of their bytes


class _Unexpected(Exception):
    """A chunk this reader leaves to the format's reader."""


def signature_of(op, in_shapes, in_dtypes, out_shapes, out_dtypes, reduce_op, root) -> tuple:
    """What the members of one collective must agree on: (op, shapes, dtypes, reduce op, root)."""
    known = ops.lookup(op)
    same = known.same if known is not None else None
    if same == "in":
        shapes, dtypes = in_shapes, in_dtypes
    elif same == "out":  # scatter: only the root has inputs; each member receives alike
        shapes, dtypes = out_shapes, out_dtypes
    else:  # all_to_all and unknown ops: splits may differ by rank, dtypes may not
        shapes, dtypes = None, tuple(sorted(set(in_dtypes)))
    return (op, shapes, dtypes, reduce_op, root)


# --- value checks: the codec's own (codec.field_check), for the fields read here ------

_is_str = codec.field_check(Collective, "op")
_opt_int = codec.field_check(Collective, "root")
_opt_str = codec.field_check(Collective, "reduce_op")
_is_bool = codec.field_check(Collective, "async_op")
_shapes = codec.field_check(Collective, "in_shapes")
_strs = codec.field_check(Collective, "in_dtypes")
_opt_strs = codec.field_check(Collective, "stack")

_MISSING = object()
_INT_OR_NONE = frozenset({int, type(None)})
_INT64_MIN = -(1 << 63)


@dataclass(slots=True)
class RankColumns:
    """One rank's records, times on rank 0's clock; `pos` is a record's place in the rank."""

    rank: int
    events: int = 0
    first_ns: int | None = None
    last_ns: int | None = None
    # communication calls (collectives and point-to-point), in record order
    pos: np.ndarray = None
    p2p: np.ndarray = None  # bool
    group: np.ndarray = None
    seq: np.ndarray = None
    peer: np.ndarray = None  # point-to-point only; 0 for collectives
    start: np.ndarray = None
    end: np.ndarray = None  # 0 where open
    open: np.ndarray = None  # bool: entered and never completed
    step: np.ndarray = None
    op: np.ndarray = None  # ids, ColumnReader.values
    sig: np.ndarray = None
    stack: np.ndarray = None
    async_op: np.ndarray = None  # bool
    tag: np.ndarray = None  # a point-to-point call's tag, 0 for collectives (ColumnReader(tags=True) only)
    # what makes a call the same call on its rank (analysis.structure_of; a point-to-point
    # call's without its peer and tag), interned (ColumnReader(structures=True) only)
    structure: np.ndarray = None
    issued: np.ndarray = None  # when an async call returned (ColumnReader(attribution=True) only)
    has_issued: np.ndarray = None  # bool: the record says when
    compute_ns: dict[int, int] = field(default_factory=dict)  # unnamed compute, by step
    comm_ns: dict[int, int] = field(default_factory=dict)  # completed blocking calls, by step
    iteration_ns: dict[int, int] = field(default_factory=dict)  # the step's Step record
    steps_seen: set[int] = field(default_factory=set)  # steps with a call, compute or step figure
    markers: list[tuple[int, Marker]] = field(default_factory=list)  # (pos, marker)
    # ColumnReader(attribution=True) only: rows (step, first start, last end) of any record of
    # the step (an end before its start taken as the start), and rows (step, start, end) of
    # its Step record (the rank's last of the step), both by step
    bounds: np.ndarray = None
    step_span: np.ndarray = None


def _in_steps(t: dict, steps: tuple[int, int]) -> dict:
    """A kind's table, only its records of steps a..b (the table itself if all are)."""
    keep = (t["step"] >= steps[0]) & (t["step"] <= steps[1])
    if keep.all():
        return t
    return {k: v[keep] if isinstance(v, np.ndarray) else [x for x, y in zip(v, keep) if y] for k, v in t.items()}


class ColumnReader:
    """Reads ranks of one bundle as columns; values (ops, signatures, stacks) are interned
    into `values`, so equal ones share one id across ranks."""

    def __init__(self, bundle: Bundle, figures: bool = True, attribution: bool = False, tags: bool = False,
                 structures: bool = False):
        """`figures`: per step, the compute and the time in blocking calls (`compute_ns`,
        `comm_ns`); without, a whole rank's compute records are not read (diagnosis).
        `attribution`: also each call's `issued` time and each step's `bounds` and `step_span`;
        with it and without figures, only what attribution reads (no compute by step, steps
        seen, markers, events or first and last times: a batch of steps is read for its calls
        and windows).
        `tags`: also each point-to-point call's `tag`. `structures`: also each call's
        `structure` (what `diff` compares)."""
        self.bundle = bundle
        self.figures = figures
        self.attribution = attribution
        self.tags = tags
        self.structures = structures
        self._lean = attribution and not figures
        self._read = dict(_READ)
        if self._lean:
            self._read[_COMPUTE] = self._read[_MARKER] = _TIMES
        if attribution:
            for kind in (_COLL, _P2P):
                self._read[kind] = self._read[kind] | {K_ISSUED}
        if tags:
            self._read[_P2P] = self._read[_P2P] | {K_TAG}
        self.values: list = [None]  # id -> value; 0 is None
        self._ids: dict = {None: 0}
        self._memo: dict = {}
        self._memo_bytes = 0

    def adopt(self, arrays: dict[str, np.ndarray], values: list) -> dict[str, np.ndarray]:
        """Columns another reader read (`load_columns`), their ids turned into this one's."""
        ids = np.array([self.intern(v) for v in values], np.int32)
        for k in ("op", "sig", "stack"):
            if k in arrays:
                arrays[k] = ids[arrays[k]]
        return arrays

    def intern(self, value) -> int:
        """`value`'s id; what `values` holds for it is display-safe (prism_rr.text.safe), as
        every string a bundle hands out."""
        i = self._ids.get(value)
        if i is None:
            i = self._ids[value] = len(self.values)
            self.values.append(safe(value))
        return i

    # --- a rank ---------------------------------------------------------------------

    def rank(self, rank: int, offset: int, steps: tuple[int, int] | None = None) -> RankColumns:
        """Rank `rank`'s records (of steps a..b, if given), `offset` subtracted from its times."""
        out = RankColumns(rank=rank)
        refs = self.bundle.chunks(rank)
        if steps is not None:
            refs = [r for r in refs if r.step_last >= steps[0] and r.step_first <= steps[1]]
        comm: list[dict] = []
        spans: list[tuple] = []  # attribution: (steps, lo, hi) of each table, then of Step records
        base = 0
        whole = steps is None  # every record of each chunk: times and counts from the index
        for ref in refs:
            try:
                tables, known, inside = self._chunk(ref, whole, steps)
            except _Unexpected:
                (tables, known), inside = self._from_records(ref), False
            if whole and ref.count:
                out.events += known
                lo, hi = ref.t_first - offset, ref.t_last - offset
                out.first_ns = lo if out.first_ns is None else min(out.first_ns, lo)
                out.last_ns = hi if out.last_ns is None else max(out.last_ns, hi)
            for kind, t in tables.items():
                if not inside:
                    t = tables[kind] = _in_steps(t, steps)
                if len(t["step"]):
                    self._fold(out, kind, t, offset, whole, base, comm, spans)
            base += known
        out.markers.sort(key=lambda pm: pm[0])
        self._set_calls(out, comm)
        if self.attribution:
            out.bounds = _by_step([x for x in spans if x[0] is not None], first=True)
            out.step_span = _by_step([x[1:] for x in spans if x[0] is None], first=False)
        return out

    def _fold(self, out: RankColumns, kind: int, t: dict, offset: int, whole: bool, base: int,
              comm: list[dict], spans: list[tuple]) -> None:
        """Fold one kind's table of a chunk into `out`: its times, counts and figures; a call
        table's columns kept in `comm` (at their positions after `base` records); with
        attribution, the table's windows and Step records' spans in `spans`."""
        start = t["start"] - offset
        end = t["end"] - offset
        op = t["open"]
        t["start"], t["end"] = start, end
        if self.attribution:
            late = np.maximum(end, start)
            spans.append((t["step"], start, np.where(op, start, late)))
            if "issued" in t:
                t["issued"] = t["issued"] - offset
            if kind == _STEP:
                done = ~op
                spans.append((None, t["step"][done], start[done], late[done]))
            if self._lean:
                if kind == _COLL or kind == _P2P:
                    t["pos"] = base + t["kpos"]
                    t["p2p"] = np.full(len(start), kind == _P2P)
                    comm.append(t)
                return
        if not whole:
            out.events += len(start)
            lo, hi = int(start.min()), int(np.where(op, start, end).max())
            out.first_ns = lo if out.first_ns is None else min(out.first_ns, lo)
            out.last_ns = hi if out.last_ns is None else max(out.last_ns, hi)
        if kind == _COLL or kind == _P2P:
            t["pos"] = base + t["kpos"]
            t["p2p"] = np.full(len(start), kind == _P2P)
            comm.append(t)
            out.steps_seen.update(_distinct(t["step"]))
            done = ~op & ~t["async_op"]
            if self.figures and done.any():
                _add_by_step(out.comm_ns, t["step"][done], (end - start)[done])
        elif kind == _COMPUTE:
            done = ~op & ~t["named"]
            if done.any():
                _add_by_step(out.compute_ns, t["step"][done], (end - start)[done])
        elif kind == _STEP:
            done = ~op
            for s, d in zip(t["step"][done].tolist(), (end - start)[done].tolist()):
                out.iteration_ns[s] = d  # a later Step record of the same step wins
                out.steps_seen.add(s)
        elif kind == _MARKER:
            out.markers.extend(zip((base + t["kpos"]).tolist(), t["records"]))

    def _set_calls(self, out: RankColumns, comm: list[dict]) -> None:
        """`out`'s call columns: the call tables' columns joined, in record order."""
        names = ("pos", "p2p", "group", "seq", "peer", "start", "end", "open", "step", "op", "sig", "stack",
                 "async_op")
        types = (np.int64, bool, np.int64, np.int64, np.int64, np.int64, np.int64, bool, np.int64, np.int32,
                 np.int32, np.int32, bool)
        if self.attribution:
            names, types = names + ("issued", "has_issued"), types + (np.int64, bool)
        if self.tags:
            names, types = names + ("tag",), types + (np.int64,)
        if self.structures:
            names, types = names + ("structure",), types + (np.int32,)
        if comm:
            cat = {k: np.concatenate([t[k] for t in comm]) for k in names}
            order = np.argsort(cat["pos"], kind="stable")
            for k in names:
                setattr(out, k, cat[k][order])
        else:
            for k, dt in zip(names, types):
                setattr(out, k, np.zeros(0, dt))

    def chunk_tables(self, ref: ChunkRef) -> tuple[dict[int, dict], int]:
        """One chunk's tables, {kind: {column: array}} for calls, compute, markers and
        steps (`kpos`: each record's place among the chunk's records, as `read_chunk` lists
        them), and how many records it holds: from its columns, or through the format's
        reader where they are not as expected (which raises FormatError on a malformed one)."""
        try:
            tables, known, _ = self._chunk(ref, True, None)
        except _Unexpected:
            tables, known = self._from_records(ref)
        return tables, known

    # --- a chunk, from its tables -------------------------------------------------------

    def _chunk(self, ref: ChunkRef, whole: bool, steps) -> tuple[dict[int, dict], int, bool]:
        """{kind: columns} of the kinds read here, how many known records the chunk holds,
        and whether every record read is of `steps` a..b (None: all are). `whole`: memory
        samples and group records, which only count, are not read."""
        b = self.bundle
        frame = b._frame(ref)
        at = f"{b.path.name}: chunks section, offset {frame.offset}"
        raw = codec.decompress(frame.payload(b._map), frame.raw_len, at, budget="frame")
        if len(raw) != frame.raw_len:
            raise _Unexpected
        try:
            return self._tables(raw, ref.count, (_SKIPPED if self.figures else _NO_FIGURES) if whole else (), steps)
        except MemoryError:
            raise
        except Exception:  # msgpack and numpy raise many types on a stranger's bytes: the reader judges
            raise _Unexpected from None

    def _tables(self, raw: bytes, count: int, skip, steps=None) -> tuple[dict[int, dict], int, bool]:
        n = len(raw)
        u = msgpack.Unpacker(raw=False, use_list=False, strict_map_key=False, max_buffer_size=max(n, 1),
                             max_str_len=n, max_bin_len=n, max_array_len=n, max_map_len=n, max_ext_len=0)
        u.feed(raw)
        order = tables = None
        for _ in range(u.read_map_header()):
            key = u.unpack()
            if key == codec.C_ORDER:
                a = u.tell()
                u.skip()
                order = self._decoded(("order", raw[a : u.tell()]), _order_column)
            elif key == codec.C_TABLES:
                tables = {}
                for _ in range(u.read_map_header()):
                    kind = u.unpack()
                    parts = u.read_array_header()
                    if parts < 2:
                        raise _Unexpected
                    cols = {}
                    need = self._read.get(kind, _TIMES)
                    for _ in range(u.read_map_header()):
                        k = u.unpack()
                        a = u.tell()
                        u.skip()
                        if k in need:
                            cols[k] = raw[a : u.tell()]
                    consts = {}
                    for _ in range(u.read_map_header()):
                        k = u.unpack()
                        consts[k] = u.unpack()
                    for _ in range(parts - 2):  # what a later minor version may add
                        u.skip()
                    if type(kind) is int and kind in _KNOWN:
                        tables[kind] = (cols, consts)
            else:
                u.skip()
        if u.tell() != n or order is None or tables is None or order[0] != count:
            raise _Unexpected
        _, known, places = order
        todo = [(kind, kpos) for kind, kpos in places.items() if kind not in skip]
        if any(kind not in tables for kind, _ in todo):
            raise _Unexpected
        times, lo, hi = self._times_and_steps([(kind, *tables[kind], len(kpos)) for kind, kpos in todo])
        inside = steps is None or (lo is not None and steps[0] <= lo and hi <= steps[1])
        out = {}
        for (kind, kpos), got in zip(todo, times):
            t = self._table(kind, *tables[kind], len(kpos), *got)
            t["kpos"] = kpos
            out[kind] = t
        return out, known, inside

    def _decoded(self, key, decode):
        got = self._memo.get(key)
        if got is None:
            got = decode(msgpack.unpackb(key[-1], raw=False, use_list=False, strict_map_key=False))
            size = len(key[-1])
            if self._memo_bytes + size > _MEMO_BYTES:
                self._memo.clear()
                self._memo_bytes = 0
            self._memo[key] = got
            self._memo_bytes += size
        return got

    def _column(self, kind, cols, consts, wire, n, default, decode):
        """A column as `decode` makes it (memoised by its bytes), or its constant."""
        if wire in cols:
            got = self._decoded((kind, wire, cols[wire]), decode)
            if len(got) != n:
                raise _Unexpected
            return got, cols[wire]
        value = consts.get(wire, default)
        if value is _MISSING:
            raise _Unexpected
        one = decode((value,))
        return (np.repeat(one, n) if isinstance(one, np.ndarray) else one * n), ("const", value)

    def _table(self, kind: int, cols: dict, consts: dict, n: int, start, end, is_open, step) -> dict:
        """{column: array} of one kind's table: its times and steps (_times_and_steps) and
        what its kind adds; _Unexpected where a value is out of bounds or of another type."""
        t: dict = {"start": start, "end": np.where(is_open, 0, end), "open": is_open, "step": step}
        if kind == _COLL or kind == _P2P:
            self._calls(kind, cols, consts, n, t)
        elif kind == _COMPUTE and not self._lean:
            names, _ = self._column(kind, cols, consts, K_NAME, n, None, self._ids_of(_opt_str))
            t["named"] = names != 0
        elif kind == _MARKER and not self._lean:
            names, _ = self._column(kind, cols, consts, K_NAME, n, _MISSING, _plain(_is_str))
            values, _ = self._column(kind, cols, consts, K_VALUE, n, None, _plain(_opt_int))
            texts, _ = self._column(kind, cols, consts, K_TEXT, n, None, _plain(_opt_str))
            raw_start, raw_end = start.tolist(), end.tolist()
            t["records"] = [Marker(start_ns=s, end_ns=None if o else e, step=st, name=safe(nm), value=v, text=safe(tx))
                            for s, e, o, st, nm, v, tx in zip(raw_start, raw_end, is_open.tolist(),
                                                               step.tolist(), names, values, texts)]
        return t

    def _times_and_steps(self, tables: list[tuple]) -> tuple[list[tuple[np.ndarray, ...]], int | None, int | None]:
        """(start, end, open, step) of the records of each of a chunk's tables (kind, cols,
        consts, n), times and steps within bounds: each check made once over the chunk; and
        the least and greatest step (None without records)."""
        if not tables:
            return [], None, None
        ns = [n for *_, n in tables]
        total = sum(ns)
        at = np.cumsum([0, *ns[:-1]])  # each table's first row
        deltas = _ints(self._time_values(tables, K_START))
        durations = self._time_values(tables, K_END, open_ok=True)
        if None in durations:
            is_open = np.array([d is None for d in durations], dtype=bool)
            durs = _ints([0 if d is None else d for d in durations])
        else:
            is_open, durs = np.zeros(total, bool), _ints(durations)
        if len(deltas) != total or len(durs) != total:
            raise _Unexpected
        # a table's first delta is its first start, the others what each start adds to the last:
        # no larger than _MAX_TIME over the table's rows (as np.abs reads them)
        first = deltas[at]
        limit = np.repeat(np.array([_MAX_TIME // n for n in ns], np.int64), ns)
        tail = deltas.copy()
        tail[at] = 0
        if (first == _INT64_MIN).any() or (np.abs(first) > _MAX_TIME).any() or (np.abs(tail) > limit).any():
            raise _Unexpected
        run = np.cumsum(tail)  # wraps as each table's own sum would: the difference is exact
        start = run - np.repeat(run[at], ns) + np.repeat(first, ns)
        if int(np.abs(start).max()) > _MAX_TIME or int(np.abs(durs).max()) >= _MAX_TIME:
            raise _Unexpected
        end = start + durs
        if int(np.abs(np.where(is_open, start, end)).max()) > _MAX_TIME:
            raise _Unexpected
        steps = [self._column(kind, cols, consts, K_STEP, n, _MISSING, _int_column)[0]
                 for kind, cols, consts, n in tables]
        step = np.concatenate(steps) if len(steps) > 1 else steps[0]
        lo, hi = int(step.min()), int(step.max())
        if not (_MIN_STEP <= lo and hi <= _MAX_STEP):
            raise _Unexpected
        bounds = [(a, a + n) for a, n in zip(at.tolist(), ns)]
        return [(start[a:b], end[a:b], is_open[a:b], s) for (a, b), s in zip(bounds, steps)], lo, hi

    def _time_values(self, tables: list[tuple], wire: int, open_ok: bool = False) -> tuple:
        """A time column of each table, joined: its values as the chunk holds them (a
        constant repeated; an absent end column: every record open, None). Each table's
        own values must read as int64 (_ints): a column of booleans alone does not."""
        out = []
        for _, cols, consts, n in tables:
            if wire in cols:
                v = msgpack.unpackb(cols[wire], raw=False, use_list=False, strict_map_key=False)
                if type(v) is not tuple or len(v) != n:
                    raise _Unexpected
                if type(v[0]) is bool or type(v[-1]) is bool:  # (rare) as _ints reads it alone
                    _ints([0 if x is None else x for x in v] if open_ok else v)
                out.append(v)
                continue
            value = consts.get(wire, None if open_ok else _MISSING)
            if type(value) is not int and not (open_ok and value is None):
                raise _Unexpected
            out.append((value,) * n)
        return out[0] if len(out) == 1 else tuple(chain.from_iterable(out))

    def _calls(self, kind: int, cols: dict, consts: dict, n: int, t: dict) -> None:
        """A call table's columns into `t`: op, group, seq, peer, async_op, stack, each
        call's signature (of its op, shapes, dtypes, reduce op and root), and what the
        reader was asked for besides (issued, tag, structure)."""
        coll = kind == _COLL
        t["op"], op_key = self._column(kind, cols, consts, K_OP, n, _MISSING, self._ids_of(_is_str))
        t["group"], _ = self._column(kind, cols, consts, K_GROUP, n, _MISSING, _int_column)
        t["seq"], _ = self._column(kind, cols, consts, K_SEQ, n, _MISSING, _int_column)
        if coll:
            root, root_key = self._column(kind, cols, consts, K_PEER, n, None, self._ids_of(_opt_int))
            t["peer"] = np.zeros(n, np.int64)
        else:
            t["peer"], root_key = self._column(kind, cols, consts, K_PEER, n, _MISSING, _int_column)
        t["async_op"], _ = self._column(kind, cols, consts, K_ASYNC, n, False, _bool_column)
        t["stack"], _ = self._column(kind, cols, consts, K_STACK, n, None, self._ids_of(_opt_strs))
        parts = [(t["op"], op_key)]
        wires = ((K_IN_SHAPES, K_IN_DTYPES, K_OUT_SHAPES, K_OUT_DTYPES, K_REDUCE_OP) if coll
                 else (K_IN_SHAPES, K_IN_DTYPES))
        for wire in wires:
            check = _shapes if wire in (K_IN_SHAPES, K_OUT_SHAPES) else _strs if wire != K_REDUCE_OP else _opt_str
            default = None if wire == K_REDUCE_OP else ()
            parts.append(self._column(kind, cols, consts, wire, n, default, self._ids_of(check)))
        if coll:
            parts.append((root, root_key))
        if self.attribution:
            t["issued"], t["has_issued"] = self._issued(cols, consts, n)
        if self.tags:
            t["tag"] = np.zeros(n, np.int64) if coll else self._column(kind, cols, consts, K_TAG, n, _MISSING,
                                                                       _int_column)[0]
        key = ("sig", kind, n, *(k for _, k in parts))
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self._signatures(coll, [ids for ids, _ in parts])
        t["sig"] = got
        if self.structures:
            key = ("structure", *key[1:])
            got = self._memo.get(key)
            if got is None:
                got = self._memo[key] = self._signatures(coll, [ids for ids, _ in parts], _structure)
            t["structure"] = got

    def _issued(self, cols, consts, n) -> tuple[np.ndarray, np.ndarray]:
        """(when each call returned to its caller, whether the record says)."""
        if K_ISSUED in cols:
            v = msgpack.unpackb(cols[K_ISSUED], raw=False, use_list=False, strict_map_key=False)
            if type(v) is not tuple or len(v) != n or not set(map(type, v)) <= _INT_OR_NONE:
                raise _Unexpected  # the format's reader says what is wrong
            if None in v:
                has = np.array([x is not None for x in v], dtype=bool).reshape(n)
                got = _ints([0 if x is None else x for x in v])
            else:
                has, got = np.ones(n, bool), _ints(v)
            if n and int(np.abs(got).max()) > _MAX_TIME:
                raise _Unexpected
            return got, has
        value = consts.get(K_ISSUED, None)
        if value is None:
            return np.zeros(n, np.int64), np.zeros(n, bool)
        if type(value) is not int or abs(value) > _MAX_TIME:
            raise _Unexpected
        return np.full(n, value, np.int64), np.ones(n, bool)

    def _ids_of(self, check):
        def decode(col):
            distinct = set(col)
            if not all(map(check, distinct)):
                raise _Unexpected
            ids = {v: self.intern(v) for v in distinct}
            return np.array([ids[v] for v in col], dtype=np.int32).reshape(len(col))
        return decode

    def _signatures(self, coll: bool, parts: list[np.ndarray], of=None) -> np.ndarray:
        """Each call's signature_of its fields (`of` another such function), interned:
        computed once per distinct combination of the fields' ids."""
        of = of or _signature
        n = len(parts[0])
        combos = np.stack(parts, axis=1) if n else np.zeros((0, len(parts)), np.int32)
        uniq, inverse = np.unique(combos, axis=0, return_inverse=True)
        vals = self.values
        ids = []
        for row in uniq.tolist():
            ids.append(self.intern(of(coll, [vals[i] for i in row])))
        return np.array(ids, dtype=np.int32)[inverse.reshape(-1)] if n else np.zeros(0, np.int32)

    # --- a chunk, through the format's reader ---------------------------------------

    def _from_records(self, ref: ChunkRef) -> tuple[dict[int, dict], int]:
        """The same columns from the format's records (which raise FormatError if the
        chunk is malformed)."""
        records = self.bundle.read_chunk(ref)
        rows: dict[int, list] = {}
        for i, rec in enumerate(records):
            rows.setdefault(rec.KIND, []).append((i, rec))
        out = {}
        try:
            for kind, items in rows.items():
                recs = [r for _, r in items]
                t = {"kpos": np.array([i for i, _ in items], np.int64),
                     "start": np.array([r.start_ns for r in recs], np.int64),
                     "end": np.array([0 if r.end_ns is None else r.end_ns for r in recs], np.int64),
                     "open": np.array([r.end_ns is None for r in recs], bool),
                     "step": np.array([r.step for r in recs], np.int64)}
                if kind == _COLL or kind == _P2P:
                    coll = kind == _COLL
                    t["op"] = np.array([self.intern(r.op) for r in recs], np.int32)
                    t["group"] = np.array([r.group for r in recs], np.int64)
                    t["seq"] = np.array([r.seq for r in recs], np.int64)
                    t["peer"] = np.array([0 if coll else r.peer for r in recs], np.int64)
                    t["async_op"] = np.array([r.async_op for r in recs], bool)
                    t["stack"] = np.array([self.intern(r.stack) for r in recs], np.int32)
                    fields = [[r.op, r.in_shapes, r.in_dtypes, r.out_shapes, r.out_dtypes, r.reduce_op, r.root]
                              if coll else [r.op, r.shapes, r.dtypes] for r in recs]
                    t["sig"] = np.array([self.intern(_signature(coll, v)) for v in fields], np.int32)
                    if self.structures:
                        t["structure"] = np.array([self.intern(_structure(coll, v)) for v in fields], np.int32)
                    if self.tags:
                        t["tag"] = np.array([0 if coll else r.tag for r in recs], np.int64)
                    if self.attribution:
                        t["issued"] = np.array([r.issued_ns or 0 for r in recs], np.int64)
                        t["has_issued"] = np.array([r.issued_ns is not None for r in recs], bool)
                elif kind == _COMPUTE:
                    t["named"] = np.array([r.name is not None for r in recs], bool)
                elif kind == _MARKER:
                    t["records"] = recs
                out[kind] = t
        except OverflowError:
            raise FormatError(f"{self.bundle.path.name}: chunk {ref.number} of rank {ref.rank} holds a group, "
                              "sequence or step number beyond 64 bits") from None
        return out, len(records)


def _signature(coll: bool, v: list) -> tuple:
    """signature_of a collective's fields, or a point-to-point call's (op, shapes, dtypes)."""
    return signature_of(*v) if coll else (v[0], v[1], v[2], None, None)


def _structure(coll: bool, v: list) -> tuple:
    """structure_of a collective's fields, or a point-to-point call's (op, shapes, dtypes)."""
    return ("collective", *structure_of(*v)) if coll else ("p2p", v[0], v[1], v[2])


def _distinct(steps: np.ndarray) -> list[int]:
    lo, hi = int(steps.min()), int(steps.max())
    if hi - lo < 4096:
        return (np.flatnonzero(np.bincount(steps - lo)) + lo).tolist()
    return np.unique(steps).tolist()


_ARRAYS = ("pos", "p2p", "group", "seq", "peer", "start", "end", "open", "step", "op", "sig", "stack", "async_op",
           "issued", "has_issued", "tag", "structure")
_WINDOWS = ("bounds", "step_span")  # rows of steps, not of calls
_MARKER_FIELDS = ("start_ns", "end_ns", "step", "name", "value", "text")


def dump_columns(parts: list[RankColumns], values: list) -> bytes:
    """(columns, the values their ids stand for) as msgpack: each column the parts have
    (those left None are not sent) as one array of all the parts (dtype, shape, bytes),
    each part's facts and how many rows are its, values as they are (tuples stay tuples on
    the way back). No pickle: the bytes cross a pipe from a process that read a stranger's
    bundle."""
    def array(a):
        return [a.dtype.str, list(a.shape), a.tobytes()]

    names = [n for n in (*_ARRAYS, *_WINDOWS) if parts and getattr(parts[0], n) is not None]
    blocks = [[n, array(np.concatenate([getattr(c, n) for c in parts]))] for n in names]
    rows = [[c.rank, c.events, c.first_ns, c.last_ns, len(c.step),
             list(c.compute_ns.items()), list(c.comm_ns.items()), list(c.iteration_ns.items()),
             sorted(c.steps_seen), [[pos, [getattr(m, f) for f in _MARKER_FIELDS]] for pos, m in c.markers],
             [len(getattr(c, n)) for n in _WINDOWS if n in names]]
            for c in parts]
    return msgpack.packb([rows, blocks, values], use_bin_type=True)


def load_columns(data: bytes) -> tuple[list, dict[str, np.ndarray], list]:
    """What dump_columns wrote: (each part's facts, {column: all parts' rows}, values).
    The arrays are read-only views of the message: the analysis makes new arrays of them."""
    rows, blocks, values = msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=False)
    arrays = {}
    if rows:
        for name, a in blocks:
            arrays[name] = np.frombuffer(a[2], dtype=np.dtype(a[0])).reshape(a[1])
        n = sum(r[4] for r in rows)
        windows = [n for n in _WINDOWS if n in arrays]
        if any(len(v) != n for k, v in arrays.items() if k not in windows) or any(
                len(arrays[k]) != sum(r[10][i] for r in rows) for i, k in enumerate(windows)):
            raise ValueError("the columns and their parts' lengths disagree")
    return list(rows), arrays, list(values)


def split_columns(rows: list, arrays: dict[str, np.ndarray]) -> list[RankColumns]:
    """Each part's RankColumns (load_columns), its columns views of `arrays`."""
    parts = []
    at = 0
    windows = [n for n in _WINDOWS if n in arrays]
    at_window = [0] * len(windows)
    for rank, events, first, last, n, compute, comm, iteration, seen, markers, counts in rows:
        c = RankColumns(rank=rank, events=events, first_ns=first, last_ns=last, compute_ns=dict(compute),
                        comm_ns=dict(comm), iteration_ns=dict(iteration), steps_seen=set(seen),
                        markers=[(pos, Marker(**dict(zip(_MARKER_FIELDS, m)))) for pos, m in markers])
        for name, a in arrays.items():
            if name not in windows:
                setattr(c, name, a[at:at + n])
        for i, name in enumerate(windows):
            setattr(c, name, arrays[name][at_window[i]:at_window[i] + counts[i]])
            at_window[i] += counts[i]
        at += n
        parts.append(c)
    return parts


def _by_step(parts: list[tuple], first: bool) -> np.ndarray:
    """Rows (step, lo, hi) from (steps, lo, hi) arrays: per step, the least lo and the
    greatest hi (`first`), else the last row's of the step; by step."""
    parts = [p for p in parts if len(p[0])]
    if not parts:
        return np.zeros((0, 3), np.int64)
    steps, lo, hi = (np.concatenate(c) if len(parts) > 1 else c[0] for c in zip(*parts))
    if not first:
        steps, at = np.unique(steps[::-1], return_index=True)  # a later row of the same step wins
        at = len(lo) - 1 - at
        return np.stack([steps, lo[at], hi[at]], axis=1)
    order = np.argsort(steps, kind="stable")
    s = steps[order]
    head = np.ones(len(s), bool)
    head[1:] = s[1:] != s[:-1]
    at = np.flatnonzero(head)
    return np.stack([s[at], np.minimum.reduceat(lo[order], at), np.maximum.reduceat(hi[order], at)], axis=1)


def _add_by_step(into: dict[int, int], steps: np.ndarray, values: np.ndarray) -> None:
    """Adds the sums of `values` by step to `into` (steps in order)."""
    lo, hi = int(steps.min()), int(steps.max())
    if hi - lo < 4096 and float(np.abs(values).sum(dtype=np.float64)) < 2.0**52:  # float sums are exact
        n = np.bincount(steps - lo, minlength=hi - lo + 1)
        sums = np.bincount(steps - lo, weights=values, minlength=hi - lo + 1).astype(np.int64)
        uniq = np.flatnonzero(n)
        pairs = zip((uniq + lo).tolist(), sums[uniq].tolist())
    else:
        uniq, inv = np.unique(steps, return_inverse=True)
        sums = np.zeros(len(uniq), np.int64)
        np.add.at(sums, inv.reshape(-1), values)
        pairs = zip(uniq.tolist(), sums.tolist())
    for s, v in pairs:
        into[s] = into.get(s, 0) + v


def _ints(values) -> np.ndarray:
    """int64 values; _Unexpected for anything numpy does not read as int64 (floats,
    strings, nil, integers beyond 64 bits). A bool among integers reads as 0 or 1."""
    if not len(values):
        return np.zeros(0, np.int64)
    arr = np.array(values)
    if arr.dtype != np.int64 or arr.ndim != 1:
        raise _Unexpected
    return arr


def _int_column(col) -> np.ndarray:
    if type(col) is not tuple:
        raise _Unexpected
    return _ints(col)


def _order_column(col) -> tuple[int, int, dict[int, np.ndarray]]:
    """(records, records of known kinds, {kind: each record's place among those})."""
    order = _int_column(col)
    known = np.isin(order, _KNOWN)
    place = np.cumsum(known) - 1
    rows = {kind: place[order == kind] for kind in _KNOWN}
    return len(order), int(known.sum()), {k: v for k, v in rows.items() if len(v)}


def _bool_column(col) -> np.ndarray:
    if type(col) is not tuple or not all(map(_is_bool, set(col))):
        raise _Unexpected
    return np.array(col, dtype=bool).reshape(len(col))


def _plain(check):
    def decode(col):
        if type(col) is not tuple or not all(map(check, set(col))):
            raise _Unexpected
        return col
    return decode
