"""The recorder's call path on both twins, as CPython tests heapq and _heapq (PEP 399): one
class of tests, run on PyCallRecorder over the pure-Python call log, and on CallRecorder
over the C speedups where they were built. Each makes calls in this process through a
stand-in backend and reads the call log back as a dead rank's log is read.

The C twin takes the call log's layout and the Call it makes from their one definition
(format/calllog.py, intercept/group.py's Call): the tests at the end check that it refuses,
by name, what it could not write."""

import dataclasses
import struct
from types import SimpleNamespace

import pytest
import torch

from prism_rr.format import calllog, codec
from prism_rr.format.calllog import CallLog, decode_log, log_path, read_log
from prism_rr.format.records import Collective, Compute, Marker, PointToPoint
from prism_rr.intercept import payload as _payload
from prism_rr.intercept.group import Call
from prism_rr.recorder import _calls

BUILT = _calls.CallRecorder is not _calls.PyCallRecorder
needs_c = pytest.mark.skipif(not BUILT, reason="the C speedups were not built here")
TIMES = ("start_ns", "end_ns", "issued_ns")


class Rec:
    """The Recording as the call path sees it: on until it fails, and what it was given."""

    def __init__(self):
        self.on = True
        self.failed = []
        self.written = []

    def fail(self, exc):
        self.failed.append(exc)
        self.on = False

    def write(self, record):
        self.written.append(record)


class Work:
    def wait(self):
        return True


def _ran(*args):
    return Work()


def _boom(*args):
    raise RuntimeError("gloo: connection closed by peer")


def _records(log) -> list:
    _, records = decode_log(read_log(log.path))
    return [codec.row_record(r) if type(r) is tuple else r for r in records]


def _field_code(name: str) -> str:
    """The struct code of an ENTER field, by enter's argument name (format/calllog.py)."""
    codes = [c for i, c in enumerate(calllog.ENTER_BODY.format[5:])
             if struct.calcsize(calllog.ENTER_BODY.format[: 5 + i]) != calllog.CID_AT]
    return dict(zip(_calls._enter_args()[1:], codes))[name]


def _calls_of(records) -> list:
    return [dataclasses.replace(r, **{k: 0 for k in TIMES}) for r in records if isinstance(r, (Collective, PointToPoint))]


class CallPathTests:
    """What a recording of these calls holds; the same on either twin."""

    recorder = None  # the class under test
    accelerate = False  # whether its call log is the C one's

    def _path(self, tmp_path, payload="none", stack_depth=0):
        log = CallLog(log_path(tmp_path, 0), 0, ring_size=1 << 16, persist_size=1 << 16, accelerate=self.accelerate)
        assert log.accelerated == self.accelerate
        rec = Rec()
        return rec, log, self.recorder(rec, log, payload, stack_depth)

    def test_a_blocking_collective_is_one_record(self, tmp_path):
        rec, log, path = self._path(tmp_path)
        t = torch.ones(4)
        for seq in range(3):  # the first learns the names and shapes (C: the Python path), the rest are seen
            assert type(path.blocking(Call("all_reduce", 2, seq, [t], [t], _ran, ([t],), "SUM"))) is Work
        records = _records(log)
        calls = [r for r in records if isinstance(r, Collective)]
        assert [(c.op, c.group, c.seq, c.reduce_op, c.root) for c in calls] == [("all_reduce", 2, s, "SUM", None)
                                                                               for s in range(3)]
        assert all(c.in_shapes == c.out_shapes == ((4,),) and c.in_dtypes == ("float32",) and c.in_bytes == 16
                   for c in calls)
        assert all(c.start_ns <= c.issued_ns <= c.end_ns and not c.async_op for c in calls)
        assert sum(isinstance(r, Compute) for r in records) == 2  # the gaps between the calls
        assert rec.failed == [] and not path.open

    @pytest.mark.parametrize("payload", ["none", "small", "digest"])
    def test_payloads_roots_and_several_outputs(self, tmp_path, payload):
        rec, log, path = self._path(tmp_path, payload)
        for i in range(3):
            x = torch.full((2,), float(i))
            outs = [torch.full((2,), float(i)), torch.full((2,), float(-i))]
            path.blocking(Call("all_gather", 0, 2 * i, [x], outs, _ran, ()))
            b = torch.arange(3, dtype=torch.int64) + i
            path.blocking(Call("broadcast", 0, 2 * i + 1, [b], [b], _ran, (), root=1))
        calls = [r for r in _records(log) if isinstance(r, Collective)]
        assert [c.op for c in calls] == ["all_gather", "broadcast"] * 3
        gathers, casts = calls[0::2], calls[1::2]
        assert all(c.out_shapes == ((2,), (2,)) and c.out_bytes == 16 for c in gathers)
        assert all(c.root == 1 and c.in_dtypes == ("int64",) for c in casts)
        if payload == "none":
            assert all(c.blob_in is c.blob_out is c.digest_out is None for c in calls)
        else:  # small calls keep their bytes; only digest keeps what goes in
            assert all(c.blob_out is not None and len(c.blob_out) == len(c.out_shapes) for c in calls)
            assert all((c.blob_in is not None) == (payload == "digest") for c in calls)
            assert len({c.blob_out for c in gathers}) == 3  # each call's own bytes
        assert rec.failed == []

    def test_a_blocking_send_and_receive(self, tmp_path):
        rec, log, path = self._path(tmp_path, "small")
        for seq in range(3):
            out = torch.ones(3)
            path.blocking(Call("send", 0, seq, [out], [out], _ran, (), peer=1, tag=7, p2p=True))
            got = torch.full((3,), float(seq))
            path.blocking(Call("recv", 0, seq, [got], [got], _ran, (), peer=1, p2p=True, receives=True))
        calls = [r for r in _records(log) if isinstance(r, PointToPoint)]
        assert [(c.op, c.seq, c.peer) for c in calls] == [(op, s, 1) for s in range(3) for op in ("send", "recv")]
        assert [c.tag for c in calls[0::2]] == [7, 7, 7]
        assert all(c.blob is None for c in calls[0::2])  # small keeps what arrives, not what goes
        assert all(c.blob is not None for c in calls[1::2])
        assert rec.failed == []

    def test_a_call_that_fails_in_the_backend_is_recorded_failed_and_raises(self, tmp_path):
        rec, log, path = self._path(tmp_path)
        t = torch.ones(2)
        for seq in range(2):
            with pytest.raises(RuntimeError, match="closed by peer"):
                path.blocking(Call("all_reduce", 0, seq, [t], [t], _boom, (), "SUM"))
        calls = [r for r in _records(log) if isinstance(r, Collective)]
        assert [c.seq for c in calls] == [0, 1] and all(c.end_ns is not None for c in calls)
        markers = [m for m in rec.written if isinstance(m, Marker)]
        assert [(m.name, m.value) for m in markers] == [("call_failed", 0), ("call_failed", 1)]
        assert "closed by peer" in markers[0].text and rec.failed == [] and not path.open

    def test_an_async_call_completes_later(self, tmp_path):
        rec, log, path = self._path(tmp_path, "digest")
        t = torch.arange(4.0)
        call = Call("all_reduce", 0, 0, [t], [t], _ran, (), "SUM", async_op=True)
        assert path.enter(call) and id(call) in path.open
        path.issued(call)
        path.complete(call)
        (c,) = [r for r in _records(log) if isinstance(r, Collective)]
        assert c.async_op and c.end_ns >= c.issued_ns >= c.start_ns and c.digest_in is not None
        assert not path.open and rec.failed == []

    def test_the_stack_names_the_callers_line(self, tmp_path):
        rec, log, path = self._path(tmp_path, stack_depth=2)
        t = torch.ones(1)

        def group_method(seq):  # the group's method and its _collective: the two frames the path skips
            return (lambda: path.blocking(Call("all_reduce", 0, seq, [t], [t], _ran, (), "SUM")))()

        for seq in range(3):
            group_method(seq)  # one line, three calls: the C walk answers the last two
        stacks = {c.stack for c in _records(log) if isinstance(c, Collective)}
        assert len(stacks) == 1
        (stack,) = stacks
        assert stack[0].startswith("test_call_path.py:") and stack[0].endswith(" in test_the_stack_names_the_callers_line")

    @pytest.mark.parametrize("beyond", ["its-field", "any-field"])
    def test_a_value_its_field_cannot_hold_fails_the_recording_not_the_call(self, tmp_path, beyond):
        """A tag one past what the ENTER's field holds, or past 64 bits: struct refuses it on
        either path (the C writer hands it to the Python one), the recording fails, the
        program's call runs."""
        rec, log, path = self._path(tmp_path)
        t = torch.ones(1)
        too_big = 1 << (8 * struct.calcsize(_field_code("tag")) - 1) if beyond == "its-field" else 1 << 64
        path.blocking(Call("all_reduce", 0, 0, [t], [t], _ran, (), "SUM"))  # names and shapes learnt
        assert type(path.blocking(Call("all_reduce", 0, 1, [t], [t], _ran, (), "SUM", tag=too_big))) is Work
        assert len(rec.failed) == 1 and isinstance(rec.failed[0], struct.error)
        assert [c.seq for c in _records(log) if isinstance(c, Collective)] == [0]


class TestPython(CallPathTests):
    recorder = _calls.PyCallRecorder
    accelerate = False


@needs_c
class TestC(CallPathTests):
    recorder = _calls.CallRecorder
    accelerate = True

    def test_the_c_path_takes_the_calls_it_has_seen(self, tmp_path):
        rec, log, path = self._path(tmp_path, "small")
        python = []
        path._blocking_py = lambda call: (python.append(call.seq), type(path)._blocking_py(path, call))[1]
        t = torch.ones(2)
        for seq in range(5):
            path.blocking(Call("all_reduce", 0, seq, [t], [t], _ran, (), "SUM"))
        assert python == [0]  # a name and a shape not seen yet: the Python path's, once
        assert len([c for c in _records(log) if isinstance(c, Collective)]) == 5


def _program(path):
    """Calls of every kind the path writes, each kind three times."""
    for i in range(3):
        x = torch.full((3,), float(i))
        path.blocking(Call("all_reduce", 0, i, [x], [x], _ran, (), "MAX"))
        outs = [torch.zeros(3), torch.ones(3)]
        path.blocking(Call("all_gather", 1, i, [x], outs, _ran, ()))
        path.blocking(Call("send", 0, i, [x], [x], _ran, (), peer=1, tag=i, p2p=True))
        path.blocking(Call("recv", 0, i, [x], [x], _ran, (), peer=1, p2p=True, receives=True))
        call = Call("reduce_scatter", 1, i, outs, [x], _ran, (), "SUM", async_op=True)
        path.enter(call)
        path.issued(call)
        path.complete(call)


@needs_c
@pytest.mark.parametrize("payload", ["none", "small", "digest"])
def test_both_twins_write_the_same_records(tmp_path, payload):
    got = []
    for twin in (TestPython, TestC):
        rec, log, path = twin()._path(tmp_path / twin.__name__, payload, stack_depth=3)
        _program(path)
        got.append((_calls_of(_records(log)), rec.failed))
    assert got[0] == got[1] and len(got[0][0]) == 15


# --- what the C twin takes from the one definition, and what it refuses -----------------


def _layout(**change):
    names = ("HEAD", "ENTER_BODY", "ENTER", "DONE_BODY", "DONE", "PAYLOAD_HEAD", "ONE_BYTES", "CID_AT", "SEQ_KEY",
             "ALIGN", "T_ENTER", "T_DONE", "AUX_PAYLOAD", "E_P2P", "E_RECV", "E_SAME_OUT")
    return SimpleNamespace(**{**{n: getattr(calllog, n) for n in names}, **change})


@needs_c
def test_the_c_writer_lays_out_the_entries_as_calllog_says():
    from prism_rr import _speedups

    got = _speedups.entry_layout()
    assert got == _speedups.entry_layout(_layout())
    fmt = calllog.ENTER_BODY.format
    offsets = [struct.calcsize(fmt[: 5 + k]) for k in range(len(fmt) - 5)]  # after "<IBBH"
    assert got["enter"] == list(zip(offsets, fmt[5:]))
    assert got["enter"][got["cid"]][0] == calllog.CID_AT
    assert (got["enter_size"], got["done_size"]) == (calllog.ENTER.size, calllog.DONE.size)


@needs_c
@pytest.mark.parametrize("change, says", [
    ({"ENTER_BODY": struct.Struct("<IBBHqqQiidiIIIHHqq")}, "code 'd'"),
    ({"ENTER_BODY": struct.Struct("<IBHqqQiiqiiIIIHHqq")}, "<IBBH"),
    ({"CID_AT": 32}, "CID_AT"),
    ({"ENTER": struct.Struct("<IBBHqqQiiqiiIIIHHqqQ8x")}, "ENTER is not ENTER_BODY"),
    ({"DONE_BODY": struct.Struct("<IBBHQqqiiqq")}, "DONE_BODY's fields"),
    ({"ONE_BYTES": struct.Struct("<HBBIQ")}, "ONE_BYTES"),
], ids=["a-double", "another-head", "cid-elsewhere", "enter-size", "done-fields", "payload-head"])
def test_a_layout_the_c_writer_cannot_write_is_refused_by_name(change, says):
    from prism_rr import _speedups

    with pytest.raises(ValueError, match=says):
        _speedups.entry_layout(_layout(**change))


@needs_c
def test_bind_refuses_what_the_blocking_path_cannot_fill_by_name():
    from prism_rr import _speedups

    args = _calls._enter_args()
    proto = Call("", 0, 0, (), (), None, ())
    with pytest.raises(ValueError, match="has a field thread"):
        _speedups.bind(Call, proto, args[:-1] + ("thread",), _payload.FULL)
    with pytest.raises(ValueError, match="enter takes 16 arguments"):
        _speedups.bind(Call, proto, args + ("thread",), _payload.FULL)

    class Renamed:
        __slots__ = tuple("operation" if s == "op" else s for s in Call.__slots__)

    with pytest.raises(ValueError, match="no slot op"):
        _speedups.bind(Renamed, Renamed(), args, _payload.FULL)
    # nothing was taken: the path still makes Calls
    caught = []

    class Catch(_speedups.CallState):
        _blocking_py = staticmethod(caught.append)

    state = Catch()
    state._op_names, state._op_name, state._reduce_op_type = None, str, None
    state.fast_collective("all_reduce", 0, 1, [], [], print, (), None, None)
    assert type(caught[0]) is Call and caught[0].op == "all_reduce"


@needs_c
def test_a_slot_call_gains_is_made_as_its_init_makes_it():
    """fast_collective starts from bind's prototype: a slot Call gains (and its default)
    needs nothing in C."""
    from prism_rr import _speedups

    class Wider:
        __slots__ = Call.__slots__ + ("device",)

        def __init__(self, *args, **kwargs):
            Call.__init__(self, *args, **kwargs)
            self.device = "cpu"

    caught = []

    class Catch(_speedups.CallState):
        def _blocking_py(self, call):
            caught.append(call)

    state = Catch()
    state._op_names, state._op_name, state._reduce_op_type = None, str, None
    try:
        _speedups.bind(Wider, Wider("", 0, 0, (), (), None, ()), _calls._enter_args(), _payload.FULL)
        state.fast_collective("broadcast", 3, 9, [], [], print, (), None, 1)
    finally:
        _speedups.bind(Call, Call("", 0, 0, (), (), None, ()), _calls._enter_args(), _payload.FULL)
    (made,) = caught
    want = Wider("broadcast", 3, 9, [], [], print, (), None, 1)
    assert type(made) is Wider and made.device == "cpu"
    for name in Wider.__slots__:
        assert hasattr(made, name) == hasattr(want, name), name
        if hasattr(want, name):
            assert getattr(made, name) == getattr(want, name), name
