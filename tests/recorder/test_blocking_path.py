"""The recorder's blocking call path in C (prism_rr/_speedups.c, CallState.fast_blocking)
and in Python (recorder/_calls.py, CallRecorder.blocking) record the same calls, field for
field: real gloo ranks run the same program on each path."""

import dataclasses
import json
import os
import sys

import pytest

from prism_rr.format.calllog import accelerated
from prism_rr.format.reader import open_bundle
from prism_rr.format.records import Collective, PointToPoint
from prism_rr.recorder import _calls

from recorder_helpers import SCRIPTS, run_recorded
from tests.cli_helpers import run_cli

TIMES = ("start_ns", "end_ns", "issued_ns")

CALLS = 17  # calls a round of scripts/blocking.py makes


def _run(tmp_path, pure: bool, payload: str, rounds: int = 4, ring: int | None = None, env: dict | None = None):
    argv = [SCRIPTS / "blocking.py", tmp_path, rounds, 15 if ring else 0]
    spools, _ = run_recorded(tmp_path, argv, 2, timeout=120, payload=payload,
                             env_extra={"PRISM_RR_PURE_PYTHON": "1", **(env or {})} if pure else env,
                             **({"ring_size": ring} if ring else {}))
    paths = [json.loads((tmp_path / f"path-{r}.json").read_text()) for r in range(2)]
    calls = {r: [dataclasses.replace(c, **{k: 0 for k in TIMES}) for c in spools.calls(r)] for r in range(2)}
    # the time between calls (a Compute record from the ENTER's `prev`) and markers
    kinds = {r: [type(x).__name__ for x in spools.records[r]] for r in range(2)}
    return calls, paths, kinds


# A 64 KiB ring goes round twice: at its end an entry takes the log's slow path (padding),
# from the C path as from the Python one, with and without a payload.
@pytest.mark.skipif(not accelerated(), reason="the C speedups were not built here")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("payload, rounds, ring", [("digest", 4, None), ("none", 4, None), ("small", 4, None),
                                                   ("none", 45, 1 << 16), ("digest", 30, 1 << 16)],
                         ids=["digest", "none", "small", "none-ring-64k", "digest-ring-64k"])
def test_the_c_and_python_paths_record_the_same_calls(tmp_path, payload, rounds, ring):
    assert _calls.CallRecorder is not _calls.PyCallRecorder  # built: CallRecorder runs on CallState
    c_calls, c_paths, c_kinds = _run(tmp_path / "c", False, payload, rounds, ring)
    py_calls, py_paths, py_kinds = _run(tmp_path / "py", True, payload, rounds, ring)
    assert all(p["c_path"] for p in c_paths) and not any(p["c_path"] for p in py_paths)
    for rank in range(2):
        made = len(c_calls[rank])
        assert made == len(py_calls[rank]) == rounds * CALLS + 1
        # the first round (names, shapes and stacks new) goes the Python way, and the last barrier
        assert c_paths[rank]["python"] == CALLS + 1, c_paths[rank]
        for a, b in zip(c_calls[rank], py_calls[rank]):
            assert a == b
        assert c_kinds[rank] == py_kinds[rank]
        assert c_kinds[rank].count("Compute") >= made - 2
        if payload != "none":
            assert any(c.op == "all_gather" and c.blob_out and len(c.blob_out) == 2 for c in c_calls[rank])


@pytest.mark.skipif(not accelerated(), reason="the C speedups were not built here")
@pytest.mark.timeout(300)
def test_small_plain_tensors_payloads_are_read_in_c_as_log_payload_reads_them(tmp_path):
    """A call's small plain CPU tensors (log_payload's first cases: one, or several of at
    most KEEP_SMALL bytes in all) are read by the C path itself: the same records as when
    every payload goes through Python's log_payload, and at least ten payloads a round
    fewer asked of it (two all_reduces, a broadcast of floats and one of bytes, a
    subgroup's all_reduce, each in and out; all_gather's several outputs too). A Parameter
    (a subclass) and tensors above the small size still go the Python way."""
    rounds = 4
    c_calls, c_paths, _ = _run(tmp_path / "c", False, "digest", rounds)
    py_calls, py_paths, _ = _run(tmp_path / "py", False, "digest", rounds, env={"BLOCKING_NO_ONE_SMALL": "1"})
    for rank in range(2):
        assert c_calls[rank] == py_calls[rank]
        assert c_paths[rank]["python"] == py_paths[rank]["python"] == CALLS + 1
        fewer = py_paths[rank]["payload_calls"] - c_paths[rank]["payload_calls"]
        assert fewer >= 12 * (rounds - 1), (c_paths[rank], py_paths[rank])
        assert c_paths[rank]["payload_calls"] >= 2 * (rounds - 1), c_paths[rank]


@pytest.mark.skipif(not accelerated(), reason="the C speedups were not built here")
@pytest.mark.timeout(400)
def test_a_flight_ring_gone_round_keeps_the_same_calls_on_both_paths(tmp_path):
    """Flight mode's ring of 1 MiB (about 5,500 calls under its default payload, small:
    ENTERs without one), gone round half as far again (8,500 calls): the entries the ring
    drops to make room go through the log's slow path, from the C path as from the Python
    one; the dump at exit holds the same calls."""
    rounds = 500
    got = {}
    for pure in (False, True):
        d = tmp_path / ("py" if pure else "c")
        d.mkdir()
        out = d / "dump.prism"
        r = run_cli("record", "--flight", 2, "--flight-budget", 1, "--flight-at-exit", "-o", out, "--nproc", 2, "--",
                    sys.executable, SCRIPTS / "blocking.py", d, rounds, 0, timeout=300,
                    env=dict(os.environ, PRISM_RR_PURE_PYTHON="1") if pure else None)
        assert r.returncode == 0, r.stderr[-3000:]
        with open_bundle(out) as b:
            got[pure] = {rank: [dataclasses.replace(c, **{k: 0 for k in TIMES}) for c in b.events(rank)
                                if isinstance(c, (Collective, PointToPoint))] for rank in b.recorded_ranks}
    for rank in (0, 1):
        kept = got[False][rank]
        assert 2000 < len(kept) < rounds * CALLS * 0.8  # the ring let the oldest go
        assert kept == got[True][rank]


@pytest.mark.skipif(not accelerated(), reason="the C speedups were not built here")
@pytest.mark.parametrize("reduce_op", ["SUM", "AVG", "MAX-type", None], ids=["sum", "avg", "red-op-type", "none"])
def test_the_c_path_makes_the_call_as_call_init_does(reduce_op):
    """fast_collective's Call, slot for slot, against intercept/group.py's Call(...) (a state
    that hands every call to the Python path, where the call is caught before it runs)."""
    import torch.distributed as dist

    from prism_rr._speedups import CallState
    from prism_rr.intercept.group import Call, _op_name, op_names

    op = {"SUM": dist.ReduceOp.SUM, "AVG": dist.ReduceOp(dist.ReduceOp.AVG),
          "MAX-type": dist.ReduceOp.RedOpType.MAX, None: None}[reduce_op]
    caught = []

    class Catch(CallState):
        def _blocking_py(self, call):
            caught.append(call)
            return "ran"

    state = Catch()
    state._op_names, state._op_name, state._reduce_op_type = op_names()
    ins, outs, args = [object()], [object()], (1, 2)
    assert state.fast_collective("all_reduce", 3, 7, ins, outs, print, args, op, 5) == "ran"
    want = Call("all_reduce", 3, 7, ins, outs, print, args, None if op is None else _op_name(op), 5)
    got = caught[0]
    assert type(got) is Call
    for name in Call.__slots__:
        assert hasattr(got, name) == hasattr(want, name), name
        if hasattr(want, name):
            assert getattr(got, name) == getattr(want, name), name
