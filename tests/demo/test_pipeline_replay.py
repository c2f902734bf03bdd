"""The demo's pipeline recorded as `prism-rr demo --pp 2` records it, and replayed.

Issue 17: the demo records steps 1-3 after a warm-up step, with digests. Pipelining's
warm-up vote (stage 0 sends stage 1 its vote, stage 1 sends the product back: 1 = the
stages' shapes are given, skip metadata inference) happens in step 0, outside the
window, so the bundle has no data for it; the replay made up zeros, the replayed stage 0
took the inference path the recording never took and failed there. A virtual peer now
answers such a control message the way the handshake does (see ReplayPolicy._echo).
"""

from __future__ import annotations

import types

import pytest
import torch

from prism_rr.format import open_bundle
from prism_rr.replayer._data import write
from prism_rr.replayer._policy import ReplayPolicy

PP_DEMO = ("--pp", "2", "--world", "2")  # the README's pipeline demo line


@pytest.mark.timeout(400)
def test_windowed_pipeline_replays_its_first_stage(demo_runs):
    """`prism-rr demo --pp 2 --world 2` records the trainer's steps 1-3 of 4 with digests
    and replays rank 0, the first stage: the session's run (conftest.demo_runs), which the
    README test and the attribution test read too."""
    run = demo_runs.start(*PP_DEMO)
    out = run.result()
    assert out.returncode == 0, out.stderr[-3000:]  # a replay that stopped early exits 6
    assert "prism-rr replay · 1 real rank(s) [0], 1 virtual" in out.stderr, out.stderr[-3000:]
    assert "diverged: no" in out.stderr and "stopped early" not in out.stderr, out.stderr[-3000:]
    with open_bundle(run.bundle) as b:
        assert list(b.steps) == [1, 2, 3] and b.world_size == 2  # the window: no data for step 0's vote


def test_received_data_keeps_the_programs_strides():
    """The replayer writes into the program's own tensors, in logical order: a strided
    receive buffer or output keeps its strides (FORMAT.md, "Strides")."""
    base = torch.zeros(4, 17, dtype=torch.long)
    dst = base[:, :-1]  # a slice, as the demo's batches were: stride (17, 1)
    src = torch.arange(64).reshape(4, 16)
    write(dst, src)
    assert dst.stride() == (17, 1) and torch.equal(dst, src)
    assert torch.equal(base[:, -1], torch.zeros(4, dtype=torch.long))  # nothing outside it
    t = torch.zeros(16, 4).t()  # transposed: stride (1, 4)
    write(t, torch.arange(64.0))
    assert t.stride() == (1, 4) and torch.equal(t.reshape(-1), torch.arange(64.0))


def test_a_virtual_peer_echoes_control_messages_only():
    group = types.SimpleNamespace(_sent={}, _ECHO_BYTES=ReplayPolicy._ECHO_BYTES)
    note = ReplayPolicy._note_sent.__get__(group)
    echo = ReplayPolicy._echo.__get__(group)
    vote = torch.tensor([1], dtype=torch.int32)
    note(1, [vote])
    vote.zero_()  # the program reuses its buffer: the echo is what was sent
    assert torch.equal(echo(1, [torch.zeros(1, dtype=torch.int32)])[0], torch.tensor([1], dtype=torch.int32))
    assert echo(2, [torch.zeros(1, dtype=torch.int32)]) is None  # another peer
    assert echo(1, [torch.zeros(1, dtype=torch.int64)]) is None  # another dtype
    note(1, [torch.ones(2, 3)])  # activations are data, not control: never echoed
    assert echo(1, [torch.zeros(2, 3)]) is None
    note(1, [torch.ones(4096, dtype=torch.int64)])  # too big to be a handshake
    assert echo(1, [torch.zeros(4096, dtype=torch.int64)]) is None
