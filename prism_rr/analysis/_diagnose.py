"""Find and explain what went wrong in a recorded run: hangs, mismatches, stragglers, gaps."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prism_rr.format import ops
from prism_rr.format.facts import attempt_endings, exit_noted, interrupted_facts
from prism_rr.format.reader import Bundle
from prism_rr.text import shown
from prism_rr.specs import format_ranks
from prism_rr.format.records import Collective, Compute, GroupInfo, Marker, Memory, PointToPoint, Step
from prism_rr.analysis._build import ExecutionGraph, build_graph, small_pages
from prism_rr.analysis._model import MatchedCall, Member, P2PMatch

__all__ = ["KINDS", "WINDOW_EVENTS", "Finding", "diagnose", "diagnosis_json", "finding_lines", "step_windows"]

# Finding kinds, in the order they are reported.
KINDS = (
    "attempt", "interrupted", "crashed", "killed", "hang", "incomplete", "drift", "mismatch", "unmatched_p2p",
    "straggler", "call_failed", "recorder_failed", "dropped", "truncated",
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
    """One problem: what kind, which ranks, which call, and a sentence for people.

    The sentence quotes the bundle (op names, error texts, crash reports): each value is
    cut where it is quoted, and the sentence as a whole is made safe for a terminal here,
    so that no screen showing it, nor a `--json` reader printing it, meets a stranger's
    escape sequence. `stack` and `details` keep the bundle's values whole (escaped as read)."""

    kind: str
    ranks: tuple[int, ...]
    message: str
    group: int | None = None
    seq: int | None = None
    stack: tuple[str, ...] | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "message", shown(self.message, None))

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "ranks": list(self.ranks), "group": self.group, "seq": self.seq,
            "message": self.message, "stack": list(self.stack) if self.stack else None,
            "details": self.details,
        }


def finding_lines(number: int, finding: Finding, cost_ns: int | None = None) -> list[str]:
    """One finding as `prism-rr diagnose` prints it, safe for a terminal: what, where, the
    sentence, a straggler's cost (`cost_ns`, if known) and the stack."""
    f = finding
    where = f"group {f.group} seq {f.seq}" if f.group is not None else ""
    lines = [f"{number}. [{f.kind}] ranks {format_ranks(list(f.ranks))} {where}".rstrip(), f"   {f.message}"]
    if cost_ns is not None:
        lines.append(f"   cost: the steps would have ended {cost_ns / 1e6:,.1f} ms sooner had "
                     f"{'it' if len(f.ranks) == 1 else 'they'} been on time")
    if f.stack:
        lines.append(f"   at {' <- '.join(shown(frame) for frame in f.stack)}")
    return lines


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


# A bundle of more events than this is diagnosed in windows of consecutive steps of about
# this many events each, one window's graph held at a time, so memory follows the window and
# not the bundle (about 2 GiB at this size, both reading processes together; 1024 ranks x
# 20,000 events read whole took 2.6 GiB). A step larger than the window is read whole.
WINDOW_EVENTS = 12_000_000
# Each window is read with this many steps more on either side: a call whose members
# recorded it in neighbouring steps (a rank's step ends at its own optimizer call) is seen
# whole in one window.
_MARGIN = 1


def diagnose(bundle: Bundle, *, graph: ExecutionGraph | None = None, window_events: int | None = None,
             progress=None) -> list[Finding]:
    """Everything notable in `bundle`, most serious first; an empty list on a clean run.

    `graph`: one already built (of the whole bundle). Else the bundle is read whole, or in
    windows of steps where it holds more than `window_events` events (WINDOW_EVENTS);
    then `progress(done, total, (first step, last step), again)` is called after each
    window (`again`: the second reading, where a drift was found: see _Run.read_windows)."""
    with small_pages():
        run = _Run()
        if graph is not None:
            run.add(graph)
        else:
            windows = step_windows(bundle, WINDOW_EVENTS if window_events is None else window_events)
            if len(windows) <= 1:
                run.add(build_graph(bundle, figures=False))
            else:
                run.read_windows(bundle, windows, progress)
        return run.findings(bundle)


def step_windows(bundle: Bundle, events: int) -> list[tuple[int, int]]:
    """Consecutive step ranges (a, b), both ends included, of about `events` events each,
    from the chunk index (each chunk's records taken as spread evenly over its steps): one
    range where the bundle holds no more; none where it holds no records."""
    spans: list[tuple[int, int, int]] = []
    for rank in bundle.recorded_ranks:  # (a stranger's index may name its steps backwards)
        spans.extend((min(r.step_first, r.step_last), max(r.step_first, r.step_last), r.count)
                     for r in bundle.chunks(rank) if r.count)
    if not spans:
        return []
    lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
    if sum(s[2] for s in spans) <= events or lo == hi:
        return [(lo, hi)]
    # the steps where some chunk's density of records per step changes
    cuts = sorted({s[0] for s in spans} | {s[1] + 1 for s in spans})
    at = {c: i for i, c in enumerate(cuts)}
    density = np.zeros(len(cuts))
    for first, last, n in spans:
        d = n / (last - first + 1)
        density[at[first]] += d
        density[at[last + 1]] -= d
    density = np.cumsum(density).tolist()
    out: list[tuple[int, int]] = []
    start, held = lo, 0.0
    for i in range(len(cuts) - 1):
        s, end, d = cuts[i], cuts[i + 1], max(density[i], 0.0)  # steps s..end-1, d events each
        while s < end:
            room = int((events - held) // d) if d > 0 else end - s
            if room >= end - s:
                held += d * (end - s)
                break
            s += max(room, 1 if held == 0 else 0)  # a step larger than the window goes alone
            if s > start:
                out.append((start, s - 1))
            start, held = s, 0.0
    if start <= hi:
        out.append((start, hi))
    return out


_ON_CALLS = ("hang", "incomplete", "drift", "mismatch", "unmatched_p2p")


class _Run:
    """What the rules read about the whole run, gathered from one graph, or from the graphs
    of consecutive windows of steps (`add`, in step order): each rank's trace, the calls
    that may be about a problem (as objects, merged across windows), the drifts, and who
    arrived last where (summed as read). Every other call is read from a window's columns
    while it is held, and let go."""

    def __init__(self):
        self.world_size = 0
        self.ranks: list[int] = []
        self.groups: dict[int, tuple[int, ...]] = {}
        self.traces: dict = {}
        self.t0_ns: int | None = None
        self.calls: dict[tuple[int, int], MatchedCall] = {}  # calls that may be about a problem
        self.seen: dict[tuple[int, int], tuple[int, int]] = {}  # ... first read: (window, place)
        self.counted: set[tuple[int, int]] = set()  # ... whose arrivals a window counted
        self.p2p: dict[tuple[int, int, int, int], P2PMatch] = {}
        self.counts = _Counts()
        self.drifts: list[Finding] = []
        self.entered: dict[tuple[int, int], int] = {}  # a drift's call -> its first entry
        self.timed = 0  # steps with a Step record
        self.warmup: int | None = None  # the first of them
        self.step_ns: dict[int, int] = {}  # per rank: its Step records' time, warm-up aside
        self.warmup_ns: dict[int, int] = {}  # ... in the warm-up step
        self.late: _Lateness | None = None  # calls after the warm-up step
        self.late_warmup: _Lateness | None = None  # calls in it
        self.windows = 0
        self._last_keys: tuple[set, set] = (set(), set())  # odd calls and messages of the window before
        self._window_keys: list[set] = []  # each window's odd calls
        # calls and messages the window before owned and read with members in the steps
        # after it: the next window, which reads only those members, must not take them up
        self._handed: tuple[set, set] = (set(), set())

    def add(self, g: ExecutionGraph, core: tuple[int, int] | None = None) -> None:
        """One graph: the whole run (core None), or a window read with its margins, whose
        own steps are `core`."""
        w = self.windows
        self.windows += 1
        if w == 0:
            self.world_size, self.ranks, self.groups = g.world_size, g.ranks, g.groups
            self.late, self.late_warmup = _Lateness(g.world_size), _Lateness(g.world_size)
        if core is None:
            self.traces = g.traces
        else:
            for rank, trace in g.traces.items():
                self._merge_trace(trace)
        if g.traces and any(t.first_ns is not None for t in g.traces.values()):
            t0 = g.t0_ns
            self.t0_ns = t0 if self.t0_ns is None else min(self.t0_ns, t0)
        self._add_steps(g, core)
        t, p = g.table, g.p2p_table
        owned, ids, keys, handed = self._add_calls(t, core, w)
        pkeys, phanded = self._add_messages(p, core)
        self._last_keys = (keys, pkeys)
        self._handed = (handed, phanded)
        self._window_keys.append(keys)
        self.counts.add(t, core)
        if core is None:  # the whole run: its drifts now, from its own table
            self._find_drifts(lambda ranks: t)
        self._count_late(t, owned, ids, w)

    def _add_steps(self, g: ExecutionGraph, core: tuple[int, int] | None) -> None:
        """The graph's own timed steps: the warm-up, and each rank's step time."""
        own = (lambda s: True) if core is None else (lambda s: core[0] <= s <= core[1])
        timed = sorted(s for s, st in g.steps.items() if st.iteration_ns and own(s))
        if timed and self.warmup is None:
            self.warmup = timed[0]
        self.timed += len(timed)
        for s in timed:
            into = self.warmup_ns if s == self.warmup else self.step_ns
            for r, ns in g.steps[s].iteration_ns.items():
                into[r] = into.get(r, 0) + ns

    def _add_calls(self, t, core: tuple[int, int] | None, w: int) -> tuple[np.ndarray, list[int], set, set]:
        """Merge the calls of window `w` that may be about a problem, and those of the
        window before looked up here; (which calls it owns, the rows merged, their keys,
        the keys it hands to the next window).

        A call belongs to the window of its earliest member's step: one whose members
        here are all in a margin is another window's (the members of the steps beyond
        are not read here, and it would look like a hang)."""
        owned = _owned(t, core)
        for key in self._handed[0]:  # seen whole by the window before, which owns them
            i = t.find(*key)
            if i is not None:
                owned[i] = False
        handed = set()
        if core is not None:
            last = _reduce_max(t.step, t.starts)
            for i in np.flatnonzero(owned & (last > core[1])).tolist():
                handed.add((int(t.call_group[i]), int(t.call_seq[i])))
        ids = [i for i in t.interesting() if owned[i]]
        keys = set()
        for i in ids:
            c = t.call(i)
            keys.add(c.key)
            self._merge_call(c, (w, int(t.first_seen[i])))
        for key in self._last_keys[0] - keys:
            i = t.find(*key)
            if i is not None:
                self._merge_call(t.call(i), None)
                ids.append(i)
                keys.add(key)
        return owned, ids, keys, handed

    def _add_messages(self, p, core: tuple[int, int] | None) -> tuple[set, set]:
        """Merge the point-to-point messages of the window that may be about a problem
        (those whose first step is its own), and those of the window before looked up
        here; (their keys, the keys it hands to the next window)."""
        pkeys = set()
        phanded = set()
        if core is not None and len(p):
            sent, got = p.send_row >= 0, p.recv_row >= 0
            s_step, r_step = p.step[np.maximum(p.send_row, 0)], p.step[np.maximum(p.recv_row, 0)]
            first = np.where(sent, np.where(got, np.minimum(s_step, r_step), s_step), r_step)
            last = np.where(sent, np.where(got, np.maximum(s_step, r_step), s_step), r_step)
            for i in np.flatnonzero((first >= core[0]) & (first <= core[1]) & (last > core[1])).tolist():
                phanded.add(p.key(i))
        for i in p.interesting():
            m = p.match(i)
            if core is not None:
                first = min(x.step for x in (m.send, m.recv) if x)
                if not core[0] <= first <= core[1] or m.key in self._handed[1]:
                    continue
            pkeys.add(m.key)
            self._merge_p2p(m)
        for key in self._last_keys[1] - pkeys:
            i = p.find(key)
            if i is not None:
                self._merge_p2p(p.match(i))
        return pkeys, phanded

    def read_windows(self, bundle: Bundle, windows: list[tuple[int, int]], progress=None) -> None:
        """Each window in turn (with its margins); then the drifts, whose calls are read
        again for the ranks concerned; and where there are any, who arrived last counted
        again without the calls after them (pairs of the wrong calls)."""
        lo, hi = windows[0][0], windows[-1][1]
        reads = [((a - _MARGIN if a > lo else a, b + _MARGIN if b < hi else b), (a, b)) for a, b in windows]
        for n, (read, core) in enumerate(reads, 1):
            self.add(build_graph(bundle, steps=read, figures=False), core)
            if progress is not None:
                progress(n, len(reads), core, False)
        every = bundle.recorded_ranks  # the clock offsets of the windows' graphs
        self._find_drifts(lambda ranks: build_graph(bundle, ranks=ranks, figures=False, clock_from=every).table)
        if self.drifts:
            self.late, self.late_warmup = _Lateness(self.world_size), _Lateness(self.world_size)
            self.counted = set()
            for w, (read, core) in enumerate(reads):
                t = build_graph(bundle, steps=read, figures=False).table
                ids = [i for i in (t.find(*k) for k in self._window_keys[w]) if i is not None]
                self._count_late(t, _owned(t, core), ids, w)
                if progress is not None:
                    progress(w + 1, len(reads), core, True)

    def _find_drifts(self, table_of) -> None:
        """The drifts (`_drift`) of ranks whose calls of a group part from its reference
        rank's (`_Counts.parting`), from a table of their calls: `table_of(ranks)`."""
        self.drifts = []
        for group, ref, ranks in self.counts.parting():
            for i in range(0, len(ranks), 32):
                batch = ranks[i:i + 32]
                t = table_of([ref, *batch])
                ref_calls = _calls_of(t, group, ref)
                ref_steps = _by_step(ref_calls)
                for rank in batch:
                    if len(self.drifts) >= _MAX_LISTED:
                        return
                    calls = _calls_of(t, group, rank)
                    f = _drift(group, ref, ref_steps, ref_calls, rank, calls)
                    if f is not None:
                        self.drifts.append(f)
                        self.entered[(group, f.seq)] = min(m.enter_ns for s, m in ref_calls + calls if s == f.seq)

    def _count_late(self, t, owned: np.ndarray, ids: list[int], w: int) -> None:
        """Who arrived last at the calls of window `w` that count (`_late_columns`) and
        belong to it (`owned`); `ids`: its calls that may be about a problem."""
        drifted: dict[int, int] = {}
        for f in self.drifts:
            drifted[f.group] = min(f.seq, drifted.get(f.group, f.seq))
        use, last_row, skew, wait = _late_columns(t, drifted)
        use &= owned
        # the warm-up's calls: by their lowest rank's step, as members sort
        in_warmup = use & (t.step[t.starts] == self.warmup) if self.warmup is not None else np.zeros(len(use), bool)
        self.late.add_columns(t, use & ~in_warmup, last_row, skew, wait, w)
        self.late_warmup.add_columns(t, in_warmup, last_row, skew, wait, w)
        for i in ids:
            if use[i]:
                self.counted.add((int(t.call_group[i]), int(t.call_seq[i])))

    def _merge_call(self, c: MatchedCall, seen) -> None:
        have = self.calls.get(c.key)
        if have is None:
            self.calls[c.key] = c
            self.seen[c.key] = seen if seen is not None else (self.windows, 0)
            return
        known = {(m.rank, m.enter_ns) for m in have.members}
        new = [m for m in c.members if (m.rank, m.enter_ns) not in known]
        if new:  # members sort by rank, as in a window's table
            have.members = sorted(have.members + new, key=lambda m: m.rank)

    def _merge_p2p(self, m: P2PMatch) -> None:
        have = self.p2p.get(m.key)
        if have is None:
            self.p2p[m.key] = m
        else:
            have.send = have.send or m.send
            have.recv = have.recv or m.recv

    def _merge_trace(self, t) -> None:
        have = self.traces.get(t.rank)
        t.source = (t.source[0], None) if t.source else None  # its last record: of the whole bundle
        if have is None:
            self.traces[t.rank] = t
            return
        have.events += t.events  # margins count twice: only whether there are any is read
        if t.first_ns is not None:
            have.first_ns = t.first_ns if have.first_ns is None else min(have.first_ns, t.first_ns)
            have.last_ns = t.last_ns if have.last_ns is None else max(have.last_ns, t.last_ns)
        if t.last_call is not None and (have.last_call is None or t.last_call.enter_ns >= have.last_call.enter_ns):
            have.last_call, have.last_call_group_seq = t.last_call, t.last_call_group_seq
        known = {(k, g, s, m.enter_ns) for k, g, s, m in have.open_calls}
        have.open_calls += [c for c in t.open_calls if (c[0], c[1], c[2], c[3].enter_ns) not in known]
        marks = {(m.name, m.start_ns, m.value) for m in have.markers}
        have.markers += [m for m in t.markers if (m.name, m.start_ns, m.value) not in marks][: 1000 - len(have.markers)]
        fails = {(g, s, m.start_ns) for g, s, m in have.failed}
        have.failed += [f for f in t.failed if (f[0], f[1], f[2].start_ns) not in fails][: 1000 - len(have.failed)]
        if t.off_ns is not None:
            have.off_ns = t.off_ns if have.off_ns is None else min(have.off_ns, t.off_ns)
        have.ended = have.ended or t.ended

    # --- after the last window ------------------------------------------------------

    def first_entry(self, f: Finding) -> int | None:
        """When the call a finding is about was first entered, if known."""
        if "src" in f.details:
            pm = self.p2p.get((f.group, f.details.get("src"), f.details.get("dst"), f.seq))
            m = pm and (pm.send or pm.recv)
            return m.enter_ns if m else None
        call = self.calls.get((f.group, f.seq))
        if call is not None and call.members:
            return call.first_arrival.enter_ns
        return self.entered.get((f.group, f.seq))

    def findings(self, bundle: Bundle | None = None) -> list[Finding]:
        if self.t0_ns is None:
            self.t0_ns = 0
        failures = _Failures(self)
        order = sorted(self.calls, key=self.seen.__getitem__)
        calls = [self.calls[k] for k in order]
        disagreeing = sorted((c for c in calls if len(c.members) >= 2 and len({m.sig for m in c.members}) > 1),
                             key=lambda c: c.key)
        p2p = list(self.p2p.values())
        out: list[Finding] = _interrupted(self, bundle)
        out += _crashes(self)
        out += _hangs(self, failures, calls, p2p, _silent(self, bundle))
        drifts = self.drifts
        out += drifts
        out += _fold_into_drifts(_mismatches(self, failures, disagreeing, p2p), drifts)
        out += _unmatched_p2p(self, p2p)
        out += self._stragglers(calls, order, {d.group: d.seq for d in drifts})
        out += _call_failures(self, failures)
        out += _gaps(self)
        out.sort(key=lambda f: _order(self, f))
        return out

    def _stragglers(self, calls, keys, drifted) -> list[Finding]:
        """The calls whose arrivals no window counted (members missing from a window's
        table, or not their group's ranks) are counted here, one by one."""
        warmup = self.warmup if self.timed >= 3 else None
        late = self.late
        if warmup is None:
            late.merge(self.late_warmup)
        for key, call in zip(keys, calls):
            if key not in self.counted:
                late.add_call(call, self.seen[key], warmup, drifted)
        per_rank = dict(self.step_ns)
        if warmup is None:
            for r, ns in self.warmup_ns.items():
                per_rank[r] = per_rank.get(r, 0) + ns
        spans = sorted(per_rank.values()) or sorted(
            t.last_ns - t.first_ns for t in self.traces.values() if t.first_ns is not None and t.last_ns is not None)
        span = spans[len(spans) // 2] if spans else 0
        steps = max(1, self.timed - (warmup is not None))
        return _stragglers(late, span, steps, len(self.groups.get(0, ())) or len(self.ranks))


def _order(run: "_Run", f: Finding) -> tuple:
    """Crashes first, then problems on calls, earliest first (the first is most often
    the cause of the rest), then stragglers, then what the bundle cannot show. An
    interrupt, which may be the cause of anything, leads."""
    if f.kind == "interrupted":
        return (-2, 0, f.ranks)
    if f.kind in ("crashed", "killed"):
        return (-1, f.details.get("last_ns") or 0, f.ranks)
    if f.kind in _ON_CALLS:
        t = run.first_entry(f)
        return (0, t if t is not None else 1 << 62, _ON_CALLS.index(f.kind), f.ranks)
    return (1 + KINDS.index(f.kind) if f.kind in KINDS else 99, f.group or -1, f.seq or -1, f.ranks)


class _Failures:
    """Calls that ended in an error (call_failed markers); a finding that explains one
    takes it, and the rest are reported on their own."""

    def __init__(self, g: "_Run"):
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
    return shown(text, n)


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


def _at(g: "_Run", t: int) -> str:
    return f"+{(t - g.t0_ns) / 1e6:.3f} ms"


def _call_text(op: str, group: int, seq: int) -> str:
    return f"{shown(op)} (group {group}, seq {seq})"


def _describe_record(rec) -> str:
    cls = type(rec)
    if cls is Collective:
        return _call_text(rec.op, rec.group, rec.seq)
    if cls is PointToPoint:
        direction = "from" if ops.receives(rec.op) else "to"
        return f"{shown(rec.op)} {direction} rank {rec.peer} (group {rec.group}, message {rec.seq})"
    if cls is Compute:
        return f"compute{' ' + shown(rec.name) if rec.name else ''}"
    if cls is Step:
        return f"the end of step {rec.step}"
    if cls is Marker:
        return f"marker {shown(rec.name)}" + (f" ({shown(rec.text)})" if rec.text else "")
    if cls is Memory:
        return "a memory sample"
    if cls is GroupInfo:
        return f"creating group {rec.group}"
    return type(rec).__name__


def _doing_last(g: "_Run", rank: int, failures: "_Failures | None" = None) -> tuple[str, dict]:
    """What a rank was doing last, in words and as details."""
    trace = g.traces.get(rank)
    if trace is None or trace.events == 0:
        return f"rank {rank} recorded nothing", {"state": "nothing recorded"}
    if trace.open_calls:
        kind, group, seq, m = min(trace.open_calls, key=lambda c: c[3].enter_ns)
        if kind == "collective":
            what = _call_text(m.op, group, seq)
        else:
            what = f"{shown(m.op)} (group {group}, message {seq})"
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
    within = "" if type(rec) is Step else f" in step {rec.step}"
    text = f"rank {rank}'s last record is {_describe_record(rec)}{within}, ending at {_at(g, end - trace.offset_ns)}"
    ends = [mk for mk in trace.markers if mk.name == "recording_end"]
    details: dict[str, Any] = {"state": "finished", "last": _describe_record(rec), "step": rec.step,
                               "last_ns": end - trace.offset_ns - g.t0_ns}
    if failures is not None and type(rec) is Collective:
        failed = failures.take(rec.group, rec.seq, (rank,))
        if failed:
            text += f", which failed ({_short(failed[rank])})"
            details["failed"] = failed[rank]
    if ends and ends[-1].text:
        text += f"; its recording then ended ({shown(ends[-1].text)}) in step {ends[-1].step}"
        details["ended"] = ends[-1].text
        details["ended_step"] = ends[-1].step
    elif trace.crash is not None:
        text += f"; then the process died ({shown(trace.crash.signal)})"
        details["state"] = "truncated" if trace.truncated else "crashed"
        details["signal"] = trace.crash.signal
    elif trace.truncated:
        text += "; its spool is truncated (was the process killed?)"
        details["state"] = "truncated"
    elif not ends:
        text += "; then nothing: its recording stops without a proper end (was the process killed?)"
        details["state"] = "stopped"
    return text, details


def _abrupt(g: "_Run", rank: int) -> bool:
    """The rank's records end without the recording's proper end: the process died (or
    the spool was packed while it ran), and what it did after its last record is unknown."""
    trace = g.traces.get(rank)
    return trace is not None and trace.events > 0 and (not trace.ended or trace.truncated)


LOSS_NS = 100_000_000  # what a rank that dies may lose of its last records


def _ends_before(g: "_Run", rank: int, t: int) -> bool:
    """The rank's records end before `t` plus what a death may lose: they cannot show
    whether it entered a call at `t`."""
    last = g.traces[rank].last_ns
    return last is None or last < t + LOSS_NS


def _death(trace) -> str:
    if trace.crash is not None:
        return f"process died: {shown(trace.crash.signal)}"
    if trace.truncated:
        return "its spool ends in a torn frame: the process died while writing"
    return "no proper end: the process died or was killed"


def _end_text(g: "_Run", rank: int) -> tuple[str, dict]:
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


def _crashed_in(g: "_Run", rank: int) -> tuple[int, int] | None:
    """(group, seq) of the call a rank was in when its process crashed (its crash file
    names the signal; its records show the call it never left), or None."""
    trace = g.traces.get(rank)
    if trace is None or trace.crash is None or (trace.ended and not trace.truncated) or not trace.open_calls:
        return None
    _, group, seq, _ = max(trace.open_calls, key=lambda c: c[3].enter_ns)
    return group, seq


_LISTED_RANKS = 8  # ranks an interrupt's sentence names; details hold every rank


def _interrupted(g: "_Run", bundle: Bundle | None) -> list[Finding]:
    """A recording that a SIGINT or SIGTERM to `prism-rr record` stopped: which signal,
    when, and where each rank was (its open call or last record, and the program's line
    the signal found it at, from its exit note)."""
    run = bundle.manifest.get("run") if bundle is not None else None
    i = interrupted_facts(run)
    if i is None:
        return []
    ended = attempt_endings(bundle)["ranks"]
    options = run.get("options") if type(run.get("options")) is dict else {}
    every = options.get("ranks") is None and options.get("slice") is None  # else unrecorded ranks were not chosen
    ranks = list(range(g.world_size)) if every else list(g.ranks)
    where: dict[str, dict] = {}
    sentences = []
    for rank in ranks:
        text, d = _doing_last(g, rank)
        if d["state"] == "nothing recorded" and rank not in g.traces:
            text = f"rank {rank} had not finished init_process_group (no records)"
        at = (ended.get(str(rank)) or {}).get("where")
        if at:
            text += f"; the signal found it at {shown(at[0])}"
            d["where"] = at
        where[str(rank)] = d
        sentences.append(text)
    more = f"; and {len(ranks) - _LISTED_RANKS} more ranks" if len(ranks) > _LISTED_RANKS else ""
    when = "" if i["after_s"] is None else f" {i['after_s']:,.1f} s into the run"
    forced = (f" and, as it had not ended a few seconds later, stopped with {shown(i['forced'])}"
              if i["forced"] else "")
    msg = (f"The recording was interrupted: {shown(i['signal'])} to prism-rr record{when}, passed on to the "
           f"command{forced}; the findings below may be its doing. Where each rank was: "
           + "; ".join(sentences[:_LISTED_RANKS]) + more + ".")
    return [Finding(kind="interrupted", ranks=tuple(ranks), message=msg,
                    details={"signal": i["signal"], "after_s": i["after_s"], "forced": i["forced"], "ranks": where})]


def _crashes(g: "_Run") -> list[Finding]:
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
                else f" in {shown(op)}" if op else "")
        at = f" at {shown(where)}" if where else ""
        msg = (f"Rank {rank} crashed ({shown(crash.signal)}){what}{at}; its records end at {_at(g, last)}. "
               f"faulthandler: \"{shown(crash.reason)}\" ({shown(crash.thread)} thread's stack below).")
        out.append(Finding(
            kind="crashed", ranks=(rank,), group=group, seq=seq, message=msg, stack=crash.stack or None,
            details={"signal": crash.signal, "reason": crash.reason, "op": op, "where": where,
                     "thread": crash.thread, "last_ns": last - g.t0_ns, "text": crash.text[:8192]}))
    return out


# --- hangs ----------------------------------------------------------------------------


def _recording_off_before(g: "_Run", rank: int, t: int) -> bool:
    off = g.traces[rank].off_ns if rank in g.traces else None
    return off is not None and off <= t


def _hangs(g: "_Run", failures: _Failures, calls: list[MatchedCall], p2p: list[P2PMatch],
           silent: frozenset[int] = frozenset()) -> list[Finding]:
    """A finding for each run of calls of one group that the same ranks never entered
    (a hang) or never completed, then for each message stuck."""
    out: list[Finding] = []
    for (kind, group, ranks), run in _hang_runs(g, calls).items():
        run.sort(key=lambda c: c.seq)
        call = run[0]
        seqs = [c.seq for c in run]
        if _gone(g, kind, call, ranks, silent):
            out.append(_killed(g, failures, kind, call, ranks, seqs))
            continue
        stack = next((m.stack for m in call.members if m.stack), None)
        details: dict[str, Any] = {
            "op": call.op, "entered": list(call.entered), "never_completed": list(call.incomplete),
            "seqs": seqs[:_MAX_LISTED], "calls": len(seqs),
        }
        if kind == "hang":
            msg = _hang_message(g, failures, call, ranks, seqs, details)
        else:
            more = f" ({len(seqs) - 1} later calls too)" if len(seqs) > 1 else ""
            msg = (f"{_call_text(call.op, group, call.seq)} was entered by every member but never "
                   f"completed on {_ranks_text(ranks)}{more}.")
        out.append(Finding(kind=kind, ranks=tuple(ranks), group=group, seq=call.seq, message=msg,
                           stack=stack, details=details))
    return out + _stuck_p2p(p2p)


def _hang_runs(g: "_Run", calls: list[MatchedCall]) -> dict[tuple, list[MatchedCall]]:
    """{(kind, group, ranks): calls} of the calls some members never entered ("hang",
    the ranks missing, less those whose recording was off) or never completed
    ("incomplete", unless they all died in it: the crash says so)."""
    runs: dict[tuple, list[MatchedCall]] = {}
    for call in calls:
        if not call.members:
            continue
        first = call.first_arrival.enter_ns
        missing = tuple(r for r in call.missing if not _recording_off_before(g, r, first))
        if missing:
            runs.setdefault(("hang", call.group, missing), []).append(call)
        elif call.incomplete and not call.missing:
            if all(_crashed_in(g, r) == (call.group, call.seq) for r in call.incomplete):
                continue  # they died in it: the crash says so (and a mismatch, if there was one, why)
            runs.setdefault(("incomplete", call.group, call.incomplete), []).append(call)
    return runs


def _hang_message(g: "_Run", failures: _Failures, call: MatchedCall, ranks: tuple[int, ...], seqs: list[int],
                  details: dict[str, Any]) -> str:
    """What a hang's finding says: who entered the call and who never did, what each rank
    missing last did (or where its records end, if it died before it could show the
    call); `details` gets the same."""
    group, entered = call.group, call.entered
    waiting = [m for m in call.members if m.end_ns is None]
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
    if not unknown:
        return (f"{_call_text(call.op, group, call.seq)} was entered by {_ranks_text(entered)} "
                f"but never by {_ranks_text(ranks)}{stuck}{more}. "
                + ". ".join(s[0].upper() + s[1:] for s in sentences) + ".")
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
    return (f"{_call_text(call.op, group, call.seq)} was entered by {_ranks_text(entered)}{never}"
            f"{stuck}{more}. " + ". ".join(s[0].upper() + s[1:] for s in sentences) + ".")


def _stuck_p2p(p2p: list[P2PMatch]) -> list[Finding]:
    """Point-to-point calls left open whose partner is there: a receive never matched is
    reported as unmatched; a matched pair that never completed is incomplete."""
    out: list[Finding] = []
    for pm in p2p:
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


def _silent(g: "_Run", bundle: Bundle | None) -> frozenset[int]:
    """The ranks whose processes ended without a word: their records end abruptly, with no
    crash file and no exit note, where other ranks' recorders left theirs (so the silence
    is the process's: SIGKILL, the OOM killer, os._exit; not a spool packed while it ran)."""
    if bundle is None:
        return frozenset()
    noted = exit_noted(bundle)
    if not noted:
        return frozenset()
    return frozenset(r for r, t in g.traces.items()
                     if r not in noted and t.crash is None and _abrupt(g, r))


def _gone(g: "_Run", kind: str, call: MatchedCall, ranks, silent: frozenset[int]) -> bool:
    """Whether the ranks a call waits for were gone (`silent`: their processes ended without
    a word) before the call's first member entered it (a hang), or inside it (a call every
    member entered)."""
    first = call.first_arrival.enter_ns
    for r in ranks:
        trace = g.traces.get(r)
        if trace is None or r not in silent:
            return False
        inside = any((grp, seq) == (call.group, call.seq) for _, grp, seq, _m in trace.open_calls)
        if not (inside if kind == "incomplete" else _ends_before(g, r, first)):
            return False
    return True


def _step_at_end(trace) -> int | None:
    """The step a rank was in when its records end, as `info` numbers it (its last record's)."""
    rec = trace.last_record
    steps = [mk.step for mk in trace.markers] + ([rec.step] if rec is not None else [])
    return max(steps) if steps else None


def _killed(g: "_Run", failures: _Failures, kind: str, call: MatchedCall, ranks, seqs: list[int]) -> Finding:
    """A call that waits for ranks whose processes were gone (killed: SIGKILL, the OOM
    killer, os._exit): named as that, not as a hang."""
    what = _call_text(call.op, call.group, call.seq)
    sentences, where = [], {}
    for r in ranks:
        trace = g.traces[r]
        step = _step_at_end(trace)
        last = trace.last_ns if trace.last_ns is not None else g.t0_ns
        inside = f" inside {what}" if kind == "incomplete" else ""
        rec = trace.last_record if kind != "incomplete" else None
        record = "" if rec is None else f", its last record {_describe_record(rec)}"
        sentences.append(f"Rank {r} was killed{inside} in step {step} (its process ended without a word: SIGKILL, "
                         f"the OOM killer, or os._exit); its records end at {_at(g, last)}{record}")
        where[str(r)] = {"step": step, "last_ns": last - g.t0_ns, "in_call": kind == "incomplete"}
    waiting = [m.rank for m in call.members if m.rank not in ranks]
    failed = failures.take(call.group, call.seq)
    them = "it" if len(ranks) == 1 else "them"
    never = "" if kind == "incomplete" else f", which {them} never entered"
    then = (f"{_ranks_text(waiting)} waited for {them} in {what}{never}" if waiting
            else f"no other rank entered {what}")
    if failed:
        then += f"; the wait ended in an error on {_ranks_text(failed)} ({_short(next(iter(failed.values())))})"
    more = f" ({len(seqs) - 1} later calls of this group lack {them} too)" if len(seqs) > 1 else ""
    stack = next((m.stack for m in call.members if m.stack), None)
    details = {"op": call.op, "killed": where, "entered": list(call.entered), "waiting": waiting,
               "seqs": seqs[:_MAX_LISTED], "calls": len(seqs),
               "last_ns": min(w["last_ns"] for w in where.values())}
    if failed:
        details["failed"] = {str(r): t for r, t in sorted(failed.items())}
    msg = ". ".join(sentences) + f". Then {then}{more}."
    return Finding(kind="killed", ranks=tuple(ranks), group=call.group, seq=call.seq, message=msg, stack=stack,
                   details=details)


# --- drift: call sequences that part ---------------------------------------------------


def _where(m: Member) -> str:
    return shown(m.stack[0].split(" in ")[0]) if m.stack else "an unrecorded line"


class _Counts:
    """Per (group, rank): how many calls of the group the rank made, and a hash of the
    steps it made them in (a sum of one hash per call, of its step, so that windows of
    steps add up). A rank whose hash differs from its group's reference rank's (the one
    that made most, then the lowest) made another number of the group's calls in some step."""

    def __init__(self):
        self.group = np.zeros(0, np.int64)
        self.rank = np.zeros(0, np.int64)
        self.calls = np.zeros(0, np.int64)
        self.digest = np.zeros(0, np.uint64)

    def add(self, t, core: tuple[int, int] | None) -> None:
        """The calls of table `t` in steps `core` (all where None)."""
        if core is None:
            rows = self._add_regular(t)
            if rows is None:
                return
        else:
            rows = np.flatnonzero((t.step >= core[0]) & (t.step <= core[1]))
        g, r = t.group[rows], t.rank[rows]
        if not len(g):
            return
        head = np.ones(len(g), bool)
        head[1:] = g[1:] != g[:-1]  # rows are sorted by group
        gids, gi = g[head], np.cumsum(head) - 1
        nr = int(r.max()) + 1
        order = np.argsort(gi * nr + r, kind="stable") if len(gids) * nr < 1 << 62 else np.lexsort((r, gi))
        pair = (gi * nr + r)[order]
        first = np.ones(len(pair), bool)
        first[1:] = pair[1:] != pair[:-1]
        at = np.flatnonzero(first)
        calls = np.diff(np.append(at, len(pair)))
        self._merge(gids[pair[at] // nr], pair[at] % nr, calls, np.add.reduceat(_hash(t.step[rows][order]), at))

    def _add_regular(self, t) -> np.ndarray | None:
        """The groups all of whose calls are regular (members: the group's ranks, in order):
        their rows are a (call, member) matrix, summed down each member's column. The
        rows of the other groups (None if there are none) are left to sorting."""
        if not len(t):
            return None
        head = np.ones(len(t), bool)
        head[1:] = t.call_group[1:] != t.call_group[:-1]  # calls are sorted by group
        first = np.flatnonzero(head)
        last = np.append(first[1:], len(t))
        irregular = np.add.reduceat((~t.regular).astype(np.int64), first)
        row_end = np.append(t.starts[1:], len(t.rank))
        hashes = _hash(t.step)
        groups, ranks, calls, digests, rest = [], [], [], [], []
        for a, b, bad in zip(first.tolist(), last.tolist(), irregular.tolist()):
            lo, hi = int(t.starts[a]), int(row_end[b - 1])
            if bad:
                rest.append(np.arange(lo, hi))
                continue
            m = int(t.count[a])
            groups.append(np.full(m, t.call_group[a], np.int64))
            ranks.append(t.rank[lo:lo + m])
            calls.append(np.full(m, b - a, np.int64))
            digests.append(hashes[lo:hi].reshape(b - a, m).sum(axis=0, dtype=np.uint64))
        if groups:
            self._merge(np.concatenate(groups), np.concatenate(ranks), np.concatenate(calls),
                        np.concatenate(digests))
        return np.concatenate(rest) if rest else None

    def _merge(self, group, rank, calls, digest) -> None:
        group, rank = np.append(self.group, group), np.append(self.rank, rank)
        calls, digest = np.append(self.calls, calls), np.append(self.digest, digest)
        order = np.lexsort((rank, group))
        group, rank, calls, digest = group[order], rank[order], calls[order], digest[order]
        new = np.ones(len(group), bool)
        new[1:] = (group[1:] != group[:-1]) | (rank[1:] != rank[:-1])
        at = np.flatnonzero(new)
        self.group, self.rank = group[at], rank[at]
        self.calls, self.digest = np.add.reduceat(calls, at), np.add.reduceat(digest, at)

    def parting(self) -> list[tuple[int, int, list[int]]]:
        """(group, reference rank, the ranks whose counts part from its), by group."""
        out: list[tuple[int, int, list[int]]] = []
        if not len(self.group):
            return out
        head = np.ones(len(self.group), bool)
        head[1:] = self.group[1:] != self.group[:-1]
        starts = np.flatnonzero(head)
        ends = np.append(starts[1:], len(self.group))
        for a, b in zip(starts.tolist(), ends.tolist()):
            if b - a < 2:
                continue
            calls = self.calls[a:b]
            ref = a + int(np.flatnonzero(calls == calls.max())[0])  # ranks are in order: the lowest
            part = a + np.flatnonzero(self.digest[a:b] != self.digest[ref])
            if len(part):
                out.append((int(self.group[a]), int(self.rank[ref]), self.rank[part].tolist()))
        return out


def _hash(step: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each step (splitmix64's finaliser)."""
    with np.errstate(over="ignore"):
        z = step.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(0xD1B54A32D192ED03)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _owned(t, core: tuple[int, int] | None) -> np.ndarray:
    """The calls of table `t` that belong to the window of steps `core`: those whose
    earliest member's step is in it (every call where core is None)."""
    if core is None:
        return np.ones(len(t), bool)
    first = _reduce_min(t.step, t.starts)
    return (first >= core[0]) & (first <= core[1])


def _calls_of(t, group: int, rank: int) -> list[tuple[int, Member]]:
    """(seq, member) of one rank's calls in one group, by seq."""
    lo = int(np.searchsorted(t.group, group, "left"))
    hi = int(np.searchsorted(t.group, group, "right"))
    rows = lo + np.flatnonzero(t.rank[lo:hi] == rank)
    return [(int(t.seq[r]), t.member(r)) for r in rows.tolist()]


def _call_key(m: Member | None) -> tuple:
    return (m.op, m.sig, m.stack[0] if m.stack else None) if m is not None else ()


def _by_step(calls) -> dict[int, list[tuple[int, Member]]]:
    steps: dict[int, list] = {}
    for seq, m in calls:
        steps.setdefault(m.step, []).append((seq, m))
    return steps


def _drift(group, ref, ref_steps, ref_calls, rank, calls) -> Finding | None:
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
        mine = dict(calls)
        if len(calls) == len(ref_calls) and all(_call_key(m) == _call_key(mine.get(s)) for s, m in ref_calls):
            return None  # the same calls, some counted in a neighbouring step: they pair as they should
        counts: dict[str, tuple[int, int]] = {}
        for op in dict.fromkeys(ops_a + ops_b):
            counts[op] = (ops_a.count(op), ops_b.count(op))
        op = next(op for op, (x, y) in counts.items() if x != y)
        x, y = counts[op]
        if y < x:
            made = f"rank {rank} made {y} of the {x} {shown(op)} calls (group {group}) that rank {ref} made"
        else:
            made = f"rank {rank} made {y} {shown(op)} calls (group {group}) where rank {ref} made {x}"
        msg = (f"In step {step}, {made}; from there on its calls pair with the wrong ones: "
               f"rank {ref}'s {shown(late_ref.op)} at {_where(late_ref)} (step {late_ref.step}) is seq {seq} of "
               f"group {group}, and so is rank {rank}'s {shown(late.op)} at {_where(late)} (step {late.step}).")
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


def _mismatches(g: "_Run", failures: _Failures, disagreeing: list[MatchedCall],
                p2p: list[P2PMatch]) -> list[Finding]:
    """A finding for each call whose members disagree on what they pass (the same ranks
    of a group out of step again counted as later calls of the first), then for each
    message whose two ends disagree."""
    pending: list[dict] = []
    seen: dict[tuple[int, tuple[int, ...]], dict] = {}  # (group, odd ranks) -> first finding's details
    for call in disagreeing:
        if len(call.members) < 2:
            continue
        first_sig = call.members[0].sig
        if all(m.sig is first_sig or m.sig == first_sig for m in call.members):
            continue
        counts: dict[tuple, list[Member]] = {}
        for m in call.members:
            counts.setdefault(m.sig, []).append(m)
        ref_sig = max(counts, key=lambda s: (len(counts[s]), -min(m.rank for m in counts[s])))
        odd = [m for m in call.members if m.sig != ref_sig]
        odd_ranks = tuple(sorted(m.rank for m in odd))
        prior = seen.get((call.group, odd_ranks))
        if prior is not None:  # the same ranks out of step again: most likely a consequence
            if len(prior["later"]) < _MAX_LISTED:
                prior["later"].append(call.seq)
            prior["later_count"] += 1
            continue
        details, msg = _mismatch(g, failures, call, counts, ref_sig)
        seen[(call.group, odd_ranks)] = details
        pending.append(dict(kind="mismatch", ranks=odd_ranks, group=call.group, seq=call.seq, message=msg,
                            stack=next((m.stack for m in odd if m.stack), None), details=details))
    out: list[Finding] = []
    for kw in pending:
        n = kw["details"]["later_count"]
        if n:
            kw["message"] += (f" {n} later calls of group {kw['group']} disagree the same way "
                              "(the same ranks are likely out of step).")
        out.append(Finding(**kw))
    return out + _p2p_mismatches(p2p)


def _mismatch(g: "_Run", failures: _Failures, call: MatchedCall, counts: dict[tuple, list[Member]],
              ref_sig: tuple) -> tuple[dict[str, Any], str]:
    """(details, message) of a call whose members disagree: what each side passed where
    the most members (`ref_sig`) passed another, every side's shapes and dtypes, and who
    died in it or saw it fail."""
    ref_ranks = [m.rank for m in counts[ref_sig]]
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
            parts.append(f"{_ranks_text(ranks)} called {shown(a)} where {_ranks_text(ref_ranks)} called {shown(b)}")
        else:
            parts.append(f"{_ranks_text(ranks)} {verb} {name} {shown(a)} where {_ranks_text(ref_ranks)} "
                         f"passed {shown(b)}")
    details = {"op": ref_sig[0], "differences": fields, "later": [], "later_count": 0,
               "expected_ranks": sorted(ref_ranks)}
    # every side's shapes and dtypes, whichever field differed first
    sides = sorted(counts.items(), key=lambda kv: min(m.rank for m in kv[1]))
    # (an op this version does not know has no shapes its members must agree on: None)
    details["members"] = {str(m.rank): {"shapes": None if sig[1] is None else [list(x) for x in sig[1]],
                                        "dtypes": list(sig[2])}
                          for sig, ms in sides for m in ms}
    parts[-1] += " (" + "; ".join(f"{_ranks_text([m.rank for m in ms])}: {_fmt_shapes(sig[1])} "
                                   f"{shown(', '.join(sig[2])) or 'no tensors'}" for sig, ms in sides) + ")"
    crashed = {m.rank: g.traces[m.rank].crash for m in call.members
               if _crashed_in(g, m.rank) == (call.group, call.seq)}
    if crashed:
        details["crashed"] = {str(r): {"signal": c.signal, "where": c.where} for r, c in sorted(crashed.items())}
        for r, c in sorted(crashed.items()):
            parts.append(f"rank {r} died in it ({shown(c.signal)}{f' at {shown(c.where)}' if c.where else ''})")
    failed = failures.take(call.group, call.seq)
    if failed:
        details["failed"] = {str(r): t for r, t in sorted(failed.items())}
        parts.append(f"the call then failed on {_ranks_text(failed)} ({_short(next(iter(failed.values())))})")
    msg = f"Members of {_call_text(ref_sig[0], call.group, call.seq)} disagree: " + "; ".join(parts) + "."
    return details, msg


def _p2p_mismatches(p2p: list[P2PMatch]) -> list[Finding]:
    """Sends and receives that pair up but disagree on what is sent."""
    out = []
    for pm in p2p:
        if pm.send is None or pm.recv is None:
            continue
        (_, s_shapes, s_dtypes, _, _), (_, r_shapes, r_dtypes, _, _) = pm.send.sig, pm.recv.sig
        if s_shapes != r_shapes or s_dtypes != r_dtypes:
            out.append(Finding(
                kind="mismatch", ranks=(pm.src, pm.dst), group=pm.group, seq=pm.seq,
                message=(f"Rank {pm.src} sent {_fmt_shapes(s_shapes)} {shown(', '.join(s_dtypes))} to rank {pm.dst} "
                         f"(group {pm.group}, message {pm.seq}), which received into "
                         f"{_fmt_shapes(r_shapes)} {shown(', '.join(r_dtypes))}."),
                stack=pm.send.stack or pm.recv.stack,
                details={"op": pm.send.op, "src": pm.src, "dst": pm.dst}))
    return out


def _unmatched_p2p(g: "_Run", p2p: list[P2PMatch]) -> list[Finding]:
    recorded = set(g.ranks)
    runs: dict[tuple, list] = {}
    for pm in p2p:
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


class _Pairs:
    """Pairs of ranks (a, b): a bit matrix up to 16384 ranks (256 MiB at most, its pages
    touched only where set), sorted codes beyond."""

    def __init__(self, n: int):
        self.n = n
        self.bits: np.ndarray | None = None
        self.codes = np.zeros(0, np.int64)

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        if not len(a):
            return
        if self.n <= 16384:
            if self.bits is None:
                self.bits = np.zeros((self.n, self.n), bool)
            self.bits.reshape(-1)[np.asarray(a, np.int64) * self.n + b] = True
        else:
            self.codes = np.union1d(self.codes, np.asarray(a, np.int64) * self.n + b)

    def of(self, a: int) -> set[int]:
        got = set()
        if self.bits is not None:
            got = set(np.flatnonzero(self.bits[a]).tolist())
        if len(self.codes):
            lo, hi = np.searchsorted(self.codes, [a * self.n, (a + 1) * self.n])
            got.update((self.codes[lo:hi] - a * self.n).tolist())
        return got

    def merge(self, other: "_Pairs") -> None:
        if other.bits is not None:
            self.bits = other.bits.copy() if self.bits is None else self.bits | other.bits
        if len(other.codes):
            self.codes = np.union1d(self.codes, other.codes)


class _Lateness:
    """Per rank, over the calls counted: how often it arrived last (`last`) and how often
    chance gives (`expected`, `var`), the time the others lost waiting for it (`lost`),
    who waited (`waited`), and its longest wait, `worst`: ((skew, -first entry, -window,
    -place read), (op, group, seq, its stack)): of equal waits, the call entered first
    (the same whether the bundle is read whole or in windows)."""

    def __init__(self, world: int):
        self.last: dict[int, int] = {}
        self.expected: dict[int, float] = {}
        self.var: dict[int, float] = {}
        self.lost: dict[int, int] = {}
        self.waited = _Pairs(world)
        self.worst: dict[int, tuple] = {}

    def _better(self, rank: int, key: tuple, what: tuple) -> None:
        have = self.worst.get(rank)
        if have is None or key > have[0]:
            self.worst[rank] = (key, what)

    def add_columns(self, t, use: np.ndarray, last_row, skew, wait, window: int) -> None:
        """The calls of one window's table in `use` (`_late_columns`)."""
        calls = np.flatnonzero(use)
        if not len(calls):
            return
        call_of = t.call_of
        rows = use[call_of]
        lm = t.rank[last_row[calls]]
        lm_row = np.zeros(len(t.starts), np.int64)
        lm_row[calls] = lm
        p = 1.0 / t.count
        r = t.rank[rows]
        _add(self.expected, _sums(r, p[call_of][rows]))
        _add(self.var, _sums(r, (p * (1 - p))[call_of][rows]))
        _add(self.last, _sums(lm, np.ones(len(lm), np.int64)))
        waiting = rows & (t.rank != lm_row[call_of]) & (wait > 0)
        _add(self.lost, _sums(lm_row[call_of][waiting], wait[waiting]))
        self.waited.add(lm_row[call_of][waiting], t.rank[waiting])
        entered = np.minimum.reduceat(t.start, t.starts)[calls]  # the call's first entry
        order = np.lexsort((t.first_seen[calls], entered, -skew[calls], lm))
        head = np.ones(len(order), bool)
        head[1:] = lm[order][1:] != lm[order][:-1]
        v = t.values
        for j in order[head].tolist():
            c = int(calls[j])
            row = int(last_row[c])
            self._better(int(lm_row[c]), (int(skew[c]), -int(entered[j]), -window, -int(t.first_seen[c])),
                         (v[t.op[row]], int(t.call_group[c]), int(t.call_seq[c]), v[t.stack[row]] or None))

    def add_call(self, call: MatchedCall, seen: tuple[int, int], warmup: int | None, drifted: dict[int, int]) -> None:
        """One call as MatchedCall.arrivals says, where it counts."""
        ms = call.members
        n = len(ms)
        if n < 2 or call.missing or ms[0].step == warmup or call.seq >= drifted.get(call.group, 1 << 62):
            return
        got = call.arrivals()
        if got is None:
            return
        lm, waits = got
        skew = max(waits.values())
        if skew < STRAGGLER_MIN_SKEW_NS:
            return
        p = 1.0 / n
        for m in ms:
            self.expected[m.rank] = self.expected.get(m.rank, 0.0) + p
            self.var[m.rank] = self.var.get(m.rank, 0.0) + p * (1 - p)
        self.last[lm.rank] = self.last.get(lm.rank, 0) + 1
        waiting = [rank for rank, w in waits.items() if rank != lm.rank and w > 0]
        self.lost[lm.rank] = self.lost.get(lm.rank, 0) + sum(waits[rank] for rank in waiting)
        self.waited.add(np.full(len(waiting), lm.rank, np.int64), np.array(waiting, np.int64))
        self._better(lm.rank, (skew, -call.first_arrival.enter_ns, -seen[0], -seen[1]),
                     (lm.op, call.group, call.seq, lm.stack or None))

    def merge(self, other: "_Lateness") -> None:
        for mine, theirs in ((self.last, other.last), (self.expected, other.expected), (self.var, other.var),
                             (self.lost, other.lost)):
            _add(mine, theirs)
        self.waited.merge(other.waited)
        for rank, (key, what) in other.worst.items():
            self._better(rank, key, what)


def _add(into: dict, more: dict) -> None:
    for k, v in more.items():
        into[k] = into.get(k, 0) + v


def _stragglers(late: _Lateness, span: int, steps: int, n: int) -> list[Finding]:
    """Ranks that arrived last far more often than chance and cost the others a share of
    their time. `span`: a typical rank's recorded step time, warm-up aside; `steps`: how
    many steps that is; `n`: the default group's size."""
    total_lost = sum(late.lost.values()) or 1
    out = []
    for rank, k in late.last.items():
        e = late.expected.get(rank, 0.0)
        sd = math.sqrt(late.var.get(rank, 0.0)) or 1.0
        z = (k - e) / sd
        lost = late.lost.get(rank, 0)
        share = lost / total_lost
        often = z >= STRAGGLER_MIN_Z and k >= STRAGGLER_MIN_RATIO * e
        # in small groups "last" is often by chance alone: then the lost time must be its doing
        dominant = share >= max(0.5, min(0.8, 3 / max(n, 1)))
        if k < STRAGGLER_MIN_COUNT or not (often or dominant):
            continue
        others = late.waited.of(rank)
        per_rank = lost / max(1, len(others))
        fraction = per_rank / span if span else 0.0
        if fraction < STRAGGLER_MIN_FRACTION or per_rank < STRAGGLER_MIN_LOST_PER_STEP_NS * steps:
            continue
        (longest, *_), (op, group, seq, stack) = late.worst[rank]
        msg = (f"Rank {rank} arrived last at {k} collectives where chance gives {e:.1f}; "
               f"{_ranks_text(others)} lost {_ms(lost)} waiting for it in all "
               f"({_ms(int(per_rank))} each, {fraction:.1%} of the recorded time). "
               f"The longest wait was {_ms(longest)} in {_call_text(op, group, seq)}.")
        out.append(Finding(
            kind="straggler", ranks=(rank,), group=group, seq=seq, message=msg, stack=stack,
            details={"last": k, "expected": round(e, 2), "z": round(z, 2), "share_of_waiting": round(share, 3),
                     "lost_ns": lost, "lost_per_rank_ns": int(per_rank), "fraction": round(fraction, 4),
                     "waiting_ranks": sorted(others)}))
    return out


def _late_columns(t, drifted: dict[int, int]):
    """MatchedCall.arrivals over every call of table `t` whose members are its group's
    ranks, all completed, before any drift of its group: (the calls that count (skew above
    the noise floor), each call's last to arrive (its row), each call's skew, each
    member's wait)."""
    call_of = t.call_of
    use = t.regular & ~t.any_open & (t.count >= 2)
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
    return use, last_row, skew, wait


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


# --- what the bundle cannot show ----------------------------------------------------


def _call_failures(g: "_Run", failures: _Failures) -> list[Finding]:
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


def _gaps(g: "_Run") -> list[Finding]:
    out = []
    for rank, trace in g.traces.items():
        failed = [mk for mk in trace.markers if mk.name in ("recorder_failed", "recording_off")]
        if failed:
            mk = failed[0]
            out.append(Finding(kind="recorder_failed", ranks=(rank,),
                               message=(f"The recorder turned itself off on rank {rank} in step {mk.step}"
                                        f"{': ' + shown(mk.text) if mk.text else ''}; later events of this rank "
                                        "are missing."),
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
