"""Byte layout of spools and bundles: magic numbers, fixed structs, limits (FORMAT.md)."""

from __future__ import annotations

import struct
import zlib

from prism_rr.errors import FormatError

MAJOR = 1
# 1.1: the summaries section as tables of int64 columns (format/summaries.py)
# 1.2: attempts: every incarnation of the job in one bundle (section 10, manifest `attempts`)
# 1.3: device time: DeviceTime records (kind 8) and the summaries' device step table
MINOR = 3

# Features this reader implements. A bundle lists the ones a reader must know.
FEATURES_KNOWN = frozenset({"columnar-chunks", "columnar-summaries", "blobs", "summaries", "digests", "redacted",
                            "attempts", "device-time"})

SPOOL_MAGIC = b"PRSPOOL\x00"
SPOOL_HEADER = struct.Struct("<8sHHII")  # magic, major, minor, rank, crc32 of the first 16 bytes

FRAME_MAGIC = b"PRCK"
FRAME_EVENTS = 1
FRAME_RANK_INFO = 2
# magic, flags, kind, rank, index, count, raw_len, comp_len, summ_len,
# t_first, t_last, step_first, step_last, crc_body, crc_head
FRAME_HEADER = struct.Struct("<4sHHIIIIIIqqiiII")

BUNDLE_MAGIC = b"\x89PRISM\r\n"
BUNDLE_HEADER = struct.Struct("<8sHHI12sI")  # magic, major, minor, flags, reserved, crc32
TRAILER_MAGIC = b"PRISMEND"
# magic, table offset, table count, major, minor, table crc32, trailer crc32
TRAILER = struct.Struct("<8sQIHHII")
SECTION_ENTRY = struct.Struct("<IIQQII")  # id, flags, offset, length, crc32, reserved

SEC_MANIFEST = 1
SEC_CHUNKS = 2
SEC_BLOBS = 3
SEC_BLOB_INDEX = 4
SEC_SUMMARIES = 5
SEC_RANK_INDEX = 6
SEC_CHUNK_INDEX = 7
SEC_RANK_INFO = 8
SEC_GROUPS = 9
SEC_ATTEMPTS = 10  # the other attempts' summaries, indexes, rank info and groups
SECTION_NAMES = {
    SEC_MANIFEST: "manifest",
    SEC_CHUNKS: "chunks",
    SEC_BLOBS: "blobs",
    SEC_BLOB_INDEX: "blob index",
    SEC_SUMMARIES: "summaries",
    SEC_RANK_INDEX: "rank index",
    SEC_CHUNK_INDEX: "chunk index",
    SEC_RANK_INFO: "rank info",
    SEC_GROUPS: "groups",
    SEC_ATTEMPTS: "attempts",
}
# The sections of one attempt (FORMAT.md §4, "Attempts"): the base ones hold the default
# attempt's; the manifest's `attempts` says where each other attempt's lie.
ATTEMPT_SECTIONS = (SEC_SUMMARIES, SEC_RANK_INDEX, SEC_CHUNK_INDEX, SEC_RANK_INFO, SEC_GROUPS)
MAX_ATTEMPT = 1 << 20
REQUIRED_SECTIONS = (SEC_MANIFEST, SEC_CHUNKS, SEC_SUMMARIES, SEC_RANK_INDEX, SEC_CHUNK_INDEX, SEC_GROUPS)

RANK_ENTRY = struct.Struct("<II")  # first chunk, number of chunks; dense by rank
# offset in chunk section, length, count, t_first, t_last, step_first, step_last
CHUNK_ENTRY = struct.Struct("<QIIqqii")
BLOB_ID_LEN = 16
# blob id, offset in blob section, stored length, raw length, crc32 of stored bytes
BLOB_ENTRY = struct.Struct("<16sQIII")

# Bounds applied before anything is allocated from a length read off disk.
MAX_CHUNK_RAW = 64 << 20
MAX_CHUNK_COMPRESSED = 64 << 20
MAX_CHUNK_EVENTS = 1 << 20
MAX_SUMMARY_LEN = 1 << 20
MAX_SECTIONS = 64
MAX_WORLD = 1 << 20
MAX_MANIFEST_RAW = 256 << 20
# 40 bytes a rank and step in 1.1's step table: 8192 ranks of 2000 steps take 656 MB. What
# a frame may declare is bounded by its stored length too (ratio_limit), so a zip bomb
# gains nothing from this.
MAX_SUMMARIES_RAW = 2 << 30
MAX_BLOB_RAW = 1 << 31
MAX_RANK_INFO_RAW = 1 << 20
MAX_GROUPS_RAW = 256 << 20

# Budgets: what a bundle's own bytes can justify (FORMAT.md, "Hostile input"). Each is
# checked before the memory it guards is allocated.
# A zstd frame may declare at most RATIO_FLOOR + MAX_RATIO * (its stored length) bytes
# (real chunks and metadata compress 2 to 40 times); a blob BLOB_RATIO_FLOOR +
# MAX_BLOB_RATIO * (its stored length).
MAX_RATIO = 128
RATIO_FLOOR = 64 << 10
MAX_BLOB_RATIO = 1024
BLOB_RATIO_FLOOR = 1 << 20
# A msgpack value costs Python up to ~60 times its encoding (a 1-element array: 2 bytes,
# 56 bytes of Python; an empty map: 1 byte, 64). A decoded frame may hold at most
# OBJECTS_FLOOR + OBJECTS_PER_BYTE * (its stored length) objects, counting each element of
# an array, each key and value of a map, 1 for each array and 4 for each map (real frames
# hold under 8 per stored byte). No one array or map may hold more than half of that.
OBJECTS_PER_BYTE = 16
OBJECTS_FLOOR = 1 << 16
# ... and never more than this many, whatever its size (a chunk of 2048 records holds
# ~100K; the rank info of 8192 ranks under 1M): a frame costs at most a few hundred MiB.
MAX_OBJECTS = 1 << 22
# Nesting of values in the manifest, summaries, rank info and groups.
MAX_DEPTH = 32
# Ranks of all groups together, once arithmetic runs are expanded: at most
# GROUP_RANKS_FLOOR + GROUP_RANKS_PER_RANK * world_size (a world is justified by its rank
# index: 8 bytes a rank).
GROUP_RANKS_PER_RANK = 16
GROUP_RANKS_FLOOR = 1 << 16


def ratio_limit(stored: int, *, blob: bool = False) -> int:
    """The largest decompressed size `stored` bytes of zstd may declare."""
    if blob:
        return BLOB_RATIO_FLOOR + MAX_BLOB_RATIO * stored
    return RATIO_FLOOR + MAX_RATIO * stored


def objects_limit(stored: int) -> int:
    """The most msgpack objects a frame of `stored` bytes may decode to (see above)."""
    return min(OBJECTS_FLOOR + OBJECTS_PER_BYTE * stored, MAX_OBJECTS)


def crc32(data) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def bounded(value: int, limit: int, what: str, where: str) -> int:
    """`value` if 0 <= value <= limit, else a FormatError naming what and where."""
    if not 0 <= value <= limit:
        raise FormatError(f"{where}: {what} {value} is out of bounds (limit {limit})")
    return value

# The summaries section's tables (format 1.1, format/summaries.py), by key.
RANK_TABLE = "rank_table"
STEP_TABLE = "step_table"
DEVICE_STEP_TABLE = "device_step_table"  # format 1.3, where a bundle has device time
