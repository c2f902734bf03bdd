"""Payloads read once the device has passed them (recorder/_later.py) on a real GPU: taking
them queues work and copies without one host synchronization, and the bytes are the
synchronous path's; a recording of the CUDA trainer keeps the digests it kept reading them
at once. Skipped without CUDA (the `gpu` marker); the CPU side is tests/recorder/test_later.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from prism_rr.format import Collective, open_bundle

from cli_helpers import run_cli

pytestmark = pytest.mark.gpu

TRAINER = Path(__file__).with_name("cuda_train.py")


def test_taking_a_payload_does_not_synchronize_and_keeps_its_bytes(tmp_path):
    import torch

    from prism_rr.format.calllog import CallLog, log_path
    from prism_rr.intercept import payload as _payload
    from prism_rr.recorder._later import DevicePayloads

    log = CallLog(log_path(tmp_path, 0), 0, ring_size=1 << 20, persist_size=1 << 16)
    later = DevicePayloads(log, _payload.DIGEST)
    cases = [[torch.arange(4.0, device="cuda")], [torch.randn(3001, device="cuda").to(torch.bfloat16)],
             [torch.randint(0, 255, (5003,), device="cuda", dtype=torch.uint8)[1:]],
             [torch.randn(300, device="cuda"), torch.randn(40, 100, device="cuda").t()]]
    for tensors in cases:  # each path warmed up (the first pinned allocation may synchronize)
        later.take(0, tensors, True)
    later.resolve(final=True)
    torch.cuda._sleep(50_000_000)  # the device busy: a synchronization would wait for it
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i, tensors in enumerate(cases):
            later.take(i + 1, tensors, True)
        assert later.resolve() == 0  # nothing passed yet: the device is asleep
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert later.resolve(final=True) == len(cases)

    class Kept:
        def __init__(self):
            self.payloads = []

        def out(self, cid, payload, inputs=False):
            self.payloads.append(payload)

    for tensors in cases:  # the bytes: what the synchronous path makes of the same tensors
        probe = DevicePayloads(kept := Kept(), _payload.DIGEST)
        probe.take(0, tensors, True)
        probe.resolve(final=True)
        assert kept.payloads == [_payload.log_payload(tensors, _payload.DIGEST)], tensors


@pytest.mark.timeout(600)
def test_a_cuda_recording_keeps_the_same_digests(tmp_path):
    got = {}
    for later in ("0", "1"):
        bundle = tmp_path / f"later-{later}.prism"
        env = dict(os.environ, PRISM_RR_DEVICE_PAYLOADS=later)
        out = run_cli("record", "-o", bundle, "--steps", "1:4", "--payload", "digest", "--nproc", 1,
                      "--", sys.executable, TRAINER, cwd=tmp_path, env=env, timeout=300)
        assert out.returncode == 0, out.stderr[-6000:]
        with open_bundle(bundle) as b:
            said = b.rank_info(0).get("payloads_later")
            assert (said is None) if later == "0" else (said["taken"] > 0 and said["unread"] == 0), said
            got[later] = [(c.op, c.seq, c.digest_in, c.digest_out) for c in b.events(0) if type(c) is Collective]
    # the same calls, each with its digests; where the data is the same run to run (the
    # broadcast's flag of zeros), the same digests
    assert [(op, seq, bool(i), bool(o)) for op, seq, i, o in got["1"]] == \
        [(op, seq, bool(i), bool(o)) for op, seq, i, o in got["0"]]
    assert any(c[2] for c in got["1"])
    flags = [(c, d) for c, d in zip(got["1"], got["0"]) if c[0] == "broadcast"]
    assert flags and all(c == d for c, d in flags), flags
