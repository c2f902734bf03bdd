"""Build the execution graph: read each rank once, match calls across ranks.

Ranks are read one after another; only a compact `Member` per communication call is
kept (its signature interned), so memory grows with calls, not with records.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from prism_rr.format import ops
from prism_rr.format.reader import Bundle
from prism_rr.format.records import Collective, Compute, Marker, PointToPoint, Step
from prism_rr.analysis._model import Crash, MatchedCall, Member, P2PMatch, RankTrace, StepStats

__all__ = ["ExecutionGraph", "build_graph", "clock_offset", "clock_offsets", "parse_crash", "signature"]

# Marker names that say something about what a bundle can show.
_NOTABLE = frozenset({"recording_end", "recorder_failed", "call_failed", "recording_off", "records_dropped"})


def signature(rec: Collective) -> tuple:
    """What the members of one collective must agree on: (op, shapes, dtypes, reduce op, root)."""
    op = ops.lookup(rec.op)
    same = op.same if op is not None else None
    if same == "in":
        shapes, dtypes = rec.in_shapes, rec.in_dtypes
    elif same == "out":  # scatter: only the root has inputs; each member receives alike
        shapes, dtypes = rec.out_shapes, rec.out_dtypes
    else:  # all_to_all and unknown ops: splits may differ by rank, dtypes may not
        shapes, dtypes = None, tuple(sorted(set(rec.in_dtypes)))
    return (rec.op, shapes, dtypes, rec.reduce_op, rec.root)


def _RANK(m: Member) -> int:
    return m.rank


def clock_offset(info: dict) -> int | None:
    """A rank's clock minus rank 0's as its rank info estimates it, or None."""
    clock = info.get("clock_offset")
    if type(clock) is dict and type(clock.get("offset_ns")) is int:
        return clock["offset_ns"]
    return None


def clock_offsets(bundle: Bundle, ranks=None) -> dict[int, int]:
    """Each rank's clock minus rank 0's.

    Ranks on one host share one monotonic clock, so the per-rank estimates (each good to
    a few ms under load) are pooled by host: rank 0's host gets 0, another host the
    median of its ranks' estimates. A rank with neither host nor estimate gets 0.
    """
    ranks = bundle.recorded_ranks if ranks is None else ranks
    infos = {r: bundle.rank_info(r) for r in ranks}
    ref_host = bundle.rank_info(0).get("hostname")
    by_host: dict[str, list[int]] = {}
    for r, info in infos.items():
        host, est = info.get("hostname"), clock_offset(info)
        if type(host) is str and est is not None and host != ref_host:
            by_host.setdefault(host, []).append(est)
    pooled = {h: sorted(v)[len(v) // 2] for h, v in by_host.items()}
    out = {}
    for r, info in infos.items():
        host = info.get("hostname")
        if type(host) is str and ref_host is not None and host == ref_host:
            out[r] = 0
        elif type(host) is str and host in pooled:
            out[r] = pooled[host]
        else:
            out[r] = clock_offset(info) or 0
    return out


@dataclass(slots=True)
class ExecutionGraph:
    """Every recorded call matched across ranks, per-rank traces and per-step figures."""

    world_size: int
    ranks: list[int]
    groups: dict[int, tuple[int, ...]]  # group id -> global ranks
    calls: dict[tuple[int, int], MatchedCall] = field(default_factory=dict)
    p2p: dict[tuple[int, int, int, int], P2PMatch] = field(default_factory=dict)
    traces: dict[int, RankTrace] = field(default_factory=dict)
    steps: dict[int, StepStats] = field(default_factory=dict)
    t0_ns: int = 0  # earliest recorded time, on rank 0's clock

    def ordered_calls(self) -> list[MatchedCall]:
        """Matched collectives by first arrival."""
        return sorted(self.calls.values(), key=lambda c: (c.first_arrival.enter_ns if c.members else 0, c.key))

    def call_of(self, group: int, seq: int) -> MatchedCall | None:
        return self.calls.get((group, seq))


def build_graph(bundle: Bundle, *, steps: tuple[int, int] | None = None,
                ranks: list[int] | None = None) -> ExecutionGraph:
    """Read the recorded ranks of `bundle` (optionally only `steps` a..b) and match their calls."""
    recorded = bundle.recorded_ranks if ranks is None else [r for r in ranks if r in set(bundle.recorded_ranks)]
    rset = set(recorded)
    groups = {g["id"]: tuple(g["ranks"]) for g in bundle.groups}
    graph = ExecutionGraph(world_size=bundle.world_size, ranks=list(recorded), groups=groups)
    sums = bundle.summaries["ranks"]
    interned: dict[tuple, tuple] = {}
    offsets = clock_offsets(bundle, recorded)
    t0 = None
    for rank in recorded:
        trace = _read_rank(bundle, rank, offsets[rank], steps, graph, interned, rset)
        rs = sums.get(rank, {})
        trace.dropped = int(rs.get("dropped", 0) or 0)
        trace.truncated = bool(rs.get("truncated", False))
        trace.crash = parse_crash(bundle.rank_info(rank).get("crash"))
        graph.traces[rank] = trace
        if trace.first_ns is not None:
            t0 = trace.first_ns if t0 is None else min(t0, trace.first_ns)
    graph.t0_ns = t0 or 0
    stats = graph.steps
    for call in graph.calls.values():
        ms = call.members
        ms.sort(key=_RANK)
        last = max(m.enter_ns for m in ms)
        for m in ms:
            st = stats.get(m.step)
            if st is not None:
                st.wait_ns[m.rank] = st.wait_ns.get(m.rank, 0) + call.wait_ns(m, last)
    return graph


def _read_rank(bundle, rank, offset, steps, graph: ExecutionGraph, interned, rset) -> RankTrace:
    trace = RankTrace(rank=rank, offset_ns=offset)
    off = trace.offset_ns
    calls = graph.calls
    p2p = graph.p2p
    groups = graph.groups
    stats = graph.steps
    first = last = None
    last_end = None
    last_rec = None
    last_call = None
    last_enter = None
    prev_key = None  # (group, seq) of the collective just read
    n = 0
    for rec in bundle.events(rank, steps=steps):
        n += 1
        start = rec.start_ns - off
        end = None if rec.end_ns is None else rec.end_ns - off
        if first is None or start < first:
            first = start
        tail = start if end is None else end
        if last is None or tail > last:
            last = tail
        cls = type(rec)
        if cls is not Marker and (last_end is None or tail >= last_end):
            last_end, last_rec = tail, rec
        if cls is Collective or cls is PointToPoint:
            if cls is Collective:
                sig = signature(rec)
            else:
                sig = (rec.op, rec.shapes, rec.dtypes, None, None)
            sig = interned.setdefault(sig, sig)
            stack = rec.stack
            if stack is not None:
                stack = interned.setdefault(stack, stack)
            m = Member(rank=rank, enter_ns=start, end_ns=end, step=rec.step, op=rec.op, sig=sig,
                       stack=stack, async_op=rec.async_op)
            if last_enter is None or start >= last_enter:
                last_enter, last_call = start, m
                trace.last_call_group_seq = (rec.group, rec.seq)
            st = stats.get(rec.step)
            if st is None:
                st = stats[rec.step] = StepStats(step=rec.step)
            if end is not None and not rec.async_op:
                st.comm_ns[rank] = st.comm_ns.get(rank, 0) + (end - start)
            prev_key = (rec.group, rec.seq) if cls is Collective else None
            if cls is Collective:
                key = (rec.group, rec.seq)
                call = calls.get(key)
                if call is None:
                    members = groups.get(rec.group)
                    expected = tuple(r for r in members if r in rset) if members else ()
                    call = calls[key] = MatchedCall(group=rec.group, seq=rec.seq, expected=expected)
                call.members.append(m)
                if end is None:
                    trace.open_calls.append(("collective", rec.group, rec.seq, m))
            else:
                sending = not ops.receives(rec.op)
                if end is None:
                    trace.open_calls.append(("p2p", rec.group, rec.seq, m))
                if rec.peer < 0 or rec.seq < 0:
                    continue  # a receive from any source that never completed: no partner known
                src, dst = (rank, rec.peer) if sending else (rec.peer, rank)
                key = (rec.group, src, dst, rec.seq)
                pm = p2p.get(key)
                if pm is None:
                    pm = p2p[key] = P2PMatch(group=rec.group, src=src, dst=dst, seq=rec.seq)
                if sending:
                    pm.send = m
                else:
                    pm.recv = m
        elif cls is Compute:
            if rec.name is None and end is not None:
                st = stats.get(rec.step)
                if st is None:
                    st = stats[rec.step] = StepStats(step=rec.step)
                st.compute_ns[rank] = st.compute_ns.get(rank, 0) + (end - start)
        elif cls is Step:
            if end is not None:
                st = stats.get(rec.step)
                if st is None:
                    st = stats[rec.step] = StepStats(step=rec.step)
                st.iteration_ns[rank] = end - start
        elif cls is Marker:
            if rec.name == "call_failed" and len(trace.failed) < 1000:
                # written right after the failed call's record, whose seq it names
                group = prev_key[0] if prev_key is not None and prev_key[1] == rec.value else None
                trace.failed.append((group, rec.value, rec))
            if rec.name == "recording_end":
                trace.ended = True
            if rec.name in _NOTABLE:
                if len(trace.markers) < 1000:
                    trace.markers.append(rec)
                if rec.name in ("recorder_failed", "recording_off") and trace.off_ns is None:
                    trace.off_ns = start
    trace.events = n
    trace.first_ns, trace.last_ns = first, last
    trace.last_record = last_rec
    trace.last_call = last_call
    return trace


# --- crash files ------------------------------------------------------------------------

# faulthandler's words for the signals it handles
_FATAL = {
    "Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
    "Floating-point exception": "SIGFPE", "Floating point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}
_THREAD = re.compile(r"(Current thread|Thread) (0x[0-9a-fA-F]{1,16})(?: \[[^\]]*\])? \(most recent call first\):$")
_FRAME = re.compile(r'  File "(.{1,1000})", line (\d{1,9}) in (.{1,200})$')
_MAX_CRASH_TEXT = 64 << 10
_MAX_THREADS = 256
_MAX_FRAMES = 200


def parse_crash(value) -> Crash | None:
    """The rank info key `crash` (FORMAT.md), read as the untrusted text it is: bounded,
    type-checked, parsed by pattern; None when absent or unreadable."""
    if type(value) is not dict or type(value.get("text")) is not str:
        return None
    text = value["text"][:_MAX_CRASH_TEXT]
    main = value.get("main_thread")
    main = main.lower() if type(main) is str else None
    reason = ""
    threads: list[tuple[str, str, list]] = []  # (label, id, frames)
    for line in text.splitlines():
        if line.startswith("Fatal Python error: ") and not reason:
            reason = line[len("Fatal Python error: "):].strip()[:100]
            continue
        m = _THREAD.match(line)
        if m:
            if len(threads) >= _MAX_THREADS:
                break
            threads.append((m.group(1), m.group(2).lower(), []))
            continue
        m = _FRAME.match(line)
        if m and threads and len(threads[-1][2]) < _MAX_FRAMES:
            threads[-1][2].append((m.group(1), int(m.group(2)), m.group(3)))
    if not reason and not threads:
        return None
    pick, which = None, "first"

    def same(a: str, b: str | None) -> bool:
        return b is not None and int(a, 16) == int(b, 16)

    for label, tid, frames in threads:
        if same(tid, main) and frames:
            pick, which = frames, "main"
            break
    if pick is None:
        for label, tid, frames in threads:
            if label == "Current thread" and frames:
                pick, which = frames, "current"
                break
    if pick is None:
        pick = next((frames for _, _, frames in threads if frames), [])
    frames = tuple(pick)
    stack = tuple(f"{path.replace(chr(92), '/').rsplit('/', 1)[-1]}:{line} in {func}" for path, line, func in frames)
    return Crash(signal=_FATAL.get(reason, "fatal error"), reason=reason or "unknown", stack=stack,
                 frames=frames, thread=which, text=text)
