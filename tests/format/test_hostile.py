"""Bundles arrive from strangers: every malformed input ends in a FormatError.

PRISM_RR_FUZZ=N multiplies the number of cases (e.g. PRISM_RR_FUZZ=50 for a long run).
"""

import os
import random
import struct
from pathlib import Path

import msgpack
import pytest

from prism_rr.errors import FormatError, UnsupportedVersionError
from prism_rr.format import codec, layout, open_bundle, verify
from prism_rr.format.synthetic import synthetic_records

GOLDEN = Path(__file__).parent.parent / "data" / "golden-v1.prism"
SCALE = int(os.environ.get("PRISM_RR_FUZZ", "1"))


def read_everything(path):
    """Everything a user's command could touch, without verify's extra checks."""
    with open_bundle(path) as b:
        b.summaries, b.steps, b.event_count, b.groups
        for rank in range(b.world_size):
            b.rank_info(rank)
            for rec in b.events(rank):
                for ident in getattr(rec, "blob_out", None) or ():
                    b.blob(ident)


def assert_only_format_error(path, must_fail=True):
    try:
        read_everything(path)
    except FormatError as exc:
        assert str(exc), "a FormatError must say what and where"
    try:
        with open_bundle(path) as b:
            verify(b)
    except FormatError as exc:
        assert "offset" in str(exc) or "section" in str(exc) or "rank" in str(exc) or "blob" in str(exc), str(exc)
        return
    assert not must_fail, "verify accepted a damaged bundle"


def test_truncated_at_every_offset(tmp_path):
    data = GOLDEN.read_bytes()
    path = tmp_path / "cut.prism"
    for n in range(len(data)):
        path.write_bytes(data[:n])
        with pytest.raises(FormatError):
            read_everything(path)


def test_bit_flips_anywhere(tmp_path):
    data = GOLDEN.read_bytes()
    rng = random.Random(2026)
    path = tmp_path / "flip.prism"
    for _ in range(1000 * SCALE):
        buf = bytearray(data)
        at = rng.randrange(len(buf))
        buf[at] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(buf))
        assert_only_format_error(path)


def _resealed(data: bytes, sid: int, mutate) -> bytes:
    """The bundle with one section's bytes mutated and every checksum made valid again,
    so the checks behind the checksums are reached."""
    buf = bytearray(data)
    t_at = len(buf) - layout.TRAILER.size
    _, table_at, count, *_ = layout.TRAILER.unpack_from(buf, t_at)
    sections = {}
    for i in range(count):
        entry = layout.SECTION_ENTRY.unpack_from(buf, table_at + i * layout.SECTION_ENTRY.size)
        sections[entry[0]] = (i, entry)
    i, (sid_, flags, offset, length, _crc, res) = sections[sid]
    body = bytes(buf[offset : offset + length])
    new = mutate(body)
    assert len(new) <= length or sid == layout.SEC_MANIFEST
    # Rebuild: sections before this one stay put; this one is rewritten in place
    # when no longer than before, else appended after the body.
    if len(new) <= length:
        buf[offset : offset + len(new)] = new
        length = len(new)
    else:
        offset = table_at
        buf[table_at:table_at] = new
        table_at += len(new)
    layout.SECTION_ENTRY.pack_into(buf, table_at + i * layout.SECTION_ENTRY.size, sid_, flags, offset, length, layout.crc32(new), res)
    table = buf[table_at : table_at + count * layout.SECTION_ENTRY.size]
    trailer = layout.TRAILER.pack(layout.TRAILER_MAGIC, table_at, count, layout.MAJOR, layout.MINOR, layout.crc32(table), 0)
    buf[table_at + len(table):] = trailer[:-4] + layout.crc32(trailer[:-4]).to_bytes(4, "little")
    return bytes(buf)


@pytest.mark.parametrize("sid", [layout.SEC_RANK_INDEX, layout.SEC_CHUNK_INDEX, layout.SEC_BLOB_INDEX, layout.SEC_RANK_INFO, layout.SEC_GROUPS])
def test_damaged_indexes_behind_valid_checksums(tmp_path, sid):
    data = GOLDEN.read_bytes()
    rng = random.Random(sid)
    path = tmp_path / "idx.prism"
    for _ in range(150 * SCALE):
        def mutate(body):
            b = bytearray(body)
            for _ in range(rng.randrange(1, 4)):
                at = rng.randrange(len(b))
                b[at] = rng.randrange(256)
            return bytes(b)
        path.write_bytes(_resealed(data, sid, mutate))
        assert_only_format_error(path, must_fail=False)


def test_hostile_manifests_behind_valid_checksums(tmp_path):
    data = GOLDEN.read_bytes()
    path = tmp_path / "m.prism"
    good = {"format": [1, 0], "world_size": 4, "recorded_ranks": [0, 1, 2, 3], "groups": [], "ranks": {}, "run": {}}
    cases = [
        b"not zstd at all",
        codec.compress(b"\xc1"),  # msgpack's never-used byte
        codec.compress(msgpack.packb([1, 2, 3])),
        codec.compress(msgpack.packb({**good, "world_size": -1})),
        codec.compress(msgpack.packb({**good, "world_size": 2**40})),
        codec.compress(msgpack.packb({**good, "world_size": "4"})),
        codec.compress(msgpack.packb({**good, "recorded_ranks": [9]})),
        codec.compress(msgpack.packb({**good, "format": "1.0"})),
        codec.compress(msgpack.packb({**good, "world_size": 3})),  # disagrees with the rank index
        codec.compress(msgpack.packb({1: 2, (1,): 3}, strict_types=False) if False else msgpack.packb({**good, "features_required": [7]})),
    ]
    for case in cases:
        path.write_bytes(_resealed(data, layout.SEC_MANIFEST, lambda _b: case))
        with pytest.raises(FormatError):
            read_everything(path)


def test_hostile_groups_behind_valid_checksums(tmp_path):
    path = tmp_path / "g.prism"
    for case in (
        [{"id": 1, "ranks": {0: 5, 1: 2**40, 2: 1}}],  # a range of 2^40 ranks
        [{"id": 1, "ranks": ["a"]}],
        [{"id": "x", "ranks": [0]}],
        {"not": "a list"},
    ):
        path.write_bytes(_resealed(GOLDEN.read_bytes(), layout.SEC_GROUPS, lambda _b: codec.compress(msgpack.packb(case))))
        with pytest.raises(FormatError):
            read_everything(path)


def test_unknown_required_feature_is_refused(tmp_path):
    good = {"format": [1, 0], "world_size": 4, "recorded_ranks": [0, 1, 2, 3], "features_required": ["columnar-chunks", "quantum-chunks"]}
    path = tmp_path / "f.prism"
    path.write_bytes(_resealed(GOLDEN.read_bytes(), layout.SEC_MANIFEST, lambda _b: codec.compress(msgpack.packb(good))))
    with pytest.raises(UnsupportedVersionError, match="quantum-chunks"):
        open_bundle(path)


def test_newer_major_version_is_refused_with_both_versions(tmp_path):
    buf = bytearray(GOLDEN.read_bytes())
    struct.pack_into("<H", buf, 8, 2)
    head = bytes(buf[: layout.BUNDLE_HEADER.size - 4])
    buf[layout.BUNDLE_HEADER.size - 4 : layout.BUNDLE_HEADER.size] = layout.crc32(head).to_bytes(4, "little")
    path = tmp_path / "v2.prism"
    path.write_bytes(bytes(buf))
    with pytest.raises(UnsupportedVersionError) as err:
        open_bundle(path)
    assert "2.0" in str(err.value) and "1.0" in str(err.value)


def test_newer_minor_version_is_read(tmp_path):
    """Minor versions only add: a 1.7 bundle with unknown keys and kinds still reads."""
    from prism_rr.format.records import Collective

    recs = [r for r in synthetic_records(0, 2, 50) if isinstance(r, Collective)][:5]
    payload, _ = codec.encode_chunk(recs)
    chunk = msgpack.unpackb(payload, strict_map_key=False)
    chunk[99] = "a future top-level key"
    chunk[1][1][0][250] = [1] * len(recs)  # a future field of Collective
    chunk[1][77] = [{}, {}]  # a future record kind...
    chunk[0] = chunk[0] + [77]  # ...with one record in the order
    out = codec.decode_chunk(msgpack.packb(chunk), len(recs) + 1, "test")
    assert out == recs


def test_decoder_fuzz_without_checksums():
    """Mutated chunk payloads (as if a checksum collided) still end in FormatError."""
    recs = list(synthetic_records(0, 4, 200, payload=True))
    payload, _ = codec.encode_chunk(recs)
    rng = random.Random(7)
    for _ in range(1500 * SCALE):
        b = bytearray(payload)
        for _ in range(rng.randrange(1, 6)):
            op = rng.randrange(3)
            at = rng.randrange(len(b))
            if op == 0:
                b[at] = rng.randrange(256)
            elif op == 1:
                del b[at : at + rng.randrange(1, 20)]
            else:
                b[at:at] = rng.randbytes(rng.randrange(1, 10))
        try:
            codec.decode_chunk(bytes(b), len(recs), "fuzz")
        except FormatError:
            pass


def test_decompression_bomb_is_refused():
    bomb = codec.compress(b"\0" * (70 << 20))
    with pytest.raises(FormatError, match="out of bounds"):
        codec.decompress(bomb, layout.MAX_CHUNK_RAW, "test")


def test_not_a_bundle(tmp_path):
    for content in (b"", b"hello", b"\x89PRISM\r\n" + b"\0" * 100, os.urandom(5000)):
        path = tmp_path / "x.prism"
        path.write_bytes(content)
        with pytest.raises(FormatError):
            open_bundle(path)
