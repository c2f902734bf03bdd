"""One training step across ranks: iteration times, waiting, and its critical path."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from prism_rr.format import ops
from prism_rr.format.reader import Bundle
from prism_rr.format.records import Collective, Compute, PointToPoint, Step
from prism_rr.format.summaries import NIL, StepTable
from prism_rr.analysis._build import clock_offsets

__all__ = ["CLOCKS", "CriticalPath", "OpenSteps", "Segment", "StepAnalysis", "StepDurations", "analyze_step",
           "step_durations"]

CLOCKS = ("device", "host")


class StepDurations(dict):
    """{rank: ns} of one step, and the clock they were taken on (`clock`): "device" (the
    device's own, FORMAT.md "Device time") or "host" (the host's monotonic clock)."""

    __slots__ = ("clock",)

    def __init__(self, values=(), clock: str = "host"):
        super().__init__(values)
        self.clock = clock


class OpenSteps:
    """Of one rank's records of the failed steps (`format.facts.failed_steps`, the step a
    run failed or hung in), read in order: the steps its records reach but no Step record of
    its closes, each as (step, its first record's start, the latest time its records reach).
    An export shows that step as every command counts it, not only the steps that ended."""

    __slots__ = ("spans", "closed")

    def __init__(self):
        self.spans: dict[int, list[int]] = {}
        self.closed: set[int] = set()

    def see(self, rec) -> None:
        """Note `rec`, a record of a failed step (callers test `rec.step in failed`)."""
        if type(rec) is Step:
            self.closed.add(rec.step)
            return
        reach = rec.start_ns if rec.end_ns is None else max(rec.start_ns, rec.end_ns)
        span = self.spans.get(rec.step)
        if span is None:
            self.spans[rec.step] = [rec.start_ns, reach]
        else:
            span[0] = min(span[0], rec.start_ns)
            span[1] = max(span[1], reach)

    def open(self) -> list[tuple[int, int, int]]:
        return [(step, a, b) for step, (a, b) in sorted(self.spans.items()) if step not in self.closed]


def step_durations(bundle, step: int, clock: str | None = None) -> StepDurations:
    """Each rank's time for `step` (ns), as the summaries hold it; ranks that did not
    finish the step are left out. On the device's clock where the bundle has device
    time for the step (a step from its start to its end as the device passed them),
    else the host's (its Step record's end - start); `clock` "device" or "host" asks for
    one (device: empty where there is none). The result's `clock` says which.
    `bundle`: a Bundle, or anything that carries its `summaries` (the TUI's timeline
    model)."""
    if clock not in (None, *CLOCKS):
        raise ValueError(f"clock is {clock!r}, not one of {', '.join(CLOCKS)}")
    summaries = bundle.summaries
    device = summaries.get("device_steps")
    if clock != "host" and device is not None:
        per_rank = device.get(step, {})
        out = {r: v[1] - v[0] for r, v in per_rank.items() if v[0] is not None and v[1] is not None}
        if out or clock == "device":
            return StepDurations(out, "device")
    elif clock == "device":
        return StepDurations((), "device")
    table = summaries["steps"]
    if isinstance(table, StepTable):  # its columns: a look-up per rank costs ms at 8192 ranks
        if step not in table:
            return StepDurations((), "host")
        ranks, start, end = table.arrays(step)[:3]
        ended = end != NIL
        return StepDurations(zip(ranks[ended].tolist(), (end[ended] - start[ended]).tolist()), "host")
    per_rank = table.get(step, {})
    return StepDurations({r: v[1] - v[0] for r, v in per_rank.items() if v[1] is not None}, "host")


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of the critical path on one rank: compute, communication, or unrecorded time."""

    rank: int
    kind: str  # "compute", "comm" or "other"
    name: str  # the op of a call, the compute's name, or ""
    start_ns: int  # on rank 0's clock
    end_ns: int
    group: int | None = None
    seq: int | None = None

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(slots=True)
class CriticalPath:
    """The chain of work that set the step's length, earliest first."""

    segments: list[Segment] = field(default_factory=list)

    @property
    def total_ns(self) -> int:
        return sum(s.duration_ns for s in self.segments)

    def by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.segments:
            out[s.kind] = out.get(s.kind, 0) + s.duration_ns
        return out

    @property
    def ranks(self) -> list[int]:
        """Ranks the path passes through, in order, without repeats in a row."""
        out: list[int] = []
        for s in self.segments:
            if not out or out[-1] != s.rank:
                out.append(s.rank)
        return out


@dataclass(slots=True)
class StepAnalysis:
    """Per-rank figures of one step (ns) and its critical path. `iteration_ns` is on the
    clock `clock` names (step_durations: the device's where the bundle has it); the
    other figures and the path are the host's."""

    step: int
    iteration_ns: dict[int, int] = field(default_factory=dict)
    wait_ns: dict[int, int] = field(default_factory=dict)
    compute_ns: dict[int, int] = field(default_factory=dict)
    comm_ns: dict[int, int] = field(default_factory=dict)
    start_ns: dict[int, int] = field(default_factory=dict)
    end_ns: dict[int, int] = field(default_factory=dict)
    critical_path: CriticalPath = field(default_factory=CriticalPath)
    clock: str = "host"

    @property
    def slowest_rank(self) -> int | None:
        return max(self.iteration_ns, key=self.iteration_ns.get) if self.iteration_ns else None


@dataclass(slots=True)
class _Item:
    start: int
    end: int
    kind: str
    name: str
    key: tuple | None  # (group, seq) of a collective, (group, src, dst, seq) of a p2p call
    sending: bool = False


def analyze_step(bundle: Bundle, step: int, *, ranks: list[int] | None = None) -> StepAnalysis:
    """Read step `step` of every recorded rank (only the chunks that hold it) and analyse it."""
    ranks = bundle.recorded_ranks if ranks is None else ranks
    out = StepAnalysis(step=step)
    timelines: dict[int, list[_Item]] = {}
    arrivals: dict[tuple, dict[int, int]] = {}  # call key -> rank -> entry
    p2p_sends: dict[tuple, int] = {}
    offsets = clock_offsets(bundle, ranks)
    durations = step_durations(bundle, step)
    out.iteration_ns = {r: durations[r] for r in ranks if r in durations}
    out.clock = durations.clock
    for rank in ranks:
        off = offsets[rank]
        items: list[_Item] = []
        lo = hi = None
        for rec in bundle.events(rank, steps=(step, step)):
            start = rec.start_ns - off
            end = None if rec.end_ns is None else rec.end_ns - off
            cls = type(rec)
            if cls is Step:
                out.start_ns[rank] = start
                if end is not None:
                    out.end_ns[rank] = end
                continue
            if end is None:
                if cls is Collective:
                    arrivals.setdefault((rec.group, rec.seq), {})[rank] = start
                continue
            lo = start if lo is None else min(lo, start)
            hi = end if hi is None else max(hi, end)
            if cls is Compute:
                if rec.name is None:
                    items.append(_Item(start, end, "compute", "", None))
                    out.compute_ns[rank] = out.compute_ns.get(rank, 0) + end - start
            elif cls is Collective:
                key = (rec.group, rec.seq)
                arrivals.setdefault(key, {})[rank] = start
                if not rec.async_op:
                    items.append(_Item(start, end, "comm", rec.op, key))
                    out.comm_ns[rank] = out.comm_ns.get(rank, 0) + end - start
            elif cls is PointToPoint and rec.peer >= 0:
                sending = not ops.receives(rec.op)
                key = (rec.group, rank, rec.peer, rec.seq) if sending else (rec.group, rec.peer, rank, rec.seq)
                if sending:
                    p2p_sends[key] = start
                if not rec.async_op:
                    items.append(_Item(start, end, "comm", rec.op, key, sending))
                    out.comm_ns[rank] = out.comm_ns.get(rank, 0) + end - start
        if lo is not None:
            out.start_ns.setdefault(rank, lo)
            out.end_ns.setdefault(rank, hi)
        items.sort(key=lambda it: it.start)
        timelines[rank] = items
    for key, who in arrivals.items():
        last = max(who.values())
        for rank, t in who.items():
            out.wait_ns[rank] = out.wait_ns.get(rank, 0) + (last - t)
    out.critical_path = _critical_path(out, timelines, arrivals, p2p_sends)
    return out


def _critical_path(out: StepAnalysis, timelines, arrivals, p2p_sends) -> CriticalPath:
    """Walk back from the rank that finished last; at a call, jump to the member that
    arrived last, since the call could not end before it came."""
    path = CriticalPath()
    if not out.end_ns:
        return path
    rank = max(out.end_ns, key=out.end_ns.get)
    t = out.end_ns[rank]
    begin = min(out.start_ns.values())
    starts = {r: [it.start for it in items] for r, items in timelines.items()}
    segs: list[Segment] = []
    budget = sum(len(v) for v in timelines.values()) + len(timelines) + 8
    while budget > 0 and t > begin:
        budget -= 1
        items = timelines.get(rank, [])
        i = bisect.bisect_left(starts.get(rank, []), t) - 1
        if i < 0:
            floor = out.start_ns.get(rank, begin)
            if t > floor:
                segs.append(Segment(rank, "other", "", floor, t))
            break
        it = items[i]
        end = min(it.end, t)
        if end < t:
            segs.append(Segment(rank, "other", "", end, t))
        if it.kind == "comm":
            jump = None
            if len(it.key) == 2:
                who = arrivals.get(it.key, {})
                if who:
                    last_rank = max(who, key=who.get)
                    if last_rank != rank and who[last_rank] > it.start:
                        jump = (last_rank, who[last_rank])
            elif not it.sending:
                sent = p2p_sends.get(it.key)
                if sent is not None and sent > it.start:
                    jump = (it.key[1], sent)
            group, seq = it.key[0], it.key[-1]
            if jump is not None and jump[1] < end:
                segs.append(Segment(rank, "comm", it.name, jump[1], end, group, seq))
                rank, t = jump
                continue
            segs.append(Segment(rank, "comm", it.name, it.start, end, group, seq))
        else:
            segs.append(Segment(rank, "compute", it.name, it.start, end))
        t = it.start
    segs.reverse()
    path.segments = [s for s in segs if s.end_ns > s.start_ns]
    return path
