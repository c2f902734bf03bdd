"""Spools: one append-only file of checksummed zstd frames per recording rank.

A recording rank's records reach its call log first (format/calllog.py: written as they
happen, kept by the kernel whatever kills the process); the compactor
(format/compactor.py) writes them here as frames. `SpoolWriter` writes a spool directly,
for tools that make spools of records they already have (tests, synthetic bundles).

Spools of earlier versions may hold open-call snapshots (FRAME_OPEN): `pack` keeps the
last one's calls that no later record names (FORMAT.md, "Spool").
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from prism_rr.errors import FormatError
from prism_rr.format import codec, layout
from prism_rr.format.names import rank_file
from prism_rr.format.records import Record

__all__ = ["FRAME_OPEN", "Frame", "SpoolWriter", "call_identity", "read_spool", "repair_spool", "scan_spool",
           "spool_header", "spool_path", "still_open"]


# A spool frame kind beside layout.FRAME_EVENTS and FRAME_RANK_INFO, in spools of earlier
# versions: the calls open at a moment, as an events chunk whose records have end_ns nil
# (FORMAT.md, "Spool").
FRAME_OPEN = 3


def spool_path(directory: str | os.PathLike, rank: int, attempt: int = 0) -> Path:
    return rank_file(directory, rank, attempt, "spool")


def spool_header(rank: int) -> bytes:
    """The bytes a spool of `rank` starts with: magic, version, rank and their checksum."""
    head = layout.SPOOL_HEADER.pack(layout.SPOOL_MAGIC, layout.MAJOR, layout.MINOR, rank, 0)
    return head[:-4] + layout.crc32(head[:-4]).to_bytes(4, "little")


def encode_frame(kind: int, rank: int, index: int, records=None, info=None) -> bytes:
    """One frame: header, summary, compressed payload."""
    if kind in (layout.FRAME_EVENTS, FRAME_OPEN):
        payload, cs = codec.encode_chunk(records)
        summary = msgpack.packb(cs.summary, use_bin_type=True)
        count, t0, t1, s0, s1 = cs.count, cs.t_first, cs.t_last, cs.step_first, cs.step_last
    else:
        payload = msgpack.packb(info, use_bin_type=True)
        summary = b""
        count = t0 = t1 = s0 = s1 = 0
    body = summary + codec.compress(payload)
    head = layout.FRAME_HEADER.pack(
        layout.FRAME_MAGIC, 0, kind, rank, index, count, len(payload),
        len(body) - len(summary), len(summary), t0, t1, s0, s1, layout.crc32(body), 0,
    )
    head = head[:-4] + layout.crc32(head[:-4]).to_bytes(4, "little")
    return head + body


@dataclass(frozen=True, slots=True, kw_only=True)
class Frame:
    """A frame found in a spool: where it lies and what its header says."""

    offset: int  # of the header, in the spool or chunk section
    length: int  # header + summary + payload
    kind: int
    rank: int
    index: int
    count: int
    raw_len: int
    t_first: int
    t_last: int
    step_first: int
    step_last: int
    summary: dict
    summary_len: int

    def payload(self, buf) -> memoryview:
        start = self.offset + layout.FRAME_HEADER.size + self.summary_len
        return memoryview(buf)[start : self.offset + self.length]


def parse_frame(buf, offset: int, end: int, where: str) -> Frame:
    """The frame at `offset`; checks header, bounds and body checksum."""
    size = layout.FRAME_HEADER.size
    if end - offset < size:
        raise FormatError(f"{where}, offset {offset}: truncated frame header")
    fields = layout.FRAME_HEADER.unpack_from(buf, offset)
    (magic, flags, kind, rank, index, count, raw_len, comp_len, summ_len,
     t0, t1, s0, s1, crc_body, crc_head) = fields
    if magic != layout.FRAME_MAGIC:
        raise FormatError(f"{where}, offset {offset}: bad frame magic {magic!r}")
    view = memoryview(buf)
    if zlib.crc32(view[offset : offset + size - 4]) != crc_head:
        raise FormatError(f"{where}, offset {offset}: frame header checksum mismatch")
    if flags != 0:
        raise FormatError(f"{where}, offset {offset}: reserved frame flags are set ({flags})")
    if not (raw_len <= layout.MAX_CHUNK_RAW and comp_len <= layout.MAX_CHUNK_COMPRESSED
            and summ_len <= layout.MAX_SUMMARY_LEN and count <= layout.MAX_CHUNK_EVENTS):
        at = f"{where}, offset {offset}"  # (all are unsigned) which one, said by bounded
        layout.bounded(raw_len, layout.MAX_CHUNK_RAW, "payload size", at)
        layout.bounded(comp_len, layout.MAX_CHUNK_COMPRESSED, "compressed size", at)
        layout.bounded(summ_len, layout.MAX_SUMMARY_LEN, "summary size", at)
        layout.bounded(count, layout.MAX_CHUNK_EVENTS, "record count", at)
    length = size + summ_len + comp_len
    if end - offset < length:
        raise FormatError(f"{where}, offset {offset}: frame body is truncated "
                          f"({end - offset - size} of {length - size} bytes)")
    body = view[offset + size : offset + length]
    if zlib.crc32(body) != crc_body:
        raise FormatError(f"{where}, offset {offset}: frame body checksum mismatch")
    summary = {}
    if summ_len:
        summary = codec.unpack(body[:summ_len], f"{where}, offset {offset}, summary")
        if type(summary) is not dict:
            raise FormatError(f"{where}, offset {offset}: frame summary is not a map")
    return Frame(
        offset=offset, length=length, kind=kind, rank=rank, index=index, count=count,
        raw_len=raw_len, t_first=t0, t_last=t1, step_first=s0, step_last=s1, summary=summary,
        summary_len=summ_len,
    )


def frame_records(buf, frame: Frame, where: str) -> list[Record]:
    at = f"{where}, offset {frame.offset}"
    raw = codec.decompress(frame.payload(buf), frame.raw_len, at)
    if len(raw) != frame.raw_len:
        raise FormatError(f"{at}: payload is {len(raw)} bytes, header says {frame.raw_len}")
    return codec.decode_chunk(raw, frame.count, at)


def frame_info(buf, frame: Frame, where: str) -> dict:
    at = f"{where}, offset {frame.offset}"
    raw = codec.decompress(frame.payload(buf), layout.MAX_RANK_INFO_RAW, at)
    info = codec.unpack(raw, at)
    if type(info) is not dict:
        raise FormatError(f"{at}: rank info is not a map")
    return info


@dataclass(frozen=True, slots=True, kw_only=True)
class SpoolScan:
    """What a spool holds: its good frames, and where and why reading stopped early."""

    path: Path
    rank: int
    frames: list[Frame]
    good_bytes: int  # length of the intact prefix
    size: int
    problem: str | None  # why the tail was not read, or None

    @property
    def torn(self) -> bool:
        return self.problem is not None


def read_spool(path: str | os.PathLike, data: bytes | None = None) -> SpoolScan:
    """Scan a spool, keeping every complete frame before the first bad one."""
    path = Path(path)
    if data is None:
        data = path.read_bytes()
    rank, frames, good, problem = scan_spool(data, f"spool {path.name}")
    return SpoolScan(path=path, rank=rank, frames=frames, good_bytes=good, size=len(data), problem=problem)


def scan_spool(data, where: str) -> tuple[int, list[Frame], int, str | None]:
    """What read_spool finds in a spool's bytes: (rank, every complete frame before the
    first bad one, the length of that intact prefix, why reading stopped early or None);
    FormatError if the header is not a spool's. `where` names the spool in errors."""
    hsize = layout.SPOOL_HEADER.size
    if len(data) < hsize:
        raise FormatError(f"{where}: too short for a spool header ({len(data)} bytes)")
    magic, major, minor, rank, crc = layout.SPOOL_HEADER.unpack_from(data, 0)
    if magic != layout.SPOOL_MAGIC or layout.crc32(data[: hsize - 4]) != crc:
        raise FormatError(f"{where}: not a prism-rr spool (bad header)")
    if major != layout.MAJOR:
        raise FormatError(f"{where}: spool format {major}.{minor}, this reader supports {layout.MAJOR}.x")
    frames = []
    offset = hsize
    problem = None
    while offset < len(data):
        try:
            frame = parse_frame(data, offset, len(data), where)
        except FormatError as exc:
            problem = str(exc)
            break
        if frame.rank != rank:
            problem = f"{where}, offset {offset}: frame of rank {frame.rank} in the spool of rank {rank}"
            break
        frames.append(frame)
        offset += frame.length
    return rank, frames, offset, problem


def repair_spool(path: str | os.PathLike) -> SpoolScan:
    """Cut a torn tail off a spool, keeping it beside the spool as `<name>.torn`."""
    path = Path(path)
    scan = read_spool(path)
    if scan.torn:
        data = path.read_bytes()
        path.with_name(path.name + ".torn").write_bytes(data[scan.good_bytes :])
        with open(path, "r+b") as f:
            f.truncate(scan.good_bytes)
            f.flush()
            os.fsync(f.fileno())
    return scan


def call_identity(rec: Record) -> tuple:
    """What names one call in both its open and its completed record."""
    return (type(rec).__name__, rec.start_ns, getattr(rec, "op", None), getattr(rec, "group", None),
            getattr(rec, "seq", None))


def still_open(buf, frames: list[Frame], where: str) -> list[Record]:
    """The calls of the spool's last open-calls snapshot that no later record names
    (completed, or written as open at close): what the rank was in when it stopped
    writing, and calls it had seen complete without writing their record yet."""
    last = None
    for i, frame in enumerate(frames):
        if frame.kind == FRAME_OPEN:
            last = i
    if last is None:
        return []
    snap = frame_records(buf, frames[last], where)
    if not snap:
        return []
    seen = set()
    for frame in frames[last + 1 :]:
        if frame.kind == layout.FRAME_EVENTS:
            seen.update(call_identity(r) for r in frame_records(buf, frame, where))
    return [r for r in snap if call_identity(r) not in seen]


class SpoolWriter:
    """Writes records of one rank to its spool, `chunk_records` to a frame, on the
    caller's thread (no recorder uses it: a recording rank writes its call log)."""

    def __init__(self, path: str | os.PathLike, rank: int, *, chunk_records: int = 2048,
                 info: dict[str, Any] | None = None):
        self.path = Path(path)
        self.rank = rank
        self.chunk_records = chunk_records
        self._pending: list = []
        self._index = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        os.write(self._fd, spool_header(rank))
        if info is not None:
            self.add_info(info)

    def append(self, record: Record | tuple) -> None:
        """A record, or a row (codec.row_maker)."""
        self._pending.append(record)
        if len(self._pending) >= self.chunk_records:
            self.flush()

    def add_info(self, info: dict[str, Any]) -> None:
        """A rank-info frame (argv, versions, clock offset, ...): later ones add to earlier ones."""
        self.flush()
        self._write(layout.FRAME_RANK_INFO, info=info)

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending:
            self._write(layout.FRAME_EVENTS, records=pending)

    def close(self) -> None:
        if self._fd < 0:
            return
        self.flush()
        os.close(self._fd)
        self._fd = -1

    def _write(self, kind: int, records=None, info=None) -> None:
        frame = encode_frame(kind, self.rank, self._index, records=records, info=info)
        self._index += 1
        view = memoryview(frame)
        while view:
            view = view[os.write(self._fd, view):]
