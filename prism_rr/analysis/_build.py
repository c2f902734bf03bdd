"""Build the execution graph: read each rank once, match calls across ranks.

Ranks are read one after another as columns (`_columns`); a row per communication call
is kept, its op, signature and stack as ids of interned values, and calls are matched by
sorting those rows (`_calls`), not by a dict of objects.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from prism_rr.format.facts import FATAL_SIGNALS
from prism_rr.format.reader import Bundle, open_bundle
from prism_rr.format.records import Collective
from prism_rr.analysis._calls import CallMap, CallTable, P2PMap, P2PTable
from prism_rr.analysis._columns import (
    ColumnReader,
    RankColumns,
    dump_columns,
    load_columns,
    signature_of,
    split_columns,
)
from prism_rr.analysis._model import Crash, MatchedCall, Member, P2PMatch, RankTrace, StepStats

# Deferred imports: numpy's private huge-page switch, looked up where it is used (its module moved in numpy 2).

__all__ = ["ExecutionGraph", "build_graph", "clock_offset", "clock_offsets", "parse_crash", "read_columns", "serve",
           "signature", "small_pages"]

# Marker names that say something about what a bundle can show.
_NOTABLE = frozenset({"recording_end", "recorder_failed", "call_failed", "recording_off", "records_dropped"})


def signature(rec: Collective) -> tuple:
    """What the members of one collective must agree on: (op, shapes, dtypes, reduce op, root)."""
    return signature_of(rec.op, rec.in_shapes, rec.in_dtypes, rec.out_shapes, rec.out_dtypes, rec.reduce_op, rec.root)


@contextlib.contextmanager
def small_pages():
    """numpy asks the kernel for 2 MiB pages for its big arrays (where transparent huge
    pages are on madvise, as on most Linux hosts). Analysis makes many big arrays that
    live briefly, and faulting in huge pages cost diagnose 8192 x 1000 a quarter of a second
    of its five; so 4 KiB pages while analysing, numpy's setting restored after."""
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:
        try:
            from numpy.core.multiarray import _set_madvise_hugepage
        except ImportError:  # a numpy without the setting: as it is
            yield
            return
    before = _set_madvise_hugepage(False)
    try:
        yield
    finally:
        _set_madvise_hugepage(before)


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
    infos = {r: {k: bundle.rank_field(r, k) for k in ("hostname", "clock_offset")} for r in ranks}
    ref_host = bundle.rank_field(0, "hostname")
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
    """Every recorded call matched across ranks, per-rank traces and per-step figures.

    `calls` and `p2p` are mappings whose entries are made when looked up, from the
    columns of `table` and `p2p_table`: iterating them whole makes every object."""

    world_size: int
    ranks: list[int]
    groups: dict[int, tuple[int, ...]]  # group id -> global ranks
    calls: Mapping[tuple[int, int], MatchedCall] = field(default_factory=dict)
    p2p: Mapping[tuple[int, int, int, int], P2PMatch] = field(default_factory=dict)
    traces: dict[int, RankTrace] = field(default_factory=dict)
    steps: dict[int, StepStats] = field(default_factory=dict)
    t0_ns: int = 0  # earliest recorded time, on rank 0's clock
    table: CallTable | None = None
    p2p_table: P2PTable | None = None

    def ordered_calls(self) -> list[MatchedCall]:
        """Matched collectives by first arrival."""
        return sorted(self.calls.values(), key=lambda c: (c.first_arrival.enter_ns if c.members else 0, c.key))

    def call_of(self, group: int, seq: int) -> MatchedCall | None:
        return self.calls.get((group, seq))


_COMM = ("group", "seq", "peer", "start", "end", "open", "step", "op", "sig", "stack", "async_op")


# From this many recorded ranks, a second process reads half of them (where a second core
# is there): starting it costs about half a second; 8192 ranks take seconds to read.
PARALLEL_FROM_RANKS = 2048


def build_graph(bundle: Bundle, *, steps: tuple[int, int] | None = None,
                ranks: list[int] | None = None, processes: int | None = None,
                figures: bool = True, clock_from: list[int] | None = None) -> ExecutionGraph:
    """Read the recorded ranks of `bundle` (optionally only `steps` a..b) and match their calls.

    `figures`: False leaves each step's compute_ns and comm_ns empty (diagnosis reads
    neither), and is quicker. `clock_from`: the ranks whose clock estimates give the clock
    offsets (`clock_offsets`; by default the ranks read), so that a graph of a few ranks
    has the times a graph of all has. `processes`: 1 reads every rank here; 2 has a second interpreter (`_Helper`) read
    the last part of the ranks meanwhile. None: 2 from PARALLEL_FROM_RANKS recorded ranks on a machine with more
    than one core."""
    recorded = bundle.recorded_ranks if ranks is None else [r for r in ranks if r in set(bundle.recorded_ranks)]
    # the second reader starts first: its start-up overlaps the set-up below
    helper = _Helper.start(bundle, recorded, steps, processes, figures, clock_from)
    try:
        rset = set(recorded)
        groups = {g["id"]: tuple(g["ranks"]) for g in bundle.groups}
        graph = ExecutionGraph(world_size=bundle.world_size, ranks=list(recorded), groups=groups)
        sums = bundle.summaries["ranks"]
        offsets = clock_offsets(bundle, recorded if clock_from is None else clock_from)
    except BaseException:  # (once reading starts, _read stops it)
        if helper is not None:
            helper.stop()
        raise
    reader = ColumnReader(bundle, figures)
    parts: list[RankColumns] = []  # per-step figures only; the call columns go to `columns`
    columns: dict[str, list[np.ndarray]] = {k: [] for k in (*_COMM, "rank", "p2p")}
    theirs: dict[str, np.ndarray] = {}  # the helper's columns, each one array of all its ranks
    t0 = None
    for rank, cols in _read(bundle, reader, recorded, offsets, steps, helper, theirs):
        trace = graph.traces[rank] = _rank_trace(bundle, rank, cols, offsets[rank], reader.values, steps, sums)
        if trace.first_ns is not None:
            t0 = trace.first_ns if t0 is None else min(t0, trace.first_ns)
        if not theirs:  # (the helper's ranks come last, their columns already in one)
            for k in (*_COMM, "p2p"):
                columns[k].append(getattr(cols, k))
            columns["rank"].append(np.full(len(cols.pos), rank, np.int64))
        for k in (*_COMM, "p2p", "pos"):
            setattr(cols, k, None)
        parts.append(cols)
    if theirs:
        for k in (*_COMM, "p2p"):
            columns[k].append(theirs[k])
        columns["rank"].append(np.repeat(np.array(helper.theirs, np.int64), theirs["lengths"]))
    graph.t0_ns = t0 or 0
    _match(graph, columns, reader.values, rset)
    graph.steps = _step_stats(parts, graph.table)
    return graph


def _rank_trace(bundle: Bundle, rank: int, cols: RankColumns, offset: int, values: list, steps,
                sums: dict) -> RankTrace:
    """One rank's trace, with what its summary and rank info say of how it ended."""
    trace = _trace(bundle, cols, offset, values, steps)
    rs = sums.get(rank, {})
    trace.dropped = int(rs.get("dropped", 0) or 0)
    trace.truncated = bool(rs.get("truncated", False))
    trace.crash = parse_crash(bundle.rank_info(rank).get("crash"))
    return trace


def _match(graph: ExecutionGraph, columns: dict[str, list[np.ndarray]], values: list, rset: set[int]) -> None:
    """The graph's call and message tables and maps, from every rank's call columns
    (`columns` is emptied as they are joined: the whole table is never held twice)."""
    comm = {k: np.concatenate(v) if v else np.zeros(0, bool if k == "p2p" else np.int64) for k, v in columns.items()}
    columns.clear()
    is_p2p = comm.pop("p2p")
    comm["read_at"] = np.arange(len(comm["rank"]), dtype=np.int64)
    expected = {gid: tuple(r for r in members if r in rset) if members else ()
                for gid, members in graph.groups.items()}
    matched = is_p2p & (comm["peer"] >= 0) & (comm["seq"] >= 0)  # a receive from any source has no partner
    graph.p2p_table = P2PTable({k: v[matched] for k, v in comm.items()}, values)
    del comm["peer"]
    if is_p2p.any():
        coll = ~is_p2p
        for k in list(comm):
            comm[k] = comm[k][coll]  # one column at a time: the whole table is never held twice
    graph.table = CallTable(comm, values, expected)
    del comm
    graph.calls = CallMap(graph.table)
    graph.p2p = P2PMap(graph.p2p_table)


class _Helper:
    """A second interpreter reading the second part of the ranks (a subprocess, so safe
    from any thread and any main module). It computes the clock offsets itself, from
    all of `ranks` as this process does, so it starts before this process has them."""

    # This process also matches and diagnoses after reading; the helper also starts an
    # interpreter and sends its columns: it reads a little less than half.
    SHARE = 0.42
    # ... where this process only waits for it (a batch of attribution, diff's comparison):
    # nearly half, its start-up the difference.
    WAITED_SHARE = 0.48

    def __init__(self, proc, theirs: list[int]):
        self.proc, self.theirs = proc, theirs

    @classmethod
    def start(cls, bundle: Bundle, ranks: list[int], steps, processes: int | None,
              figures: bool = True, clock_from: list[int] | None = None,
              attribution: bool = False) -> _Helper | None:
        theirs = cls._share(ranks, processes, cls.WAITED_SHARE if attribution else cls.SHARE)
        if theirs is None:
            return None
        job = {"path": str(bundle.path.resolve()), "all": list(ranks if clock_from is None else clock_from), "ranks": theirs,
               "steps": list(steps) if steps is not None else None, "figures": figures,
               "attribution": attribution}
        return cls._spawn(job, theirs)

    @classmethod
    def comparing(cls, a: Bundle, b: Bundle, ranks: list[int], steps, processes: int | None) -> _Helper | None:
        """One comparing the last part of `ranks` of bundles A and B as `diff` does
        (`_diff.serve`), its output() the message of `_diff.compare_ranks`."""
        theirs = cls._share(ranks, processes, cls.WAITED_SHARE)
        if theirs is None:
            return None
        job = {"diff": [str(a.path.resolve()), str(b.path.resolve())], "ranks": theirs,
               "steps": list(steps) if steps is not None else None}
        return cls._spawn(job, theirs, "prism_rr.analysis._diff")

    @classmethod
    def _share(cls, ranks: list[int], processes: int | None, share: float) -> list[int] | None:
        """The last `share` of `ranks`, which a second process takes; None where none is started."""
        if processes is None:
            processes = 2 if len(ranks) >= PARALLEL_FROM_RANKS and (os.cpu_count() or 1) > 1 else 1
        if processes < 2 or len(ranks) < 2:
            return None
        return ranks[len(ranks) - max(1, int(len(ranks) * share)):]

    @classmethod
    def _spawn(cls, job: dict, theirs: list[int], module: str = "prism_rr.analysis._build") -> _Helper:
        """The interpreter running `module`'s serve() on `job` (a fixed module of ours)."""
        proc = subprocess.Popen([sys.executable, "-c", f"from {module} import serve; serve()"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        # The job (8192 ranks: some 70 KB) outgrows the pipe's buffer, so writing it waits
        # for the interpreter to start and read: a thread writes it, this one goes on.
        threading.Thread(target=cls._send, args=(proc, json.dumps(job).encode()), daemon=True).start()
        return cls(proc, theirs)

    @staticmethod
    def _send(proc, job: bytes) -> None:
        try:
            proc.stdin.write(job)
            proc.stdin.close()
        except OSError:  # it ended: result() sees it fail, and the ranks are read here
            pass

    def output(self) -> bytes | None:
        """What it wrote, or None if it failed (a malformed chunk, no memory, ...)."""
        proc = self.proc
        try:
            data = proc.stdout.read()
        finally:
            proc.stdout.close()
            if proc.wait() != 0:
                data = None
        return data

    def result(self) -> tuple[list, dict[str, np.ndarray], list] | None:
        """What it read (load_columns), or None if it failed."""
        data = self.output()
        if data is None:
            return None
        got = load_columns(data)  # our own child's output, as plain data
        return got if [r[0] for r in got[0]] == self.theirs else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()


def serve() -> None:
    """A second reading process (_Helper's): reads {"path", "all": the ranks read,
    "ranks": those to read here, "steps", "figures", "attribution"} as JSON on stdin,
    writes dump_columns of what it read on stdout, for ColumnReader.adopt in the process
    that started it. The clock offsets are those of all the ranks read, as the process
    that started it computes them."""
    job = json.loads(sys.stdin.buffer.read())
    steps = tuple(job["steps"]) if job["steps"] is not None else None
    with small_pages(), open_bundle(job["path"]) as bundle:
        offsets = clock_offsets(bundle, job["all"])
        reader = ColumnReader(bundle, job.get("figures", True), attribution=job.get("attribution", False))
        parts = [reader.rank(r, offsets[r], steps) for r in job["ranks"]]
        if reader.attribution:
            for c in parts:  # what attribution does not read is not sent
                c.pos = c.sig = c.stack = None
        data = dump_columns(parts, reader.values)
    sys.stdout.buffer.write(data)


def _read(bundle: Bundle, reader: ColumnReader, ranks: list[int], offsets: dict[int, int], steps,
          helper: _Helper | None, into: dict[str, np.ndarray]):
    """(rank, columns) in `ranks` order; the last part read by `helper` if there is one,
    whose columns are then views of one array each, put in `into` (with "lengths": how
    many rows are each rank's) before its first rank comes."""
    if helper is None:
        for rank in ranks:
            yield rank, reader.rank(rank, offsets[rank], steps)
        return
    theirs = helper.theirs
    done = False
    try:
        for rank in ranks[: len(ranks) - len(theirs)]:
            yield rank, reader.rank(rank, offsets[rank], steps)
        got = helper.result()
        done = True
    finally:
        if not done:
            helper.stop()
    if got is None:  # read them here, which says why it failed
        for rank in theirs:
            yield rank, reader.rank(rank, offsets[rank], steps)
        return
    rows, arrays, values = got
    arrays = reader.adopt(arrays, values)
    parts = split_columns(rows, arrays)
    into.update(arrays, lengths=np.array([len(c.step) for c in parts], np.int64))
    yield from zip(theirs, parts)


def read_columns(bundle: Bundle, reader: ColumnReader, ranks: list[int], offsets: dict[int, int],
                 steps: tuple[int, int] | None = None, processes: int | None = None):
    """(rank, reader.rank(rank, ...)) for each of `ranks` in order, the last part read by a
    second process as in build_graph (`processes`), with `reader`'s options. `offsets`
    must be clock_offsets(bundle, ranks), which the second process computes too."""
    helper = _Helper.start(bundle, ranks, steps, processes, reader.figures, attribution=reader.attribution)
    yield from _read(bundle, reader, ranks, offsets, steps, helper, {})


def _trace(bundle: Bundle, cols: RankColumns, offset: int, values: list, steps) -> RankTrace:
    """What one rank's columns say about the rank as a whole."""
    trace = RankTrace(rank=cols.rank, offset_ns=offset, events=cols.events, first_ns=cols.first_ns,
                      last_ns=cols.last_ns)
    trace.source = (bundle, steps)
    n = len(cols.pos)

    def member(i: int) -> Member:
        return Member(rank=cols.rank, enter_ns=int(cols.start[i]), end_ns=None if cols.open[i] else int(cols.end[i]),
                      step=int(cols.step[i]), op=values[cols.op[i]], sig=values[cols.sig[i]],
                      stack=values[cols.stack[i]], async_op=bool(cols.async_op[i]))

    if n:
        i = n - 1 - int(np.argmax(cols.start[::-1]))  # the latest entry; a later record wins a tie
        trace.last_call = member(i)
        trace.last_call_group_seq = (int(cols.group[i]), int(cols.seq[i]))
        for i in np.flatnonzero(cols.open).tolist():
            trace.open_calls.append(("p2p" if cols.p2p[i] else "collective", int(cols.group[i]),
                                     int(cols.seq[i]), member(i)))
    for pos, mk in cols.markers:
        if mk.name == "call_failed" and len(trace.failed) < 1000:
            # written right after the failed call's record, whose seq it names
            i = int(np.searchsorted(cols.pos, pos)) - 1
            group = None
            if i >= 0 and not cols.p2p[i] and int(cols.seq[i]) == mk.value:
                group = int(cols.group[i])
            trace.failed.append((group, mk.value, mk))
        if mk.name == "recording_end":
            trace.ended = True
        if mk.name in _NOTABLE:
            if len(trace.markers) < 1000:
                trace.markers.append(mk)
            if mk.name in ("recorder_failed", "recording_off") and trace.off_ns is None:
                trace.off_ns = mk.start_ns - offset
    return trace


def _step_stats(parts: list[RankColumns], table: CallTable) -> dict[int, StepStats]:
    """Per step and rank: the Step record's length, compute, communication and waiting."""
    steps: set[int] = set()
    for c in parts:
        steps |= c.steps_seen
        steps.update(c.compute_ns)
    stats = {s: StepStats(step=s) for s in sorted(steps)}
    for c in parts:
        for s, ns in c.iteration_ns.items():
            stats[s].iteration_ns[c.rank] = ns
        for s, ns in c.compute_ns.items():
            stats[s].compute_ns[c.rank] = ns
        for s, ns in c.comm_ns.items():
            stats[s].comm_ns[c.rank] = ns
    _spread_waits(stats, table)
    return stats


def _spread_waits(stats: dict[int, StepStats], t: CallTable) -> None:
    """Each member's wait (CallTable.waits) summed by step and rank into wait_ns."""
    if not len(t.step):
        return
    waits = t.waits()
    lo, hi = int(t.step.min()), int(t.step.max())
    world = int(t.rank.max()) + 1
    if (hi - lo + 1) * world <= 1 << 26:  # a dense (step, rank) grid
        cell = (t.step - lo) * world + t.rank
        cells = (hi - lo + 1) * world
        present = np.bincount(cell, minlength=cells) > 0
        if float(waits.sum(dtype=np.float64)) < 2.0**52:  # float sums are exact
            sums = np.bincount(cell, weights=waits, minlength=cells).astype(np.int64)
        else:
            sums = np.zeros(cells, np.int64)
            np.add.at(sums, cell, waits)
        cell = np.flatnonzero(present)
        for c, v in zip(cell.tolist(), sums[cell].tolist()):
            stats[lo + c // world].wait_ns[c % world] = v
        return
    keys, inv = np.unique(np.stack([t.step, t.rank], axis=1), axis=0, return_inverse=True)
    sums = np.zeros(len(keys), np.int64)
    np.add.at(sums, inv.reshape(-1), waits)
    for (s, r), v in zip(keys.tolist(), sums.tolist()):
        stats[s].wait_ns[r] = v


# --- crash files ------------------------------------------------------------------------

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
    return Crash(signal=FATAL_SIGNALS.get(reason, "fatal error"), reason=reason or "unknown", stack=stack,
                 frames=frames, thread=which, text=text)
