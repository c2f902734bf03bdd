"""Read a `.prism` bundle: memory-mapped, lazy, and safe on hostile input."""

from __future__ import annotations

import bisect
import hashlib
import mmap
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator

import zstandard

from prism_rr.errors import FormatError, UnsupportedVersionError, UsageError
from prism_rr.format import codec, layout
from prism_rr.format.facts import bundle_facts, failed_steps
from prism_rr.format.records import Record
from prism_rr.format.spool import Frame, parse_frame
from prism_rr.text import quoted, safe, shown

# Deferred imports: format.summaries (numpy) until a 1.1 bundle's summary tables are read;
# `prism-rr info` on an older bundle, and a rank's start-up, never pay for numpy.

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


def open_bundle(path: str | os.PathLike, attempt: int | None = None) -> "Bundle":
    """Open a bundle for reading; FormatError if it is not one this reader can read.

    A bundle of a job that was restarted holds every attempt (FORMAT.md §4, "Attempts"):
    `attempt` picks one; None opens the default one (the last that failed, else the last).
    UsageError for an attempt the bundle does not hold."""
    return Bundle(path, attempt)


class Bundle:
    """A recorded run: manifest, summaries, and each rank's events on demand, of one
    attempt of the job (`attempt`; `attempts` lists them all)."""

    def __init__(self, path: str | os.PathLike, attempt: int | None = None):
        self.path = Path(path)
        self._asked = attempt
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
        self._choose_attempt()
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

    def _plain(self, sid: int, limit: int) -> Any:
        """A metadata section (zstd of msgpack), decoded within its budget and checked
        to be plain data (codec.check_plain)."""
        where = self._where(sid)
        stored = self._checked(sid)
        raw = codec.decompress(stored, limit, where, budget="frame")
        return codec.unpack_plain(raw, where, len(stored))

    def _read_manifest(self) -> dict:
        where = self._where(layout.SEC_MANIFEST)
        m = self._plain(layout.SEC_MANIFEST, layout.MAX_MANIFEST_RAW)
        if type(m) is not dict or not all(type(k) is str for k in m):
            raise FormatError(f"{where}: manifest is not a map with string keys")
        fmt = m.get("format")
        if not (type(fmt) is tuple and len(fmt) == 2 and all(type(v) is int for v in fmt)):
            raise FormatError(f"{where}: manifest lacks its format version")
        required = m.get("features_required", ())
        if type(required) is not tuple or not all(type(v) is str for v in required):
            raise FormatError(f"{where}: features_required is not a list of names")
        unknown = sorted(set(required) - layout.FEATURES_KNOWN)
        if unknown:
            raise UnsupportedVersionError(
                f"{self.path.name}: needs features this reader lacks: {', '.join(map(quoted, unknown))} "
                f"(bundle format {fmt[0]}.{fmt[1]}; upgrade prism-rr)"
            )
        world = m.get("world_size")
        if type(world) is not int:
            raise FormatError(f"{where}: world_size is missing or not an integer")
        layout.bounded(world, layout.MAX_WORLD, "world size", where)
        ranks = m.get("recorded_ranks")
        if type(ranks) is not tuple or (ranks and (set(map(type, ranks)) != {int} or min(ranks) < 0 or max(ranks) >= world)):
            raise FormatError(f"{where}: recorded_ranks is not a list of ranks below world_size")
        if len(set(ranks)) != len(ranks):
            raise FormatError(f"{where}: recorded_ranks names a rank twice")
        for key, check in _MANIFEST_FIELDS.items():
            if key in m and not check(m[key]):
                raise FormatError(f"{where}: manifest field {key!r} has the wrong type")
        return safe(m)

    def _choose_attempt(self) -> None:
        """Read the manifest's `attempts`; for an attempt other than the default one, point
        its sections (summaries, indexes, rank info, groups) at that attempt's and its
        manifest facts (world, ranks, run, clock) at its own."""
        where = self._where(layout.SEC_MANIFEST)
        entries = self.manifest.get("attempts")
        if entries is None:  # before 1.2: one attempt
            self.attempts = [{"attempt": 0, "default": True, "world_size": self.world_size,
                              "recorded_ranks": tuple(self.recorded_ranks)}]
        elif type(entries) is not tuple or not entries or len(entries) > layout.MAX_ATTEMPT:
            raise FormatError(f"{where}: attempts is not a list of attempts")
        else:
            self.attempts = [_attempt_entry(e, where) for e in entries]
        numbers = [e["attempt"] for e in self.attempts]
        defaults = [e["attempt"] for e in self.attempts if e["default"]]
        if len(set(numbers)) != len(numbers) or len(defaults) != 1:
            raise FormatError(f"{where}: attempts name an attempt twice, or not one default")
        self.default_attempt = defaults[0]
        asked = self.default_attempt if self._asked is None else self._asked
        entry = next((e for e in self.attempts if e["attempt"] == asked), None)
        if entry is None:
            raise UsageError(f"{self.path.name} holds no attempt {asked} (it holds {', '.join(map(str, numbers))})")
        self.attempt = asked
        if entry["default"]:
            return
        attempts = self.sections.get(layout.SEC_ATTEMPTS)
        if attempts is None:
            raise FormatError(f"{where}: attempt {asked} has no attempts section to lie in")
        for sid in layout.ATTEMPT_SECTIONS:
            name = layout.SECTION_NAMES[sid]
            at = entry["sections"].get(name)
            if at is None:
                raise FormatError(f"{where}: attempt {asked} has no {name}")
            offset, length, crc = at
            if not (attempts.offset <= offset and offset + length <= attempts.offset + attempts.length):
                raise FormatError(f"{where}: attempt {asked}'s {name} lies outside the attempts section")
            self.sections[sid] = Section(sid, offset, length, crc)
        self.manifest = {**self.manifest, **entry["facts"]}

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
        """Every process group: {id, ranks, name, desc, backend}, ranks as global ranks.

        Types are checked here: id an int, ranks a tuple of ranks (below layout.MAX_WORLD), the
        others strings ("" when absent); other keys are dropped. Arithmetic runs are
        expanded only within the budget of layout.GROUP_RANKS_*.
        """
        where = self._where(layout.SEC_GROUPS)
        entries = self._plain(layout.SEC_GROUPS, layout.MAX_GROUPS_RAW)
        if type(entries) is not tuple:
            raise FormatError(f"{where}: groups are not a list")
        world = self.world_size
        budget = layout.GROUP_RANKS_FLOOR + layout.GROUP_RANKS_PER_RANK * world
        for g in entries:
            if not (type(g) is dict and type(g.get("id")) is int):
                raise FormatError(f"{where}: a group entry is malformed")
            budget -= codec.ranks_len(g.get("ranks"), where)
            if budget < 0:
                raise FormatError(
                    f"{where}: groups name more ranks than a world of {world} can justify "
                    f"(limit {layout.GROUP_RANKS_FLOOR} + {layout.GROUP_RANKS_PER_RANK} per rank)"
                )
        out = []
        for g in entries:
            entry = {"id": g["id"], "ranks": codec.unpack_ranks(g["ranks"], where)}
            for key in ("name", "desc", "backend"):
                v = g.get(key, "")
                if v is None:
                    v = ""
                if type(v) is not str:
                    raise FormatError(f"{where}: group {g['id']}: {key} is not a string")
                entry[key] = safe(v)
            out.append(entry)
        return out

    @cached_property
    def _rank_infos(self) -> dict:
        if layout.SEC_RANK_INFO not in self.sections:
            return {}
        where = self._where(layout.SEC_RANK_INFO)
        infos = self._plain(layout.SEC_RANK_INFO, layout.MAX_MANIFEST_RAW)
        if type(infos) is not dict or not all(type(v) is dict for v in infos.values()):
            raise FormatError(f"{where}: rank info is not a map of maps")
        world = self.world_size
        for rank, info in infos.items():
            if type(rank) is not int or not 0 <= rank < world:
                raise FormatError(f"{where}: rank info for {shown(repr(rank))}, which is not a rank below {world}")
            for key, value in info.items():
                if type(key) is not str:
                    raise FormatError(f"{where}: rank {rank}: a key is not a string")
                check = _INFO_FIELDS.get(key)
                if check is not None and not check(value):
                    raise FormatError(f"{where}: rank {rank}: {key!r} has the wrong type")
        return infos

    def rank_info(self, rank: int) -> dict:
        """What the recorder knew of one rank: argv, cwd, versions, clock, environment, ...,
        its strings display-safe (prism_rr.text.safe), as every string a bundle hands out."""
        info = self._shown_infos.get(rank)  # made safe once a rank, as asked (8192 of them)
        if info is None:
            info = self._shown_infos[rank] = safe(self._rank_infos.get(rank, {}))
        return info

    def rank_field(self, rank: int, key: str, default=None):
        """One field of a rank's info, display-safe as `rank_info` gives it, without making
        the rest of the info safe (a field of 8192 ranks: 0.3 s less)."""
        info = self._shown_infos.get(rank)
        if info is not None:
            return info.get(key, default)
        return safe(self._rank_infos.get(rank, {}).get(key, default))

    def raw_rank_info(self, rank: int) -> dict:
        """One rank's info as recorded, strings unescaped: only for what runs it again (a
        replay's argument vector and environment), never for a person to read."""
        return self._rank_infos.get(rank, {})

    @cached_property
    def _shown_infos(self) -> dict:
        return {}

    @cached_property
    def summaries(self) -> dict:
        """{"ranks": {rank: {...}}, "steps": {step: {rank: (start_ns, end_ns, mem_peak)}}},
        and, where the bundle has device time (1.3), "device_steps": {step: {rank:
        (dev_start_ns, dev_end_ns)}}.

        Type-checked where read, so no consumer sees a wrong type: ranks are ints below
        world_size; each rank's summary has exactly the keys of _RANK_SUMMARY (absent
        ones take their defaults; unknown ones are dropped) with those types; counts are
        never negative. A 1.1 bundle holds them as tables of columns (format/summaries.py):
        the same shapes then come as read-only mappings over the columns, steps ascending.
        """
        where = self._where(layout.SEC_SUMMARIES)
        stored = self._checked(layout.SEC_SUMMARIES)
        raw = codec.decompress(stored, layout.MAX_SUMMARIES_RAW, where, budget="frame")
        s = codec.unpack(raw, where, budget=layout.objects_limit(len(stored)))
        if type(s) is dict and layout.STEP_TABLE in s:
            from prism_rr.format import summaries

            tables = {k: s.pop(k, None) for k in (layout.RANK_TABLE, layout.STEP_TABLE)}
            device = s.pop(layout.DEVICE_STEP_TABLE, None)
            codec.check_plain(s, where)  # what else a later minor version adds
            world = self.world_size
            out = {**s, "ranks": summaries.read_rank_table(tables[summaries.RANK_TABLE], world, where),
                   "steps": summaries.read_step_table(tables[summaries.STEP_TABLE], world, where)}
            if device is not None:  # 1.3: where the bundle has device time
                out["device_steps"] = summaries.read_device_step_table(device, world, where)
            return out
        codec.check_plain(s, where)
        if type(s) is not dict or type(s.get("ranks")) is not dict or type(s.get("steps")) is not dict:
            raise FormatError(f"{where}: summaries are malformed")
        world = self.world_size
        ranks = {}
        for rank, rs in s["ranks"].items():
            if type(rank) is not int or not 0 <= rank < world:
                raise FormatError(f"{where}: a summary for {shown(repr(rank))}, which is not a rank below {world}")
            if type(rs) is not dict or type(rs.get("events")) is not int:
                raise FormatError(f"{where}: summary of rank {rank} is malformed")
            out = {}
            for key, (check, default) in _RANK_SUMMARY.items():
                v = rs.get(key, default)
                if not check(v):
                    raise FormatError(f"{where}: summary of rank {rank}: {key!r} has the wrong type or is negative")
                out[key] = v
            ranks[rank] = out
        steps = {}
        for step, per_rank in s["steps"].items():
            if type(step) is not int or type(per_rank) is not dict:
                raise FormatError(f"{where}: summary of step {shown(repr(step))} is malformed")
            for rank, v in per_rank.items():
                if not (type(rank) is int and 0 <= rank < world and type(v) is tuple and len(v) == 3
                        and type(v[0]) is int and (v[1] is None or type(v[1]) is int)
                        and (v[2] is None or type(v[2]) is int)):
                    raise FormatError(f"{where}: summary of step {step} is malformed")
            steps[step] = per_rank
        return {**s, "ranks": ranks, "steps": steps}

    @cached_property
    def steps(self) -> list[int]:
        """The recording's steps as every command numbers them: each a rank ended (the step
        summaries), and each a run failed or hung in (`facts.failed_steps`), which no rank
        may have ended."""
        return sorted(set(self.summaries["steps"]) | set(failed_steps(self)))

    @property
    def event_count(self) -> int:
        ranks = self.summaries["ranks"]
        if type(ranks) is not dict:  # 1.1: a summaries.RankTable
            return ranks.total("events")
        return sum(rs["events"] for rs in ranks.values())

    def rank_summary(self, rank: int) -> dict:
        return self.summaries["ranks"].get(rank, {})

    def step_times(self, step: int) -> dict[int, tuple[int, int | None]]:
        """Each rank's (start_ns, end_ns) of `step`, from the summaries."""
        return {r: (v[0], v[1]) for r, v in self.summaries["steps"].get(step, {}).items()}

    def facts(self) -> dict:
        """What `prism-rr info --json` prints (see `facts.bundle_facts`): format, world,
        ranks, groups, steps, events, size, losses, and the manifest's own notes."""
        return bundle_facts(self)

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
        stored = frame.length - layout.FRAME_HEADER.size - frame.summary_len
        if frame.raw_len > layout.ratio_limit(stored):
            raise FormatError(
                f"{where}, offset {frame.offset}: payload of {stored} bytes declares {frame.raw_len} "
                f"bytes, more than its size can justify (limit {layout.ratio_limit(stored)})"
            )
        return frame

    def _records(self, frame: Frame) -> list[Record]:
        """The records of a checked frame: decompressed and decoded within the budgets."""
        raw = self._payload(frame)
        at = f"{self.path.name}: chunks section, offset {frame.offset}"
        stored = frame.length - layout.FRAME_HEADER.size - frame.summary_len
        return codec.decode_chunk(raw, frame.count, at, world=self.world_size, stored=stored)

    def _payload(self, frame: Frame) -> bytes:
        """The decompressed payload of a checked frame, of the size its header declares."""
        at = f"{self.path.name}: chunks section, offset {frame.offset}"
        raw = codec.decompress(frame.payload(self._map), frame.raw_len, at, budget="frame")
        if len(raw) != frame.raw_len:
            raise FormatError(f"{at}: payload is {len(raw)} bytes, header says {frame.raw_len}")
        return raw

    def read_chunk(self, ref: ChunkRef) -> list[Record]:
        return self._records(self._frame(ref))

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

    def blob(self, ident: bytes, expected: int | None = None) -> bytes:
        """A payload by its content id; FormatError if absent or damaged.

        Its declared size must be what its stored length can justify (FORMAT.md §7),
        unless the caller says how many bytes it expects and the blob declares exactly
        that: a replay fills a tensor of the recorded shape the program already holds,
        and a tensor of zeros compresses far better than any fixed ratio."""
        stored, raw_len, where = self._blob_stored(ident)
        limit = min(raw_len, layout.MAX_BLOB_RAW)
        if expected is not None and raw_len == expected:
            return codec.decompress(stored, limit, where)
        return codec.decompress(stored, limit, where, budget="blob")

    def blob_digest(self, ident: bytes) -> bytes:
        """The content id of the payload stored under `ident`, computed as it is
        decompressed piece by piece: what verify checks, in bounded memory."""
        stored, raw_len, where = self._blob_stored(ident)
        # No ratio budget: this never holds more than a 1 MiB piece, and a real blob of
        # zeros declares thousands of times its stored length.
        size = codec.declared_size(stored, min(raw_len, layout.MAX_BLOB_RAW), where)
        h = hashlib.blake2b(digest_size=layout.BLOB_ID_LEN)
        n = 0
        try:
            reader = zstandard.ZstdDecompressor().stream_reader(stored, read_across_frames=False)
            while True:
                piece = reader.read(1 << 20)
                if not piece:
                    break
                n += len(piece)
                if n > size:
                    break
                h.update(piece)
        except zstandard.ZstdError as exc:
            raise FormatError(f"{where}: corrupt zstd data ({exc})") from None
        if n != size:
            raise FormatError(f"{where}: zstd frame holds {'more than ' if n > size else ''}{n} bytes, declared {size}")
        if raw_len != size:
            raise FormatError(f"{where}: blob {ident.hex()} holds {size} bytes, its index entry says {raw_len}")
        return h.digest()

    def _blob_stored(self, ident: bytes) -> tuple[memoryview, int, str]:
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
        return stored, raw_len, where

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


def _is_str(v) -> bool:
    return type(v) is str


def _is_int(v) -> bool:
    return type(v) is int


def _count(v) -> bool:
    return type(v) is int and v >= 0


def _opt_count(v) -> bool:
    return v is None or (type(v) is int and v >= 0)


def _opt_int(v) -> bool:
    return v is None or type(v) is int


def _strs(v) -> bool:
    return type(v) is tuple and all(type(x) is str for x in v)


def _ints(v) -> bool:
    return type(v) is tuple and all(type(x) is int for x in v)


def _str_map(v) -> bool:
    return type(v) is dict and all(type(k) is str and type(x) is str for k, x in v.items())


def _map(v) -> bool:
    return type(v) is dict


def _opt_map(v) -> bool:
    return v is None or type(v) is dict


def _kinds(v) -> bool:
    return type(v) is dict and all(type(k) is int and type(n) is int and n >= 0 for k, n in v.items())


def _clock_offset(v) -> bool:
    return v is None or (type(v) is dict and type(v.get("offset_ns", 0)) is int)


def _mesh(v) -> bool:
    if v is None:
        return True
    if type(v) is not dict:
        return False
    shape = v.get("shape", ())
    names = v.get("dim_names", ())
    ranks = v.get("ranks", ())
    return (_ints(shape) and all(x > 0 for x in shape) and (names is None or _strs(names))
            and (ranks is None or (_ints(ranks) and all(x >= 0 for x in ranks))))


def _fsdp_layouts(v) -> bool:
    return type(v) is dict and all(
        type(k) is str and type(table) is dict and all(
            type(size) is str and type(rows) is tuple and all(
                type(row) is tuple and len(row) == 2 and _ints(row) for row in rows)
            for size, rows in table.items())
        for k, table in v.items())


def _format(v) -> bool:
    return type(v) is tuple and len(v) == 2 and _ints(v)


def _time(v) -> bool:
    return type(v) is int and 0 <= v < (1 << 63)


# Manifest fields a reader uses, and their types (others are checked as plain data only).
def _attempt_entry(e, where: str) -> dict:
    """One entry of the manifest's `attempts`, type-checked: {attempt, default, world_size,
    recorded_ranks, sections: {name: (offset, length, crc)}, facts: the manifest keys of
    that attempt}."""
    if not (type(e) is dict and type(e.get("attempt")) is int and 0 <= e["attempt"] <= layout.MAX_ATTEMPT
            and type(e.get("default")) is bool and type(e.get("world_size")) is int
            and type(e.get("recorded_ranks")) is tuple):
        raise FormatError(f"{where}: an attempts entry is malformed")
    world = layout.bounded(e["world_size"], layout.MAX_WORLD, "world size", where)
    ranks = e["recorded_ranks"]
    if ranks and (set(map(type, ranks)) != {int} or min(ranks) < 0 or max(ranks) >= world or len(set(ranks)) != len(ranks)):
        raise FormatError(f"{where}: attempt {e['attempt']}'s recorded_ranks are not ranks below its world size")
    sections = {}
    raw = e.get("sections", {})
    if type(raw) is not dict:
        raise FormatError(f"{where}: attempt {e['attempt']}'s sections are not a map")
    for name, at in raw.items():
        if not (type(name) is str and type(at) is tuple and len(at) == 3 and all(type(v) is int and v >= 0 for v in at)):
            raise FormatError(f"{where}: attempt {e['attempt']}'s sections are malformed")
        sections[name] = at
    facts = {"world_size": world, "recorded_ranks": ranks}
    for key in ("run", "clock", "nodes"):
        if key in e:
            facts[key] = e[key]
    if type(facts.get("run", {})) is not dict:
        raise FormatError(f"{where}: attempt {e['attempt']}'s run is not a map")
    return {"attempt": e["attempt"], "default": e["default"], "world_size": world, "recorded_ranks": ranks,
            "sections": sections, "facts": facts}


_MANIFEST_FIELDS = {
    "features_optional": _strs, "tool": _is_str, "created_unix_ns": _time, "run": _map,
    "redacted": _map, "roles": _map, "scale": _map,
}
# Rank info keys a reader uses, and their types.
_INFO_FIELDS = {
    "rank": _is_int, "world_size": _count, "local_rank": _is_int, "pid": _is_int,
    "backend": _is_str, "device": _is_str, "device_name": _is_str, "hostname": _is_str,
    "cwd": _is_str, "executable": _is_str, "payload": _is_str, "slice_by": _is_str,
    "argv": _strs, "orig_argv": _strs, "env": _str_map, "versions": _str_map, "clock": _map,
    "clock_offset": _clock_offset, "device_mesh": _mesh, "slice_mesh": _mesh,
    "fsdp_layouts": _fsdp_layouts, "device_time": _map,
}
# A rank's summary: key -> (check, default when absent).
_RANK_SUMMARY = {
    "events": (_count, 0), "chunks": (_count, 0), "kinds": (_kinds, {}),
    "t_first": (_opt_int, None), "t_last": (_opt_int, None), "dropped": (_count, 0),
    "open": (_count, 0), "mem_peak": (_opt_count, None), "truncated": (lambda v: type(v) is bool, False),
    "lost_bytes": (_count, 0),
}


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
