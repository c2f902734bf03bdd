"""Payload blobs stored from a thread of their own: ids at once, bounded, errors kept."""

import errno
import os
import threading

import pytest

from prism_rr.errors import FormatError
from prism_rr.format import codec, layout, open_bundle, pack
from prism_rr.format.blobs import PACK_LIMIT, BlobWriter, blob_id, blob_path, pack_entries, spool_blobs


def _all_stored(spool_dir) -> dict:
    """id -> stored frame of every blob under spool_dir: files and pack entries."""
    return {ident: read() for ident, _, read in spool_blobs(spool_dir)}


def _stored(spool_dir, ident) -> bytes:
    return codec.decompress(_all_stored(spool_dir)[ident], layout.MAX_BLOB_RAW, "test")


def _has(spool_dir, ident) -> bool:
    return ident in _all_stored(spool_dir)


@pytest.mark.timeout(30)
def test_put_returns_the_id_and_close_writes_everything(tmp_path):
    w = BlobWriter(tmp_path)
    datas = [os.urandom(100_000) for _ in range(20)]
    ids = [w.put(d) for d in datas]
    assert ids == [blob_id(d) for d in datas]
    assert w.put(datas[0]) == ids[0]  # once per content
    w.close()
    assert w.error is None and w.pending == 0
    assert [_stored(tmp_path, i) for i in ids] == datas
    assert list(tmp_path.rglob("*.tmp")) == []


@pytest.mark.timeout(30)
def test_small_blobs_share_a_pack_file_and_reach_the_bundle(tmp_path):
    """A `digest` recording keeps a blob of every small call: they go to one pack file
    (appended, not a file each); a large one to a file of its own. pack takes both, each
    id once, and stops a torn pack file (a writer killed mid-write) before its torn entry."""
    from prism_rr.format.records import Marker
    from prism_rr.format.spool import SpoolWriter, spool_path

    w = BlobWriter(tmp_path)
    small = [os.urandom(100) for _ in range(50)]
    large = os.urandom(PACK_LIMIT + 1)
    ids = [w.put(d) for d in small] + [w.put(large)]
    w.close()
    packs = list((tmp_path / "blobs").glob("*.pack"))
    files = list((tmp_path / "blobs").glob("*/*.zst"))
    assert len(packs) == 1 and files == [blob_path(tmp_path, ids[-1])]
    assert [_stored(tmp_path, i) for i in ids] == small + [large]
    # another writer of the same directory (another rank) stores some of the same bytes
    other = BlobWriter(tmp_path)
    other.put(small[0])
    extra = other.put(os.urandom(10))
    other.close()
    # a third is killed in the middle of an entry
    torn = BlobWriter(tmp_path)
    kept = torn.put(os.urandom(10))
    lost = torn.put(os.urandom(200))
    torn.close()
    third = [p for p in (tmp_path / "blobs").glob("*.pack") if p not in packs and extra not in dict(pack_entries(p))]
    assert len(third) == 1
    third[0].write_bytes(third[0].read_bytes()[:-5])
    sw = SpoolWriter(spool_path(tmp_path, 0), 0)
    sw.append(Marker(start_ns=1, end_ns=1, step=0, name="m"))
    sw.close()
    result = pack(tmp_path, tmp_path / "b.prism")
    assert result.blobs == len(ids) + 2  # small[0] once; `lost` not at all
    with open_bundle(tmp_path / "b.prism") as b:
        assert [b.blob(i) for i in ids] == small + [large]
        assert len(b.blob(kept)) == 10
        with pytest.raises(FormatError):
            b.blob(lost)


@pytest.mark.timeout(30)
def test_past_the_bound_the_caller_stores_itself(tmp_path, monkeypatch):
    gate = threading.Event()
    real = BlobWriter._store
    stored_on = []

    def slow(self, ident, data):
        stored_on.append(threading.get_ident())
        if threading.get_ident() != me:
            gate.wait(10)
        real(self, ident, data)

    me = threading.get_ident()
    monkeypatch.setattr(BlobWriter, "_store", slow)
    w = BlobWriter(tmp_path, max_pending=250_000)
    a, b, c = (os.urandom(100_000) for _ in range(3))
    w.put(a)
    w.put(b)
    assert w.pending <= 250_000
    w.put(c)  # would pass the bound: stored by the caller, now
    assert _has(tmp_path, blob_id(c)) and me in stored_on
    gate.set()
    w.close()
    assert all(_has(tmp_path, blob_id(x)) for x in (a, b, c))


@pytest.mark.timeout(30)
def test_an_error_is_kept_and_raised_at_the_next_put(tmp_path, monkeypatch):
    def full(self, entries):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(BlobWriter, "_append_pack", full)  # small blobs: the pack file's write
    w = BlobWriter(tmp_path)
    w.put(os.urandom(1000))
    w.close()
    assert isinstance(w.error, OSError) and w.error.errno == errno.ENOSPC
    with pytest.raises(OSError):
        w.put(os.urandom(1000))


@pytest.mark.timeout(30)
def test_a_record_reaches_the_spool_only_after_its_blobs(tmp_path, monkeypatch):
    """The compactor holds a batch back until the blobs queued before it are stored, so
    no spool frame ever names a blob that is not on disk (the record itself is in the
    call log meanwhile)."""
    import time

    from prism_rr.format import codec
    from prism_rr.format.calllog import CallLog, log_path
    from prism_rr.format.compactor import Compactor
    from prism_rr.format.records import Marker
    from prism_rr.format.spool import read_spool, spool_path

    gate = threading.Event()
    real = BlobWriter._append_pack

    def slow(self, entries):
        gate.wait(10)
        real(self, entries)

    monkeypatch.setattr(BlobWriter, "_append_pack", slow)  # small blobs: the pack file's write
    log = CallLog(log_path(tmp_path, 0), 0, ring_size=1 << 16, persist_size=1 << 16)
    compactor = Compactor(log, spool_path(tmp_path, 0), 0, info={"world_size": 1})
    compactor.blobs = b = BlobWriter(tmp_path)
    ident = b.put(os.urandom(1000))
    log.record(codec.as_row(Marker(start_ns=1, end_ns=1, step=0, name="names_a_blob", value=0)))
    batch = threading.Thread(target=compactor.compact)
    batch.start()
    time.sleep(0.2)

    def events():
        return sum(f.kind == layout.FRAME_EVENTS for f in read_spool(spool_path(tmp_path, 0)).frames)

    assert events() == 0 and not _has(tmp_path, ident)
    gate.set()
    batch.join(10)
    assert events() == 1 and _has(tmp_path, ident)
    b.close()
    compactor.close()


@pytest.mark.timeout(30)
def test_a_pack_file_of_an_earlier_process_with_the_same_id_is_left_alone(tmp_path, monkeypatch):
    """Pack files are opened exclusively: a name taken (a container whose host name and
    process id repeat between runs) is passed over, never appended to or an error."""
    import prism_rr.format.blobs as blobs

    names = iter(["taken.pack", "taken.pack", "mine.pack"])
    monkeypatch.setattr(blobs, "pack_name", lambda n: next(names))
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / "taken.pack").write_bytes(b"an earlier run's")
    w = BlobWriter(tmp_path)
    ident = w.put(b"x" * 10)
    w.close()
    assert w.error is None
    assert (tmp_path / "blobs" / "taken.pack").read_bytes() == b"an earlier run's"
    assert dict(pack_entries(tmp_path / "blobs" / "mine.pack")).keys() == {ident}


@pytest.mark.timeout(30)
def test_a_write_that_fails_part_way_is_cut_off(tmp_path, monkeypatch):
    """A full disk part-way through an append leaves no torn entry: the blobs stored
    after it are read."""
    real_write = os.write
    calls = []

    def short(fd, data):
        calls.append(len(data))
        if len(calls) == 2:  # the second append: half of it, then the disk is full
            real_write(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    w = BlobWriter(tmp_path)
    monkeypatch.setattr(os, "write", short)
    a = os.urandom(50)
    w._store(blob_id(a), a)
    with pytest.raises(OSError):
        w._store(blob_id(b"lost"), b"lost")
    c = os.urandom(60)
    w._store(blob_id(c), c)
    monkeypatch.setattr(os, "write", real_write)
    w.close()
    assert set(_all_stored(tmp_path)) == {blob_id(a), blob_id(c)}


def test_record_clears_only_this_hosts_old_pack_files(tmp_path, monkeypatch):
    """`prism-rr record` clears an earlier run's packs of its own host from the directory,
    never another node's: not even one whose host name starts with this one's."""
    import socket

    from prism_rr.recorder.launch import _clear_old_spools

    monkeypatch.setattr(socket, "gethostname", lambda: "node")
    w = BlobWriter(tmp_path)
    w.put(b"x" * 10)
    w.close()
    others = ["node-b-12-0deadbeef.pack", "nodex-12-0deadbeef.pack", "other-7-1aaaaaaaa.pack"]
    for name in others:
        (tmp_path / "blobs" / name).write_bytes(b"")
    _clear_old_spools(tmp_path)
    assert sorted(p.name for p in (tmp_path / "blobs").glob("*.pack")) == sorted(others)


@pytest.mark.timeout(60)
def test_small_blobs_are_stored_in_batches_and_at_once_when_waited_for(tmp_path, monkeypatch):
    """The thread gathers what a `digest` recording queues call after call into one
    write, instead of a wake-up, the GIL and a system call per blob; a spool writer
    waiting for its records' blobs (wait_stored) ends the gathering at once, and what
    no one waits for is stored within BATCH_S."""
    import time

    writes = []
    real_write = os.write

    def counting_write(fd, data):
        writes.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", counting_write)
    monkeypatch.setattr(BlobWriter, "BATCH_S", 60.0)  # nothing but a waiter or a full batch ends it
    w = BlobWriter(tmp_path)
    small = [os.urandom(4) for _ in range(200)]
    for d in small:
        w.put(d)
    time.sleep(0.2)
    assert w.stored == 0 and writes == []  # gathering: nothing written yet
    t0 = time.monotonic()
    assert w.wait_stored(w.queued, timeout=30)
    assert time.monotonic() - t0 < 10  # not the 60 s of BATCH_S
    assert len(writes) == 1 and w.stored == 200  # one write for the 200
    # a full batch goes without a waiter
    more = [os.urandom(4) for _ in range(BlobWriter.BATCH_BLOBS)]
    for d in more:
        w.put(d)
    deadline = time.monotonic() + 20
    while w.stored < 200 + len(more) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert w.stored == 200 + len(more) and len(writes) == 2
    w.close()
    assert w.error is None
    assert [_stored(tmp_path, blob_id(d)) for d in small + more] == small + more

    # with the default BATCH_S, a lone blob no one waits for is stored soon after all
    monkeypatch.undo()
    w = BlobWriter(tmp_path / "alone")
    w.put(b"lone")
    deadline = time.monotonic() + 20
    while w.stored < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert w.stored == 1 and _stored(tmp_path / "alone", blob_id(b"lone")) == b"lone"
    w.close()


@pytest.mark.timeout(60)
def test_the_ids_kept_to_store_each_content_once_are_bounded(tmp_path, monkeypatch):
    """A long digest recording keeps a blob of every small call, most with new bytes: the
    writer's memory of what it stored stays bounded, and a content stored again after it
    forgot is still one blob of the bundle."""
    monkeypatch.setattr(BlobWriter, "KNOWN_MAX", 100)
    w = BlobWriter(tmp_path)
    datas = [i.to_bytes(4, "little") for i in range(1000)]
    ids = [w.put(d) for d in datas]
    assert len(w._known) <= 100
    assert w.put(datas[0]) == ids[0]  # forgotten: queued again, same id
    w.close()
    assert w.error is None
    stored = [ident for ident, _, _ in spool_blobs(tmp_path)]
    assert set(stored) == set(ids) and stored.count(ids[0]) == 2  # written twice
    assert [_stored(tmp_path, i) for i in ids] == datas
    # the bundle holds it once
    from prism_rr.format.records import Collective
    from prism_rr.format.spool import SpoolWriter, spool_path

    s = SpoolWriter(spool_path(tmp_path, 0), 0, info={"world_size": 1})
    s.append(Collective(start_ns=1, end_ns=2, step=0, op="all_reduce", group=0, seq=0, blob_in=(ids[0],)))
    s.close()
    out = tmp_path.parent / "bounded.prism"
    pack(tmp_path, out)
    with open_bundle(out) as b:
        assert b.blob(ids[0], expected=4) == datas[0]
        index = b.sections[layout.SEC_BLOB_INDEX]
        assert index.length == len(ids) * layout.BLOB_ENTRY.size  # every id, each once
