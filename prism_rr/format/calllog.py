"""The call log: a rank's records, written as they happen into a file mapped into memory.

A recording rank's program thread writes each call into its call log *before* the
backend is entered: a store into a shared mapping, which the kernel keeps whatever kills
the process (SIGKILL, a gloo abort, a segfault, `os._exit`), so a dying rank loses
nothing, not the last 100 ms, not the call it died in. The entry holds what names the
call (op, group, sequence, peer or root), its shapes and dtypes (by a dictionary id), its
stack (an id too), the step and the memory readings; a later entry completes it. Nothing
on the program's path is compressed or encoded as msgpack: the compactor (a thread of the
recorder, `Compactor` in format/compactor.py, or `pack` after a death) turns entries into
the spool's records.

Layout (little-endian; FORMAT.md, "Call log"):

    header      4096 bytes: HEADER (magic "PRRLOG1\\0", version, flags, rank, sizes, pid,
                crc), then the live words at LIVE_AT (tail, persist_done, state)
    persistent  `persist_size` bytes, appended to and never overwritten: the dictionary
                (DEF), rank info (INFO) and group records (REC), which every later entry
                may need however old
    ring        `ring_size` bytes, written round and round: calls (ENTER, DONE, OUT),
                other records (REC), padding (PAD)

An entry is ENTRY_HEAD (length, type, flags, aux, seq) and its body, its length a multiple
of 16. Its seq (per region, from 1, stored xor SEQ_KEY) is stored last: an entry half
written when the rank died has a stale seq and is not read. A reader walks the ring from
the tail while each entry's seq is the one after the last; the persistent region from 0.

The ring's tail: in a spool recording, the compactor moves it past what it wrote to the
spool (never past a call still open: the call's ENTER stays readable, copied ahead when
it would hold the tail back too long); in a flight recording (flag FLIGHT), the writer
moves it past the oldest entries when it needs their room.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import mmap
import os
import struct
import sys
import threading
from contextlib import contextmanager
from ctypes import string_at as _string_at
from dataclasses import dataclass, field
from pathlib import Path

import msgpack

from prism_rr.errors import FormatError
from prism_rr.format import codec, layout
from prism_rr.format.names import rank_file
from prism_rr.format.records import RECORD_TYPES, Collective, Compute, PointToPoint

__all__ = ["CallLog", "LogContents", "LogDecoder", "log_path", "read_log"]

MAGIC = b"PRRLOG1\x00"
VERSION = 1
# magic, version, flags, rank, persist size, ring size, pid, attempt, crc32 of the bytes before it
HEADER = struct.Struct("<8sHHIQQIII")
HEADER_AREA = 4096
# The pages ahead of the ring's head are faulted in, writable, by the recorder's threads
# (MADV_POPULATE_WRITE, Linux 5.14) before the program's thread stores into them: the first
# store into a page of the mapped file faults (the file system zeroes a read-ahead folio,
# makes the page writable and dirty): on the program's path that was one fault in about 20
# small calls. The ring's first lap only (CallLog.prefault).
_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23 if sys.platform.startswith("linux") else None)
PREFAULT_AHEAD = 4 << 20  # bytes ahead of the head, renewed every tenth of a second (compactor)


def _libc_madvise():
    if _POPULATE_WRITE is None:
        return None
    try:

        fn = ctypes.CDLL(None, use_errno=True).madvise
        fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        fn.restype = ctypes.c_int
        return fn
    except (OSError, AttributeError):
        return None


def _address(mm: mmap.mmap) -> int:
    """Where the mapping lies (its buffer let go at once: an export would keep it from
    closing)."""
    buf = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(buf)
    finally:
        del buf


_madvise = _libc_madvise()
LIVE_AT = 64
# tail (absolute ring position), tail seq, persist_done (bytes of the persistent region
# already in the spool), ring_done (the seq up to which ring entries are in the spool), state
LIVE = struct.Struct("<QQQQI")
STATE_LIVE, STATE_CLOSED = 0, 1
F_FLIGHT = 1

HEAD = struct.Struct("<IBBH")  # length, type, flags, aux
_LENGTH = struct.Struct("<I")
SEQ = struct.Struct("<Q")  # the entry's last 8 bytes: its seq ^ SEQ_KEY, stored last
SEQ_KEY = 0x5052_524C_4F47_0000  # "PRRLOG": a stale word is unlikely to pass for a seq
ALIGN = 16

# Entry types.
T_PAD, T_ENTER, T_DONE, T_OUT, T_REC, T_INFO, T_DEF = 0, 1, 2, 3, 4, 5, 6
TYPE_NAMES = {T_PAD: "pad", T_ENTER: "enter", T_DONE: "done", T_OUT: "out", T_REC: "record", T_INFO: "info",
              T_DEF: "def"}

# ENTER: the call as entered. After the head: start_ns, prev_ns (when the program last got
# control back from a call; 0: not since a step or window began), call id (the seq of the
# call's first ENTER: a copy keeps it), step, group, call seq (per group, or per direction
# and peer; -1: a receive from any source), peer or root (global rank, -1: none), tag, in
# desc, out desc, stack (dictionary ids; 0: none), op, reduce op (ids), mem_alloc, mem_peak
# (-1: none). Without a payload the seq follows (one struct, packed in field order after
# zeroing it: the seq is stored last); with one, the payload follows and the seq ends it.
ENTER_BODY = struct.Struct("<IBBHqqQiiqiiIIIHHqq")
ENTER = struct.Struct("<IBBHqqQiiqiiIIIHHqqQ")
CID_AT = 24  # the call id's offset in ENTER
# flags of ENTER (E_COPY: written again ahead, its aux's high byte counting how often;
# E_IN_LATER: the inputs' payload comes in an OUT with O_INPUTS, read once the device has
# passed the call's entry)
E_ASYNC, E_P2P, E_RECV, E_SAME_OUT, E_COPY, E_IN_LATER = 1, 2, 4, 8, 16, 32
DROP_SHIFT = 4  # a full flight ring drops 1/2**DROP_SHIFT of itself at once (_make_room)
MAX_CARRIES = 2  # a flight ring lets go of a call open that long (two laps of other entries)

# DONE: the call completed (or failed): call id, end_ns, issued_ns (0: none), peer and call
# seq learnt at completion (a receive from any source; flag D_SOURCED).
DONE_BODY = struct.Struct("<IBBHQqqiiq")
DONE = struct.Struct("<IBBHQqqiiq8xQ")
# flags of DONE
D_FAILED, D_SOURCED, D_OUT_LATER = 1, 2, 4

# OUT: the outputs' payload of a call whose DONE came first (D_OUT_LATER): call id; with
# flag O_INPUTS, the inputs' payload of a call whose ENTER said E_IN_LATER (before or after
# its DONE). A call's record is made once its DONE and every payload said later are in.
O_INPUTS = 1
OUT_BODY = struct.Struct("<IBBHQ")
OUT = struct.Struct("<IBBHQ8xQ")

# REC, INFO and DEF: the body's length (u32), the DEF's id (u32, else 0), the body (msgpack).
BODY_HEAD = struct.Struct("<IBBHII")
BODY_AT = BODY_HEAD.size

# A payload follows ENTER (the inputs) or DONE or OUT (the outputs), said by aux
# AUX_PAYLOAD: PAYLOAD_HEAD (tensors, what, 0, data bytes), then digests (u64 each) if
# P_DIGESTS, blob ids (16 bytes each) if P_BLOBS, then, if P_BYTES, each tensor's length
# (u32) and the bytes: the compactor makes their blob ids, and with P_DIGEST_BYTES their
# digests, off the program's path.
PAYLOAD_HEAD = struct.Struct("<HBBI")
P_DIGESTS, P_BLOBS, P_BYTES, P_DIGEST_BYTES = 1, 2, 4, 8
AUX_PAYLOAD = 1
ONE_BYTES = struct.Struct("<HBBII")  # PAYLOAD_HEAD and one length: one tensor's bytes
_U32 = struct.Struct("<I")

MIN_RING = 1 << 16
MAX_RING = 1 << 40
MAX_PERSIST = 1 << 32
MAX_ENTRY = 1 << 30

_pack_enter = ENTER.pack_into
_pack_enter_body = ENTER_BODY.pack_into
_pack_done = DONE.pack_into
_pack_done_body = DONE_BODY.pack_into
_pack_one = ONE_BYTES.pack
# An entry's padding (zeros) and its seq, as one struct per padding length: packed last.
_SEALS = [struct.Struct(f"<{k}xQ").pack_into for k in range(ALIGN)]

try:
    if os.environ.get("PRISM_RR_PURE_PYTHON"):
        raise ImportError("PRISM_RR_PURE_PYTHON is set")
    from prism_rr._speedups import Cursor as _FastCursor
except ImportError:
    _FastCursor = None


def _one_tensor(ptr: int, nbytes: int, what: int) -> bytes:
    """The payload part of one tensor's `nbytes` at address `ptr` (see ONE_BYTES)."""
    return _pack_one(1, what, 0, nbytes, nbytes) + (_string_at(ptr, nbytes) if nbytes else b"")


def _tensors(spec: list) -> bytes:
    """The payload part of several tensors' bytes in memory: spec is [what, address,
    nbytes, address, nbytes, ...] (payload_tail's bytes, read from those addresses)."""
    if not spec or len(spec) % 2 != 1 or len(spec) > 2 * 0xFFFF + 1 or any(type(v) is not int for v in spec):
        raise ValueError("tensors' bytes: [what, address, nbytes, ...] of ints, at most 65535")
    what, ptrs, sizes = spec[0], spec[1::2], spec[2::2]
    if any(not 0 <= k <= 0xFFFFFFFF or (k and not p) for p, k in zip(ptrs, sizes)):
        raise ValueError("tensors' bytes: bad address or length")
    return payload_tail(len(sizes), what, datas=[_string_at(p, k) if k else b"" for p, k in zip(ptrs, sizes)])


def accelerated() -> bool:
    """Whether call logs are written by the C speedups (prism_rr._speedups)."""
    return _FastCursor is not None


class _Cursor:
    """A ring's writing position, for the pure-Python path (the C Cursor's twin)."""

    __slots__ = ("head", "tail", "tail_seq", "seq", "busy")

    def __init__(self):
        self.head = 0  # absolute ring position of the next entry
        self.tail = 0  # of the oldest entry a reader must read
        self.tail_seq = 1
        self.seq = 0  # of the last ring entry
        self.busy = 0

    def state(self) -> tuple[int, int, int, int]:
        return self.head, self.tail, self.tail_seq, self.seq

    def release(self) -> None:
        pass


def log_path(directory, rank: int, attempt: int = 0) -> Path:
    return rank_file(directory, rank, attempt, "log")


def _pad(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


def payload_tail(n: int, what: int, digests=None, blobs=None, datas=None) -> bytes:
    """The payload part of an entry (see PAYLOAD_HEAD)."""
    parts = []
    total = 0
    if digests is not None:
        parts.append(struct.pack(f"<{n}Q", *digests))
    if blobs is not None:
        parts.append(b"".join(blobs))
    if datas is not None:
        total = sum(map(len, datas))
        parts.append(struct.pack(f"<{n}I", *map(len, datas)))
        parts.extend(datas)
    return PAYLOAD_HEAD.pack(n, what, 0, total) + b"".join(parts)


def one_bytes(data: bytes, what: int = P_BYTES | P_DIGEST_BYTES) -> bytes:
    """payload_tail of one tensor's bytes (the common case: one small tensor)."""
    return ONE_BYTES.pack(1, what, 0, len(data), len(data)) + data


class LogFull(Exception):
    """The ring has no room and its tail may not move (a spool recording whose compactor
    is behind): the entry is dropped and counted."""


class CallLog:
    """The writer of one rank's call log. Every method may be called from any thread.

    The hot two, `enter` and `done`, are the C speedups' where they were built (each runs
    whole under the GIL), else the Python twins below, which take the log's lock; both
    write the same bytes. What needs more (padding to the ring's end, making room, a
    compactor's read) takes the lock and sets the cursor `busy`, which sends the C path
    here too.

    `ring_size` is a power of two. The file's blocks are allocated at once
    (posix_fallocate): a store into a mapped page that the file system cannot back
    would kill the process with SIGBUS; a full disk fails here, before training starts.
    """

    def __init__(self, path, rank: int, *, ring_size: int = 32 << 20, persist_size: int = 8 << 20,
                 flight: bool = False, attempt: int = 0, accelerate: bool = True):
        if ring_size < MIN_RING or ring_size & (ring_size - 1) or ring_size > MAX_RING:
            raise ValueError(f"ring size {ring_size} is not a power of two of at least {MIN_RING}")
        self.path = Path(path)
        self.rank = rank
        self.flight = flight
        self.ring_size = ring_size
        self.persist_size = _pad(persist_size)
        self._mask = ring_size - 1
        self._ring_at = HEADER_AREA + self.persist_size
        size = self._ring_at + ring_size
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without it
                    raise
                os.ftruncate(fd, size)
            self._mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise
        os.close(fd)
        head = HEADER.pack(MAGIC, VERSION, F_FLIGHT if flight else 0, rank, self.persist_size, ring_size,
                           os.getpid(), attempt, 0)
        self._mm[0:HEADER.size] = head[:-4] + layout.crc32(head[:-4]).to_bytes(4, "little")
        self.lock = threading.Lock()
        # call id -> ring position of its newest ENTER: what a flight ring carries ahead when
        # it drops old entries (a spool's log keeps none: its compactor knows its open calls)
        self.open: dict[int, int] = {}
        if accelerate and _FastCursor is not None:
            self.cur = _FastCursor(self._mm, self._ring_at, ring_size, self.open if flight else None)
            self.cur.slow_enter = self._enter
            self.cur.slow_done = self._done
            self.enter = self.cur.enter
            self.done = self.cur.done
        else:
            self.cur = _Cursor()
            self.enter = self._enter
            self.done = self._done
        self._p_head = 0
        self._p_seq = 0
        self.dropped = 0  # entries that found no room (spool recordings only)
        self.persist_full = False
        self.closed = False
        self._carried: list[bytes] = []  # ENTERs of open calls to write again, ahead
        self._populate = _POPULATE_WRITE if _madvise is not None else None
        self._base = _address(self._mm) if self._populate is not None else 0
        self._faulted = 0  # the ring's first lap is faulted in up to here (prefault)
        self._write_live(0, 0)
        self._prefault(0, min(self.persist_size, 256 << 10))  # the dictionary's first entries
        self.prefault()

    @property
    def head(self) -> int:
        return self.cur.head

    @property
    def tail(self) -> int:
        return self.cur.tail

    @property
    def accelerated(self) -> bool:
        return type(self.cur) is not _Cursor

    # --- room -------------------------------------------------------------------------

    def _room(self, n: int) -> int:
        """With the lock held: the position where an entry of `n` bytes goes (padding to
        the ring's end first where it does not fit before it). Raises LogFull."""
        cur = self.cur
        pos = cur.head
        at = pos & self._mask
        if at + n > self.ring_size:  # the rest of the lap is padding
            gap = self.ring_size - at
            self._make_room(pos + gap + n)
            seq = cur.seq + 1
            off = self._ring_at + at
            HEAD.pack_into(self._mm, off, gap, T_PAD, 0, 0)
            _SEALS[0](self._mm, off + gap - 8, seq ^ SEQ_KEY)
            if gap > ALIGN:
                self._mm[off + HEAD.size : off + gap - 8] = bytes(gap - 8 - HEAD.size)
            cur.seq = seq
            pos += gap
            cur.head = pos
        else:
            self._make_room(pos + n)
        return pos

    def _make_room(self, end: int) -> None:
        if end - self.cur.tail <= self.ring_size:
            return
        if not self.flight:
            raise LogFull
        # A sixteenth of the ring more than the entry needs: the entries after it find
        # room on the writers' fast path (the C one's) until that is used, where dropping
        # only what each needs sent every entry of a ring gone round through here.
        self._drop_until(end - self.ring_size + (self.ring_size >> DROP_SHIFT))

    def _drop_until(self, new_tail: int) -> None:
        """Flight: forget the oldest entries up to `new_tail`, keeping the ENTER of a call
        still open to write again ahead (it names the call its DONE completes), as long as
        the open calls take at most a quarter of the ring."""
        mm, mask, at0, cur = self._mm, self._mask, self._ring_at, self.cur
        old = cur.tail
        tail, seq = self._skip(old, new_tail, cur.tail_seq)
        self._flush_open()
        open_ = self.open
        carried = self._carried
        room = self.ring_size // 4 - sum(map(len, carried))  # open calls may fill a quarter, no more
        # the open calls whose newest ENTER goes, oldest first
        for pos, cid in sorted((pos, cid) for cid, pos in open_.items() if old <= pos < tail):
            off = at0 + (pos & mask)
            length, _, _, aux = HEAD.unpack_from(mm, off)
            if length <= room and aux >> 8 < MAX_CARRIES:
                carried.append(bytes(mm[off : off + length]))
                room -= length
            else:  # open for laps, or too many open for this ring: let go
                del open_[cid]
        cur.tail, cur.tail_seq = tail, seq
        self._write_live(None, None)

    def _flush_open(self) -> None:
        """Before `open` is read here: the C cursor keeps the newest call it entered out of
        it (a blocking call's ENTER and DONE then touch no dict); this puts it in."""
        flush = getattr(self.cur, "flush_open", None)
        if flush is not None:
            flush()

    def _pop_open(self, cid: int) -> None:
        self._flush_open()
        self.open.pop(cid, None)

    def _skip(self, tail: int, until: int, seq: int) -> tuple[int, int]:
        """(ring position, seq) past the whole entries from `tail` (its seq `seq`) while
        before `until` and the head."""
        skip = getattr(self.cur, "skip", None)  # (a C extension built before it has none)
        if skip is not None:
            return skip(tail, until, seq)
        mm, mask, at0, head = self._mm, self._mask, self._ring_at, self.cur.head
        while tail < until and tail < head:
            n = _LENGTH.unpack_from(mm, at0 + (tail & mask))[0]
            if n < ALIGN or n % ALIGN or n > self.ring_size:
                raise ValueError(f"the call log's ring: an entry of {n} bytes at {tail}")
            tail += n
            seq += 1
        return tail, seq

    def _carry(self) -> None:
        """With the lock held: write the ENTERs that room-making took out, as copies (at
        most one round of the open calls: making room for one may take out another; what
        is left goes after the next entry, which the cursor's `busy` sends here too)."""
        cur = self.cur
        carried = self._carried
        self._flush_open()
        for _ in range(len(self.open) + 1):
            if not carried:
                return
            raw = carried.pop(0)
            cid = SEQ.unpack_from(raw, CID_AT)[0]
            if cid not in self.open:
                continue  # completed meanwhile
            n = len(raw)
            try:
                pos = self._room(n)
            except LogFull:
                carried.clear()
                return
            seq = cur.seq + 1
            off = self._ring_at + (pos & self._mask)
            mm = self._mm
            mm[off : off + n - 8] = raw[: n - 8]
            mm[off + 5] = raw[5] | E_COPY
            mm[off + 7] = min(255, raw[7] + 1)  # aux's high byte: how many times it was carried
            _SEALS[0](mm, off + n - 8, seq ^ SEQ_KEY)
            cur.seq = seq
            cur.head = pos + n
            self.open[cid] = pos

    # --- the program's path (the Python twins of the C speedups) ---------------------

    def _enter(self, flags, start, prev, step, group, call_seq, peer, tag, in_desc, out_desc, stack, op, reduce_op,
               mem_alloc, mem_peak, payload=None) -> int:
        """Write a call as entered; its call id (for done), or -1 when it found no room.
        The inputs' payload: bytes, or (address, nbytes, what): one tensor's bytes in
        memory, copied here (what: P_BYTES and P_DIGEST_BYTES, or P_BYTES), or [what,
        address, nbytes, address, nbytes, ...]: several tensors' bytes in memory."""
        if type(payload) is tuple:
            payload = _one_tensor(*payload)
        elif type(payload) is list:
            payload = _tensors(payload)
        if payload is None:
            n = ENTER.size
        else:
            used = ENTER_BODY.size + len(payload)
            n = _pad(used + 8)
        lock = self.lock
        lock.acquire()
        cur = self.cur
        cur.busy = 1
        try:
            pos = cur.head
            at = pos & self._mask
            if at + n > self.ring_size or pos + n - cur.tail > self.ring_size:
                pos = self._room(n)
                at = pos & self._mask
            seq = cur.seq + 1
            off = self._ring_at + at
            mm = self._mm
            if payload is None:
                _pack_enter(mm, off, n, T_ENTER, flags, 0, start, prev, seq, step, group, call_seq, peer, tag,
                            in_desc, out_desc, stack, op, reduce_op, mem_alloc, mem_peak, seq ^ SEQ_KEY)
            else:
                _pack_enter_body(mm, off, n, T_ENTER, flags, AUX_PAYLOAD, start, prev, seq, step, group, call_seq,
                                 peer, tag, in_desc, out_desc, stack, op, reduce_op, mem_alloc, mem_peak)
                mm[off + ENTER_BODY.size : off + used] = payload
                _SEALS[n - 8 - used](mm, off + used, seq ^ SEQ_KEY)
            cur.seq = seq
            cur.head = pos + n
            if self.flight:
                self.open[seq] = pos
            if self._carried:
                self._carry()
            return seq
        except LogFull:
            self.dropped += 1
            return -1
        finally:
            cur.busy = 1 if self._carried else 0
            lock.release()

    def _done(self, cid: int, end: int, issued: int, flags: int = 0, peer: int = -1, call_seq: int = -1,
              payload=None) -> int:
        """Write a call's completion (cid: what enter returned); 0. `payload`: the
        outputs', as enter's. A call whose ENTER found no room (cid -1) is dropped too."""
        if cid < 0:
            with self.lock:
                self.dropped += 1
            return 0
        if type(payload) is tuple:
            payload = _one_tensor(*payload)
        elif type(payload) is list:
            payload = _tensors(payload)
        if payload is None:
            n = DONE.size
        else:
            used = DONE_BODY.size + len(payload)
            n = _pad(used + 8)
        lock = self.lock
        lock.acquire()
        cur = self.cur
        cur.busy = 1
        try:
            pos = cur.head
            at = pos & self._mask
            if at + n > self.ring_size or pos + n - cur.tail > self.ring_size:
                pos = self._room(n)
                at = pos & self._mask
            seq = cur.seq + 1
            off = self._ring_at + at
            mm = self._mm
            if payload is None:
                _pack_done(mm, off, n, T_DONE, flags, 0, cid, end, issued, peer, 0, call_seq, seq ^ SEQ_KEY)
            else:
                _pack_done_body(mm, off, n, T_DONE, flags, AUX_PAYLOAD, cid, end, issued, peer, 0, call_seq)
                mm[off + DONE_BODY.size : off + used] = payload
                _SEALS[n - 8 - used](mm, off + used, seq ^ SEQ_KEY)
            cur.seq = seq
            cur.head = pos + n
            self._pop_open(cid)
            if self._carried:
                self._carry()
        except LogFull:
            self.dropped += 1
            self._pop_open(cid)
        finally:
            cur.busy = 1 if self._carried else 0
            lock.release()
        return 0

    def out(self, cid: int, payload: bytes | None, inputs: bool = False) -> None:
        """The outputs' payload of a call whose DONE said D_OUT_LATER, or with `inputs` the
        inputs' of one whose ENTER said E_IN_LATER (None: there is none)."""
        if cid < 0:  # a call whose ENTER found no room: dropped (and counted) already
            return
        flags = O_INPUTS if inputs else 0
        if payload is None:
            self._append(OUT.size, lambda mm, off, n, seq: OUT.pack_into(mm, off, n, T_OUT, flags, 0, cid, seq))
        else:
            self._append(OUT_BODY.size + len(payload) + 8, lambda mm, off, n, seq: OUT_BODY.pack_into(
                mm, off, n, T_OUT, flags, AUX_PAYLOAD, cid), payload, OUT_BODY.size)

    def record(self, row) -> None:
        """Any other record, as a row (kind, its fields in wire order)."""
        body = msgpack.packb(row, use_bin_type=True)
        self._append(BODY_AT + len(body) + 8, _body_head(T_REC, len(body), 0), body, BODY_AT)

    def _append(self, size: int, write, tail=None, tail_at: int = 0) -> None:
        n = _pad(size)
        with self._exclusive():
            cur = self.cur
            try:
                pos = self._room(n)
            except LogFull:
                self.dropped += 1
                return
            seq = cur.seq + 1
            off = self._ring_at + (pos & self._mask)
            mm = self._mm
            write(mm, off, n, seq ^ SEQ_KEY)
            if tail is not None:
                used = tail_at + len(tail)
                mm[off + tail_at : off + used] = tail
                _SEALS[n - 8 - used](mm, off + used, seq ^ SEQ_KEY)
            cur.seq = seq
            cur.head = pos + n
            if self._carried:
                self._carry()

    @contextmanager
    def _exclusive(self):
        """The log's lock, with the cursor busy: the C path stands aside meanwhile."""
        with self.lock:
            cur = self.cur
            cur.busy = 1
            try:
                yield
            finally:
                cur.busy = 1 if self._carried or self.closed else 0

    # --- the persistent region ---------------------------------------------------------

    def persist(self, kind: int, body: bytes, ident: int = 0) -> bool:
        """Append a DEF, INFO or REC entry to the persistent region; False when it is full
        (the caller writes the record to the ring instead)."""
        used = BODY_AT + len(body)
        n = _pad(used + 8)
        with self.lock:
            if self.closed:
                raise ValueError("the call log is closed")
            at = self._p_head
            if at + n > self.persist_size:
                self.persist_full = True
                return False
            seq = self._p_seq + 1
            off = HEADER_AREA + at
            mm = self._mm
            BODY_HEAD.pack_into(mm, off, n, kind, 0, 0, len(body), ident)
            mm[off + BODY_AT : off + used] = body
            _SEALS[n - 8 - used](mm, off + used, seq ^ SEQ_KEY)
            self._p_seq = seq
            self._p_head = at + n
            return True

    def define(self, ident: int, value) -> bool:
        """Dictionary entry `ident` -> value (a desc, a stack, a name); False if no room."""
        return self.persist(T_DEF, msgpack.packb(value, use_bin_type=True), ident)

    def info(self, info: dict) -> bool:
        return self.persist(T_INFO, msgpack.packb(info, use_bin_type=True))

    def persist_record(self, row) -> None:
        """A record every later reader needs (GroupInfo): in the persistent region, else
        in the ring."""
        if not self.persist(T_REC, msgpack.packb(row, use_bin_type=True)):
            self.record(row)

    # --- the pages ahead ----------------------------------------------------------------

    def prefault(self, ahead: int = PREFAULT_AHEAD) -> bool:
        """Fault in, writable, the ring's pages not yet written from the head on, up to
        `ahead` bytes past it, so that the program's stores find them ready: at creation,
        then from the recorder's own threads (the compactor's, flight mode's watchdog). The
        first lap only: then every page of the ring is in memory, and faulting one in again
        would only make the kernel write it back again (a page written back faults once
        more at the program's next store into it, without the zeroing). False where the
        kernel cannot (no MADV_POPULATE_WRITE: the stores fault as before) or the log is
        closed."""
        head = self.cur.head
        start, end = max(self._faulted, head), min(head + ahead, self.ring_size)
        if start >= end:
            return self._populate is not None and not self.closed
        if not self._prefault(self._ring_at - HEADER_AREA + start, end - start):
            return False
        self._faulted = end
        return True

    def _prefault(self, at: int, n: int) -> bool:
        """MADV_POPULATE_WRITE over n bytes from `at` past the header area, a megabyte at a
        time, each under the log's lock (close unmaps under it), without the GIL (ctypes
        lets it go; mmap.madvise would hold it while the kernel faults the pages in)."""
        at += HEADER_AREA
        page = at & ~(mmap.PAGESIZE - 1)
        end = at + n
        while page < end:
            step = min(end - page, 1 << 20)
            with self.lock:
                if self._populate is None or self.closed:
                    return False
                failed = _madvise(self._base + page, step, self._populate) != 0
            if failed:
                self._populate = None  # an older kernel, or a file system that refuses: no more tries
                return False
            page += step
        return True

    # --- readers of a live log (the compactor, a flight dump) --------------------------

    def _write_live(self, persist_done, ring_done) -> None:
        cur = LIVE.unpack_from(self._mm, LIVE_AT)
        LIVE.pack_into(self._mm, LIVE_AT, self.cur.tail, self.cur.tail_seq,
                       cur[2] if persist_done is None else persist_done,
                       cur[3] if ring_done is None else ring_done, cur[4])

    def snapshot(self) -> LogContents:
        """A copy of what the log holds now (for a flight dump), as read_log would find it."""
        with self._exclusive():
            persist = bytes(self._mm[HEADER_AREA : HEADER_AREA + self._p_head])
            head, tail, tail_seq, _ = self.cur.state()
            ring = bytes(self._mm[self._ring_at : self._ring_at + self.ring_size])
        return LogContents(rank=self.rank, flight=self.flight, attempt=0, persist=persist, ring=ring, tail=tail,
                           tail_seq=tail_seq, head=head, persist_done=0, ring_done=0)

    def view(self) -> tuple[memoryview, int, int, int]:
        """(the ring, tail, tail seq, head) for the compactor: the entries between tail and
        head stay as they are until the compactor itself moves the tail (`consume`)."""
        with self._exclusive():
            head, tail, tail_seq, _ = self.cur.state()
            return memoryview(self._mm)[self._ring_at : self._ring_at + self.ring_size], tail, tail_seq, head

    def persisted(self) -> tuple[memoryview, int]:
        """(the persistent region, how far it is written)."""
        with self.lock:
            return memoryview(self._mm)[HEADER_AREA : HEADER_AREA + self.persist_size], self._p_head

    def consume(self, tail: int, tail_seq: int, persist_done: int, ring_done: int) -> None:
        """The compactor wrote everything before these to the spool: the ring's room up to
        `tail` is free."""
        with self._exclusive():
            cur = self.cur
            if tail > cur.tail:
                cur.tail, cur.tail_seq = tail, tail_seq
            self._write_live(persist_done, ring_done)

    def close(self, remove: bool = False) -> None:
        """Mark the log closed (its records are all in the spool) and unmap it. Writes
        after this raise ValueError (the recorder is off by then)."""
        with self._exclusive():
            if self.closed:
                return
            self.closed = True
            cur = self.cur
            try:
                live = LIVE.unpack_from(self._mm, LIVE_AT)
                LIVE.pack_into(self._mm, LIVE_AT, *live[:4], STATE_CLOSED)
            except ValueError:
                pass
            cur.release()
            cur.busy = 1  # for good: the C path sends every write to the Python one, which fails
            try:
                self._mm.close()
            except BufferError:
                pass  # a view of it is still held (a compactor's): unmapped when dropped
        if remove:
            self.path.unlink(missing_ok=True)


def _body_head(kind: int, length: int, ident: int):
    def write(mm, off, n, seq):
        BODY_HEAD.pack_into(mm, off, n, kind, 0, 0, length, ident)
    return write


# --- reading ----------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class LogContents:
    """A call log's bytes: its persistent region (as far as written) and its ring, with
    where the readable part of the ring starts (tail, its seq) and the writer's head
    (None when read from a file: the reader walks on while seqs follow)."""

    rank: int
    flight: bool
    attempt: int
    persist: bytes
    ring: bytes
    tail: int
    tail_seq: int
    head: int | None
    persist_done: int
    ring_done: int
    closed: bool = False
    pid: int = 0


def read_log(path) -> LogContents:
    """A call log file (a dead rank's or a live one's): FormatError if it is none."""
    path = Path(path)
    where = f"call log {path.name}"
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < HEADER_AREA:
            raise FormatError(f"{where}: too short for a call log ({size} bytes)")
        head = f.read(HEADER_AREA)
        magic, version, flags, rank, persist_size, ring_size, pid, attempt, crc = HEADER.unpack_from(head, 0)
        if magic != MAGIC or layout.crc32(head[: HEADER.size - 4]) != crc:
            raise FormatError(f"{where}: not a prism-rr call log (bad header)")
        if version != VERSION:
            raise FormatError(f"{where}: call log version {version}, this reader supports {VERSION}")
        if not (persist_size <= MAX_PERSIST and MIN_RING <= ring_size <= MAX_RING
                and ring_size & (ring_size - 1) == 0):
            raise FormatError(f"{where}: region sizes out of bounds ({persist_size}, {ring_size})")
        if size < HEADER_AREA + persist_size + ring_size:
            raise FormatError(f"{where}: {size} bytes, its header says {HEADER_AREA + persist_size + ring_size}")
        tail, tail_seq, persist_done, ring_done, state = LIVE.unpack_from(head, LIVE_AT)
        persist = f.read(persist_size)
        ring = f.read(ring_size)
    return LogContents(rank=rank, flight=bool(flags & F_FLIGHT), attempt=attempt, persist=persist, ring=ring,
                       tail=tail, tail_seq=tail_seq, head=None, persist_done=persist_done, ring_done=ring_done,
                       closed=state == STATE_CLOSED, pid=pid)


def _entry_at(buf, at: int, end: int, expect: int | None):
    """(length, type, flags, aux) of the entry at `at` if it is whole (its seq, in its last
    8 bytes, is `expect`, or any seq if None) and ends by `end`, else None."""
    if at + ALIGN > end:
        return None
    length, kind, flags, aux = HEAD.unpack_from(buf, at)
    if length < ALIGN or length % ALIGN or at + length > end or length > MAX_ENTRY:
        return None
    seq = SEQ.unpack_from(buf, at + length - 8)[0] ^ SEQ_KEY
    if (seq != expect) if expect is not None else not 0 < seq < 1 << 48:
        return None
    return length, kind, flags, aux, seq


def persist_entries(buf, end: int | None = None, start: int = 0, first_seq: int | None = None):
    """(offset, type, id, body) of the persistent region's entries from `start`, in order, up
    to `end` or the first that is not whole."""
    end = len(buf) if end is None else min(end, len(buf))
    at = start
    expect = first_seq
    while True:
        got = _entry_at(buf, at, end, expect)
        if got is None:
            return
        length, kind, _flags, _aux, seq = got
        if length < BODY_AT + 8:
            return
        size, ident = BODY_HEAD.unpack_from(buf, at)[4:]
        if BODY_AT + size + 8 > length:
            return
        yield at, kind, ident, bytes(buf[at + BODY_AT : at + BODY_AT + size])
        expect = seq + 1
        at += length


def ring_entries(ring, tail: int, tail_seq: int, head: int | None = None):
    """(position, seq, type, flags, aux, entry as a memoryview) of the ring's entries from
    `tail`: up to `head` where known, else while each entry's seq follows the last."""
    size = len(ring)
    mask = size - 1
    view = memoryview(ring)
    pos, expect = tail, tail_seq
    stop = tail + size if head is None else head
    while pos < stop:
        at = pos & mask
        got = _entry_at(ring, at, size, expect)
        if got is None or pos + got[0] - tail > size:
            return
        length, kind, flags, aux, _ = got
        yield pos, expect, kind, flags, aux, view[at : at + length]
        expect += 1
        pos += length


def _payload(buf, at: int, where: str):
    """(digests, blob ids, datas, digest the bytes) of the payload at `at`."""
    n, what, _, total = PAYLOAD_HEAD.unpack_from(buf, at)
    at += PAYLOAD_HEAD.size
    digests = blobs = datas = None
    if what & P_DIGESTS:
        digests = struct.unpack_from(f"<{n}Q", buf, at)
        at += 8 * n
    if what & P_BLOBS:
        blobs = tuple(bytes(buf[at + 16 * i : at + 16 * (i + 1)]) for i in range(n))
        at += 16 * n
    if what & P_BYTES:
        lens = struct.unpack_from(f"<{n}I", buf, at)
        at += 4 * n
        if sum(lens) != total or at + total > len(buf):
            raise FormatError(f"{where}: a payload's lengths do not add up")
        datas = []
        for k in lens:
            datas.append(bytes(buf[at : at + k]))
            at += k
    return digests, blobs, datas, bool(what & P_DIGEST_BYTES)


_collective = codec.row_maker(Collective, (
    "start_ns", "end_ns", "step", "op", "group", "seq", "in_shapes", "in_dtypes", "in_bytes", "out_shapes",
    "out_dtypes", "out_bytes", "reduce_op", "root", "async_op", "issued_ns", "digest_in", "digest_out",
    "blob_in", "blob_out", "mem_alloc", "mem_peak", "stack"))
_point_to_point = codec.row_maker(PointToPoint, (
    "start_ns", "end_ns", "step", "op", "group", "seq", "peer", "tag", "shapes", "dtypes", "nbytes",
    "async_op", "issued_ns", "digest", "blob", "mem_alloc", "mem_peak", "stack"))
_compute = codec.row_maker(Compute, ("start_ns", "end_ns", "step", "mem_alloc", "mem_peak"))
_NO_DESC = ((), (), 0)


def _small_digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _blob_id(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=layout.BLOB_ID_LEN).digest()


@dataclass(slots=True)
class _Open:
    """A call entered and not yet made a record: the ENTER's fields, its inputs' payload,
    and what completion brought."""

    fields: tuple
    flags: int
    payload_in: tuple | None
    pos: int  # where its newest ENTER lies in the ring, and that entry's seq
    seq: int
    end: int | None = None
    issued: int | None = None
    peer: int | None = None
    call_seq: int | None = None
    payload_out: tuple | None = None
    waiting_out: bool = False
    waiting_in: bool = False  # E_IN_LATER: its inputs' payload not in yet
    got_out: bool = False  # its outputs' OUT is in
    spilled: bool = False  # in the spool's open-calls snapshot already (the compactor's)


@dataclass(slots=True)
class LogDecoder:
    """Turns call log entries into records, in entry order: a call's record when it
    completes (its Compute gap when it is entered), every other record as it comes.
    Blobs found in payloads go to `blobs` (id -> bytes) for whoever writes them.

    `quiet_below`: entries with a lower seq were already turned into records by someone
    else (the compactor, before a death): they update the open calls, emit nothing.
    """

    where: str
    defs: dict = field(default_factory=dict)
    pending: dict = field(default_factory=dict)  # call id -> _Open
    blobs: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    persist_records: list = field(default_factory=list)
    quiet_below: int = 0

    def read_persistent(self, buf, end: int | None = None, start: int = 0, *, records_from: int = 0) -> int:
        """Take the dictionary, rank info and records of a persistent region (records and
        info only at or past `records_from`); returns where it stopped."""
        stop = start
        for at, kind, ident, body in persist_entries(buf, end, start):
            stop = at + HEAD.unpack_from(buf, at)[0]
            if kind == T_DEF:
                self.defs[ident] = codec.unpack(body, f"{self.where}, dictionary entry {ident}")
            elif at < records_from:
                continue
            elif kind == T_INFO:
                info = codec.unpack(body, f"{self.where}, rank info")
                if type(info) is dict:
                    self.info.update(info)
            elif kind == T_REC:
                self.persist_records.append(self._record(body))
        return stop

    def _def(self, ident: int, default=None):
        if ident == 0:
            return default
        try:
            return self.defs[ident]
        except KeyError:
            raise FormatError(f"{self.where}: dictionary entry {ident} is missing") from None

    def _record(self, body):
        row = codec.unpack(body, f"{self.where}, record")
        if type(row) is not tuple or not row or type(row[0]) is not int:
            raise FormatError(f"{self.where}: a record entry is not a row")
        cls = RECORD_TYPES.get(row[0])
        if cls is None:
            return None
        names = [name for name, _ in cls.WIRE]
        if len(row) - 1 != len(names):
            raise FormatError(f"{self.where}: a {cls.__name__} row has {len(row) - 1} fields, not {len(names)}")
        try:
            return cls(**dict(zip(names, row[1:])))
        except TypeError as exc:
            raise FormatError(f"{self.where}: a {cls.__name__} row is malformed ({exc})") from None

    def feed(self, pos: int, seq: int, kind: int, flags: int, aux: int, entry) -> list:
        """The records entry `seq` (at ring position `pos`) makes (a list, often empty)."""
        quiet = seq < self.quiet_below
        if kind == T_ENTER:
            return self._enter(pos, seq, flags, aux, entry, quiet)
        if kind == T_DONE:
            return self._done(flags, aux, entry, quiet)
        if kind == T_OUT:
            return self._out(flags, aux, entry, quiet)
        if kind == T_REC:
            return [] if quiet else self._rec(entry)
        return []  # padding; a kind from a newer writer

    def _enter(self, pos: int, seq: int, flags: int, aux: int, entry, quiet: bool) -> list:
        """A call entered: pending until it completes; the compute before it, if any."""
        (_, _, _, _, start, prev, cid, step, group, call_seq, peer, tag, in_desc, out_desc, stack, op,
         reduce_op, alloc, peak) = ENTER_BODY.unpack_from(entry, 0)
        known = self.pending.get(cid)
        if known is not None:  # a copy of a call's ENTER (E_COPY): the call is known already
            known.pos, known.seq = pos, seq
            return []
        payload = _payload(entry, ENTER_BODY.size, self.where) if aux & AUX_PAYLOAD else None
        mem_alloc = None if alloc < 0 else alloc
        mem_peak = None if peak < 0 else peak
        self.pending[cid] = _Open((start, step, group, call_seq, peer, tag, in_desc, out_desc, stack, op,
                                   reduce_op, mem_alloc, mem_peak), flags, payload, pos, seq,
                                  waiting_in=bool(flags & E_IN_LATER))
        if quiet or flags & E_COPY or prev <= 0 or start <= prev:
            return []
        return [_compute(prev, start, step, mem_alloc, mem_peak)]

    def _done(self, flags: int, aux: int, entry, quiet: bool) -> list:
        """A call completed: its record, unless a payload of it is still to come."""
        _, _, _, _, cid, end, issued, peer, _, call_seq = DONE_BODY.unpack_from(entry, 0)
        call = self.pending.get(cid)
        if call is None:
            return []  # its ENTER is older than what was kept (a flight ring)
        call.end = end
        call.issued = issued or None
        if flags & D_SOURCED:
            call.peer, call.call_seq = peer, call_seq
        if aux & AUX_PAYLOAD:
            call.payload_out = _payload(entry, DONE_BODY.size, self.where)
        if flags & D_OUT_LATER and not call.got_out:  # (its OUT may have come first: a backend thread's DONE)
            call.waiting_out = True
            return []
        if call.waiting_in:
            return []
        del self.pending[cid]
        return [] if quiet else [self._call_record(call)]

    def _out(self, flags: int, aux: int, entry, quiet: bool) -> list:
        """A call's input or output payload, written after it: its record, once it is done
        and no other payload is to come."""
        cid = OUT_BODY.unpack_from(entry, 0)[4]
        call = self.pending.get(cid)
        if call is None:
            return []
        payload = _payload(entry, OUT_BODY.size, self.where) if aux & AUX_PAYLOAD else None
        if flags & O_INPUTS:
            call.payload_in, call.waiting_in = payload, False
        else:
            call.payload_out, call.waiting_out, call.got_out = payload, False, True
        if call.end is None or call.waiting_in or call.waiting_out:
            return []  # its DONE, or another payload, is still to come
        del self.pending[cid]
        return [] if quiet else [self._call_record(call)]

    def _rec(self, entry) -> list:
        """A record written whole (a row in the entry's body)."""
        if len(entry) < BODY_AT + 8:
            raise FormatError(f"{self.where}: a record entry is too short")
        size = BODY_HEAD.unpack_from(entry, 0)[4]
        if BODY_AT + size + 8 > len(entry):
            raise FormatError(f"{self.where}: a record entry's body overruns it")
        rec = self._record(entry[BODY_AT : BODY_AT + size])
        return [] if rec is None else [rec]

    def open_records(self) -> list:
        """Records of the calls still pending: entered and never completed (end_ns nil), or
        completed with their outputs' payload never written."""
        out = [self._call_record(c) for c in self.pending.values()]
        self.pending.clear()
        return out

    def spilled_records(self) -> list:
        """Records of the spilled calls still pending, as they stand (see open_records);
        they stay pending."""
        return [self._call_record(c) for c in self.pending.values() if c.spilled]

    def _blob_ids(self, payload, digest_default: bool):
        digests, blobs, datas, digest_bytes = payload
        if datas is not None:
            ids = []
            for data in datas:
                ident = _blob_id(data)
                self.blobs[ident] = data
                ids.append(ident)
            blobs = tuple(ids)
            if digest_bytes:
                digests = tuple(map(_small_digest, datas))
        return (None if digests is None else tuple(digests)), blobs

    def _call_record(self, call: _Open):
        (start, step, group, call_seq, peer, tag, in_desc, out_desc, stack, op, reduce_op, mem_alloc,
         mem_peak) = call.fields
        flags = call.flags
        if call.peer is not None:
            peer, call_seq = call.peer, call.call_seq
        digest_in = blob_in = digest_out = blob_out = None
        if call.payload_in is not None:
            digest_in, blob_in = self._blob_ids(call.payload_in, True)
        if call.payload_out is not None:
            digest_out, blob_out = self._blob_ids(call.payload_out, True)
        ins = self._def(in_desc, _NO_DESC)
        op_name = self._def(op, "?")
        stack_v = self._def(stack)
        if flags & E_P2P:
            shapes, dtypes, nbytes = ins
            # a receive's payload is what arrived: its outputs
            digest, blob = (digest_out, blob_out) if flags & E_RECV else (digest_in, blob_in)
            return _point_to_point(start, call.end, step, op_name, group, call_seq, peer, tag, shapes, dtypes,
                                   nbytes, bool(flags & E_ASYNC), call.issued, digest, blob, mem_alloc, mem_peak,
                                   stack_v)
        outs = ins if flags & E_SAME_OUT else self._def(out_desc, _NO_DESC)
        return _collective(start, call.end, step, op_name, group, call_seq, ins[0], ins[1], ins[2], outs[0],
                           outs[1], outs[2], self._def(reduce_op), None if peer < 0 else peer,
                           bool(flags & E_ASYNC), call.issued, digest_in, digest_out, blob_in, blob_out, mem_alloc,
                           mem_peak, stack_v)


def decode_log(contents: LogContents, *, where: str | None = None) -> tuple[LogDecoder, list]:
    """Every record a call log holds that its spool does not (a dead rank's, read by
    `pack` or `repair`): the records past what the compactor wrote, then the calls still
    open. Returns (the decoder, with its info and blobs; the records)."""
    where = where or f"call log of rank {contents.rank}"
    dec = LogDecoder(where)
    dec.read_persistent(contents.persist, records_from=contents.persist_done)
    records = list(dec.persist_records)
    dec.quiet_below = contents.ring_done + 1 if contents.ring_done else 0
    for pos, seq, kind, flags, aux, entry in ring_entries(contents.ring, contents.tail, contents.tail_seq,
                                                         contents.head):
        try:
            records += dec.feed(pos, seq, kind, flags, aux, entry)
        except (struct.error, IndexError) as exc:
            raise FormatError(f"{where}: entry {seq} is malformed ({exc})") from None
    records += dec.open_records()
    return dec, records
