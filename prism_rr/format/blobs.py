"""Content-addressed payload blobs in a spool directory: a large one a file of its own
(ranks that make the same bytes share it), small ones appended to their writer's pack
file (a file each would cost the writer five system calls for a few bytes: a `digest`
recording keeps the payload of every call of at most 1 KiB)."""

from __future__ import annotations

import hashlib
import itertools
import mmap
import os
import re
import socket
import struct
import threading
import time
from collections import deque
from pathlib import Path

from prism_rr.errors import FormatError
from prism_rr.format import codec, layout

__all__ = ["KEEP_SMALL", "BlobWriter", "blob_id", "blob_level", "blob_path", "host_packs", "pack_entries",
           "spool_blobs", "write_blob"]


# A `digest` recording keeps the payload of calls this small (in bytes, all tensors of
# the call together): control data such as sizes, flags and losses, which a replay must
# not make up.
KEEP_SMALL = 1024

# Payloads this large (full mode's parameters and gradients) are compressed with zstd's
# fastest level: records wait for the blobs they name before they reach the disk, and
# must reach it within 100 ms. Tensors of floats gain little from a slower level (under
# 10% at level 3, at a third of the speed).
FAST_BLOB = 1 << 20
FAST_LEVEL = -1


# Blobs at most this large go to their writer's pack file: spool_dir/blobs/*.pack, each
# entry a header (magic, id, stored length, CRC-32 of the stored bytes) and the zstd frame.
PACK_LIMIT = 64 << 10
PACK_MAGIC = b"PRBP"
PACK_HEAD = struct.Struct("<4s16sII")
PACK_SUFFIX = ".pack"


def blob_level(size: int) -> int:
    """The zstd level a blob of `size` bytes is stored with."""
    return FAST_LEVEL if size >= FAST_BLOB else 3


def blob_id(data) -> bytes:
    """The 16-byte content id of a payload (BLAKE2b-128 of its raw bytes)."""
    return hashlib.blake2b(data, digest_size=layout.BLOB_ID_LEN).digest()


def blob_path(spool_dir: str | os.PathLike, ident: bytes) -> Path:
    """Where a spool directory keeps blob `ident`: always under `spool_dir/blobs`, since
    only a 16-byte id is taken (an id read from a bundle is anything a stranger wrote)."""
    if type(ident) is not bytes or len(ident) != layout.BLOB_ID_LEN:
        what = f"{len(ident)} bytes" if type(ident) is bytes else type(ident).__name__
        raise FormatError(f"a blob id is {layout.BLOB_ID_LEN} bytes, not {what}")
    h = ident.hex()
    return Path(spool_dir) / "blobs" / h[:2] / f"{h}.zst"


def write_blob(spool_dir: str | os.PathLike, data) -> bytes:
    """Store `data` once under its content id and return the id.

    Ranks that produce the same bytes (an all_reduce result) write the same file; the
    rename makes the write atomic, so a reader never sees half a blob.
    """
    ident = blob_id(data)
    _store(spool_dir, ident, data)
    return ident


def _store(spool_dir, ident: bytes, data) -> None:
    path = blob_path(spool_dir, ident)
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_bytes(codec.compress(bytes(data), blob_level(len(data))))  # bytes of bytes is no copy
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half blob behind
        raise


def _pack_entry(ident: bytes, data) -> bytes:
    stored = codec.compress(bytes(data), blob_level(len(data)))
    return PACK_HEAD.pack(PACK_MAGIC, ident, len(stored), layout.crc32(stored)) + stored


def _host() -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in socket.gethostname())[:64] or "host"


def pack_name(n: int) -> str:
    """This process's n-th pack file name: host, process and a random token, so no other
    writer's (on this node or another sharing the directory, or an earlier run's whose
    process had the same id) is the same."""
    return f"{_host()}-{os.getpid()}-{n}{os.urandom(4).hex()}{PACK_SUFFIX}"


def host_packs(spool_dir: str | os.PathLike) -> list[Path]:
    """The pack files this host's writers made in a spool directory (pack_name's; not
    those of another host, even one whose name starts with this one's)."""
    name = re.compile(re.escape(_host()) + r"-\d+-\d+[0-9a-f]{8}" + re.escape(PACK_SUFFIX))
    return [p for p in (Path(spool_dir) / "blobs").glob(f"*{PACK_SUFFIX}") if name.fullmatch(p.name)]


def pack_entries(path: Path):
    """(id, stored zstd frame) of each entry of a pack file, in order, up to its end or to
    the first entry that is torn or does not check out (a writer killed mid-write). The
    file is mapped, not read: only the entry at hand is held in memory."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < PACK_HEAD.size:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            at = 0
            while at + PACK_HEAD.size <= size:
                magic, ident, n, crc = PACK_HEAD.unpack_from(data, at)
                start = at + PACK_HEAD.size
                if magic != PACK_MAGIC or start + n > size:
                    return
                stored = data[start: start + n]
                if layout.crc32(stored) != crc:
                    return
                yield ident, stored
                at = start + n


def spool_blobs(spool_dir: str | os.PathLike):
    """(id, where, read) of every blob a spool directory holds, files first, then pack
    entries (an id may come more than once: ranks that made the same bytes); `read()`
    gives its stored zstd frame."""
    where = Path(spool_dir) / "blobs"
    if not where.is_dir():
        return
    for path in sorted(where.glob("*/*.zst"), key=lambda p: p.name):
        try:
            ident = bytes.fromhex(path.name[: -len(".zst")])
        except ValueError:
            continue
        yield ident, path.name, path.read_bytes
    for path in sorted(where.glob(f"*{PACK_SUFFIX}")):
        for ident, stored in pack_entries(path):
            yield ident, f"{path.name}, {ident.hex()}", lambda stored=stored: stored


_packs = itertools.count()


class BlobWriter:
    """Stores blobs from a thread of its own: the caller hands over a copy of the bytes
    and gets the id at once; compression and the write happen beside it.

    At most `max_delay_s` of compression waits (at the rate the thread has shown) and
    at most `max_pending` bytes; past either, `put` stores the blob itself. So a
    recording that produces payloads faster than one thread compresses them slows down
    rather than grow without bound, and records, which wait for their blobs (below),
    still reach the disk within the spool's 100 ms. The first error is kept in `error`
    (the caller turns itself off); later blobs are not written.

    `queued` counts the blobs handed to the thread and `stored` those it is done with, in
    order: a spool writer notes `queued` when it takes records and waits for `stored` to
    reach it before writing them (`wait_stored`), so no record on disk names a blob that
    is not (a rank killed in between loses the records, not their payloads).

    The thread gathers small blobs into batches: it takes what is queued once
    `BATCH_BLOBS` blobs or `BATCH_BYTES` bytes wait, `BATCH_S` after the first of them,
    or at once when a spool writer waits for them or the writer closes. A recording that
    keeps a payload of every small call (`digest`) would otherwise wake the thread, take
    the GIL from the program and make a system call for every call.
    """

    BATCH_BLOBS = 512
    BATCH_BYTES = 256 << 10
    BATCH_S = 0.02
    # The ids stored, to store each content once: at most this many (about 100 bytes
    # each), then forgotten all at once. A long recording whose small calls carry new
    # values (a loss, a step counter) grew it by two a call; a blob stored again after
    # is written twice and read once (`pack` takes each id once).
    KNOWN_MAX = 1 << 16

    def __init__(self, spool_dir: str | os.PathLike, max_pending: int = 32 << 20, max_delay_s: float = 0.03):
        self.spool_dir = Path(spool_dir)
        self._pack: int | None = None  # the pack file's descriptor, once opened
        self._pack_lock = threading.Lock()  # `put` may store a blob itself, beside the thread
        self.max_pending = max_pending
        self.max_delay_s = max_delay_s
        self.rate = 200e6  # bytes a second the thread stores, as last measured
        self.error: BaseException | None = None
        self.pending = 0  # bytes queued, not yet written
        self.queued = 0  # blobs handed to the thread
        self.stored = 0  # of those, the ones written (or given up on after an error)
        self._queue: deque = deque()
        self._known: set[bytes] = set()  # ids stored or queued by this writer
        self._cond = threading.Condition()
        self._closed = False
        self._urgent = False  # a spool writer waits for what is queued: no batching
        self._thread: threading.Thread | None = None

    def put(self, data: bytes) -> bytes:
        """Store `data` (bytes the caller will not change) once; return its id."""
        ident = blob_id(data)
        if ident in self._known:
            return ident
        if self.error is not None:
            raise self.error
        known = self._known
        if len(known) >= self.KNOWN_MAX:
            known.clear()
        known.add(ident)
        with self._cond:
            after = self.pending + len(data)
            if self._closed or after > self.max_pending or after > self.rate * self.max_delay_s:
                inline = True
            else:
                inline = False
                queue = self._queue
                queue.append((ident, data))
                self.pending += len(data)
                self.queued += 1
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="prism-rr-blobs", daemon=True)
                    self._thread.start()
                # the first of a batch starts the thread's wait for more; a full one ends
                # it (all: a spool writer's wait_stored may be waiting too)
                n = len(queue)
                if n == 1 or n == self.BATCH_BLOBS or self.pending >= self.BATCH_BYTES:
                    self._cond.notify_all()
        if inline:
            try:
                self._store(ident, data)
            except BaseException:
                self._known.discard(ident)
                raise
        return ident

    def store_now(self, items) -> int:
        """Store (id, bytes) pairs on the caller's thread, each content once: the small
        payloads a compactor found in a call log, whose ids it made. How many were new."""
        if self.error is not None:
            raise self.error
        entries = []
        known = self._known
        new = 0
        for ident, data in items:
            if ident in known:
                continue
            if len(known) >= self.KNOWN_MAX:
                known.clear()
            known.add(ident)
            new += 1
            if len(data) > PACK_LIMIT:
                _store(self.spool_dir, ident, data)
            else:
                entries.append(_pack_entry(ident, data))
        if entries:
            self._append_pack(b"".join(entries))
        return new

    def _store(self, ident: bytes, data) -> None:
        if len(data) > PACK_LIMIT:
            _store(self.spool_dir, ident, data)
        else:
            self._append_pack(_pack_entry(ident, data))

    def _append_pack(self, entry: bytes) -> None:
        """Append whole entries to the pack file. A write that fails part-way (a full
        disk) is cut off again: an entry after a torn one would not be read."""
        with self._pack_lock:
            if self._pack is None:
                where = self.spool_dir / "blobs"
                where.mkdir(parents=True, exist_ok=True)
                while True:
                    try:
                        self._pack = os.open(where / pack_name(next(_packs)),
                                             os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
                        break
                    except FileExistsError:
                        continue
            fd = self._pack
            start = os.lseek(fd, 0, os.SEEK_END)
            try:
                view = memoryview(entry)
                while view:
                    view = view[os.write(fd, view):]
            except BaseException:
                try:
                    os.ftruncate(fd, start)
                except OSError:
                    pass
                raise
            finally:
                thread = self._thread
                if self._closed and (thread is None or not thread.is_alive()):
                    os.close(fd)  # a blob its caller stored after close(): no file left open
                    self._pack = None

    def wait_stored(self, mark: int, timeout: float) -> bool:
        """Wait (at most `timeout`) until the first `mark` queued blobs are written;
        True when they are."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.stored < mark:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if not self._urgent:
                    self._urgent = True  # the thread stops gathering a batch
                    self._cond.notify_all()
                self._cond.wait(left)
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (waiting at most `timeout`), then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        with self._pack_lock:
            if self._pack is not None and (thread is None or not thread.is_alive()):
                os.close(self._pack)
                self._pack = None

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                self._gather()
                if not self._queue:
                    return
                # Everything queued, at once: a recording that keeps a payload of every
                # small call queues them faster than one lock, wake-up and write apiece.
                batch = list(self._queue)
                self._queue.clear()
                self._urgent = False
            try:
                if self.error is None:
                    self._store_all(batch)
            except BaseException as exc:
                self.error = exc
            finally:
                with self._cond:
                    self.pending -= sum(len(data) for _, data in batch)
                    self.stored += len(batch)
                    self._cond.notify_all()

    def _gather(self) -> None:
        """With the condition held and blobs queued: wait (at most BATCH_S) for a batch."""
        deadline = None
        queue = self._queue
        while (queue and not self._closed and not self._urgent and len(queue) < self.BATCH_BLOBS
               and self.pending < self.BATCH_BYTES):
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.BATCH_S
            elif now >= deadline:
                return
            self._cond.wait(deadline - now)

    def _store_all(self, batch: list) -> None:
        """Store (ident, data) of each blob in order: small ones to the pack file in one
        write, large ones a file each."""
        entries = []
        for ident, data in batch:
            if len(data) <= PACK_LIMIT:
                entries.append(_pack_entry(ident, data))
                continue
            t0 = time.perf_counter()
            _store(self.spool_dir, ident, data)
            if len(data) >= 1 << 20:  # a blob big enough to time
                self.rate = 0.5 * self.rate + 0.5 * len(data) / max(time.perf_counter() - t0, 1e-6)
        if entries:
            self._append_pack(b"".join(entries))
