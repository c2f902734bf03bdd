"""What the collectives, diagnosis and compare screens show; imports no UI.

Diagnosis is `prism_rr.analysis.diagnose`, named here for the screens, and run apart in a
child process (`diagnose_apart`): on a big bundle it takes seconds of CPU that would
otherwise stall the screen, and a process can be stopped when the user cancels. A
group's calls are matched here from the analysis's columns (`group_calls`), read a batch
of members at a time, so the screen can say how far it got and stop between batches.
The heat map's lateness reads only the calls' columns, a forked process reading part of
a big bundle's ranks.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from dataclasses import dataclass, field
from statistics import median
from typing import Callable

import numpy as np

from prism_rr.analysis import (
    ColumnReader,
    Finding,
    attribute,
    build_graph,
    call_divergence,
    clock_offsets,
    data_checked,
    diagnose,
    replay_data,
    step_durations,
    straggler_totals,
)
from prism_rr.errors import PrismError
from prism_rr.format import Bundle, Collective, PointToPoint, open_bundle, ops
from prism_rr.text import shown
from prism_rr.specs import named_ranks
from prism_rr.tui.model import FAR, TimelineModel

__all__ = [
    "CallRow",
    "Finding",
    "StepGrid",
    "call_row",
    "compact_ranks",
    "compare_bundles",
    "diagnose",
    "diagnose_apart",
    "group_calls",
    "lateness",
    "run_apart",
    "step_grid",
]

MEMBERS_PER_BATCH = 512  # ranks read per build_graph in group_calls: about half a second each
# lateness: from this many ranks a forked process reads the last LATENESS_SHARE of them, a
# little over half: this one then matches the calls (forking costs ms; 8192 ranks take seconds)
LATENESS_APART_FROM = 512
LATENESS_SHARE = 0.52
DENSE_CALLS = 4  # _dense_index: at most this many slots a row (calls' sequence numbers spread wider are sorted)


@dataclass(slots=True)
class CallRow:
    """One sequence number of a group: who entered, who did not, skew, and what is wrong."""

    group: int
    seq: int
    ops: dict[str, int] = field(default_factory=dict)  # op -> how many members called it
    arrivals: dict[int, int] = field(default_factory=dict)  # rank -> enter time
    ends: dict[int, int] = field(default_factory=dict)  # rank -> end (FAR: never completed)
    sigs: dict[int, int] = field(default_factory=dict)  # rank -> its signature (op, shapes, dtypes, ...), interned
    step: int | None = None  # the lowest step a member recorded it in
    steps: dict[int, int] = field(default_factory=dict)  # rank -> the step it recorded the call in
    failed: dict[int, str] = field(default_factory=dict)  # rank -> the error the call failed with there

    @property
    def step_text(self) -> str:
        """The step, or the range of steps when members disagree (a rank a step ahead)."""
        if not self.steps:
            return "" if self.step is None else str(self.step)
        lo, hi = min(self.steps.values()), max(self.steps.values())
        return str(lo) if lo == hi else f"{lo}-{hi}"

    @property
    def op(self) -> str:
        return max(self.ops, key=self.ops.get) if self.ops else ""

    @property
    def skew(self) -> int:
        return max(self.arrivals.values()) - min(self.arrivals.values()) if self.arrivals else 0

    @property
    def last(self) -> int | None:
        return max(self.arrivals, key=self.arrivals.get) if self.arrivals else None

    @property
    def hung(self) -> list[int]:
        return sorted(r for r, e in self.ends.items() if e == FAR)

    def missing(self, expected) -> list[int]:
        return [r for r in expected if r not in self.arrivals]

    def problems(self, expected) -> list[str]:
        out = []
        if len(self.ops) > 1:
            out.append("op mismatch: " + ", ".join(f"{shown(o, 40)} on {n} rank{'s' if n > 1 else ''}"
                                                   for o, n in sorted(self.ops.items(), key=lambda on: -on[1])))
        elif len(set(self.sigs.values())) > 1:
            out.append("shape/dtype mismatch")
        if self.hung:
            out.append(f"never completed on {named_ranks(self.hung)}")
        if self.failed:
            out.append(f"failed on {named_ranks(self.failed)}")
        if self.missing(expected):
            out.append(f"{named_ranks(self.missing(expected))} did not enter")
        if "-" in self.step_text:
            out.append(f"members in steps {self.step_text}")
        return out


def group_calls(tm: TimelineModel, group: int, *, progress: Callable[[int, int], None] | None = None,
                stop: Callable[[], bool] | None = None) -> tuple[list[CallRow], tuple[int, ...]]:
    """Every call of `group`, matched by sequence number over its recorded members.

    The members are read as the analysis reads them (numpy columns, no record objects,
    about 1 ms a rank), MEMBERS_PER_BATCH at a time: `progress(done, total)` after each
    batch, `stop()` checked before each. The timeline's cached spans are left alone (a
    4096-member group read through them took a minute and evicted the timeline's rows).
    """
    members = tuple(r for r in tm.group_members(group) if r in tm.row_of)
    rows: dict[int, CallRow] = {}
    for lo in range(0, len(members), MEMBERS_PER_BATCH):
        if stop is not None and stop():
            break
        _read_calls(tm, members[lo : lo + MEMBERS_PER_BATCH], group, None, rows)
        if progress is not None:
            progress(min(lo + MEMBERS_PER_BATCH, len(members)), len(members))
    return [rows[s] for s in sorted(rows)], members


def call_row(tm: TimelineModel, group: int, seq: int, ranks) -> CallRow:
    """Call `seq` of `group` on `ranks` (recorded ones; the others are not read), read as
    group_calls reads: about 1 ms a rank against 6 through the timeline's spans, which
    it leaves alone."""
    rows: dict[int, CallRow] = {}
    ranks = [r for r in ranks if r in tm.row_of]
    for lo in range(0, len(ranks), MEMBERS_PER_BATCH):
        _read_calls(tm, ranks[lo : lo + MEMBERS_PER_BATCH], group, seq, rows)
    return rows.get(seq) or CallRow(group=group, seq=seq)


def _read_calls(tm: TimelineModel, ranks, group: int, seq: int | None, rows: dict[int, CallRow]) -> None:
    """Add the calls of `group` (only `seq`, if given) on `ranks` into `rows` (seq -> CallRow)."""
    graph = build_graph(tm.bundle, ranks=list(ranks), processes=1)
    table = graph.table
    mine = table.group == group
    if seq is not None:
        mine &= table.seq == seq
    at = np.flatnonzero(mine)
    values = table.values
    for s, rank, start, end, open_, step, op, sig in zip(
            *(getattr(table, k)[at].tolist() for k in ("seq", "rank", "start", "end", "open", "step", "op", "sig"))):
        row = rows.get(s)
        if row is None:
            row = rows[s] = CallRow(group=group, seq=s, step=step)
        elif row.step is None or step < row.step:
            row.step = step
        row.steps[rank] = step
        name = values[op]
        row.ops[name] = row.ops.get(name, 0) + 1
        row.arrivals[rank] = start
        row.ends[rank] = FAR if open_ else end
        row.sigs[rank] = sig
    for rank in ranks:  # a call that failed: its `call_failed` marker, as the diagnosis reads it
        trace = graph.traces.get(rank)
        for g, s, marker in trace.failed if trace is not None else ():
            row = rows.get(s)
            if g == group and (seq is None or s == seq) and row is not None and rank in row.arrivals:
                row.failed[rank] = shown(marker.text or "failed")


def compact_ranks(ranks, limit: int = 8) -> str:
    """Ranks as a person reads them: 0-7, 0-14/2 (every second), or 3, 5, 9, ... (+N)."""
    rs = sorted(set(ranks))
    if not rs:
        return "none"
    if len(rs) == 1:
        return str(rs[0])
    step = rs[1] - rs[0]
    if len(rs) > 2 and all(b - a == step for a, b in zip(rs, rs[1:])):
        return f"{rs[0]}-{rs[-1]}" + (f"/{step}" if step > 1 else "")
    runs, i = [], 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        runs.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ", ".join(runs[:limit]) + (f", ... (+{len(runs) - limit} more runs)" if len(runs) > limit else "")


# --- every rank's steps --------------------------------------------------------------------


@dataclass(slots=True)
class StepGrid:
    """Each recorded rank's steps from the summaries (no events read): row i is ranks[i].

    `time`: the step's duration; `late`: how long after the step's earliest start (across
    ranks, on rank 0's clock) the rank started it. Both in ns, NaN where the rank has no
    finished step; the step a run failed or hung in, which a rank began and never ended,
    from the end of its previous step to its last record (`TimelineModel.open_steps`)."""

    ranks: list[int]
    steps: list[int]
    time: np.ndarray  # float64 [rank row, step column]
    late: np.ndarray

    def rank_means(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per rank: mean and max step time, mean lateness (NaN for a rank with no step)."""
        have = ~np.isnan(self.time)
        n = have.sum(axis=1)
        some = n > 0
        mean = np.full(len(self.ranks), np.nan)
        mx = np.full(len(self.ranks), np.nan)
        late = np.full(len(self.ranks), np.nan)
        if not self.time.shape[1]:  # no steps (an imported Flight Recorder dump has none)
            return mean, mx, late
        mean[some] = np.where(have, self.time, 0).sum(axis=1)[some] / n[some]
        mx[some] = np.where(have, self.time, -np.inf).max(axis=1)[some]
        late[some] = np.where(have, self.late, 0).sum(axis=1)[some] / n[some]
        return mean, mx, late


def step_grid(tm: TimelineModel) -> StepGrid:
    """The StepGrid of `tm`'s bundle: a pass over the summaries' step table."""
    ranks, steps = tm.ranks, tm.steps
    row_of, offsets = tm.row_of, tm.offsets
    time_ = np.full((len(ranks), len(steps)), np.nan)
    start = np.full((len(ranks), len(steps)), np.nan)
    table = tm.summaries["steps"]
    for j, s in enumerate(steps):
        rows, starts, ends = [], [], []
        for r, v in table.get(s, {}).items():
            i = row_of.get(r)
            if i is not None and v[1] is not None:
                rows.append(i)
                starts.append(v[0] - offsets.get(r, 0))
                ends.append(v[1] - v[0])
        if rows:
            time_[rows, j] = ends
            start[rows, j] = starts
    col_of = {s: j for j, s in enumerate(steps)}
    for s, began in tm.open_steps.items():  # where the run failed or hung: until its records end
        for r, (t0, reach) in began.items():
            time_[row_of[r], col_of[s]], start[row_of[r], col_of[s]] = reach - t0, t0 - offsets.get(r, 0)
    first = np.where(np.isnan(start), np.inf, start).min(axis=0, initial=np.inf)
    return StepGrid(ranks=list(ranks), steps=list(steps), time=time_, late=start - first)


# --- analyses in a child process -----------------------------------------------------------


def _diagnosis(b: Bundle):
    """The findings, and where a straggler was found, each straggler's cost (re-timing
    every step costs as much as `prism-rr analyze`: only then, as `prism-rr diagnose` does)."""
    found = diagnose(b)
    # every late rank's cost (the ranks table has a column of them), not only the stragglers'
    costs = straggler_totals(attribute(b)) if any(f.kind == "straggler" for f in found) else []
    return found, costs


def lateness(b: Bundle, ranks: list[int], steps: list[int]) -> np.ndarray:
    """[rank row, step column]: how long the rank kept the others waiting in the step's
    collectives: over each call, its entry minus the first member's, summed (ns; NaN
    where it made none). A rank that computes slowly in a synchronous run shows here,
    where its step time and start look like everyone's.

    A call is a (group, seq) of the collectives that the recorded ones of `ranks` recorded
    (point-to-point calls are not), entries on rank 0's clock (clock_offsets of those
    ranks), as build_graph's call table has them; a call only one member recorded keeps
    no one waiting. Only what that needs is read, as columns (ColumnReader), from
    LATENESS_APART_FROM ranks a forked process reading part of them; calls are matched
    by numbering them (`_call_index`), not by building the graph (8192 x 1,000: 6 s on
    two cores, not 14.5)."""
    out = np.full((len(ranks), len(steps)), np.nan)
    recorded = set(b.recorded_ranks)
    read = [r for r in ranks if r in recorded]
    if not read or not steps:
        return out
    row_of = {r: i for i, r in enumerate(ranks)}
    group, seq, start, cell = _collective_rows(b, read, clock_offsets(b, read), row_of, steps)
    late = _late_by_call(group, seq, start)
    ok = cell >= 0
    total = np.bincount(cell[ok], weights=late[ok], minlength=out.size)
    seen = np.bincount(cell[ok], minlength=out.size) > 0
    out.ravel()[seen] = total[seen]
    return out


def _collective_rows(b: Bundle, ranks: list[int], offsets: dict[int, int], row_of: dict[int, int],
                     steps: list[int]) -> np.ndarray:
    """(4, calls) int64: group, seq, start and cell of every collective call of `ranks`,
    the last LATENESS_SHARE of them read by a forked process where there are
    LATENESS_APART_FROM ranks or more (and it can fork, on more than one core)."""
    apart = (len(ranks) >= LATENESS_APART_FROM and hasattr(os, "fork") and (os.cpu_count() or 1) > 1)
    theirs = ranks[len(ranks) - max(1, int(len(ranks) * LATENESS_SHARE)):] if apart else []
    helper = _fork_rows(b, theirs, offsets, row_of, steps) if theirs else None
    got = None
    try:
        ours = _read_rows(b, ranks[: len(ranks) - len(theirs)], offsets, row_of, steps)
        if helper is not None:
            got = _helper_rows(helper[1])
    finally:
        if helper is not None:
            _end_helper(*helper)
    if theirs and got is None:  # read them here, which says why it failed
        got = _read_rows(b, theirs, offsets, row_of, steps)
    return ours if got is None else np.concatenate([ours, got], axis=1)


def _read_rows(b: Bundle, ranks: list[int], offsets: dict[int, int], row_of: dict[int, int],
               steps: list[int]) -> np.ndarray:
    """(4, calls) int64 of `ranks`' collective calls, read here in order: group, seq,
    start (on rank 0's clock) and cell, row_of[rank] * len(steps) + the step's column
    (-1 for a step not in `steps`). figures=False reads the calls and little else: at
    8192 x 1,000 a fifth less a rank (1.1 ms) than attribution's lean mode, which also
    reads when each call returned and each step's bounds."""
    reader = ColumnReader(b, figures=False)
    cols: list[list[np.ndarray]] = [[], [], [], [], [], []]
    for r in ranks:
        c = reader.rank(r, offsets[r])
        for into, a in zip(cols, (c.group, c.seq, c.start, c.step, c.p2p)):
            into.append(a)
        cols[5].append(len(c.p2p))
    if not ranks:
        return np.zeros((4, 0), np.int64)
    group, seq, start, step, p2p = (np.concatenate(v) for v in cols[:5])
    row = np.repeat(np.array([row_of[r] for r in ranks], np.int64), cols[5])
    coll = ~p2p
    group, seq, start, step, row = group[coll], seq[coll], start[coll], step[coll], row[coll]
    at = np.asarray(steps)
    col = np.searchsorted(at, step)
    ok = col < len(at)
    ok[ok] &= at[col[ok]] == step[ok]
    return np.stack([group, seq, start, np.where(ok, row * len(at) + col, -1)])


def _fork_rows(b: Bundle, ranks: list[int], offsets: dict[int, int], row_of: dict[int, int],
               steps: list[int]):
    """(pid, connection) of a forked process sending _read_rows of `ranks` as bytes (no
    pickle: the numbers it read from a stranger's bundle), or sending nothing and ending
    with 1 where it fails; None where none could be forked. os.fork, not multiprocessing:
    run_apart's child is daemonic, and multiprocessing lets a daemonic process start
    none. It stays in this process's group, which a cancel of run_apart ends whole."""
    ours, theirs = multiprocessing.Pipe(duplex=False)
    try:
        pid = os.fork()
    except OSError:  # no room for a process: all are read here
        ours.close()
        theirs.close()
        return None
    if pid == 0:  # the helper: never returns into the caller
        code = 1
        try:
            ours.close()
            theirs.send_bytes(_read_rows(b, ranks, offsets, row_of, steps).tobytes())
            code = 0
        except BaseException:  # noqa: BLE001 - the ranks are read again where it was asked, which says why
            pass
        finally:
            os._exit(code)
    theirs.close()
    return pid, ours


def _helper_rows(conn) -> np.ndarray | None:
    """What the forked process sent, as _read_rows's array, or None if it sent nothing whole."""
    try:
        data = conn.recv_bytes()
    except (EOFError, OSError):
        return None
    if len(data) % 32:
        return None
    return np.frombuffer(data, np.int64).reshape(4, -1)


def _end_helper(pid: int, conn) -> None:
    """Ends and reaps the forked process: done once it sent its rows, or no longer
    wanted (reading here failed or was interrupted)."""
    conn.close()
    try:
        os.kill(pid, signal.SIGKILL)  # (a process that ended is still there to kill until reaped)
        os.waitpid(pid, 0)
    except OSError:  # reaped already, by someone else
        pass


def _late_by_call(group: np.ndarray, seq: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Each row's start minus the earliest start of the rows of its call (the same group
    and seq): 0 where the call has one row, as it must."""
    idx, n = _call_index(group, seq)
    first = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(first, idx, start)
    return start - first[idx]


def _call_index(group: np.ndarray, seq: np.ndarray) -> tuple[np.ndarray, int]:
    """(each row's call numbered 0..n-1, n): rows of the same (group, seq) get one number.
    Per group, its span of sequence numbers laid end to end where they are few enough
    (no sort: 4 M rows at 8192 x 1,000); else by sorting."""
    got = _dense_index(group, seq)
    if got is not None:
        return got
    order = np.lexsort((seq, group))
    g, s = group[order], seq[order]
    new = np.ones(len(order), bool)
    new[1:] = (g[1:] != g[:-1]) | (s[1:] != s[:-1])
    idx = np.empty(len(order), np.int64)
    idx[order] = np.cumsum(new) - 1
    return idx, int(new.sum())


def _dense_index(group: np.ndarray, seq: np.ndarray) -> tuple[np.ndarray, int] | None:
    """_call_index's numbering as base[group] + seq - least seq[group], or None where the
    groups' ids or sequence numbers spread too far for that (a slot per number in each
    group's span, at most DENSE_CALLS slots a row)."""
    n = len(group)
    if not n:
        return None
    g0, g1, s0, s1 = int(group.min()), int(group.max()), int(seq.min()), int(seq.max())
    if g1 - g0 > max(n, 1 << 16) or s1 - s0 >= 1 << 40 or max(-s0, s1) >= 1 << 62:
        return None  # (within these, nothing below overflows)
    g = group - g0
    lo, hi = np.full(g1 - g0 + 1, s1), np.full(g1 - g0 + 1, s0)
    np.minimum.at(lo, g, seq)
    np.maximum.at(hi, g, seq)
    span = np.where(np.bincount(g, minlength=len(lo)) > 0, hi - lo + 1, 0)
    slots = int(span.sum())
    if slots > DENSE_CALLS * n + (1 << 16):
        return None
    first_slot = np.cumsum(span) - span - lo  # a group's first slot, less its least seq
    return first_slot[g] + seq, slots


def _child(fn, path, args, conn) -> None:
    """The child's side of run_apart. It leads a process group of its own, so a cancel
    ends the reader it starts for big bundles with it; it never prints."""
    if hasattr(os, "setpgrp"):
        os.setpgrp()
    try:
        with open_bundle(path) as b:
            conn.send(("ok", fn(b, *args)))
    except PrismError as exc:
        conn.send(("bundle", exc))
    except Exception as exc:  # noqa: BLE001 - the parent says so
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def run_apart(fn, bundle: Bundle, *args, tick: Callable[[float], None] | None = None,
              stop: Callable[[], bool] | None = None, every: float = 0.25):
    """`fn(bundle, *args)` in a child process that reads the bundle afresh: seconds of CPU
    that would stall the screen, and that a user can stop.

    `tick(seconds so far)` is called every `every` seconds while it runs; when `stop()`
    turns true the child is ended and None is returned. A malformed bundle raises its
    PrismError here; any other failure raises RuntimeError with its text. Where the
    platform can fork, the child inherits this module as it is (a test's stand-in for
    `diagnose` included).
    """
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    ours, theirs = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(fn, str(bundle.path), args, theirs), daemon=True,
                        name=f"prism-rr {fn.__name__.strip('_')}")
    t0 = time.monotonic()
    child.start()
    theirs.close()
    try:
        while not ours.poll(every):
            if stop is not None and stop():
                return None
            if not child.is_alive() and not ours.poll(0):
                raise RuntimeError(f"the analysis process ended with exit code {child.exitcode}")
            if tick is not None:
                tick(time.monotonic() - t0)
        try:
            status, value = ours.recv()
        except EOFError:
            child.join(1)
            raise RuntimeError(f"the analysis process ended with exit code {child.exitcode}") from None
    finally:
        ours.close()
        if child.is_alive():
            try:
                os.killpg(child.pid, signal.SIGTERM)
            except (AttributeError, OSError):  # no process groups here, or it just ended
                child.terminate()
        child.join(5)
    if status == "bundle":
        raise value
    if status == "failed":
        raise RuntimeError(value)
    return value


def diagnose_apart(bundle: Bundle, **kw):
    """`diagnose(bundle)` and the stragglers' costs ({rank, cost_ns, steps, late_calls},
    costliest first), by run_apart (same keywords; None if stopped)."""
    return run_apart(_diagnosis, bundle, **kw)


# --- compare ---------------------------------------------------------------------------


def _step_medians(bundle: Bundle, clock: str) -> dict[int, float]:
    out = {}
    for s in bundle.steps:
        d = step_durations(bundle, s, clock=clock)
        if d:
            out[s] = median(d.values())
    return out


def _rank_means(bundle: Bundle, ranks, steps, clock: str) -> dict[int, float]:
    out = {}
    per_step = [step_durations(bundle, s, clock=clock) for s in steps]
    for r in ranks:
        d = [durations[r] for durations in per_step if r in durations]
        if d:
            out[r] = sum(d) / len(d)
    return out


def _identity(rec) -> tuple:
    """Which call a record is, by the numbers that name it in any recording of the program:
    a collective by (group, seq), a point-to-point call by direction, peer and seq."""
    if isinstance(rec, Collective):
        return ("collective", rec.group, rec.seq)
    return ("p2p", rec.group, ops.receives(rec.op), rec.peer, rec.seq)


def first_divergence(recorded: Bundle, replayed: Bundle, rank: int,
                     made_up: dict[int, int | None] | None = None) -> dict | None:
    """The first recorded call of `rank` that its replay made otherwise, or not at all.

    Calls are matched by what names them (group and sequence number), not by position:
    a replay's own recording holds the whole program (set-up, step 0) while the bundle
    it replays may hold a window of steps, and positions would pair unrelated calls. Calls
    the replay made beyond the recording's are not divergences (replay scores the same).
    A matched pair differs as replay judges it (`call_divergence`): data only where the
    replay ran on the recorded data (`made_up`, `replay_data(recorded, replayed)`)."""
    if made_up is None:
        made_up = replay_data(recorded, replayed)

    def calls(b):
        return (rec for rec in b.events(rank) if isinstance(rec, (Collective, PointToPoint)))

    made, last_step = {}, None
    for rec in calls(replayed):
        made[_identity(rec)] = rec
        last_step = rec.step if last_step is None else max(last_step, rec.step)
    for n, a in enumerate(calls(recorded)):
        b = made.get(_identity(a))
        what = None
        if b is None:
            what = "replay stopped early" if last_step is None or a.step > last_step else "replay never made it"
        else:
            d = call_divergence(a, b, data=data_checked(made_up, rank, b))
            what = None if d is None else d.text()
        if what:
            return {"rank": rank, "index": n, "step": a.step, "op": a.op, "group": a.group,
                    "seq": a.seq, "what": what, "recorded": a, "replayed": b}
    return None


def replay_warning(recorded: Bundle, replayed: Bundle) -> str | None:
    """Why `replayed` may not be a replay of `recorded`, or None: its ranks' `replay_of`
    names the bundle each replayed."""
    names = set()
    for r in replayed.recorded_ranks[:64]:
        of = replayed.raw_rank_info(r).get("replay_of")  # a path, held against a file's name; shown below
        if isinstance(of, dict) and isinstance(of.get("bundle"), str):
            names.add(of["bundle"].replace("\\", "/").rsplit("/", 1)[-1])
    if not names:
        return (f"{shown(replayed.path.name)} does not say it is a replay (no replay_of): "
                "it is compared as another recording of the same program")
    if recorded.path.name not in names:
        return (f"{shown(replayed.path.name)} is a replay of {', '.join(shown(n) for n in sorted(names)[:8])}, "
                f"not of {shown(recorded.path.name)}")
    return None


def compare_bundles(recorded: Bundle, replayed: Bundle) -> dict:
    """Iteration times per step and per rank, recorded vs replayed, and the first divergence,
    over what `prism-rr replay` scores: the steps both hold, less the first (it also holds
    start-up), and the calls of the recording.

    Only the replay's ranks are compared call by call (a replay runs a few ranks).
    """
    # one clock for both sides: the device's where both timed their steps there (a replay's
    # own recording on the GPU it ran on), else the host's
    clock = "device" if all(b.summaries.get("device_steps") for b in (recorded, replayed)) else "host"
    rec_steps, rep_steps = _step_medians(recorded, clock), _step_medians(replayed, clock)
    common = sorted(set(rec_steps) & set(rep_steps))
    scored = common[1:] if len(common) > 1 else common
    ranks = [r for r in replayed.recorded_ranks if r in set(recorded.recorded_ranks)]
    rec_ranks, rep_ranks = _rank_means(recorded, ranks, scored, clock), _rank_means(replayed, ranks, scored, clock)
    made_up = replay_data(recorded, replayed)
    divergences = [d for r in ranks if (d := first_divergence(recorded, replayed, r, made_up)) is not None]
    first = min(divergences, key=lambda d: (d["step"], d["index"]), default=None)
    return {
        "steps": [(s, rec_steps.get(s), rep_steps.get(s)) for s in scored],
        "ranks": [(r, rec_ranks.get(r), rep_ranks.get(r)) for r in ranks],
        "scored_steps": scored,
        "clock": clock,
        "first_divergence": first,
        "data_compared": bool(made_up),  # the replay said where it ran on the recorded data
        "warning": replay_warning(recorded, replayed),
    }


