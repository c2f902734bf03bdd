"""The bundle's summaries section as tables of int64 columns (FORMAT.md §4, format 1.1).

Format 1.0 held the step summaries as one msgpack map {step: {rank: [start, end, peak]}}:
four values a rank and step, so 8192 ranks of more than 128 steps passed the decode
budget that guards every reader against a zip bomb (2^22 values a frame) and such a
bundle could not be opened at all. Here each column is one msgpack bin of little-endian
int64s: a table costs a reader a handful of values and its bytes, which the ratio budget
already bounds (layout.ratio_limit), and is checked whole with numpy, never row by row.

Readers see the same shapes as before, `{step: {rank: (start, end, peak)}}` and `{rank:
{events, ...}}`, as read-only mappings over the columns (StepTable, RankTable): a consumer
of Bundle.summaries needs no change, and nothing is expanded into Python objects until
it is asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain
from operator import itemgetter, methodcaller
from typing import Any, Iterator

import numpy as np

from prism_rr.errors import FormatError
from prism_rr.format import layout

__all__ = ["NIL", "DeviceStepRows", "DeviceStepTable", "RankTable", "StepRows", "StepTable", "encode",
           "read_device_step_table", "read_rank_table", "read_step_table"]

NIL = -(1 << 63)  # a nil value in an int64 column
MAX_TIME = 1 << 62  # as codec.MAX_TIME: times of records lie within +-2^62 ns
MIN_STEP, MAX_STEP = -(1 << 31), (1 << 31) - 1

# Keys of the summaries map in format 1.1 (1.0 has "ranks" and "steps" maps instead).
RANK_TABLE, STEP_TABLE = layout.RANK_TABLE, layout.STEP_TABLE
DEVICE_STEP_TABLE = layout.DEVICE_STEP_TABLE
STEP_COLUMNS = ("step", "rank", "start_ns", "end_ns", "mem_peak")
# format 1.3: a step's device times (DeviceTime records of steps), nil where not resolved
DEVICE_STEP_COLUMNS = ("step", "rank", "dev_start_ns", "dev_end_ns")
# A rank table's columns beside "rank" and its map "kinds" {kind: column}: the keys of a
# rank's summary, with what a value may be (counts are never negative; "opt": nil too).
RANK_COLUMNS = {
    "events": "count", "chunks": "count", "t_first": "opt_time", "t_last": "opt_time",
    "dropped": "count", "open": "count", "mem_peak": "opt_count", "truncated": "bool",
    "lost_bytes": "count",
}
_LE = np.dtype("<i8")


def _column(values) -> bytes:
    try:
        return np.asarray(values, dtype=_LE).tobytes()
    except OverflowError:  # a stranger's chunk summary: the reader would refuse it too
        raise FormatError("pack: a rank's summary holds an integer beyond int64") from None


class _Rows:
    """Rows as pack meets them, `(rank, (row, ...))` as a chunk summary holds them, made
    int64 column arrays every BLOCK rows: 8192 ranks of 2000 steps are 16M rows,
    gigabytes as Python tuples. A subclass says how a block of rows becomes columns."""

    BLOCK = 1 << 18
    COLUMNS = 0  # columns `arrays` returns, the rank's among them

    def __init__(self):
        self._pending: list[tuple[int, tuple]] = []
        self._rows = 0
        self._blocks: list[tuple[np.ndarray, ...]] = []

    def __bool__(self) -> bool:
        return bool(self._rows or self._blocks)

    def add(self, rank: int, rows: tuple) -> None:
        self._pending.append((rank, rows))
        self._rows += len(rows)
        if self._rows >= self.BLOCK:
            self._compact()

    def _compact(self) -> None:
        pending, self._pending, self._rows = self._pending, [], 0
        if not pending:
            return
        rows = list(chain.from_iterable(r for _, r in pending))
        try:
            rank = np.repeat(np.array([r for r, _ in pending], dtype=np.int64), [len(r) for _, r in pending])
            self._blocks.append(self._columns(rows, rank))
        except OverflowError:
            raise FormatError(f"pack: a chunk summary's {self.WHAT} hold an integer beyond int64") from None

    def _columns(self, rows: list, rank: np.ndarray) -> tuple[np.ndarray, ...]:
        raise NotImplementedError

    def arrays(self) -> tuple[np.ndarray, ...]:
        """Every row's columns, in the order met."""
        self._compact()
        if not self._blocks:
            return tuple(np.zeros(0, np.int64) for _ in range(self.COLUMNS))
        return tuple(np.concatenate(c) for c in zip(*self._blocks))


class StepRows(_Rows):
    """The chunks' Step rows, `(step, start_ns, end_ns, mem_peak)`; `arrays` gives step,
    rank, start_ns, end_ns, mem_peak."""

    COLUMNS = 5
    WHAT = "step rows"

    def _columns(self, rows: list, rank: np.ndarray) -> tuple[np.ndarray, ...]:
        if not set(map(type, rows)) <= {tuple} or not set(map(len, rows)) <= {4}:
            raise FormatError("pack: a chunk summary's step rows are not [step, start, end, peak]")
        flat = list(chain.from_iterable(rows))
        if set(map(type, flat)) <= {int}:  # no nil: one conversion of every value
            step, start, end, peak = np.array(flat, dtype=np.int64).reshape(-1, 4).T
        else:
            step, start, end, peak = zip(*rows)
            if not (set(map(type, step)) | set(map(type, start)) <= {int}
                    and set(map(type, end)) | set(map(type, peak)) <= {int, type(None)}):
                raise FormatError("pack: a chunk summary's step rows hold something other than integers")
            step, start, end, peak = (np.array([NIL if v is None else v for v in c], dtype=np.int64)
                                      for c in (step, start, end, peak))
        _check_steps(step, rank, start, end, peak, None, "pack", ordered=False)
        return step, rank, start, end, peak


class DeviceStepRows(_Rows):
    """The chunks' device step rows, `(step, dev_start_ns, dev_end_ns)`
    (codec.S_DEVICE_STEPS); `arrays` gives step, rank, dev_start_ns, dev_end_ns."""

    COLUMNS = len(DEVICE_STEP_COLUMNS)
    WHAT = "device step rows"

    def _columns(self, rows: list, rank: np.ndarray) -> tuple[np.ndarray, ...]:
        if not set(map(type, rows)) <= {tuple} or not set(map(len, rows)) <= {3}:
            raise FormatError("pack: a chunk summary's device step rows are not [step, dev_start, dev_end]")
        step, start, end = zip(*rows) if rows else ((), (), ())
        if not (set(map(type, step)) <= {int} and set(map(type, start)) | set(map(type, end)) <= {int, type(None)}):
            raise FormatError("pack: a chunk summary's device step rows hold something other than integers")
        step = np.array(step, dtype=np.int64)
        start, end = (np.array([NIL if v is None else v for v in c], dtype=np.int64) for c in (start, end))
        _check_device_steps(step, rank, start, end, None, "pack", ordered=False)
        return step, rank, start, end


def _first_set(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per run of rows beginning at `starts`, its first value that is not nil (else nil)."""
    n = len(values)
    index = np.where(values != NIL, np.arange(n), n)
    first = np.minimum.reduceat(index, starts)
    return np.where(first < n, values[np.minimum(first, n - 1)], NIL)


def _device_step_table(rows: DeviceStepRows) -> dict:
    """Rows by (step, rank), once each; where a rank has a step twice (a DeviceTime
    written in two pieces) each column takes its first value that is set, as readers of
    the records do."""
    step, rank, start, end = rows.arrays()
    order = np.lexsort((rank, step))
    step, rank, start, end = step[order], rank[order], start[order], end[order]
    new = np.ones(len(step), dtype=bool)
    new[1:] = (step[1:] != step[:-1]) | (rank[1:] != rank[:-1])
    starts = np.flatnonzero(new)
    return {"step": _column(step[starts]), "rank": _column(rank[starts]),
            "dev_start_ns": _column(_first_set(start, starts)), "dev_end_ns": _column(_first_set(end, starts))}


def encode(rank_sums: dict[int, dict], step_rows: StepRows, device_rows: DeviceStepRows | None = None) -> dict:
    """The summaries map of format 1.1: the ranks' summaries (pack's {rank: {events,
    chunks, kinds, ...}}) and the chunks' Step rows; where a rank has a step twice the
    later row counts, as it did when a map held them. With device step rows (1.3), the
    device step table too. FormatError on a value a reader would refuse (pack reads a
    stranger's spools too)."""
    ranks = sorted(rank_sums)
    sums = list(map(rank_sums.__getitem__, ranks))
    rank_table: dict[str, Any] = {"rank": _column(ranks)}
    for key, what in RANK_COLUMNS.items():
        col = list(map(itemgetter(key), sums))
        if what != "count" and what != "bool" and None in col:
            col = [NIL if v is None else v for v in col]
        rank_table[key] = _column(col)
    kinds = list(map(itemgetter("kinds"), sums))
    rank_table["kinds"] = {k: _column(list(map(methodcaller("get", k, 0), kinds)))
                           for k in sorted(set(chain.from_iterable(kinds)))}
    step, rank, start, end, peak = step_rows.arrays()
    # rows by (step, rank), the last of each pair (a stable sort keeps the order met)
    order = np.lexsort((rank, step))
    step, rank = step[order], rank[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = (step[1:] != step[:-1]) | (rank[1:] != rank[:-1])
    keep = order[last]
    step_table = {"step": _column(step[last]), "rank": _column(rank[last]),
                  "start_ns": _column(start[keep]), "end_ns": _column(end[keep]),
                  "mem_peak": _column(peak[keep])}
    out = {RANK_TABLE: rank_table, STEP_TABLE: step_table}
    if device_rows:
        out[DEVICE_STEP_TABLE] = _device_step_table(device_rows)
    return out


# --- reading --------------------------------------------------------------------------


def _columns(table, names, where: str, what: str) -> tuple[int, dict[str, np.ndarray]]:
    """The int64 columns `names` of a table map, all of one length; FormatError otherwise."""
    if type(table) is not dict:
        raise FormatError(f"{where}: the {what} is not a map")
    out = {}
    n = None
    for name in names:
        raw = table.get(name)
        if type(raw) is not bytes:
            raise FormatError(f"{where}: the {what} lacks its column {name!r} (or it is not bytes)")
        if len(raw) % 8:
            raise FormatError(f"{where}: the {what}'s column {name!r} is not a whole number of int64s")
        if n is None:
            n = len(raw) // 8
        elif len(raw) // 8 != n:
            raise FormatError(f"{where}: the {what}'s columns differ in length ({name!r}: "
                              f"{len(raw) // 8} rows, others {n})")
        out[name] = np.frombuffer(raw, dtype=_LE)
    return n or 0, out


def _fail(where: str, what: str) -> None:
    raise FormatError(f"{where}: {what}")


def _check_steps(step, rank, start, end, peak, world: int | None, where: str, *, ordered: bool) -> None:
    if len(step) and not (MIN_STEP <= step.min() and step.max() <= MAX_STEP):
        _fail(where, "a step summary's step is out of bounds (int32)")
    if len(rank) and not (0 <= rank.min() and (world is None or rank.max() < world)):
        _fail(where, f"a step summary names a rank that is not one below the world size {world}")
    if len(start) and not (-MAX_TIME <= start.min() and start.max() <= MAX_TIME):
        _fail(where, "a step summary's start time is nil or out of bounds (+-2^62 ns)")
    given = end[end != NIL]
    if len(given) and not (-MAX_TIME <= given.min() and given.max() <= MAX_TIME):
        _fail(where, "a step summary's end time is out of bounds (+-2^62 ns)")
    if len(peak) and not ((peak == NIL) | (peak >= 0)).all():
        _fail(where, "a step summary's mem_peak is negative")
    if ordered and len(step) > 1:
        # one key per row: steps are int32 and ranks below 2^20 (layout.MAX_WORLD)
        key = (step << 21) + rank
        if not (key[1:] > key[:-1]).all():
            _fail(where, "the step table's rows are not in order of (step, rank), each once")


def _check_device_steps(step, rank, start, end, world: int | None, where: str, *, ordered: bool) -> None:
    if len(step) and not (MIN_STEP <= step.min() and step.max() <= MAX_STEP):
        _fail(where, "a device step summary's step is out of bounds (int32)")
    if len(rank) and not (0 <= rank.min() and (world is None or rank.max() < world)):
        _fail(where, f"a device step summary names a rank that is not one below the world size {world}")
    for col in (start, end):
        given = col[col != NIL]
        if len(given) and not (-MAX_TIME <= given.min() and given.max() <= MAX_TIME):
            _fail(where, "a device step summary's time is out of bounds (+-2^62 ns)")
    if ordered and len(step) > 1:
        key = (step << 21) + rank
        if not (key[1:] > key[:-1]).all():
            _fail(where, "the device step table's rows are not in order of (step, rank), each once")


def read_device_step_table(table, world: int, where: str) -> "DeviceStepTable":
    """The device step times of a 1.3 bundle, checked whole as the step table is (times
    nil or within +-2^62); FormatError on anything else."""
    _, c = _columns(table, DEVICE_STEP_COLUMNS, where, "device step table")
    _check_device_steps(c["step"], c["rank"], c["dev_start_ns"], c["dev_end_ns"], world, where, ordered=True)
    return DeviceStepTable(c["step"], c["rank"], c["dev_start_ns"], c["dev_end_ns"])


def read_step_table(table, world: int, where: str) -> "StepTable":
    """The step summaries of a 1.1 bundle, checked whole: every column present and of
    one length, steps int32, ranks below `world`, start times set and within +-2^62,
    end times nil or within it, peaks nil or non-negative, rows in order of (step, rank)
    with no pair twice. FormatError on anything else."""
    _, c = _columns(table, STEP_COLUMNS, where, "step table")
    _check_steps(c["step"], c["rank"], c["start_ns"], c["end_ns"], c["mem_peak"], world, where, ordered=True)
    return StepTable(c["step"], c["rank"], c["start_ns"], c["end_ns"], c["mem_peak"])


def read_rank_table(table, world: int, where: str) -> "RankTable":
    """The ranks' summaries of a 1.1 bundle, checked whole (the types a 1.0 reader checks
    value by value: counts non-negative, times nil or int, `truncated` 0 or 1, ranks
    distinct, ascending and below `world`). FormatError on anything else."""
    n, c = _columns(table, ("rank", *RANK_COLUMNS), where, "rank table")
    rank = c["rank"]
    if n and not (0 <= rank.min() and rank.max() < world and (rank[1:] > rank[:-1]).all()):
        _fail(where, f"the rank table's ranks are not distinct ranks below {world}, ascending")
    for name, what in RANK_COLUMNS.items():
        col = c[name]
        if not n:
            continue
        if what == "count" and col.min() < 0:
            _fail(where, f"the rank table's {name!r} is negative")
        if what == "opt_count" and not ((col == NIL) | (col >= 0)).all():
            _fail(where, f"the rank table's {name!r} is negative")
        if what == "bool" and not ((col == 0) | (col == 1)).all():
            _fail(where, f"the rank table's {name!r} is not 0 or 1")
    kinds = table.get("kinds", {})
    if type(kinds) is not dict or not all(type(k) is int for k in kinds):
        _fail(where, "the rank table's kinds are not a map of record kinds")
    counts = {}
    for kind, raw in kinds.items():
        m, col = _columns({"kind": raw}, ("kind",), where, f"rank table's kind {kind}")
        if m != n:
            _fail(where, f"the rank table's kind {kind} has {m} rows, its ranks {n}")
        if n and col["kind"].min() < 0:
            _fail(where, f"the rank table's count of kind {kind} is negative")
        counts[kind] = col["kind"]
    return RankTable(c, counts)


def _opt(values: list) -> list:
    return [None if v == NIL else v for v in values]


class StepRow(Mapping):
    """One step's {rank: (start_ns, end_ns, mem_peak)}: rows lo..hi of a StepTable; each
    value None where the table holds nil (a device step row's: (dev_start_ns, dev_end_ns),
    each None where not resolved)."""

    __slots__ = ("_ranks", "_cols")

    def __init__(self, ranks, *cols):
        self._ranks, self._cols = ranks, cols

    def __getitem__(self, rank) -> tuple:
        if type(rank) is not int:
            raise KeyError(rank)
        i = int(np.searchsorted(self._ranks, rank))
        if i == len(self._ranks) or self._ranks[i] != rank:
            raise KeyError(rank)
        return tuple(None if (v := int(c[i])) == NIL else v for c in self._cols)

    def __contains__(self, rank) -> bool:
        try:
            self[rank]
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[int]:
        return iter(self._ranks.tolist())

    def __len__(self) -> int:
        return len(self._ranks)

    def items(self):
        return list(zip(self._ranks.tolist(), self.values()))

    def values(self):
        return list(zip(*(_opt(c.tolist()) for c in self._cols)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.items())!r})"


class DeviceStepRow(StepRow):
    """One step's {rank: (dev_start_ns, dev_end_ns)}, each None where not resolved."""

    __slots__ = ()


class StepTable(Mapping):
    """{step: StepRow}, steps ascending, over the columns of a step table (step, rank,
    then the row's columns)."""

    ROW = StepRow

    def __init__(self, step, rank, *cols):
        cut = np.flatnonzero(step[1:] != step[:-1]) + 1
        bounds = [0, *cut.tolist(), len(step)]
        steps = step[bounds[:-1]].tolist() if len(step) else []
        self._at = {s: (bounds[i], bounds[i + 1]) for i, s in enumerate(steps)}
        self._cols = (rank, *cols)

    def __getitem__(self, step) -> StepRow:
        return self.ROW(*self.arrays(step))

    def arrays(self, step) -> tuple[np.ndarray, ...]:
        """Step `step`'s rows as columns: the ranks ascending, then each of the row's
        (int64, NIL where nil)."""
        lo, hi = self._at[step]
        return tuple(c[lo:hi] for c in self._cols)

    def __contains__(self, step) -> bool:
        return step in self._at

    def __iter__(self) -> Iterator[int]:
        return iter(self._at)

    def __len__(self) -> int:
        return len(self._at)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {len(self)} steps, {len(self._cols[0])} rows>"


class DeviceStepTable(StepTable):
    """{step: DeviceStepRow}, steps ascending, over the columns of a device step table."""

    ROW = DeviceStepRow


class RankTable(Mapping):
    """{rank: its summary (a new dict each time)}, ranks ascending, over a rank table."""

    def __init__(self, columns: dict[str, np.ndarray], kinds: dict[int, np.ndarray]):
        self._cols = columns
        self._kinds = kinds
        self._row = {r: i for i, r in enumerate(columns["rank"].tolist())}

    def __getitem__(self, rank) -> dict:
        i = self._row[rank]
        c = self._cols
        out: dict[str, Any] = {}
        for name, what in RANK_COLUMNS.items():
            v = int(c[name][i])
            if what == "bool":
                v = bool(v)
            elif what != "count" and v == NIL:
                v = None
            out[name] = v
        out["kinds"] = {k: n for k, col in self._kinds.items() if (n := int(col[i]))}
        return out

    def __contains__(self, rank) -> bool:
        return rank in self._row

    def __iter__(self) -> Iterator[int]:
        return iter(self._row)

    def __len__(self) -> int:
        return len(self._row)

    def column(self, name: str) -> np.ndarray:
        """One column (int64, NIL where nil), a row per rank in the order `iter` gives them."""
        return self._cols[name]

    def total(self, name: str) -> int:
        """The sum of one count column over every rank (events, dropped, ...)."""
        return sum(self._cols[name].tolist())  # Python ints: a stranger's huge counts cannot wrap

    def __repr__(self) -> str:
        return f"<RankTable of {len(self)} ranks>"
