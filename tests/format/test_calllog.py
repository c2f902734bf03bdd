"""The call log (format/calllog.py): what a rank writes as it goes, and what a reader makes
of it after any death. Both writers (the C speedups and their pure-Python twin) run every
test and must write the same bytes."""

import ctypes
import os
import random
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prism_rr.errors import FormatError
from prism_rr.format import codec, open_bundle, pack, verify
from prism_rr.format.calllog import (
    D_FAILED, D_OUT_LATER, D_SOURCED, E_ASYNC, E_COPY, E_P2P, E_RECV, E_SAME_OUT, DONE, ENTER, HEADER_AREA, P_BYTES,
    P_DIGEST_BYTES, P_DIGESTS, SEQ_KEY, CallLog, accelerated, decode_log, log_path, payload_tail, read_log,
    ring_entries,
)
from prism_rr.format.compactor import POLL_S, Compactor, recover_logs
from prism_rr.format.records import Collective, Compute, GroupInfo, Marker, PointToPoint, Step
from prism_rr.format.spool import spool_path

WRITERS = [pytest.param(False, id="python")]
if accelerated():
    WRITERS.append(pytest.param(True, id="c"))

F32 = (((4,),), ("float32",), 16)  # describe() of one float32 tensor of 4


def _records(contents):
    _, records = decode_log(contents)
    return [codec.row_record(r) if type(r) is tuple else r for r in records]


def _dictionary(log):
    """The ids a recorder would have defined: op and reduce names, a desc, a stack."""
    log.define(1, "all_reduce")
    log.define(2, F32)
    log.define(3, ("train.py:12 in step", "train.py:40 in main"))
    log.define(4, "SUM")
    log.define(5, "recv")
    return {"op": 1, "desc": 2, "stack": 3, "sum": 4, "recv": 5}


def _one_of_each(log, ids, data=b"\x01\x02\x03\x04" * 4):
    """Every kind of entry a recording writes, in the order a program would make them."""
    log.info({"world_size": 2, "argv": ["train.py"]})
    log.persist_record(codec.as_row(GroupInfo(start_ns=5, end_ns=5, step=0, group=0, ranks=(0, 1), backend="gloo")))
    # a blocking all_reduce with small payloads: in before, out after
    buf = ctypes.create_string_buffer(data, len(data))
    cid = log.enter(E_SAME_OUT, 100, 90, 0, 0, 0, -1, 0, ids["desc"], 0, ids["stack"], ids["op"], ids["sum"], -1, -1,
                    (ctypes.addressof(buf), len(data), P_BYTES | P_DIGEST_BYTES))
    log.done(cid, 200, 150, 0, -1, -1, payload_tail(1, P_BYTES | P_DIGEST_BYTES, datas=[data[::-1]]))
    # an async one completed on a backend thread, its outputs written later
    cid = log.enter(E_SAME_OUT | E_ASYNC, 300, 200, 0, 0, 1, -1, 0, ids["desc"], 0, 0, ids["op"], ids["sum"], 7, 9,
                    payload_tail(1, P_DIGESTS, digests=[12345]))
    log.done(cid, 400, 310, D_OUT_LATER, -1, -1)
    log.out(cid, payload_tail(1, P_DIGESTS, digests=[54321]))
    # a receive from any source: its sender and sequence come at completion
    cid = log.enter(E_P2P | E_RECV, 500, 400, 0, 0, -1, -1, 3, ids["desc"], 0, 0, ids["recv"], 0, -1, -1)
    log.done(cid, 600, 510, D_SOURCED, 1, 4)
    # a call that failed
    cid = log.enter(E_SAME_OUT, 700, 600, 1, 0, 2, -1, 0, ids["desc"], 0, 0, ids["op"], ids["sum"], -1, -1)
    log.done(cid, 800, 710, D_FAILED, -1, -1)
    log.record(codec.as_row(Marker(start_ns=800, end_ns=800, step=1, name="call_failed", value=2, text="boom")))
    log.record(codec.as_row(Step(start_ns=0, end_ns=900, step=1, mem_peak=64)))
    # and the call the rank dies in
    log.enter(E_SAME_OUT, 1000, 900, 2, 0, 3, -1, 0, ids["desc"], 0, ids["stack"], ids["op"], ids["sum"], -1, -1)


@pytest.mark.parametrize("fast", WRITERS)
def test_every_entry_becomes_the_record_it_describes(tmp_path, fast):
    log = CallLog(log_path(tmp_path, 0), 0, ring_size=1 << 16, persist_size=1 << 16, accelerate=fast)
    assert log.accelerated == fast
    _one_of_each(log, _dictionary(log))
    got = _records(read_log(log.path))  # the file, as a dead rank leaves it
    from prism_rr.format.calllog import _blob_id, _small_digest

    data = b"\x01\x02\x03\x04" * 4
    stack = ("train.py:12 in step", "train.py:40 in main")
    assert got == [
        GroupInfo(start_ns=5, end_ns=5, step=0, group=0, ranks=(0, 1), backend="gloo"),
        Compute(start_ns=90, end_ns=100, step=0),
        Collective(start_ns=100, end_ns=200, step=0, op="all_reduce", group=0, seq=0, in_shapes=((4,),),
                   in_dtypes=("float32",), in_bytes=16, out_shapes=((4,),), out_dtypes=("float32",), out_bytes=16,
                   reduce_op="SUM", issued_ns=150, digest_in=(_small_digest(data),),
                   digest_out=(_small_digest(data[::-1]),), blob_in=(_blob_id(data),),
                   blob_out=(_blob_id(data[::-1]),), stack=stack),
        Compute(start_ns=200, end_ns=300, step=0, mem_alloc=7, mem_peak=9),
        Collective(start_ns=300, end_ns=400, step=0, op="all_reduce", group=0, seq=1, in_shapes=((4,),),
                   in_dtypes=("float32",), in_bytes=16, out_shapes=((4,),), out_dtypes=("float32",), out_bytes=16,
                   reduce_op="SUM", async_op=True, issued_ns=310, digest_in=(12345,), digest_out=(54321,),
                   mem_alloc=7, mem_peak=9),
        Compute(start_ns=400, end_ns=500, step=0),
        PointToPoint(start_ns=500, end_ns=600, step=0, op="recv", group=0, seq=4, peer=1, tag=3, shapes=((4,),),
                     dtypes=("float32",), nbytes=16, issued_ns=510),
        Compute(start_ns=600, end_ns=700, step=1),
        Collective(start_ns=700, end_ns=800, step=1, op="all_reduce", group=0, seq=2, in_shapes=((4,),),
                   in_dtypes=("float32",), in_bytes=16, out_shapes=((4,),), out_dtypes=("float32",), out_bytes=16,
                   reduce_op="SUM", issued_ns=710),
        Marker(start_ns=800, end_ns=800, step=1, name="call_failed", value=2, text="boom"),
        Step(start_ns=0, end_ns=900, step=1, mem_peak=64),
        Compute(start_ns=900, end_ns=1000, step=2),
        Collective(start_ns=1000, end_ns=None, step=2, op="all_reduce", group=0, seq=3, in_shapes=((4,),),
                   in_dtypes=("float32",), in_bytes=16, out_shapes=((4,),), out_dtypes=("float32",), out_bytes=16,
                   reduce_op="SUM", stack=stack),
    ]
    assert decode_log(read_log(log.path))[0].info == {"world_size": 2, "argv": ("train.py",)}


def _churn(log, ids, n, seed=0, first=0):
    """`n` calls of many sizes (payloads of 0 to 300 bytes), numbered from `first`, every
    7th left open."""
    rng = random.Random(seed)
    for i in range(first, first + n):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(300)))
        buf = ctypes.create_string_buffer(data, len(data) or 1)  # alive until the entry is written
        payload = (payload_tail(1, P_BYTES | P_DIGEST_BYTES, datas=[data]) if i % 3
                   else (ctypes.addressof(buf), len(data), P_BYTES | P_DIGEST_BYTES) if i % 2 else None)
        cid = log.enter(E_SAME_OUT, 10 * i + 1, 10 * i, i // 50, 0, i, -1, 0, ids["desc"], 0, ids["stack"],
                        ids["op"], ids["sum"], -1, -1, payload)
        if i % 7:
            log.done(cid, 10 * i + 5, 10 * i + 2, 0, -1, -1, payload_tail(1, P_DIGESTS, digests=[i]) if i % 2 else None)


@pytest.mark.skipif(not accelerated(), reason="the C speedups were not built here")
def test_the_c_and_python_writers_write_the_same_bytes(tmp_path):
    """Round and round a small ring, padding at its end, payloads from bytes and from
    memory: the two writers leave byte-identical files."""
    files = []
    for fast in (False, True):
        log = CallLog(log_path(tmp_path / str(fast), 0), 0, ring_size=1 << 16, persist_size=1 << 16, flight=True,
                      accelerate=fast)
        ids = _dictionary(log)
        _one_of_each(log, ids)
        _churn(log, ids, 3000)
        assert log.cur.head > 3 * log.ring_size  # it went round
        files.append(log.path.read_bytes())
    a, b = files
    assert len(a) == len(b)
    assert a == b, f"first difference at byte {next(i for i in range(len(a)) if a[i] != b[i])}"


@pytest.mark.parametrize("fast", WRITERS)
def test_flight_ring_keeps_the_newest_calls_and_those_still_open(tmp_path, fast):
    """In flight mode the oldest entries make room; a call still open is written again
    ahead (E_COPY) and stays a call whose DONE finds it. One open for more than two laps
    of other entries is let go (a hang trigger dumps long before)."""
    log = CallLog(log_path(tmp_path, 0), 0, ring_size=1 << 16, persist_size=1 << 16, flight=True, accelerate=fast)
    ids = _dictionary(log)
    early = log.enter(E_SAME_OUT | E_ASYNC, 1, 0, 0, 1, 0, -1, 0, ids["desc"], 0, 0, ids["op"], 0, -1, -1)
    _churn(log, ids, 250, seed=1)  # about a lap and a half
    assert log.cur.tail > 0
    copies = [e for e in ring_entries(*_ring(log)) if e[2] == 1 and e[3] & E_COPY]
    assert copies  # the early call's ENTER, carried
    got = _records(read_log(log.path))
    calls = [r for r in got if type(r) is Collective]
    kept = sorted(c.seq for c in calls if c.group == 0)
    assert 1 not in kept and kept[-1] == 249  # the oldest went (but those open), the newest are there
    assert [(c.seq, c.end_ns) for c in calls if c.group == 1] == [(0, None)]  # still open, once
    log.done(early, 99_999, 5)
    got = _records(read_log(log.path))
    assert [(c.seq, c.end_ns) for c in got if type(c) is Collective and c.group == 1] == [(0, 99_999)]
    again = log.enter(E_SAME_OUT | E_ASYNC, 2, 0, 0, 2, 0, -1, 0, ids["desc"], 0, 0, ids["op"], 0, -1, -1)
    _churn(log, ids, 1000, seed=2)  # many laps
    assert again not in log.open
    assert not [c for c in _records(read_log(log.path)) if type(c) is Collective and c.group == 2]


@pytest.mark.skipif(not accelerated(), reason="the C speedups were not built here")
def test_a_full_flight_ring_drops_a_sixteenth_at_once_and_keeps_the_fast_path(tmp_path):
    """A flight ring gone round drops a sixteenth of itself when it needs room: the entries
    after that take the C writer's fast path until that room is used (dropping only what
    each entry needed sent every entry of a full ring through the Python slow path, and
    an always-on recording is mostly a full ring). It keeps at least 15/16 of the ring,
    and every call in it reads back whole."""
    from prism_rr.format.calllog import DROP_SHIFT

    ring = 1 << 16
    log = CallLog(log_path(tmp_path, 0), 0, ring_size=ring, persist_size=1 << 16, flight=True)
    ids = _dictionary(log)
    slow = []
    enter = log.cur.slow_enter

    def counted(*args):
        slow.append(args)
        return enter(*args)

    log.cur.slow_enter = counted
    laps, n = 4, 0
    while log.head < laps * ring:
        cid = log.enter(E_SAME_OUT, 10 * n + 1, 10 * n, 0, 0, n, -1, 0, ids["desc"], 0, 0, ids["op"], ids["sum"], -1,
                        -1)
        log.done(cid, 10 * n + 5, 10 * n + 2)
        n += 1
        assert log.head - log.tail <= ring
    # about 2**DROP_SHIFT drops a lap and a padding at each lap's end, where it was every entry
    assert len(slow) <= (laps - 1) * ((1 << DROP_SHIFT) + 2), (len(slow), n)
    assert log.head - log.tail >= ring - (ring >> DROP_SHIFT) - 2 * DONE.size - ENTER.size
    calls = [r for r in _records(read_log(log.path)) if type(r) is Collective]
    seqs = [c.seq for c in calls]
    assert seqs == list(range(seqs[0], n)) and all(c.end_ns == 10 * c.seq + 5 for c in calls)


def _ring(log):
    contents = read_log(log.path)
    return contents.ring, contents.tail, contents.tail_seq


@pytest.mark.parametrize("fast", WRITERS)
@pytest.mark.parametrize("where", ["head", "body", "seq"])
def test_an_entry_torn_by_a_death_is_not_read(tmp_path, fast, where):
    """A death in the middle of an entry's stores: the entry's seq (stored last) does not
    follow, and reading stops before it, keeping everything that came first."""
    log = CallLog(log_path(tmp_path, 0), 0, ring_size=1 << 16, persist_size=1 << 16, accelerate=fast)
    ids = _dictionary(log)
    _churn(log, ids, 50)
    whole = _records(read_log(log.path))
    pos = log.cur.head
    log.enter(E_SAME_OUT, 10_000, 0, 9, 0, 999, -1, 0, ids["desc"], 0, 0, ids["op"], 0, -1, -1,
              payload_tail(1, P_BYTES, datas=[bytes(100)]))
    contents = read_log(log.path)
    assert len(_records(contents)) == len(whole) + 1
    at = HEADER_AREA + log.persist_size + pos
    length = struct.unpack_from("<I", contents.ring, pos)[0]
    data = bytearray(log.path.read_bytes())
    if where == "seq":  # the seq never stored: what the ring held there before
        data[at + length - 8 : at + length] = b"\0" * 8
    elif where == "body":  # stores cut short in the payload, before the seq
        data[at + 100 : at + length] = b"\0" * (length - 100)
    else:  # only the head was stored
        data[at + 8 : at + length] = b"\0" * (length - 8)
    log.path.write_bytes(bytes(data))
    assert _records(read_log(log.path)) == whole


@pytest.mark.parametrize("fast", WRITERS)
def test_a_full_ring_drops_calls_and_the_spool_says_how_many(tmp_path, fast):
    """A spool recording whose compactor is behind: entries that find no room are
    dropped and counted, never written over, and the spool says how many."""
    log = CallLog(log_path(tmp_path, 0), 0, ring_size=1 << 16, persist_size=1 << 16, accelerate=fast)
    ids = _dictionary(log)
    _churn(log, ids, 2000)
    assert log.dropped > 0
    compactor = Compactor(log, spool_path(tmp_path, 0), 0, info={"world_size": 1})
    compactor.close()
    pack(tmp_path, tmp_path / "b.prism")
    with open_bundle(tmp_path / "b.prism") as b:
        events = list(b.events(0))
        markers = [e for e in events if type(e) is Marker and e.name == "records_dropped"]
        assert sum(m.value for m in markers) == log.dropped
        seqs = [e.seq for e in events if type(e) is Collective]
        assert seqs and len(set(seqs)) == len(seqs) and max(seqs) < 2000  # none written over
        verify(b)


@pytest.mark.parametrize("fast", WRITERS)
def test_compacted_in_batches_then_killed_loses_nothing(tmp_path, fast):
    """The compactor writes batches and frees the ring, never past a call still open
    (one open for long goes to the spool as an open-calls snapshot instead); the rank
    dies with calls open and records not yet compacted: pack reads the log where it
    lies, and every call is in the bundle once (the open ones open)."""
    spools = tmp_path / "run.prism.d"
    log = CallLog(log_path(spools, 0), 0, ring_size=1 << 16, persist_size=1 << 16, accelerate=fast)
    compactor = Compactor(log, spool_path(spools, 0), 0, info={"world_size": 1})
    # its thread stops now: the batches are the test's, and none may run while the rank
    # "dies" (a batch of its in flight beside pack wrote the last calls twice: seen in CI)
    compactor._stopped = True
    compactor.wake()
    compactor._thread.join(5)
    ids = _dictionary(log)
    from prism_rr.format.blobs import BlobWriter

    compactor.blobs = BlobWriter(spools)
    for batch in range(40):  # 40 rounds of 60 calls: far more than the ring holds
        _churn(log, ids, 60, seed=batch, first=60 * batch)
        compactor.compact()
    assert log.cur.tail > log.ring_size and log.dropped == 0
    _churn(log, ids, 50, seed=99, first=2400)  # never compacted: the rank dies now; nothing closes the log
    compactor.blobs.close()
    out = tmp_path / "run.prism"
    pack(spools, out)
    assert log.path.exists()  # pack writes nothing where it reads
    with open_bundle(out) as b:
        verify(b)
        calls = [e for e in b.events(0) if type(e) is Collective]
    seen = sorted((c.seq, c.end_ns is None) for c in calls)
    assert [s for s, _ in seen] == list(range(2450))  # each call once
    assert [s for s, is_open in seen if is_open] == list(range(0, 2450, 7))  # every 7th open
    # the same, written into the spool for good (record's and repair's way)
    assert recover_logs(spools) and not log.path.exists()
    pack(spools, tmp_path / "again.prism")
    with open_bundle(tmp_path / "again.prism") as b:
        assert sorted((c.seq, c.end_ns is None) for c in b.events(0) if type(c) is Collective) == seen


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, (1 << 16) + 4096 + 65535), st.binary(min_size=1, max_size=24)),
                min_size=1, max_size=12))
def test_damage_anywhere_is_a_format_error_or_a_shorter_log(tmp_path_factory, damage):
    """Bytes changed anywhere in a log (header, dictionary, ring): reading it ends in a
    FormatError or in fewer records, never in another exception."""
    d = tmp_path_factory.mktemp("hostile")
    path = d / "rank-00000.log"
    if not path.exists():
        log = CallLog(path, 0, ring_size=1 << 16, persist_size=1 << 12, accelerate=False)
        _one_of_each(log, _dictionary(log))
        _churn(log, _dictionary(log), 100)
        log.close()
    data = bytearray(path.read_bytes())
    for at, junk in damage:
        at %= len(data)
        data[at : at + len(junk)] = junk
    path.write_bytes(bytes(data[: len(data)]))
    try:
        decode_log(read_log(path))
    except FormatError:
        pass


def test_a_log_that_is_none_is_refused_by_name(tmp_path):
    path = tmp_path / "rank-00000.log"
    path.write_bytes(os.urandom(5000))
    with pytest.raises(FormatError, match="not a prism-rr call log"):
        read_log(path)
    path.write_bytes(b"short")
    with pytest.raises(FormatError, match="too short"):
        read_log(path)


def test_the_seq_is_stored_keyed():
    """A stale word of zeros or small numbers never passes for a seq."""
    assert SEQ_KEY >> 48 and all((n ^ SEQ_KEY) >> 40 for n in range(1, 1 << 20, 4099))


@pytest.mark.parametrize("fast", WRITERS)
def test_several_tensors_bytes_from_memory_are_their_payload_tail(tmp_path, fast):
    """A call's payload given as [what, address, nbytes, ...] (several plain tensors, read
    from memory by the writer) is written as the same bytes as payload_tail of their
    datas, in an ENTER and in a DONE, empty tensors included."""
    datas = [b"", b"\x01" * 5, bytes(range(200)), b"xyz"]
    bufs = [ctypes.create_string_buffer(d, len(d) or 1) for d in datas]
    what = P_BYTES | P_DIGEST_BYTES
    spec = [what] + [v for b, d in zip(bufs, datas) for v in (ctypes.addressof(b), len(d))]
    files = []
    for form in ("memory", "bytes"):
        log = CallLog(log_path(tmp_path / form, 0), 0, ring_size=1 << 16, persist_size=1 << 16, accelerate=fast)
        ids = _dictionary(log)
        for i in range(3):
            payload = list(spec) if form == "memory" else payload_tail(len(datas), what, datas=datas)
            cid = log.enter(0, 10 * i + 1, 10 * i, 0, 0, i, -1, 0, ids["desc"], ids["desc"], 0, ids["op"], 0, -1, -1,
                            payload)
            log.done(cid, 10 * i + 5, 10 * i + 2, 0, -1, -1, payload)
        files.append(log.path.read_bytes())
    assert files[0] == files[1]


class _Index:
    """An int-like whose value changes each time it is read (a hostile caller's)."""

    def __init__(self):
        self.reads = 0

    def __index__(self):
        self.reads += 1
        return 1 if self.reads == 1 else 4096


@pytest.mark.parametrize("fast", WRITERS)
@pytest.mark.parametrize("bad", [[], [4, 1], [4, 0, 5], [4, 16, -1], [4, 16, 1 << 33], ["x", 16, 1], [4, 16, _Index()]],
                         ids=["empty", "odd", "null", "negative", "huge", "what", "index"])
def test_a_bad_address_list_is_refused_and_nothing_written(tmp_path, bad, fast):
    log = CallLog(log_path(tmp_path, 0), 0, ring_size=1 << 16, persist_size=1 << 16, accelerate=fast)
    ids = _dictionary(log)
    head = log.cur.head
    with pytest.raises((ValueError, TypeError, OverflowError)):
        log.enter(0, 1, 0, 0, 0, 0, -1, 0, ids["desc"], 0, 0, ids["op"], 0, -1, -1, bad)
    assert log.cur.head == head


def _faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


@pytest.mark.parametrize("fast", WRITERS)
def test_the_pages_the_program_writes_are_faulted_in_ahead(tmp_path, fast):
    """The program's thread stores into ring pages already faulted in writable: at the
    log's creation, then by the compactor's thread as the head moves on (every store into
    a fresh page of the mapped file was a page fault on the program's path). Without it,
    the same writes fault once per page."""
    import prism_rr.format.calllog as calllog

    log = CallLog(log_path(tmp_path, 0), 0, accelerate=fast)
    if not log.prefault():
        log.close(remove=True)
        pytest.skip("the kernel has no MADV_POPULATE_WRITE (Linux 5.14)")
    ids = _dictionary(log)
    compactor = Compactor(log, spool_path(tmp_path, 0), 0, info={"world_size": 1})
    faults, pages, seq = 0, 0, 0
    try:
        for _ in range(3 * calllog.PREFAULT_AHEAD // (1 << 20)):  # three times the window, a MiB at a time
            head, before = log.head, _faults()
            while log.head - head < 1 << 20:
                cid = log.enter(E_SAME_OUT, 100 + seq, 90, 0, 0, seq, -1, 0, ids["desc"], 0, 0, ids["op"], ids["sum"],
                                -1, -1)
                log.done(cid, 200 + seq, 150 + seq)
                seq += 1
            faults += _faults() - before
            pages += (log.head - head) >> 12
            # the compactor's turn (it looks every POLL_S): waited for, not slept on, so a
            # loaded machine that runs its thread late cannot fail the test
            ahead = min(log.head + calllog.PREFAULT_AHEAD, log.ring_size)
            deadline = time.monotonic() + 20
            while log._faulted < ahead and time.monotonic() < deadline:
                time.sleep(POLL_S / 4)
    finally:
        compactor.close()
    assert pages > 2000 and faults < pages // 50, (faults, pages)

    # the same writes into a log that is not faulted in ahead: a fault a page
    saved = calllog._madvise
    calllog._madvise = None
    try:
        cold = CallLog(log_path(tmp_path, 1), 1, accelerate=fast)
    finally:
        calllog._madvise = saved
    ids = _dictionary(cold)
    before = _faults()
    while cold.head < 1 << 20:
        cid = cold.enter(E_SAME_OUT, 100, 90, 0, 0, 0, -1, 0, ids["desc"], 0, 0, ids["op"], ids["sum"], -1, -1)
        cold.done(cid, 200, 150)
    assert _faults() - before >= (cold.head >> 12) // 2
    cold.close(remove=True)


def test_the_pages_are_faulted_in_ahead_on_the_first_lap_only(tmp_path, monkeypatch):
    """Once the ring has gone round, every page of it is in memory: faulting pages in again
    would only dirty them for the kernel to write back again (a whole ring each poll of
    flight's watchdog). And a log closed is never touched."""
    import prism_rr.format.calllog as calllog

    if calllog._madvise is None:
        pytest.skip("no madvise here")
    calls = []

    def counted(addr, n, advice, _real=calllog._madvise):
        calls.append(n)
        return _real(addr, n, advice)

    monkeypatch.setattr(calllog, "_madvise", counted)
    ring = 1 << 20
    log = CallLog(log_path(tmp_path, 0), 0, ring_size=ring, persist_size=1 << 16, flight=True)
    if not log.prefault():
        log.close(remove=True)
        pytest.skip("the kernel has no MADV_POPULATE_WRITE (Linux 5.14)")
    assert sum(calls) >= ring  # the whole (small) ring at its creation
    made = len(calls)
    ids = _dictionary(log)
    n = 0
    while log.head < 3 * ring:
        cid = log.enter(E_SAME_OUT, n, n, 0, 0, n, -1, 0, ids["desc"], 0, 0, ids["op"], ids["sum"], -1, -1)
        log.done(cid, n + 2, n + 1)
        n += 1
        if n % 2000 == 0:
            assert log.prefault(8 << 20)
    assert len(calls) == made
    log.close(remove=True)
    assert not log.prefault() and len(calls) == made


@pytest.mark.skipif(not accelerated(), reason="the C speedups were not built here")
def test_the_c_cursor_keeps_its_newest_open_call_out_of_the_table_until_asked(tmp_path):
    """A flight ring's table of open calls (what room-making carries ahead): the C cursor
    keeps the newest call entered beside it, so a blocking call's ENTER and DONE touch no
    dict; a second call entered, or Python about to read the table, puts it in."""
    log = CallLog(log_path(tmp_path, 0), 0, ring_size=1 << 16, persist_size=1 << 16, flight=True)
    ids = _dictionary(log)

    def enter(seq):
        return log.enter(E_SAME_OUT, seq, seq, 0, 0, seq, -1, 0, ids["desc"], 0, 0, ids["op"], ids["sum"], -1, -1)

    a = enter(0)
    at = log.head - ENTER.size
    assert log.open == {}
    log._flush_open()
    assert log.open == {a: at}
    log.done(a, 5, 4)
    assert log.open == {}
    a = enter(1)
    b = enter(2)  # a goes into the table, b stays beside it
    assert set(log.open) == {a}
    log.done(b, 7, 6)
    assert set(log.open) == {a}
    c = enter(3)
    log.done(a, 9, 8)
    log._flush_open()
    assert set(log.open) == {c}
    log.done(c, 11, 10)
    log._flush_open()
    assert log.open == {}
    calls = sorted((r.seq, r.end_ns) for r in _records(read_log(log.path)) if type(r) is Collective)
    assert calls == [(0, 5), (1, 9), (2, 7), (3, 11)]
    log.close(remove=True)
