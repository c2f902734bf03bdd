"""Pack directories of spools into one `.prism` bundle (FORMAT.md, "Bundle").

One directory holds one node's spools (`run.prism.d/`, or `run.prism.d/node-<i>/` when
every node of a multi-node job recorded its own; a directory that holds no spools but
subdirectories that do stands for them all). Spools of several directories go into one
bundle: each rank once, blobs from every directory, every directory's run facts kept
(manifest `nodes`), and a summary of how well the ranks' clocks were aligned (`clock`).

Chunks are copied byte for byte: packing reads frame headers and summaries and
decompresses no events payload, so its cost is the copy. A rank that died left its call
log beside its spool (format/calllog.py): what it holds past the compactor's last batch,
the call the rank died in included, is read where it lies and packed as more chunks
(compactor.log_frames); pack writes nothing into the directories it reads.
Spools of earlier versions may hold open-call snapshots: the last one's calls that no later
record completed make one more chunk.
"""

from __future__ import annotations

import gc
import json
import os
import re
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import msgpack

from prism_rr._version import __version__
from prism_rr.errors import FormatError, UsageError
from prism_rr.format import codec, layout
from prism_rr.format.blobs import blob_id, blob_level, spool_blobs
from prism_rr.format.compactor import log_frames, open_log, snapshot_calls
from prism_rr.format.names import parse_rank_file
from prism_rr.format.records import DeviceTime
from prism_rr.format.spool import encode_frame, frame_info, parse_frame, scan_spool, spool_header, still_open

# Deferred imports: format.summaries (numpy) where the summaries' tables are built, so that
# importing the format (a bundle read on a laptop, `prism-rr info`) does not load numpy.

if TYPE_CHECKING:
    from prism_rr.format.summaries import DeviceStepRows, StepRows

__all__ = ["PackResult", "pack", "spool_dirs"]


@dataclass(slots=True, kw_only=True)
class PackResult:
    path: Path
    ranks: int
    chunks: int
    events: int
    blobs: int
    bytes: int
    torn: dict[int, str] = field(default_factory=dict)  # rank -> why its tail was dropped
    attempts: list[int] = field(default_factory=lambda: [0])  # the attempts packed (FORMAT.md §4)
    default_attempt: int = 0  # the one a reader sees unless it asks


def _is_spool(name: str) -> bool:
    return name.startswith("rank-") and name.endswith(".spool")


def _has_spools(spool_dir: Path) -> bool:
    return any(_is_spool(n) or _is_log(n) for n in os.listdir(spool_dir))


_WRITE_BYTES = 8 << 20  # chunks are written in pieces of about this size


def spool_dirs(dirs) -> list[Path]:
    """The directories of spools that `dirs` (one path or several) name: a directory with
    rank-*.spool files is one; one without them stands for its subdirectories that have
    them (`run.prism.d/` of a multi-node recording holds `node-*/`). A directory with
    spools of its own is only that: a single-node recording into a `run.prism.d/` that
    still holds an earlier multi-node recording's `node-*/` packs its own spools."""
    dirs = [dirs] if isinstance(dirs, (str, os.PathLike)) else list(dirs)
    if not dirs:
        raise UsageError("give at least one directory of spools")
    found: list[Path] = []
    for d in map(Path, dirs):
        if not d.is_dir():
            raise UsageError(f"{d} is not a directory of spools")
        if _has_spools(d):  # its own spools, whatever its subdirectories hold
            found.append(d)
            continue
        inner = [s for s in sorted(d.iterdir(), key=_natural) if s.is_dir() and _has_spools(s)]
        if not inner:
            raise UsageError(f"{d} holds no rank-*.spool files")
        found += inner
    seen: set[Path] = set()
    for d in found:
        if d.resolve() in seen:
            raise UsageError(f"{d} is named twice")
        seen.add(d.resolve())
    return found


def _natural(path: Path) -> list:
    """node-2 before node-10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def _read_run(spool_dir: Path) -> dict:
    run_path = spool_dir / "run.json"
    if not run_path.exists():
        return {}
    try:
        run = json.loads(run_path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"{run_path}: not valid JSON ({exc})") from None
    if not isinstance(run, dict):
        raise FormatError(f"{run_path}: not a JSON object")
    return run


def pack(
    spool_dir: str | os.PathLike | list,
    out: str | os.PathLike,
    *,
    manifest_extra: dict[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PackResult:
    """Write the bundle `out` from the spools in `spool_dir` (a directory, or a list of
    them: see `spool_dirs`); returns what went in.

    A spool with a torn tail is packed up to its last complete frame and the rank is
    marked truncated in the summaries. A rank found in two places is an error naming
    both. The bundle appears atomically (written beside, then renamed).
    """
    dirs = spool_dirs(spool_dir)
    out = Path(out)
    spools = _spool_files(dirs)
    runs = {d: _read_run(d) for d in dirs}
    tmp = out.with_name(out.name + ".partial")
    out.parent.mkdir(parents=True, exist_ok=True)
    have_blob = _blob_lookup(dirs)
    log_blobs: dict[bytes, bytes] = {}  # small payloads found in the call logs of dead ranks
    attempts: dict[int, _Attempt] = {}
    torn: dict[int, str] = {}
    events = 0
    with open(tmp, "wb") as f, _no_gc():
        f.write(b"\0" * layout.BUNDLE_HEADER.size)  # written last, once sections are known
        chunks = _Chunks(f)
        for i, spool in enumerate(spools):
            events += _pack_rank(chunks, attempts, torn, spool, have_blob, log_blobs)
            if progress:
                progress(i + 1, len(spools))
        chunks.write()
        sections = [(layout.SEC_CHUNKS, chunks.at, chunks.pos - chunks.at, chunks.crc & 0xFFFFFFFF)]

        blobs_at = f.tell()
        blob_rows, blobs_crc = _copy_blobs(dirs, f, blobs_at, log_blobs)
        sections.append((layout.SEC_BLOBS, blobs_at, f.tell() - blobs_at, blobs_crc & 0xFFFFFFFF))

        if not attempts:
            raise FormatError("no rank's spool could be read")
        default = _default_attempt(attempts)
        parts = {k: at.parts(runs) for k, at in attempts.items()}
        manifest = _manifest(attempts, parts[default], bool(blob_rows), manifest_extra)
        manifest["attempts"] = _write_attempts(f, parts, default, sections)
        for sid, payload in (
            (layout.SEC_MANIFEST, codec.compress(msgpack.packb(manifest, use_bin_type=True), 9)),
            *parts[default]["sections"],
            (layout.SEC_BLOB_INDEX, b"".join(sorted(blob_rows))),
        ):
            sections.append((sid, f.tell(), len(payload), layout.crc32(payload)))
            f.write(payload)
        size = _write_ends(f, sections)
    os.replace(tmp, out)
    return PackResult(
        path=out, ranks=len(attempts[default].rank_sums), chunks=sum(p["chunks"] for p in parts.values()),
        events=events, blobs=len(blob_rows), bytes=size, torn=torn, attempts=sorted(attempts), default_attempt=default,
    )


def _spool_files(dirs: list[Path]) -> list[tuple[tuple[int, int], str, Path, str | None]]:
    """((rank, attempt) by its file name, spool path, its directory, its crash file's name
    or None) of every spool in `dirs`, attempt by attempt and rank by rank; UsageError if a
    rank is in two places."""
    owner: dict[tuple[int, int], str] = {}  # (rank, attempt) -> its spool, by file name
    paths: list[tuple[tuple[int, int], str, Path, str | None]] = []
    for d in dirs:
        names = os.listdir(d)  # one listing, not a glob and a probe for each rank's crash file
        crashes = {n for n in names if n.endswith(".crash")}
        spools = set(filter(_is_spool, names))
        # a rank that died before its spool was made left only its call log
        spools |= {n[: -len(".log")] + ".spool" for n in names if _is_log(n)} - spools
        for name in sorted(spools):
            parsed = parse_rank_file(name)
            key = (parsed[0], parsed[1]) if parsed else (1 << 40, 0)
            path = os.path.join(d, name)
            if parsed is not None:
                if key in owner:
                    raise UsageError(f"rank {key[0]}{_attempt_text(key[1])} is in two places: {owner[key]} and {path}")
                owner[key] = path
            crash = name[: -len(".spool")] + ".crash"
            paths.append((key, str(path), d, crash if crash in crashes else None))
    paths.sort(key=lambda p: (p[0][1], p[0][0], p[1]))
    return paths


def _blob_lookup(dirs: list[Path]) -> Callable[[bytes], bool]:
    """Whether a blob id is in the blob stores of `dirs`, listed on the first question
    (only a dead rank's call log asks)."""
    known: set[bytes] | None = None

    def have_blob(ident: bytes) -> bool:
        nonlocal known
        if known is None:
            known = {i for d in dirs for i, _, _ in spool_blobs(d)}
        return ident in known

    return have_blob


class _Chunks:
    """The chunks section as pack writes it: chunks copied in writes of a few MiB, not one
    a chunk, and their CRC."""

    def __init__(self, f):
        self.f = f
        self.at = self.pos = f.tell()
        self.crc = 0
        self.pending: list = []  # chunks not yet written
        self.pending_bytes = 0

    def add(self, chunk, frame) -> bytes:
        """Queue one chunk; its chunk index entry."""
        self.pending.append(chunk)
        self.pending_bytes += frame.length
        self.crc = zlib.crc32(chunk, self.crc)
        entry = layout.CHUNK_ENTRY.pack(
            self.pos - self.at, frame.length, frame.count, frame.t_first, frame.t_last,
            frame.step_first, frame.step_last,
        )
        self.pos += frame.length
        return entry

    def write(self, at_least: int = 0) -> None:
        """Write the chunks queued, if they make at least `at_least` bytes."""
        if self.pending_bytes >= at_least:
            _write_all(self.f, self.pending)
            self.pending, self.pending_bytes = [], 0


def _pack_rank(chunks: _Chunks, attempts: dict[int, _Attempt], torn: dict[int, str], spool: tuple,
               have_blob: Callable[[bytes], bool], log_blobs: dict) -> int:
    """Fold one spool (with its call log and crash file) into its attempt, and queue its
    chunks; the events it holds."""
    (_, file_attempt), path, spool_dir, crash_file = spool
    data, problem_before = _read_rank(Path(path), have_blob, log_blobs)
    name = os.path.basename(path)
    rank, frames, good_bytes, problem = scan_spool(data, f"spool {name}")
    problem = problem or problem_before
    info: dict = {}
    for frame in frames:
        if frame.kind == layout.FRAME_RANK_INFO:
            info.update(frame_info(data, frame, name))
    at = _attempt_of(attempts, info, file_attempt, rank, path)
    at.dir_ranks.setdefault(spool_dir, []).append(rank)
    if problem is not None:
        torn[rank] = problem
    rs = at.rank_sums[rank] = {
        "events": 0, "chunks": 0, "kinds": {}, "t_first": None, "t_last": None,
        "dropped": 0, "open": 0, "mem_peak": 0, "truncated": problem is not None,
        "lost_bytes": len(data) - good_bytes,
    }
    entries = at.chunk_entries[rank] = []

    def add_chunk(chunk, frame) -> None:
        entries.append(chunks.add(chunk, frame))
        _fold(rs, frame, at.step_rows, at.groups, rank, name, at.device_rows)

    for frame in frames:
        if frame.kind == layout.FRAME_EVENTS:
            add_chunk(memoryview(data)[frame.offset : frame.offset + frame.length], frame)
    hung = still_open(data, frames, name)
    if hung:
        piece = encode_frame(layout.FRAME_EVENTS, rank, len(frames), records=hung)
        add_chunk(piece, parse_frame(piece, 0, len(piece), name))
    chunks.write(at_least=_WRITE_BYTES)
    if crash_file is not None:
        crash = read_crash_file(Path(spool_dir) / crash_file)
        if crash is not None:
            info["crash"] = crash
    at.rank_info[rank] = info
    return rs["events"]


def _attempt_of(attempts: dict[int, _Attempt], info: dict, file_attempt: int, rank: int, path: str) -> _Attempt:
    """The attempt a spool belongs to: the one its ranks agreed on (rank 0's number, the
    recorder's _install), else the one its file names; FormatError if it has the rank."""
    name = os.path.basename(path)
    number = info.get("attempt") if type(info.get("attempt")) is int else file_attempt
    layout.bounded(number, layout.MAX_ATTEMPT, "attempt", f"spool {name}")
    at = attempts.get(number)
    if at is None:
        at = attempts[number] = _Attempt(number)
    if rank in at.rank_sums:
        raise FormatError(f"rank {rank}{_attempt_text(number)} is in two places: {at.where[rank]} and "
                          f"{path} (by their headers)")
    at.where[rank] = path
    return at


def _manifest(attempts: dict[int, _Attempt], default: dict, blobs: bool, extra: dict | None) -> dict:
    """The bundle's manifest, from the default attempt's part (whose groups section a
    rewrite's `groups` replaces) and what the caller adds."""
    manifest = {
        "format": [layout.MAJOR, layout.MINOR],
        "features_required": ["columnar-chunks", "columnar-summaries"] + (["attempts"] if len(attempts) > 1 else [])
        + (["device-time"] if any(at.device_time() for at in attempts.values()) else []),
        "features_optional": ["summaries"] + (["blobs"] if blobs else []),
        "tool": f"prism-rr {__version__}",
        "created_unix_ns": time.time_ns(),
        **default["manifest"],
    }
    if extra:
        manifest.update(extra)
    if "groups" in manifest:
        # A rewrite (scale) gives the groups of the world it writes: they replace the
        # default attempt's groups section, as folded from the records.
        packed = codec.compress(msgpack.packb(manifest.pop("groups"), use_bin_type=True))
        default["sections"] = [(sid, packed if sid == layout.SEC_GROUPS else payload)
                               for sid, payload in default["sections"]]
    return manifest


def _write_attempts(f, parts: dict[int, dict], default: int, sections: list) -> list[dict]:
    """Write every attempt but the default one: its index and metadata sections, one after
    the other in the attempts section (added to `sections` if any); the manifest's
    `attempts`, which says where each is."""
    attempts_at = f.tell()
    attempts_crc = 0
    entries = []
    for k in sorted(parts):
        entry = {"attempt": k, "default": k == default, **_attempt_facts(parts[k]["manifest"])}
        if k != default:
            where = {}
            for sid, payload in parts[k]["sections"]:
                where[layout.SECTION_NAMES[sid]] = [f.tell(), len(payload), layout.crc32(payload)]
                f.write(payload)
                attempts_crc = zlib.crc32(payload, attempts_crc)
            entry["sections"] = where
        entries.append(entry)
    if f.tell() > attempts_at:
        sections.append((layout.SEC_ATTEMPTS, attempts_at, f.tell() - attempts_at, attempts_crc & 0xFFFFFFFF))
    return entries


def _write_ends(f, sections: list) -> int:
    """Write the section table and the trailer, then the header at the start, and sync;
    the bundle's size."""
    table = bytearray()
    for sid, offset, length, crc in sections:
        table += layout.SECTION_ENTRY.pack(sid, 0, offset, length, crc, 0)
    table_at = f.tell()
    f.write(table)
    trailer = layout.TRAILER.pack(
        layout.TRAILER_MAGIC, table_at, len(sections), layout.MAJOR, layout.MINOR,
        layout.crc32(table), 0,
    )
    f.write(trailer[:-4] + layout.crc32(trailer[:-4]).to_bytes(4, "little"))
    size = f.tell()
    f.seek(0)
    head = layout.BUNDLE_HEADER.pack(layout.BUNDLE_MAGIC, layout.MAJOR, layout.MINOR, 0, b"\0" * 12, 0)
    f.write(head[:-4] + layout.crc32(head[:-4]).to_bytes(4, "little"))
    f.flush()
    os.fsync(f.fileno())
    return size


def _attempt_text(attempt: int) -> str:
    return f" (attempt {attempt})" if attempt else ""


class _Attempt:
    """What pack gathers of one attempt (the ranks of one incarnation of the job)."""

    def __init__(self, number: int):
        from prism_rr.format import summaries  # (numpy: packing only, not reading a 1.0 bundle)

        self.number = number
        self.rank_info: dict[int, dict] = {}
        self.rank_sums: dict[int, dict] = {}
        self.step_rows = summaries.StepRows()
        self.device_rows = summaries.DeviceStepRows()
        self.groups: dict[int, dict] = {}
        self.chunk_entries: dict[int, list[bytes]] = {}
        self.where: dict[int, str] = {}
        self.dir_ranks: dict[Path, list[int]] = {}

    def parts(self, runs: dict) -> dict:
        """{"manifest": this attempt's manifest keys, "sections": [(id, payload)] of its
        summaries, rank index, chunk index, rank info and groups, "chunks": n}."""
        from prism_rr.format import summaries

        ranks = sorted(self.rank_sums)
        world = max([int(info.get("world_size", 0) or 0) for info in self.rank_info.values()] + [ranks[-1] + 1])
        layout.bounded(world, layout.MAX_WORLD, "world size", "pack")
        dirs = sorted(self.dir_ranks, key=lambda d: self.dir_ranks[d][0])
        manifest = {
            "world_size": world,
            "recorded_ranks": ranks,
            "run": runs[dirs[0]] if dirs else {},
            "clock": clock_summary(self.rank_info, ranks),
        }
        if len(runs) > 1 or any("node" in r for r in runs.values()):
            manifest["nodes"] = [
                {"node": str(runs[d].get("node", d.name)), "hostname": runs[d].get("hostname"),
                 "ranks": self.dir_ranks[d], "run": runs[d]}
                for d in dirs
            ]
        rank_index = bytearray(layout.RANK_ENTRY.size * world)
        chunk_index = bytearray()
        n_chunks = 0
        for r in ranks:
            entries = self.chunk_entries[r]
            layout.RANK_ENTRY.pack_into(rank_index, r * layout.RANK_ENTRY.size, n_chunks, len(entries))
            chunk_index += b"".join(entries)
            n_chunks += len(entries)
        # Groups get a section of their own, read on first use: a job of 8192 ranks has
        # thousands, and opening a bundle should not decode them.
        group_list = [self.groups[g] for g in sorted(self.groups)]
        sections = [
            (layout.SEC_SUMMARIES, codec.compress(msgpack.packb(
                summaries.encode(self.rank_sums, self.step_rows, self.device_rows), use_bin_type=True))),
            (layout.SEC_RANK_INDEX, bytes(rank_index)),
            (layout.SEC_CHUNK_INDEX, bytes(chunk_index)),
            (layout.SEC_RANK_INFO, codec.compress(msgpack.packb({r: self.rank_info.get(r, {}) for r in ranks},
                                                                use_bin_type=True))),
            (layout.SEC_GROUPS, codec.compress(msgpack.packb(group_list, use_bin_type=True))),
        ]
        return {"manifest": manifest, "sections": sections, "chunks": n_chunks}

    def device_time(self) -> bool:
        """Whether a rank of it wrote DeviceTime records (format 1.3's feature "device-time")."""
        return any(rs["kinds"].get(DeviceTime.KIND) for rs in self.rank_sums.values())

    def failed(self) -> bool:
        """Whether a rank of it ended other than cleanly: an exit code other than 0, a
        signal, a crash, or no word at all (its records end without a `recording_end`)."""
        for info in self.rank_info.values():
            end = info.get("exit")
            if info.get("crash") or not isinstance(end, dict):
                return True
            if end.get("signal") or end.get("code") not in (0, None):
                return True
        return False


def _default_attempt(attempts: dict[int, _Attempt]) -> int:
    """The attempt a reader sees unless it asks for another: the last that failed, else the
    last (what a user recorded a restarted job for)."""
    failed = [k for k, at in attempts.items() if at.failed()]
    return max(failed) if failed else max(attempts)


def _attempt_facts(manifest: dict) -> dict:
    """What the manifest's `attempts` says of each attempt: its manifest keys (the base ones
    are the default attempt's)."""
    return {k: manifest[k] for k in ("world_size", "recorded_ranks", "run", "clock", "nodes") if k in manifest}


@contextmanager
def _no_gc():
    """The cyclic garbage collector off meanwhile: pack makes a few containers a frame
    (summaries, rank infos, index entries) and keeps most of them to the end, so the
    collector walks ever more of them for nothing (no cycle is made): a tenth of the time
    of packing 8192 spools."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _is_log(name: str) -> bool:
    return name.startswith("rank-") and name.endswith(".log")


def _read_rank(spool: Path, have_blob, log_blobs: dict) -> tuple[bytes, str | None]:
    """A rank's spool as pack reads it: with what the call log it left beside it holds (a
    rank that died: format/compactor.py) as more frames after the spool's good part.
    Nothing is written to the directory. The second value: why the spool alone was cut
    short, when the log made up for it (None then), or a log that cannot be read."""
    contents = None
    problem = None
    try:
        contents = open_log(spool)
    except FormatError as exc:
        problem = f"its call log cannot be read ({exc})"
    data = _read(str(spool)) if spool.exists() else b""
    if contents is None:
        if not data:
            raise FormatError(f"{spool.name}: no spool, and no call log to read instead")
        return data, problem
    spilled = frozenset()
    if data:
        _, frames, good, _ = scan_spool(data, f"spool {spool.name}")
        data = data[:good]
        index = max((f.index for f in frames), default=-1) + 1
        spilled = snapshot_calls(data, frames, spool.name)
    else:
        data, index = spool_header(contents.rank), 0
    more, blobs, _ = log_frames(contents, index, have_blob, spilled)
    log_blobs.update(blobs)
    return data + more, problem


def _read(path: str) -> bytes:
    """A file's bytes, with fewer layers than open().read() (pack reads thousands)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        data = os.read(fd, size)
        if len(data) < size:  # a short read: the rest as open().read() would
            with os.fdopen(os.dup(fd), "rb") as rest:
                rest.seek(len(data))
                data += rest.read()
        return data
    finally:
        os.close(fd)


def _write_all(f, pieces: list) -> None:
    """Write `pieces` (bytes, memoryviews) after what `f` holds, with writev: no copy
    joins them first."""
    f.flush()
    fd = f.fileno()
    for at in range(0, len(pieces), 512):
        batch = pieces[at : at + 512]
        while batch:
            n = os.writev(fd, batch)
            while batch and n >= len(batch[0]):
                n -= len(batch[0])
                batch.pop(0)
            if batch and n:
                batch[0] = memoryview(batch[0])[n:]


def _fold(rs: dict, frame, step_rows: StepRows, groups: dict, rank: int, where: str,
          device_rows: DeviceStepRows | None = None) -> None:
    """Add one frame's header and summary to its rank's and the per-step summaries."""
    s = frame.summary
    rs["events"] += frame.count
    rs["chunks"] += 1
    rs["t_first"] = frame.t_first if rs["t_first"] is None else min(rs["t_first"], frame.t_first)
    rs["t_last"] = frame.t_last if rs["t_last"] is None else max(rs["t_last"], frame.t_last)
    try:
        for kind, n in s.get(codec.S_KINDS, {}).items():
            rs["kinds"][kind] = rs["kinds"].get(kind, 0) + int(n)
        rs["dropped"] += int(s.get(codec.S_DROPPED, 0))
        rs["open"] += int(s.get(codec.S_OPEN, 0))
        rs["mem_peak"] = max(rs["mem_peak"], int(s.get(codec.S_MEM_PEAK, 0)))
        rows = s.get(codec.S_STEPS)
        if rows:
            if type(rows) is not tuple:
                raise TypeError("its steps are not a list")
            step_rows.add(rank, rows)
        rows = s.get(codec.S_DEVICE_STEPS)
        if rows and device_rows is not None:
            if type(rows) is not tuple:
                raise TypeError("its device steps are not a list")
            device_rows.add(rank, rows)
        for gid, ranks, name, desc, backend in s.get(codec.S_GROUPS, ()):
            if gid not in groups:
                codec.unpack_ranks(ranks, f"{where}, offset {frame.offset}")  # refuse nonsense early
                groups[int(gid)] = {"id": int(gid), "ranks": ranks, "name": name, "desc": desc, "backend": backend}
    except (TypeError, ValueError, AttributeError) as exc:
        raise FormatError(f"{where}, offset {frame.offset}: malformed frame summary ({exc})") from None


MAX_CRASH_TEXT = 64 << 10  # bytes of a crash file carried into the bundle
_CRASH_HEADER = re.compile(r"prism-rr crash file: rank (\d+), pid (\d+), main thread (0x[0-9a-f]+)\n")


def read_crash_file(path: Path) -> dict | None:
    """A rank's crash file (faulthandler's dump of every thread's Python stack when the
    process died of SIGSEGV, SIGABRT, SIGBUS, SIGFPE or SIGILL) as the rank info key
    `crash`: {"text": the dump (at most 64 KiB), "bytes": its whole size, "main_thread"};
    None when the process wrote no dump."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CRASH_TEXT + 4096)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return None
    text = raw.decode("utf-8", "replace")
    out: dict[str, Any] = {}
    m = _CRASH_HEADER.match(text)
    if m:
        out["main_thread"] = m.group(3)
        size -= len(m.group(0).encode())
        text = text[m.end():]
    text = text[:MAX_CRASH_TEXT]
    if not text.strip():
        return None
    out["text"] = text
    out["bytes"] = size
    return out


def clock_summary(rank_info: dict[int, dict], ranks: list[int]) -> dict:
    """The manifest's `clock`: how well the ranks' clocks are aligned to the reference
    rank's (each rank's `clock_offset`, FORMAT.md §4)."""
    methods, errors, missing, hosts = set(), [], [], set()
    for r in ranks:
        info = rank_info.get(r, {})
        if isinstance(info.get("hostname"), str):
            hosts.add(info["hostname"])
        clock = info.get("clock_offset")
        if not isinstance(clock, dict) or type(clock.get("offset_ns")) is not int:
            missing.append(r)
            continue
        if isinstance(clock.get("method"), str):
            methods.add(clock["method"])
        if type(clock.get("error_ns")) is int:
            errors.append(clock["error_ns"])
    return {
        "reference_rank": 0,
        "method": ",".join(sorted(methods)) or None,
        "max_error_ns": max(errors) if errors else None,
        "hosts": len(hosts),
        "ranks_without_offset": missing,
    }


def _copy_blobs(dirs: list[Path], f, blobs_at: int, raw_blobs: dict | None = None) -> tuple[list[bytes], int]:
    """Every blob of every directory, once (an id names its content), and `raw_blobs`
    (id -> bytes, not yet compressed: payloads from call logs)."""
    rows: list[bytes] = []
    crc = 0
    seen: set[bytes] = set()
    for ident, raw in (raw_blobs or {}).items():
        if ident in seen:
            continue
        seen.add(ident)
        stored = codec.compress(raw, blob_level(len(raw)))
        rows.append(layout.BLOB_ENTRY.pack(ident, f.tell() - blobs_at, len(stored), len(raw), layout.crc32(stored)))
        f.write(stored)
        crc = zlib.crc32(stored, crc)
    for ident, name, read in (blob for d in dirs for blob in spool_blobs(d)):
        if len(ident) != layout.BLOB_ID_LEN or ident in seen:
            continue
        seen.add(ident)
        stored = read()
        where = f"blob {name}"
        raw = codec.decompress(stored, layout.MAX_BLOB_RAW, where)
        if blob_id(raw) != ident:
            raise FormatError(f"{where}: content does not match its id")
        rows.append(layout.BLOB_ENTRY.pack(ident, f.tell() - blobs_at, len(stored), len(raw), layout.crc32(stored)))
        f.write(stored)
        crc = zlib.crc32(stored, crc)
    return rows, crc
