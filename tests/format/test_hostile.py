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


def write_case(path, data: bytes) -> None:
    """`path` holds `data`, in a new file: ext4 flushes a file truncated and rewritten in
    place to disk as it is closed (auto_da_alloc), a few ms a case."""
    path.unlink(missing_ok=True)
    path.write_bytes(data)


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
        write_case(path, data[:n])
        with pytest.raises(FormatError):
            read_everything(path)


def _flipped(data: bytes, seed: int, count: int):
    """`count` copies of `data`, each with one bit flipped at a random place."""
    rng = random.Random(seed)
    for _ in range(count):
        buf = bytearray(data)
        at = rng.randrange(len(buf))
        buf[at] ^= 1 << rng.randrange(8)
        yield bytes(buf)


def test_bit_flips_anywhere(tmp_path):
    path = tmp_path / "flip.prism"
    for case in _flipped(GOLDEN.read_bytes(), 2026, 1000 * SCALE):
        write_case(path, case)
        assert_only_format_error(path)


def test_the_check_before_the_spools_go_refuses_a_flip_anywhere(tmp_path):
    """verify with decode=False, what `record` checks of the bundle it packed before it
    removes the spools: it counts what verify counts, and a copy with any bit flipped is
    refused, as verify refuses it, without a record decoded."""
    with open_bundle(GOLDEN) as b:
        assert verify(b, decode=False) == verify(b)
    path = tmp_path / "flip.prism"
    for case in _flipped(GOLDEN.read_bytes(), 38, 300 * SCALE):
        write_case(path, case)
        with pytest.raises(FormatError):
            with open_bundle(path) as b:
                verify(b, decode=False)


def _resealed(data: bytes, sid: int, mutate) -> bytes:
    """The bundle with one section's bytes mutated and every checksum made valid again,
    so the checks behind the checksums are reached."""
    buf = bytearray(data)
    t_at = len(buf) - layout.TRAILER.size
    _, table_at, count, major, minor, *_ = layout.TRAILER.unpack_from(buf, t_at)
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
    trailer = layout.TRAILER.pack(layout.TRAILER_MAGIC, table_at, count, major, minor, layout.crc32(table), 0)
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
        write_case(path, _resealed(data, sid, mutate))
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
        write_case(path, _resealed(data, layout.SEC_MANIFEST, lambda _b: case))
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
        write_case(path, _resealed(GOLDEN.read_bytes(), layout.SEC_GROUPS, lambda _b: codec.compress(msgpack.packb(case))))
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
        write_case(path, content)
        with pytest.raises(FormatError):
            open_bundle(path)


# --- budgets: what the bundle's own size can justify (issue 11, part 5) -----------------
#
# Each hand-made bundle below has every checksum valid. The command line runs in a
# subprocess limited to 512 MiB of address space: it must end with exit 4 and one line.

import resource
import subprocess
import sys

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz  # noqa: E402

PRISM = Path(sys.executable).with_name("prism-rr")
LIMIT = 512 << 20


def _with_section(sid, value, base=None) -> bytes:
    parts = fuzz.Parts(base or GOLDEN.read_bytes())
    parts.get(sid).body = fuzz.zc(value if isinstance(value, bytes) and not isinstance(value, fuzz.Raw) else fuzz.packb(value))
    return parts.build()


def _manifest(**extra):
    with open_bundle(GOLDEN) as b:
        m = dict(b.manifest)
    m.update(extra)
    return m


def _cli(*args, timeout=120):
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))

    return subprocess.run([str(PRISM), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=limit, stdin=subprocess.DEVNULL)


def _assert_refused(path, *commands):
    for cmd in commands:
        extra = ["-o", path.with_suffix(".out")] if cmd in ("export", "redact") else []
        extra += ["--json"] if cmd == "info" else []
        r = _cli(cmd, path, *extra)
        assert r.returncode == 4, (cmd, r.returncode, r.stderr[-2000:])
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("prism-rr: error: "), (cmd, r.stderr[-2000:])


def test_blob_declared_2gib_is_refused_before_allocating(tmp_path):
    parts = fuzz.Parts(GOLDEN.read_bytes())
    idx = bytearray(parts.get(layout.SEC_BLOB_INDEX).body)
    ident, *_ = layout.BLOB_ENTRY.unpack_from(idx, 0)
    stored = fuzz._patch_content_size(fuzz.zc(b"\0" * 4096), 2**31 - 1)
    blobs = parts.get(layout.SEC_BLOBS)
    layout.BLOB_ENTRY.pack_into(idx, 0, ident, len(blobs.body), len(stored), 2**31 - 1, layout.crc32(stored))
    blobs.body += stored
    parts.get(layout.SEC_BLOB_INDEX).body = bytes(idx)
    path = tmp_path / "blob.prism"
    path.write_bytes(parts.build())
    with open_bundle(path) as b, pytest.raises(FormatError, match="justify"):
        b.blob(ident)
    _assert_refused(path, "verify")


def test_groups_of_a_million_ranks_are_refused(tmp_path):
    groups = [{"id": i, "ranks": {0: 0, 1: 1 << 20, 2: 1}, "name": str(i), "desc": "x", "backend": "gloo"} for i in range(40)]
    path = tmp_path / "groups.prism"
    path.write_bytes(_with_section(layout.SEC_GROUPS, groups))
    with open_bundle(path) as b, pytest.raises(FormatError, match="justify"):
        b.groups
    _assert_refused(path, "info", "verify", "diagnose", "export")


def test_rank_runs_in_chunks_are_bounded_by_the_world():
    from prism_rr.format.records import GroupInfo

    recs = [GroupInfo(start_ns=1, end_ns=2, step=0, group=i, ranks=tuple(range(4)), name="", text="", backend="")
            for i in range(2)]
    payload, _ = codec.encode_chunk(recs)
    chunk = msgpack.unpackb(payload, strict_map_key=False)
    chunk[1][7][0][27] = [{0: 0, 1: 1 << 20, 2: 1}] * 2
    chunk[1][7][1].pop(27, None)
    with pytest.raises(FormatError, match="justify"):
        codec.decode_chunk(msgpack.packb(chunk), 2, "test", world=4)


def test_manifest_of_16m_empty_maps_is_refused(tmp_path):
    bomb = fuzz.Raw(b"\xdd" + struct.pack(">I", 1 << 24) + b"\x80" * (1 << 24))
    path = tmp_path / "maps.prism"
    path.write_bytes(_with_section(layout.SEC_MANIFEST, _manifest(run={"x": bomb})))
    assert path.stat().st_size < 100_000
    with pytest.raises(FormatError, match="justify"):
        open_bundle(path)
    _assert_refused(path, "info", "verify")


def test_maps_are_counted_within_a_frame_that_may_hold_them():
    raw = fuzz.packb({"run": fuzz.Raw(b"\xdd" + struct.pack(">I", 100_000) + b"\x80" * 100_000)})
    with pytest.raises(FormatError, match="justify"):
        codec.unpack_plain(raw, "test", stored=100)  # 100 stored bytes cannot justify 100,000 maps


def test_manifest_nested_1000_deep_is_refused(tmp_path):
    path = tmp_path / "deep.prism"
    path.write_bytes(_with_section(layout.SEC_MANIFEST, _manifest(run={"x": fuzz._deep(1000)})))
    with pytest.raises(FormatError, match="nested"):
        open_bundle(path)
    _assert_refused(path, "info", "verify", "diagnose")


def test_bytes_in_the_manifest_are_refused(tmp_path):
    for extra in ({"tool": b"prism-rr"}, {"run": {"host": b"\xff\xfe"}}, {"run": {"x": float("nan")}},
                  {"run": {(1, 2): 3}}):
        path = tmp_path / "bytes.prism"
        write_case(path, _with_section(layout.SEC_MANIFEST, _manifest(**extra)))
        with pytest.raises(FormatError):
            open_bundle(path)
    _assert_refused(path, "info")


def test_summary_fields_of_the_wrong_type_are_refused(tmp_path):
    with open_bundle(GOLDEN) as b:
        good = {"ranks": {r: dict(s) for r, s in b.summaries["ranks"].items()},
                "steps": {s: {r: list(v) for r, v in per.items()} for s, per in b.summaries["steps"].items()}}
    for key, bad in (("dropped", "3"), ("open", (1, 2)), ("open", {}), ("dropped", float("inf")),
                     ("dropped", float("nan")), ("open", -1), ("truncated", "yes"), ("events", -5)):
        s = {"ranks": {r: dict(v) for r, v in good["ranks"].items()}, "steps": good["steps"]}
        s["ranks"][0][key] = bad
        path = tmp_path / "sum.prism"
        write_case(path, _with_section(layout.SEC_SUMMARIES, s))
        with open_bundle(path) as b, pytest.raises(FormatError):
            b.summaries
    _assert_refused(path, "info", "diagnose", "tui")


def test_summaries_handed_out_are_typed():
    with open_bundle(GOLDEN) as b:
        for rank, rs in b.summaries["ranks"].items():
            assert type(rank) is int
            assert type(rs["dropped"]) is int and type(rs["open"]) is int and type(rs["truncated"]) is bool


def test_record_kinds_that_are_maps_are_refused():
    recs = list(synthetic_records(0, 2, 20))
    payload, _ = codec.encode_chunk(recs)
    chunk = msgpack.unpackb(payload, strict_map_key=False)
    chunk[0][3] = {}
    with pytest.raises(FormatError):
        codec.decode_chunk(fuzz.packb(chunk), len(recs), "test")


@pytest.mark.parametrize("apart", [False, True], ids=["thread", "apart"])
def test_tui_ends_a_bundle_malformed_in_a_worker_with_exit_4(tmp_path, monkeypatch, apart):
    """A chunk is read lazily, in a worker thread or the process reading spans apart (as
    for a big bundle), while browsing: the app ends, and the error is the one line the
    command prints."""
    import asyncio

    from prism_rr.tui.app import PrismApp
    from prism_rr.tui.model import TimelineModel

    monkeypatch.setattr(TimelineModel, "APART_FROM", 1 if apart else 1 << 30)

    parts = fuzz.Parts(GOLDEN.read_bytes())
    entries = parts.chunk_entries()
    frame = parts.get(layout.SEC_CHUNKS).body[entries[0][0] : entries[0][0] + entries[0][1]]
    f, summary, payload = fuzz.parse_frame(frame)
    chunk = fuzz.unpackb(fuzz.zd(payload))
    chunk[0] = [{}] * len(chunk[0])
    raw = fuzz.packb(chunk)
    parts.replace_frame(0, fuzz.build_frame(f, summary, fuzz.zc(raw), raw_len=len(raw)))
    path = tmp_path / "lazy.prism"
    path.write_bytes(parts.build())

    async def browse():
        app = PrismApp(path, start="timeline")
        read_apart = app.model.apart is not None
        async with app.run_test() as pilot:
            for _ in range(50):
                await pilot.pause(0.05)
                if app.bundle_error is not None:
                    break
        return app, read_apart

    app, read_apart = asyncio.run(browse())
    assert read_apart == apart
    assert isinstance(app.bundle_error, FormatError)
    assert app.return_code == 4


def test_tui_command_ends_a_lazily_malformed_bundle_with_exit_4_and_one_line():
    """`prism-rr tui` on a terminal: the bundle opens, the timeline (key 2) reads a chunk in
    a worker thread and finds it malformed; the app ends, one line, exit 4."""
    import os
    import pty
    import select
    import time

    path = fuzz.CORPUS / "hand-chunk-order-maps.bundle"
    pid, fd = pty.fork()
    if pid == 0:  # the child: a terminal of its own
        os.environ["TERM"] = "xterm-256color"
        os.execv(str(PRISM), [str(PRISM), "tui", str(path)])
    out = b""
    t0 = time.monotonic()
    first = sent = None
    status = None
    try:
        while time.monotonic() - t0 < 120:
            if first is not None and not sent and time.monotonic() - first > 2:
                os.write(fd, b"2")
                sent = True
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    piece = os.read(fd, 65536)
                except OSError:
                    break
                if not piece:
                    break
                out += piece
                first = first or time.monotonic()
    finally:
        done, status = os.waitpid(pid, os.WNOHANG)
        if not done:
            os.kill(pid, 9)
            _, status = os.waitpid(pid, 0)
    text = out.decode("utf-8", "replace")
    assert os.waitstatus_to_exitcode(status) == 4, text[-3000:]
    assert "Traceback" not in text
    assert text.count("prism-rr: error: ") == 1 and "record kind" in text


def test_objects_are_capped_whatever_the_frame_size():
    """A big frame (a 12 MB fuzzed chunk decoding to 64 MiB of small values took 506 MiB)
    still decodes to at most layout.MAX_OBJECTS objects."""
    n = layout.MAX_OBJECTS + 10
    raw = b"\xdd" + struct.pack(">I", 4) + (b"\xdd" + struct.pack(">I", n // 4) + b"\xc0" * (n // 4)) * 4
    assert layout.objects_limit(10**9) == layout.MAX_OBJECTS
    with pytest.raises(FormatError, match="justify"):
        codec.unpack(raw, "test", budget=layout.objects_limit(10**9))
