"""Find and explain what went wrong in a recorded run: hangs, mismatches, stragglers, gaps."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prism_rr.format import ops
from prism_rr.format.reader import Bundle
from prism_rr.format.records import Collective, Compute, GroupInfo, Marker, Memory, PointToPoint, Step
from prism_rr.analysis._build import ExecutionGraph, build_graph
from prism_rr.analysis._model import MatchedCall, Member

__all__ = ["KINDS", "Finding", "diagnose", "diagnosis_json"]

# Finding kinds, in the order they are reported.
KINDS = (
    "crashed", "hang", "incomplete", "drift", "mismatch", "unmatched_p2p", "straggler",
    "call_failed", "recorder_failed", "dropped", "truncated",
)
_MAX_LISTED = 20  # seqs listed in a coalesced finding's details

# Straggler thresholds: a rank must arrive last this much more often than chance, at
# calls whose skew is above the noise floor, and cost the others this share of their time.
STRAGGLER_MIN_SKEW_NS = 50_000
STRAGGLER_MIN_Z = 3.0
STRAGGLER_MIN_RATIO = 2.0
STRAGGLER_MIN_COUNT = 3
STRAGGLER_MIN_FRACTION = 0.20  # of the others' step time lost waiting for the rank
STRAGGLER_MIN_LOST_PER_STEP_NS = 1_000_000  # below this, scheduling noise on a busy host


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One problem: what kind, which ranks, which call, and a sentence for people."""

    kind: str
    ranks: tuple[int, ...]
    message: str
    group: int | None = None
    seq: int | None = None
    stack: tuple[str, ...] | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "ranks": list(self.ranks), "group": self.group, "seq": self.seq,
            "message": self.message, "stack": list(self.stack) if self.stack else None,
            "details": self.details,
        }


def diagnosis_json(findings: list[Finding]) -> dict[str, Any]:
    """The `--json` form: {"findings": [...], "summary": {...}}."""
    by_kind: dict[str, int] = {}
    for f in findings:
        by_kind[f.kind] = by_kind.get(f.kind, 0) + 1
    ranks = sorted({r for f in findings for r in f.ranks})
    text = "no problems found" if not findings else (
        f"{len(findings)} finding{'s' if len(findings) != 1 else ''}: "
        + ", ".join(f"{n} {k}" for k, n in by_kind.items())
    )
    return {
        "findings": [f.to_dict() for f in findings],
        "summary": {"count": len(findings), "by_kind": by_kind, "ranks": ranks, "message": text},
    }


def diagnose(bundle: Bundle, *, graph: ExecutionGraph | None = None) -> list[Finding]:
    """Everything notable in `bundle`, most serious first; an empty list on a clean run."""
    g = build_graph(bundle) if graph is None else graph
    failures = _Failures(g)
    odd = _Odd(g)
    out: list[Finding] = []
    out += _crashes(g)
    out += _hangs(g, failures, odd)
    drifts = _drifts(g)
    out += drifts
    out += _fold_into_drifts(_mismatches(g, failures, odd), drifts)
    out += _unmatched_p2p(g, odd)
    out += _stragglers(g, {d.group: d.seq for d in drifts}, odd)
    out += _call_failures(g, failures)
    out += _gaps(g)
    out.sort(key=lambda f: _order(g, f))
    return out


_ON_CALLS = ("hang", "incomplete", "drift", "mismatch", "unmatched_p2p")


class _Odd:
    """The calls that may be about a problem, as objects, made once: a member missing,
    one too many, one never completed, or members that disagree. Every other call is
    read from the graph's columns."""

    def __init__(self, g: ExecutionGraph):
        t, p = g.table, g.p2p_table
        self.ids = t.interesting()
        self.calls = [t.call(i) for i in self.ids]
        self.irregular = [c for i, c in zip(self.ids, self.calls) if not t.regular[i]]
        self.disagreeing = sorted((c for i, c in zip(self.ids, self.calls) if t.disagree[i]), key=lambda c: c.key)
        self.p2p = [p.match(i) for i in p.interesting()]


def _order(g: ExecutionGraph, f: Finding) -> tuple:
    """Crashes first, then problems on calls, earliest first (the first is most often
    the cause of the rest), then stragglers, then what the bundle cannot show."""
    if f.kind == "crashed":
        return (-1, f.details.get("last_ns") or 0, f.ranks)
    if f.kind in _ON_CALLS:
        t = None
        call = g.calls.get((f.group, f.seq)) if "src" not in f.details else None
        if call is not None and call.members:
            t = call.first_arrival.enter_ns
        else:
            pm = g.p2p.get((f.group, f.details.get("src"), f.details.get("dst"), f.seq))
            m = pm and (pm.send or pm.recv)
            t = m.enter_ns if m else None
        return (0, t if t is not None else 1 << 62, _ON_CALLS.index(f.kind), f.ranks)
    return (1 + KINDS.index(f.kind) if f.kind in KINDS else 99, f.group or -1, f.seq or -1, f.ranks)


class _Failures:
    """Calls that ended in an error (call_failed markers); a finding that explains one
    takes it, and the rest are reported on their own."""

    def __init__(self, g: ExecutionGraph):
        self.by_call: dict[tuple[int, int], dict[int, str]] = {}
        self.explained: set[tuple[int, int | None, int | None]] = set()
        for rank, trace in g.traces.items():
            for group, seq, mk in trace.failed:
                if group is not None:
                    self.by_call.setdefault((group, seq), {})[rank] = mk.text or ""

    def take(self, group: int, seq: int, ranks=None) -> dict[int, str]:
        got = {r: t for r, t in self.by_call.get((group, seq), {}).items() if ranks is None or r in ranks}
        self.explained.update((r, group, seq) for r in got)
        return got


def _short(text: str, n: int = 160) -> str:
    text = re.sub(r"\[[^\]]*[/\\][^\]]*\]\s*", "", " ".join(text.split()))  # "[/src/gloo/pair.cc:78] "
    return text if len(text) <= n else text[: n - 3] + "..."


# --- wording --------------------------------------------------------------------------


def _ranks_text(ranks) -> str:
    ranks = sorted(ranks)
    if not ranks:
        return "no rank"
    word = "rank" if len(ranks) == 1 else "ranks"
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{word} {ranks[0]}-{ranks[-1]}"
    if len(ranks) > 12:
        return f"{word} {', '.join(map(str, ranks[:10]))}, ... ({len(ranks)} in all)"
    return f"{word} {', '.join(map(str, ranks))}"


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.3f} ms"


def _at(g: ExecutionGraph, t: int) -> str:
    return f"+{(t - g.t0_ns) / 1e6:.3f} ms"


def _call_text(op: str, group: int, seq: int) -> str:
    return f"{op} (group {group}, seq {seq})"


def _describe_record(rec) -> str:
    cls = type(rec)
    if cls is Collective:
        return f"{rec.op} (group {rec.group}, seq {rec.seq})"
    if cls is PointToPoint:
        direction = "from" if ops.receives(rec.op) else "to"
        return f"{rec.op} {direction} rank {rec.peer} (group {rec.group}, message {rec.seq})"
    if cls is Compute:
        return f"compute{' ' + rec.name if rec.name else ''}"
    if cls is Step:
        return "the end of a step"
    if cls is Marker:
        return f"marker {rec.name}" + (f" ({rec.text})" if rec.text else "")
    if cls is Memory:
        return "a memory sample"
    if cls is GroupInfo:
        return f"creating group {rec.group}"
    return type(rec).__name__


def _doing_last(g: ExecutionGraph, rank: int, failures: "_Failures | None" = None) -> tuple[str, dict]:
    """What a rank was doing last, in words and as details."""
    trace = g.traces.get(rank)
    if trace is None or trace.events == 0:
        return f"rank {rank} recorded nothing", {"state": "nothing recorded"}
    if trace.open_calls:
        kind, group, seq, m = min(trace.open_calls, key=lambda c: c[3].enter_ns)
        if kind == "collective":
            what = _call_text(m.op, group, seq)
        else:
            what = f"{m.op} (group {group}, message {seq})"
        if _abrupt(g, rank):
            text = (f"rank {rank} was in {what} since {_at(g, m.enter_ns)} when its records end "
                    f"({_death(trace)})")
        else:
            text = f"rank {rank} was blocked in {what} since {_at(g, m.enter_ns)} and never left it"
        return (text,
                {"state": "blocked", "op": m.op, "group": group, "seq": seq, "since_ns": m.enter_ns - g.t0_ns,
                 "stack": list(m.stack) if m.stack else None})
    rec = trace.last_record
    if rec is None:
        return f"rank {rank} recorded no calls or compute", {"state": "nothing recorded"}
    end = rec.start_ns if rec.end_ns is None else rec.end_ns
    text = f"rank {rank}'s last record is {_describe_record(rec)} in step {rec.step}, ending at {_at(g, end - trace.offset_ns)}"
    ends = [mk for mk in trace.markers if mk.name == "recording_end"]
    details: dict[str, Any] = {"state": "finished", "last": _describe_record(rec), "step": rec.step,
                               "last_ns": end - trace.offset_ns - g.t0_ns}
    if failures is not None and type(rec) is Collective:
        failed = failures.take(rec.group, rec.seq, (rank,))
        if failed:
            text += f", which failed ({_short(failed[rank])})"
            details["failed"] = failed[rank]
    if ends and ends[-1].text:
        text += f"; its recording then ended ({ends[-1].text})"
        details["ended"] = ends[-1].text
    elif trace.crash is not None:
        text += f"; then the process died ({trace.crash.signal})"
        details["state"] = "truncated" if trace.truncated else "crashed"
        details["signal"] = trace.crash.signal
    elif trace.truncated:
        text += "; its spool is truncated (was the process killed?)"
        details["state"] = "truncated"
    elif not ends:
        text += "; then nothing: its recording stops without a proper end (was the process killed?)"
        details["state"] = "stopped"
    return text, details


def _abrupt(g: ExecutionGraph, rank: int) -> bool:
    """The rank's records end without the recording's proper end: the process died (or
    the spool was packed while it ran), and what it did after its last record is unknown."""
    trace = g.traces.get(rank)
    return trace is not None and trace.events > 0 and (not trace.ended or trace.truncated)


LOSS_NS = 100_000_000  # what a rank that dies may lose of its last records


def _ends_before(g: ExecutionGraph, rank: int, t: int) -> bool:
    """The rank's records end before `t` plus what a death may lose: they cannot show
    whether it entered a call at `t`."""
    last = g.traces[rank].last_ns
    return last is None or last < t + LOSS_NS


def _death(trace) -> str:
    if trace.crash is not None:
        return f"process died: {trace.crash.signal}"
    if trace.truncated:
        return "its spool ends in a torn frame: the process died while writing"
    return "no proper end: the process died or was killed"


def _end_text(g: ExecutionGraph, rank: int) -> tuple[str, dict]:
    """'rank 1's records end at +22.000 ms (process died: SIGABRT); what it did
    afterwards is unknown', and as details."""
    trace = g.traces[rank]
    last = trace.last_ns if trace.last_ns is not None else g.t0_ns
    why = _death(trace)
    details: dict[str, Any] = {"records_end_ns": last - g.t0_ns, "death": why}
    if trace.crash is not None:
        details["signal"] = trace.crash.signal
    return f"rank {rank}'s records end at {_at(g, last)} ({why}); what it did afterwards is unknown", details


# --- crashes --------------------------------------------------------------------------


def _crashes(g: ExecutionGraph) -> list[Finding]:
    """A rank whose process died of a fatal signal its crash file names."""
    out = []
    for rank, trace in g.traces.items():
        crash = trace.crash
        if crash is None or (trace.ended and not trace.truncated):
            continue  # a crash after the recording ended (teardown) explains no record
        last = trace.last_ns if trace.last_ns is not None else g.t0_ns
        op, group, seq = crash.op, None, None
        if trace.open_calls:  # the call it was in, as its records show
            _, group, seq, m = max(trace.open_calls, key=lambda c: c[3].enter_ns)
            op = m.op
        where = crash.where
        what = (f" in {_call_text(op, group, seq)}" if group is not None
                else f" in {op}" if op else "")
        at = f" at {where}" if where else ""
        msg = (f"Rank {rank} crashed ({crash.signal}){what}{at}; its records end at {_at(g, last)}. "
               f"faulthandler: \"{crash.reason}\" ({crash.thread} thread's stack below).")
        out.append(Finding(
            kind="crashed", ranks=(rank,), group=group, seq=seq, message=msg, stack=crash.stack or None,
            details={"signal": crash.signal, "reason": crash.reason, "op": op, "where": where,
                     "thread": crash.thread, "last_ns": last - g.t0_ns, "text": crash.text[:8192]}))
    return out


# --- hangs ----------------------------------------------------------------------------


def _recording_off_before(g: ExecutionGraph, rank: int, t: int) -> bool:
    off = g.traces[rank].off_ns if rank in g.traces else None
    return off is not None and off <= t


def _hangs(g: ExecutionGraph, failures: _Failures, odd: _Odd) -> list[Finding]:
    out: list[Finding] = []
    runs: dict[tuple, list[MatchedCall]] = {}  # (kind, group, ranks) -> calls, coalesced
    for call in odd.calls:
        if not call.members:
            continue
        first = call.first_arrival.enter_ns
        missing = tuple(r for r in call.missing if not _recording_off_before(g, r, first))
        if missing:
            runs.setdefault(("hang", call.group, missing), []).append(call)
        elif call.incomplete and not call.missing:
            runs.setdefault(("incomplete", call.group, call.incomplete), []).append(call)
    for (kind, group, ranks), calls in runs.items():
        calls.sort(key=lambda c: c.seq)
        call = calls[0]
        seqs = [c.seq for c in calls]
        entered = call.entered
        waiting = [m for m in call.members if m.end_ns is None]
        stack = next((m.stack for m in call.members if m.stack), None)
        details: dict[str, Any] = {
            "op": call.op, "entered": list(entered), "never_completed": list(call.incomplete),
            "seqs": seqs[:_MAX_LISTED], "calls": len(seqs),
        }
        if kind == "hang":
            doing = {}
            sentences = []
            for r in ranks:
                text, d = _doing_last(g, r, failures)
                doing[str(r)] = d
                sentences.append(text)
            details["missing"] = list(ranks)
            details["missing_last"] = doing
            stuck = f"; {_ranks_text(call.incomplete)} waited there and never completed it" if waiting else ""
            failed = failures.take(group, call.seq)
            if failed:
                details["failed"] = {str(r): t for r, t in sorted(failed.items())}
                stuck += (f"; the wait ended in an error on {_ranks_text(failed)} "
                          f"({_short(next(iter(failed.values())))})")
            more = f" ({len(seqs) - 1} later calls of this group lack them too)" if len(seqs) > 1 else ""
            # ranks whose records end (the process died) before they could show the
            # call: whether they entered it later is unknown
            unknown = [r for r in ranks if _abrupt(g, r) and _ends_before(g, r, call.first_arrival.enter_ns)]
            known = [r for r in ranks if r not in unknown]
            if unknown:
                sentences = []
                for r in unknown:
                    text, d = _end_text(g, r)
                    doing[str(r)].update(d)
                    if g.traces[r].open_calls:  # what its records last show it in
                        text = _doing_last(g, r, failures)[0] + "; what it did afterwards is unknown"
                    sentences.append(text)
                for r in known:
                    sentences.append(_doing_last(g, r, failures)[0])
                details["unknown_after"] = unknown
                never = f" but never by {_ranks_text(known)}" if known else ""
                msg = (f"{_call_text(call.op, group, call.seq)} was entered by {_ranks_text(entered)}{never}"
                       f"{stuck}{more}. " + ". ".join(s[0].upper() + s[1:] for s in sentences) + ".")
            else:
                msg = (f"{_call_text(call.op, group, call.seq)} was entered by {_ranks_text(entered)} "
                       f"but never by {_ranks_text(ranks)}{stuck}{more}. "
                       + ". ".join(s[0].upper() + s[1:] for s in sentences) + ".")
        else:
            more = f" ({len(seqs) - 1} later calls too)" if len(seqs) > 1 else ""
            msg = (f"{_call_text(call.op, group, call.seq)} was entered by every member but never "
                   f"completed on {_ranks_text(ranks)}{more}.")
        out.append(Finding(kind=kind, ranks=tuple(ranks), group=group, seq=call.seq, message=msg,
                           stack=stack, details=details))
    # point-to-point calls left open whose partner is there: a receive never matched is
    # reported as unmatched; a matched pair that never completed is incomplete.
    for pm in odd.p2p:
        if pm.send is None or pm.recv is None:
            continue
        stuck = [m for m in (pm.send, pm.recv) if m.end_ns is None]
        if stuck:
            ranks = tuple(sorted(m.rank for m in stuck))
            out.append(Finding(
                kind="incomplete", ranks=ranks, group=pm.group, seq=pm.seq,
                message=(f"{pm.send.op} from rank {pm.src} to rank {pm.dst} (group {pm.group}, message {pm.seq}) "
                         f"was posted on both sides but never completed on {_ranks_text(ranks)}."),
                stack=stuck[0].stack, details={"src": pm.src, "dst": pm.dst, "op": pm.send.op}))
    return out


# --- drift: call sequences that part ---------------------------------------------------


def _where(m: Member) -> str:
    return m.stack[0].split(" in ")[0] if m.stack else "an unrecorded line"


def _drifts(g: ExecutionGraph) -> list[Finding]:
    """Ranks whose calls in a group part from a reference rank's: the first step where
    they made different calls, after which seq numbers pair calls that do not belong
    together. Only where both ranks made calls past that point: a rank that stops is a
    hang (or a death), not a drift."""
    t = g.table
    out: list[Finding] = []
    for group, ref, ranks in _parting(t):
        ref_calls = _calls_of(t, group, ref)
        ref_steps = _by_step(ref_calls)
        for rank in ranks:
            if len(out) < _MAX_LISTED:
                f = _drift(g, group, ref, ref_steps, ref_calls, rank, _calls_of(t, group, rank))
                if f is not None:
                    out.append(f)
    return out


def _parting(t) -> list[tuple[int, int, list[int]]]:
    """(group, reference rank, ranks) where those ranks made, in some step, another number
    of the group's calls than the reference rank (the one that made most), counted from
    the columns by sorting rather than per member."""
    if not len(t.rank):
        return []
    head = np.ones(len(t.group), bool)
    head[1:] = t.group[1:] != t.group[:-1]  # rows are sorted by group
    gids, gi = t.group[head], np.cumsum(head) - 1
    ranks, ri = np.arange(int(t.rank.max()) + 1), t.rank  # recorded ranks are below the world size
    lo, hi = int(t.step.min()), int(t.step.max())
    if hi - lo < 1 << 20:
        steps, si = np.arange(lo, hi + 1), t.step - lo
    else:
        steps, si = np.unique(t.step, return_inverse=True)
    nr, ns = len(ranks), len(steps)
    if len(gids) * nr * ns < 1 << 62:  # one sort of one key
        cells, counts = np.unique((gi * nr + ri) * ns + si.reshape(-1), return_counts=True)
        by_pair = cells // ns
        first = np.ones(len(cells), bool)
        first[1:] = by_pair[1:] != by_pair[:-1]
        pairs, cell_pair = by_pair[first], np.cumsum(first) - 1
    else:
        pairs, pair_of_row = np.unique(gi * nr + ri, return_inverse=True)
        cells, counts = np.unique(pair_of_row.reshape(-1) * ns + si.reshape(-1), return_counts=True)
        cell_pair = cells // ns
    cell_step = cells % ns  # a cell: one (group, rank, step)
    p_group, p_rank = pairs // nr, pairs % nr
    steps_of_pair = np.bincount(cell_pair, minlength=len(pairs))
    calls_of_pair = np.bincount(cell_pair, weights=counts, minlength=len(pairs))
    best = np.lexsort((p_rank, -calls_of_pair, p_group))  # per group: most calls, then the lowest rank
    first = np.ones(len(best), bool)
    first[1:] = p_group[best][1:] != p_group[best][:-1]
    ref_of_group = np.full(len(gids), -1, np.int64)
    ref_of_group[p_group[best[first]]] = best[first]
    cell_group = p_group[cell_pair]
    is_ref = cell_pair == ref_of_group[cell_group]
    key = cell_group * ns + cell_step
    ref_key, ref_count = key[is_ref], counts[is_ref]  # sorted: cells are in (group, rank, step) order
    at = np.minimum(np.searchsorted(ref_key, key), len(ref_key) - 1)
    same = (ref_key[at] == key) & (ref_count[at] == counts)
    agreeing = np.bincount(cell_pair, weights=same, minlength=len(pairs))
    ref_steps = steps_of_pair[ref_of_group[p_group]]
    parts = ~((agreeing == steps_of_pair) & (steps_of_pair == ref_steps))
    ranks_in_group = np.bincount(p_group, minlength=len(gids))
    out: list[tuple[int, int, list[int]]] = []
    for j in np.flatnonzero(parts & (ranks_in_group[p_group] >= 2)).tolist():
        gid, rank = int(gids[p_group[j]]), int(ranks[p_rank[j]])
        if out and out[-1][0] == gid:
            out[-1][2].append(rank)
        else:
            out.append((gid, int(ranks[p_rank[ref_of_group[p_group[j]]]]), [rank]))
    return out


def _calls_of(t, group: int, rank: int) -> list[tuple[int, Member]]:
    """(seq, member) of one rank's calls in one group, by seq."""
    lo = int(np.searchsorted(t.group, group, "left"))
    hi = int(np.searchsorted(t.group, group, "right"))
    rows = lo + np.flatnonzero(t.rank[lo:hi] == rank)
    return [(int(t.seq[r]), t.member(r)) for r in rows.tolist()]


def _call_key(m: Member) -> tuple:
    return (m.op, m.sig, m.stack[0] if m.stack else None)


def _by_step(calls) -> dict[int, list[tuple[int, Member]]]:
    steps: dict[int, list] = {}
    for seq, m in calls:
        steps.setdefault(m.step, []).append((seq, m))
    return steps


def _drift(g, group, ref, ref_steps, ref_calls, rank, calls) -> Finding | None:
    mine = _by_step(calls)
    for step in sorted(set(ref_steps) | set(mine)):
        a, b = ref_steps.get(step, []), mine.get(step, [])
        ops_a, ops_b = [m.op for _, m in a], [m.op for _, m in b]
        if len(ops_a) == len(ops_b):
            continue  # as many calls: what differs pairs up, and is a mismatch
        # the first position where the calls differ: by op, signature or line
        keys_a, keys_b = [_call_key(m) for _, m in a], [_call_key(m) for _, m in b]
        i = next((i for i, (x, y) in enumerate(zip(keys_a, keys_b)) if x != y), min(len(a), len(b)))
        seq = a[i][0] if i < len(a) else b[i][0]
        # from `seq` on, both ranks made calls that pair by seq: the wrong ones
        late_ref = next((m for s, m in ref_calls if s >= seq), None)
        late = next((m for s, m in calls if s >= seq), None)
        if late_ref is None or late is None:
            return None  # one of them stopped: a hang or a death, reported as such
        counts: dict[str, tuple[int, int]] = {}
        for op in dict.fromkeys(ops_a + ops_b):
            counts[op] = (ops_a.count(op), ops_b.count(op))
        op = next(op for op, (x, y) in counts.items() if x != y)
        x, y = counts[op]
        if y < x:
            made = f"rank {rank} made {y} of the {x} {op} calls (group {group}) that rank {ref} made"
        else:
            made = f"rank {rank} made {y} {op} calls (group {group}) where rank {ref} made {x}"
        msg = (f"In step {step}, {made}; from there on its calls pair with the wrong ones: "
               f"rank {ref}'s {late_ref.op} at {_where(late_ref)} (step {late_ref.step}) is seq {seq} of group {group}, "
               f"and so is rank {rank}'s {late.op} at {_where(late)} (step {late.step}).")
        return Finding(
            kind="drift", ranks=(rank,), group=group, seq=seq, message=msg,
            stack=late.stack or late_ref.stack,
            details={"step": step, "op": op, "reference": ref,
                     "counts": {o: {str(ref): x, str(rank): y} for o, (x, y) in counts.items()},
                     "where": {str(ref): _where(late_ref), str(rank): _where(late)},
                     "stacks": {str(ref): list(late_ref.stack or ()), str(rank): list(late.stack or ())},
                     "later_mismatches": 0})
    return None


def _fold_into_drifts(findings: list[Finding], drifts: list[Finding]) -> list[Finding]:
    """Mismatches a drift explains (its group, from its seq on, between its ranks) are
    counted in the drift finding rather than reported one by one."""
    if not drifts:
        return findings
    out = []
    for f in findings:
        cause = next((d for d in drifts if f.kind == "mismatch" and f.group == d.group and f.seq is not None
                      and f.seq >= d.seq and "src" not in f.details
                      and set(f.ranks) <= {d.ranks[0], d.details["reference"]}), None)
        if cause is None:
            out.append(f)
        else:
            cause.details["later_mismatches"] += 1 + int(f.details.get("later_count", 0))
    return out


# --- mismatches -----------------------------------------------------------------------


def _fmt_shapes(shapes) -> str:
    if shapes is None:
        return "?"
    return ", ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes) or "no tensors"


def _difference(odd: tuple, ref: tuple) -> tuple[str, str, str]:
    """(field, odd value, reference value) of the first field that differs."""
    names = ("op", "shapes", "dtypes", "reduce op", "root")
    for name, a, b in zip(names, odd, ref):
        if a != b:
            if name == "shapes":
                return name, _fmt_shapes(a), _fmt_shapes(b)
            if name == "dtypes":
                return name, ", ".join(a) or "none", ", ".join(b) or "none"
            return name, str(a), str(b)
    return "signature", str(odd), str(ref)


def _mismatches(g: ExecutionGraph, failures: _Failures, looked_at: _Odd) -> list[Finding]:
    out: list[Finding] = []
    pending: list[dict] = []
    seen: dict[tuple[int, tuple[int, ...]], dict] = {}  # (group, odd ranks) -> first finding's details
    for call in looked_at.disagreeing:
        if len(call.members) < 2:
            continue
        first_sig = call.members[0].sig
        if all(m.sig is first_sig or m.sig == first_sig for m in call.members):
            continue
        counts: dict[tuple, list[Member]] = {}
        for m in call.members:
            counts.setdefault(m.sig, []).append(m)
        ref_sig = max(counts, key=lambda s: (len(counts[s]), -min(m.rank for m in counts[s])))
        ref_ranks = [m.rank for m in counts[ref_sig]]
        odd = [m for m in call.members if m.sig != ref_sig]
        odd_ranks = tuple(sorted(m.rank for m in odd))
        prior = seen.get((call.group, odd_ranks))
        if prior is not None:  # the same ranks out of step again: most likely a consequence
            if len(prior["later"]) < _MAX_LISTED:
                prior["later"].append(call.seq)
            prior["later_count"] += 1
            continue
        parts = []
        fields: dict[str, Any] = {}
        for sig, ms in counts.items():
            if sig == ref_sig:
                continue
            name, a, b = _difference(sig, ref_sig)
            ranks = [m.rank for m in ms]
            fields[name] = {"ranks": sorted(ranks), "value": a, "expected": b}
            verb = "called" if name == "op" else "passed"
            if name == "op":
                parts.append(f"{_ranks_text(ranks)} called {a} where {_ranks_text(ref_ranks)} called {b}")
            else:
                parts.append(f"{_ranks_text(ranks)} {verb} {name} {a} where {_ranks_text(ref_ranks)} passed {b}")
        details = {"op": ref_sig[0], "differences": fields, "later": [], "later_count": 0,
                   "expected_ranks": sorted(ref_ranks)}
        failed = failures.take(call.group, call.seq)
        if failed:
            details["failed"] = {str(r): t for r, t in sorted(failed.items())}
            parts.append(f"the call then failed on {_ranks_text(failed)} ({_short(next(iter(failed.values())))})")
        seen[(call.group, odd_ranks)] = details
        msg = f"Members of {_call_text(ref_sig[0], call.group, call.seq)} disagree: " + "; ".join(parts) + "."
        pending.append(dict(kind="mismatch", ranks=odd_ranks, group=call.group, seq=call.seq, message=msg,
                            stack=next((m.stack for m in odd if m.stack), None), details=details))
    for kw in pending:
        n = kw["details"]["later_count"]
        if n:
            kw["message"] += (f" {n} later calls of group {kw['group']} disagree the same way "
                              "(the same ranks are likely out of step).")
        out.append(Finding(**kw))
    # sends and receives that pair up but disagree on what is sent
    for pm in looked_at.p2p:
        if pm.send is None or pm.recv is None:
            continue
        (_, s_shapes, s_dtypes, _, _), (_, r_shapes, r_dtypes, _, _) = pm.send.sig, pm.recv.sig
        if s_shapes != r_shapes or s_dtypes != r_dtypes:
            out.append(Finding(
                kind="mismatch", ranks=(pm.src, pm.dst), group=pm.group, seq=pm.seq,
                message=(f"Rank {pm.src} sent {_fmt_shapes(s_shapes)} {', '.join(s_dtypes)} to rank {pm.dst} "
                         f"(group {pm.group}, message {pm.seq}), which received into "
                         f"{_fmt_shapes(r_shapes)} {', '.join(r_dtypes)}."),
                stack=pm.send.stack or pm.recv.stack,
                details={"op": pm.send.op, "src": pm.src, "dst": pm.dst}))
    return out


def _unmatched_p2p(g: ExecutionGraph, odd: _Odd) -> list[Finding]:
    recorded = set(g.ranks)
    runs: dict[tuple, list] = {}
    for pm in odd.p2p:
        if (pm.send is None) == (pm.recv is None):
            continue
        m = pm.send or pm.recv
        other = pm.dst if pm.send is not None else pm.src
        if other not in recorded or _recording_off_before(g, other, m.enter_ns):
            continue
        runs.setdefault((pm.group, pm.src, pm.dst, pm.send is not None), []).append(pm)
    out = []
    for (group, src, dst, sending), pms in runs.items():
        pms.sort(key=lambda p: p.seq)
        pm = pms[0]
        m = pm.send or pm.recv
        n = len(pms)
        more = f" ({n - 1} later messages too)" if n > 1 else ""
        other = dst if sending else src
        if _abrupt(g, other):
            unknown = _end_text(g, other)[0]
            if sending:
                msg = (f"Rank {src} sent {_fmt_shapes(m.sig[1])} to rank {dst} (group {group}, message {pm.seq}) "
                       f"and no matching receive is recorded{more}; {unknown}.")
            else:
                msg = (f"Rank {dst} waited to receive from rank {src} (group {group}, message {pm.seq}) "
                       f"and no matching send is recorded{more}; {unknown}.")
        elif sending:
            msg = (f"Rank {src} sent {_fmt_shapes(m.sig[1])} to rank {dst} (group {group}, message {pm.seq}) "
                   f"but rank {dst} never posted the matching receive{more}.")
        else:
            msg = (f"Rank {dst} waited to receive from rank {src} (group {group}, message {pm.seq}) "
                   f"but rank {src} never sent it{more}.")
        ranks = (src, dst)
        out.append(Finding(kind="unmatched_p2p", ranks=ranks, group=group, seq=pm.seq, message=msg,
                           stack=m.stack, details={"src": src, "dst": dst, "op": m.op, "side": "send" if sending else "recv",
                                                   "seqs": [p.seq for p in pms[:_MAX_LISTED]], "count": n,
                                                   "completed": m.end_ns is not None}))
    return out


# --- stragglers -----------------------------------------------------------------------


def _stragglers(g: ExecutionGraph, drifted: dict[int, int] | None = None, odd: _Odd | None = None) -> list[Finding]:
    """`drifted`: {group: seq} from which a group's calls pair the wrong ones (a drift):
    their arrival times say nothing about stragglers.

    Calls whose members are their group's ranks are counted from the columns
    (`_arrivals`); the few others one by one, as MatchedCall.arrivals says."""
    drifted = drifted or {}
    odd = odd or _Odd(g)
    warmup = _warmup_step(g)
    last, expected, var, lost, victims, worst = _arrivals(g, warmup, drifted)
    t = g.table
    seen = {c.key: int(t.first_seen[i]) for i, c in zip(odd.ids, odd.calls)}
    also_waited: dict[int, set] = {}
    for call in odd.irregular:
        ms = call.members
        n = len(ms)
        if n < 2 or call.missing or ms[0].step == warmup or call.seq >= drifted.get(call.group, 1 << 62):
            continue
        got = call.arrivals()
        if got is None:
            continue
        lm, waits = got
        skew = max(waits.values())
        if skew < STRAGGLER_MIN_SKEW_NS:
            continue
        p = 1.0 / n
        for m in ms:
            expected[m.rank] = expected.get(m.rank, 0.0) + p
            var[m.rank] = var.get(m.rank, 0.0) + p * (1 - p)
        last[lm.rank] = last.get(lm.rank, 0) + 1
        waited = 0
        for rank, w in waits.items():
            if rank != lm.rank and w > 0:
                waited += w
                also_waited.setdefault(lm.rank, set()).add(rank)
        lost[lm.rank] = lost.get(lm.rank, 0) + waited
        mine = (skew, -seen[call.key], call)
        if lm.rank not in worst or mine[:2] > worst[lm.rank][:2]:
            worst[lm.rank] = mine
    span = _recorded_time(g)
    warm = _warmup_step(g)
    steps = max(1, sum(1 for st in g.steps.values() if st.iteration_ns and st.step != warm))
    total_lost = sum(lost.values()) or 1
    out = []
    for rank, k in last.items():
        e = expected.get(rank, 0.0)
        sd = math.sqrt(var.get(rank, 0.0)) or 1.0
        z = (k - e) / sd
        n = len(g.groups.get(0, ())) or len(g.ranks)
        share = lost[rank] / total_lost
        often = z >= STRAGGLER_MIN_Z and k >= STRAGGLER_MIN_RATIO * e
        # in small groups "last" is often by chance alone: then the lost time must be its doing
        dominant = share >= max(0.5, min(0.8, 3 / max(n, 1)))
        if k < STRAGGLER_MIN_COUNT or not (often or dominant):
            continue
        others = victims(rank) | also_waited.get(rank, set())
        per_rank = lost[rank] / max(1, len(others))
        fraction = per_rank / span if span else 0.0
        if fraction < STRAGGLER_MIN_FRACTION or per_rank < STRAGGLER_MIN_LOST_PER_STEP_NS * steps:
            continue
        longest, _, call = worst[rank]
        if type(call) is int:
            call = t.call(call)
        msg = (f"Rank {rank} arrived last at {k} collectives where chance gives {e:.1f}; "
               f"{_ranks_text(others)} lost {_ms(lost[rank])} waiting for it in all "
               f"({_ms(int(per_rank))} each, {fraction:.1%} of the recorded time). "
               f"The longest wait was {_ms(longest)} in {_call_text(call.op, call.group, call.seq)}.")
        out.append(Finding(
            kind="straggler", ranks=(rank,), group=call.group, seq=call.seq, message=msg,
            stack=next((m.stack for m in call.members if m.rank == rank and m.stack), None),
            details={"last": k, "expected": round(e, 2), "z": round(z, 2), "share_of_waiting": round(share, 3),
                     "lost_ns": lost[rank], "lost_per_rank_ns": int(per_rank), "fraction": round(fraction, 4),
                     "waiting_ranks": sorted(others)}))
    return out


def _arrivals(g: ExecutionGraph, warmup: int | None, drifted: dict[int, int]):
    """MatchedCall.arrivals over every call whose members are its group's ranks, all
    completed: per rank, how often it arrived last, by chance (expected, variance), the
    time others lost waiting for it, the waiting ranks (a function) and its longest wait
    as (skew, -first seen, call index)."""
    t = g.table
    call_of = t.call_of
    use = t.regular & ~t.any_open & (t.count >= 2)
    if warmup is not None:
        use &= t.step[t.starts] != warmup  # the step of the call's lowest rank, as members sort
    for group, seq in drifted.items():
        use &= ~((t.call_group == group) & (t.call_seq >= seq))
    rows = use[call_of]
    enter, end = t.start, t.end
    dur = end - enter
    last_enter = t.last_enter[call_of]
    # on clocks that agree: from entry times; else from durations (the member that waited least came last)
    by_entry = ~_reduce_any(rows & (end < last_enter), t.starts)
    asyncs = _reduce_any(rows & t.async_op, t.starts)
    use &= by_entry | ~asyncs
    rows = use[call_of]
    by_entry_row = by_entry[call_of]
    min_dur = _reduce_min(np.where(rows, dur, _BIG), t.starts)[call_of]
    wait = np.where(by_entry_row, np.minimum(last_enter - enter, dur), dur - min_dur)
    index = np.arange(len(enter))
    is_last = np.where(by_entry_row, enter == last_enter, dur == min_dur)
    last_row = _reduce_min(np.where(rows & is_last, index, _BIG), t.starts)  # the lowest rank among ties
    skew = _reduce_max(np.where(rows, wait, -1), t.starts)
    use &= skew >= STRAGGLER_MIN_SKEW_NS
    rows = use[call_of]
    calls = np.flatnonzero(use)
    lm = t.rank[last_row[calls]] if len(calls) else np.zeros(0, np.int64)
    lm_row = np.zeros(len(t.starts), np.int64)
    lm_row[calls] = lm
    p = 1.0 / t.count
    r = t.rank[rows]
    expected = _sums(r, p[call_of][rows])
    var = _sums(r, (p * (1 - p))[call_of][rows])
    last = _sums(lm, np.ones(len(lm), np.int64))
    waiting = rows & (t.rank != lm_row[call_of]) & (wait > 0)
    lost = _sums(lm_row[call_of][waiting], wait[waiting])
    lost = {k: lost.get(k, 0) for k in last}
    worst: dict[int, tuple] = {}
    if len(calls):
        order = np.lexsort((t.first_seen[calls], -skew[calls], lm))
        head = np.ones(len(order), bool)
        head[1:] = lm[order][1:] != lm[order][:-1]
        for c in calls[order[head]].tolist():
            worst[int(lm_row[c])] = (int(skew[c]), -int(t.first_seen[c]), c)

    def victims(rank: int) -> set[int]:
        mine = waiting & (lm_row[call_of] == rank)
        return set(np.unique(t.rank[mine]).tolist())

    return last, expected, var, lost, victims, worst


_BIG = np.iinfo(np.int64).max


def _reduce_any(flags, starts):
    return np.logical_or.reduceat(flags, starts) if len(flags) else np.zeros(len(starts), bool)


def _reduce_min(values, starts):
    return np.minimum.reduceat(values, starts) if len(values) else np.zeros(len(starts), np.int64)


def _reduce_max(values, starts):
    return np.maximum.reduceat(values, starts) if len(values) else np.zeros(len(starts), np.int64)


def _sums(keys: np.ndarray, values: np.ndarray) -> dict:
    """{key: sum of its values}, keys in order of first appearance."""
    if not len(keys):
        return {}
    uniq, first, inv = np.unique(keys, return_index=True, return_inverse=True)
    sums = np.zeros(len(uniq), values.dtype)
    np.add.at(sums, inv.reshape(-1), values)
    order = np.argsort(first, kind="stable")
    return dict(zip(uniq[order].tolist(), sums[order].tolist()))


def _warmup_step(g: ExecutionGraph) -> int | None:
    """The first recorded step, when there are enough others: it holds start-up skew
    (imports, lazy initialisation) that says nothing about stragglers."""
    timed = sorted(s for s, st in g.steps.items() if st.iteration_ns)
    return timed[0] if len(timed) >= 3 else None


def _recorded_time(g: ExecutionGraph) -> int:
    """A typical rank's recorded step time, warm-up aside (its time span where no steps
    were recorded)."""
    per_rank: dict[int, int] = {}
    warmup = _warmup_step(g)
    for st in g.steps.values():
        if st.step == warmup:
            continue
        for r, ns in st.iteration_ns.items():
            per_rank[r] = per_rank.get(r, 0) + ns
    spans = sorted(per_rank.values()) or sorted(
        t.last_ns - t.first_ns for t in g.traces.values() if t.first_ns is not None and t.last_ns is not None)
    return spans[len(spans) // 2] if spans else 0


# --- what the bundle cannot show ----------------------------------------------------


def _call_failures(g: ExecutionGraph, failures: _Failures) -> list[Finding]:
    """Each rank's first failed call is a finding of its own, with the error text; where
    another finding (a hang, a mismatch, a crash) took it as its consequence, it says so."""
    out = []
    for rank, trace in g.traces.items():
        failed = trace.failed
        if failed:
            group, seq, mk = failed[0]
            explained = (rank, group, seq) in failures.explained
            more = f" ({len(failed) - 1} more failures after it)" if len(failed) > 1 else ""
            where = f"group {group}, seq {seq}" if group is not None else f"seq {seq}"
            why = "; a consequence of the finding above on the same call" if explained else ""
            out.append(Finding(kind="call_failed", ranks=(rank,), group=group, seq=seq,
                               message=(f"A call ({where}) failed on rank {rank} in step {mk.step}: "
                                        f"{_short(mk.text or '')}{more}{why}."),
                               details={"count": len(failed), "text": mk.text, "step": mk.step,
                                        "consequence": explained}))
    return out


def _gaps(g: ExecutionGraph) -> list[Finding]:
    out = []
    for rank, trace in g.traces.items():
        failed = [mk for mk in trace.markers if mk.name in ("recorder_failed", "recording_off")]
        if failed:
            mk = failed[0]
            out.append(Finding(kind="recorder_failed", ranks=(rank,),
                               message=(f"The recorder turned itself off on rank {rank} in step {mk.step}"
                                        f"{': ' + mk.text if mk.text else ''}; later events of this rank are missing."),
                               details={"step": mk.step, "text": mk.text}))
    dropped = {r: t.dropped for r, t in g.traces.items() if t.dropped}
    if dropped:
        total = sum(dropped.values())
        out.append(Finding(kind="dropped", ranks=tuple(sorted(dropped)),
                           message=(f"The recorder dropped {total} records on {_ranks_text(dropped)} because its queue "
                                    "was full; calls in those gaps cannot be matched or timed."),
                           details={"dropped": {str(r): n for r, n in sorted(dropped.items())}}))
    truncated = sorted(r for r, t in g.traces.items() if t.truncated)
    if truncated:
        out.append(Finding(kind="truncated", ranks=tuple(truncated),
                           message=(f"The spools of {_ranks_text(truncated)} end in a torn frame (the process died "
                                    "while writing?); the events after the last whole frame are lost."),
                           details={}))
    return out
