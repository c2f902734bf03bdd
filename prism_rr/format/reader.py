"""Read a `.prism` bundle: memory-mapped, lazy, and safe on hostile input."""

from __future__ import annotations

import bisect
import mmap
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator

from prism_rr.errors import FormatError, UnsupportedVersionError, UsageError
from prism_rr.format import codec, layout
from prism_rr.format.records import Record
from prism_rr.format.spool import Frame, frame_records, parse_frame

__all__ = ["Bundle", "ChunkRef", "open_bundle"]


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """Where one chunk lies and what the index says of it."""

    rank: int
    number: int  # position in the chunk index
    offset: int  # in the chunk section
    length: int
    count: int
    t_first: int
    t_last: int
    step_first: int
    step_last: int


@dataclass(frozen=True, slots=True)
class Section:
    id: int
    offset: int
    length: int
    crc: int

    @property
    def name(self) -> str:
        return layout.SECTION_NAMES.get(self.id, f"section {self.id}")


def open_bundle(path: str | os.PathLike) -> "Bundle":
    """Open a bundle for reading; FormatError if it is not one this reader can read."""
    return Bundle(path)


class Bundle:
    """A recorded run: manifest, summaries, and each rank's events on demand."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self._file = open(self.path, "rb")
        except IsADirectoryError:
            raise UsageError(f"{self.path}: is a directory, not a bundle") from None
        except OSError as exc:
            raise UsageError(f"{self.path}: cannot open ({exc.strerror})") from None
        self.size = os.fstat(self._file.fileno()).st_size
        self._map = None
        try:
            if self.size < layout.BUNDLE_HEADER.size + layout.TRAILER.size:
                raise FormatError(f"{self.path.name}: {self.size} bytes is too short to be a bundle")
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
            self._read_frame_of_file()
        except BaseException:
            self.close()
            raise

    # --- opening -------------------------------------------------------------------

    def _read_frame_of_file(self) -> None:
        buf = self._map
        magic, major, minor, flags, _reserved, crc = layout.BUNDLE_HEADER.unpack_from(buf, 0)
        if magic != layout.BUNDLE_MAGIC:
            raise FormatError(f"{self.path.name}: not a prism-rr bundle (bad magic at offset 0)")
        if major != layout.MAJOR:
            raise UnsupportedVersionError(
                f"{self.path.name}: bundle format {major}.{minor}; this reader supports "
                f"{layout.MAJOR}.0 to {layout.MAJOR}.{layout.MINOR} (upgrade prism-rr to read it)"
            )
        if layout.crc32(buf[: layout.BUNDLE_HEADER.size - 4]) != crc:
            raise FormatError(f"{self.path.name}: header checksum mismatch (offset 0)")
        if flags != 0:
            raise FormatError(f"{self.path.name}: reserved header flags are set (offset 12)")
        self.version = (major, minor)
        t_at = self.size - layout.TRAILER.size
        tmagic, table_at, count, tmajor, tminor, table_crc, tcrc = layout.TRAILER.unpack_from(buf, t_at)
        if tmagic != layout.TRAILER_MAGIC or layout.crc32(buf[t_at : self.size - 4]) != tcrc:
            raise FormatError(f"{self.path.name}: trailer is damaged or missing (offset {t_at}); the file may be truncated")
        if (tmajor, tminor) != (major, minor):
            raise FormatError(f"{self.path.name}: trailer version {tmajor}.{tminor} differs from header {major}.{minor}")
        layout.bounded(count, layout.MAX_SECTIONS, "section count", f"trailer (offset {t_at})")
        table_len = count * layout.SECTION_ENTRY.size
        if not layout.BUNDLE_HEADER.size <= table_at <= t_at - table_len:
            raise FormatError(f"{self.path.name}: section table offset {table_at} is out of bounds")
        if layout.crc32(buf[table_at : table_at + table_len]) != table_crc:
            raise FormatError(f"{self.path.name}: section table checksum mismatch (offset {table_at})")
        self.sections: dict[int, Section] = {}
        for i in range(count):
            sid, sflags, offset, length, scrc, _ = layout.SECTION_ENTRY.unpack_from(
                buf, table_at + i * layout.SECTION_ENTRY.size
            )
            where = f"section table entry {i} (offset {table_at + i * layout.SECTION_ENTRY.size})"
            if not (layout.BUNDLE_HEADER.size <= offset and offset + length <= table_at):
                raise FormatError(f"{self.path.name}: {where}: section lies outside the file body")
            if sid in self.sections:
                raise FormatError(f"{self.path.name}: {where}: section {sid} appears twice")
            self.sections[sid] = Section(sid, offset, length, scrc)
        for sid in layout.REQUIRED_SECTIONS:
            if sid not in self.sections:
                raise FormatError(f"{self.path.name}: the {layout.SECTION_NAMES[sid]} section is missing")
        self.manifest = self._read_manifest()
        self._rank_index = self._checked(layout.SEC_RANK_INDEX)
        self._chunk_index = self._checked(layout.SEC_CHUNK_INDEX)
        self._check_indexes()

    def _where(self, sid: int, offset: int | None = None) -> str:
        sec = self.sections[sid]
        at = sec.offset if offset is None else offset
        return f"{self.path.name}: {sec.name} section (offset {at})"

    def _checked(self, sid: int) -> memoryview:
        sec = self.sections[sid]
        view = memoryview(self._map)[sec.offset : sec.offset + sec.length]
        if layout.crc32(view) != sec.crc:
            raise FormatError(f"{self._where(sid)}: checksum mismatch")
        return view

    def _read_manifest(self) -> dict:
        where = self._where(layout.SEC_MANIFEST)
        raw = codec.decompress(self._checked(layout.SEC_MANIFEST), layout.MAX_MANIFEST_RAW, where)
        m = codec.unpack(raw, where)
        if type(m) is not dict:
            raise FormatError(f"{where}: manifest is not a map")
        fmt = m.get("format")
        if not (type(fmt) is tuple and len(fmt) == 2 and all(type(v) is int for v in fmt)):
            raise FormatError(f"{where}: manifest lacks its format version")
        required = m.get("features_required", ())
        if type(required) is not tuple or not all(type(v) is str for v in required):
            raise FormatError(f"{where}: features_required is not a list of names")
        unknown = sorted(set(required) - layout.FEATURES_KNOWN)
        if unknown:
            raise UnsupportedVersionError(
                f"{self.path.name}: needs features this reader lacks: {', '.join(unknown)} "
                f"(bundle format {fmt[0]}.{fmt[1]}; upgrade prism-rr)"
            )
        world = m.get("world_size")
        if type(world) is not int:
            raise FormatError(f"{where}: world_size is missing or not an integer")
        layout.bounded(world, layout.MAX_WORLD, "world size", where)
        ranks = m.get("recorded_ranks")
        if type(ranks) is not tuple or (ranks and (set(map(type, ranks)) != {int} or min(ranks) < 0 or max(ranks) >= world)):
            raise FormatError(f"{where}: recorded_ranks is not a list of ranks below world_size")
        for key, kind in (("run", dict),):
            if type(m.get(key, kind())) is not kind:
                raise FormatError(f"{where}: manifest field {key!r} has the wrong type")
        return m

    def _check_indexes(self) -> None:
        world = self.world_size
        if len(self._rank_index) != world * layout.RANK_ENTRY.size:
            raise FormatError(f"{self._where(layout.SEC_RANK_INDEX)}: {len(self._rank_index)} bytes for a world of {world}")
        if len(self._chunk_index) % layout.CHUNK_ENTRY.size:
            raise FormatError(f"{self._where(layout.SEC_CHUNK_INDEX)}: length is not a whole number of entries")
        self._n_chunks = len(self._chunk_index) // layout.CHUNK_ENTRY.size

    # --- what the bundle says without reading chunks -------------------------------

    @property
    def format_version(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"

    @property
    def world_size(self) -> int:
        return self.manifest["world_size"]

    @property
    def recorded_ranks(self) -> list[int]:
        return list(self.manifest["recorded_ranks"])

    @cached_property
    def groups(self) -> list[dict]:
        """Every process group: {id, ranks, name, desc, backend}, ranks as global ranks."""
        where = self._where(layout.SEC_GROUPS)
        raw = codec.decompress(self._checked(layout.SEC_GROUPS), layout.MAX_MANIFEST_RAW, where)
        entries = codec.unpack(raw, where)
        if type(entries) is not tuple:
            raise FormatError(f"{where}: groups are not a list")
        out = []
        for g in entries:
            if not (type(g) is dict and type(g.get("id")) is int):
                raise FormatError(f"{where}: a group entry is malformed")
            out.append({**g, "ranks": codec.unpack_ranks(g.get("ranks"), where)})
        return out

    @cached_property
    def _rank_infos(self) -> dict:
        if layout.SEC_RANK_INFO not in self.sections:
            return {}
        where = self._where(layout.SEC_RANK_INFO)
        raw = codec.decompress(self._checked(layout.SEC_RANK_INFO), layout.MAX_MANIFEST_RAW, where)
        infos = codec.unpack(raw, where)
        if type(infos) is not dict or not all(type(v) is dict for v in infos.values()):
            raise FormatError(f"{where}: rank info is not a map of maps")
        return infos

    def rank_info(self, rank: int) -> dict:
        """What the recorder knew of one rank: argv, cwd, versions, clock, environment, ..."""
        return self._rank_infos.get(rank, {})

    @cached_property
    def summaries(self) -> dict:
        where = self._where(layout.SEC_SUMMARIES)
        raw = codec.decompress(self._checked(layout.SEC_SUMMARIES), layout.MAX_SUMMARIES_RAW, where)
        s = codec.unpack(raw, where)
        if type(s) is not dict or type(s.get("ranks")) is not dict or type(s.get("steps")) is not dict:
            raise FormatError(f"{where}: summaries are malformed")
        for rank, rs in s["ranks"].items():
            if type(rs) is not dict or type(rs.get("events")) is not int:
                raise FormatError(f"{where}: summary of rank {rank!r} is malformed")
        for step, per_rank in s["steps"].items():
            if type(step) is not int or type(per_rank) is not dict:
                raise FormatError(f"{where}: summary of step {step!r} is malformed")
            for v in per_rank.values():
                if not (type(v) is tuple and len(v) == 3 and type(v[0]) is int
                        and (v[1] is None or type(v[1]) is int)):
                    raise FormatError(f"{where}: summary of step {step} is malformed")
        return s

    @property
    def steps(self) -> list[int]:
        return sorted(self.summaries["steps"])

    @property
    def event_count(self) -> int:
        return sum(rs["events"] for rs in self.summaries["ranks"].values())

    def rank_summary(self, rank: int) -> dict:
        return self.summaries["ranks"].get(rank, {})

    def step_times(self, step: int) -> dict[int, tuple[int, int | None]]:
        """Each rank's (start_ns, end_ns) of `step`, from the summaries."""
        return {r: (v[0], v[1]) for r, v in self.summaries["steps"].get(step, {}).items()}

    # --- chunks and events ---------------------------------------------------------

    def chunks(self, rank: int) -> list[ChunkRef]:
        """The index entries of one rank's chunks, in recording order (O(1) lookup)."""
        if not 0 <= rank < self.world_size:
            return []
        first, n = layout.RANK_ENTRY.unpack_from(self._rank_index, rank * layout.RANK_ENTRY.size)
        if first + n > self._n_chunks:
            raise FormatError(f"{self._where(layout.SEC_RANK_INDEX, None)}: rank {rank} points past the chunk index")
        out = []
        for i in range(first, first + n):
            fields = layout.CHUNK_ENTRY.unpack_from(self._chunk_index, i * layout.CHUNK_ENTRY.size)
            out.append(ChunkRef(rank, i, *fields))
        return out

    def _frame(self, ref: ChunkRef) -> Frame:
        sec = self.sections[layout.SEC_CHUNKS]
        where = f"{self.path.name}: chunks section"
        if ref.offset + ref.length > sec.length:
            raise FormatError(f"{where}: chunk {ref.number} of rank {ref.rank} lies outside the section")
        frame = parse_frame(self._map, sec.offset + ref.offset, sec.offset + ref.offset + ref.length, where)
        if frame.kind != layout.FRAME_EVENTS or frame.rank != ref.rank or frame.count != ref.count:
            raise FormatError(
                f"{where}, offset {frame.offset}: chunk does not match its index entry "
                f"(rank {frame.rank}, {frame.count} records; index says rank {ref.rank}, {ref.count})"
            )
        return frame

    def read_chunk(self, ref: ChunkRef) -> list[Record]:
        frame = self._frame(ref)
        return frame_records(self._map, frame, f"{self.path.name}: chunks section")

    def events(
        self,
        rank: int,
        *,
        steps: tuple[int, int] | None = None,
        window: tuple[int, int] | None = None,
    ) -> Iterator[Record]:
        """One rank's records, lazily, chunk by chunk.

        `steps=(a, b)` keeps records of steps a..b inclusive; `window=(t0, t1)` keeps
        records overlapping that monotonic-ns window, found by bisection in the index.
        """
        refs = self.chunks(rank)
        if window is not None:
            refs = _in_window(refs, *window)
        if steps is not None:
            lo, hi = steps
            refs = [r for r in refs if r.step_last >= lo and r.step_first <= hi]
        for ref in refs:
            for rec in self.read_chunk(ref):
                if steps is not None and not steps[0] <= rec.step <= steps[1]:
                    continue
                if window is not None:
                    end = rec.start_ns if rec.end_ns is None else rec.end_ns
                    if end < window[0] or rec.start_ns > window[1]:
                        continue
                yield rec

    def blob(self, ident: bytes) -> bytes:
        """A payload by its content id; FormatError if absent or damaged."""
        sec = self.sections.get(layout.SEC_BLOB_INDEX)
        data = self.sections.get(layout.SEC_BLOBS)
        if sec is None or data is None:
            raise FormatError(f"{self.path.name}: the bundle holds no payload blobs")
        index = memoryview(self._map)[sec.offset : sec.offset + sec.length]
        size = layout.BLOB_ENTRY.size
        n = len(index) // size
        lo, hi = 0, n
        while lo < hi:  # entries are sorted by id
            mid = (lo + hi) // 2
            if bytes(index[mid * size : mid * size + layout.BLOB_ID_LEN]) < ident:
                lo = mid + 1
            else:
                hi = mid
        if lo == n or bytes(index[lo * size : lo * size + layout.BLOB_ID_LEN]) != ident:
            raise FormatError(f"{self.path.name}: blob {ident.hex()} is not in the bundle")
        _, offset, length, raw_len, crc = layout.BLOB_ENTRY.unpack_from(index, lo * size)
        where = f"{self.path.name}: blobs section (offset {data.offset + offset})"
        if offset + length > data.length:
            raise FormatError(f"{where}: blob {ident.hex()} lies outside the section")
        stored = memoryview(self._map)[data.offset + offset : data.offset + offset + length]
        if layout.crc32(stored) != crc:
            raise FormatError(f"{where}: blob {ident.hex()} checksum mismatch")
        return codec.decompress(stored, min(raw_len, layout.MAX_BLOB_RAW), where)

    # --- lifetime ------------------------------------------------------------------

    def close(self) -> None:
        for name in ("_rank_index", "_chunk_index"):
            view = self.__dict__.pop(name, None)
            if view is not None:
                view.release()
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a caller still holds a view; the GC closes it later
                pass
            self._map = None
        self._file.close()

    def __enter__(self) -> "Bundle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Bundle {self.path.name} v{self.format_version} world={self.world_size} ranks={len(self.recorded_ranks)}>"


def _in_window(refs: list[ChunkRef], t0: int, t1: int) -> list[ChunkRef]:
    """Chunks that may hold records overlapping [t0, t1], by bisection.

    Records are written when they complete, so chunk start times are only nearly sorted:
    bisect on a running maximum of ends and a running minimum (from the right) of starts.
    """
    if not refs:
        return refs
    hi_prefix = []
    m = None
    for r in refs:
        m = r.t_last if m is None else max(m, r.t_last)
        hi_prefix.append(m)
    lo_suffix = [0] * len(refs)
    m = None
    for i in range(len(refs) - 1, -1, -1):
        m = refs[i].t_first if m is None else min(m, refs[i].t_first)
        lo_suffix[i] = m
    first = bisect.bisect_left(hi_prefix, t0)
    last = bisect.bisect_right(lo_suffix, t1)
    return [r for r in refs[first:last] if r.t_last >= t0 and r.t_first <= t1]
