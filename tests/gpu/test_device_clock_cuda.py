"""CudaClock on a real GPU (issue 27, "Record device time"): CUDA events on the current
stream, read back with query() in batches without synchronizing, a final resolve that
waits for the rest; and a recording on nccl whose steps and calls carry device times
(NCCL's own durations with TORCH_NCCL_ENABLE_TIMING=1). Skipped without CUDA (the `gpu`
marker); the CPU side of the same path is tests/recorder/test_device_clock.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prism_rr.analysis import step_durations
from prism_rr.format import Collective, DeviceTime, Step, open_bundle

from cli_helpers import run_cli

pytestmark = pytest.mark.gpu

RECORD_TIMEOUT = 540
TRAINER = Path(__file__).with_name("cuda_train.py")
SLEEP_CYCLES = 100_000_000  # torch.cuda._sleep: tens of ms on any recent GPU


def _clock():
    import torch

    from prism_rr.recorder._device import CudaClock

    torch.ones(1, device="cuda")  # CUDA initialised: the clock begins at its first mark
    return CudaClock()


def test_cuda_clock_resolves_in_batches_without_synchronizing():
    import torch

    clock = _clock()
    ref0, ref1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.set_sync_debug_mode("error")  # a synchronizing call raises
    try:
        # the device busy first, so that each mark and its reference event are queued
        # back to back and pass together (on an idle device they are apart by the host's
        # time between the two calls, tens of us on a first mark)
        torch.cuda._sleep(SLEEP_CYCLES // 10)
        clock.mark("a")
        ref0.record()
        torch.cuda._sleep(SLEEP_CYCLES)
        ref1.record()
        clock.mark("b")
        early = clock.resolve()  # the device is still asleep: "b" is not passed yet
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert "b" not in [k for k, _ in early]
    rest = clock.resolve(final=True)
    times = dict(early + rest)
    assert list(times) == ["a", "b"]
    slept_ns = ref0.elapsed_time(ref1) * 1e6
    assert slept_ns > 5e6, slept_ns
    assert abs((times["b"] - times["a"]) - slept_ns) < 20_000, (times, slept_ns)  # within 20 us
    assert clock.epoch["clock"] == "cuda-events" and clock.epoch["device"].startswith("cuda:")


def test_cuda_clock_stays_exact_over_many_batches_and_reuses_its_events():
    """The host marks far ahead of the device (each mark waits behind a sleep), so many
    events are in flight at once; once read they are reused in the next round."""
    import torch

    clock = _clock()
    pools = []
    for _ in range(2):
        seen = []
        for batch in range(50):
            for i in range(10):
                clock.mark((batch, i))
                torch.cuda._sleep(100_000)
            seen += clock.resolve()
        seen += clock.resolve(final=True)
        assert [k for k, _ in seen] == [(b, i) for b in range(50) for i in range(10)]
        ns = [t for _, t in seen]
        assert all(b > a for a, b in zip(ns, ns[1:])), "device times go back"
        pools.append(len(clock._pool))
    # made anew for each mark, the two rounds would leave about 1,000 events; reused, no
    # more than one round's 500 marks were ever in flight
    assert 0 < pools[1] <= 501, pools


def test_marks_before_cuda_is_initialised_resolve_as_none():
    code = (
        "import torch\n"
        "from prism_rr.recorder._device import CudaClock\n"
        "c = CudaClock()\n"
        "c.mark('early')\n"
        "assert c.resolve(final=True) == [('early', None)] and c.epoch is None\n"
        "torch.ones(1, device='cuda')\n"
        "c.mark('late')\n"
        "got = c.resolve(final=True)\n"
        "assert [k for k, _ in got] == ['late'] and got[0][1] >= 0, got\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


@pytest.mark.timeout(RECORD_TIMEOUT + 60)
def test_a_nccl_recording_has_device_times(tmp_path):
    import torch

    world = min(2, torch.cuda.device_count())
    bundle = tmp_path / "trainer.prism"
    env = {k: v for k, v in os.environ.items() if k != "PRISM_RR_DEVICE_CLOCK"}
    env["TORCH_NCCL_ENABLE_TIMING"] = "1"
    out = run_cli("record", "-o", bundle, "--steps", "1:4", "--payload", "none", "--nproc", world,
                  "--", sys.executable, TRAINER, "--steps", "6", cwd=tmp_path, env=env, timeout=RECORD_TIMEOUT)
    assert out.returncode == 0, out.stderr[-6000:]
    with open_bundle(bundle) as b:
        assert "device-time" in b.manifest["features_required"]
        for rank in range(world):
            assert b.rank_info(rank)["device_time"]["clock"] == "cuda-events"
            records = list(b.events(rank))
            steps = {s.step: s for s in records if type(s) is Step}
            dev_steps = {d.step: d for d in records if type(d) is DeviceTime and d.name == "step"}
            assert set(steps) <= set(dev_steps), (sorted(steps), sorted(dev_steps))
            for n in steps:
                assert dev_steps[n].dev_start_ns < dev_steps[n].dev_end_ns, dev_steps[n]
            calls = [c for c in records if type(c) is Collective and c.step in steps]
            dev_calls = [d for d in records if type(d) is DeviceTime and d.name == "call"]
            assert {(c.group, c.seq) for c in calls} <= {(d.group, d.seq) for d in dev_calls}
            assert all(d.dev_start_ns is not None for d in dev_calls if d.step in steps)
            durations = [d.dev_duration_ns for d in dev_calls if d.dev_duration_ns is not None]
            print(f"\nrank {rank}: step ms host/device "
                  + ", ".join(f"{n}: {(s.end_ns - s.start_ns) / 1e6:.2f}/"
                              f"{(dev_steps[n].dev_end_ns - dev_steps[n].dev_start_ns) / 1e6:.2f}"
                              for n, s in sorted(steps.items()))
                  + f"; {len(dev_calls)} calls timed, {len(durations)} with NCCL's duration")
            assert durations and all(d > 0 for d in durations), "TORCH_NCCL_ENABLE_TIMING=1 gave no durations"
        d = step_durations(b, 2)
        assert d.clock == "device" and sorted(d) == list(range(world))
