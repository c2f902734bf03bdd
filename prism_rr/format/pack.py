"""Pack a directory of spools into one `.prism` bundle (FORMAT.md, "Bundle").

Chunks are copied byte for byte: packing reads frame headers and summaries and
decompresses no events payload, so its cost is the copy. The one exception is small: a
rank whose spool holds open-call snapshots gets one more chunk, of the last snapshot's
calls that no later record completed (what a killed rank was in when it died).
"""

from __future__ import annotations

import json
import os
import re
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import msgpack

from prism_rr._version import __version__
from prism_rr.errors import FormatError, UsageError
from prism_rr.format import codec, layout
from prism_rr.format.blobs import blob_id
from prism_rr.format.spool import encode_frame, frame_info, parse_frame, read_spool, still_open

__all__ = ["PackResult", "pack"]


@dataclass(slots=True, kw_only=True)
class PackResult:
    path: Path
    ranks: int
    chunks: int
    events: int
    blobs: int
    bytes: int
    torn: dict[int, str] = field(default_factory=dict)  # rank -> why its tail was dropped


def _spools(spool_dir: Path) -> list[Path]:
    return sorted(spool_dir.glob("rank-*.spool"))


def pack(
    spool_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    manifest_extra: dict[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PackResult:
    """Write the bundle `out` from the spools in `spool_dir`; returns what went in.

    A spool with a torn tail is packed up to its last complete frame and the rank is
    marked truncated in the summaries. The bundle appears atomically (written beside,
    then renamed).
    """
    spool_dir = Path(spool_dir)
    out = Path(out)
    if not spool_dir.is_dir():
        raise UsageError(f"{spool_dir} is not a directory of spools")
    paths = _spools(spool_dir)
    if not paths:
        raise UsageError(f"{spool_dir} holds no rank-*.spool files")
    run = {}
    run_path = spool_dir / "run.json"
    if run_path.exists():
        try:
            run = json.loads(run_path.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise FormatError(f"{run_path}: not valid JSON ({exc})") from None
    tmp = out.with_name(out.name + ".partial")
    out.parent.mkdir(parents=True, exist_ok=True)
    rank_info: dict[int, dict] = {}
    rank_sums: dict[int, dict] = {}
    steps: dict[int, dict[int, list]] = {}
    groups: dict[int, dict] = {}
    chunk_entries: dict[int, list[bytes]] = {}
    torn: dict[int, str] = {}
    events = 0
    chunks_crc = 0
    with open(tmp, "wb") as f:
        f.write(b"\0" * layout.BUNDLE_HEADER.size)  # written last, once sections are known
        chunks_at = f.tell()
        for i, path in enumerate(paths):
            data = path.read_bytes()
            scan = read_spool(path, data)
            rank = scan.rank
            if rank in rank_sums:
                raise FormatError(f"{path.name}: a second spool for rank {rank}")
            if scan.torn:
                torn[rank] = scan.problem
            rs = rank_sums[rank] = {
                "events": 0, "chunks": 0, "kinds": {}, "t_first": None, "t_last": None,
                "dropped": 0, "open": 0, "mem_peak": 0, "truncated": scan.torn,
                "lost_bytes": scan.size - scan.good_bytes,
            }
            entries = chunk_entries[rank] = []

            def copy_chunk(piece, frame) -> None:
                nonlocal chunks_crc
                offset = f.tell() - chunks_at
                f.write(piece)
                chunks_crc = zlib.crc32(piece, chunks_crc)
                entries.append(layout.CHUNK_ENTRY.pack(
                    offset, frame.length, frame.count, frame.t_first, frame.t_last,
                    frame.step_first, frame.step_last,
                ))
                _fold(rs, frame, steps, groups, rank, path.name)
            for frame in scan.frames:
                if frame.kind == layout.FRAME_RANK_INFO:
                    rank_info.setdefault(rank, {}).update(frame_info(data, frame, path.name))
                    continue
                if frame.kind == layout.FRAME_EVENTS:
                    copy_chunk(memoryview(data)[frame.offset : frame.offset + frame.length], frame)
            hung = still_open(data, scan.frames, path.name)
            if hung:
                piece = encode_frame(layout.FRAME_EVENTS, rank, len(scan.frames), records=hung)
                copy_chunk(piece, parse_frame(piece, 0, len(piece), path.name))
            crash = read_crash_file(spool_dir, rank)
            if crash is not None:
                rank_info.setdefault(rank, {})["crash"] = crash
            events += rs["events"]
            if progress:
                progress(i + 1, len(paths))
        chunks_len = f.tell() - chunks_at

        blobs_at = f.tell()
        blob_rows, blobs_crc = _copy_blobs(spool_dir, f, blobs_at)
        blobs_len = f.tell() - blobs_at

        ranks = sorted(rank_sums)
        world = max(
            [int(info.get("world_size", 0) or 0) for info in rank_info.values()]
            + [ranks[-1] + 1]
        )
        layout.bounded(world, layout.MAX_WORLD, "world size", "pack")
        manifest = {
            "format": [layout.MAJOR, layout.MINOR],
            "features_required": ["columnar-chunks"],
            "features_optional": ["summaries"] + (["blobs"] if blob_rows else []),
            "tool": f"prism-rr {__version__}",
            "created_unix_ns": time.time_ns(),
            "world_size": world,
            "recorded_ranks": ranks,
            "groups": [groups[g] for g in sorted(groups)],
            "run": run,
        }
        if manifest_extra:
            manifest.update(manifest_extra)
        # Groups get a section of their own, read on first use: a job of 8192 ranks has
        # thousands, and opening a bundle should not decode them.
        group_list = manifest.pop("groups")
        summaries = {
            "ranks": rank_sums,
            "steps": {s: steps[s] for s in sorted(steps)},
        }
        rank_index = bytearray(layout.RANK_ENTRY.size * world)
        chunk_index = bytearray()
        n_chunks = 0
        for r in ranks:
            entries = chunk_entries[r]
            layout.RANK_ENTRY.pack_into(rank_index, r * layout.RANK_ENTRY.size, n_chunks, len(entries))
            chunk_index += b"".join(entries)
            n_chunks += len(entries)
        blob_index = b"".join(sorted(blob_rows))
        sections = [
            (layout.SEC_CHUNKS, chunks_at, chunks_len, chunks_crc & 0xFFFFFFFF),
            (layout.SEC_BLOBS, blobs_at, blobs_len, blobs_crc & 0xFFFFFFFF),
        ]
        for sid, payload in (
            (layout.SEC_MANIFEST, codec.compress(msgpack.packb(manifest, use_bin_type=True), 9)),
            (layout.SEC_SUMMARIES, codec.compress(msgpack.packb(summaries, use_bin_type=True))),
            (layout.SEC_RANK_INDEX, bytes(rank_index)),
            (layout.SEC_CHUNK_INDEX, bytes(chunk_index)),
            (layout.SEC_BLOB_INDEX, blob_index),
            (layout.SEC_RANK_INFO, codec.compress(msgpack.packb({r: rank_info.get(r, {}) for r in ranks}, use_bin_type=True))),
            (layout.SEC_GROUPS, codec.compress(msgpack.packb(group_list, use_bin_type=True))),
        ):
            sections.append((sid, f.tell(), len(payload), layout.crc32(payload)))
            f.write(payload)
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
    os.replace(tmp, out)
    return PackResult(
        path=out, ranks=len(ranks), chunks=n_chunks, events=events, blobs=len(blob_rows),
        bytes=size, torn=torn,
    )


def _fold(rs: dict, frame, steps: dict, groups: dict, rank: int, where: str) -> None:
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
        for step, start, end, peak in s.get(codec.S_STEPS, ()):
            steps.setdefault(int(step), {})[rank] = [start, end, peak]
        for gid, ranks, name, desc, backend in s.get(codec.S_GROUPS, ()):
            if gid not in groups:
                codec.unpack_ranks(ranks, f"{where}, offset {frame.offset}")  # refuse nonsense early
                groups[int(gid)] = {"id": int(gid), "ranks": ranks, "name": name, "desc": desc, "backend": backend}
    except (TypeError, ValueError, AttributeError) as exc:
        raise FormatError(f"{where}, offset {frame.offset}: malformed frame summary ({exc})") from None


MAX_CRASH_TEXT = 64 << 10  # bytes of a crash file carried into the bundle
_CRASH_HEADER = re.compile(r"prism-rr crash file: rank (\d+), pid (\d+), main thread (0x[0-9a-f]+)\n")


def read_crash_file(spool_dir: Path, rank: int) -> dict | None:
    """The rank's crash file (faulthandler's dump of every thread's Python stack when the
    process died of SIGSEGV, SIGABRT, SIGBUS, SIGFPE or SIGILL) as the rank info key
    `crash`: {"text": the dump (at most 64 KiB), "bytes": its whole size, "main_thread"};
    None when the process wrote no dump."""
    path = spool_dir / f"rank-{rank:05d}.crash"
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


def _copy_blobs(spool_dir: Path, f, blobs_at: int) -> tuple[list[bytes], int]:
    rows: list[bytes] = []
    crc = 0
    root = spool_dir / "blobs"
    if not root.is_dir():
        return rows, crc
    for path in sorted(root.glob("*/*.zst")):
        try:
            ident = bytes.fromhex(path.name[: -len(".zst")])
        except ValueError:
            continue
        if len(ident) != layout.BLOB_ID_LEN:
            continue
        stored = path.read_bytes()
        where = f"blob {path.name}"
        raw = codec.decompress(stored, layout.MAX_BLOB_RAW, where)
        if blob_id(raw) != ident:
            raise FormatError(f"{where}: content does not match its id")
        rows.append(layout.BLOB_ENTRY.pack(ident, f.tell() - blobs_at, len(stored), len(raw), layout.crc32(stored)))
        f.write(stored)
        crc = zlib.crc32(stored, crc)
    return rows, crc
