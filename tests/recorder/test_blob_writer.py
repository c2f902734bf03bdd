"""Payload blobs stored from a thread of their own: ids at once, bounded, errors kept."""

import errno
import os
import threading

import pytest

from prism_rr.format import codec, layout
from prism_rr.format.blobs import BlobWriter, blob_id, blob_path


def _stored(spool_dir, ident) -> bytes:
    return codec.decompress(blob_path(spool_dir, ident).read_bytes(), layout.MAX_BLOB_RAW, "test")


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
def test_past_the_bound_the_caller_stores_itself(tmp_path, monkeypatch):
    import prism_rr.format.blobs as blobs

    gate = threading.Event()
    real = blobs._store
    stored_on = []

    def slow(spool_dir, ident, data):
        stored_on.append(threading.get_ident())
        if threading.get_ident() != me:
            gate.wait(10)
        real(spool_dir, ident, data)

    me = threading.get_ident()
    monkeypatch.setattr(blobs, "_store", slow)
    w = BlobWriter(tmp_path, max_pending=250_000)
    a, b, c = (os.urandom(100_000) for _ in range(3))
    w.put(a)
    w.put(b)
    assert w.pending <= 250_000
    w.put(c)  # would pass the bound: stored by the caller, now
    assert blob_path(tmp_path, blob_id(c)).exists() and me in stored_on
    gate.set()
    w.close()
    assert all(blob_path(tmp_path, blob_id(x)).exists() for x in (a, b, c))


@pytest.mark.timeout(30)
def test_an_error_is_kept_and_raised_at_the_next_put(tmp_path, monkeypatch):
    import prism_rr.format.blobs as blobs

    def full(spool_dir, ident, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(blobs, "_store", full)
    w = BlobWriter(tmp_path)
    w.put(os.urandom(1000))
    w.close()
    assert isinstance(w.error, OSError) and w.error.errno == errno.ENOSPC
    with pytest.raises(OSError):
        w.put(os.urandom(1000))


@pytest.mark.timeout(30)
def test_a_record_reaches_the_spool_only_after_its_blobs(tmp_path, monkeypatch):
    """The spool writer holds a chunk back until the blobs queued before it are stored,
    so a death in between never leaves a record that names a missing blob."""
    import time

    import prism_rr.format.blobs as blobs
    from prism_rr.format.records import Marker
    from prism_rr.format.spool import SpoolWriter, read_spool, spool_path

    gate = threading.Event()
    real = blobs._store

    def slow(spool_dir, ident, data):
        gate.wait(10)
        real(spool_dir, ident, data)

    monkeypatch.setattr(blobs, "_store", slow)
    w = SpoolWriter(spool_path(tmp_path, 0), 0, flush_interval_s=0.01)
    w.blobs = b = BlobWriter(tmp_path)
    data = os.urandom(1000)
    ident = b.put(data)
    w.append(Marker(start_ns=1, end_ns=1, step=0, name="names_a_blob", value=0))
    w.flush()
    time.sleep(0.2)  # many writer ticks

    def events():
        return sum(f.kind == layout.FRAME_EVENTS for f in read_spool(spool_path(tmp_path, 0)).frames)

    assert events() == 0 and not blob_path(tmp_path, ident).exists()
    gate.set()
    deadline = time.monotonic() + 5
    while events() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert events() == 1 and blob_path(tmp_path, ident).exists()
    b.close()
    w.close()
