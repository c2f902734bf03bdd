"""From call logs to spools: the compactor of a recording rank, and the recovery of a dead
rank's call log.

A recording rank's records reach its call log (format/calllog.py) as they happen, with no
encoding on the program's path. `Compactor` turns them into the spool's compressed frames:
on a thread of its own whenever a quarter of the log's ring is in use, and at close, which
writes everything and removes the log. A rank that dies leaves its log beside its spool;
`recover_logs` (run by `pack`, `repair` and `record` before they read spools) appends
what the log holds past the compactor's last batch to the spool, then removes the log.
`log_to_spool` writes a log's records (a flight dump's copy, or a dead rank's log) as a
spool of its own.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

from prism_rr.errors import FormatError
from prism_rr.format import codec, layout
from prism_rr.format.blobs import BlobWriter, blob_path, spool_blobs
from prism_rr.format.calllog import TYPE_NAMES, CallLog, LogContents, LogDecoder, decode_log, read_log, ring_entries
from prism_rr.format.records import Collective, Marker, PointToPoint
from prism_rr.format.spool import FRAME_OPEN, call_identity, encode_frame, frame_records, read_spool, spool_header

__all__ = ["Compactor", "log_to_spool", "recover_logs", "spool_of_log"]

log = logging.getLogger("prism_rr.format")

CHUNK_RECORDS = 2048
# The compactor's thread looks this often whether a quarter of the ring is in use.
POLL_S = 0.1
# How long a record that names a payload blob waits for the blob writer to store it.
BLOB_WAIT_S = 5.0


def spool_of_log(path: Path) -> Path:
    """The spool of the same rank and attempt as a call log."""
    return path.with_name(path.name[: -len(".log")] + ".spool")


def _write_frames(fd: int, rank: int, index: int, records: list) -> int:
    """Write records as events frames of at most CHUNK_RECORDS; the next frame index."""
    for i in range(0, len(records), CHUNK_RECORDS):
        frame = encode_frame(layout.FRAME_EVENTS, rank, index, records=records[i : i + CHUNK_RECORDS])
        view = memoryview(frame)
        while view:
            view = view[os.write(fd, view):]
        index += 1
    return index


def _write_info(fd: int, rank: int, index: int, info: dict) -> int:
    frame = encode_frame(layout.FRAME_RANK_INFO, rank, index, info=info)
    view = memoryview(frame)
    while view:
        view = view[os.write(fd, view):]
    return index + 1


class Compactor:
    """A rank's spool while it records: the header and first rank info written at once,
    then the call log's records as frames, batch by batch.

    `blobs`: a BlobWriter (format/blobs.py), set once payloads start: small payloads found
    in the log are stored through it, and a batch that names blobs it stores on its own
    thread (large ones) waits for them before its frames are written."""

    def __init__(self, calls: CallLog, path, rank: int, *, info: dict | None = None):
        self.calls = calls
        self.path = Path(path)
        self.rank = rank
        self.blobs = None
        self._own_blobs = None  # one made here, where no one gave one
        self.error: BaseException | None = None
        self.dropped_reported = 0
        self._decoder = LogDecoder(f"call log of rank {rank}")
        self._p_at = 0  # how far the persistent region is read
        self._read = (0, 1)  # (ring position, seq) of the next entry to read
        self._lock = threading.Lock()  # one batch at a time
        self._wake = threading.Event()
        self._stopped = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        os.write(self._fd, spool_header(rank))
        self._index = 0
        if info is not None:
            self._index = _write_info(self._fd, rank, self._index, info)
        self._thread = threading.Thread(target=self._run, name=f"prism-rr-compactor-{rank}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        calls = self.calls
        quarter = calls.ring_size // 4
        while not self._stopped:
            self._wake.wait(POLL_S)
            self._wake.clear()
            if self._stopped:
                return
            try:
                if calls.head - calls.tail > quarter or calls.persist_full:
                    self.compact()
                calls.prefault()  # the pages the program writes next, off its path
            except BaseException as exc:  # never let the thread die silently
                self.error = exc
                return

    def compact(self, final: bool = False) -> int:
        """Write what the log holds to the spool (with `final`, the calls still open too, as
        records with end_ns nil); the records written."""
        with self._lock:
            if self._fd < 0:
                return 0
            calls, dec = self.calls, self._decoder
            records, info = self._read_persistent()
            last, (tail, tail_seq, head) = self._read_ring(records)
            if calls.dropped > self.dropped_reported:
                lost = calls.dropped - self.dropped_reported
                self.dropped_reported = calls.dropped
                t, step = (codec.row_start(records[0]) if records else (time.monotonic_ns(), 0))
                records.insert(0, Marker(start_ns=t, end_ns=t, step=step, name="records_dropped", value=lost))
            if final:
                records += dec.open_records()
            pending = dec.pending.values()
            snapshot = None if final else self._spill(pending, head)
            self._store_blobs(dec)
            self._write(info, records, snapshot)
            oldest = min((c for c in pending if not c.spilled), key=lambda c: c.pos, default=None)
            if last:
                new_tail, new_seq = (head, last + 1) if oldest is None else (oldest.pos, oldest.seq)
                calls.consume(new_tail, new_seq, self._p_at, last)
            else:
                calls.consume(tail, tail_seq, self._p_at, None)
            return len(records)

    def _read_persistent(self) -> tuple[list, dict]:
        """(records, rank info that changed) from the persistent area since the last batch."""
        dec = self._decoder
        persist, p_head = self.calls.persisted()
        try:
            info_before = dict(dec.info)
            dec.persist_records = []
            self._p_at = dec.read_persistent(persist, p_head, self._p_at)
            info = {k: v for k, v in dec.info.items() if info_before.get(k, _NONE) != v}
            return list(dec.persist_records), info
        finally:
            persist.release()

    def _read_ring(self, records: list) -> tuple[int, tuple[int, int, int]]:
        """Decode the ring's entries from where the last batch stopped (the tail may lag
        behind it: a pending call's ENTER holds it back) into `records`; (the seq of the
        last entry read or 0, the ring's (tail, tail seq, head) as it was viewed)."""
        ring, tail, tail_seq, head = self.calls.view()
        dec = self._decoder
        last = 0
        at, at_seq = max(self._read, (tail, tail_seq))
        try:
            for pos, seq, kind, flags, aux, entry in ring_entries(ring, at, at_seq, head):
                records += dec.feed(pos, seq, kind, flags, aux, entry)
                last = seq
                del entry
        finally:
            ring.release()
        if last:
            self._read = (head, last + 1)
        return last, (tail, tail_seq, head)

    def _spill(self, pending, head: int) -> list | None:
        """The open-calls snapshot to write, if a call has been pending for more than a
        quarter of the ring, else None.

        The ring's room is free up to the oldest call still pending (its ENTER is what a
        reader after a death needs). A call pending that long is spilled instead: written
        to the spool as an open-calls snapshot (which `pack` reads: FORMAT.md, "Spool"), so
        it holds the ring back no more; its completion, when it comes, is an ordinary
        record that supersedes it."""
        limit = head - self.calls.ring_size // 4
        if not any(not c.spilled and c.pos < limit for c in pending):
            return None
        for c in pending:
            c.spilled = c.spilled or c.pos < limit
        return self._decoder.spilled_records()

    def _write(self, info: dict, records: list, snapshot: list | None) -> None:
        """Append the batch's frames to the spool: changed rank info, records, open calls."""
        if info:
            self._index = _write_info(self._fd, self.rank, self._index, info)
        if records:
            self._index = _write_frames(self._fd, self.rank, self._index, records)
        if snapshot is not None:
            frame = encode_frame(FRAME_OPEN, self.rank, self._index, records=snapshot)
            self._index += 1
            view = memoryview(frame)
            while view:
                view = view[os.write(self._fd, view):]

    def _store_blobs(self, dec: LogDecoder) -> None:
        """Store the small payloads the batch found, and wait for the large ones its
        records name (the blob writer's thread): no record on disk names a missing blob."""
        blobs = self.blobs
        if dec.blobs:
            found, dec.blobs = dec.blobs, {}
            if blobs is None:

                blobs = self.blobs = self._own_blobs = BlobWriter(self.path.parent)
            blobs.store_now(found.items())
        if blobs is not None and blobs.queued > blobs.stored:
            blobs.wait_stored(blobs.queued, BLOB_WAIT_S)

    def close(self, remove_log: bool = True) -> None:
        """Write everything the log holds, the calls still open included, and close."""
        self._stopped = True
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)
        written = False
        try:
            self.compact(final=True)
            if self._own_blobs is not None:
                self._own_blobs.close()
            written = True
        finally:
            with self._lock:
                if self._fd >= 0:
                    os.close(self._fd)
                    self._fd = -1
            # The log goes only once all it holds is in the spool (a full disk leaves it
            # for `pack`, which reads it where it lies).
            if written:
                self.calls.close(remove=remove_log)

    def wake(self) -> None:
        self._wake.set()


_NONE = object()


# --- a log as a spool --------------------------------------------------------------------


def _blob_positions() -> dict:
    """Record kind -> the positions of its blob fields in its row."""
    at = {}
    for cls in (Collective, PointToPoint):
        index = {name: i + 1 for i, (name, _) in enumerate(cls.WIRE)}
        at[cls.KIND] = tuple(index[n] for n in ("blob_in", "blob_out", "blob") if n in index)
    return at


_BLOB_AT = _blob_positions()


def _blob_ids_of(rec) -> tuple:
    if type(rec) is tuple:
        ids = ()
        for i in _BLOB_AT.get(rec[0], ()):
            v = rec[i]
            if v:
                ids += tuple(v)
        return ids
    ids = ()
    for name in ("blob_in", "blob_out", "blob"):
        v = getattr(rec, name, None)
        if v:
            ids += tuple(v)
    return ids


def _without_blobs(rec):
    """The record with no blob ids (their payload is lost) and a payload_lost marker."""
    if type(rec) is tuple:
        rec = codec.row_record(rec)
    changes = {k: None for k in ("blob_in", "blob_out", "blob") if getattr(rec, k, None)}
    t = rec.end_ns or rec.start_ns
    marker = Marker(start_ns=t, end_ns=t, step=rec.step, name="payload_lost", value=getattr(rec, "seq", None),
                    text=f"{getattr(rec, 'op', '?')}: payload not on disk when the rank stopped")
    return marker, replace(rec, **changes)


def _have_blob(spool_dir: Path, ident: bytes, known: set) -> bool:

    return ident in known or blob_path(spool_dir, ident).exists()


def log_to_spool(contents: LogContents, out_dir, *, first_step: int | None = None, ring: dict | None = None,
                 extra_records=(), known_blobs: set | None = None, blob_store=None) -> dict:
    """Write a call log's records as `out_dir/rank-NNNNN.spool` (and its small payloads as
    blobs under `out_dir/blobs`): rank info, the records of steps from `first_step` on (all
    when None), then the calls still open and `extra_records`. A record that names a blob
    found nowhere keeps no blob and gets a `payload_lost` marker. `ring`: a flight dump's
    facts, for the rank info's `flight_ring` (with what was kept). Returns what was
    written: {records, first_step, last_step, blobs, payloads_lost}."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rank = contents.rank
    dec, records = decode_log(contents)
    records += list(extra_records)
    lo = first_step
    steps = [codec.row_start(r)[1] for r in records]
    newest = max(steps, default=None)
    if lo is not None:
        records = [r for r, s in zip(records, steps) if s >= lo or _is_group(r)]
    writer = blob_store or BlobWriter(out_dir)
    try:
        writer.store_now(dec.blobs.items())
    finally:
        if blob_store is None:
            writer.close()
    known = set(dec.blobs) | (known_blobs or set())
    out, lost = [], 0
    for r in records:
        ids = _blob_ids_of(r)
        if ids and not all(_have_blob(out_dir, i, known) for i in ids):
            marker, r = _without_blobs(r)
            out.append(marker)
            lost += 1
        out.append(r)
    kept_steps = [codec.row_start(r)[1] for r in out if not _is_group(r)]
    first = min(kept_steps, default=None)
    info = dict(dec.info)
    if lo is not None:  # the records are a window of the run, as with --steps: a replay knows
        info["steps"] = [lo, None]
    if ring is not None:
        info["flight_ring"] = {"first_step": first, "last_step": newest, "records": len(out),
                               "payloads_lost": lost, **ring}
    spool = out_dir / f"rank-{rank:05d}.spool"
    tmp = spool.with_name(spool.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, spool_header(rank))
        index = _write_info(fd, rank, 0, info)
        _write_frames(fd, rank, index, out)
    finally:
        os.close(fd)
    os.replace(tmp, spool)
    return {"records": len(out), "first_step": first, "last_step": newest, "blobs": len(dec.blobs),
            "payloads_lost": lost}


def _is_group(r) -> bool:
    return type(r) is not tuple and r.KIND == 7


def log_frames(contents: LogContents, index: int, have_blob, spilled: frozenset = frozenset()) -> tuple[bytes, dict, int]:
    """What a dead rank's call log adds to its spool: (the frames, as bytes: its rank info
    past what the spool has, then the records past the compactor's last batch and the calls
    still open; the small payloads they name, id -> bytes; how many records). A record
    that names a blob `have_blob` does not know (and the log does not hold) keeps no blob
    and gets a `payload_lost` marker. `spilled`: the identities (spool.call_identity) of
    the calls the spool's last open-calls snapshot holds: `pack` reads those from there."""
    dec, records = decode_log(contents, where=f"call log of rank {contents.rank}")
    if spilled:
        records = [r for r in records
                   if call_identity(codec.row_record(r) if type(r) is tuple else r) not in spilled]
    if any(_blob_ids_of(r) for r in records):
        fixed = []
        for r in records:
            ids = _blob_ids_of(r)
            if ids and not all(i in dec.blobs or have_blob(i) for i in ids):
                marker, r = _without_blobs(r)
                fixed.append(marker)
            fixed.append(r)
        records = fixed
    parts = []
    if dec.info:
        parts.append(encode_frame(layout.FRAME_RANK_INFO, contents.rank, index, info=dec.info))
        index += 1
    for i in range(0, len(records), CHUNK_RECORDS):
        parts.append(encode_frame(layout.FRAME_EVENTS, contents.rank, index, records=records[i : i + CHUNK_RECORDS]))
        index += 1
    return b"".join(parts), dec.blobs, len(records)


def snapshot_calls(data, frames, where: str) -> frozenset:
    """The identities of the calls in a spool's last open-calls snapshot."""
    last = next((f for f in reversed(frames) if f.kind == FRAME_OPEN), None)
    if last is None:
        return frozenset()
    return frozenset(call_identity(r) for r in frame_records(data, last, where))


def open_log(spool: Path) -> LogContents | None:
    """The call log beside a spool (same rank), if its rank left one open (it died)."""
    path = spool.with_name(spool.name[: -len(".spool")] + ".log")
    if not path.exists():
        return None
    contents = read_log(path)
    return None if contents.closed else contents


def recover_logs(spool_dir) -> list[tuple[int, int]]:
    """Append to each spool in `spool_dir` what its rank's call log holds past the
    compactor's last batch (a rank that died), store its small payloads, then remove the
    log: (rank, records) of each. A log that cannot be read is left as it is, with a
    warning. (`pack` reads such logs where they lie instead, writing nothing here.)"""
    spool_dir = Path(spool_dir)
    done = []
    logs = sorted(spool_dir.glob("rank-*.log"))
    if not logs:
        return done
    known = None

    def have_blob(ident: bytes) -> bool:
        nonlocal known
        if known is None:
            known = {i for i, _, _ in spool_blobs(spool_dir)}
        return ident in known

    writer = BlobWriter(spool_dir)
    try:
        for path in logs:
            spool = spool_of_log(path)
            try:
                contents = read_log(path)
                if contents.closed:
                    path.unlink(missing_ok=True)
                    continue
                good, index, spilled = 0, 0, frozenset()
                if spool.exists():
                    data = spool.read_bytes()
                    scan = read_spool(spool, data)
                    good = scan.good_bytes
                    index = max((f.index for f in scan.frames), default=-1) + 1
                    spilled = snapshot_calls(data, scan.frames, spool.name)
                frames, blobs, n = log_frames(contents, index, have_blob, spilled)
                writer.store_now(blobs.items())
                fd = os.open(spool, os.O_WRONLY | os.O_CREAT, 0o644)
                try:
                    os.ftruncate(fd, good)  # a torn tail (the compactor killed mid-write) goes
                    os.lseek(fd, 0, os.SEEK_END)
                    data = (spool_header(contents.rank) if good == 0 else b"") + frames
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                finally:
                    os.close(fd)
                path.unlink()
                done.append((contents.rank, n))
            except (FormatError, OSError) as exc:
                log.warning("prism-rr: the call log %s cannot be recovered: %s", path, exc)
    finally:
        writer.close()
    return done


def log_info(path) -> dict:
    """The rank info a call log holds (its persistent region), without its records."""
    contents = read_log(path)
    dec = LogDecoder(f"call log {Path(path).name}")
    dec.read_persistent(contents.persist)
    return dec.info


def log_entries(path) -> list:
    """(seq, type name) of each ring entry, for tests and `repair --verbose`."""
    contents = read_log(path)
    return [(seq, TYPE_NAMES.get(kind, str(kind))) for _, seq, kind, _, _, _ in
            ring_entries(contents.ring, contents.tail, contents.tail_seq, contents.head)]

