"""Two bundles compared: do they issue the same collectives, and where did the time go?

For CI: record a short window after every change and diff it against a reference bundle.
The calls of each (rank, group) are compared in order, as replay compares a replayed call
with its recording (`call_divergence`: op, the shapes and dtypes its members agree on,
reduce op, root; peer and tag for point-to-point), never by timing, and by data only where
one bundle is the recording of a replay of the other and the replay itself compared data
(`replay_data`); the first position where they disagree is that sequence's difference.
Windows of a longer run that start at different sequence numbers (flight dumps, imported
Flight Recorder rings) are compared from the first sequence number both hold.
A call one run entered and never completed where the other completed it is a difference
too (a hang, or a rank that died in it): a failed run differs from a good one even where
its calls agree up to where it stopped. The steps compared are both bundles' steps
(`Bundle.steps`), the one a run failed or hung in included: its calls are compared up to
where its records end. Then, per step and rank, the step's time and the time spent in
calls, A against B.

Each rank is read once per bundle, one rank at a time: memory holds one rank's calls.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from itertools import zip_longest

import msgpack
import numpy as np

from prism_rr.errors import UsageError
from prism_rr.format.reader import Bundle, open_bundle
from prism_rr.format.records import Collective, PointToPoint
from prism_rr.specs import format_ranks
from prism_rr.analysis._columns import ColumnReader, _add_by_step
from prism_rr.analysis._divergence import call_divergences, call_structure, data_checked, replay_data
from prism_rr.analysis._build import _Helper, signature, small_pages
from prism_rr.analysis._steps import step_durations
from prism_rr.text import shown

__all__ = ["BundleDiff", "GroupDifference", "NeverCompleted", "SequenceDifference", "StepTime", "call_facts",
           "compare_ranks", "diff_bundles", "diff_json", "diff_lines", "serve"]

Call = Collective | PointToPoint


@dataclass(frozen=True, slots=True, kw_only=True)
class SequenceDifference:
    """The first call of one rank in one group that differs between A and B (None: that
    run made no call at this position)."""

    rank: int
    group: int
    index: int  # position among this rank's calls of this group compared, from 0
    a: Call | None
    b: Call | None
    data: bool = False  # the calls' data was compared (a replay that ran on the recorded data)
    a_recorded: bool = True  # A is the recording (B the replay's), else the other way round

    @property
    def step(self) -> int:
        return min(c.step for c in (self.a, self.b) if c is not None)

    @property
    def fields(self) -> tuple[str, ...]:
        """What differs: "missing in A"/"missing in B", or what `call_divergences` finds,
        in its words (kind, op, shapes, dtypes, reduce_op, root, peer, tag, data)."""
        if self.a is None:
            return ("missing in A",)
        if self.b is None:
            return ("missing in B",)
        recorded, other = (self.a, self.b) if self.a_recorded else (self.b, self.a)
        found = call_divergences(recorded, other, data=self.data)
        return tuple(dict.fromkeys(d.topic for d in found))


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupDifference:
    """A process group both bundles define with other members."""

    group: int
    a: tuple[int, ...]
    b: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class NeverCompleted:
    """A call one run (`side`, "A" or "B") entered and never completed, where the other
    run completed it or never made it."""

    side: str
    rank: int
    group: int
    seq: int
    op: str
    step: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTime:
    """One step on one rank: the step's wall time and the time inside calls, A and B
    (None where that run did not record it)."""

    step: int
    rank: int
    a_ns: int | None
    b_ns: int | None
    a_comm_ns: int
    b_comm_ns: int

    @property
    def delta_ns(self) -> int | None:
        return None if self.a_ns is None or self.b_ns is None else self.b_ns - self.a_ns


@dataclass(slots=True, kw_only=True)
class BundleDiff:
    """What `diff_bundles` found; `same` is what a CI job asks."""

    world: tuple[int, int]
    ranks: list[int]  # compared: recorded in both
    only_a: list[int]
    only_b: list[int]
    steps: tuple[int, int] | None  # the window compared, when it was narrowed to the common steps
    calls: tuple[int, int] = (0, 0)  # calls compared, A and B
    sequences: list[SequenceDifference] = field(default_factory=list)  # first by step, rank, group
    groups: list[GroupDifference] = field(default_factory=list)
    never_completed: list[NeverCompleted] = field(default_factory=list)  # by step, rank, group, seq
    times: list[StepTime] = field(default_factory=list)
    unended: tuple[list[int], list[int]] = ([], [])  # steps compared that A, B did not end (failed or hung in)

    @property
    def same(self) -> bool:
        return not self.sequences and not self.groups and not self.never_completed

    @property
    def first(self) -> SequenceDifference | None:
        return self.sequences[0] if self.sequences else None

    def json(self) -> dict:
        """What `prism-rr diff --json` prints (diff_json)."""
        return diff_json(self)

    def lines(self) -> list[str]:
        """What `prism-rr diff` prints (diff_lines)."""
        return diff_lines(self)


def call_facts(call: Call) -> dict:
    """One call as plain data (JSON-ready): what is compared, and where it was made."""
    if type(call) is Collective:
        op, shapes, dtypes, reduce_op, root = signature(call)
        recorded_shapes = call.in_shapes if shapes is None else shapes
        return {"kind": "collective", "op": op, "group": call.group, "seq": call.seq, "step": call.step,
                "shapes": None if shapes is None else [list(s) for s in shapes],
                "dtypes": list(dtypes), "reduce_op": reduce_op, "root": root, "peer": None, "tag": None,
                "bytes": call.in_bytes, "shapes_recorded": [list(s) for s in recorded_shapes],
                "stack": list(call.stack or ())}
    return {"kind": "p2p", "op": call.op, "group": call.group, "seq": call.seq, "step": call.step,
            "shapes": [list(s) for s in call.shapes], "dtypes": list(call.dtypes), "reduce_op": None,
            "root": None, "peer": call.peer, "tag": call.tag, "bytes": call.nbytes,
            "shapes_recorded": [list(s) for s in call.shapes], "stack": list(call.stack or ())}


def _read_rank(bundle: Bundle, rank: int,
               steps: tuple[int, int] | None) -> tuple[dict[int, list[Call]], dict[int, int], int, dict]:
    """One rank's calls per group in recording order, the time inside calls per step, the
    number of calls, and the calls it never completed ({(group, p2p, seq, (op, peer)): (op, step)})."""
    by_group: dict[int, list[Call]] = {}
    comm: dict[int, int] = {}
    opened: dict[tuple, tuple[str, int]] = {}
    n = 0
    for rec in bundle.events(rank, steps=steps):
        cls = type(rec)
        if cls is Collective or cls is PointToPoint:
            by_group.setdefault(rec.group, []).append(rec)
            n += 1
            if rec.end_ns is not None:
                comm[rec.step] = comm.get(rec.step, 0) + rec.end_ns - rec.start_ns
            else:
                p2p = cls is PointToPoint
                opened[(rec.group, p2p, rec.seq, (rec.op, rec.peer if p2p else None))] = (rec.op, rec.step)
    return by_group, comm, n, opened


def _aligned(xs: list[Call], ys: list[Call]) -> tuple[list[Call], list[Call]]:
    """Two windows of one group's calls that start at different sequence numbers (a flight
    dump, an imported ring, a recording of later steps), cut to start at the first
    sequence number both hold; others as they are."""
    if not (xs and ys and type(xs[0]) is Collective and type(ys[0]) is Collective) or xs[0].seq == ys[0].seq:
        return xs, ys
    lo = max(xs[0].seq, ys[0].seq)

    def cut(calls: list[Call]) -> list[Call]:
        for i, c in enumerate(calls):
            if type(c) is Collective and c.seq >= lo:
                return calls[i:]
        return []

    return cut(xs), cut(ys)


def _common_steps(a: Bundle, b: Bundle) -> tuple[int, int] | None:
    """The steps both recorded, when their windows differ (None: compare everything)."""
    sa, sb = a.steps, b.steps
    if not sa or not sb or sa == sb:
        return None
    lo, hi = max(sa[0], sb[0]), min(sa[-1], sb[-1])
    if lo > hi:
        raise UsageError(f"{a.path.name} records steps {sa[0]}-{sa[-1]} and {b.path.name} steps "
                         f"{sb[0]}-{sb[-1]}: no step in common to compare")
    return (lo, hi)


class _Columns:
    """Ranks of one bundle read as columns (ColumnReader), each call's compared fields as
    one id shared by both bundles (`keys`), so that sequences compare as arrays."""

    def __init__(self, bundle: Bundle, keys: dict):
        self.reader = ColumnReader(bundle, figures=False, tags=True, structures=True)
        self.keys = keys
        self.canon = np.zeros(0, np.int64)  # the reader's value id -> shared id

    def rank(self, rank: int, steps) -> tuple[dict[int, tuple], dict[int, int], int, dict]:
        """(group -> (p2p, seq, key) arrays in recording order, time inside calls per step,
        calls, the calls never completed: {(group, p2p, seq, key): (op, step)})."""
        c = self.reader.rank(rank, 0, steps)
        values = self.reader.values
        if len(self.canon) < len(values):
            more = [self.keys.setdefault(v, len(self.keys)) for v in values[len(self.canon):]]
            self.canon = np.append(self.canon, np.array(more, np.int64))
        sig = self.canon[c.structure]
        # a point-to-point call's key: (op, shapes, dtypes), peer and tag
        key = sig.copy()
        if c.p2p.any():
            p = np.flatnonzero(c.p2p)
            key[p] = [self.keys.setdefault(("p2p", k, peer, tag), len(self.keys))
                      for k, peer, tag in zip(sig[p].tolist(), c.peer[p].tolist(), c.tag[p].tolist())]
        by_group: dict[int, tuple] = {}
        if len(c.group):
            order = np.argsort(c.group, kind="stable")
            g = c.group[order]
            head = np.ones(len(g), bool)
            head[1:] = g[1:] != g[:-1]
            at = np.append(np.flatnonzero(head), len(g))
            for lo, hi in zip(at[:-1].tolist(), at[1:].tolist()):
                rows = order[lo:hi]
                by_group[int(g[lo])] = (c.p2p[rows], c.seq[rows], key[rows])
        comm: dict[int, int] = {}
        done = ~c.open
        if done.any():
            _add_by_step(comm, c.step[done], (c.end - c.start)[done])
        opened = {(int(c.group[i]), bool(c.p2p[i]), int(c.seq[i]), int(key[i])): (values[c.op[i]], int(c.step[i]))
                  for i in np.flatnonzero(c.open).tolist()}
        return by_group, comm, len(c.group), opened


def _first_difference(x: tuple | None, y: tuple | None) -> int | None:
    """Where two sequences of (p2p, seq, key) arrays first part, as `_aligned` and the
    comparison in `diff_bundles` see them; None where they do not."""
    empty = (np.zeros(0, bool), np.zeros(0, np.int64), np.zeros(0, np.int64))
    x, y = x or empty, y or empty
    if len(x[0]) and len(y[0]) and not x[0][0] and not y[0][0] and x[1][0] != y[1][0]:
        lo = max(int(x[1][0]), int(y[1][0]))

        def cut(s):
            i = np.flatnonzero(~s[0] & (s[1] >= lo))
            return tuple(v[int(i[0]):] for v in s) if len(i) else empty

        x, y = cut(x), cut(y)
    n = min(len(x[0]), len(y[0]))
    differ = np.flatnonzero((x[0][:n] != y[0][:n]) | (x[2][:n] != y[2][:n]))
    if len(differ):
        return int(differ[0])
    return n if len(x[0]) != len(y[0]) else None


def diff_bundles(a: Bundle, b: Bundle, *, columns: bool = True, processes: int | None = None,
                 progress=None) -> BundleDiff:
    """Compare B against A: sequences of calls per (rank, group), group memberships, and
    per step and rank the time. Ranks recorded in only one bundle are listed, not compared;
    where the recorded steps differ, only the steps both hold are compared.

    `columns`: each rank is read as columns and its sequences compared as arrays; only a
    sequence that differs is read again as records (for the report). False reads every
    rank as records (the reference the tests hold the columns to). `processes`: as
    build_graph's: from PARALLEL_FROM_RANKS ranks a second process compares the last part
    of the ranks (compare_ranks) meanwhile. `progress(ranks done, ranks)` after each rank
    compared (8192 x 10,000 takes minutes)."""
    ra, rb = set(a.recorded_ranks), set(b.recorded_ranks)
    steps = _common_steps(a, b)
    # Data counts only where one is the recording of a replay of the other (call_divergence)
    made_up, a_recorded = replay_data(a, b), True
    if not made_up:
        made_up = replay_data(b, a)
        a_recorded = not made_up
    out = BundleDiff(world=(a.world_size, b.world_size), ranks=sorted(ra & rb),
                     only_a=sorted(ra - rb), only_b=sorted(rb - ra), steps=steps)
    helper = (_Helper.comparing(a, b, [r for r in out.ranks if r not in made_up], steps, processes)
              if columns else None)
    try:
        return _diff(a, b, out, steps, made_up, a_recorded, columns, helper, progress)
    finally:
        if helper is not None:
            helper.stop()


def _diff(a: Bundle, b: Bundle, out: BundleDiff, steps, made_up, a_recorded: bool, columns: bool,
          helper: _Helper | None, progress=None) -> BundleDiff:
    ga = {g["id"]: tuple(g["ranks"]) for g in a.groups}
    gb = {g["id"]: tuple(g["ranks"]) for g in b.groups}
    out.groups = [GroupDifference(group=g, a=ga[g], b=gb[g]) for g in sorted(ga.keys() & gb.keys())
                  if ga[g] != gb[g]]
    step_a, step_b = a.summaries["steps"], b.summaries["steps"]
    time_a = {s: step_durations(a, s, clock="host") for s in step_a}
    time_b = {s: step_durations(b, s, clock="host") for s in step_b}
    wanted = _steps_compared(a, b, steps)
    out.unended = ([s for s in wanted if s not in step_a], [s for s in wanted if s not in step_b])
    calls_a = calls_b = 0
    keys: dict = {}
    col_a, col_b = _Columns(a, keys), _Columns(b, keys)
    theirs: dict[int, tuple] = {}
    for done, rank in enumerate(out.ranks, 1):
        if progress is not None:
            progress(done - 1, len(out.ranks))
        data = rank in made_up
        if columns and not data:
            if helper is not None and rank == helper.theirs[0]:
                theirs = _compared(helper.output(), helper.theirs)  # (failed: {}, compared here)
            got = theirs.pop(rank, None)
            parting, comm_a, comm_b, na, nb, never = got if got is not None else _compare(col_a, col_b, rank, steps)
            if parting:  # the calls themselves, for the report
                rec_a, rec_b = _read_rank(a, rank, steps)[0], _read_rank(b, rank, steps)[0]
        else:
            rec_a, comm_a, na, open_a = _read_rank(a, rank, steps)
            rec_b, comm_b, nb, open_b = _read_rank(b, rank, steps)
            parting = sorted(rec_a.keys() | rec_b.keys())
            never = _one_sided(rank, open_a, open_b)
        calls_a += na
        calls_b += nb
        out.never_completed += never
        for group in parting:
            found = _first_parted(rank, group, rec_a, rec_b, made_up if data else None, a_recorded)
            if found is not None:
                out.sequences.append(found)
        rank_steps = wanted or sorted(comm_a.keys() | comm_b.keys())
        for s in rank_steps:
            out.times.append(StepTime(step=s, rank=rank, a_ns=time_a.get(s, {}).get(rank),
                                      b_ns=time_b.get(s, {}).get(rank),
                                      a_comm_ns=comm_a.get(s, 0), b_comm_ns=comm_b.get(s, 0)))
    out.calls = (calls_a, calls_b)
    out.sequences.sort(key=lambda d: (d.step, d.rank, d.group, d.index))
    out.never_completed.sort(key=lambda c: (c.step, c.rank, c.group, c.seq, c.side))
    return out


def _compare(col_a: _Columns, col_b: _Columns, rank: int, steps) -> tuple:
    """Rank `rank` of A and B as columns: (the groups whose sequences part, the time
    inside calls per step in A and in B, the calls in A and in B, the calls one side
    never completed)."""
    seq_a, comm_a, na, open_a = col_a.rank(rank, steps)
    seq_b, comm_b, nb, open_b = col_b.rank(rank, steps)
    parting = [g for g in sorted(seq_a.keys() | seq_b.keys())
               if _first_difference(seq_a.get(g), seq_b.get(g)) is not None]
    return parting, comm_a, comm_b, na, nb, _one_sided(rank, open_a, open_b)


def compare_ranks(a: Bundle, b: Bundle, ranks: list[int], steps: tuple[int, int] | None) -> bytes:
    """_compare of each of `ranks`, as msgpack of plain values: what the second process
    (serve) sends back."""
    keys: dict = {}
    col_a, col_b = _Columns(a, keys), _Columns(b, keys)
    rows = []
    for rank in ranks:
        parting, comm_a, comm_b, na, nb, never = _compare(col_a, col_b, rank, steps)
        rows.append([rank, parting, list(comm_a.items()), list(comm_b.items()), na, nb,
                     [[c.side, c.group, c.seq, c.op, c.step] for c in never]])
    return msgpack.packb(rows, use_bin_type=True)


def serve() -> None:
    """diff's second process (_build._Helper.comparing): reads {"diff": [path A, path B],
    "ranks", "steps"} as JSON on stdin, writes compare_ranks of those ranks on stdout."""
    job = json.loads(sys.stdin.buffer.read())
    steps = tuple(job["steps"]) if job["steps"] is not None else None
    with small_pages(), open_bundle(job["diff"][0]) as a, open_bundle(job["diff"][1]) as b:
        data = compare_ranks(a, b, job["ranks"], steps)
    sys.stdout.buffer.write(data)


def _compared(data: bytes | None, ranks: list[int]) -> dict[int, tuple]:
    """What compare_ranks sent of `ranks`, by rank; {} where the process failed."""
    if data is None:
        return {}
    rows = msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=False)
    if [r[0] for r in rows] != ranks:
        return {}
    return {rank: (list(parting), dict(comm_a), dict(comm_b), na, nb,
                   [NeverCompleted(side=side, rank=rank, group=group, seq=seq, op=op, step=step)
                    for side, group, seq, op, step in never])
            for rank, parting, comm_a, comm_b, na, nb, never in rows}


def _first_parted(rank: int, group: int, rec_a: dict, rec_b: dict, made_up, a_recorded: bool):
    """The first call of `rank` in `group` where A and B part (`made_up`: where data is
    compared, replay_data's), or None."""
    xs, ys = _aligned(rec_a.get(group, []), rec_b.get(group, []))
    for i, (x, y) in enumerate(zip_longest(xs, ys)):
        replayed = y if a_recorded else x
        checked = made_up is not None and replayed is not None and data_checked(made_up, rank, replayed)
        if x is None or y is None or _parted(x, y, checked, a_recorded):
            return SequenceDifference(rank=rank, group=group, index=i, a=x, b=y, data=checked,
                                      a_recorded=a_recorded)
    return None


def _steps_compared(a: Bundle, b: Bundle, window: tuple[int, int] | None) -> list[int]:
    """The steps whose times are compared: those both bundles hold (`Bundle.steps`, the
    step a run failed or hung in included), or all either holds where one has none."""
    sa, sb = set(a.steps), set(b.steps)
    wanted = sorted(sa & sb) if sa and sb else sorted(sa | sb)
    return [s for s in wanted if window is None or window[0] <= s <= window[1]]


def _one_sided(rank: int, open_a: dict, open_b: dict) -> list[NeverCompleted]:
    """The calls of `rank` one run entered and never completed and the other did not leave
    open (it completed them, or never made them)."""
    return [NeverCompleted(side=side, rank=rank, group=key[0], seq=key[2], op=op, step=step)
            for side, mine, theirs in (("A", open_a, open_b), ("B", open_b, open_a))
            for key, (op, step) in mine.items() if key not in theirs]


def _parted(x: Call, y: Call, data: bool, a_recorded: bool) -> bool:
    """Whether the calls differ: as replay would judge the replayed one (call_divergence)."""
    if not data:
        return call_structure(x) != call_structure(y)
    recorded, other = (x, y) if a_recorded else (y, x)
    return bool(call_divergences(recorded, other, data=True))


def diff_json(d: BundleDiff) -> dict:
    """What `prism-rr diff --json` prints."""
    return {
        "same": d.same,
        "world_size": {"a": d.world[0], "b": d.world[1]},
        "ranks_compared": d.ranks,
        "ranks_only_in_a": d.only_a,
        "ranks_only_in_b": d.only_b,
        "steps_compared": list(d.steps) if d.steps is not None else None,
        "calls": {"a": d.calls[0], "b": d.calls[1]},
        "first_difference": _seq_json(d.first) if d.first is not None else None,
        "sequence_differences": [_seq_json(s) for s in d.sequences],
        "group_differences": [{"group": g.group, "a": list(g.a), "b": list(g.b)} for g in d.groups],
        "never_completed": [{"side": c.side, "rank": c.rank, "group": c.group, "seq": c.seq, "op": c.op,
                             "step": c.step} for c in d.never_completed],
        "steps_not_ended": {"a": d.unended[0], "b": d.unended[1]},
        "times": [{"step": t.step, "rank": t.rank, "a_ns": t.a_ns, "b_ns": t.b_ns, "delta_ns": t.delta_ns,
                   "a_comm_ns": t.a_comm_ns, "b_comm_ns": t.b_comm_ns} for t in d.times],
    }


def _seq_json(s: SequenceDifference) -> dict:
    return {"rank": s.rank, "group": s.group, "index": s.index, "step": s.step, "differs_in": list(s.fields),
            "a": call_facts(s.a) if s.a is not None else None,
            "b": call_facts(s.b) if s.b is not None else None}


def diff_lines(d: BundleDiff, *, listed: int = 8) -> list[str]:
    """What `prism-rr diff` prints, safe for a terminal: the first difference with both
    calls and stacks, the other differing sequences (up to `listed`), then the time per
    step."""
    out = []
    if d.world[0] != d.world[1]:
        out.append(f"world size {d.world[0]} in A, {d.world[1]} in B")
    if d.only_a or d.only_b:
        out.append(f"ranks recorded in one bundle only, not compared: A {_ranks(d.only_a) or '-'}, "
                   f"B {_ranks(d.only_b) or '-'}")
    window = f", steps {d.steps[0]}-{d.steps[1]} (the steps both recorded)" if d.steps is not None else ""
    if d.same or not (d.sequences or d.groups):
        left = ", but calls were left open (below)" if d.never_completed else ""
        out.append(f"collective sequences match: {d.calls[0]:,} calls in A, {d.calls[1]:,} in B, "
                   f"on ranks {_ranks(d.ranks)}{window}{left}")
    else:
        out.append(f"collective sequences differ: {len(d.sequences)} (rank, group) sequence"
                   f"{'s' if len(d.sequences) != 1 else ''}, {len(d.groups)} group"
                   f"{'s' if len(d.groups) != 1 else ''}{window}")
    for g in d.groups:
        out.append(f"  group {g.group}: ranks {_ranks(g.a)} in A, {_ranks(g.b)} in B")
    first = d.first
    if first is not None:
        out.append(f"first: step {first.step}, rank {first.rank}, group {first.group}, the rank's call {first.index} "
                   f"in that group: {', '.join(first.fields)}")
        for side, call in (("A", first.a), ("B", first.b)):
            if call is None:
                out.append(f"  {side}: no call (the run made {first.index} calls of this group on this rank)")
                continue
            out.append(f"  {side}: {_call_line(call)}")
            if call.stack:
                out.append(f"     at {' <- '.join(shown(frame) for frame in call.stack)}")
        for s in d.sequences[1:listed + 1]:
            out.append(f"  also step {s.step}, rank {s.rank}, group {s.group}, call {s.index}: {', '.join(s.fields)}")
        if len(d.sequences) > listed + 1:
            out.append(f"  ... and {len(d.sequences) - listed - 1} more (--json lists them all)")
    out += _never_lines(d.never_completed, listed)
    out += _time_lines(d.times, d.unended)
    return out


def _never_lines(calls: list[NeverCompleted], listed: int) -> list[str]:
    """The calls one run entered and never completed where the other did not."""
    if not calls:
        return []
    out = [f"never completed: {len(calls)} call{'s' if len(calls) != 1 else ''} one run entered and never left "
           f"(a hang, or a rank that died in it), where the other run did not:"]
    for c in calls[:listed]:
        out.append(f"  {c.side}: rank {c.rank}, {shown(c.op)} (group {c.group}, seq {c.seq}) in step {c.step}")
    if len(calls) > listed:
        out.append(f"  ... and {len(calls) - listed} more (--json lists them all)")
    return out


def _ranks(ranks) -> str:
    return format_ranks(ranks)


def _call_line(c: Call) -> str:
    f = call_facts(c)
    parts = [f"seq {c.seq}", shown(c.op), f"shapes {f['shapes_recorded']}", f"dtypes {shown(f['dtypes'])}"]
    if f["reduce_op"] is not None:
        parts.append(f"reduce {shown(f['reduce_op'])}")
    if f["root"] is not None:
        parts.append(f"root {f['root']}")
    if f["peer"] is not None:
        parts.append(f"peer {f['peer']} tag {f['tag']}")
    return "  ".join(parts)


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.1f} ms"


def _time_lines(times: list[StepTime], unended: tuple[list[int], list[int]] = ([], [])) -> list[str]:
    """Per step: the slowest rank's step time, A -> B (a step a run failed or hung in,
    `unended`, did not end); the time inside calls summed over ranks; the rank whose step
    time changed most."""
    by_step: dict[int, list[StepTime]] = {}
    for t in times:
        by_step.setdefault(t.step, []).append(t)
    if not by_step:
        return []
    if all(t.a_ns is None and t.b_ns is None and not t.a_comm_ns and not t.b_comm_ns for t in times):
        return ["time: not compared (neither bundle holds step times or call durations, as imported dumps may not)"]
    out = ["time per step, A -> B (slowest rank's step; time inside calls, all ranks together):"]
    for step, rows in sorted(by_step.items()):
        wa = [t.a_ns for t in rows if t.a_ns is not None]
        wb = [t.b_ns for t in rows if t.b_ns is not None]
        line = f"  step {step:<4}"
        if wa and wb:
            a, b = max(wa), max(wb)
            line += f" {_ms(a):>10} -> {_ms(b):>10} ({(b - a) / a * 100 if a else 0.0:+.1f}%)"
        elif step in unended[0] or step in unended[1]:
            a = _ms(max(wa)) if wa else "did not end" if step in unended[0] else "-"
            b = _ms(max(wb)) if wb else "did not end" if step in unended[1] else "-"
            line += f" {a:>10} -> {b:>11}"
        else:
            line += f" {'step times not recorded':>31}"
        ca, cb = sum(t.a_comm_ns for t in rows), sum(t.b_comm_ns for t in rows)
        line += f"   calls {_ms(ca)} -> {_ms(cb)}"
        moved = [t for t in rows if t.delta_ns is not None]
        if len(moved) > 1:
            worst = max(moved, key=lambda t: abs(t.delta_ns))
            line += f"   most changed: rank {worst.rank} {worst.delta_ns / 1e6:+.1f} ms"
        out.append(line)
    return out
