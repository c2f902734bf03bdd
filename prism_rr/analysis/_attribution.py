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

Imports neither torch nor a UI library; reads bundles through `prism_rr.format`.
"""

from __future__ import annotations

import heapq
import json
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from prism_rr.analysis._build import clock_offsets
from prism_rr.analysis._columns import ColumnReader
from prism_rr.analysis._steps import CriticalPath, Segment
from prism_rr.format import ops
from prism_rr.format.reader import Bundle
from prism_rr.format.records import Collective, PointToPoint, Step

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


@dataclass(slots=True)
class _Node:
    """One rank's call in one step (times on rank 0's clock)."""

    rank: int
    key: tuple  # ("c", group, seq) | ("p", group, src, dst, seq); ("x", rank, i), ("twice", id): alone
    start: int
    end: int | None  # None: never completed
    issued: int | None  # an async call: when it returned to the program
    async_op: bool
    op: str


@dataclass(slots=True)
class _Graph:
    ranks: list[int]
    nodes: list[_Node]
    by_rank: dict[int, list[int]]  # rank -> its node ids, in call order
    members: dict[tuple, list[int]]  # key -> node ids of the members present
    window: dict[int, tuple[int, int]]  # rank -> (step start, step end), recorded
    last_entry: dict[tuple, int]  # key -> the latest recorded entry among its members
    held: dict[int, int]  # node id -> how late it entered a call whose other members it held up
    # ids of calls that waited to their end: never completed, or made in a step the rank did
    # not end (where the run failed or hung) while a member of the group never came
    stranded: set[int] = field(default_factory=set)


def _read_step(bundle: Bundle, step: int, ranks: list[int], offsets: dict[int, int]) -> _Graph:
    """Step `step`'s graph, from each rank's records of the step."""

    def rank_nodes(rank: int):
        off = offsets.get(rank, 0)
        mine: list[_Node] = []
        lo = hi = None
        step_rec = None
        for rec in bundle.events(rank, steps=(step, step)):
            cls = type(rec)
            start = rec.start_ns - off
            end = None if rec.end_ns is None else rec.end_ns - off
            if end is not None and end < start:
                end = start  # a hostile or mis-clocked record: no negative durations
            lo = start if lo is None or start < lo else lo
            tail = start if end is None else end
            hi = tail if hi is None or tail > hi else hi
            if cls is Step:
                if end is not None:
                    step_rec = (start, end)
                continue
            if cls is Collective or cls is PointToPoint:
                issued = None if rec.issued_ns is None else rec.issued_ns - off
                p2p = cls is PointToPoint
                mine.append(_node(rank, p2p, rec.op, rec.group, rec.seq, rec.peer if p2p else 0, start, end,
                                  issued, rec.async_op, len(mine)))
        return None if lo is None else (mine, lo, hi, step_rec)

    return _assemble(ranks, rank_nodes, _unended(bundle, step, ranks, offsets, _group_members(bundle, ranks)))


def _column_nodes(c, step: int, values: list):
    """What `_read_step` makes of one rank's records of `step`, from its columns
    (ColumnReader(attribution=True)): (nodes, first start, last end, Step record), or None."""
    bounds = c.bounds.get(step)
    if bounds is None:
        return None
    rows = np.flatnonzero(c.step == step)
    mine: list[_Node] = []
    if len(rows):
        cols = (c.p2p[rows].tolist(), c.op[rows].tolist(), c.group[rows].tolist(), c.seq[rows].tolist(),
                c.peer[rows].tolist(), c.start[rows].tolist(), c.end[rows].tolist(), c.open[rows].tolist(),
                c.issued[rows].tolist(), c.has_issued[rows].tolist(), c.async_op[rows].tolist())
        for p2p, op, group, seq, peer, start, end, is_open, issued, has, async_op in zip(*cols):
            mine.append(_node(c.rank, p2p, values[op], group, seq, peer, start, None if is_open else max(end, start),
                              issued if has else None, async_op, len(mine)))
    return mine, bounds[0], bounds[1], c.step_span.get(step)


def _node(rank, p2p, op, group, seq, peer, start, end, issued, async_op, index) -> _Node:
    """One call of `rank` (times on rank 0's clock, end None if never completed)."""
    if not p2p:
        key = ("c", group, seq)
    elif peer < 0 or seq < 0:
        key = ("x", rank, index)
    else:
        src, dst = (rank, peer) if not ops.receives(op) else (peer, rank)
        key = ("p", group, src, dst, seq)
    if async_op and issued is not None:
        issued = min(max(issued, start), start if end is None else end)
    else:
        issued = None
    return _Node(rank, key, start, end, issued, bool(async_op), op)


def _assemble(ranks: list[int], rank_nodes, unended: "_Unended | None" = None) -> _Graph:
    """A step's graph from `rank_nodes(rank)`: (its calls in record order, the first start
    and last end of its records, its Step record's (start, end) or None), or None.
    `unended`: where the run failed or hung in the step, when each rank that did not end
    it began it, and each group's members among `ranks`."""
    nodes: list[_Node] = []
    by_rank: dict[int, list[int]] = {}
    members: dict[tuple, list[int]] = {}
    window: dict[int, tuple[int, int]] = {}
    open_ranks: set[int] = set()
    for rank in ranks:
        got = rank_nodes(rank)
        if got is None:
            continue
        mine, lo, hi, step_rec = got
        mine.sort(key=lambda n: n.start)
        ws, we = step_rec if step_rec is not None else (lo, hi)
        if step_rec is None and unended is not None:
            open_ranks.add(rank)
            ws = unended.begun.get(rank, ws)
        window[rank] = (min(ws, lo), max(we, hi))
        ids = by_rank[rank] = []
        for node in mine:
            present = members.setdefault(node.key, [])
            if present and nodes[present[-1]].rank == rank:  # the same call twice on one rank
                node.key = ("twice", len(nodes))
                present = members.setdefault(node.key, [])
            present.append(len(nodes))
            ids.append(len(nodes))
            nodes.append(node)
    last_entry = {key: max(nodes[i].start for i in ids) for key, ids in members.items()}
    stranded = {i for i, n in enumerate(nodes) if n.end is None}
    if unended is not None:
        stranded.update(i for ids in members.values() for i in ids if nodes[i].rank in open_ranks
                        and nodes[i].key[0] == "c" and len(ids) < unended.members.get(nodes[i].key[1], 0))
    return _Graph(ranks=[r for r in ranks if r in window], nodes=nodes, by_rank=by_rank, members=members,
                  window=window, last_entry=last_entry, held=_held(nodes, members), stranded=stranded)


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


def _held(nodes: list[_Node], members: dict[tuple, list[int]]) -> dict[int, int]:
    """The calls a member entered last while another member's call was still running
    (blocked, or an async call it waited for): node id -> its entry minus the one before.
    Lateness into a call nobody was still in (a buffered send, a dump's untimed entries)
    held no one up."""
    out = {}
    for ids in members.values():
        if len(ids) < 2:
            continue
        ms = sorted(ids, key=lambda i: nodes[i].start)
        last, before = nodes[ms[-1]], nodes[ms[-2]]
        if last.start > before.start and any(nodes[i].end is None or nodes[i].end >= last.start for i in ms[:-1]):
            out[ms[-1]] = last.start - before.start
    return out


# --- the time split ----------------------------------------------------------------------


def _measure(intervals: list[tuple[int, int]]) -> int:
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


def _split(g: _Graph) -> dict[int, RankTime]:
    late: dict[int, list[int]] = {}  # rank -> [late ns, calls]
    for i, ns in g.held.items():
        acc = late.setdefault(g.nodes[i].rank, [0, 0])
        acc[0] += ns
        acc[1] += 1
    out = {}
    for rank in g.ranks:
        ws, we = g.window[rank]
        waiting, blocked, flight = [], [], []
        for i in g.by_rank.get(rank, ()):
            n = g.nodes[i]
            end = we if n.end is None else min(n.end, we)
            last = g.last_entry[n.key]
            if i in g.stranded:
                waiting.append((n.start, end))
            elif last > n.start and (n.end is None or n.end >= last):
                waiting.append((n.start, min(last, end)))
            if n.async_op:
                blocked.append((n.start, n.issued if n.issued is not None else n.start))
                flight.append((n.start, end))
            else:
                blocked.append((n.start, end))
        total = we - ws
        wait = _measure(waiting)
        in_calls = _measure(waiting + blocked)
        busy = _measure(waiting + blocked + flight)
        acc = late.get(rank, (0, 0))
        out[rank] = RankTime(rank=rank, total_ns=total, compute_ns=max(0, total - busy),
                             overlapped_ns=busy - in_calls, exposed_ns=in_calls - wait, waiting_ns=wait,
                             late_ns=acc[0], late_calls=acc[1])
    return out


# --- re-timing ---------------------------------------------------------------------------


class _Timing:
    """One re-timing of a step's graph: when each node is entered and completes.

    `slow`: rank -> factor on its time between calls (as `replay --slow-rank`).
    `on_time`: ranks never later than the latest of the other members into a call where
    they held them up (`_Graph.held`).
    The causes of each time are kept, for the critical path.
    """

    def __init__(self, g: _Graph, *, slow: dict[int, float] | None = None, on_time: Iterable[int] = ()):
        self.g = g
        self.slow = slow or {}
        self.on_time = frozenset(on_time)
        n = len(g.nodes)
        self.natural: list[int | None] = [None] * n  # entry before any clamp
        self.entry: list[int | None] = [None] * n
        self.done: list[int | None] = [None] * n
        self.entry_cause: list[tuple | None] = [None] * n  # ("gap", node id | None) or ("pending", node id)
        self.floor: list[int] = [0] * n
        self.last_in: dict[tuple, int] = {}  # key -> node id of the member that entered last
        self.closed: set[tuple] = set()  # keys whose members' times are final
        self.registered: dict[tuple, int] = {}
        self._first_in: dict[tuple, int] = {}  # key -> the earliest natural entry among those registered
        self.end: dict[int, int] = {}  # rank -> its step's modelled end
        self.end_cause: dict[int, tuple] = {}
        self._run()

    def _run(self) -> None:
        g = self.g
        self._pos = dict.fromkeys(g.ranks, 0)
        self._resume = {r: (g.window[r][0], g.window[r][0], None) for r in g.ranks}  # (model, recorded, node)
        self._pending: dict[int, list[int]] = {r: [] for r in g.ranks}
        self._blocked: dict[tuple, list[int]] = {}  # key -> ranks that wait for it to close
        self._ready = deque(g.ranks)
        left = set(g.ranks)
        ready, blocked, closed, advance = self._ready, self._blocked, self.closed, self._advance
        stuck: list[tuple[int, tuple]] = []  # heap of (first entry, key) of the keys ranks wait on
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

    def _advance(self, r: int) -> tuple | None:
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
                issue = (n.start if n.issued is None else n.issued) - n.start
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
            issued = pn.start if pn.issued is None else pn.issued
            waited = max(waited, min(pn.end, g.last_entry[pn.key], rec_t) - max(issued, t_rec))
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

    def _close(self, key: tuple) -> None:
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

    def critical_path(self) -> tuple[CriticalPath, dict[int, int]]:
        """Walk back from the rank that ends last through what set each time: the gap
        before a call, the call's last member, an async call waited for. Also, for each
        rank the path passes, how much later than the other members it entered the calls
        on the path it entered last (about what its re-timing could gain)."""
        g = self.g
        path = CriticalPath()
        late: dict[int, int] = {}
        if not self.end:
            return path, late
        rank = max(self.end, key=lambda r: (self.end[r], -r))
        segs: list[Segment] = []
        t = self.end[rank]
        cause = self.end_cause[rank]

        def through(i: int) -> tuple:
            """The path passes node i's entry: note how late its rank was into the call."""
            others = [self.entry[j] for j in g.members[g.nodes[i].key] if j != i and self.entry[j] is not None]
            if i in g.held and others and self.entry[i] > max(others):
                r = g.nodes[i].rank
                late[r] = late.get(r, 0) + self.entry[i] - max(others)
            return self.entry[i], self.entry_cause[i]

        budget = 2 * len(g.nodes) + 8
        while budget > 0:
            budget -= 1
            kind, i = cause
            if kind == "stuck":
                t, cause = through(i)
                continue
            if i is None:  # the gap from the step's start
                segs.append(Segment(rank, "compute", "", g.window[rank][0], t))
                break
            n = g.nodes[i]
            group, seq = _group_seq(n.key)
            if kind == "pending" or not n.async_op:
                # resumed where call i completed: the call ran from its last member's entry
                done = self.done[i]
                segs.append(Segment(rank, "compute", "", done, t))
                last = self.last_in.get(n.key, i)
                lt = self.entry[last]
                segs.append(Segment(rank, "comm", n.op, max(lt, self.entry[i]), done, group, seq))
                if last != i and lt > self.entry[i]:
                    rank = g.nodes[last].rank
                    t, cause = through(last)
                    continue
                t, cause = through(i)
                continue
            # resumed where async call i returned
            issue = self.entry[i] + ((n.issued if n.issued is not None else n.start) - n.start)
            segs.append(Segment(rank, "compute", "", issue, t))
            segs.append(Segment(rank, "comm", n.op, self.entry[i], issue, group, seq))
            t, cause = through(i)
        segs.reverse()
        path.segments = [s for s in segs if s.end_ns > s.start_ns]
        return path, late


def _group_seq(key: tuple) -> tuple[int | None, int | None]:
    if key[0] == "c":
        return key[1], key[2]
    if key[0] == "p":
        return key[1], key[4]
    return None, None


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
    out.span_ns = max(w[1] for w in g.window.values()) - min(w[0] for w in g.window.values())
    out.call_durations = any((g.window[n.rank][1] if n.end is None else n.end) > n.start for n in g.nodes)
    base = _Timing(g)
    out.modelled_ns = base.span()
    out.critical_path, path_late = base.critical_path()
    # A rank's re-timing can gain at most about its lateness along the path: ranks late
    # by a sliver of the step are not worth one re-timing of the whole step each.
    floor = max(1, int(out.modelled_ns * MIN_LATE_FRACTION))
    of = None if of is None else set(of)
    late = sorted((r for r, ns in path_late.items() if ns >= floor and (of is None or r in of)),
                  key=lambda r: (-path_late[r], r))
    for r in late[:candidates]:
        t = out.ranks[r]
        cost = out.modelled_ns - _Timing(g, on_time=(r,)).span()
        out.stragglers.append(StragglerCost(rank=r, step=step, cost_ns=max(0, cost), late_ns=t.late_ns,
                                            late_calls=t.late_calls))
    out.stragglers.sort(key=lambda s: (-s.cost_ns, s.rank))
    return out


def attribute(bundle: Bundle, *, steps: tuple[int, int] | None = None, ranks: list[int] | None = None,
              candidates: int = MAX_CANDIDATES, of: Iterable[int] | None = None) -> Iterator[StepAttribution]:
    """`attribute_step` for each step (of `steps` a..b inclusive, if given), one step in
    memory at a time: what the TUI and `prism-rr analyze` read. `of`: only these ranks'
    costs (each costs a re-timing of the step: diagnose asks for its stragglers')."""
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
    for i in range(0, len(todo), size):
        batch = todo[i : i + size]
        reader = ColumnReader(bundle, figures=False, attribution=True)
        cols = {rank: reader.rank(rank, offsets[rank], (batch[0], batch[-1])) for rank in ranks}
        for step in batch:
            unended = _unended(bundle, step, ranks, offsets, members)
            g = _assemble(ranks, lambda r, step=step: _column_nodes(cols[r], step, reader.values), unended)
            yield _attribute_graph(g, step, candidates, of)


def retimed_span(bundle: Bundle, step: int, *, slow: dict[int, float] | None = None,
                 on_time: Iterable[int] = ()) -> int:
    """Step `step`'s span (ns) re-timed on its graph with ranks' time between calls
    stretched (`slow`: rank -> factor, as `replay --slow-rank`) or their lateness removed."""
    ranks = bundle.recorded_ranks
    g = _read_step(bundle, step, ranks, clock_offsets(bundle, ranks))
    return _Timing(g, slow=slow, on_time=on_time).span()


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
