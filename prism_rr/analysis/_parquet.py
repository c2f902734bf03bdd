"""A bundle as Parquet tables, for DuckDB, pandas, Spark or any engine that reads Parquet:
a bundle too big to analyse in one process is queried column by column instead.

DIR/calls/ranks-A-B.parquet    one row per call per rank of ranks A..B: rank, kind, group,
                               seq, op, step, peer, root, reduce_op, tag, bytes, out_bytes,
                               shapes, dtypes, async, start_ns, end_ns, issued_ns,
                               duration_ns, stack
DIR/compute/ranks-A-B.parquet  one row per compute span: rank, step, name (null: the time
                               between calls), start_ns, end_ns, duration_ns
DIR/steps.parquet    one row per step per rank: rank, step, start_ns, end_ns, duration_ns, mem_peak
                     (the step a run failed or hung in, where the rank never ended it: from
                     its first record in it, end_ns, duration_ns and mem_peak null)
DIR/groups.parquet   one row per process group: group, name, backend, size, ranks

The two large tables are partitioned by rank range, a file per RANKS_A_FILE ranks, each
rank's rows in time order (so by step): an engine reads the footers, then only the files
and row groups whose rank and step statistics a query's filter can match. Times are ns
since the first recorded event, on rank 0's clock (each rank's estimated offset removed),
as in the Chrome export. Rows are written in row groups as ranks are read: no table is
ever whole in memory. Needs pyarrow (`pip install 'prism-rr[parquet]'`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from prism_rr.errors import UsageError
from prism_rr.format.facts import failed_steps
from prism_rr.format.reader import Bundle
from prism_rr.format.records import Collective, Compute, PointToPoint, Step
from prism_rr.analysis._build import clock_offsets
from prism_rr.analysis._steps import OpenSteps

# Deferred imports: pyarrow (an optional extra, `prism-rr[parquet]`), only when a Parquet export runs.

__all__ = ["PARQUET_TABLES", "export_parquet"]

ROW_GROUP = 65_536
RANKS_A_FILE = 1024  # ranks in one file of a partitioned table
PARTITIONED = ("calls", "compute")  # the tables written as a directory of files by rank range

# name -> (column, arrow type name), in column order
PARQUET_TABLES: dict[str, tuple[tuple[str, str], ...]] = {
    "calls": (("rank", "int32"), ("kind", "string"), ("group", "int32"), ("seq", "int64"), ("op", "string"),
              ("step", "int32"), ("peer", "int32"), ("root", "int32"), ("reduce_op", "string"), ("tag", "int64"),
              ("bytes", "int64"), ("out_bytes", "int64"), ("shapes", "string"), ("dtypes", "string"),
              ("async", "bool"), ("start_ns", "int64"), ("end_ns", "int64"), ("issued_ns", "int64"),
              ("duration_ns", "int64"), ("stack", "string")),
    "compute": (("rank", "int32"), ("step", "int32"), ("name", "string"), ("start_ns", "int64"),
                ("end_ns", "int64"), ("duration_ns", "int64")),
    "steps": (("rank", "int32"), ("step", "int32"), ("start_ns", "int64"), ("end_ns", "int64"),
              ("duration_ns", "int64"), ("mem_peak", "int64")),
    "groups": (("group", "int32"), ("name", "string"), ("backend", "string"), ("size", "int32"),
               ("ranks", "list<int32>")),
}


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise UsageError("export --format parquet needs pyarrow: pip install 'prism-rr[parquet]'") from None
    return pyarrow, pyarrow.parquet


class _Table:
    """One Parquet file written a row group at a time."""

    def __init__(self, pa, pq, path: Path, columns: tuple[tuple[str, str], ...]):
        types = {"int32": pa.int32(), "int64": pa.int64(), "string": pa.string(), "bool": pa.bool_(),
                 "list<int32>": pa.list_(pa.int32())}
        self.pa = pa
        self.schema = pa.schema([(name, types[t]) for name, t in columns])
        self.names = [name for name, _ in columns]
        self.cols: list[list] = [[] for _ in columns]
        self.rows = 0
        self.path = path
        self.tmp = path.with_name(path.name + ".partial")
        self.writer = pq.ParquetWriter(self.tmp, self.schema, compression="zstd")

    def add(self, *row) -> None:
        for col, v in zip(self.cols, row):
            col.append(v)
        if len(self.cols[0]) >= ROW_GROUP:
            self.flush()

    def flush(self) -> None:
        if self.cols[0]:
            self.rows += len(self.cols[0])
            self.writer.write_table(self.pa.Table.from_arrays(
                [self.pa.array(c, type=f.type) for c, f in zip(self.cols, self.schema)], schema=self.schema))
            self.cols = [[] for _ in self.cols]

    def abandon(self) -> None:
        self.writer.close()
        self.tmp.unlink(missing_ok=True)

    def close(self) -> int:
        self.flush()
        self.writer.close()
        os.replace(self.tmp, self.path)
        return self.rows


def export_parquet(
    bundle: Bundle,
    out_dir: str | os.PathLike,
    *,
    ranks: list[int] | None = None,
    steps: tuple[int, int] | None = None,
    progress=None,
) -> dict[str, int]:
    """Write `bundle` (optionally some ranks, steps a..b) as Parquet tables into `out_dir`;
    returns the rows written per table. `progress(done, total)` is called as ranks are read."""
    pa, pq = _pyarrow()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    recorded = bundle.recorded_ranks
    chosen = recorded if ranks is None else [r for r in ranks if r in set(recorded)]
    offsets = clock_offsets(bundle, chosen)
    sums = bundle.summaries["ranks"]
    firsts = [sums[r]["t_first"] - offsets[r] for r in chosen if sums.get(r, {}).get("t_first") is not None]
    t0 = min(firsts) if firsts else 0
    _clear_parts(out)
    tables = {name: _Table(pa, pq, out / f"{name}.parquet", cols) for name, cols in PARQUET_TABLES.items()
              if name not in PARTITIONED}
    step_rows = tables["steps"]
    parts = _Parts(pa, pq, out)
    failed = frozenset(failed_steps(bundle))
    try:
        for i, rank in enumerate(chosen):
            calls, compute = parts.at(chosen[i - i % RANKS_A_FILE: i - i % RANKS_A_FILE + RANKS_A_FILE])
            _write_rank(bundle, rank, offsets[rank] + t0, steps, failed, calls, compute, step_rows)
            if progress is not None:
                progress(i + 1, len(chosen))
        for g in bundle.groups:
            tables["groups"].add(g["id"], g["name"], g["backend"], len(g["ranks"]), list(g["ranks"]))
    except BaseException:
        for t in (*tables.values(), *parts.open):
            t.abandon()
        raise
    return {**parts.close(), **{name: t.close() for name, t in tables.items()}}


def _clear_parts(out: Path) -> None:
    """The partitioned tables' folders made, emptied of another export's files (its
    ranks were others)."""
    for name in PARTITIONED:
        (out / name).mkdir(exist_ok=True)
        for old in (out / name).glob("ranks-*.parquet"):
            old.unlink()


def _write_rank(bundle: Bundle, rank: int, zero: int, steps, failed: frozenset[int], calls: _Table,
                compute: _Table, step_rows: _Table) -> None:
    """One rank's rows of the calls, compute and steps tables, times from `zero`; a step
    it failed or hung in, and never ended, a row without an end."""
    unended = OpenSteps()
    for r in bundle.events(rank, steps=steps):
        cls = type(r)
        if r.step in failed:
            unended.see(r)
        start = r.start_ns - zero
        end = None if r.end_ns is None else r.end_ns - zero
        dur = None if r.end_ns is None else r.end_ns - r.start_ns
        if cls is Collective or cls is PointToPoint:
            issued = None if r.issued_ns is None else r.issued_ns - zero
            stack = " <- ".join(r.stack) if r.stack else None
            if cls is Collective:
                calls.add(rank, "collective", r.group, r.seq, r.op, r.step, None, r.root, r.reduce_op, None,
                          r.in_bytes, r.out_bytes, json.dumps([list(s) for s in r.in_shapes]),
                          json.dumps(list(r.in_dtypes)), r.async_op, start, end, issued, dur, stack)
            else:
                calls.add(rank, "p2p", r.group, r.seq, r.op, r.step, r.peer, None, None, r.tag,
                          r.nbytes, None, json.dumps([list(s) for s in r.shapes]),
                          json.dumps(list(r.dtypes)), r.async_op, start, end, issued, dur, stack)
        elif cls is Compute:
            compute.add(rank, r.step, r.name, start, end, dur)
        elif cls is Step:
            step_rows.add(rank, r.step, start, end, dur, r.mem_peak)
    for step, first, _ in unended.open():
        step_rows.add(rank, step, first - zero, None, None, None)


class _Parts:
    """The partitioned tables' files: one pair (calls, compute) open at a time, for the
    block of ranks being read."""

    def __init__(self, pa, pq, out: Path):
        self.pa, self.pq, self.out = pa, pq, out
        self.block: tuple[int, int] | None = None
        self.open: tuple = ()
        self.rows = {name: 0 for name in PARTITIONED}

    def at(self, block: list[int]) -> tuple:
        """The (calls, compute) tables of the block of ranks `block` (sorted)."""
        key = (block[0], block[-1])
        if key != self.block:
            self._close_block()
            self.block = key
            self.open = tuple(_Table(self.pa, self.pq, self.out / name / f"ranks-{key[0]}-{key[1]}.parquet",
                                     PARQUET_TABLES[name]) for name in PARTITIONED)
        return self.open

    def _close_block(self) -> None:
        for name, t in zip(PARTITIONED, self.open):
            self.rows[name] += t.close()
        self.open = ()

    def close(self) -> dict[str, int]:
        if self.block is None:  # no rank: empty files, so that a query over the directory still reads
            self.open = tuple(_Table(self.pa, self.pq, self.out / name / "ranks-none.parquet", PARQUET_TABLES[name])
                              for name in PARTITIONED)
        self._close_block()
        return dict(self.rows)
