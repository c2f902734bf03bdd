"""Records survive spool -> pack -> open unchanged, and the reader finds them fast."""

import random

import pytest

from prism_rr.format import (
    Collective,
    Compute,
    GroupInfo,
    Marker,
    Memory,
    PointToPoint,
    SpoolWriter,
    Step,
    open_bundle,
    pack,
    spool_path,
    verify,
    write_blob,
)
from dataclasses import fields

from prism_rr.errors import FormatError
from prism_rr.format.codec import ROW_TYPES, row_maker
from prism_rr.format.synthetic import synthetic_records


def _mixed_records(spool_dir):
    blob = write_blob(spool_dir, b"x" * 100)
    t = 10_000
    out = [GroupInfo(start_ns=t, end_ns=t, step=0, group=0, ranks=(0, 1), name="0", text="default_pg", backend="gloo")]
    for i in range(300):
        t += 1000 + i
        out.append(Collective(
            start_ns=t, end_ns=None if i == 299 else t + 500, step=i // 100, op="all_reduce", group=0, seq=i,
            in_shapes=((4, i % 3 + 1),), in_dtypes=("float32",), in_bytes=16 * (i % 3 + 1),
            out_shapes=((4, i % 3 + 1),), out_dtypes=("float32",), out_bytes=16 * (i % 3 + 1),
            reduce_op="sum", async_op=bool(i % 2), issued_ns=t + 5 if i % 2 else None,
            digest_in=(i, 2**64 - 1), digest_out=(i + 1,), blob_out=(blob,) if i == 7 else None,
            mem_alloc=i * 10, mem_peak=5000, stack=("train.py:3 in main",),
        ))
        out.append(Compute(start_ns=t + 500, end_ns=t + 900, step=i // 100, name="aten::mm" if i % 5 == 0 else None,
                           shapes=((2, 3), (3, 4)) if i % 5 == 0 else None))
    out.append(PointToPoint(start_ns=t, end_ns=t + 7, step=2, op="isend", group=0, seq=0, peer=1, tag=3,
                            shapes=((8,),), dtypes=("int64",), nbytes=64, async_op=True, digest=(5,), blob=(blob,)))
    out.append(Step(start_ns=10_000, end_ns=t, step=2, mem_peak=5000))
    out.append(Memory(start_ns=t, end_ns=t, step=2, mem_alloc=1, mem_peak=2, name="cpu-tracker"))
    out.append(Marker(start_ns=t, end_ns=t, step=2, name="user", value=None, text="hello"))
    return out


def test_every_record_kind_round_trips(tmp_path):
    spools = tmp_path / "run.prism.d"
    records = _mixed_records(spools)
    w = SpoolWriter(spool_path(spools, 1), 1, chunk_records=37, info={"world_size": 2, "argv": ["a.py"]})
    for rec in records:
        w.append(rec)
    w.close()
    result = pack(spools, tmp_path / "run.prism")
    assert result.events == len(records) and result.blobs == 1
    with open_bundle(tmp_path / "run.prism") as b:
        assert list(b.events(1)) == records
        assert b.world_size == 2 and b.recorded_ranks == [1]
        assert b.rank_info(1)["argv"] == ("a.py",)
        assert b.blob(records[15].blob_out[0]) == b"x" * 100
        assert b.rank_summary(1)["open"] == 1  # the call that never completed
        assert b.groups == [{"id": 0, "ranks": (0, 1), "name": "0", "desc": "default_pg", "backend": "gloo"}]
        assert verify(b).events == len(records)
        assert list(b.events(0)) == []  # not recorded


def test_filters_by_step_and_time_window(small_bundle):
    with open_bundle(small_bundle) as b:
        everything = list(b.events(2))
        assert len(b.chunks(2)) > 1
        by_step = list(b.events(2, steps=(1, 1)))
        assert by_step == [r for r in everything if r.step == 1]
        rng = random.Random(1)
        for _ in range(20):
            a, c = sorted(rng.sample([r.start_ns for r in everything], 2))
            got = list(b.events(2, window=(a, c)))
            want = [r for r in everything if (r.end_ns or r.start_ns) >= a and r.start_ns <= c]
            assert got == want


def test_summaries_need_no_chunks(small_bundle):
    with open_bundle(small_bundle) as b:
        assert b.steps == [0, 1, 2]
        start, end = b.step_times(1)[3]
        steps = [r for r in b.events(3) if isinstance(r, Step) and r.step == 1]
        assert (steps[0].start_ns, steps[0].end_ns) == (start, end)
        assert b.event_count == sum(len(list(b.events(r))) for r in b.recorded_ranks)


def test_pack_copies_chunks_byte_for_byte(tmp_path):
    from prism_rr.format.spool import read_spool
    from prism_rr.format.synthetic import write_synthetic

    spools = write_synthetic(tmp_path / "s", 2, 300, chunk_records=50)
    pack(spools, tmp_path / "b.prism")
    bundle_bytes = (tmp_path / "b.prism").read_bytes()
    for rank in (0, 1):
        data = spool_path(spools, rank).read_bytes()
        for frame in read_spool(spool_path(spools, rank)).frames[1:]:
            assert data[frame.offset : frame.offset + frame.length] in bundle_bytes


def _as_row(rec):
    """The record as the recorder makes it on the program's thread: a row, where its kind
    is made so (codec.row_maker), else the record itself."""
    if rec.KIND not in ROW_TYPES:
        return rec
    names = tuple(f.name for f in fields(rec))
    return row_maker(type(rec), names)(*(getattr(rec, n) for n in names))


@pytest.mark.parametrize("every", [1, 3])
def test_rows_are_written_byte_for_byte_as_their_records(tmp_path, every):
    """A spool fed rows (every record that can be one, or every third: chunks that mix
    them) is the same file, byte for byte, as one fed the records."""
    records = _mixed_records(tmp_path / "blobs")
    rows = [_as_row(r) if i % every == 0 else r for i, r in enumerate(records)]
    assert sum(type(r) is tuple for r in rows) > len(records) // (every + 1)
    paths = []
    for name, feed in (("records", records), ("rows", rows)):
        path = tmp_path / name / "rank-00001.spool"
        w = SpoolWriter(path, 1, chunk_records=37, info={"world_size": 2})
        for r in feed:
            w.append(r)
        w.close()
        paths.append(path)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    pack(tmp_path / "rows", tmp_path / "rows.prism")
    with open_bundle(tmp_path / "rows.prism") as b:
        assert list(b.events(1)) == records


def test_row_makers_give_the_defaults_of_fields_not_named():
    row = row_maker(Compute, ("start_ns", "end_ns", "step"))(5, 9, 2)
    assert row == _as_row(Compute(start_ns=5, end_ns=9, step=2))
    with pytest.raises(ValueError):
        row_maker(Step, ("start_ns", "end_ns", "step"))


@pytest.mark.parametrize("cut", [1, 10, 63, 64, 100, -1])
def test_torn_tail_is_repaired_keeping_complete_frames(tmp_path, cut):
    from prism_rr.format import read_spool, repair_spool
    from prism_rr.format.synthetic import write_synthetic

    spools = write_synthetic(tmp_path / "s", 1, 300, chunk_records=50)
    path = spool_path(spools, 0)
    whole = read_spool(path)
    data = path.read_bytes()
    if cut == -1:  # all of the last frame but its first byte
        cut = whole.frames[-1].length - 1
    path.write_bytes(data[:-cut])
    scan = repair_spool(path)
    assert scan.torn and len(scan.frames) == len(whole.frames) - 1
    assert path.read_bytes() == data[: whole.frames[-1].offset]
    assert (path.parent / (path.name + ".torn")).read_bytes() == data[whole.frames[-1].offset : -cut]
    assert not read_spool(path).torn


def test_pack_keeps_what_a_killed_rank_wrote(tmp_path):
    from prism_rr.format.synthetic import write_synthetic

    spools = write_synthetic(tmp_path / "s", 2, 300, chunk_records=50)
    path = spool_path(spools, 1)
    path.write_bytes(path.read_bytes()[:-20])
    result = pack(spools, tmp_path / "b.prism")
    assert set(result.torn) == {1}
    with open_bundle(tmp_path / "b.prism") as b:
        assert b.rank_summary(1)["truncated"] and not b.rank_summary(0)["truncated"]
        assert 0 < len(list(b.events(1))) < len(list(b.events(0)))
        verify(b)


def test_a_blob_of_zeros_reads_back_for_its_expected_size(tmp_path):
    """4 MiB of zeros compresses ~28,000 times, past any fixed ratio a hostile-input budget
    allows: verify (which streams) and a reader that knows the size it expects take it."""
    spools = tmp_path / "run.prism.d"
    zeros = bytes(4 << 20)
    blob = write_blob(spools, zeros)
    rec = Collective(start_ns=1, end_ns=2, step=0, op="all_reduce", group=0, seq=0, in_shapes=((1 << 20,),),
                     in_dtypes=("float32",), in_bytes=len(zeros), out_shapes=((1 << 20,),),
                     out_dtypes=("float32",), out_bytes=len(zeros), blob_out=(blob,))
    w = SpoolWriter(spool_path(spools, 0), 0, info={"world_size": 1, "argv": ["a.py"]})
    w.append(rec)
    w.close()
    pack(spools, tmp_path / "run.prism")
    with open_bundle(tmp_path / "run.prism") as b:
        assert verify(b).blobs == 1
        assert b.blob(blob, expected=len(zeros)) == zeros
        with pytest.raises(FormatError, match="justify"):
            b.blob(blob)  # a size the caller cannot vouch for stays bounded by the ratio
