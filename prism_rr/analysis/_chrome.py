"""Chrome trace event JSON (Perfetto, chrome://tracing), written as it is produced.

A process per rank; threads for steps, compute, operators and communication lanes
(overlapping calls of one rank go to separate lanes, since slices on one thread must
nest); flow arrows join the members of each collective and each send to its receive;
counters show memory. Where the bundle has device time (format 1.3), each rank also has
"device" threads: its steps and calls as the device passed them, placed on the host
timeline by the rank's device epoch (`otherData.device_clock` says which clock).
Events are written one at a time: the whole list never exists. A name ending in .gz
(or gzip=True) writes it gzipped: a trace of thousands of ranks is mostly repeated
keys, and Perfetto opens .json.gz as it is.
"""

from __future__ import annotations

import gzip as gz
import json
import os
from pathlib import Path
from typing import Any

from prism_rr.format import ops
from prism_rr.format.reader import Bundle
from prism_rr.format.facts import device_time_facts, failed_steps
from prism_rr.format.records import Collective, Compute, DeviceTime, Marker, Memory, PointToPoint, Step
from prism_rr.analysis._build import build_graph
from prism_rr.analysis._steps import OpenSteps

__all__ = ["export_chrome"]

_TID_STEPS, _TID_COMPUTE, _TID_OPS, _TID_DEVICE_STEPS, _TID_COMM, _TID_DEVICE = 1, 2, 3, 4, 10, 1000


def export_chrome(
    bundle: Bundle,
    out_path: str | os.PathLike,
    *,
    ranks: list[int] | None = None,
    steps: tuple[int, int] | None = None,
    gzip: bool | None = None,
    also: list[Bundle] = (),
) -> dict[str, int]:
    """Write `bundle` (optionally some ranks, steps a..b) as a Chrome trace, gzipped when
    `gzip` is true or, when None, when the name ends in .gz; returns counts. `also`: other
    attempts of the same restarted job (Bundle views of one file), written beside it on
    one timeline, a process per attempt and rank ("attempt 1, rank 0")."""
    views = [bundle, *also]
    graphs = [build_graph(b, steps=steps, ranks=ranks) for b in views]
    several = len(views) > 1
    t0 = min(g.t0_ns for g in graphs)
    out_path = Path(out_path)
    tmp = out_path.with_name(out_path.name + ".partial")
    counts = {"events": 0, "ranks": sum(len(g.ranks) for g in graphs), "flows": 0}
    if gzip is None:
        gzip = out_path.name.endswith(".gz")
    # gzip's level 6: a third of level 9's time for 7% more bytes
    f = gz.open(tmp, "wt", encoding="utf-8", compresslevel=6) if gzip else open(tmp, "w", encoding="utf-8")
    with f:
        f.write('{"displayTimeUnit": "ns", "otherData": ')
        other = {"world_size": bundle.world_size, "format": bundle.format_version, "recorded_ranks": graphs[0].ranks,
                 "clock": "rank 0's monotonic clock, from the first event"}
        device = device_time_facts(bundle)
        if device is not None:
            other["device_clock"] = (", ".join(device["clocks"]) + ": the device threads' times, each rank's "
                                     "placed by its device epoch's host time")
        if several:
            other["attempts"] = [b.attempt for b in views]
        f.write(json.dumps(other))
        f.write(', "traceEvents": [\n')
        first = [True]

        def emit(ev: dict[str, Any]) -> None:
            if first[0]:
                first[0] = False
            else:
                f.write(",\n")
            f.write(json.dumps(ev, separators=(",", ":")))
            counts["events"] += 1

        flows = [0]  # flow ids, unique across attempts
        stride = max(b.world_size for b in views)
        for i, (b, graph) in enumerate(zip(views, graphs)):
            _write_attempt(b, graph, emit, counts, flows, steps, t0, pid_base=i * stride,
                           label=f"attempt {b.attempt}, " if several else "")
        f.write("\n]}\n")
    os.replace(tmp, out_path)
    return counts


def _write_attempt(bundle: Bundle, graph, emit, counts: dict, flows: list, steps, t0: int, *, pid_base: int,
                   label: str) -> None:
    """One attempt's ranks, each a process `pid_base + rank` named `label` + "rank R"."""
    failed = frozenset(failed_steps(bundle))
    flow_ids, roles = _flows(graph, flows)

    def us(t: int) -> float:
        return round((t - t0) / 1000, 3)

    for rank in graph.ranks:
        trace = graph.traces[rank]
        off = trace.offset_ns
        pid = pid_base + rank
        _write_names(pid, f"{label}rank {rank}", emit)
        end_of_rank = trace.last_ns if trace.last_ns is not None else t0
        epoch = bundle.rank_info(rank).get("device_time")
        epoch = epoch.get("epoch_host_ns") if type(epoch) is dict else None
        device: list[DeviceTime] = []
        unended = OpenSteps()
        calls = _Calls(pid, rank, end_of_rank, flow_ids, roles, counts, emit, us)
        for rec in bundle.events(rank, steps=steps):
            start = rec.start_ns - off
            end = None if rec.end_ns is None else rec.end_ns - off
            cls = type(rec)
            if rec.step in failed:
                unended.see(rec)
            if cls is DeviceTime:
                if type(epoch) is int:
                    device.append(rec)
            elif cls is Collective or cls is PointToPoint:
                calls.write(rec, start, end)
            else:
                _write_other(rec, start, end, pid, emit, us)
        for step, first, reach in unended.open():
            _write_unended(step, first - off, max(reach - off, end_of_rank), pid, emit, us)
        if device:
            _write_device(device, epoch - off, pid, emit, us)


def _flows(graph, flows: list) -> tuple[dict[tuple, int], dict[tuple, dict[int, str]]]:
    """({call key: flow id}, {call key: {rank: "s" | "t" | "f"}}) of every call with two
    members or more: its flow starts at the first to enter and finishes at the last;
    `flows[0]`, the last id given, counts on."""
    flow_ids: dict[tuple, int] = {}
    roles: dict[tuple, dict[int, str]] = {}
    for key, call in graph.calls.items():
        if len(call.members) < 2:
            continue
        flows[0] += 1
        flow_ids[key] = flows[0]
        order = sorted(call.members, key=lambda m: (m.enter_ns, m.rank))
        roles[key] = {m.rank: "t" for m in order}
        roles[key][order[0].rank] = "s"
        roles[key][order[-1].rank] = "f"
    for key, pm in graph.p2p.items():
        if pm.send is not None and pm.recv is not None:
            flows[0] += 1
            flow_ids[key] = flows[0]
            roles[key] = {pm.src: "s", pm.dst: "f"} if pm.src != pm.dst else {pm.src: "s"}
    return flow_ids, roles


def _write_names(pid: int, name: str, emit) -> None:
    """A rank's process name, and its threads' names and order."""
    emit({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}})
    emit({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}})
    for tid, thread in ((_TID_STEPS, "steps"), (_TID_COMPUTE, "compute"), (_TID_OPS, "operators")):
        emit({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": thread}})
        emit({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})


def _write_other(rec, start: int, end: int | None, pid: int, emit, us) -> None:
    """A compute span, a step, a memory sample or a marker of one rank."""
    cls = type(rec)
    if cls is Compute:
        if end is None:
            return
        tid = _TID_COMPUTE if rec.name is None else _TID_OPS
        emit({"ph": "X", "pid": pid, "tid": tid, "name": rec.name or "compute", "cat": "compute",
              "ts": us(start), "dur": round((end - start) / 1000, 3), "args": {"step": rec.step}})
    elif cls is Step:
        if end is not None:
            emit({"ph": "X", "pid": pid, "tid": _TID_STEPS, "name": f"step {rec.step}", "cat": "step",
                  "ts": us(start), "dur": round((end - start) / 1000, 3),
                  "args": {"step": rec.step, "mem_peak": rec.mem_peak}})
    elif cls is Memory:
        emit({"ph": "C", "pid": pid, "name": "memory", "ts": us(start),
              "args": {"allocated": rec.mem_alloc}})
        emit({"ph": "C", "pid": pid, "name": "memory peak", "ts": us(start),
              "args": {"peak": rec.mem_peak}})
    elif cls is Marker:
        emit({"ph": "i", "pid": pid, "tid": _TID_STEPS, "s": "p", "name": rec.name, "cat": "marker",
              "ts": us(start), "args": {"value": rec.value, "text": rec.text}})


class _Calls:
    """One rank's collective and point-to-point calls: each on the first communication
    lane free when it starts (a lane a thread), with its end of a flow if it has one."""

    def __init__(self, pid: int, rank: int, end_of_rank: int, flow_ids: dict, roles: dict, counts: dict, emit, us):
        self.pid, self.rank, self.end_of_rank = pid, rank, end_of_rank
        self.flow_ids, self.roles, self.counts = flow_ids, roles, counts
        self.emit, self.us = emit, us
        self.lanes: list[int] = []  # end of the last call in each lane

    def write(self, rec, start: int, end: int | None) -> None:
        """One call: its span (to where the rank's records end if it never completed), its
        flow event and its memory sample."""
        pid, emit, us = self.pid, self.emit, self.us
        stop = end if end is not None else max(self.end_of_rank, start)
        tid = self.lane(start, stop)
        key, name, args = self.describe(rec)
        if end is None:
            name += " (never completed)"
            args["never_completed"] = True
        if rec.stack:
            args["stack"] = list(rec.stack)
        emit({"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": "communication",
              "ts": us(start), "dur": round((stop - start) / 1000, 3), "args": args})
        fid = self.flow_ids.get(key)
        role = self.roles[key].get(self.rank) if fid is not None else None
        if role is not None:
            flow = f"{rec.op} {key}" if type(rec) is Collective else f"p2p {key}"
            emit({"ph": role, "pid": pid, "tid": tid, "name": flow, "cat": "flow", "id": fid,
                  "ts": us(start), "bp": "e"})
            self.counts["flows"] += role == "s"
        if rec.mem_alloc is not None:
            emit({"ph": "C", "pid": pid, "name": "memory", "ts": us(start),
                  "args": {"allocated": rec.mem_alloc}})

    def lane(self, start: int, stop: int) -> int:
        """The thread of the first lane free at `start`, a new one named if none is."""
        lanes = self.lanes
        lane = next((i for i, e in enumerate(lanes) if e <= start), None)
        if lane is None:
            lane = len(lanes)
            lanes.append(stop)
            name = "communication" if lane == 0 else f"communication {lane + 1}"
            self.emit({"ph": "M", "pid": self.pid, "tid": _TID_COMM + lane, "name": "thread_name",
                       "args": {"name": name}})
            self.emit({"ph": "M", "pid": self.pid, "tid": _TID_COMM + lane, "name": "thread_sort_index",
                       "args": {"sort_index": _TID_COMM + lane}})
        else:
            lanes[lane] = max(lanes[lane], stop)
        return _TID_COMM + lane

    def describe(self, rec) -> tuple[tuple, str, dict]:
        """(its call's key in the graph, its name, its args) of a call."""
        if type(rec) is Collective:
            key = (rec.group, rec.seq)
            args = {"group": rec.group, "seq": rec.seq, "step": rec.step,
                    "shapes": [list(s) for s in rec.in_shapes], "dtypes": list(rec.in_dtypes),
                    "bytes": rec.in_bytes, "reduce_op": rec.reduce_op, "root": rec.root,
                    "async": rec.async_op}
            return key, rec.op, args
        rank = self.rank
        sending = not ops.receives(rec.op)
        key = (rec.group, rank, rec.peer, rec.seq) if sending else (rec.group, rec.peer, rank, rec.seq)
        name = f"{rec.op} {'to' if sending else 'from'} {rec.peer}"
        args = {"group": rec.group, "seq": rec.seq, "peer": rec.peer, "step": rec.step,
                "shapes": [list(s) for s in rec.shapes], "dtypes": list(rec.dtypes),
                "bytes": rec.nbytes, "async": rec.async_op}
        return key, name, args


def _write_unended(step: int, start: int, stop: int, pid: int, emit, us) -> None:
    """The step a run failed or hung in, which this rank never ended: from its first record
    in it to where its records end."""
    emit({"ph": "X", "pid": pid, "tid": _TID_STEPS, "name": f"step {step} (never ended)", "cat": "step",
          "ts": us(start), "dur": round((stop - start) / 1000, 3), "args": {"step": step, "never_ended": True}})


def _write_device(records: list[DeviceTime], base: int, pid: int, emit, us) -> None:
    """A rank's DeviceTime records as slices on its device threads, each device time
    placed at `base` + it (the epoch's host time, on rank 0's clock): steps on one thread,
    calls from their issue to where the program's wait for them returned, in lanes."""
    thread = {_TID_DEVICE_STEPS: "device: steps"}
    lanes: list[int] = []
    slices = []
    for rec in records:
        first = rec.dev_start_ns if rec.dev_start_ns is not None else rec.dev_wait_ns
        if first is None or rec.dev_end_ns is None or rec.dev_end_ns < first:
            continue
        args = {"step": rec.step, "device_ns": [first, rec.dev_end_ns]}
        if rec.name == "step":
            slices.append((first, rec.dev_end_ns, _TID_DEVICE_STEPS, f"step {rec.step}", "step", args))
            continue
        args.update(group=rec.group, seq=rec.seq)
        if rec.peer is not None:
            args["peer"] = rec.peer
        if rec.dev_wait_ns is not None:
            args["waited_us"] = round((rec.dev_end_ns - rec.dev_wait_ns) / 1000, 3)
        if rec.dev_duration_ns is not None:
            args["backend_us"] = round(rec.dev_duration_ns / 1000, 3)
        slices.append((first, rec.dev_end_ns, None, rec.op or "call", "communication", args))
    slices.sort(key=lambda s: s[0])
    for first, last, tid, name, cat, args in slices:
        if tid is None:
            lane = next((i for i, e in enumerate(lanes) if e <= first), None)
            if lane is None:
                lane = len(lanes)
                lanes.append(last)
            else:
                lanes[lane] = last
            tid = _TID_DEVICE + lane
            thread.setdefault(tid, "device: calls" if lane == 0 else f"device: calls {lane + 1}")
        emit({"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat, "ts": us(base + first),
              "dur": round((last - first) / 1000, 3), "args": args})
    for tid, name in thread.items():
        emit({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}})
        emit({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
