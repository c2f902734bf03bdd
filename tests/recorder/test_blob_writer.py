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
