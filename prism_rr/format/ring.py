"""Flight rings: one rank's last records and payloads in a fixed-size memory-mapped file.

A flight recording (`record --flight K`) writes no spool. Each rank keeps its newest
frames in a ring: a file of fixed size, mapped into memory, that it writes with memcpy
and never with a write() call. The kernel owns the mapped pages, so when the rank dies by
any signal (SIGKILL, SIGSEGV) the ring is still whole on disk; `ring_to_spool` turns it
(live, at a trigger, or after a death) into an ordinary spool that `pack` reads.

Layout (little-endian):

    header   RING_HEADER: magic "PRRRING1", version, rank, data capacity, slot sizes, crc
    slots    for each of info, groups, open calls: two buffers of `slot_size` bytes
    data     `capacity` bytes, written round and round

Everything after the header is a sequence of entries: ENTRY (magic "PRRE", kind, seq,
length, crc of the rest) then `length` bytes. A data entry holds one spool events frame
(kind E_FRAME) or one payload blob (E_BLOB: its 16-byte id, then its zstd bytes). A new
entry goes where the last one ended, or at the start of the data area when it does not
fit before its end, over the oldest entries. A slot holds the newest version of one
thing, in its two buffers by turns (so a death while one is written leaves the other):
the rank info (E_INFO, msgpack), the groups made so far (E_GROUPS, an events frame of
GroupInfo records: they are made once, at start, and a ring would lose them), and the
calls open now (E_OPEN, an events frame of records with end_ns nil).

Reading finds every entry whose checksum holds, orders them by seq and keeps the newest
unbroken run: an entry half overwritten, or half written when the rank died, is not read.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import zlib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import msgpack

from prism_rr.errors import FormatError
from prism_rr.format import codec, layout
from prism_rr.format.records import Marker
from prism_rr.format.spool import encode_frame, frame_records, parse_frame, spool_header

__all__ = ["E_BLOB", "E_FRAME", "E_GROUPS", "E_INFO", "E_OPEN", "Ring", "RingContents", "newest_step",
           "read_ring", "ring_path", "ring_to_spool"]

RING_MAGIC = b"PRRRING1"
RING_VERSION = 1
RING_HEADER = struct.Struct("<8sHHIQIIII")  # magic, version, 0, rank, capacity, 3 slot sizes, crc
ENTRY = struct.Struct("<4sBxxxQII")  # magic, kind, seq, length, crc32 of kind+seq+length+payload
ENTRY_MAGIC = b"PRRE"
E_FRAME, E_BLOB, E_INFO, E_GROUPS, E_OPEN = 1, 2, 3, 4, 5
SLOTS = (E_INFO, E_GROUPS, E_OPEN)
SLOT_SIZES = {E_INFO: 256 << 10, E_GROUPS: 4 << 20, E_OPEN: 1 << 20}  # sparse: unused pages cost nothing
_HEADER_AREA = 4096


def ring_path(directory, rank: int) -> Path:
    return Path(directory) / f"rank-{rank:05d}.ring"


def _entry(kind: int, seq: int, payload) -> bytes:
    crc = zlib.crc32(payload, zlib.crc32(struct.pack("<BQI", kind, seq, len(payload))))
    return ENTRY.pack(ENTRY_MAGIC, kind, seq, len(payload), crc) + bytes(payload)


@dataclass(slots=True)
class _Held:
    """Where a data entry lies, and what the in-memory index knows of it."""

    seq: int
    kind: int
    offset: int
    length: int  # of the whole entry
    meta: object  # E_FRAME: (step_first, step_last, blob ids named); E_BLOB: its id


class Ring:
    """The writer of one rank's ring (thread-safe; every method is short)."""

    def __init__(self, path, rank: int, capacity: int, slot_sizes: dict | None = None):
        self.path = Path(path)
        self.rank = rank
        self.capacity = int(capacity)
        self.slot_sizes = {**SLOT_SIZES, **(slot_sizes or {})}
        self._slot_at = {}
        at = _HEADER_AREA
        for kind in SLOTS:
            self._slot_at[kind] = at
            at += 2 * self.slot_sizes[kind]
        self._data_at = at
        size = at + self.capacity
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, size)
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        head = RING_HEADER.pack(RING_MAGIC, RING_VERSION, 0, rank, self.capacity,
                                *(self.slot_sizes[k] for k in SLOTS), 0)
        self._mm[0:RING_HEADER.size] = head[:-4] + layout.crc32(head[:-4]).to_bytes(4, "little")
        self._lock = threading.Lock()
        self._seq = 0  # of data entries: a gap in a ring read back is a break
        self._slot_seq = 0
        self._head = 0  # where the next data entry goes, from the data area's start
        self.held: deque[_Held] = deque()  # data entries whole in the ring, oldest first
        self.blobs: dict[bytes, _Held] = {}
        self._slot_turn = {kind: 0 for kind in SLOTS}
        self.closed = False

    def append(self, kind: int, payload, meta=None) -> bool:
        """Add a data entry over the oldest; False when it is larger than the ring."""
        n = ENTRY.size + len(payload)
        if n > self.capacity:
            return False
        with self._lock:
            if self.closed:
                return False
            held = self.held
            if self._head + n > self.capacity:  # wrap: let the rest of the last lap go
                while held and held[0].offset >= self._head:
                    self._drop()
                self._head = 0
            at, end = self._head, self._head + n
            while held and at <= held[0].offset < end:  # the oldest, where the new one goes
                self._drop()
            self._seq += 1
            self._mm[self._data_at + at : self._data_at + end] = _entry(kind, self._seq, payload)
            entry = _Held(self._seq, kind, at, n, meta)
            held.append(entry)
            if kind == E_BLOB:
                self.blobs[meta] = entry
            self._head = end
            return True

    def _drop(self) -> None:
        old = self.held.popleft()
        if old.kind == E_BLOB and self.blobs.get(old.meta) is old:
            del self.blobs[old.meta]

    def holds_recent(self, ident: bytes) -> bool:
        """Whether blob `ident` is in the newer half of the ring: a record that names it
        now goes out of the ring before it does (entries are overwritten oldest first)."""
        with self._lock:
            entry = self.blobs.get(ident)
            if entry is None:
                return False
            behind = self._head - entry.offset if entry.offset < self._head else \
                self._head + self.capacity - entry.offset
            return behind < self.capacity // 2

    def set_slot(self, kind: int, payload) -> bool:
        """Write the newest version of a slot; False when it does not fit its slot."""
        size = self.slot_sizes[kind]
        if ENTRY.size + len(payload) > size:
            return False
        with self._lock:
            if self.closed:
                return False
            self._slot_seq += 1
            turn = self._slot_turn[kind]
            self._slot_turn[kind] = 1 - turn
            at = self._slot_at[kind] + turn * size
            data = _entry(kind, self._slot_seq, payload)
            self._mm[at : at + len(data)] = data
            return True

    def data_entries(self) -> list[tuple[_Held, bytes]]:
        """A copy of every whole data entry, oldest first, with its payload."""
        with self._lock:
            out = []
            for h in self.held:
                start = self._data_at + h.offset + ENTRY.size
                out.append((h, bytes(self._mm[start : self._data_at + h.offset + h.length])))
            return out

    def close(self, remove: bool = True) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._mm.close()
        if remove:
            self.path.unlink(missing_ok=True)


# --- reading ----------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class RingContents:
    """What a ring holds: frames (spool events frames, oldest first), blobs, and slots."""

    rank: int
    frames: list[bytes] = field(default_factory=list)
    blobs: dict[bytes, bytes] = field(default_factory=dict)  # id -> zstd bytes
    info: dict = field(default_factory=dict)
    groups: bytes | None = None  # an events frame of GroupInfo records
    open: bytes | None = None  # an events frame of the calls open at the last snapshot


def _entries_in(buf, start: int, end: int) -> list[tuple[int, int, bytes]]:
    """Every entry in buf[start:end] whose checksum holds: (seq, kind, payload)."""
    out = []
    at = start
    view = memoryview(buf)
    while True:
        at = buf.find(ENTRY_MAGIC, at, end)
        if at < 0 or at + ENTRY.size > end:
            return out
        _, kind, seq, length, crc = ENTRY.unpack_from(buf, at)
        stop = at + ENTRY.size + length
        if kind in (E_FRAME, E_BLOB, *SLOTS) and stop <= end:
            payload = view[at + ENTRY.size : stop]
            if zlib.crc32(payload, zlib.crc32(struct.pack("<BQI", kind, seq, length))) == crc:
                out.append((seq, kind, bytes(payload)))
                at = stop
                continue
        at += 1


def read_ring(path) -> RingContents:
    """Read a ring file (a dead rank's, or a live one's): raises FormatError if it is none."""
    path = Path(path)
    buf = path.read_bytes()
    where = f"ring {path.name}"
    if len(buf) < _HEADER_AREA:
        raise FormatError(f"{where}: too short for a ring ({len(buf)} bytes)")
    magic, version, _, rank, capacity, *sizes, crc = RING_HEADER.unpack_from(buf, 0)
    if magic != RING_MAGIC or layout.crc32(buf[: RING_HEADER.size - 4]) != crc:
        raise FormatError(f"{where}: not a prism-rr flight ring (bad header)")
    if version != RING_VERSION:
        raise FormatError(f"{where}: ring version {version}, this reader supports {RING_VERSION}")
    slot_sizes = dict(zip(SLOTS, sizes))
    at = _HEADER_AREA
    out = RingContents(rank=rank)
    for kind in SLOTS:
        found = [e for e in _entries_in(buf, at, at + 2 * slot_sizes[kind]) if e[1] == kind]
        at += 2 * slot_sizes[kind]
        if not found:
            continue
        payload = max(found)[2]
        if kind == E_INFO:
            info = codec.unpack(payload, f"{where}, rank info")
            out.info = info if type(info) is dict else {}
        elif kind == E_GROUPS:
            out.groups = payload
        else:
            out.open = payload
    if len(buf) < at + capacity:
        raise FormatError(f"{where}: {len(buf)} bytes, its header says {at + capacity}")
    data = sorted(e for e in _entries_in(buf, at, at + capacity) if e[1] in (E_FRAME, E_BLOB))
    first = 0  # the newest unbroken run of seqs
    for i in range(1, len(data)):
        if data[i][0] != data[i - 1][0] + 1:
            first = i
    for _seq, kind, payload in data[first:]:
        if kind == E_FRAME:
            out.frames.append(payload)
        elif len(payload) > layout.BLOB_ID_LEN:
            out.blobs[payload[: layout.BLOB_ID_LEN]] = payload[layout.BLOB_ID_LEN :]
    return out


# --- a ring as a spool ------------------------------------------------------------------


def _blob_ids(rec) -> tuple:
    ids = ()
    for name in ("blob_in", "blob_out", "blob"):
        v = getattr(rec, name, None)
        if v:
            ids += tuple(v)
    return ids


def newest_step(contents: RingContents) -> int | None:
    """The last step the ring's frames reach (None: no frame)."""
    steps = []
    for raw in contents.frames:
        try:
            steps.append(parse_frame(raw, 0, len(raw), "ring").step_last)
        except FormatError:
            continue
    return max(steps, default=None)


def ring_to_spool(contents: RingContents, out_dir, *, first_step: int | None, info_extra: dict | None = None,
                  open_records=None) -> dict:
    """Write the ring as `out_dir/rank-NNNNN.spool` (and its blobs under `out_dir/blobs`):
    the rank info, the groups, the records of steps from `first_step` on (the same step
    on every rank of a dump, so their calls pair up from the first), then the calls open
    now (`open_records`, else the ring's last open-calls snapshot) as records with end_ns
    nil. A record whose payload blob the ring no longer holds keeps no payload and gets a
    `payload_lost` marker. Returns what was written: {frames, first_step, blobs,
    payloads_lost}."""
    from prism_rr.format.blobs import blob_path

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rank = contents.rank
    where = f"ring of rank {rank}"
    parsed = []
    for raw in contents.frames:
        try:
            parsed.append((parse_frame(raw, 0, len(raw), where), raw))
        except FormatError:
            continue
    newest = max((f.step_last for f, _ in parsed), default=0)
    lo = first_step
    kept = [(f, raw) for f, raw in parsed if lo is None or f.step_last >= lo]
    lost = 0
    frames: list[bytes] = []
    for frame, raw in kept:
        records = frame_records(raw, frame, where)
        gone = {id(r) for r in records if any(i not in contents.blobs for i in _blob_ids(r))}
        early = lo is not None and frame.step_first < lo
        if not gone and not early:
            frames.append(raw)
            continue
        fixed = []
        for r in records:
            if early and r.step < lo:
                continue
            if id(r) in gone:
                lost += 1
                r = _without_blobs(r)
                fixed.append(Marker(start_ns=r.end_ns or r.start_ns, end_ns=r.end_ns or r.start_ns, step=r.step,
                                    name="payload_lost", value=getattr(r, "seq", None),
                                    text=f"{getattr(r, 'op', '?')}: payload no longer in the flight ring"))
            fixed.append(r)
        if fixed:
            frames.append(encode_frame(layout.FRAME_EVENTS, rank, frame.index, records=fixed))
    if open_records is None and contents.open is not None:
        try:
            f = parse_frame(contents.open, 0, len(contents.open), where)
            open_records = frame_records(contents.open, f, where)
        except FormatError:
            open_records = None
    first_step = max(lo or 0, min((f.step_first for f, _ in kept), default=0)) if kept else None
    info = dict(contents.info)
    if lo is not None:  # the records are a window of the run, as with --steps: a replay knows
        info["steps"] = [lo, None]
    info["flight_ring"] = {"first_step": first_step, "last_step": newest, "frames": len(frames),
                           "payloads_lost": lost, **(info_extra or {})}
    spool = out_dir / f"rank-{rank:05d}.spool"
    tmp = spool.with_name(spool.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(spool_header(rank))
        f.write(encode_frame(layout.FRAME_RANK_INFO, rank, 0, info=info))
        if contents.groups is not None:
            f.write(contents.groups)
        for raw in frames:
            f.write(raw)
        if open_records:
            f.write(encode_frame(layout.FRAME_EVENTS, rank, 1 << 30, records=list(open_records)))
    os.replace(tmp, spool)
    named = set()
    for raw in frames:
        fr = parse_frame(raw, 0, len(raw), where)
        for r in frame_records(raw, fr, where):
            named.update(_blob_ids(r))
    for r in open_records or ():
        named.update(_blob_ids(r))
    for ident in named:
        data = contents.blobs.get(ident)
        if data is None:
            continue
        path = blob_path(out_dir, ident)
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        part.write_bytes(data)
        os.replace(part, path)
    return {"frames": len(frames), "first_step": first_step, "blobs": len(named), "payloads_lost": lost}


def _without_blobs(rec):
    from dataclasses import replace

    changes = {k: None for k in ("blob_in", "blob_out", "blob") if getattr(rec, k, None)}
    return replace(rec, **changes)


def info_payload(info: dict) -> bytes:
    return msgpack.packb(info, use_bin_type=True)
