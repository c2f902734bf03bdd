"""Device waits on a real GPU (issue 27, "Replay on the device"): the Triton %globaltimer
spin and calibrated torch.cuda._sleep occupy the current stream without blocking the host
or synchronizing it, never end early, and the Triton one waits only for what is left when
the stream arrives after the peer. Skipped without CUDA (the `gpu` marker); the figures
are bench/device_wait.py's, which `make gpu-check` runs."""

from __future__ import annotations

import time

import pytest

from prism_rr.replayer._device_wait import mechanisms, waiter_for

pytestmark = pytest.mark.gpu

LATE_NS = 5_000_000  # 5 ms: far above a kernel launch, far below a test's patience


def _waiters():
    import torch

    return [waiter_for("cuda", name, slots=4) for name in mechanisms(torch.device("cuda"))]


def test_a_wait_occupies_the_stream_not_the_host():
    import torch

    for w in _waiters():
        w.stamp(0)
        w.occupy(0, 0)  # compiled and loaded before the host is timed
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # any synchronizing call inside raises
        try:
            t0 = time.monotonic_ns()
            w.stamp(0)
            w.occupy(0, LATE_NS, into=1)
            w.occupy(1, LATE_NS, into=2)
            host_ns = time.monotonic_ns() - t0
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert host_ns < 2 * LATE_NS, (w.name, host_ns)  # queued, not waited for
        torch.cuda.synchronize()
        assert w.read(2) - w.read(0) >= 2 * LATE_NS - 1_000, w.name


def test_the_triton_wait_only_waits_what_is_left():
    import torch

    if "triton" not in mechanisms(torch.device("cuda")):
        pytest.skip("Triton is not installed with this torch")
    w = waiter_for("cuda", "triton", slots=4)
    for _ in range(2):  # the first compiles
        w.stamp(0)
        torch.cuda._sleep(100_000_000)  # the stream's own work (tens of ms), past the peer's arrival
        w.stamp(1)
        w.occupy(0, LATE_NS, into=2)
        torch.cuda.synchronize()
    assert w.read(1) - w.read(0) > LATE_NS, "the stream's own work was shorter than the peer's lateness"
    # a relative wait would take LATE_NS more here; an absolute one ends at once
    assert w.read(2) - w.read(1) < LATE_NS // 2, w.read(2) - w.read(1)
