"""Chakra execution traces (mlcommons/chakra, schema/protobuf/et_def.proto) for simulators
such as ASTRA-sim: one `PREFIX.<rank>.et` per rank and `PREFIX.comm_groups.json`.

A `.et` file is a stream of varint-length-delimited protobuf messages: one GlobalMetadata,
then one Node per compute span or call, in the rank's order, each depending (ctrl_deps)
on the one before it. Compute nodes carry their measured durations; communication nodes
carry comm_type, comm_size, pg_name (and comm_src, comm_dst, comm_tag for point-to-point).
The protobuf wire format is written here by hand from the schema's field numbers, so
exporting needs no protobuf package.

The groups file maps each group id (the nodes' pg_name) to its members' ranks, the shape
ASTRA-sim's --comm-group-configuration reads.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

from prism_rr.format import ops
from prism_rr.format.reader import Bundle
from prism_rr.format.records import Collective, Compute, PointToPoint
from prism_rr.analysis._build import clock_offsets

__all__ = ["CHAKRA_VERSION", "export_chakra"]

CHAKRA_VERSION = "0.0.4"  # GlobalMetadata.version: the schema the nodes follow

# et_def.proto: NodeType
COMP_NODE, COMM_SEND_NODE, COMM_RECV_NODE, COMM_COLL_NODE = 4, 5, 6, 7
# et_def.proto: CollectiveCommType, by the form of an op in format/ops.py (how its outputs
# follow from its members' inputs): ALL_REDUCE 0, REDUCE 1, ALL_GATHER 2, GATHER 3,
# SCATTER 4, BROADCAST 5, ALL_TO_ALL 6, REDUCE_SCATTER 7, BARRIER 9
_COMM_TYPE_OF_FORM = {
    "reduce_all": 0, "reduce_root": 1, "gather_list": 2, "gather_list_by_rank": 2, "gather_tensor": 2,
    "gather_root": 3, "scatter_root": 4, "copy_root": 5, "all_to_all": 6, "all_to_all_single": 6,
    "reduce_scatter_list": 7, "reduce_scatter_tensor": 7, "none": 9,
}

# Field numbers. Node: id 1, name 2, type 3, ctrl_deps 4, data_deps 5, start_time_micros 6,
# duration_micros 7, inputs 8, outputs 9, attr 10. IOInfo: values 1, shapes 2, types 3.
# GlobalMetadata: version 1, attr 2. AttributeProto: name 1, and one value of the oneof:
_ATTR_INT32, _ATTR_INT64, _ATTR_BOOL, _ATTR_STRING = 7, 9, 27, 29


_SMALL = [bytes((i,)) for i in range(128)]


def _varint(n: int) -> bytes:
    if 0 <= n < 128:
        return _SMALL[n]
    if n < 0:  # int32/int64: two's complement, always ten bytes
        n += 1 << 64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@lru_cache(maxsize=None)
def _tag(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _uint(field: int, n: int) -> bytes:
    """A varint field, left out when 0 (proto3's default)."""
    return _tag(field, 0) + _varint(n) if n else b""


def _bytes(field: int, data: bytes) -> bytes:
    return _tag(field, 2) + _varint(len(data)) + data


def _str(field: int, text: str) -> bytes:
    return _bytes(field, text.encode()) if text else b""


@lru_cache(maxsize=4096)  # most attributes repeat: is_cpu_op, pg_name, comm_type, sizes
def _attr(name: str, kind: int, value) -> bytes:
    """Field 10 of a Node (2 of GlobalMetadata): an AttributeProto. A oneof member is
    written even when it is 0: its presence is the value."""
    if kind == _ATTR_STRING:
        body = _bytes(kind, value.encode())
    else:
        body = _tag(kind, 0) + _varint(int(value))
    return _bytes(1, name.encode()) + body


def _node(nid: int, name: str, ntype: int, dep: int | None, start_us: int, dur_us: int,
          inputs: bytes, attrs: list[bytes]) -> bytes:
    body = _uint(1, nid) + _str(2, name) + _uint(3, ntype)
    if dep is not None:  # packed repeated uint64
        body += _bytes(4, _varint(dep))
    body += _uint(6, start_us) + _uint(7, dur_us)
    if inputs:
        body += _bytes(8, inputs)
    for a in attrs:
        body += _bytes(10, a)
    return body


@lru_cache(maxsize=4096)
def _io(shapes, dtypes) -> bytes:
    return _str(2, json.dumps([list(s) for s in shapes])) + _str(3, json.dumps(list(dtypes)))


def _delimited(message: bytes) -> bytes:
    return _varint(len(message)) + message


def comm_type(op: str) -> int | None:
    """Chakra's CollectiveCommType of a collective op, or None where it has none."""
    o = ops.lookup(op)
    return None if o is None else _COMM_TYPE_OF_FORM.get(o.form)


def export_chakra(
    bundle: Bundle,
    prefix: str | os.PathLike,
    *,
    ranks: list[int] | None = None,
    steps: tuple[int, int] | None = None,
    progress=None,
) -> dict[str, int]:
    """Write PREFIX.<rank>.et for each recorded rank (or `ranks`; steps a..b) and
    PREFIX.comm_groups.json; returns counts: files, nodes, comp, comm, and `unmapped`
    (calls of an op Chakra has no type for, written as compute nodes). `progress(done,
    total)` is called as ranks are written."""
    prefix = str(prefix)
    recorded = bundle.recorded_ranks
    chosen = recorded if ranks is None else [r for r in ranks if r in set(recorded)]
    offsets = clock_offsets(bundle, chosen)
    sums = bundle.summaries["ranks"]
    firsts = [sums[r]["t_first"] - offsets[r] for r in chosen if sums.get(r, {}).get("t_first") is not None]
    t0 = min(firsts) if firsts else 0
    counts = {"files": 0, "nodes": 0, "comp": 0, "comm": 0, "unmapped": 0}
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    for i, rank in enumerate(chosen):
        _write_rank(bundle, rank, Path(f"{prefix}.{rank}.et"), offsets[rank] + t0, steps, counts)
        counts["files"] += 1
        if progress is not None:
            progress(i + 1, len(chosen))
    groups = {str(g["id"]): list(g["ranks"]) for g in bundle.groups}
    path = Path(f"{prefix}.comm_groups.json")
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(groups))
    os.replace(tmp, path)
    return counts


def _write_rank(bundle: Bundle, rank: int, path: Path, zero_ns: int, steps, counts: dict) -> None:
    """One rank's trace. Records are written when they complete, so they are put in start
    order first; a rank with no compute records (an imported dump) gets a compute node for
    each gap between its calls, so the simulator keeps the time between them."""
    recs = [r for r in bundle.events(rank, steps=steps)
            if (type(r) is Compute and r.name is None) or type(r) is Collective or type(r) is PointToPoint]
    recs.sort(key=lambda r: r.start_ns)
    gaps = not any(type(r) is Compute for r in recs)
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        meta = _str(1, CHAKRA_VERSION)
        meta += _bytes(2, _attr("source", _ATTR_STRING, "prism-rr"))
        meta += _bytes(2, _attr("rank", _ATTR_INT64, rank))
        meta += _bytes(2, _attr("world_size", _ATTR_INT64, bundle.world_size))
        f.write(_delimited(meta))
        nid, prev, last_end = 0, None, None

        def emit(name, ntype, start_ns, end_ns, inputs=b"", attrs=()):
            nonlocal nid, prev
            start_us = max(0, (start_ns - zero_ns) // 1000)
            dur_us = 0 if end_ns is None else max(0, round((end_ns - start_ns) / 1000))
            f.write(_delimited(_node(nid, name, ntype, prev, start_us, dur_us, inputs, list(attrs))))
            prev = nid
            nid += 1
            counts["nodes"] += 1

        for r in recs:
            cls = type(r)
            if cls is Compute:
                emit(f"compute step {r.step}", COMP_NODE, r.start_ns, r.end_ns,
                     attrs=[_attr("is_cpu_op", _ATTR_BOOL, False)])
                counts["comp"] += 1
                continue
            if gaps and last_end is not None and r.start_ns > last_end:
                emit(f"compute step {r.step}", COMP_NODE, last_end, r.start_ns,
                     attrs=[_attr("is_cpu_op", _ATTR_BOOL, False)])
                counts["comp"] += 1
            if r.end_ns is not None:
                last_end = r.end_ns if last_end is None else max(last_end, r.end_ns)
            common = [_attr("is_cpu_op", _ATTR_BOOL, False), _attr("pg_name", _ATTR_STRING, str(r.group))]
            if cls is Collective:
                kind = comm_type(r.op)
                name = f"{r.op} group {r.group} seq {r.seq}"
                if kind is None:
                    emit(name, COMP_NODE, r.start_ns, r.end_ns, _io(r.in_shapes, r.in_dtypes),
                         [_attr("is_cpu_op", _ATTR_BOOL, False)])
                    counts["unmapped"] += 1
                    continue
                emit(name, COMM_COLL_NODE, r.start_ns, r.end_ns, _io(r.in_shapes, r.in_dtypes),
                     [*common, _attr("comm_type", _ATTR_INT64, kind),
                      _attr("comm_size", _ATTR_INT64, r.in_bytes)])
            else:
                recv = ops.receives(r.op)
                src, dst = (r.peer, rank) if recv else (rank, r.peer)
                emit(f"{r.op} {'from' if recv else 'to'} {r.peer} group {r.group} seq {r.seq}",
                     COMM_RECV_NODE if recv else COMM_SEND_NODE, r.start_ns, r.end_ns, _io(r.shapes, r.dtypes),
                     [*common, _attr("comm_size", _ATTR_INT64, r.nbytes), _attr("comm_src", _ATTR_INT32, src),
                      _attr("comm_dst", _ATTR_INT32, dst), _attr("comm_tag", _ATTR_INT32, r.tag)])
            counts["comm"] += 1
    os.replace(tmp, path)
