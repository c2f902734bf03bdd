"""Payloads read once the device has passed them (recorder/_later.py): a CUDA recording's
digests and small calls' bytes without a host synchronization at each call. Here on CPU
tensors (DevicePayloads' device "cpu", PRISM_RR_DEVICE_PAYLOADS=cpu), which runs the same
code but for the pinned copies and the event: the call log's entries (ENTER flag
E_IN_LATER, DONE flag D_OUT_LATER, OUT and its O_INPUTS flag) in every order they can come,
and payload bytes equal to the synchronous path's, tensor by tensor and in real
recordings of every collective. The CUDA side is tests/gpu/test_later_cuda.py."""

import pytest
import torch

from prism_rr.format import codec
from prism_rr.format.calllog import (D_OUT_LATER, E_IN_LATER, E_SAME_OUT, P_DIGESTS, CallLog, decode_log, log_path,
                                     payload_tail, read_log)
from prism_rr.format.records import Collective
from prism_rr.intercept import payload as _payload
from prism_rr.recorder._later import DevicePayloads

from recorder_helpers import SCRIPTS, run_recorded

F32 = (((4,),), ("float32",), 16)


def _log(tmp_path):
    log = CallLog(log_path(tmp_path, 0), 0, ring_size=1 << 20, persist_size=1 << 16)
    log.define(1, "all_reduce")
    log.define(2, F32)
    return log


def _calls(log):
    _, records = decode_log(read_log(log.path))
    return [r for r in (codec.row_record(r) if type(r) is tuple else r for r in records) if type(r) is Collective]


def _enter(log, seq, flags=E_SAME_OUT, payload=None):
    return log.enter(flags, 100 * seq + 10, 100 * seq, 0, 0, seq, -1, 0, 2, 0, 0, 1, 0, -1, -1, payload)


def test_a_call_is_made_once_its_done_and_every_later_payload_are_in(tmp_path):
    log = _log(tmp_path)
    ins, outs = payload_tail(1, P_DIGESTS, digests=[11]), payload_tail(1, P_DIGESTS, digests=[22])
    # 0: the inputs' payload before the DONE
    cid = _enter(log, 0, E_SAME_OUT | E_IN_LATER)
    log.out(cid, ins, inputs=True)
    log.done(cid, 50, 20, 0, -1, -1, outs)
    # 1: after the DONE
    cid = _enter(log, 1, E_SAME_OUT | E_IN_LATER)
    log.done(cid, 150, 120, 0, -1, -1, outs)
    log.out(cid, ins, inputs=True)
    # 2: both later, the outputs' first
    cid = _enter(log, 2, E_SAME_OUT | E_IN_LATER)
    log.done(cid, 250, 220, D_OUT_LATER, -1, -1)
    log.out(cid, outs)
    log.out(cid, ins, inputs=True)
    # 3: the inputs' never comes (the rank died first): made at the end, without them
    cid = _enter(log, 3, E_SAME_OUT | E_IN_LATER)
    log.done(cid, 350, 320, 0, -1, -1, outs)
    # 4: an OUT without a payload (the reading failed) closes it as well
    cid = _enter(log, 4, E_SAME_OUT | E_IN_LATER)
    log.done(cid, 450, 420, 0, -1, -1, outs)
    log.out(cid, None, inputs=True)
    got = {c.seq: c for c in _calls(log)}
    assert sorted(got) == [0, 1, 2, 3, 4]
    for seq in (0, 1, 2):
        assert (got[seq].digest_in, got[seq].digest_out, got[seq].end_ns) == ((11,), (22,), 100 * seq + 50), got[seq]
    assert got[3].digest_in is None and got[3].digest_out == (22,) and got[3].end_ns == 350
    assert got[4].digest_in is None and got[4].digest_out == (22,)
    # the order records come in: 3 only at the end, as a call still pending
    assert [c.seq for c in _calls(log)] == [0, 1, 2, 4, 3]


def test_a_call_the_log_dropped_reads_nothing_and_writes_nothing(tmp_path):
    """A full ring drops a call (enter gives cid -1, counted): its later payloads neither
    fail the recording nor write an entry."""
    log = _log(tmp_path)
    later = DevicePayloads(log, _payload.DIGEST, device="cpu")
    later.take(-1, [torch.ones(4)], True)
    log.out(-1, payload_tail(1, P_DIGESTS, digests=[1]), inputs=True)
    assert later.pending == 0 and later.resolve(final=True) == 0 and _calls(log) == []


def test_an_outputs_payload_before_its_done_is_kept(tmp_path):
    """A backend thread's DONE (D_OUT_LATER) can land after the program's thread wrote the
    outputs' OUT: the call is made at the DONE, whole, not held until the end."""
    log = _log(tmp_path)
    outs = payload_tail(1, P_DIGESTS, digests=[22])
    cid = _enter(log, 0)
    log.out(cid, outs)
    log.done(cid, 50, 20, D_OUT_LATER, -1, -1)
    _enter(log, 1)  # a later call, still open: the first is made before it
    got = _calls(log)
    assert [(c.seq, c.end_ns, c.digest_out) for c in got] == [(0, 50, (22,)), (1, None, None)], got


def _cases():
    g = torch.Generator().manual_seed(0)

    def rnd(n, dtype=torch.float32):
        return torch.randint(-1000, 1000, (n,), generator=g).to(dtype)

    odd = torch.randint(0, 255, (6001,), generator=g).to(torch.uint8)
    return {
        "one small": [rnd(4)],
        "small ones": [rnd(3), rnd(5, torch.int64), torch.tensor([True, False])],
        "large": [rnd(2000)],
        "large, a tail": [torch.randint(0, 255, (5003,), generator=g).to(torch.uint8)],
        "large, not 8-aligned": [odd[1:]],
        "mixed sizes": [rnd(100), rnd(1500), rnd(3, torch.float64)],
        "not contiguous": [rnd(4000).reshape(40, 100).t()],
        "bf16": [rnd(3001, torch.bfloat16)],
        "empty beside": [rnd(0), rnd(3000)],
    }


@pytest.mark.parametrize("mode", [_payload.DIGEST, _payload.SMALL])
@pytest.mark.parametrize("case", list(_cases()))
def test_the_payloads_are_the_synchronous_paths_to_the_byte(tmp_path, case, mode):
    tensors = _cases()[case]
    later = DevicePayloads(log := _log(tmp_path), mode, device="cpu")
    wanted = later.wanted(tensors)
    sync = _payload.log_payload(tensors, mode)
    if not wanted:  # small's larger calls: nothing to read, nothing kept
        assert mode == _payload.SMALL and sync is None
        return
    cid_sync = _enter(log, 0, E_SAME_OUT, sync)
    log.done(cid_sync, 50, 20, 0, -1, -1, sync if type(sync) is bytes else None)
    cid = _enter(log, 1, E_SAME_OUT | E_IN_LATER)
    later.take(cid, tensors, True)
    log.done(cid, 150, 120, D_OUT_LATER, -1, -1)
    later.take(cid, tensors, False)
    assert later.pending == 2 and later.resolve() == 2 and later.pending == 0
    a, b = _calls(log)
    assert (b.digest_in, b.blob_in) == (a.digest_in, a.blob_in)
    if type(sync) is bytes:
        assert (b.digest_out, b.blob_out) == (a.digest_out, a.blob_out)
    assert b.digest_in or b.blob_in


def test_a_failed_reading_closes_the_call_and_says_so(tmp_path):
    log = _log(tmp_path)
    later = DevicePayloads(log, _payload.DIGEST, device="cpu")
    cid = _enter(log, 0, E_SAME_OUT | E_IN_LATER)

    class Broken(torch.Tensor):
        pass

    broken = torch.zeros(4).as_subclass(Broken)
    broken.numel = None  # what take() reads first fails
    with pytest.raises(TypeError):
        later.take(cid, [broken], True)
    log.done(cid, 50, 20, 0, -1, -1)
    (call,) = _calls(log)
    assert call.end_ns == 50 and call.digest_in is None


@pytest.mark.timeout(240)
def test_a_recording_of_every_collective_keeps_the_same_payloads(tmp_path):
    """collectives.py (every collective and point-to-point call, deterministic data) recorded
    at world 2 twice, its payloads read at once and read later: call by call, the same
    digests and blobs, and the later path took them."""
    ops = ["all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
           "all_to_all_single", "broadcast", "reduce", "gather", "scatter", "barrier", "p2p"]
    got = {}
    for later in ("0", "cpu"):
        d = tmp_path / later
        d.mkdir()
        spools, _ = run_recorded(d, [SCRIPTS / "collectives.py", d, ",".join(ops)], 2, timeout=120,
                                 env_extra={"PRISM_RR_DEVICE_PAYLOADS": later}, payload="digest")
        for r in range(2):
            said = spools.info[r].get("payloads_later")
            assert (said is None) if later == "0" else (said["device"] == "cpu" and said["taken"] > 20
                                                        and said["unread"] == 0), said
        got[later] = {r: [(c.op, c.group, c.seq, c.digest_in, c.digest_out, c.blob_in, c.blob_out)
                          if type(c) is Collective else (c.op, c.group, c.seq, c.digest, c.blob)
                          for c in sorted(spools.calls(r), key=lambda c: c.start_ns)] for r in range(2)}
    for r in range(2):
        assert got["cpu"][r] == got["0"][r], r
        calls = [c for c in got["cpu"][r] if len(c) == 7]
        assert any(c[3] for c in calls) and any(c[4] for c in calls)
        assert any(c[3] for c in got["cpu"][r] if len(c) == 5), "no message kept"
