"""A structure-aware fuzzer for bundles.

Byte flips die at the first checksum. This fuzzer takes a bundle apart, decodes one
section or one chunk (zstd, then msgpack), mutates the decoded structure (a value of
another type, a huge or deeply nested value, a bomb of empty maps, a container that
declares more than it holds, a duplicate or missing key, a rank range of a million
ranks, an absurd number in a binary index or frame header), encodes it again and
rebuilds the file with every length, offset and checksum right, so that the mutation
reaches the parsers. Then it runs every read path a command can take, in process, and
reports any exception other than a PrismError, and the peak memory of each case (the
growth of the resident set, whose peak is reset before each case).

Run by tests/format/test_fuzz.py; alone:

    .venv/bin/python tests/format/fuzz.py --cases 2000 --seed 1 [--save DIR] [--bundle X.prism]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import struct
import sys
import tempfile
import time
import traceback
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import msgpack
import zstandard

from prism_rr.errors import PrismError
from prism_rr.format import layout

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden-v1.prism"
CORPUS = Path(__file__).resolve().parent.parent / "data" / "fuzz_corpus"
MEMORY_LIMIT = 512 << 20
# Mutated bundles above this are not run: an attachment is smaller, and a mapped file's
# pages count in the resident set that measures memory.
MAX_CASE_BYTES = 32 << 20

# --- msgpack with splices ------------------------------------------------------------


class Raw(bytes):
    """Bytes spliced into the encoding as they are: a bomb, a lie, deep nesting."""


class Pairs(list):
    """A map written as these (key, value) pairs: duplicate keys survive."""


def encode(v, out: bytearray) -> None:
    t = type(v)
    if t is Raw:
        out += v
    elif v is None:
        out.append(0xC0)
    elif t is bool:
        out.append(0xC3 if v else 0xC2)
    elif t is int:
        if 0 <= v < 128:
            out.append(v)
        elif -32 <= v < 0:
            out.append(v & 0xFF)
        elif 0 <= v < 1 << 64:
            out += b"\xcf" + struct.pack(">Q", v)
        elif -(1 << 63) <= v < 0:
            out += b"\xd3" + struct.pack(">q", v)
        else:
            out += b"\xcf" + struct.pack(">Q", v & ((1 << 64) - 1))
    elif t is float:
        out += b"\xcb" + struct.pack(">d", v)
    elif t is str:
        b = v.encode("utf-8", "surrogatepass")
        out += b"\xdb" + struct.pack(">I", len(b)) + b
    elif t is bytes:
        out += b"\xc6" + struct.pack(">I", len(v)) + v
    elif t in (list, tuple):
        out += b"\xdd" + struct.pack(">I", len(v))
        for x in v:
            encode(x, out)
    elif t is dict or t is Pairs:
        items = list(v.items()) if t is dict else list(v)
        out += b"\xdf" + struct.pack(">I", len(items))
        for k, x in items:
            encode(k, out)
            encode(x, out)
    else:
        raise TypeError(t)


def packb(v) -> bytes:
    out = bytearray()
    encode(v, out)
    return bytes(out)


def unpackb(data):
    return msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True)


def zc(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=1, write_content_size=True).compress(data)


def zd(data: bytes) -> bytes:
    return zstandard.ZstdDecompressor().decompress(data)


# --- evil values -------------------------------------------------------------------

_SCALARS = [
    None, True, False, 0, 1, -1, 7, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62 + 1, 2**63 - 1,
    -(2**63), 2**64 - 1, 1.5, -0.0, math.inf, -math.inf, math.nan, "", "x", "rank", "a" * 300,
    "\u00e9\u4e2d", b"", b"\0" * 16, b"x" * 17, "../../etc/passwd",
]


def _deep(n: int, leaf: bytes = b"\xc0", kind: int = 0x91) -> Raw:
    return Raw(bytes([kind]) * n + leaf)


def _deep_map(n: int) -> Raw:
    return Raw(b"\x81\x00" * n + b"\xc0")


def _bomb(rng: random.Random) -> Raw:
    n = rng.choice([1 << 10, 1 << 16, 1 << 20, 1 << 22, 1 << 24])
    piece = rng.choice([b"\x80", b"\x90", b"\x91\xc0", b"\x81\x00\x80", b"\xa2ab", b"\xcb" + b"\0" * 8, b"\xcd\x01\x00"])
    if rng.random() < 0.5:
        return Raw(b"\xdd" + struct.pack(">I", n) + piece * n)
    # a map with distinct keys, each holding the piece
    n = min(n, 1 << 16)
    body = bytearray(b"\xdf" + struct.pack(">I", n))
    for i in range(n):
        body += b"\xce" + struct.pack(">I", i) + piece
    return Raw(bytes(body))


def _liar(rng: random.Random) -> Raw:
    """A container or string that declares far more than follows."""
    head = rng.choice([b"\xdd", b"\xdf", b"\xdb", b"\xc6", b"\xdc", b"\xde"])
    size = rng.choice([2**31 - 1, 2**32 - 1, 1 << 20, 100])
    if head in (b"\xdc", b"\xde"):
        return Raw(head + struct.pack(">H", size & 0xFFFF) + b"\xc0")
    return Raw(head + struct.pack(">I", size) + b"\xc0\xc0")


def _ranks(rng: random.Random):
    return rng.choice([
        {0: 0, 1: 1 << 20, 2: 1}, {0: 0, 1: 1 << 40, 2: 1}, {0: 5, 1: 3, 2: 1}, {0: 0, 1: 10, 2: 0},
        {0: 0, 1: 10, 2: -1}, {0: -4, 1: 4, 2: 1}, {0: 0, 1: 8}, {0: "0", 1: 8, 2: 1},
        {0: 0, 1: 4, 2: 1, 3: 9}, [0, -1], [1 << 40], [0, 1, "2"], list(range(5000)),
    ])


def evil(rng: random.Random, like=None):
    r = rng.random()
    if r < 0.40:
        return rng.choice(_SCALARS)
    if r < 0.50 and type(like) is int:
        return rng.choice([like + 1, like - 1, -like, like * 2**rng.randrange(1, 64), like + 2**62, ~like])
    if r < 0.58:
        return rng.choice([[], {}, [0], {0: 0}, {"": None}, [[]] * 5, [None] * 3, {(1): {}}, [like, like]])
    if r < 0.68:
        d = rng.choice([33, 100, 1000, 1025])
        return _deep_map(d) if rng.random() < 0.3 else _deep(d)
    if r < 0.76:
        return _bomb(rng)
    if r < 0.82:
        return _liar(rng)
    if r < 0.90:
        return _ranks(rng)
    if r < 0.95 and like is not None:
        return [like] * rng.choice([2, 100, 10000])
    return Raw(rng.randbytes(rng.randrange(1, 12)))


def _paths(v, path=(), out=None, depth=0):
    """Every (container, key) in a decoded structure."""
    if out is None:
        out = []
    if depth > 12:
        return out
    if type(v) is dict:
        for k, x in v.items():
            out.append((v, k))
            _paths(x, path + (k,), out, depth + 1)
    elif type(v) is list:
        for i, x in enumerate(v):
            out.append((v, i))
            _paths(x, path + (i,), out, depth + 1)
    return out


def mutate_value(rng: random.Random, root):
    """One structural mutation of `root` (decoded with lists and dicts); returns the new root."""
    paths = _paths(root)
    if not paths or rng.random() < 0.03:
        return evil(rng, root)
    box, key = rng.choice(paths)
    old = box[key]
    op = rng.random()
    if op < 0.55:
        box[key] = evil(rng, old)
    elif op < 0.65:  # delete
        del box[key]
    elif op < 0.72 and type(box) is dict:  # an unknown key, or a key of another type
        if rng.random() < 0.5:
            box[rng.choice([99, "zz", 1 << 40, -1, b"k", 2.5])] = evil(rng)
        else:
            v = box.pop(key)
            nk = {int: lambda k: str(k), str: lambda k: len(k)}.get(type(key), lambda k: 0)(key)
            box[nk] = v
    elif op < 0.78 and type(box) is dict:  # a duplicate key, the second with an evil value
        pairs = Pairs(box.items())
        pairs.append((key, evil(rng, old)))
        replace_in(root, box, pairs)
    elif op < 0.86 and type(box) is list:
        if rng.random() < 0.5:
            box.extend(box * rng.choice([1, 10]))
        else:
            del box[rng.randrange(len(box)) :]
    elif op < 0.93:  # swap with another value somewhere
        box2, key2 = rng.choice(paths)
        try:
            box[key], box2[key2] = box2[key2], old
        except (KeyError, IndexError):
            pass
    else:
        box[key] = evil(rng, old)
        if paths:
            b2, k2 = rng.choice(paths)
            try:
                b2[k2] = evil(rng, b2[k2])
            except (KeyError, IndexError):
                pass
    return root


def replace_in(root, target, new) -> None:
    """Put `new` where the container `target` is inside `root`."""
    for box, key in _paths(root):
        try:
            if box[key] is target:
                box[key] = new
                return
        except (KeyError, IndexError):
            continue


# --- the bundle taken apart ---------------------------------------------------------


@dataclass
class Section:
    sid: int
    flags: int
    body: bytes
    reserved: int


class Parts:
    def __init__(self, data: bytes):
        self.head = bytearray(data[: layout.BUNDLE_HEADER.size])
        t_at = len(data) - layout.TRAILER.size
        _, table_at, count, self.major, self.minor, _, _ = layout.TRAILER.unpack_from(data, t_at)
        self.sections: list[Section] = []
        for i in range(count):
            sid, flags, off, length, _crc, res = layout.SECTION_ENTRY.unpack_from(data, table_at + i * layout.SECTION_ENTRY.size)
            self.sections.append(Section(sid, flags, bytes(data[off : off + length]), res))

    def get(self, sid: int) -> Section | None:
        return next((s for s in self.sections if s.sid == sid), None)

    def build(self) -> bytes:
        out = bytearray(self.head)
        out[-4:] = layout.crc32(bytes(out[:-4])).to_bytes(4, "little")
        table = bytearray()
        for s in self.sections:
            table += layout.SECTION_ENTRY.pack(s.sid, s.flags, len(out), len(s.body), layout.crc32(s.body), s.reserved)
            out += s.body
        table_at = len(out)
        out += table
        trailer = layout.TRAILER.pack(layout.TRAILER_MAGIC, table_at, len(self.sections), self.major, self.minor,
                                      layout.crc32(bytes(table)), 0)
        out += trailer[:-4] + layout.crc32(trailer[:-4]).to_bytes(4, "little")
        return bytes(out)

    # chunks: frames in the chunk section, found through the chunk index
    def chunk_entries(self) -> list[list]:
        idx = self.get(layout.SEC_CHUNK_INDEX).body
        n = len(idx) // layout.CHUNK_ENTRY.size
        return [list(layout.CHUNK_ENTRY.unpack_from(idx, i * layout.CHUNK_ENTRY.size)) for i in range(n)]

    def set_chunk_entries(self, entries) -> None:
        self.get(layout.SEC_CHUNK_INDEX).body = b"".join(layout.CHUNK_ENTRY.pack(*e) for e in entries)

    def replace_frame(self, i: int, frame: bytes) -> None:
        """Chunk i's frame replaced, every later offset shifted."""
        entries = self.chunk_entries()
        sec = self.get(layout.SEC_CHUNKS)
        off, length = entries[i][0], entries[i][1]
        sec.body = sec.body[:off] + frame + sec.body[off + length :]
        delta = len(frame) - length
        for e in entries:
            if e[0] > off:
                e[0] += delta
        entries[i][1] = len(frame)
        self.set_chunk_entries(entries)


def parse_frame(buf: bytes):
    f = list(layout.FRAME_HEADER.unpack_from(buf, 0))
    summ_len, comp_len = f[8], f[7]
    size = layout.FRAME_HEADER.size
    summary = buf[size : size + summ_len]
    payload = buf[size + summ_len : size + summ_len + comp_len]
    return f, summary, payload


def build_frame(f: list, summary: bytes, payload: bytes, raw_len: int | None = None) -> bytes:
    f = list(f)
    f[7], f[8] = len(payload), len(summary)
    if raw_len is not None:
        f[6] = raw_len
    f[13] = layout.crc32(summary + payload)
    f[14] = 0
    head = layout.FRAME_HEADER.pack(*f)
    head = head[:-4] + layout.crc32(head[:-4]).to_bytes(4, "little")
    return head + summary + payload


# --- mutations of a bundle ------------------------------------------------------------

_META = (layout.SEC_MANIFEST, layout.SEC_SUMMARIES, layout.SEC_RANK_INFO, layout.SEC_GROUPS)
_U32 = [0, 1, 7, 2**16, 2**20, 2**31 - 1, 2**32 - 1]
_I64 = [0, -1, 1, 2**62, 2**63 - 1, -(2**63)]
_I32 = [0, -1, 2**31 - 1, -(2**31)]


def mutate_bundle(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    parts = Parts(data)
    target = rng.choices(
        ["meta", "chunk", "chunk_summary", "frame_header", "index", "blob", "table"],
        weights=[30, 35, 8, 7, 10, 6, 4],
    )[0]
    if target == "meta":
        sid = rng.choice([s for s in _META if parts.get(s) is not None])
        sec = parts.get(sid)
        value = unpackb(zd(sec.body))
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            value = mutate_value(rng, value)
        sec.body = zc(packb(value))
        return parts.build(), f"{layout.SECTION_NAMES[sid]}"
    entries = parts.chunk_entries()
    if target in ("chunk", "chunk_summary", "frame_header") and entries:
        i = rng.randrange(len(entries))
        off, length = entries[i][0], entries[i][1]
        frame = parts.get(layout.SEC_CHUNKS).body[off : off + length]
        f, summary, payload = parse_frame(frame)
        if target == "chunk":
            value = unpackb(zd(payload))
            for _ in range(rng.choice([1, 1, 1, 2, 3])):
                value = mutate_value(rng, value)
            raw = packb(value)
            payload = zc(raw)
            parts.replace_frame(i, build_frame(f, summary, payload, raw_len=len(raw)))
        elif target == "chunk_summary":
            value = unpackb(summary) if summary else {}
            value = mutate_value(rng, value)
            parts.replace_frame(i, build_frame(f, packb(value), payload))
        else:
            field = rng.choice([5, 6, 9, 10, 11, 12, 3, 4])  # count, raw_len, t_first, t_last, steps, rank, index
            if field in (9, 10):
                f[field] = rng.choice(_I64)
            elif field in (11, 12):
                f[field] = rng.choice(_I32)
            else:
                f[field] = rng.choice(_U32)
            if field == 5 and rng.random() < 0.5:
                entries[i][2] = f[5] % 2**32  # index agrees with the header
                parts.set_chunk_entries(entries)
            if field in (9, 10, 11, 12) and rng.random() < 0.7:
                entries[i][field - 6] = f[field]  # t_first.. in the index at 3..6
                parts.set_chunk_entries(entries)
            head_raw = f[6]
            parts.replace_frame(i, build_frame(f, summary, payload, raw_len=head_raw))
        return parts.build(), target
    if target == "blob" and parts.get(layout.SEC_BLOB_INDEX) is not None and parts.get(layout.SEC_BLOB_INDEX).body:
        idx = bytearray(parts.get(layout.SEC_BLOB_INDEX).body)
        blobs = parts.get(layout.SEC_BLOBS)
        n = len(idx) // layout.BLOB_ENTRY.size
        j = rng.randrange(n)
        ident, off, length, raw_len, crc = layout.BLOB_ENTRY.unpack_from(idx, j * layout.BLOB_ENTRY.size)
        kind = rng.random()
        if kind < 0.4:  # a new stored frame: a bomb, or a frame declaring a lie
            size = rng.choice([1 << 20, 64 << 20, 300 << 20])
            stored = zc(b"\0" * size) if size <= 64 << 20 else zc(b"\0" * (1 << 20))
            if size > 64 << 20:
                stored = _patch_content_size(stored, rng.choice([2**31 - 1, 2**32 - 1, size]))
            raw_len = rng.choice([size, 2**31 - 1, raw_len])
            blobs.body = blobs.body + stored
            off, length, crc = len(blobs.body) - len(stored), len(stored), layout.crc32(stored)
        else:
            field = rng.choice(["off", "length", "raw"])
            v = rng.choice(_U32)
            if field == "off":
                off = v
            elif field == "length":
                length = v
            else:
                raw_len = v
        layout.BLOB_ENTRY.pack_into(idx, j * layout.BLOB_ENTRY.size, ident, off % 2**64, length % 2**32, raw_len % 2**32, crc)
        parts.get(layout.SEC_BLOB_INDEX).body = bytes(idx)
        return parts.build(), "blob"
    if target == "table":
        op = rng.random()
        if op < 0.4:
            del parts.sections[rng.randrange(len(parts.sections))]
        elif op < 0.7:
            parts.sections.append(Section(rng.choice([10, 77, 2**32 - 1]), 0, rng.randbytes(rng.randrange(64)), 0))
        else:
            s = rng.choice(parts.sections)
            parts.sections.append(Section(s.sid, s.flags, s.body, s.reserved))
        return parts.build(), "table"
    # binary indexes
    sid = rng.choice([layout.SEC_RANK_INDEX, layout.SEC_CHUNK_INDEX])
    sec = parts.get(sid)
    body = bytearray(sec.body)
    if not body or rng.random() < 0.1:
        body += rng.randbytes(rng.choice([1, 8, 40]))
    else:
        width = 4 if sid == layout.SEC_RANK_INDEX else rng.choice([4, 8])
        at = rng.randrange(0, max(1, len(body) - width + 1), width) if sid == layout.SEC_RANK_INDEX else rng.randrange(max(1, len(body) - width + 1))
        v = rng.choice(_U32 if width == 4 else [0, 1, 2**32, 2**63 - 1, 2**64 - 1])
        body[at : at + width] = v.to_bytes(width, "little")
    sec.body = bytes(body)
    return parts.build(), layout.SECTION_NAMES[sid]


def _patch_content_size(frame: bytes, size: int) -> bytes:
    """A zstd frame whose header declares `size` (the data stays as it was)."""
    fhd = frame[4]
    fcs_flag = fhd >> 6
    single = (fhd >> 5) & 1
    did = fhd & 3
    pos = 5 + (0 if single else 1) + [0, 1, 2, 4][did]
    width = [1 if single else 0, 2, 4, 8][fcs_flag]
    new_fhd = (fhd & 0x3F) | (3 << 6)
    body = frame[:4] + bytes([new_fhd]) + frame[5:pos] + size.to_bytes(8, "little") + frame[pos + width :]
    return body


# --- what a command may do with a bundle -------------------------------------------------


def _open_and_facts(path, scratch):
    from prism_rr.format import open_bundle

    with open_bundle(path) as b:
        b.manifest, b.summaries, b.steps, b.event_count, b.groups
        for r in b.recorded_ranks[:64]:
            b.rank_info(r)
            b.rank_summary(r)
        for s in b.steps[:64]:
            b.step_times(s)
        json.dumps(b.facts())


def _events(path, scratch):
    from prism_rr.format import open_bundle

    with open_bundle(path) as b:
        blobs = 0
        for r in b.recorded_ranks[:64]:
            for rec in b.events(r):
                for ident in (getattr(rec, "blob_out", None) or ()) + (getattr(rec, "blob_in", None) or ()) + (getattr(rec, "blob", None) or ()):
                    if blobs < 8:
                        blobs += 1
                        b.blob(ident)
        for r in b.recorded_ranks[:1]:
            list(b.events(r, steps=(0, 1), window=(0, 2**62)))


def _verify(path, scratch):
    from prism_rr.format import open_bundle, verify

    with open_bundle(path) as b:
        verify(b)


def _diagnose(path, scratch):
    from prism_rr.format import open_bundle
    from prism_rr.analysis import diagnose, diagnosis_json

    with open_bundle(path) as b:
        json.dumps(diagnosis_json(diagnose(b)))


def _diagnose_windows(path, scratch):
    from prism_rr.format import open_bundle
    from prism_rr.analysis import diagnose, diagnosis_json

    with open_bundle(path) as b:
        json.dumps(diagnosis_json(diagnose(b, window_events=1)))  # a window a step, as a huge bundle is read


def _analyze(path, scratch):
    from prism_rr.format import open_bundle
    from prism_rr.analysis import attribute, attribution_json

    with open_bundle(path) as b:
        json.dumps(attribution_json(attribute(b)))


def _diff(path, scratch):
    from prism_rr.format import open_bundle
    from prism_rr.analysis import diff_bundles, diff_json

    with open_bundle(path) as a, open_bundle(path) as b:
        json.dumps(diff_json(diff_bundles(a, b)))


def _export(path, scratch):
    from prism_rr.format import open_bundle
    from prism_rr.analysis import export_chrome

    with open_bundle(path) as b:
        export_chrome(b, scratch / "trace.json")


def _tui(path, scratch):
    from prism_rr.format import open_bundle
    from prism_rr.tui import analysis
    from prism_rr.tui.model import TimelineModel

    with open_bundle(path) as b:
        tm = TimelineModel(b)
        for r in tm.ranks[:8]:
            tm.load(r)
            tm.rank_step_times(r)
        for g in list(tm.groups)[:2]:
            analysis.group_calls(tm, g)


def _redact(path, scratch):
    from prism_rr.format import open_bundle
    from prism_rr.format.redact import redact

    out = scratch / "red.prism"
    redact(path, out)
    open_bundle(out).close()
    out.unlink()


# Every read a command can make: info (--json), events and blobs (the Python API, replay),
# verify, diagnose (the graph, whole and a window a step), analyze, diff, export, the TUI's
# model, redact. Each runs on its own, so a FormatError in one does not hide a crash in
# another.
READ_PATHS = {
    "info": _open_and_facts, "events": _events, "verify": _verify, "diagnose": _diagnose,
    "diagnose-windows": _diagnose_windows, "analyze": _analyze, "diff": _diff,
    "export": _export, "tui": _tui, "redact": _redact,
}


def read_paths(path: Path, scratch: Path) -> list[tuple[str, BaseException]]:
    """Run every read path on `path`; the exceptions other than PrismError, by path."""
    from prism_rr.format import open_bundle

    try:
        open_bundle(path).close()
    except PrismError:
        return []  # every path starts by opening the bundle, and would end here
    except Exception as exc:  # noqa: BLE001
        return [("open", exc)]
    bad = []
    for name, run in READ_PATHS.items():
        try:
            run(path, scratch)
        except PrismError:
            pass
        except Exception as exc:  # noqa: BLE001 - what the fuzzer is looking for
            bad.append((name, exc))
    return bad


@dataclass
class Outcome:
    case: int
    what: str
    error: str | None  # "Type: message" of an exception that is not a PrismError
    where: str | None  # the innermost frame of prism_rr code it came from
    peak: int  # bytes, tracemalloc
    seconds: float
    data: bytes | None = None


def _rss() -> tuple[int, int]:
    """(current, peak) resident bytes of this process (Linux)."""
    with open("/proc/self/status") as f:
        text = f.read()
    cur = int(text.split("VmRSS:")[1].split()[0]) << 10
    peak = int(text.split("VmHWM:")[1].split()[0]) << 10
    return cur, peak


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM, the peak resident size
        return True
    except OSError:
        return False


def run_case(data: bytes, scratch: Path, what: str = "", case: int = 0) -> Outcome:
    """Run every read path on `data`. Peak memory is the growth of the resident set over
    the case (VmHWM reset before it: it counts C allocations too, and costs nothing),
    or tracemalloc's peak where that reset is not allowed."""
    path = scratch / "case.prism"
    # a new file each case: ext4 flushes a file truncated and rewritten in place to disk
    # as it is closed (auto_da_alloc), a few ms a case
    path.unlink(missing_ok=True)
    path.write_bytes(data)
    error = where = None
    rss = _reset_peak()
    if rss:
        base = _rss()[0]
    else:
        if not tracemalloc.is_tracing():
            tracemalloc.start(1)
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    bad = read_paths(path, scratch)
    if bad:
        name, exc = bad[0]
        error = f"{name}: {type(exc).__name__}: {str(exc)[:200]}"
        tb = traceback.extract_tb(exc.__traceback__)
        ours = [f for f in tb if "prism_rr" in f.filename] or tb
        where = f"{Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours else "?"
    seconds = time.perf_counter() - t0
    peak = (_rss()[1] if rss else tracemalloc.get_traced_memory()[1]) - base
    return Outcome(case, what, error, where, max(peak, 0), seconds, data if error or peak > MEMORY_LIMIT else None)


def fuzz(cases: int, seed: int, bundles: list[bytes], scratch: Path, progress=None) -> list[Outcome]:
    """`cases` mutated bundles (seeded); the outcome of each."""
    rng = random.Random(seed)
    out = []
    try:
        for i in range(cases):
            base = bundles[0] if len(bundles) == 1 or rng.random() < 0.3 else rng.choice(bundles[1:])
            data, what = base, "none"
            for _ in range(rng.choice([1, 1, 1, 2])):
                try:
                    new, new_what = mutate_bundle(data, rng)
                except Exception as exc:  # a mutation that cannot be built (a broken earlier one)
                    what = f"{what} (unbuildable: {type(exc).__name__})"
                    break
                if len(new) > MAX_CASE_BYTES:  # no bug report carries it; its pages would count as memory
                    what = f"{what} ({new_what} too big)"
                    break
                data, what = new, new_what
            out.append(run_case(data, scratch, what, i))
            if progress:
                progress(i, out[-1])
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    return out


def replay_corpus(scratch: Path, corpus: Path = CORPUS) -> list[Outcome]:
    out = []
    try:
        for i, path in enumerate(sorted(corpus.glob("*.bundle"))):
            out.append(run_case(path.read_bytes(), scratch, path.name, i))
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    return out


def save(o: Outcome, directory: Path) -> Path:
    import hashlib

    directory.mkdir(parents=True, exist_ok=True)
    name = f"{(o.where or 'mem').replace(':', '_').replace('.py', '')}-{hashlib.blake2b(o.data, digest_size=6).hexdigest()}.bundle"
    path = directory / name
    path.write_bytes(o.data)
    return path


def demo_bundle(scratch: Path) -> bytes:
    """A second base: a small synthetic run with payloads and short chunks."""
    from prism_rr.format import pack
    from prism_rr.format.synthetic import write_synthetic

    spools = write_synthetic(scratch / "base.prism.d", 4, 48, payload=True, chunk_records=16, tp=2)
    pack(spools, scratch / "base.prism")
    return (scratch / "base.prism").read_bytes()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=1000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--save", type=Path, default=None, help="write failing cases here")
    p.add_argument("--bundle", type=Path, action="append", default=[])
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.add_argument("--max-memory-mib", type=int, default=2048,
                   help="address space allowed above what the process holds at start (a guard for the machine)")
    args = p.parse_args(argv)
    try:
        import resource

        with open("/proc/self/status") as f:
            vsz = int(f.read().split("VmSize:")[1].split()[0]) << 10
        cap = vsz + (args.max_memory_mib << 20) + (256 << 20)  # the read paths' own imports
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    except (ImportError, OSError, ValueError, IndexError):
        pass
    with tempfile.TemporaryDirectory(prefix="prism-fuzz-") as tmp:
        scratch = Path(tmp)
        bundles = [b.read_bytes() for b in args.bundle] or [GOLDEN.read_bytes(), demo_bundle(scratch)]
        t0 = time.time()
        so_far = {"failures": 0, "peak": 0}

        def progress(i: int, o: Outcome) -> None:
            if o.error or o.peak > MEMORY_LIMIT:
                so_far["failures"] += 1
                if args.save:
                    save(o, args.save)
            so_far["peak"] = max(so_far["peak"], o.peak)
            if (i + 1) % 500 == 0:
                print(f"{i + 1} cases, {time.time() - t0:.0f} s, {so_far['failures']} failures, "
                      f"peak {so_far['peak'] / 2**20:.1f} MiB", file=sys.stderr, flush=True)

        outcomes = fuzz(args.cases, args.seed, bundles, scratch, progress)
        failures = [o for o in outcomes if o.error or o.peak > MEMORY_LIMIT]
        kinds: dict[str, int] = {}
        for o in failures:
            key = f"{o.where} {o.error.split(':')[1].strip() if o.error else 'memory'}"
            kinds[key] = kinds.get(key, 0) + 1
        worst = max(outcomes, key=lambda o: o.peak)
        summary = {
            "cases": len(outcomes), "seed": args.seed, "failures": len(failures), "kinds": kinds,
            "peak_max": worst.peak, "peak_max_what": worst.what, "seconds": round(time.time() - t0, 1),
            "slowest": round(max(o.seconds for o in outcomes), 2),
            "examples": [f"{o.what}: {o.where}: {o.error}" for o in failures[:20]],
        }
        if args.json:
            print(json.dumps(summary))
        else:
            print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
