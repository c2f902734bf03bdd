"""One rank's recording read as a program: what `replay --from-bundle` runs (driver.py).

A program is the rank's groups, its calls in the order it made them, and where it waited:
actions (a call, the wait() for an asynchronous one, a step's end), each at the recorded
time it began and returned, so that the time between two actions is the compute the rank
did there. Torch-free: the launcher reads every real rank's program before it starts one,
and a bundle whose calls are absurd (a shape of 2^40 elements, a million groups, a
negative or day-long duration) is refused in one line before anything is allocated.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from math import prod

from prism_rr.errors import FormatError, UsageError
from prism_rr.format import ops
from prism_rr.format.records import Collective, PointToPoint, Step
from prism_rr.text import quoted

__all__ = ["DTYPE_BYTES", "REDUCE_OPS", "Action", "Program", "program_of"]

# Torch's dtype names as records spell them -> bytes per element: the only dtypes a driver makes
DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex128": 16, "complex64": 8,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8,
    "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}
REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
MAX_GROUPS = 1 << 16  # group ids a program creates
MAX_CALLS = 1 << 24  # calls of one rank
MAX_TENSORS = 4096  # tensors of one call
MAX_DIMS = 16
MAX_CALL_BYTES = 8 << 30  # inputs and outputs of one call
MAX_GAP_NS = 3600 * 10**9  # compute between two actions
MAX_HELD_NS = 24 * 3600 * 10**9  # compute of the whole program
MAX_TAG = (1 << 31) - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    """One thing the program does: "call" (calls[index]), "wait" (for calls[index], made
    asynchronously) or "step" (step `index` ends), at recorded `at_ns`, returning at `back_ns`."""

    kind: str
    index: int
    at_ns: int
    back_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Program:
    rank: int
    world_size: int
    groups: dict[int, tuple[tuple[int, ...], str]]  # group id -> (global ranks in group order, description)
    last_gid: int  # the program creates group ids 1..last_gid (gaps as stand-ins)
    calls: tuple  # Collective and PointToPoint records, in the order made
    actions: tuple[Action, ...]
    first_step: int  # steps before it are not in the recording: marked at once
    start_ns: int  # where the first step began, on the rank's recorded clock
    windowed: bool  # the recording holds a window of the run's steps (calls after it are the program's own)
    held_ns: int  # the compute held in all (recorded time between actions)

    @property
    def one_step(self) -> bool:
        """Whether all its calls are in one step."""
        return self.calls[0].step == self.calls[-1].step


def _refuse(rank: int, what: str) -> None:
    raise FormatError(f"rank {rank}'s recording cannot be run as a program: {what}")


def _int(v) -> bool:
    return type(v) is int


def _tensors(rank: int, rec, shapes, dtypes) -> int:
    """Bytes of one side of a call, its shapes and dtypes checked first."""
    if type(shapes) is not tuple or type(dtypes) is not tuple or len(shapes) != len(dtypes):
        _refuse(rank, f"{rec.op} (group {rec.group}, seq {rec.seq}) has shapes and dtypes that do not pair")
    if len(shapes) > MAX_TENSORS:
        _refuse(rank, f"{rec.op} (group {rec.group}, seq {rec.seq}) has {len(shapes)} tensors (at most {MAX_TENSORS})")
    total = 0
    for shape, dtype in zip(shapes, dtypes):
        if dtype not in DTYPE_BYTES:
            _refuse(rank, f"{rec.op} (group {rec.group}, seq {rec.seq}) has dtype {quoted(dtype)}, which the "
                          f"driver does not make")
        if type(shape) is not tuple or len(shape) > MAX_DIMS or not all(_int(d) and d >= 0 for d in shape):
            _refuse(rank, f"{rec.op} (group {rec.group}, seq {rec.seq}) has shape {quoted(shape)}")
        if any(d > MAX_CALL_BYTES for d in shape):
            _refuse(rank, f"{rec.op} (group {rec.group}, seq {rec.seq}) has shape {quoted(shape)}, over "
                          f"{MAX_CALL_BYTES >> 30} GiB")
        total += prod(shape) * DTYPE_BYTES[dtype]
        if total > MAX_CALL_BYTES:
            _refuse(rank, f"{rec.op} (group {rec.group}, seq {rec.seq}) moves over {MAX_CALL_BYTES >> 30} GiB")
    return total


# form -> (inputs, outputs) as counts a call's tensors must have: an int, "n" (the group
# size), "k" (any, at least one), "nk" (n times the inputs), "root:n" (n at the root, else
# 0); a coalesced op of a one-tensor form takes ("k", "k") (_shape_rule)
_SHAPE_RULES = {
    "reduce_all": (1, 1), "reduce_root": (1, 1), "copy_root": (1, 1), "gather_list": (1, "n"),
    "gather_list_by_rank": ("k", "nk"), "gather_root": (1, "root:n"), "gather_tensor": (1, 1),
    "reduce_scatter_list": ("n", 1), "reduce_scatter_tensor": (1, 1), "scatter_root": ("root:n", 1),
    "all_to_all": ("n", "n"), "all_to_all_single": (1, 1), "none": (0, 0),
}


def _shape_rule(op: ops.Op):
    rule = _SHAPE_RULES.get(op.form)
    if rule == (1, 1) and op.name.endswith("_coalesced"):
        return ("k", "k")
    return rule


def _counts_fit(rule, count: int, n: int, ins: int, root_here: bool) -> bool:
    if rule == "n":
        return count == n
    if rule == "k":
        return count >= 1
    if rule == "nk":
        return count == n * ins
    if rule == "root:n":
        return count == (n if root_here else 0)
    return count == rule


def _check_call(rank: int, rec, groups: dict) -> None:
    op = rec.op
    known = ops.lookup(op) if isinstance(op, str) else None
    if known is None:
        _refuse(rank, f"op {quoted(op)} is not one this version knows")
    if not _int(rec.group) or rec.group not in groups:
        _refuse(rank, f"{op} names group {quoted(rec.group)}, which the bundle does not describe")
    members = groups[rec.group][0]
    if rank not in members:
        _refuse(rank, f"{op} on group {rec.group}, of which rank {rank} is not a member")
    if not _int(rec.seq) or rec.seq < 0:
        _refuse(rank, f"{op} on group {rec.group} has sequence number {quoted(rec.seq)}")
    if not _int(rec.start_ns) or (rec.end_ns is not None and (not _int(rec.end_ns) or rec.end_ns < rec.start_ns)):
        _refuse(rank, f"{op} (group {rec.group}, seq {rec.seq}) has a negative duration")
    if rec.issued_ns is not None and (not _int(rec.issued_ns) or rec.issued_ns < rec.start_ns):
        _refuse(rank, f"{op} (group {rec.group}, seq {rec.seq}) returned before it began")
    if type(rec) is PointToPoint:
        if not _int(rec.peer) or rec.peer == rank or rec.peer not in members:
            _refuse(rank, f"{op} (group {rec.group}, seq {rec.seq}) has peer {quoted(rec.peer)}, not another member")
        if not _int(rec.tag) or not 0 <= rec.tag <= MAX_TAG:
            _refuse(rank, f"{op} (group {rec.group}, seq {rec.seq}) has tag {quoted(rec.tag)}")
        if len(rec.shapes) != 1:
            _refuse(rank, f"{op} (group {rec.group}, seq {rec.seq}) moves {len(rec.shapes)} tensors (one a message)")
        _tensors(rank, rec, rec.shapes, rec.dtypes)
        return
    n = len(members)
    if known.form in ("reduce_all", "reduce_root", "reduce_scatter_list", "reduce_scatter_tensor"):
        if rec.reduce_op is not None and str(rec.reduce_op).upper() not in REDUCE_OPS:
            _refuse(rank, f"{op} (group {rec.group}, seq {rec.seq}) reduces by {quoted(rec.reduce_op)}, which the "
                          f"driver does not make ({', '.join(REDUCE_OPS)})")
    if known.form in ("reduce_root", "copy_root", "gather_root", "scatter_root"):
        if not _int(rec.root) or rec.root not in members:
            _refuse(rank, f"{op} (group {rec.group}, seq {rec.seq}) has root {quoted(rec.root)}, not a member")
    _tensors(rank, rec, rec.in_shapes, rec.in_dtypes)
    _tensors(rank, rec, rec.out_shapes, rec.out_dtypes)
    rule = _shape_rule(known)
    ins, outs = len(rec.in_shapes), len(rec.out_shapes)
    root_here = rec.root == rank
    if rule is None or not (_counts_fit(rule[0], ins, n, ins, root_here) and _counts_fit(rule[1], outs, n, ins, root_here)):
        _refuse(rank, f"{op} (group {rec.group}, seq {rec.seq}) has {ins} input(s) and {outs} output(s), which "
                      f"torch's {op} on {n} ranks does not take")
    if known.form == "all_to_all_single":
        rows_in = rec.in_shapes[0][0] if rec.in_shapes[0] else 0
        rows_out = rec.out_shapes[0][0] if rec.out_shapes[0] else 0
        if rows_in % n or rows_out % n or rec.in_shapes[0][1:] != rec.out_shapes[0][1:]:
            raise UsageError(f"rank {rank}'s all_to_all_single (group {rec.group}, seq {rec.seq}) split its rows "
                             f"unevenly, and a recording keeps no split sizes: the driver makes even splits only")


def program_of(bundle, rank: int) -> Program:
    """Rank `rank`'s recording as a program; FormatError (one line) where the bundle holds
    what no program could be, UsageError where the driver cannot make a call as recorded."""
    world = bundle.world_size
    if rank not in bundle.recorded_ranks:
        raise UsageError(f"rank {rank} was not recorded; recorded: {bundle.recorded_ranks}")
    groups: dict[int, tuple[tuple[int, ...], str]] = {}
    for g in bundle.groups:
        gid, ranks = g["id"], tuple(g["ranks"])
        if not 0 <= gid < MAX_GROUPS:
            _refuse(rank, f"group id {gid} (a program makes at most {MAX_GROUPS} groups)")
        if not ranks or len(set(ranks)) != len(ranks) or not all(0 <= r < world for r in ranks):
            _refuse(rank, f"group {gid} has ranks that are not distinct ranks of the world of {world}")
        groups[gid] = (ranks, str(g.get("desc") or ""))
    if groups.get(0, ((), ""))[0] not in ((), tuple(range(world))):
        _refuse(rank, "group 0 is not the world")
    info = bundle.rank_info(rank)
    windowed = info.get("steps") is not None
    calls: list = []
    steps: dict[int, tuple[int, int | None]] = {}
    last_seq: dict[tuple, int] = {}
    for rec in bundle.events(rank):
        kind = type(rec)
        if kind is Collective or kind is PointToPoint:
            _check_call(rank, rec, groups)
            key = (rec.group,) if kind is Collective else (rec.group, ops.receives(rec.op), rec.peer)
            if rec.seq <= last_seq.get(key, -1):
                _refuse(rank, f"{rec.op} on group {rec.group} has sequence number {rec.seq} after {last_seq[key]}")
            last_seq[key] = rec.seq
            calls.append(rec)
            if len(calls) > MAX_CALLS:
                _refuse(rank, f"over {MAX_CALLS} calls")
        elif kind is Step:
            if not _int(rec.step) or not 0 <= rec.step < MAX_CALLS:
                _refuse(rank, f"step {quoted(rec.step)}")
            if rec.end_ns is not None and rec.end_ns < rec.start_ns:
                _refuse(rank, f"step {rec.step} has a negative duration")
            steps[rec.step] = (rec.start_ns, rec.end_ns)
    if not calls:
        raise UsageError(f"rank {rank} made no calls in the recording: there is no program to run")
    for rec in calls:
        if not _int(rec.step) or not 0 <= rec.step < MAX_CALLS:
            _refuse(rank, f"{rec.op} (group {rec.group}, seq {rec.seq}) is in step {quoted(rec.step)}")
    first = min(min(steps, default=calls[0].step), calls[0].step)
    actions = _actions(rank, calls, steps, first)
    start = steps[first][0] if first in steps else actions[0].at_ns
    start = min(start, actions[0].at_ns)
    held, cursor = 0, start
    for a in actions:
        gap = a.at_ns - cursor
        if gap > MAX_GAP_NS:
            _refuse(rank, f"{gap / 1e9:.0f} s of compute before its {a.kind} at recorded {a.at_ns} ns "
                          f"(at most {MAX_GAP_NS // 10**9} s)")
        held += max(0, gap)
        cursor = max(cursor, a.back_ns)
    if held > MAX_HELD_NS:
        _refuse(rank, f"{held / 3.6e12:.0f} h of compute in all (at most {MAX_HELD_NS / 3.6e12:.0f} h)")
    return Program(rank=rank, world_size=world, groups=groups, last_gid=max(groups, default=0), calls=tuple(calls),
                   actions=tuple(actions), first_step=first, start_ns=start, windowed=windowed, held_ns=held)


def _actions(rank: int, calls: list, steps: dict, first: int) -> list[Action]:
    """Calls and step ends in the order made; each asynchronous call's wait() before the
    first of them that began after the call completed (the recording has its completion,
    on CPU not the wait itself: the wait is put where the call had completed)."""
    main: list[Action] = []
    step = first
    for i, rec in enumerate(calls):
        while step < rec.step:
            main.append(_step_end(steps, step, main, rec.start_ns))
            step += 1
        back = rec.issued_ns if rec.async_op and rec.issued_ns is not None else rec.end_ns
        main.append(Action(kind="call", index=i, at_ns=rec.start_ns, back_ns=rec.start_ns if back is None else back))
    last = max(steps, default=step)
    while step <= last:
        if steps.get(step, (None, None))[1] is None:
            break  # the recording ends inside this step
        main.append(_step_end(steps, step, main, None))
        step += 1
    reach, top = [], None  # the latest recorded time reached by each action, for bisection
    for a in main:
        top = a.at_ns if top is None else max(top, a.at_ns)
        reach.append(top)
    before: dict[int, list[Action]] = {}
    for j, a in enumerate(main):
        rec = calls[a.index] if a.kind == "call" else None
        if rec is None or not rec.async_op or rec.end_ns is None:
            continue
        at = bisect_left(reach, rec.end_ns, lo=j + 1)
        before.setdefault(at, []).append(Action(kind="wait", index=a.index, at_ns=rec.end_ns, back_ns=rec.end_ns))
    out: list[Action] = []
    for j in range(len(main) + 1):
        out.extend(sorted(before.get(j, ()), key=lambda w: w.at_ns))
        if j < len(main):
            out.append(main[j])
    return out


def _step_end(steps: dict, step: int, made: list, next_start: int | None) -> Action:
    """Step `step` ends: at its Step record's end, else where the next call began, else
    where the last action returned."""
    end = steps.get(step, (None, None))[1]
    if end is None:
        end = next_start if next_start is not None else (made[-1].back_ns if made else 0)
    return Action(kind="step", index=step, at_ns=end, back_ns=end)
