"""The execution graph's nodes: one member's part in a call, a matched call, a rank's trace."""

from __future__ import annotations

from dataclasses import dataclass, field

from prism_rr.format.records import Marker, Record

__all__ = ["Crash", "MatchedCall", "Member", "P2PMatch", "RankTrace", "StepStats"]


@dataclass(slots=True)
class Member:
    """One rank's part in a collective or point-to-point call (times on rank 0's clock)."""

    rank: int
    enter_ns: int
    end_ns: int | None  # None: entered and never completed
    step: int
    op: str
    sig: tuple  # what members of one call must agree on (interned; see _build.signature)
    stack: tuple[str, ...] | None
    async_op: bool

    @property
    def duration_ns(self) -> int | None:
        return None if self.end_ns is None else self.end_ns - self.enter_ns


def _ENTER(m: Member) -> int:
    return m.enter_ns


def _DURATION(m: Member) -> int:
    return m.end_ns - m.enter_ns


@dataclass(slots=True)
class MatchedCall:
    """A collective matched across the members of its group by (group, seq)."""

    group: int
    seq: int
    expected: tuple[int, ...]  # the group's recorded ranks
    members: list[Member] = field(default_factory=list)

    @property
    def key(self) -> tuple[int, int]:
        return (self.group, self.seq)

    @property
    def op(self) -> str:
        ops = [m.op for m in self.members]
        return max(set(ops), key=ops.count) if ops else ""

    @property
    def entered(self) -> tuple[int, ...]:
        return tuple(sorted(m.rank for m in self.members))

    @property
    def missing(self) -> tuple[int, ...]:
        have = {m.rank for m in self.members}
        return tuple(r for r in self.expected if r not in have)

    @property
    def incomplete(self) -> tuple[int, ...]:
        return tuple(sorted(m.rank for m in self.members if m.end_ns is None))

    @property
    def first_arrival(self) -> Member:
        return min(self.members, key=_ENTER)

    @property
    def last_arrival(self) -> Member:
        return max(self.members, key=_ENTER)

    @property
    def skew_ns(self) -> int:
        """Last arrival minus first arrival."""
        if not self.members:
            return 0
        enters = [m.enter_ns for m in self.members]
        return max(enters) - min(enters)

    @property
    def transfer_ns(self) -> int | None:
        """The smallest end - start among members: the last to arrive waits only for this."""
        durs = [m.end_ns - m.enter_ns for m in self.members if m.end_ns is not None]
        return min(durs) if durs else None

    def wait_ns(self, member: Member, last_enter_ns: int | None = None) -> int:
        """Time `member` spent in the call waiting for the last to arrive."""
        last = self.last_arrival.enter_ns if last_enter_ns is None else last_enter_ns
        w = last - member.enter_ns
        if member.end_ns is not None:
            w = min(w, member.end_ns - member.enter_ns)
        return max(0, w)

    def arrivals(self) -> tuple[Member, dict[int, int]] | None:
        """(last to arrive, {rank: wait}) for a call every member completed.

        On clocks that agree, from entry times. Where they cannot agree (a member ended
        before the last one entered, impossible for a call that needs everyone), from
        durations, which need no alignment: the member that waited least arrived last.
        """
        ms = self.members
        if not ms or any(m.end_ns is None for m in ms):
            return None
        last = max(ms, key=_ENTER)
        t = last.enter_ns
        if all(m.end_ns >= t for m in ms):
            return last, {m.rank: min(t - m.enter_ns, m.end_ns - m.enter_ns) for m in ms}
        if any(m.async_op for m in ms):
            return None  # an async call's end is when it was noticed, not when it finished
        last = min(ms, key=_DURATION)
        d = last.end_ns - last.enter_ns
        return last, {m.rank: m.end_ns - m.enter_ns - d for m in ms}


@dataclass(slots=True)
class P2PMatch:
    """A send paired with its receive by (group, src, dst, seq); either side may be absent."""

    group: int
    src: int
    dst: int
    seq: int
    send: Member | None = None
    recv: Member | None = None

    @property
    def key(self) -> tuple[int, int, int, int]:
        return (self.group, self.src, self.dst, self.seq)


@dataclass(slots=True)
class RankTrace:
    """What one rank's recording says about the rank as a whole."""

    rank: int
    offset_ns: int  # this rank's clock minus rank 0's (subtracted from its times)
    events: int = 0
    dropped: int = 0
    truncated: bool = False
    first_ns: int | None = None
    last_ns: int | None = None
    source: tuple | None = None  # (bundle, steps) the trace was read from: last_record reads it, while open
    last_call: Member | None = None  # the communication call entered last
    last_call_group_seq: tuple[int, int] | None = None
    open_calls: list[tuple[str, int, int, Member]] = field(default_factory=list)  # (kind, group, seq, member)
    markers: list[Marker] = field(default_factory=list)  # recording_end, recorder_failed, call_failed, ...
    failed: list[tuple[int | None, int | None, Marker]] = field(default_factory=list)  # (group, seq, call_failed)
    off_ns: int | None = None  # when the recorder turned itself off, if it did
    ended: bool = False  # the recording has its proper end (a recording_end marker)
    crash: Crash | None = None  # how the process died, where its crash file says
    _last: Record | None = None

    @property
    def last_record(self) -> Record | None:
        """The record (not a marker) that ends latest, a later one winning a tie. Looked
        up when asked (a finding about the rank), since the graph keeps no records."""
        if self._last is None and self.source is not None and self.events:
            self._last = _last_record(*self.source, self.rank)
        return self._last


def _last_record(bundle, steps: tuple[int, int] | None, rank: int) -> Record | None:
    """Chunks are read latest-ending first (their index says), until none can hold a later end."""
    refs = bundle.chunks(rank)
    if steps is not None:
        refs = [r for r in refs if r.step_last >= steps[0] and r.step_first <= steps[1]]
    best = None  # (tail, chunk, index, record)
    for ref in sorted(refs, key=lambda r: r.t_last, reverse=True):
        if best is not None and ref.t_last < best[0]:
            break
        for i, rec in enumerate(bundle.read_chunk(ref)):
            if type(rec) is Marker or (steps is not None and not steps[0] <= rec.step <= steps[1]):
                continue
            key = (rec.start_ns if rec.end_ns is None else rec.end_ns, ref.number, i)
            if best is None or key > best[:3]:
                best = (*key, rec)
    return None if best is None else best[3]


@dataclass(frozen=True, slots=True)
class Crash:
    """What a rank's crash file (faulthandler's dump, carried in its rank info) says."""

    signal: str  # "SIGABRT", "SIGSEGV", ... or "fatal error" when the dump names none
    reason: str  # faulthandler's words: "Aborted", "Segmentation fault", ...
    stack: tuple[str, ...]  # the thread that matters, innermost first: "file:line in func"
    frames: tuple[tuple[str, int, str], ...]  # (path, line, function), innermost first
    thread: str  # "main", "current" or "first": which thread's stack this is
    text: str  # the dump, bounded

    @property
    def where(self) -> str | None:
        """file:line of the innermost frame in the program's own code (not the Python
        library, an installed package or prism-rr), else of the innermost frame."""
        for path, line, _ in self.frames:
            if not _library(path):
                return f"{_base(path)}:{line}"
        return f"{_base(self.frames[0][0])}:{self.frames[0][1]}" if self.frames else None

    @property
    def op(self) -> str | None:
        """The torch.distributed function the program called, if it was in one."""
        op = None
        for path, _, func in self.frames:
            p = path.replace("\\", "/")
            if "/torch/distributed/" in p and func not in ("wrapper", "<module>") and not func.startswith("_"):
                op = func  # the outermost such frame is the one the program called
            elif op is not None and not _library(path):
                break
        return op


def _base(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def _library(path: str) -> bool:
    p = path.replace("\\", "/")
    return ("/site-packages/" in p or "/dist-packages/" in p or "/prism_rr/" in p
            or "/lib/python3" in p or p.startswith("<"))


@dataclass(slots=True)
class StepStats:
    """One training step across ranks: durations in ns, keyed by rank."""

    step: int
    iteration_ns: dict[int, int] = field(default_factory=dict)
    wait_ns: dict[int, int] = field(default_factory=dict)
    compute_ns: dict[int, int] = field(default_factory=dict)
    comm_ns: dict[int, int] = field(default_factory=dict)
