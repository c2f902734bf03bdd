"""Check every checksum and every index entry of a bundle."""

from __future__ import annotations

from dataclasses import dataclass

from prism_rr.errors import FormatError
from prism_rr.format import layout
from prism_rr.format.reader import Bundle

__all__ = ["VerifyReport", "verify"]


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyReport:
    sections: int
    chunks: int
    events: int
    blobs: int


def verify(bundle: Bundle, *, decode: bool = True) -> VerifyReport:
    """Decode everything once, every attempt's; the first problem is raised as a
    FormatError naming its place.

    `decode=False` checks the bytes, not what they say, in a small part of the time
    (decoding records is most of it): every section's and chunk's checksum, index entry
    and record count, each chunk decompressed to its declared size, but no record
    decoded and each blob checked by its section's checksum, not by its content id.
    `record` checks so the bundle it just packed before it removes the spools: pack
    checked each frame's checksum and each blob's id as it copied them, so this proves
    the file holds what pack read."""
    n_chunks = events = 0
    for entry in bundle.attempts:
        view = bundle if entry["attempt"] == bundle.attempt else Bundle(bundle.path, entry["attempt"])
        try:
            chunks, records = _verify_attempt(view, decode)
        finally:
            if view is not bundle:
                view.close()
        n_chunks += chunks
        events += records
    blobs = _verify_blobs(bundle, decode)
    return VerifyReport(sections=len(bundle.sections), chunks=n_chunks, events=events, blobs=blobs)


def _verify_attempt(bundle: Bundle, decode: bool = True) -> tuple[int, int]:
    """(chunks, records) of one attempt, every checksum and index entry checked."""
    for sec in bundle.sections.values():
        bundle._checked(sec.id)
    summaries = bundle.summaries
    bundle.groups, bundle._rank_infos  # decoded and checked on first use
    n_chunks = events = 0
    seen_chunks: set[int] = set()
    recorded = set(bundle.recorded_ranks)
    name = bundle.path.name + (f" (attempt {bundle.attempt})" if len(bundle.attempts) > 1 else "")
    for rank in range(bundle.world_size):
        refs = bundle.chunks(rank)
        if refs and rank not in recorded:
            raise FormatError(f"{name}: rank index lists chunks for rank {rank}, which was not recorded")
        rank_events = 0
        for ref in refs:
            if ref.number in seen_chunks:
                raise FormatError(f"{name}: chunk index entry {ref.number} is claimed twice")
            seen_chunks.add(ref.number)
            frame = bundle._frame(ref)
            if (frame.t_first, frame.t_last, frame.step_first, frame.step_last) != (
                ref.t_first, ref.t_last, ref.step_first, ref.step_last
            ):
                raise FormatError(f"{name}: chunks section, offset {frame.offset}: header disagrees with chunk index entry {ref.number}")
            if decode:
                records = bundle._records(frame)
                for rec in records:
                    for ident in _blob_ids(rec):
                        _check_blob(bundle, ident)
                rank_events += len(records)
            else:
                bundle._payload(frame)  # decompresses to its declared size
                rank_events += frame.count
            n_chunks += 1
        expected = summaries["ranks"].get(rank, {}).get("events", 0) if rank in recorded else 0
        if rank_events != expected:
            raise FormatError(f"{name}: rank {rank} holds {rank_events} records, its summary says {expected}")
        events += rank_events
    if len(seen_chunks) != bundle._n_chunks:
        raise FormatError(f"{name}: {bundle._n_chunks - len(seen_chunks)} chunk index entries belong to no rank")
    return n_chunks, events


def _blob_ids(rec):
    for name in ("blob_in", "blob_out", "blob"):
        ids = getattr(rec, name, None)
        if ids:
            yield from ids


def _check_blob(bundle: Bundle, ident: bytes) -> None:
    bundle.blob_digest(ident)  # raises if absent or damaged


def _verify_blobs(bundle: Bundle, decode: bool = True) -> int:
    sec = bundle.sections.get(layout.SEC_BLOB_INDEX)
    if sec is None or sec.length == 0:
        return 0
    if sec.length % layout.BLOB_ENTRY.size:
        raise FormatError(f"{bundle.path.name}: blob index section (offset {sec.offset}): length is not a whole number of entries")
    index = bundle._checked(layout.SEC_BLOB_INDEX)
    n = sec.length // layout.BLOB_ENTRY.size
    prev = b""
    for i in range(n):
        ident = bytes(index[i * layout.BLOB_ENTRY.size : i * layout.BLOB_ENTRY.size + layout.BLOB_ID_LEN])
        if ident <= prev:
            raise FormatError(f"{bundle.path.name}: blob index section (offset {sec.offset + i * layout.BLOB_ENTRY.size}): entries are not sorted")
        prev = ident
        if decode and bundle.blob_digest(ident) != ident:
            raise FormatError(f"{bundle.path.name}: blob {ident.hex()} does not match its content id")
    index.release()
    return n
