"""Where each rank's step went, and what each late rank cost the step.

Per rank and step, the step's wall time is split four ways, which add up to it:

- waiting for late peers: inside a call, before the call's last member entered it; for
  an async call, while it was in flight before its last member entered (the program
  waits for it in wait(), which the recording does not hold);
- exposed communication: inside a blocking call (a synchronous collective or
  point-to-point call) after its last member entered: the transfer the rank sat
  through; and inside an async call until it returned;
- overlapped communication: between calls while one of the rank's async calls was in
  flight after its last member entered: transfer hidden behind compute (or, as the
  recording cannot tell, waited for in wait());
- compute: between calls with nothing in flight.

A call that completed before its last member entered did not need it (a buffered send,
or clocks apart): no waiting is counted in it.

Straggler cost. Each step is re-timed on its execution graph (no replay), with the model
a replay uses (`prism_rr.replayer`'s timing): each rank enters its next call the recorded
time after its previous one returned, or after an async call it may have waited for
completed (its time in flight before its last member came counted as waiting, as in the
split); a call completes at its last member's entry plus what each member recorded
after the last entry. Unchanged, the model gives back the recorded times. A rank's
straggler cost is how much shorter the step (first start to last end, across ranks)
becomes when that rank is never later than the latest of its other members into a call
where it held them up: its lateness removed, nothing else changed. Costs are marginal, one rank at a time: two
ranks equally late each cost little alone. Only a rank on the step's critical path can
cost anything, so only ranks the path passes into calls they entered last are re-timed
(the latest eight, each late by at least 0.5% of the step).

How. A step's calls are arrays (one row per call, ranks in order, each rank's by entry;
a call's key an integer id). The model's times form a graph whose order is found once
a step and shared by every re-timing of it: each level of it is timed at once, every
candidate's re-timing side by side (`_evaluate`). Where that graph has a cycle (buffered
sends that cross, a rank that goes on after a call that never completed), the step is
timed event by event instead (`_Timing`), the reference both must agree with.

Imports neither torch nor a UI library; reads bundles through `prism_rr.format`.
"""

from __future__ import annotations

import heapq
import json
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from prism_rr.analysis._build import clock_offsets, read_columns
from prism_rr.analysis._columns import ColumnReader
from prism_rr.analysis._steps import CriticalPath, Segment
from prism_rr.format import ops
from prism_rr.format.reader import Bundle
from prism_rr.format.records import Collective, PointToPoint, Step
from prism_rr.format.summaries import NIL, StepTable

__all__ = [
    "RankTime",
    "StepAttribution",
    "StragglerCost",
    "attribute",
    "attribute_step",
    "attribution_json",
    "attribution_json_text",
    "attribution_lines",
    "retimed_span",
    "step_json",
    "straggler_lines",
    "straggler_totals",
]

# Late ranks on the critical path re-timed per step, latest first (each costs one re-timing).
MAX_CANDIDATES = 8
BATCH_RECORDS = 12_000_000  # records `attribute` reads at a time (as columns: about 1 GiB)
# ... and only those late on it by at least this fraction of the step.
MIN_LATE_FRACTION = 0.005
# Steps taken from the chunk index when a bundle has no Step records; a chunk that claims
# a longer run of steps than this (hostile, or a dump's odd numbering) gives only its ends.
_MAX_STEP_RUN = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class RankTime:
    """One rank's step, split four ways (ns); the four add up to `total_ns`."""

    rank: int
    total_ns: int
    compute_ns: int
    overlapped_ns: int
    exposed_ns: int
    waiting_ns: int
    late_ns: int = 0  # over the calls where it held the others up: its entry minus the one before
    late_calls: int = 0  # calls it entered last while another member was still in its own


@dataclass(frozen=True, slots=True, kw_only=True)
class StragglerCost:
    """How much shorter a step would be had `rank` not been late (ns)."""

    rank: int
    step: int
    cost_ns: int
    late_ns: int
    late_calls: int


@dataclass(slots=True)
class StepAttribution:
    """One step across ranks: each rank's time, the critical path and the stragglers' costs."""

    step: int
    span_ns: int  # first start to last end, across ranks (recorded)
    modelled_ns: int  # the same span as the re-timing model gives it back (its error: the difference)
    call_durations: bool = True  # False: no call lasted any time (an imported dump without timing)
    ranks: dict[int, RankTime] = field(default_factory=dict)
    critical_path: CriticalPath = field(default_factory=CriticalPath)
    stragglers: list[StragglerCost] = field(default_factory=list)  # costliest first


# --- one step's execution graph ----------------------------------------------------------

NONE = np.iinfo(np.int64).min  # an array's "no value": a call never completed, a time never reached
_C, _P, _TWICE, _ALONE = 0, 1, 2, 3  # a key's kind, in the order its tuple sorted in: "c" < "p" < "twice" < "x"


@dataclass(slots=True)
class _Calls:
    """Calls of one step across ranks, as columns (times on rank 0's clock), each rank's
    in record order, ranks in `ranks` order. Per rank (index into `ranks`): the first start
    and the last end of its records in the step (`has`: it has some), and its Step
    record's (start, end) (`has_step`: it has one)."""

    ranks: list[int]
    rank_pos: np.ndarray  # call -> index into `ranks`
    index: np.ndarray  # its place among its rank's calls of the step, in record order
    p2p: np.ndarray
    op: np.ndarray  # ids into `values`
    group: np.ndarray
    seq: np.ndarray
    peer: np.ndarray
    start: np.ndarray
    end: np.ndarray  # as recorded: may be before the start; any value where `open`
    open: np.ndarray  # never completed
    issued: np.ndarray  # where `has_issued`: when an async call returned
    has_issued: np.ndarray
    async_op: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    has: np.ndarray
    step_lo: np.ndarray
    step_hi: np.ndarray
    has_step: np.ndarray
    values: list  # op id -> op name
    receives: np.ndarray  # op id -> whether the op receives


@dataclass(slots=True)
class _Graph:
    """One step's calls as nodes, in rank order and, within a rank, by entry (times on rank
    0's clock). A key is one call across its members; its id sorts as its tuple did
    (("c", group, seq), ("p", group, src, dst, seq), then ("twice", node) and ("x", rank,
    index): a call alone)."""

    ranks: list[int]  # those with records in the step
    rank_ptr: np.ndarray  # ranks[k]'s nodes are rank_ptr[k]:rank_ptr[k + 1]
    rank_of: np.ndarray  # node -> index into `ranks`
    start: np.ndarray
    end: np.ndarray  # NONE: never completed
    issued: np.ndarray  # an async call: when it returned to the program (in [start, end]); else start
    async_op: np.ndarray
    op: np.ndarray  # node -> op id (`values`)
    values: list
    kind: np.ndarray  # _C, _P, or _TWICE / _ALONE (a call no other member shares)
    group: np.ndarray
    seq: np.ndarray
    key: np.ndarray  # node -> key id
    key_ptr: np.ndarray  # key k's members are key_nodes[key_ptr[k]:key_ptr[k + 1]], ascending
    key_nodes: np.ndarray
    last_entry: np.ndarray  # key -> the latest recorded entry among its members
    ws: np.ndarray  # rank index -> its step's (start, end), recorded
    we: np.ndarray
    # node -> how late it entered a call whose other members it held up (0: it did not)
    held: np.ndarray
    # calls that waited to their end: never completed, or made in a step the rank did
    # not end (where the run failed or hung) while a member of the group never came
    stranded: np.ndarray

    def members(self, key: int) -> np.ndarray:
        return self.key_nodes[self.key_ptr[key] : self.key_ptr[key + 1]]

    def op_name(self, i: int) -> str:
        return self.values[self.op[i]]

    def group_seq(self, i: int) -> tuple[int | None, int | None]:
        if self.kind[i] <= _P:
            return int(self.group[i]), int(self.seq[i])
        return None, None


def _assemble(c: _Calls, unended: "_Unended | None" = None) -> _Graph:
    """A step's graph from its calls. `unended`: where the run failed or hung in the step,
    when each rank that did not end it began it, and each group's members among the ranks."""
    kept = np.flatnonzero(c.has)
    ranks = [c.ranks[k] for k in kept.tolist()]
    where = np.full(len(c.ranks), -1, np.int64)
    where[kept] = np.arange(len(kept))
    ws, we, open_ranks = _windows(c, kept, unended)
    order = np.arange(len(c.start))  # each rank's calls in record order: by entry, almost always
    if not ((c.rank_pos[1:] > c.rank_pos[:-1]) | (c.start[1:] >= c.start[:-1])).all():
        order = np.lexsort((c.start, c.rank_pos))  # stable: equal entries keep record order
    rank_of = where[c.rank_pos[order]]
    start = c.start[order]
    is_open = c.open[order]
    end = np.where(is_open, NONE, np.maximum(c.end[order], start))
    async_op = c.async_op[order]
    tail = np.where(is_open, start, end)
    issued = np.where(async_op & c.has_issued[order], np.minimum(np.maximum(c.issued[order], start), tail), start)
    kind, key = _keys(c, order, rank_of)
    key_ptr, key_nodes = _members(key)
    g = _Graph(ranks=ranks, rank_ptr=np.searchsorted(rank_of, np.arange(len(ranks) + 1)), rank_of=rank_of,
               start=start, end=end, issued=issued, async_op=async_op,
               op=c.op[order], values=c.values, kind=kind,
               group=c.group[order], seq=c.seq[order], key=key, key_ptr=key_ptr, key_nodes=key_nodes,
               last_entry=np.maximum.reduceat(start[key_nodes], key_ptr[:-1]) if len(key_nodes) else start[:0],
               ws=ws, we=we, held=np.zeros(len(start), np.int64), stranded=is_open.copy())
    _held(g)
    if unended is not None:
        sizes = np.diff(key_ptr)[key]
        need = np.array([unended.members.get(x, 0) for x in g.group.tolist()], np.int64)
        g.stranded |= open_ranks[rank_of] & (kind == _C) & (sizes < need)
    return g


def _windows(c: _Calls, kept: np.ndarray, unended) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each kept rank's step (start, end): its Step record's, or its records' first start and
    last end (a rank that did not end the step: from the end of its previous one), widened
    to its records; and which ranks did not end it (when `unended`)."""
    lo, hi = c.lo[kept], c.hi[kept]
    has_step = c.has_step[kept]
    ws = np.where(has_step, c.step_lo[kept], lo)
    we = np.where(has_step, c.step_hi[kept], hi)
    open_ranks = np.zeros(len(kept), bool)
    if unended is not None:
        open_ranks = ~has_step
        begun = np.array([unended.begun.get(c.ranks[k], NONE) for k in kept.tolist()], np.int64)
        ws = np.where(open_ranks & (begun != NONE), begun, ws)
    return np.minimum(ws, lo), np.maximum(we, hi), open_ranks


def _keys(c: _Calls, order: np.ndarray, rank_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each node's key kind and key id (ids sorted as the keys' tuples): a collective's
    (group, seq); a point-to-point call's (group, src, dst, seq); a call with no partner
    to match (a receive from any source) and a call its rank made twice: alone."""
    p2p, group, seq, peer = c.p2p[order], c.group[order], c.seq[order], c.peer[order]
    rank = np.array(c.ranks, np.int64)[c.rank_pos[order]] if len(order) else np.zeros(0, np.int64)
    alone = p2p & ((peer < 0) | (seq < 0))
    recv = c.receives[c.op[order]]
    kind = np.where(~p2p, _C, np.where(alone, _ALONE, _P)).astype(np.int8)
    f1 = np.where(alone, rank, group)
    f2 = np.where(~p2p, seq, np.where(alone, c.index[order], np.where(recv, peer, rank)))
    f3 = np.where(p2p & ~alone, np.where(recv, rank, peer), 0)
    f4 = np.where(p2p & ~alone, seq, 0)
    key = _ids(kind, f1, f2, f3, f4)
    # the same call again on one rank (all its nodes but the first): a key of its own
    by = np.lexsort((np.arange(len(key)), key))
    again = np.zeros(len(key), bool)
    again[by[1:]] = (key[by[1:]] == key[by[:-1]]) & (rank_of[by[1:]] == rank_of[by[:-1]])
    if again.any():
        kind = np.where(again, _TWICE, kind).astype(np.int8)
        node = np.arange(len(key))
        key = _ids(kind, np.where(again, node, f1), *(np.where(again, 0, f) for f in (f2, f3, f4)))
    return kind, key


def _ids(*fields: np.ndarray) -> np.ndarray:
    """Rows of `fields` numbered 0.. in their lexicographic order (equal rows, one number)."""
    n = len(fields[0])
    if not n:
        return np.zeros(0, np.int64)
    bits = [int(f.max()).bit_length() for f in fields]
    if min(int(f.min()) for f in fields) >= 0 and sum(bits) <= 62:  # one integer a row: one sort
        packed = np.zeros(n, np.int64)
        for f, b in zip(fields, bits):
            packed = (packed << b) | f
        by = np.argsort(packed, kind="stable")
        new = np.r_[True, packed[by[1:]] != packed[by[:-1]]]
    else:
        by = np.lexsort(fields[::-1])
        new = np.ones(n, bool)
        new[1:] = np.any([f[by[1:]] != f[by[:-1]] for f in fields], axis=0)
    out = np.empty(n, np.int64)
    out[by] = np.cumsum(new) - 1
    return out


def _members(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each key's members, ascending: (ptr, nodes) with key k's at nodes[ptr[k]:ptr[k + 1]]."""
    nodes = np.argsort(key, kind="stable")
    ptr = np.zeros(int(key.max()) + 2 if len(key) else 1, np.int64)
    np.cumsum(np.bincount(key, minlength=len(ptr) - 1), out=ptr[1:])
    return ptr, nodes


def _held(g: _Graph) -> None:
    """Fill `g.held`: the calls a member entered last while another member's call was still
    running (blocked, or an async call it waited for), with its entry minus the one before.
    Lateness into a call nobody was still in (a buffered send, a dump's untimed entries)
    held no one up."""
    if not len(g.key_nodes):
        return
    ptr, nodes = g.key_ptr[:-1], g.key_nodes
    s = g.start[nodes]
    latest = np.repeat(g.last_entry, np.diff(g.key_ptr))
    is_last = s == latest
    alone_last = np.add.reduceat(is_last.astype(np.int64), ptr) == 1
    before = np.maximum.reduceat(np.where(is_last, NONE, s), ptr)
    end = g.end[nodes]
    running = ~is_last & ((end == NONE) | (end >= latest))
    held = alone_last & (np.diff(g.key_ptr) >= 2) & (np.add.reduceat(running.astype(np.int64), ptr) > 0)
    at = nodes[is_last & np.repeat(held, np.diff(g.key_ptr))]
    g.held[at] = g.start[at] - before[g.key[at]]


@dataclass(frozen=True, slots=True)
class _Unended:
    """A step some rank did not end (the run failed or hung in it): when each such rank
    began it (the end of its previous step, on rank 0's clock), and each group's members
    among the ranks read."""

    begun: dict[int, int]
    members: dict[int, int]


def _unended(bundle: Bundle, step: int, ranks: list[int], offsets: dict[int, int],
             members: dict[int, int]) -> _Unended | None:
    """Of a step that some of `ranks` did not end, an `_Unended`; None of one all ended."""
    if bundle.manifest.get("imported") is not None:
        return None  # a dump's steps are its chunks': none is ended by a Step record
    table = bundle.summaries["steps"]
    if isinstance(table, StepTable):  # its columns: a look-up per rank costs ms at 8192 ranks
        got = table.arrays(step) if step in table else (np.zeros(0, np.int64),) * 3
        if np.isin(np.asarray(ranks, np.int64), got[0][got[2] != NIL]).all():
            return None
    ended, before = table.get(step, {}), table.get(step - 1, {})
    if all(r in ended and ended[r][1] is not None for r in ranks):
        return None
    begun = {r: before[r][1] - offsets.get(r, 0) for r in ranks
             if r not in ended and r in before and before[r][1] is not None}
    return _Unended(begun, members)


def _group_members(bundle: Bundle, ranks: list[int]) -> dict[int, int]:
    """Each group's members among `ranks`."""
    chosen = set(ranks)
    return {g["id"]: sum(1 for r in g["ranks"] if r in chosen) for g in bundle.groups}


# --- reading a step's calls ------------------------------------------------------------------

_CALL_COLUMNS = ("p2p", "op", "group", "seq", "peer", "start", "end", "open", "issued", "has_issued", "async_op")


def _read_step(bundle: Bundle, step: int, ranks: list[int], offsets: dict[int, int]) -> _Graph:
    """Step `step`'s graph, from each rank's records of the step."""
    values: list = [None]
    ids: dict = {None: 0}
    rows: list[tuple] = []
    per_rank = []
    for k, rank in enumerate(ranks):
        off = offsets.get(rank, 0)
        lo = hi = step_rec = None
        index = 0
        for rec in bundle.events(rank, steps=(step, step)):
            cls = type(rec)
            start = rec.start_ns - off
            end = None if rec.end_ns is None else max(rec.end_ns - off, start)
            lo = start if lo is None or start < lo else lo
            tail = start if end is None else end
            hi = tail if hi is None or tail > hi else hi
            if cls is Step:
                if end is not None:
                    step_rec = (start, end)
            elif cls is Collective or cls is PointToPoint:
                p2p = cls is PointToPoint
                op = ids.setdefault(rec.op, len(values))
                if op == len(values):
                    values.append(rec.op)
                issued = rec.issued_ns
                rows.append((k, index, p2p, op, rec.group, rec.seq, rec.peer if p2p else 0, start,
                             0 if end is None else end, end is None, 0 if issued is None else issued - off,
                             issued is not None, bool(rec.async_op)))
                index += 1
        per_rank.append((lo, hi, step_rec))
    cols = list(zip(*rows)) if rows else [()] * 13
    types = (np.int64, np.int64, bool, np.int64, np.int64, np.int64, np.int64, np.int64, np.int64, bool, np.int64,
             bool, bool)
    arrays = [np.array(c, t) for c, t in zip(cols, types)]
    calls = _Calls(ranks, *arrays[:2], **dict(zip(_CALL_COLUMNS, arrays[2:])), **_rank_bounds(per_rank),
                   values=values, receives=_receives(values))
    return _assemble(calls, _unended(bundle, step, ranks, offsets, _group_members(bundle, ranks)))


def _rank_bounds(per_rank: list[tuple]) -> dict[str, np.ndarray]:
    """_Calls' per-rank columns from (first start or None, last end, Step record's (start, end) or None)."""
    has = np.array([lo is not None for lo, _, _ in per_rank], bool)
    has_step = np.array([s is not None for _, _, s in per_rank], bool)
    return dict(lo=np.array([lo or 0 for lo, _, _ in per_rank], np.int64),
                hi=np.array([hi or 0 for _, hi, _ in per_rank], np.int64), has=has,
                step_lo=np.array([s[0] if s else 0 for _, _, s in per_rank], np.int64),
                step_hi=np.array([s[1] if s else 0 for _, _, s in per_rank], np.int64), has_step=has_step)


def _receives(values: list) -> np.ndarray:
    return np.array([isinstance(v, str) and ops.receives(v) for v in values], bool)


@dataclass(slots=True)
class _Batch:
    """Calls of a batch of steps across ranks (ColumnReader(attribution=True)'s columns),
    sorted by step, then rank index, each rank's in record order."""

    ranks: list[int]
    columns: dict[str, np.ndarray]  # _CALL_COLUMNS, "step", "rank_pos" and "index" (its place in its rank's step)
    bounds: np.ndarray  # rows (rank index, step, first start, last end)
    spans: np.ndarray  # rows (rank index, step, its Step record's start, end)
    values: list
    receives: np.ndarray


def _batch(cols: list, ranks: list[int], values: list) -> _Batch:
    """One batch from each rank's columns (emptied as they are joined: never held twice)."""
    names = (*_CALL_COLUMNS, "step")
    lengths = np.array([len(c.step) for c in cols], np.int64)
    out = {"rank_pos": np.repeat(np.arange(len(cols)), lengths)}
    order = None
    for name in ("step", *names[:-1]):
        joined = np.concatenate([getattr(c, name) for c in cols]) if cols else np.zeros(0, np.int64)
        for c in cols:
            setattr(c, name, None)
        if order is None:
            order = np.argsort(joined, kind="stable")
        out[name] = joined[order]
    out["rank_pos"] = out["rank_pos"][order]
    step, pos = out["step"], out["rank_pos"]
    new = np.ones(len(step), bool)
    new[1:] = (step[1:] != step[:-1]) | (pos[1:] != pos[:-1])
    first = np.flatnonzero(new)
    out["index"] = np.arange(len(step)) - np.repeat(first, np.diff(np.r_[first, len(step)]))
    return _Batch(ranks, out, _with_rank_pos([c.bounds for c in cols]), _with_rank_pos([c.step_span for c in cols]),
                  values, _receives(values))


def _with_rank_pos(rows: list[np.ndarray]) -> np.ndarray:
    """Each rank's rows (step, a, b) as one array of rows (rank index, step, a, b)."""
    if not rows:
        return np.zeros((0, 4), np.int64)
    k = np.repeat(np.arange(len(rows), dtype=np.int64), [len(r) for r in rows])
    return np.concatenate([k[:, None], np.concatenate(rows)], axis=1)


def _slim(c):
    """A rank's columns without those attribution does not read (halves a batch's memory)."""
    for name in ("pos", "sig", "stack", "tag", "structure"):
        setattr(c, name, None)
    c.markers = []
    return c


def _step_calls(b: _Batch, step: int) -> _Calls:
    lo, hi = np.searchsorted(b.columns["step"], [step, step + 1])
    got = {k: v[lo:hi] for k, v in b.columns.items() if k != "step"}
    cols = {}
    for rows, names in ((b.bounds, ("lo", "hi", "has")), (b.spans, ("step_lo", "step_hi", "has_step"))):
        mine = rows[rows[:, 1] == step]
        for j, name in enumerate(names[:2]):
            cols[name] = np.zeros(len(b.ranks), np.int64)
            cols[name][mine[:, 0]] = mine[:, 2 + j]
        cols[names[2]] = np.zeros(len(b.ranks), bool)
        cols[names[2]][mine[:, 0]] = True
    return _Calls(b.ranks, **got, **cols, values=b.values, receives=b.receives)


# --- the time split ----------------------------------------------------------------------


def _split(g: _Graph) -> dict[int, RankTime]:
    """Each rank's step split four ways, from three sets of intervals per rank: waiting
    (W), in a call (W and blocked, B) and busy (W, B and in flight, F)."""
    rank = g.rank_of
    ends = g.end == NONE
    end = np.where(ends, g.we[rank], np.minimum(g.end, g.we[rank]))
    last = g.last_entry[g.key]
    waits = g.stranded | ((last > g.start) & (ends | (g.end >= last)))
    w_hi = np.where(g.stranded, end, np.minimum(last, end))
    b_hi = np.where(g.async_op, g.issued, end)
    a = g.async_op
    sets = np.repeat(np.arange(3, dtype=np.int8), [int(waits.sum()), len(rank), int(a.sum())])
    wait, in_calls, busy = _unions_by_rank(g, np.concatenate([rank[waits], rank, rank[a]]),
                                           np.concatenate([g.start[waits], g.start, g.start[a]]),
                                           np.concatenate([w_hi[waits], b_hi, end[a]]), sets)
    held = g.held > 0
    late_ns = _sum_by_rank(rank[held], g.held[held], len(g.ranks))  # nodes are in rank order
    late_calls = np.bincount(rank[held], minlength=len(g.ranks))
    total = g.we - g.ws
    columns = (total, np.maximum(0, total - busy), busy - in_calls, in_calls - wait, wait, late_ns, late_calls)
    return {r: RankTime(rank=r, total_ns=t, compute_ns=c, overlapped_ns=o, exposed_ns=e, waiting_ns=w, late_ns=ln,
                        late_calls=lc)
            for r, t, c, o, e, w, ln, lc in zip(g.ranks, *(x.tolist() for x in columns))}


def _sum_by_rank(rank: np.ndarray, values: np.ndarray, ranks: int) -> np.ndarray:
    """Per rank index, the sum of `values` (`rank` ascending), exactly."""
    total = np.concatenate([[0], np.cumsum(values)])
    at = np.searchsorted(rank, np.arange(ranks + 1))
    return total[at[1:]] - total[at[:-1]]


def _unions_by_rank(g: _Graph, rank: np.ndarray, lo: np.ndarray, hi: np.ndarray, sets: np.ndarray) -> list:
    """Per rank index, the length of the union of its intervals [lo, hi) (each within its
    window) in sets 0, 0-1 and 0-2: the ranks' windows laid end to end, one sort, and one
    running maximum per union."""
    keep = hi > lo
    rank, lo, hi, sets = rank[keep], lo[keep], hi[keep], sets[keep]
    if float((g.we.astype(float) - g.ws.astype(float) + 1).sum()) >= 2.0**61:  # too long to lay end to end
        return _unions_one_by_one(len(g.ranks), rank, lo, hi, sets)
    room = g.we - g.ws + 1
    off = (np.cumsum(room) - room)[rank] - g.ws[rank]  # each window's start laid at its place
    by = np.argsort(lo + off, kind="stable")
    a, b, rank, sets = lo[by] + off[by], hi[by] + off[by], rank[by], sets[by]
    out = []
    for upto in range(3):
        mine = sets <= upto
        x, y, r = a[mine], b[mine], rank[mine]
        if not len(x):
            out.append(np.zeros(len(g.ranks), np.int64))
            continue
        reach = np.maximum.accumulate(y)
        at = np.flatnonzero(np.r_[True, x[1:] > reach[:-1]])
        out.append(_sum_by_rank(r[at], np.maximum.reduceat(y, at) - x[at], len(g.ranks)))
    return out


def _unions_one_by_one(ranks: int, rank, lo, hi, sets) -> list:
    """What `_unions_by_rank` gives, a rank at a time."""
    by = np.argsort(rank, kind="stable")
    cut = np.searchsorted(rank[by], np.arange(ranks + 1)).tolist()
    out = [np.zeros(ranks, np.int64) for _ in range(3)]
    for k in range(ranks):
        mine = by[cut[k] : cut[k + 1]]
        for upto in range(3):
            i = mine[sets[mine] <= upto]
            out[upto][k] = _measure(zip(lo[i].tolist(), hi[i].tolist()))
    return out


def _measure(intervals) -> int:
    """Length of the union of intervals."""
    total = 0
    cur_lo = cur_hi = None
    for lo, hi in sorted(intervals):
        if hi <= lo:
            continue
        if cur_hi is None or lo > cur_hi:
            if cur_hi is not None:
                total += cur_hi - cur_lo
            cur_lo, cur_hi = lo, hi
        elif hi > cur_hi:
            cur_hi = hi
    if cur_hi is not None:
        total += cur_hi - cur_lo
    return total


# --- re-timing, a level at a time ---------------------------------------------------------
#
# The model's times form a graph: a call's entry follows its rank's previous call (its
# completion, or an async call's return) and the async calls it sees complete; a call's
# completion follows its members' entries. Where that graph has no cycle (every rank goes
# on after every call but its last, and no call waits on itself), it is timed here in
# topological levels, each level's calls at once, and every re-timing of a step shares
# one order: the same times `_Timing` finds event by event. Otherwise (buffered sends that
# cross, a rank that goes on after a call that never completed) `_Timing` times it.


@dataclass(slots=True)
class _Plan:
    """What every re-timing of one step shares. Its nodes are the graph's n calls, then
    one per rank index: the rank's step end (reached from its last call)."""

    rank: np.ndarray  # node -> rank index
    prev: np.ndarray  # node -> the call before it on its rank (-1: none; it starts at the step's start)
    after_done: np.ndarray  # it resumes from `prev`'s completion (a blocking call); else from its return
    resume_off: np.ndarray  # an async `prev`: its return minus its entry
    gap: np.ndarray  # the recorded time from that resumption to its entry, less waiting for async calls
    stuck: np.ndarray  # a step end: the rank's last call never completed, and the rank ends in it
    pend: np.ndarray  # pairs, by (node, call): an async call ...
    at: np.ndarray  # ... and the node whose entry it is first seen completed by
    since: np.ndarray  # ... and the recorded time from its completion to that entry


def _plan(g: _Graph) -> _Plan | None:
    """The shared arrays, or None where the step must be timed event by event: a rank goes
    on after a call that never completed, or the windows are too long to lay end to end
    (and where there is no call: nothing to gain)."""
    n, nr = len(g.start), len(g.ranks)
    if not n:
        return None
    first, after = g.rank_ptr[:-1], g.rank_ptr[1:]
    ends = g.end == NONE
    last = after[after > first] - 1
    if ends.sum() > ends[last].sum() or float((g.we.astype(float) - g.ws.astype(float) + 1).sum()) >= 2.0**61:
        return None
    rank = np.concatenate([g.rank_of, np.arange(nr)])
    prev = np.concatenate([np.arange(n) - 1, after - 1])
    prev[first[after > first]] = -1
    prev[n:][after == first] = -1
    stuck = np.zeros(n + nr, bool)
    stuck[n + g.rank_of[last]] = ends[last]
    has = prev >= 0
    pv = np.where(has, prev, 0)
    is_async = has & g.async_op[pv]
    rec = np.concatenate([g.start, g.we])
    t_rec = np.where(is_async, g.issued[pv], np.where(has & ~ends[pv], g.end[pv], g.ws[rank]))
    pend, at = _pendings(g, ends, stuck)
    waited = np.zeros(n + nr, np.int64)
    seen = np.minimum(np.minimum(g.end[pend], g.last_entry[g.key[pend]]), rec[at])
    np.maximum.at(waited, at, seen - np.maximum(g.issued[pend], t_rec[at]))
    return _Plan(rank=rank, prev=prev, after_done=has & ~is_async & ~stuck,
                 resume_off=np.where(is_async, g.issued[pv] - g.start[pv], 0),
                 gap=np.maximum(0, rec - t_rec - waited), stuck=stuck, pend=pend, at=at,
                 since=rec[at] - g.end[pend])


def _pendings(g: _Graph, ends: np.ndarray, stuck: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each completed async call and the node whose entry first comes at or after its
    completion on its rank (the rank's step end if none), sorted by (node, call)."""
    n = len(g.start)
    room = g.we - g.ws + 1
    off = (np.cumsum(room) - room)[g.rank_of] - g.ws[g.rank_of]  # the ranks' windows laid end to end
    calls = np.flatnonzero(g.async_op & ~ends)
    found = np.searchsorted(g.start + off, g.end[calls] + off[calls], "left")
    at = np.maximum(found, calls + 1)
    rank = g.rank_of[calls]
    at = np.where(at < g.rank_ptr[1:][rank], at, n + rank)
    keep = ~stuck[at]
    calls, at = calls[keep], at[keep]
    by = np.lexsort((calls, at))
    return calls[by], at[by]


def _levels(g: _Graph, plan: _Plan, clamped: np.ndarray) -> list[tuple] | None:
    """The nodes and keys in topological levels, each level's as `_evaluate` takes them:
    (nodes, their pairs, the places of those pairs' nodes in `nodes`, the pairs' segment
    starts, keys, their members, the members' segment starts). `clamped`: calls whose
    rank waits for their key to close (an on-time rank's calls where it held others up).
    None: the graph has a cycle."""
    n, nr = len(g.start), len(g.ranks)
    m = n + nr
    prev, u = plan.prev, np.arange(m)
    has = prev >= 0
    pv = np.where(has, prev, 0)
    via_key = has & (plan.after_done | clamped[pv])
    src = np.concatenate([np.where(via_key, m + g.key[pv], pv)[has], m + g.key[plan.pend], np.arange(n)])
    dst = np.concatenate([u[has], plan.at, m + g.key])
    level = _topological(m + len(g.key_ptr) - 1, src, dst)
    if level is None:
        return None
    return _by_level(g, plan, level, m)


def _topological(size: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray | None:
    """Each unit's level (Kahn's algorithm a level at a time; an edge given twice counts
    twice each way), or None if there is a cycle."""
    by = np.argsort(src, kind="stable")
    dst = dst[by]
    indeg = np.bincount(dst, minlength=size)
    ptr = np.zeros(size + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=size), out=ptr[1:])
    level = np.full(size, -1, np.int64)
    now = np.flatnonzero(indeg == 0)
    depth = 0
    while len(now):
        level[now] = depth
        count = ptr[now + 1] - ptr[now]
        total = int(count.sum())
        if not total:
            break
        nxt = np.sort(dst[np.repeat(ptr[now] - (np.cumsum(count) - count), count) + np.arange(total)])
        first = np.flatnonzero(np.r_[True, nxt[1:] != nxt[:-1]])
        nxt = nxt[first]
        indeg[nxt] -= np.diff(np.r_[first, total])
        now = nxt[indeg[nxt] == 0]
        depth += 1
    return None if (level < 0).any() else level


def _by_level(g: _Graph, plan: _Plan, level: np.ndarray, m: int) -> list[tuple]:
    units = np.argsort(level, kind="stable")
    bounds = np.searchsorted(level[units], np.arange(int(level.max()) + 2))
    pair_by = np.lexsort((plan.pend, plan.at, level[plan.at]))
    pair_bounds = np.searchsorted(level[plan.at[pair_by]], np.arange(int(level.max()) + 2))
    out = []
    for d in range(len(bounds) - 1):
        here = units[bounds[d] : bounds[d + 1]]
        nodes, keys = here[here < m], here[here >= m] - m
        pairs = pair_by[pair_bounds[d] : pair_bounds[d + 1]]
        at = plan.at[pairs]
        cut = np.flatnonzero(np.r_[True, at[1:] != at[:-1]]) if len(at) else at
        places = np.searchsorted(nodes, at[cut])
        sizes = g.key_ptr[keys + 1] - g.key_ptr[keys]
        members = g.key_nodes[np.repeat(g.key_ptr[keys] - (np.cumsum(sizes) - sizes), sizes) + np.arange(sizes.sum())]
        out.append((nodes, pairs, places, cut, keys, members, np.cumsum(sizes) - sizes))
    return out


def _evaluate(g: _Graph, plan: _Plan, levels: list[tuple], clamp: np.ndarray | None, gap: np.ndarray,
              since: np.ndarray, causes: bool = False) -> tuple:
    """Time the step's nodes a level at a time, one column per re-timing: (entry,
    completion, cause, pending), entries (nodes x columns) and completions (calls x
    columns) as `_Timing` gives them. `clamp` (calls x columns): the calls an on-time rank
    enters no later than the latest of the other members (and no sooner than it could).
    `causes` (one column): for each node, the call its entry followed (-1: the step's
    start) and whether that call is an async call it saw complete (`pending`), else its
    rank's previous call."""
    n, m = len(g.start), len(plan.prev)
    cols = 1 if clamp is None else clamp.shape[1]
    entry = np.full((m, cols), NONE, np.int64)
    done = np.full((n, cols), NONE, np.int64)
    natural = floor = None
    if clamp is not None:
        natural, floor = np.full((m, cols), NONE, np.int64), np.zeros((m, cols), np.int64)
    cause, pending = np.full(m, -1, np.int64), np.zeros(m, bool)
    start_of = g.ws[plan.rank]
    for nodes, pairs, places, cut, keys, members, seg in levels:
        if len(nodes):
            t, tm = _enter(plan, nodes, pairs, places, cut, entry, done, start_of, gap, since,
                           causes and (cause, pending))
            entry[nodes] = t
            if clamp is not None:
                natural[nodes], floor[nodes] = t, tm
                calls = nodes < n
                entry[nodes[calls]] = np.where(clamp[nodes[calls]], NONE, t[calls])
        if len(keys):
            _close_keys(g, members, seg, entry, done, clamp, natural, floor)
    return entry, done, cause, pending


def _enter(plan, nodes, pairs, places, cut, entry, done, start_of, gap, since, causes) -> tuple:
    """One level's entries before any clamp (nodes x columns), and when each rank resumed."""
    pv = plan.prev[nodes]
    at = np.maximum(pv, 0)
    tm = np.where(plan.after_done[nodes, None], done[at], entry[at] + plan.resume_off[nodes, None])
    tm = np.where(pv[:, None] >= 0, tm, start_of[nodes, None])
    t = tm + gap[nodes, None]
    if causes:
        causes[0][nodes] = pv
    if len(pairs):
        seen = done[plan.pend[pairs]] + since[pairs, None]
        best = np.maximum.reduceat(seen, cut, axis=0)
        before = t[places]
        t[places] = np.maximum(before, best)
        if causes:  # the first call (in issue order) that completed last, where it beat the gap
            sizes = np.diff(np.r_[cut, len(pairs)])
            tops = np.flatnonzero(seen[:, 0] == np.repeat(best[:, 0], sizes))
            which = np.repeat(np.arange(len(cut)), sizes)[tops]
            first = np.r_[True, which[1:] != which[:-1]]
            won = best[:, 0] >= before[:, 0]
            causes[0][nodes[places[won]]] = plan.pend[pairs[tops[first]]][won]
            causes[1][nodes[places[won]]] = True
    stuck = plan.stuck[nodes]
    if stuck.any():
        t[stuck] = entry[pv[stuck]]
    return t, tm


def _close_keys(g, members, seg, entry, done, clamp, natural, floor) -> None:
    """Every member of a level's keys has its entry (a clamped one: its natural entry):
    settle the clamped members' entries, then every member's completion."""
    sizes = np.diff(np.r_[seg, len(members)])
    if clamp is not None and clamp[members].any():
        nat = natural[members]
        top = np.repeat(np.maximum.reduceat(nat, seg, axis=0), sizes, axis=0)
        is_top = nat == top
        alone = np.repeat(np.add.reduceat(is_top.astype(np.int64), seg, axis=0), sizes, axis=0) == 1
        second = np.repeat(np.maximum.reduceat(np.where(is_top, NONE, nat), seg, axis=0), sizes, axis=0)
        others = np.where(is_top & alone, second, top)
        fixed = np.maximum(floor[members], np.minimum(nat, others))
        entry[members] = np.where(clamp[members], fixed, entry[members])
    e = entry[members]
    latest = np.repeat(np.maximum.reduceat(e, seg, axis=0), sizes, axis=0)
    last = g.last_entry[g.key[members]][:, None]
    end, start = g.end[members][:, None], g.start[members][:, None]
    d = np.where(end >= last, np.maximum(e, latest + (end - last)), e + (end - start))
    done[members] = np.where(end == NONE, NONE, d)


def _scaled(plan: _Plan, slow: dict[int, float] | None, g: _Graph) -> tuple[np.ndarray, np.ndarray]:
    """The plan's gaps and times since, with ranks' time between calls stretched (`slow`)."""
    if not slow:
        return plan.gap, plan.since
    scale = np.array([slow.get(r, 1.0) for r in g.ranks], np.float64)
    has = np.array([r in slow for r in g.ranks], bool)
    gap = np.where(has[plan.rank], (plan.gap * scale[plan.rank]).astype(np.int64), plan.gap)
    r = plan.rank[plan.at]
    since = np.where(has[r], (plan.since * scale[r]).astype(np.int64), plan.since)
    return gap, since


def _fast_times(g: _Graph, plan: _Plan, levels: list[tuple]) -> "_Times":
    """The step re-timed unchanged, with what set each time."""
    n = len(g.start)
    entry, done, cause, pending = _evaluate(g, plan, levels, None, plan.gap, plan.since, causes=True)
    end_cause = {}
    for k, r in enumerate(g.ranks):
        i = int(cause[n + k])
        kind = "stuck" if plan.stuck[n + k] else "pending" if pending[n + k] else "gap"
        end_cause[r] = (kind, None if i < 0 else i)
    return _Times(entry=entry[:n, 0], done=done[:, 0], cause=cause[:n], pending=pending[:n],
                  end=dict(zip(g.ranks, entry[n:, 0].tolist())), end_cause=end_cause)


def _fast_spans(g: _Graph, plan: _Plan, on_time: list[Iterable[int]], slow=None,
                levels: list[tuple] | None = None) -> list[int] | None:
    """The step's span re-timed once per set of on-time ranks, all at once (in `levels`
    where they allow for those ranks' clamps); None if its graph, with those clamps, has
    a cycle."""
    where = {r: k for k, r in enumerate(g.ranks)}
    chosen = np.zeros((len(on_time), len(g.ranks)), bool)
    for row, ranks in enumerate(on_time):
        chosen[row, [where[r] for r in ranks if r in where]] = True
    clamp = (g.held > 0)[:, None] & chosen.T[g.rank_of]
    levels = levels or _levels(g, plan, clamp.any(axis=1))
    if levels is None:
        return None
    entry = _evaluate(g, plan, levels, clamp, *_scaled(plan, slow, g))[0]
    return (entry[len(g.start):].max(axis=0) - g.ws.min()).tolist()


# --- re-timing, event by event -------------------------------------------------------------


@dataclass(slots=True)
class _Times:
    """One re-timing, as the critical path reads it."""

    entry: np.ndarray  # node -> modelled entry (NONE: never reached)
    done: np.ndarray  # node -> modelled completion (NONE: none)
    cause: np.ndarray  # node -> the call its entry followed (-1: its step's start)
    pending: np.ndarray  # node -> that call is an async call it saw complete (else its rank's previous call)
    end: dict[int, int]  # rank -> its step's modelled end
    end_cause: dict[int, tuple]  # rank -> ("gap" | "pending" | "stuck", node or None)
    last_in: dict[int, int] | None = None  # key -> the member that entered last (None: the latest entry's)

    def entry_cause(self, i: int) -> tuple:
        c = int(self.cause[i])
        return ("pending", c) if self.pending[i] else ("gap", None if c < 0 else c)

    def last_member(self, g: _Graph, key: int, default: int) -> int:
        if self.last_in is not None:
            return self.last_in.get(key, default)
        mem = g.members(key)
        e = self.entry[mem]
        top = mem[e == e.max()]
        return int(top[np.argmax(g.start[top])])


@dataclass(slots=True)
class _Node:
    """One rank's call in one step (times on rank 0's clock), as `_Timing` reads it."""

    rank: int
    key: int
    start: int
    end: int | None  # None: never completed
    issued: int  # an async call: when it returned to the program; else its start
    async_op: bool
    op: str


@dataclass(slots=True)
class _Listed:
    """A `_Graph` as lists, for `_Timing`."""

    ranks: list[int]
    nodes: list[_Node]
    by_rank: dict[int, list[int]]  # rank -> its node ids, in call order
    members: list[list[int]]  # key -> node ids of the members present
    window: dict[int, tuple[int, int]]  # rank -> (step start, step end), recorded
    last_entry: list[int]  # key -> the latest recorded entry among its members
    held: dict[int, int]  # node id -> how late it entered a call whose other members it held up


def _listed(g: _Graph) -> _Listed:
    rank = [g.ranks[k] for k in g.rank_of.tolist()]
    end = [None if e == NONE else e for e in g.end.tolist()]
    nodes = [_Node(*x) for x in zip(rank, g.key.tolist(), g.start.tolist(), end, g.issued.tolist(),
                                    g.async_op.tolist(), [g.values[o] for o in g.op.tolist()])]
    ptr, kp = g.rank_ptr.tolist(), g.key_ptr.tolist()
    nodes_by_key = g.key_nodes.tolist()
    return _Listed(ranks=g.ranks, nodes=nodes, by_rank={r: list(range(ptr[k], ptr[k + 1])) for k, r in enumerate(g.ranks)},
                   members=[nodes_by_key[kp[k] : kp[k + 1]] for k in range(len(kp) - 1)],
                   window=dict(zip(g.ranks, zip(g.ws.tolist(), g.we.tolist()))), last_entry=g.last_entry.tolist(),
                   held={i: v for i, v in zip(np.flatnonzero(g.held).tolist(), g.held[g.held > 0].tolist())})


class _Timing:
    """One re-timing of a step's graph, event by event: when each node is entered and
    completes. The reference for `_evaluate`, and what times a step whose graph has a cycle.

    `slow`: rank -> factor on its time between calls (as `replay --slow-rank`).
    `on_time`: ranks never later than the latest of the other members into a call where
    they held them up (`_Graph.held`).
    The causes of each time are kept, for the critical path.
    """

    def __init__(self, g: _Graph, *, slow: dict[int, float] | None = None, on_time: Iterable[int] = ()):
        self.g = g = _listed(g)
        self.slow = slow or {}
        self.on_time = frozenset(on_time)
        n = len(g.nodes)
        self.natural: list[int | None] = [None] * n  # entry before any clamp
        self.entry: list[int | None] = [None] * n
        self.done: list[int | None] = [None] * n
        self.entry_cause: list[tuple | None] = [None] * n  # ("gap", node id | None) or ("pending", node id)
        self.floor: list[int] = [0] * n
        self.last_in: dict[int, int] = {}  # key -> node id of the member that entered last
        self.closed: set[int] = set()  # keys whose members' times are final
        self.registered: dict[int, int] = {}
        self._first_in: dict[int, int] = {}  # key -> the earliest natural entry among those registered
        self.end: dict[int, int] = {}  # rank -> its step's modelled end
        self.end_cause: dict[int, tuple] = {}
        self._run()

    def _run(self) -> None:
        g = self.g
        self._pos = dict.fromkeys(g.ranks, 0)
        self._resume = {r: (g.window[r][0], g.window[r][0], None) for r in g.ranks}  # (model, recorded, node)
        self._pending: dict[int, list[int]] = {r: [] for r in g.ranks}
        self._blocked: dict[int, list[int]] = {}  # key -> ranks that wait for it to close
        self._ready = deque(g.ranks)
        left = set(g.ranks)
        ready, blocked, closed, advance = self._ready, self._blocked, self.closed, self._advance
        stuck: list[tuple[int, int]] = []  # heap of (first entry, key) of the keys ranks wait on
        while left:
            while ready:
                r = ready.popleft()
                if r not in left:
                    continue
                wait = advance(r)
                if wait is None:
                    left.discard(r)
                elif wait in closed:
                    ready.append(r)
                else:
                    if wait not in blocked:
                        heapq.heappush(stuck, (self._first_in.get(wait, 0), wait))
                    blocked.setdefault(wait, []).append(r)
            # Nothing moves: a call some members never make in this step (a hang, or
            # members recorded in another step) or an on-time rank's clamp that waits on
            # itself. Close the stuck call whose first member came earliest, with the
            # members that came.
            while stuck and (stuck[0][1] in closed or stuck[0][1] not in blocked):
                heapq.heappop(stuck)
            if not left or not stuck:
                break
            self._close(heapq.heappop(stuck)[1])

    def _advance(self, r: int) -> int | None:
        """Move rank `r` as far as it can; the key it waits on, or None when its step is done."""
        g = self.g
        nodes, natural, entry, done = g.nodes, self.natural, self.entry, self.done
        ids = g.by_rank.get(r, ())
        pos = self._pos[r]
        late_ok = r not in self.on_time
        while pos < len(ids):
            i = ids[pos]
            n = nodes[i]
            if natural[i] is None:
                at = self._reach(r, n.start)
                if len(at) == 1:
                    self._pos[r] = pos
                    return at[0]
                natural[i], self.entry_cause[i] = at
                self.floor[i] = self._resume[r][0]
                if late_ok or i not in g.held or n.key in self.closed:
                    entry[i] = at[0]
                self._register(i)
            if entry[i] is None:
                self._pos[r] = pos
                return n.key  # on time: its entry waits for the other members'
            if n.end is None:  # never completed: the rank's step ends stuck here
                self.end[r] = entry[i]
                self.end_cause[r] = ("stuck", i)
                self._pos[r] = pos
                return None
            if n.async_op:
                issue = n.issued - n.start
                self._resume[r] = (entry[i] + issue, n.start + issue, i)
                self._pending[r].append(i)
                pos += 1
                continue
            if done[i] is None:
                if n.key not in self.closed:
                    self._pos[r] = pos
                    return n.key
                done[i] = entry[i] + (n.end - n.start)
            self._resume[r] = (done[i], n.end, i)
            pos += 1
        self._pos[r] = pos
        at = self._reach(r, g.window[r][1])
        if len(at) == 1:
            return at[0]
        self.end[r], self.end_cause[r] = at
        return None

    def _reach(self, r: int, rec_t: int) -> tuple:
        """When rank `r` reaches the point it recorded at `rec_t` (a call's entry, its
        step's end): (time, cause), or (key,) of an async call it must see complete first.

        From where it resumed, the recorded time in between; and, after each async call
        that completed before `rec_t`, that call's completion plus the recorded time
        since. The part of the time in between that such a call spent before its last
        member entered is taken as waiting, not compute (a wait() soon after the call,
        as DTensor's and FSDP's make): it shrinks when that member comes sooner.
        """
        t_model, t_rec, src = self._resume[r]
        scale = self.slow.get(r)
        pending = self._pending[r]
        if not pending:
            gap = rec_t - t_rec
            if gap <= 0:
                return t_model, ("gap", src)
            return t_model + (gap if scale is None else int(gap * scale)), ("gap", src)
        g = self.g
        keep = []
        waited = 0
        best = None
        for p in pending:
            pn = g.nodes[p]
            if pn.end is None or pn.end > rec_t:
                keep.append(p)
                continue
            if self.done[p] is None:
                if pn.key in self.closed:
                    continue  # closed without it (nothing else could move): no completion known
                return (pn.key,)
            since = rec_t - pn.end
            c = self.done[p] + (since if scale is None else int(since * scale))
            if best is None or c > best[0]:
                best = (c, ("pending", p))
            waited = max(waited, min(pn.end, g.last_entry[pn.key], rec_t) - max(pn.issued, t_rec))
        self._pending[r] = keep
        gap = max(0, rec_t - t_rec - waited)
        t = t_model + (gap if scale is None else int(gap * scale))
        if best is not None and best[0] >= t:
            return best
        return t, ("gap", src)

    def _register(self, i: int) -> None:
        n = self.g.nodes[i]
        key = n.key
        if key in self.closed:
            self.entry[i] = self.natural[i]
            if n.end is not None:
                self.done[i] = self.entry[i] + (n.end - n.start)
            return
        count = self.registered[key] = self.registered.get(key, 0) + 1
        first = self._first_in.get(key)
        if first is None or self.natural[i] < first:
            self._first_in[key] = self.natural[i]
        if count == len(self.g.members[key]):
            self._close(key)

    def _close(self, key: int) -> None:
        """Every member present has its natural entry (or, when nothing else moves, those
        that came): settle the on-time members' entries, then every member's completion."""
        g = self.g
        nodes, natural, entry, done = g.nodes, self.natural, self.entry, self.done
        self.closed.add(key)
        self._ready.extend(self._blocked.pop(key, ()))
        members = g.members[key]
        ids = members if self.registered.get(key) == len(members) else [i for i in members if natural[i] is not None]
        if not ids:
            return
        # each member's latest other natural entry, from the top two (a group of 4096
        # members made the list of the others, for each member, the whole step's cost)
        vals = [natural[j] for j in ids]
        top = max(vals)
        at = vals.index(top)
        second = max(vals[:at] + vals[at + 1:]) if len(vals) > 1 else None
        for k, i in enumerate(ids):
            if entry[i] is None:
                t = natural[i]
                others = second if k == at else top
                entry[i] = max(self.floor[i], min(t, others)) if len(ids) > 1 else t
        last = ids[0]
        latest_rec = nodes[last].start
        for j in ids:
            if (entry[j], nodes[j].start) > (entry[last], nodes[last].start):
                last = j
            if nodes[j].start > latest_rec:
                latest_rec = nodes[j].start
        self.last_in[key] = last
        latest = entry[last]
        for i in ids:
            n = nodes[i]
            if n.end is None:
                continue
            if n.end >= latest_rec:
                done[i] = max(entry[i], latest + (n.end - latest_rec))
            else:  # it did not need the last member (a buffered send; clocks apart)
                done[i] = entry[i] + (n.end - n.start)

    def span(self) -> int:
        if not self.end:
            return 0
        return max(self.end.values()) - min(self.g.window[r][0] for r in self.end)

    def times(self) -> _Times:
        n = len(self.g.nodes)
        cause = np.full(n, -1, np.int64)
        pending = np.zeros(n, bool)
        for i, c in enumerate(self.entry_cause):
            if c is not None:
                pending[i] = c[0] == "pending"
                cause[i] = -1 if c[1] is None else c[1]
        return _Times(entry=np.array([NONE if e is None else e for e in self.entry], np.int64),
                      done=np.array([NONE if d is None else d for d in self.done], np.int64), cause=cause,
                      pending=pending, end=self.end, end_cause=self.end_cause, last_in=self.last_in)


# --- the critical path ---------------------------------------------------------------------


def _critical_path(g: _Graph, t: _Times) -> tuple[CriticalPath, dict[int, int]]:
    """Walk back from the rank that ends last through what set each time: the gap before
    a call, the call's last member, an async call waited for. Also, for each rank the path
    passes, how much later than the other members it entered the calls on the path it
    entered last (about what its re-timing could gain)."""
    path = CriticalPath()
    late: dict[int, int] = {}
    if not t.end:
        return path, late
    rank = max(t.end, key=lambda r: (t.end[r], -r))
    segs: list[Segment] = []
    at, cause = t.end[rank], t.end_cause[rank]

    def through(i: int) -> tuple:
        """The path passes node i's entry: note how late its rank was into the call."""
        mem = g.members(int(g.key[i]))
        e = t.entry[mem]
        others = e[(mem != i) & (e != NONE)]
        if g.held[i] and len(others) and t.entry[i] > others.max():
            r = g.ranks[g.rank_of[i]]
            late[r] = late.get(r, 0) + int(t.entry[i] - others.max())
        return int(t.entry[i]), t.entry_cause(i)

    budget = 2 * len(g.start) + 8
    while budget > 0:
        budget -= 1
        kind, i = cause
        if kind == "stuck":
            at, cause = through(i)
            continue
        if i is None:  # the gap from the step's start
            segs.append(Segment(rank, "compute", "", int(g.ws[g.ranks.index(rank)]), at))
            break
        group, seq = g.group_seq(i)
        entry = int(t.entry[i])
        if kind == "pending" or not g.async_op[i]:
            # resumed where call i completed: the call ran from its last member's entry
            done = int(t.done[i])
            segs.append(Segment(rank, "compute", "", done, at))
            last = t.last_member(g, int(g.key[i]), i)
            lt = int(t.entry[last])
            segs.append(Segment(rank, "comm", g.op_name(i), max(lt, entry), done, group, seq))
            if last != i and lt > entry:
                rank = g.ranks[g.rank_of[last]]
                at, cause = through(last)
                continue
            at, cause = through(i)
            continue
        # resumed where async call i returned
        issue = entry + int(g.issued[i] - g.start[i])
        segs.append(Segment(rank, "compute", "", issue, at))
        segs.append(Segment(rank, "comm", g.op_name(i), entry, issue, group, seq))
        at, cause = through(i)
    segs.reverse()
    path.segments = [s for s in segs if s.end_ns > s.start_ns]
    return path, late


# --- the public face -----------------------------------------------------------------------


def _steps_of(bundle: Bundle, ranks: list[int]) -> list[int]:
    """The bundle's steps; without Step records (an imported dump), those the chunk index names."""
    steps = bundle.steps
    if steps:
        return steps
    found: set[int] = set()
    for rank in ranks:
        for ref in bundle.chunks(rank):
            lo, hi = ref.step_first, ref.step_last
            if 0 <= hi - lo <= _MAX_STEP_RUN:
                found.update(range(lo, hi + 1))
            else:
                found.update((lo, hi))
    return sorted(found)


def attribute_step(bundle: Bundle, step: int, *, ranks: list[int] | None = None,
                   offsets: dict[int, int] | None = None, candidates: int = MAX_CANDIDATES,
                   of: Iterable[int] | None = None) -> StepAttribution:
    """Split step `step` of every recorded rank (or `ranks`) four ways, find its critical
    path and what each late rank on it cost (re-timing at most `candidates` of them, and
    only ranks in `of` where given)."""
    ranks = bundle.recorded_ranks if ranks is None else ranks
    offsets = clock_offsets(bundle, ranks) if offsets is None else offsets
    return _attribute_graph(_read_step(bundle, step, ranks, offsets), step, candidates, of)


def _attribute_graph(g: _Graph, step: int, candidates: int, of: Iterable[int] | None = None) -> StepAttribution:
    out = StepAttribution(step=step, span_ns=0, modelled_ns=0, ranks=_split(g))
    if not g.ranks:
        return out
    out.span_ns = int(g.we.max() - g.ws.min())
    out.call_durations = bool((np.where(g.end == NONE, g.we[g.rank_of], g.end) > g.start).any())
    plan = _plan(g)
    # one order for the base and every on-time rank's re-timing, where the clamps allow it
    every = None if plan is None else _levels(g, plan, g.held > 0)
    levels = every or (None if plan is None else _levels(g, plan, np.zeros(len(g.start), bool)))
    base = _Timing(g).times() if levels is None else _fast_times(g, plan, levels)
    out.modelled_ns = int(max(base.end.values()) - g.ws.min())
    out.critical_path, path_late = _critical_path(g, base)
    # A rank's re-timing can gain at most about its lateness along the path: ranks late
    # by a sliver of the step are not worth one re-timing of the whole step each.
    floor = max(1, int(out.modelled_ns * MIN_LATE_FRACTION))
    of = None if of is None else set(of)
    late = sorted((r for r, ns in path_late.items() if ns >= floor and (of is None or r in of)),
                  key=lambda r: (-path_late[r], r))[:candidates]
    spans = None if levels is None or not late else _fast_spans(g, plan, [(r,) for r in late], levels=every)
    if spans is None:
        spans = [_Timing(g, on_time=(r,)).span() for r in late]
    for r, span in zip(late, spans):
        t = out.ranks[r]
        out.stragglers.append(StragglerCost(rank=r, step=step, cost_ns=max(0, out.modelled_ns - span),
                                            late_ns=t.late_ns, late_calls=t.late_calls))
    out.stragglers.sort(key=lambda s: (-s.cost_ns, s.rank))
    return out


def attribute(bundle: Bundle, *, steps: tuple[int, int] | None = None, ranks: list[int] | None = None,
              candidates: int = MAX_CANDIDATES, of: Iterable[int] | None = None,
              processes: int | None = None, progress=None) -> Iterator[StepAttribution]:
    """`attribute_step` for each step (of `steps` a..b inclusive, if given), one step in
    memory at a time: what the TUI and `prism-rr analyze` read. `of`: only these ranks'
    costs (each costs a re-timing of the step: diagnose asks for its stragglers').
    `processes`: as build_graph's (from PARALLEL_FROM_RANKS ranks, a second process reads
    part of each batch). `progress(batch, batches, (first step, last step))` before each
    batch of steps is read, where there is more than one (a bundle of 8192 x 10,000 takes
    minutes)."""
    ranks = bundle.recorded_ranks if ranks is None else [r for r in ranks if r in set(bundle.recorded_ranks)]
    offsets = clock_offsets(bundle, ranks)
    every = _steps_of(bundle, ranks)
    todo = [s for s in every if steps is None or steps[0] <= s <= steps[1]]
    # Steps are read in batches, each rank's chunks once a batch (a chunk often holds many
    # steps: read step by step, it was decoded once for each), as columns (ColumnReader),
    # as many steps a batch as keep about BATCH_RECORDS records in memory.
    per_step = max(1, bundle.event_count // max(1, len(every)))
    members = _group_members(bundle, ranks)
    size = max(1, BATCH_RECORDS // per_step)
    batches = -(-len(todo) // size)
    for i in range(0, len(todo), size):
        batch = todo[i : i + size]
        if progress is not None and batches > 1:
            progress(i // size + 1, batches, (batch[0], batch[-1]))
        reader = ColumnReader(bundle, figures=False, attribution=True)
        cols = [_slim(c) for _, c in read_columns(bundle, reader, ranks, offsets, (batch[0], batch[-1]), processes)]
        calls = _batch(cols, ranks, reader.values)
        del cols
        for step in batch:
            g = _assemble(_step_calls(calls, step), _unended(bundle, step, ranks, offsets, members))
            yield _attribute_graph(g, step, candidates, of)


def retimed_span(bundle: Bundle, step: int, *, slow: dict[int, float] | None = None,
                 on_time: Iterable[int] = ()) -> int:
    """Step `step`'s span (ns) re-timed on its graph with ranks' time between calls
    stretched (`slow`: rank -> factor, as `replay --slow-rank`) or their lateness removed."""
    ranks = bundle.recorded_ranks
    g = _read_step(bundle, step, ranks, clock_offsets(bundle, ranks))
    on_time = tuple(on_time)
    plan = None if not g.ranks else _plan(g)
    spans = None if plan is None else _fast_spans(g, plan, [on_time], slow)
    return spans[0] if spans is not None else _Timing(g, slow=slow, on_time=on_time).span()


def _tally(attributions: Iterable[StepAttribution], by_rank: dict[int, dict]) -> Iterator[StepAttribution]:
    """Pass each step on, adding its stragglers' costs into `by_rank`: totals over steps
    without keeping the steps."""
    for a in attributions:
        for s in a.stragglers:
            if s.cost_ns > 0:
                e = by_rank.setdefault(s.rank, {"rank": s.rank, "cost_ns": 0, "steps": [], "late_calls": 0})
                e["cost_ns"] += s.cost_ns
                e["steps"].append(s.step)
                e["late_calls"] += s.late_calls
        yield a


def _ranked(by_rank: dict[int, dict]) -> list[dict]:
    return sorted(by_rank.values(), key=lambda e: (-e["cost_ns"], e["rank"]))


def straggler_totals(attributions: Iterable[StepAttribution]) -> list[dict]:
    """Each straggler's cost summed over steps, costliest first:
    {rank, cost_ns, steps: [step, ...], late_calls}."""
    by_rank: dict[int, dict] = {}
    for _ in _tally(attributions, by_rank):
        pass
    return _ranked(by_rank)


def step_json(a: StepAttribution) -> dict:
    """One step as `--json` holds it."""
    path = a.critical_path
    return {
        "step": a.step,
        "span_ns": a.span_ns,
        "modelled_ns": a.modelled_ns,
        "call_durations": a.call_durations,
        "ranks": {str(r): {"total_ns": t.total_ns, "compute_ns": t.compute_ns, "overlapped_ns": t.overlapped_ns,
                           "exposed_ns": t.exposed_ns, "waiting_ns": t.waiting_ns, "late_ns": t.late_ns,
                           "late_calls": t.late_calls}
                  for r, t in sorted(a.ranks.items())},
        "critical_path": {"ranks": path.ranks, "by_kind": path.by_kind(), "total_ns": path.total_ns,
                          "segments": len(path.segments)},
        "stragglers": [{"rank": s.rank, "cost_ns": s.cost_ns, "late_ns": s.late_ns, "late_calls": s.late_calls}
                       for s in a.stragglers],
    }


def attribution_json(attributions: Iterable[StepAttribution]) -> dict:
    """The `--json` form: {"steps": [step_json, ...], "stragglers": straggler_totals}."""
    by_rank: dict[int, dict] = {}
    steps = [step_json(a) for a in _tally(attributions, by_rank)]
    return {"steps": steps, "stragglers": _ranked(by_rank)}


def attribution_json_text(attributions: Iterable[StepAttribution]) -> Iterator[str]:
    """`attribution_json` as JSON text, in pieces, a step at a time: what `prism-rr
    analyze --json` writes, never holding every step of a long run of many ranks."""
    by_rank: dict[int, dict] = {}
    yield '{"steps": ['
    for i, a in enumerate(_tally(attributions, by_rank)):
        yield ("," if i else "") + json.dumps(step_json(a))
    yield '], "stragglers": ' + json.dumps(_ranked(by_rank)) + "}"


# --- for people ----------------------------------------------------------------------------

# Ranks shown per step before the table is cut (the ones that waited most are kept).
_MAX_ROWS = 16
# Costs below this are not shown in text: they print as 0.0 ms.
_SHOWN_NS = 50_000


def _ms(ns: int) -> str:
    return f"{ns / 1e6:,.1f}"


def attribution_lines(attributions: Iterable[StepAttribution]) -> Iterator[str]:
    """`prism-rr analyze`'s text, a step at a time: each rank's split, the critical path
    and the stragglers' costs; then the costs summed over steps."""
    by_rank: dict[int, dict] = {}
    steps = 0
    for a in _tally(attributions, by_rank):
        steps += 1
        if not a.ranks:
            yield f"step {a.step}: nothing recorded"
            continue
        longest = max(a.ranks.values(), key=lambda t: (t.total_ns, -t.rank))
        yield (f"step {a.step}: {_ms(longest.total_ns)} ms on rank {longest.rank}, the longest "
               f"({_ms(a.span_ns)} ms from the first rank's start to the last rank's end)")
        yield f"  {'rank':>6} {'total ms':>10} {'compute':>10} {'overlapped':>10} {'exposed':>10} {'waiting':>10}"
        rows = sorted(a.ranks.values(), key=lambda t: t.rank)
        if len(rows) > _MAX_ROWS:
            rows = sorted(sorted(rows, key=lambda t: (-t.waiting_ns, t.rank))[:_MAX_ROWS], key=lambda t: t.rank)
        for t in rows:
            yield (f"  {t.rank:>6} {_ms(t.total_ns):>10} {_ms(t.compute_ns):>10} {_ms(t.overlapped_ns):>10} "
                   f"{_ms(t.exposed_ns):>10} {_ms(t.waiting_ns):>10}")
        if not a.call_durations:
            yield ("  (no call lasted any time, as in a Flight Recorder dump without timing: waiting "
                   "and transfers cannot be told from compute)")
        if len(a.ranks) > len(rows):
            yield (f"  ... {len(a.ranks) - len(rows)} more ranks (those that waited most are shown; "
                   f"--json has every rank, --ranks picks some)")
        path = a.critical_path
        if path.segments:
            kinds = ", ".join(f"{k} {_ms(v)} ms" for k, v in sorted(path.by_kind().items()))
            hops = path.ranks
            through = " > ".join(str(r) for r in hops[:12]) + (" > ..." if len(hops) > 12 else "")
            yield f"  critical path: ranks {through} ({kinds})"
        costly = [s for s in a.stragglers if s.cost_ns >= _SHOWN_NS]
        if costly:
            yield "  stragglers: " + "; ".join(
                f"rank {s.rank} cost {_ms(s.cost_ns)} ms (late by {_ms(s.late_ns)} ms into "
                f"{s.late_calls} call{'s' if s.late_calls != 1 else ''})" for s in costly)
        else:
            yield "  stragglers: none that cost the step 0.1 ms or more"
    if not steps:
        yield "no step to analyse (none recorded, or none in the steps asked for)"
    yield from straggler_lines([e for e in _ranked(by_rank) if e["cost_ns"] >= _SHOWN_NS])


def straggler_lines(totals: list[dict], *, limit: int = 8) -> Iterator[str]:
    """One line per costly straggler over all steps (what `diagnose` adds), costliest first."""
    if not totals:
        return
    yield "straggler cost (how much sooner the steps would have ended had the rank been on time):"
    for e in totals[:limit]:
        steps = e["steps"]
        where = f"step {steps[0]}" if len(steps) == 1 else f"{len(steps)} steps"
        yield (f"  rank {e['rank']}: {_ms(e['cost_ns'])} ms over {where} "
               f"({_ms(e['cost_ns'] // len(steps))} ms a step)")
    if len(totals) > limit:
        yield f"  ... {len(totals) - limit} more ranks (--json has them all)"
