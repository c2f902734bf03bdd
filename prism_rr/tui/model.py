"""What the timeline shows, read lazily from a bundle; imports no UI.

Times are on rank 0's clock: a rank's `clock_offset` (its monotonic clock minus rank 0's)
is subtracted from every time it recorded.
"""

from __future__ import annotations

import bisect
import contextlib
import multiprocessing
import os
import struct
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from statistics import median

import msgpack
import numpy as np

from prism_rr.analysis import ColumnReader, step_durations
from prism_rr.format import Bundle, Collective, Compute, Marker, PointToPoint, Record, ops
from prism_rr.format.summaries import NIL, RankTable, StepTable

try:
    import fcntl  # a bigger pipe for the process apart (Linux)
except ImportError:  # pragma: no cover - where there is no fork there is no process apart
    fcntl = None

__all__ = [
    "FAR",
    "KIND_NAMES",
    "RankSpans",
    "TimelineModel",
    "format_ns",
    "span_code",
]

FAR = 1 << 62  # the end of a call that never completed

# Span codes, in painting priority: a later code wins a cell shared with an earlier one.
IDLE, COMPUTE, MARK, ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, OTHER_COLL, P2P, HANG = range(10)
# The code each of the table's families (ops.FAMILIES, in its order) is painted with: one
# colour each for the bulk collectives and p2p; the rooted ones and barriers share one.
_FAMILY_CODE = dict(zip(ops.FAMILIES, (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL,
                                       OTHER_COLL, OTHER_COLL, OTHER_COLL, P2P), strict=True))


def _kind_names() -> dict[int, str]:
    names = {IDLE: "idle", COMPUTE: "compute", MARK: "marker", HANG: "failed or never completed"}
    for fam, code in _FAMILY_CODE.items():
        label = ops.FAMILY_NAMES[fam]
        names[code] = f"{names[code]}/{label}" if code in names else label
    names[OTHER_COLL] += "/other"  # ops this version does not know
    return dict(sorted(names.items()))


KIND_NAMES = _kind_names()


def span_code(rec: Record) -> int:
    if rec.end_ns is None and not isinstance(rec, Marker):
        return HANG
    if isinstance(rec, Compute):
        return COMPUTE
    if isinstance(rec, PointToPoint):
        return P2P
    if isinstance(rec, Marker):
        return MARK
    return _FAMILY_CODE.get(ops.family(rec.op), OTHER_COLL)


def format_ns(ns: float) -> str:
    """A duration for people: 850ns, 12.3us, 4.56ms, 1.234s."""
    a = abs(ns)
    if a < 1_000:
        return f"{ns:.0f}ns"
    if a < 1_000_000:
        return f"{ns / 1e3:.3g}us"
    if a < 1_000_000_000:
        return f"{ns / 1e6:.3g}ms"
    return f"{ns / 1e9:.4g}s"


_CALL_KINDS = (Collective.KIND, PointToPoint.KIND)
_SPAN_KINDS = (*_CALL_KINDS, Compute.KIND, Marker.KIND)


class _Records(Sequence):
    """A rank's spans' records, in span order: a chunk is decoded the first time one of
    its records is asked for (drawing a line needs none; the details pane one)."""

    def __init__(self, refs: list, chunk: list[int], kpos: list[int], read_chunk) -> None:
        self._refs, self._chunk, self._kpos, self._read = refs, chunk, kpos, read_chunk
        self._decoded: dict[int, list[Record]] = {}

    def __len__(self) -> int:
        return len(self._chunk)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        c = self._chunk[i]
        records = self._decoded.get(c)
        if records is None:
            records = self._decoded[c] = self._read(self._refs[c])
        return records[self._kpos[i]]


@dataclass(slots=True)
class RankSpans:
    """One rank's calls sorted by start, on rank 0's clock: what drawing reads as lists,
    the rest as arrays, a record only when asked for."""

    rank: int
    starts: list[int]
    ends: list[int]  # FAR for a call that never completed
    codes: list[int]
    reach: list[int]  # running maximum of ends: bisect it to find the first visible span
    records: Sequence[Record]
    kinds: np.ndarray  # each span's record kind (Record.KIND)
    op_ids: np.ndarray  # a call's op, an index into `values` (0: None, as for every other span)
    values: list  # the reader's interned values, display-safe (the bundle's)
    group: np.ndarray  # a call's group and seq; 0 for the others
    seq: np.ndarray
    _ops: list | None = field(default=None)
    _keys: list | None = field(default=None)
    _by_call: dict | None = field(default=None)
    _np: tuple | None = field(default=None)

    @classmethod
    def build(cls, rank: int, records, offset: int) -> "RankSpans":
        """From records (a replay model's, a test's)."""
        rows = []
        call = None  # the last call's row: a `call_failed` marker right after it names its seq
        for rec in records:
            if isinstance(rec, (Collective, PointToPoint, Compute, Marker)):
                end = FAR if rec.end_ns is None else rec.end_ns - offset
                row = [rec.start_ns - offset, end, span_code(rec), rec]
                rows.append(row)
                if isinstance(rec, (Collective, PointToPoint)):
                    call = row
                elif isinstance(rec, Marker) and rec.name == "call_failed" and call is not None \
                        and call[3].seq == rec.value:
                    call[2] = HANG  # a call that failed is drawn as one that never completed
        rows.sort(key=lambda r: r[0])
        reach, m = [], -FAR
        for r in rows:
            m = max(m, r[1])
            reach.append(m)
        recs = [r[3] for r in rows]
        calls = [isinstance(r, (Collective, PointToPoint)) for r in recs]
        values: list = [None]
        ids: dict = {None: 0}
        op_ids = [ids.setdefault(r.op, len(ids)) if c else 0 for r, c in zip(recs, calls)]
        values += list(ids)[1:]
        return cls(rank, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], reach, recs,
                   np.array([r.KIND for r in recs], np.int8), np.array(op_ids, np.int32), values,
                   np.array([r.group if c else 0 for r, c in zip(recs, calls)], np.int64),
                   np.array([r.seq if c else 0 for r, c in zip(recs, calls)], np.int64))

    @classmethod
    def from_arrays(cls, rank: int, arrays: dict, values: list, refs: list, read_chunk) -> "RankSpans":
        """From `span_arrays`' arrays (op ids into `values`); a record is decoded from the
        rank's chunks (`refs`, by `read_chunk`) when asked for."""
        a = arrays
        return cls(rank, a["starts"].tolist(), a["ends"].tolist(), a["codes"].tolist(), a["reach"].tolist(),
                   _Records(refs, a["chunk"], a["kpos"], read_chunk), a["kinds"], a["op"], values, a["group"],
                   a["seq"], _np=(a["starts"], a["ends"], a["codes"].astype(np.int64)))  # (cells_many reads these)

    @property
    def ops(self) -> list[str | None]:
        """Each span's op (display-safe), None for spans that are not calls."""
        if self._ops is None:
            values = self.values
            self._ops = [values[i] for i in self.op_ids.tolist()]
        return self._ops

    def op_at(self, index: int) -> str | None:
        return self.values[self.op_ids[index]]

    @property
    def keys(self) -> list[tuple | None]:
        """Each call's (kind, group, seq), None for the other spans."""
        if self._keys is None:
            self._keys = [(k, g, q) if k in _CALL_KINDS else None
                          for k, g, q in zip(self.kinds.tolist(), self.group.tolist(), self.seq.tolist())]
        return self._keys

    def visible(self, t0: int, t1: int) -> range:
        """Indexes of spans that may overlap [t0, t1]."""
        return range(bisect.bisect_left(self.reach, t0), bisect.bisect_right(self.starts, t1))

    def cells(self, t0: int, ns_per_cell: float, width: int) -> list[int]:
        return self.cells_owned(t0, ns_per_cell, width)[0]

    def cells_owned(self, t0: int, ns_per_cell: float, width: int) -> tuple[list[int], list[int]]:
        """The span code shown in each of `width` cells starting at time t0, and the span
        each shows (-1: none): `cells_many` of this rank alone."""
        return cells_many([(self, t0)], ns_per_cell, width)[0]

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """starts, ends and codes as arrays (made once)."""
        if self._np is None:
            self._np = (np.array(self.starts, np.int64), np.array(self.ends, np.int64), np.array(self.codes, np.int64))
        return self._np

    def at(self, t: int) -> int | None:
        """Index of the call covering time t (communication first), or None."""
        best = None
        for i in self.visible(t, t):
            if self.starts[i] <= t <= self.ends[i]:
                if best is None or self.codes[i] > self.codes[best]:
                    best = i
        return best

    def nearest(self, t: int, tolerance: float) -> int | None:
        i = self.at(t)
        if i is not None:
            return i
        j = bisect.bisect_left(self.starts, t)
        cands = [k for k in (j - 1, j) if 0 <= k < len(self.starts)]
        cands = [k for k in cands if min(abs(self.starts[k] - t), abs(self.ends[k] - t)) <= tolerance]
        return min(cands, key=lambda k: min(abs(self.starts[k] - t), abs(self.ends[k] - t)), default=None)

    def find_call(self, group: int, seq: int, kind: type = Collective) -> int | None:
        """Index of this rank's call `seq` in `group`."""
        if self._by_call is None:
            self._by_call = {key: i for i, key in enumerate(self.keys) if key is not None}
        return self._by_call.get((kind.KIND, group, seq))

    def collective_key(self, index: int) -> tuple | None:
        """(group, seq, Collective) of a collective, which its group's other members share
        (a point-to-point call's seq is per direction and peer): None for any other span."""
        if self.kinds[index] != Collective.KIND:
            return None
        return int(self.group[index]), int(self.seq[index]), Collective

    def next_comm(self, t: int, direction: int, op: str | None = None) -> int | None:
        """The first collective or point-to-point call starting after (or before) t."""
        idx = range(bisect.bisect_right(self.starts, t), len(self.starts)) if direction > 0 \
            else range(bisect.bisect_left(self.starts, t) - 1, -1, -1)
        keys, ops_ = self.keys, self.ops
        for i in idx:
            if keys[i] is not None and (op is None or ops_[i] == op):
                return i
        return None


def cells_many(lines: list[tuple[RankSpans, int]], ns_per_cell: float, width: int) -> list[tuple[list, list]]:
    """Of each (spans, t0) line, the span code shown in each of `width` cells starting at
    its t0, and the span each cell shows (-1: none): the code that takes most of the cell's
    time (at coarse zoom a cell holds many calls and compute between them: painting the
    last one made every rank look communication-bound), a later call winning a tie,
    compute never; a call that failed or never completed always shows (the last such over
    the cell). All lines in one pass over arrays: a screen of lines costs about one."""
    parts = []
    for k, (spans, t0) in enumerate(lines):
        t1 = t0 + ns_per_cell * width
        span = spans.visible(t0, int(t1))
        if len(span):
            s_all, e_all, c_all = spans._arrays()
            e = np.minimum(e_all[span.start : span.stop], int(t1) + 1)
            parts.append((k, t0, s_all[span.start : span.stop], e, c_all[span.start : span.stop], span))
    out = np.full((len(lines), width), IDLE, np.int64)
    owner = np.full((len(lines), width), -1, np.int64)
    if parts:
        line = np.concatenate([np.full(len(p[2]), p[0], np.int64) for p in parts])
        t0s = np.concatenate([np.full(len(p[2]), p[1], np.int64) for p in parts])
        s, e, codes = (np.concatenate([p[i] for p in parts]) for i in (2, 3, 4))
        index = np.concatenate([np.arange(p[5].start, p[5].stop) for p in parts])  # in its own line's spans
        c0 = np.maximum(0, ((s - t0s) / ns_per_cell).astype(np.int64))
        c1 = np.minimum(width, ((e - t0s) / ns_per_cell).astype(np.int64) + 1)
        _most_time(out.reshape(-1), owner.reshape(-1), s, e, codes, c0, c1, t0s, ns_per_cell, line * width)
        for j in np.flatnonzero(codes == HANG).tolist():  # in order: the last one wins
            out[line[j], c0[j] : c1[j]] = HANG
            owner[line[j], c0[j] : c1[j]] = j
        hit = owner >= 0
        owner[hit] = index[owner[hit]]
    return list(zip(out.tolist(), owner.tolist()))


def _most_time(out, owner, s, e, codes, c0, c1, t0s, ns_per_cell: float, base) -> None:
    """Into `out` and `owner` (flat; a span's cells from its `base`), cell by cell, the
    span (other than a failed or unfinished call) that takes most of the cell's time: of
    those with the most, the last that is not compute, else the first; nothing where none
    takes any time, unless a call of none does (a marker). Spans are given in order;
    `c0`..`c1` the cells each overlaps from its line's t0 (`t0s`)."""
    n = np.where(codes == HANG, 0, np.maximum(c1 - c0, 0))
    total = int(n.sum())
    if not total:
        return
    j = np.repeat(np.arange(len(n)), n)  # each (span, cell) pair's span, then its cell
    local = np.repeat(c0, n) + np.arange(total) - np.repeat(np.cumsum(n) - n, n)
    lo = t0s[j] + local * ns_per_cell
    cell = base[j] + local
    part = np.minimum(e[j], lo + ns_per_cell) - np.maximum(s[j], lo)
    most = np.zeros(len(out))
    np.maximum.at(most, cell, part)
    top = part == most[cell]
    call = top & (codes[j] != COMPUTE)
    last = np.full(len(out), -1, np.int64)
    np.maximum.at(last, cell[call], np.flatnonzero(call))
    first = np.full(len(out), total, np.int64)
    comp = top & ~call & (most[cell] > 0)
    np.minimum.at(first, cell[comp], np.flatnonzero(comp))
    pick = np.where(last >= 0, last, np.where(first < total, first, -1))
    got = pick >= 0
    owner[got] = j[pick[got]]
    out[got] = codes[owner[got]]


def span_arrays(reader, refs: list, offset: int) -> dict[str, np.ndarray]:
    """A rank's spans from its chunks' columns (`analysis.ColumnReader`), no record made:
    {starts, ends, codes, reach, kinds, op (ids into reader.values), group, seq}, as
    RankSpans holds them, and each span's chunk (an index into `refs`) and place in it
    (kpos). Compact arrays: what a process reading apart sends back."""
    cols = _span_columns(reader, refs)
    order = np.argsort(cols["pos"], kind="stable")  # record order, as `build` sees them
    cols.update({k: v[order] for k, v in cols.items() if not k.startswith("failed")})
    codes = _span_codes(cols, reader.values)
    starts = cols["start"] - offset
    ends = np.where(cols["open"], FAR, cols["end"] - offset)
    by = np.argsort(starts, kind="stable")
    ends = ends[by]
    return {"starts": starts[by], "ends": ends, "codes": codes[by].astype(np.int8),
            "reach": np.maximum.accumulate(ends) if len(ends) else ends, "kinds": cols["kind"][by].astype(np.int8),
            "op": cols["op"][by].astype(np.int32), "group": cols["group"][by], "seq": cols["seq"][by],
            "chunk": cols["chunk"][by].astype(np.int32), "kpos": cols["kpos"][by].astype(np.int32)}


def _span_columns(reader, refs: list) -> dict[str, np.ndarray]:
    """The spans of a rank's chunks as columns, in chunk order: each record's place in the
    rank (`pos`), times, kind, op id, group and seq (0 where not a call), chunk and place in
    it; and `failed`, the places of its `call_failed` markers with the seq each names."""
    parts: list[dict] = []
    failed_pos: list[int] = []
    failed_seq: list[int] = []
    base = 0
    for c, ref in enumerate(refs):
        tables, known = reader.chunk_tables(ref)
        for kind, t in tables.items():
            n = len(t["start"])
            if kind not in _SPAN_KINDS or not n:
                continue
            call = kind in _CALL_KINDS
            zero = np.zeros(n, np.int64)
            parts.append({"pos": base + t["kpos"], "start": t["start"], "end": t["end"], "open": t["open"],
                          "kind": np.full(n, kind, np.int64), "op": t["op"] if call else zero,
                          "group": t["group"] if call else zero, "seq": t["seq"] if call else zero,
                          "chunk": np.full(n, c, np.int64), "kpos": t["kpos"]})
            if kind == Marker.KIND:
                for k, rec in zip(t["kpos"].tolist(), t["records"]):
                    if rec.name == "call_failed" and type(rec.value) is int:
                        failed_pos.append(base + k)
                        failed_seq.append(rec.value)
        base += known
    names = ("pos", "start", "end", "open", "kind", "op", "group", "seq", "chunk", "kpos")
    if not parts:
        cols = {k: np.zeros(0, bool if k == "open" else np.int64) for k in names}
    else:
        cols = {k: np.concatenate([p[k] for p in parts]) for k in names}
    cols["failed_pos"] = np.array(failed_pos, np.int64)
    cols["failed_seq"] = np.array(failed_seq, np.int64)
    return cols


def _span_codes(cols: dict[str, np.ndarray], values: list) -> np.ndarray:
    """Each span's code (span_code), columns in record order: a call that failed (a
    `call_failed` marker after it, before the next call, names its seq) as one that never
    completed."""
    kind, op, is_open = cols["kind"], cols["op"], cols["open"]
    codes = np.full(len(kind), MARK, np.int64)
    codes[kind == Compute.KIND] = COMPUTE
    codes[kind == PointToPoint.KIND] = P2P
    coll = np.flatnonzero(kind == Collective.KIND)
    if len(coll):
        ids, inverse = np.unique(op[coll], return_inverse=True)
        fam = np.array([_FAMILY_CODE.get(ops.family(values[i]), OTHER_COLL) for i in ids.tolist()], np.int64)
        codes[coll] = fam[inverse.reshape(-1)]
    codes[is_open & (kind != Marker.KIND)] = HANG
    calls = np.flatnonzero((kind == Collective.KIND) | (kind == PointToPoint.KIND))
    if len(cols["failed_pos"]) and len(calls):
        j = np.searchsorted(cols["pos"][calls], cols["failed_pos"]) - 1  # the last call before each
        ok = j >= 0
        hit = calls[j[ok]]
        codes[hit[cols["seq"][hit] == cols["failed_seq"][ok]]] = HANG
    return codes


def _int_or_nil(v) -> int:
    return v if type(v) is int and NIL < v < (1 << 63) else NIL


def _column(rank_table, name: str) -> np.ndarray:
    """A column of the summaries' rank table, a row per rank ascending, NIL where nil: the
    table's own (8192 ranks' dicts would take 300 ms), or one made of summaries made from
    the records (a bundle without its summary section)."""
    if isinstance(rank_table, RankTable):
        return rank_table.column(name)
    return np.array([_int_or_nil(rank_table[r].get(name)) for r in sorted(rank_table)], np.int64)


def _open_steps(summaries, steps: list[int], row_of) -> dict[int, dict[int, tuple[int, int]]]:
    """Of each step a rank began and never ended (the step a run failed or hung in, as
    `Bundle.steps` numbers it): {step: {rank: (when it began, the end of its previous step;
    the time its records reach)}}, on the rank's own clock. A rank began it where its
    records go on past the end of its previous step; one gone before (no record past
    that end) never did."""
    table, rank_table = summaries["steps"], summaries["ranks"]
    ranks = np.fromiter(sorted(rank_table), np.int64, len(rank_table))
    reach = _column(rank_table, "t_last")
    last = np.full(len(ranks), -1, np.int64)  # per rank, the last step it ended, and where
    end = np.zeros(len(ranks), np.int64)
    for s in steps:  # ascending: the last one a rank ended stays
        if s not in table:
            continue
        if isinstance(table, StepTable):
            r, _, e = table.arrays(s)[:3]
        else:
            row = table[s]
            r = np.fromiter(row, np.int64, len(row))
            e = np.array([_int_or_nil(row[x][1]) for x in r.tolist()], np.int64)
        r, e = r[e != NIL], e[e != NIL]
        at = np.minimum(np.searchsorted(ranks, r), max(len(ranks) - 1, 0))
        known = ranks[at] == r if len(ranks) else np.zeros(0, bool)
        last[at[known]], end[at[known]] = s, e[known]
    # the step after its last ended one is in the bundle, and its records go on past that end
    began = (last >= 0) & np.isin(last + 1, np.fromiter(steps, np.int64, len(steps))) & (reach != NIL) & (reach > end)
    out: dict[int, dict[int, tuple[int, int]]] = {}
    for i in np.flatnonzero(began).tolist():
        r = int(ranks[i])
        if r in row_of:
            out.setdefault(int(last[i]) + 1, {})[r] = (int(end[i]), int(reach[i]))
    return out


class ApartReader:
    """Reads ranks' spans in a process of its own, forked from this one: the second core
    decodes while this one draws. `ask` sends (rank, offset) pairs; `received` hands back,
    never waiting, each (rank, span_arrays, or None where it could not read them: read
    them here, where a malformed chunk is named) that has arrived whole. The process works
    on the bundle as this one opened it (an attempt's view included), forked before the UI
    starts its threads. Op ids index `values`, the op names it has sent.
    """

    def __init__(self, bundle: Bundle) -> None:
        ctx = multiprocessing.get_context("fork")
        asks, self._asks = ctx.Pipe(duplex=False)
        self._answers, answers = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_serve_apart, args=(bundle, asks, answers, (self._asks, self._answers)),
                                 daemon=True, name="prism-rr spans")
        self._proc.start()
        asks.close()
        answers.close()
        with contextlib.suppress(AttributeError, OSError):  # a bigger pipe: an answer goes in one write
            fcntl.fcntl(self._answers.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)
        os.set_blocking(self._answers.fileno(), False)
        self._buffer = bytearray()
        self.asked: set[int] = set()  # asked for and not yet received
        self.values: list = [None]  # the op names the process sent, as `span_arrays`' values
        self._ids: dict = {None: 0}

    def fileno(self) -> int:
        """What the loop watches: readable when an answer (or the end) arrives."""
        return self._answers.fileno()

    def ask(self, ranks_offsets: list[tuple[int, int]]) -> None:
        self._asks.send(ranks_offsets)
        self.asked.update(r for r, _ in ranks_offsets)

    def received(self) -> list[tuple[int, dict | None]]:
        """The answers that arrived whole; EOFError once the process is gone."""
        while True:
            try:
                piece = os.read(self._answers.fileno(), 1 << 20)
            except BlockingIOError:
                break
            if not piece:
                raise EOFError("the process reading spans apart ended")
            self._buffer += piece
        out = []
        buf = self._buffer
        while len(buf) >= 4:
            (n,) = struct.unpack("!i", buf[:4])  # multiprocessing's framing of send_bytes
            if len(buf) < 4 + n:
                break
            rank, arrays = self._decoded(bytes(buf[4 : 4 + n]))
            del buf[: 4 + n]
            self.asked.discard(rank)
            out.append((rank, arrays))
        return out

    def _decoded(self, data: bytes) -> tuple[int, dict | None]:
        """An answer (`_answer`): its arrays, its op names interned into `values` and its
        op ids made indexes of them. msgpack and raw arrays of known types (nothing here
        unpickles, not even what our own process sends)."""
        rank, names, cols = msgpack.unpackb(data, raw=False)
        if cols is None:
            return rank, None
        arrays = {k: np.frombuffer(cols[k], dtype) for k, dtype in _APART_TYPES.items()}
        ids = []
        for name in names:
            i = self._ids.get(name)
            if i is None:
                i = self._ids[name] = len(self.values)
                self.values.append(name)
            ids.append(i)
        arrays["op"] = np.array(ids, np.int32)[arrays["op"]] if ids else arrays["op"]
        return rank, arrays

    def close(self) -> None:
        self._asks.close()
        self._answers.close()
        if self._proc.is_alive():
            self._proc.terminate()
        self._proc.join(1)


def _serve_apart(bundle: Bundle, asks, answers, theirs) -> None:
    """The process apart: each rank asked for, read and sent back in the order asked, with
    the values interned since the last answer. It ends when the asking process does (its
    ends of the pipes, inherited by the fork, closed here so that the asking end's close
    reads as the end; and its parent watched, should another child hold that end)."""
    for conn in theirs:
        conn.close()
    parent = os.getppid()
    reader = ColumnReader(bundle)
    try:
        while True:
            while not asks.poll(1.0):
                if os.getppid() != parent:
                    return
            for rank, offset in asks.recv():
                answers.send_bytes(_answer(reader, bundle, rank, offset))
    except (EOFError, OSError, KeyboardInterrupt):  # the UI is gone
        pass


def _answer(reader, bundle: Bundle, rank: int, offset: int) -> bytes:
    """[rank, the op names of its calls, {column: raw bytes}], the op column indexing the
    names; [rank, [], None] where the rank could not be read (the asking process reads it
    again and names what is wrong)."""
    try:
        arrays = span_arrays(reader, bundle.chunks(rank), offset)
    except Exception:  # noqa: BLE001 - see above
        return msgpack.packb([rank, [], None], use_bin_type=True)
    ids, local = np.unique(arrays["op"], return_inverse=True)
    arrays["op"] = local.reshape(-1)
    names = [reader.values[i] for i in ids.tolist()]
    cols = {k: np.ascontiguousarray(arrays[k], dtype).tobytes() for k, dtype in _APART_TYPES.items()}
    return msgpack.packb([rank, names, cols], use_bin_type=True)


# the columns an answer carries, and their types
_APART_TYPES = {"starts": np.int64, "ends": np.int64, "codes": np.int8, "reach": np.int64, "kinds": np.int8,
                "op": np.int32, "group": np.int64, "seq": np.int64, "chunk": np.int32, "kpos": np.int32}


class TimelineModel:
    """A bundle's ranks, steps and clocks, with each rank's spans loaded on demand.

    Spans of at most `capacity` ranks are kept (least recently used go first), so the
    model never holds a whole bundle; `load` is safe to call from a worker thread.
    """

    APART_FROM = 256  # from this many ranks, spans are read in a process apart (where it can fork)

    def __init__(self, bundle: Bundle, capacity: int = 1024, apart: bool = True):
        """`apart`: read spans in a process apart where the bundle is big enough
        (APART_FROM); a second model beside the timeline's (a replay's) reads them here."""
        self.bundle = bundle
        self.ranks: list[int] = bundle.recorded_ranks
        self.row_of = {r: i for i, r in enumerate(self.ranks)}
        self.capacity = capacity
        self._cache: OrderedDict[int, RankSpans] = OrderedDict()
        self._lock = threading.Lock()
        self._reader = ColumnReader(bundle)
        self._read_lock = threading.Lock()
        self.apart: ApartReader | None = None  # reads spans in a process apart (`ApartReader`)
        if apart and len(self.ranks) >= self.APART_FROM and "fork" in multiprocessing.get_all_start_methods():
            self.apart = ApartReader(bundle)
            weakref.finalize(self, self.apart.close)
        self.summaries = bundle.summaries  # read once, on this thread
        self.offsets = {}
        for r in self.ranks:
            clock = bundle.rank_field(r, "clock_offset")
            off = clock.get("offset_ns") if type(clock) is dict else None
            self.offsets[r] = off if type(off) is int else 0
        self.steps: list[int] = bundle.steps
        self.open_steps = _open_steps(self.summaries, self.steps, self.row_of)
        rank_table = self.summaries["ranks"]
        t_first, t_last = (_column(rank_table, name) for name in ("t_first", "t_last"))
        t_first, t_last = t_first[t_first != NIL], t_last[t_last != NIL]
        self.t_min = int(t_first.min()) if len(t_first) else 0
        self.t_max = int(t_last.max()) if len(t_last) else self.t_min + 1_000_000
        if self.t_max <= self.t_min:
            self.t_max = self.t_min + 1_000_000

    @cached_property
    def groups(self) -> dict[int, dict]:
        """{id: group} (read when first asked for: 8192 ranks' groups take 0.1 s)."""
        return {g["id"]: g for g in self.bundle.groups}

    # --- spans ---------------------------------------------------------------------

    def get(self, rank: int) -> RankSpans | None:
        with self._lock:
            spans = self._cache.get(rank)
            if spans is not None:
                self._cache.move_to_end(rank)
            return spans

    def load(self, rank: int) -> RankSpans:
        spans = self.get(rank)
        if spans is not None:
            return spans
        with self._read_lock:  # the reader's interned values are shared by the ranks it reads
            arrays = span_arrays(self._reader, self.bundle.chunks(rank), self.offsets.get(rank, 0))
        return self.keep(rank, arrays, self._reader.values)

    def keep(self, rank: int, arrays: dict, values: list) -> RankSpans:
        """Spans of `rank` made of `span_arrays`' arrays (read here or apart; their op ids
        index `values`), kept."""
        spans = RankSpans.from_arrays(rank, arrays, values, self.bundle.chunks(rank), self.bundle.read_chunk)
        with self._lock:
            self._cache[rank] = spans
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        return spans

    def close(self) -> None:
        """Ends the process that reads apart, if any (the model still reads, here)."""
        apart, self.apart = self.apart, None
        if apart is not None:
            apart.close()

    def cached_ranks(self) -> list[int]:
        with self._lock:
            return list(self._cache)

    # --- steps ---------------------------------------------------------------------

    def step_span(self, step: int, rank: int) -> tuple[int, int | None] | None:
        """`rank`'s start and end of `step` (None: it never ended it), or None where it has
        no such step. The step a run failed or hung in, which no summary holds for a rank
        that never ended it, begins at the end of its previous step (`open_steps`)."""
        v = self.summaries["steps"].get(step, {}).get(rank)
        off = self.offsets.get(rank, 0)
        if v is None:
            began = self.open_steps.get(step, {}).get(rank)
            return None if began is None else (began[0] - off, None)
        return v[0] - off, (None if v[1] is None else v[1] - off)

    def step_extent(self, step: int, rank: int) -> tuple[int, int] | None:
        """`step_span`, a step `rank` never ended reaching as far as its records."""
        span = self.step_span(step, rank)
        if span is None or span[1] is not None:
            return span
        began = self.open_steps.get(step, {}).get(rank)
        return (span[0], began[1] - self.offsets.get(rank, 0)) if began else None

    def step_at(self, rank: int, t: int) -> int | None:
        """The step whose start is the last one at or before t on `rank`."""
        best = None
        for s in self.steps:
            span = self.step_span(s, rank)
            if span is not None and span[0] <= t:
                best = s
        return best

    def step_durations(self, step: int) -> dict[int, int]:
        return step_durations(self, step)

    def step_stats(self) -> list[dict]:
        """Per step: ranks, min, median and max iteration time, and the slowest rank."""
        out = []
        for s in self.steps:
            d = self.step_durations(s)
            if not d:
                out.append({"step": s, "ranks": 0, "min": None, "median": None, "max": None, "slowest": None})
                continue
            slow = max(d, key=d.get)
            out.append({"step": s, "ranks": len(d), "min": min(d.values()), "median": median(d.values()),
                        "max": d[slow], "slowest": slow})
        return out

    def rank_step_times(self, rank: int) -> list[int | None]:
        return [step_durations(self, s).get(rank) for s in self.steps]

    def initial_window(self) -> tuple[int, int]:
        """The first two steps of rank 0 (or of the first recorded rank), else everything."""
        if self.ranks and self.steps:
            r = self.ranks[0]
            first = self.step_span(self.steps[0], r)
            last = self.step_span(self.steps[min(1, len(self.steps) - 1)], r)
            if first and last and last[1]:
                pad = (last[1] - first[0]) // 50
                return first[0] - pad, last[1] + pad
        return self.t_min, self.t_max

    def steps_window(self) -> tuple[int, int]:
        """From the first step's earliest start to the last step's latest end, across the
        ranks the summaries have (a small margin each side), else the whole bundle."""
        table = self.summaries["steps"]
        if self.steps:
            first, last = table.get(self.steps[0], {}), table.get(self.steps[-1], {})
            starts = [v[0] - self.offsets.get(r, 0) for r, v in first.items()]
            ends = [v[1] - self.offsets.get(r, 0) for r, v in last.items() if v[1] is not None]
            if starts and ends and max(ends) > min(starts):
                lo, hi = min(starts), max(ends)
                pad = (hi - lo) // 50
                return lo - pad, hi + pad
        return self.t_min, self.t_max

    def group_members(self, group: int) -> tuple[int, ...]:
        g = self.groups.get(group)
        return tuple(g["ranks"]) if g else ()
