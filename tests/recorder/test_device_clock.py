"""Device time in a recording (issue 27): marks at steps and calls on a device clock,
resolved in batches into DeviceTime records. On CPU the host stand-in
(PRISM_RR_DEVICE_CLOCK=host, HostEventClock) runs the whole path: real gloo ranks, the
call log, the compactor, pack, a rank killed mid-run. CudaClock's own test is in
tests/gpu/test_device_clock_cuda.py."""

import os
import signal
import sys
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest

from prism_rr.analysis import step_durations
from prism_rr.format import Collective, DeviceTime, PointToPoint, Step, open_bundle, pack, verify
from prism_rr.recorder._device import (
    ENV_VAR,
    NOT_YET,
    HostEventClock,
    clock_for,
    collective_duration_ns,
)
from prism_rr.recorder._device_times import DeviceTimes
from prism_rr.recorder.launch import spool_dir_for

from cli_helpers import run_cli
from recorder_helpers import SCRIPTS, finish, run_recorded, start_ranks


# --- the clocks -------------------------------------------------------------------------


def test_host_clock_resolves_in_batches_a_round_late():
    clock = HostEventClock(lag=1)
    t0 = time.monotonic_ns()
    clock.mark("a")
    clock.mark("b")
    assert clock.resolve() == []  # the device is a round behind
    clock.mark("c")
    first = clock.resolve()
    assert [k for k, _ in first] == ["a", "b"]
    assert 0 <= t0 - clock.epoch_host_ns <= first[0][1] + t0 - clock.epoch_host_ns
    assert first[0][1] <= first[1][1] <= time.monotonic_ns() - clock.epoch_host_ns
    assert [k for k, _ in clock.resolve(final=True)] == ["c"]
    assert clock.resolve(final=True) == []
    now = HostEventClock(lag=0)
    now.mark("x")
    assert [k for k, _ in now.resolve()] == ["x"]
    assert now.epoch == {"clock": "host-events", "epoch_host_ns": now.epoch_host_ns, "device": "host"}


def test_clock_for_picks_by_device_and_variable(monkeypatch):
    import torch

    monkeypatch.delenv(ENV_VAR, raising=False)
    assert clock_for("cpu") is None and clock_for(torch.device("cpu")) is None
    if not torch.cuda.is_available():
        assert clock_for("cuda") is None
    monkeypatch.setenv(ENV_VAR, "host")
    assert isinstance(clock_for("cpu"), HostEventClock)
    monkeypatch.setenv(ENV_VAR, "off")
    assert clock_for("cuda") is None and clock_for("cpu") is None


def test_collective_duration_of_gloo_and_of_works_that_have_it():
    import torch
    import torch.distributed as dist

    store = dist.HashStore()
    pg = dist.ProcessGroupGloo(store, 0, 1, timedelta(seconds=10))
    work = pg.allreduce([torch.ones(3)])
    work.wait()
    assert collective_duration_ns(work) is None  # gloo keeps no timing: its work raises

    class Timed:
        def __init__(self, answer):
            self.answer = answer

        def _get_duration(self):
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer

    assert collective_duration_ns(Timed(2.5)) == 2_500_000
    assert collective_duration_ns(Timed(RuntimeError(
        "Both events must be completed before calculating elapsed time."))) is NOT_YET
    assert collective_duration_ns(Timed(RuntimeError("getDuration only works if timing was enabled"))) is None


# --- DeviceTimes: what is written when ---------------------------------------------------


class _Rec:
    """What DeviceTimes asks of a Recording."""

    def __init__(self):
        self.written, self.info, self.rank, self.step = [], {}, 0, 0
        self.calls = SimpleNamespace(device=None)
        self.device_times = None

    def write(self, record):
        self.written.append(record)

    def add_info(self, info):
        self.info.update(info)

    def marker(self, name, value=None, text=None):
        self.written.append((name, text))


def _call(cid, seq, step=0, p2p=False, peer=None):
    return SimpleNamespace(cid=cid, seq=seq, step=step, start=time.monotonic_ns(), done=False, op="all_reduce",
                           gid=0, p2p=p2p, peer=peer)


def test_device_times_write_steps_and_calls_once_resolved_and_complete():
    rec = _Rec()
    dev = rec.device_times = DeviceTimes(rec, HostEventClock(lag=1))
    rec.calls.device = dev
    dev.step_started(0, 100)
    blocking, later = _call(1, 0), _call(2, 1)
    for c in (blocking, later):
        dev.call_issued(c)
    dev.call_waiting(blocking)
    dev.call_waited(blocking)
    blocking.done = True
    dev.step_ended(0, 200)
    dev.step_started(1, 200)
    dev.resolve()  # step 0's boundary: the device has passed nothing yet; the epoch is said
    assert rec.written == [] and rec.info["device_time"]["clock"] == "host-events"
    dev.resolve()
    (step0, call0) = rec.written
    assert (step0.name, step0.step, step0.start_ns, step0.end_ns) == ("step", 0, 100, 200)
    assert step0.dev_start_ns <= call0.dev_start_ns <= call0.dev_wait_ns <= call0.dev_end_ns <= step0.dev_end_ns
    assert (call0.name, call0.group, call0.seq, call0.peer, call0.dev_duration_ns) == ("call", 0, 0, None, None)
    # the other call: its future completed it (no wait yet): written with its issue alone ...
    later.done = True
    dev.resolve()
    (call1,) = rec.written[2:]
    assert call1.seq == 1 and call1.dev_start_ns is not None and call1.dev_end_ns is call1.dev_wait_ns is None
    # ... and the program's wait() that came after it makes a second record of the same call
    dev.call_waiting(later)
    dev.call_waited(later)
    dev.resolve(final=True)
    step1, again = sorted(rec.written[3:], key=lambda r: r.name, reverse=True)
    assert (step1.step, step1.dev_start_ns is not None, step1.dev_end_ns) == (1, True, None)  # never ended
    assert (again.seq, again.dev_start_ns) == (1, None) and again.dev_wait_ns <= again.dev_end_ns


def test_a_failing_clock_turns_device_time_off_not_the_recording():
    rec = _Rec()

    class Broken(HostEventClock):
        def mark(self, key):
            raise RuntimeError("no device")

    dev = rec.device_times = DeviceTimes(rec, Broken())
    rec.calls.device = dev
    dev.step_started(0, 1)
    assert rec.device_times is None and rec.calls.device is None
    assert rec.written == [("device_time_failed", "RuntimeError: no device")]
    dev.step_ended(0, 2)  # said once
    assert len(rec.written) == 1


# --- real ranks ------------------------------------------------------------------------


def _merged(records):
    """Per call key, the DeviceTime fields of its records, each the first that is set."""
    out = {}
    for d in records:
        key = (d.group, d.op, d.peer, d.seq)
        have = out.setdefault(key, {})
        for name in ("dev_start_ns", "dev_wait_ns", "dev_end_ns"):
            if have.get(name) is None:
                have[name] = getattr(d, name)
    return out


def _call_key(c):
    return (c.group, c.op, c.peer if type(c) is PointToPoint else None, c.seq)


def _record_steps(tmp_path, env):
    out = tmp_path / "steps.prism"
    r = run_cli("record", "-o", out, "--nproc", "2", "--", sys.executable, SCRIPTS / "steps.py", timeout=150,
                env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.mark.timeout(200)
def test_a_recording_on_the_host_clock_times_every_step_and_call(tmp_path):
    env = dict(os.environ, **{ENV_VAR: "host"})
    out = _record_steps(tmp_path, env)
    with open_bundle(out) as b:
        assert b.format_version == "1.3" and "device-time" in b.manifest["features_required"]
        verify(b)
        for rank in (0, 1):
            epoch = b.rank_info(rank)["device_time"]
            assert epoch["clock"] == "host-events" and type(epoch["epoch_host_ns"]) is int
            records = list(b.events(rank))
            steps = {s.step: s for s in records if type(s) is Step}
            calls = [c for c in records if type(c) is Collective]
            device = [d for d in records if type(d) is DeviceTime]
            assert sorted(steps) == [0, 1, 2, 3] and len(calls) == 5  # 4 all_reduces and the barrier
            dev_steps = {d.step: d for d in device if d.name == "step"}
            # one device time per step; the step in which the program ended (4) has its start alone
            assert sorted(dev_steps) == [0, 1, 2, 3, 4] and len(dev_steps) == len([d for d in device
                                                                                   if d.name == "step"])
            assert dev_steps[4].dev_end_ns is None
            for n, s in steps.items():
                d = dev_steps[n]
                assert (d.start_ns, d.end_ns) == (s.start_ns, s.end_ns)
                # the host stand-in's device time is the host's at the mark: within the step
                assert s.start_ns <= epoch["epoch_host_ns"] + d.dev_end_ns <= s.end_ns + 5_000_000
                assert d.dev_start_ns < d.dev_end_ns
            # one device time per call, matched to its record by group and sequence number
            dev_calls = [d for d in device if d.name == "call"]
            assert sorted((d.group, d.seq) for d in dev_calls) == sorted((c.group, c.seq) for c in calls)
            by_seq = {d.seq: d for d in dev_calls}
            for c in calls:
                d = by_seq[c.seq]
                assert (d.op, d.step, d.start_ns) == (c.op, c.step, c.start_ns)
                assert d.dev_start_ns <= d.dev_wait_ns <= d.dev_end_ns
                assert c.start_ns <= epoch["epoch_host_ns"] + d.dev_start_ns
                assert epoch["epoch_host_ns"] + d.dev_end_ns <= c.end_ns
                step = dev_steps[c.step]
                assert step.dev_start_ns <= d.dev_start_ns and (step.dev_end_ns is None
                                                                or d.dev_end_ns <= step.dev_end_ns)
            # the device's order of calls is the host's
            by_host = [d.seq for d in sorted(dev_calls, key=lambda d: d.start_ns)]
            assert by_host == [d.seq for d in sorted(dev_calls, key=lambda d: d.dev_start_ns)]
        durations = step_durations(b, 2)
        assert durations.clock == "device" and sorted(durations) == [0, 1]
        assert step_durations(b, 2, clock="host").clock == "host"
    info = run_cli("info", out)
    assert info.returncode == 0 and "device time     recorded (host events" in info.stdout, info.stdout


@pytest.mark.timeout(200)
def test_without_a_device_clock_a_cpu_recording_has_no_device_time(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    out = _record_steps(tmp_path, env)
    with open_bundle(out) as b:
        assert "device-time" not in b.manifest["features_required"] and "device_steps" not in b.summaries
        assert not any(type(r) is DeviceTime for rank in (0, 1) for r in b.events(rank))
        assert all("device_time" not in b.rank_info(r) for r in (0, 1))
        assert step_durations(b, 2).clock == "host"
    info = run_cli("info", out)
    assert info.returncode == 0 and "device time" not in info.stdout


@pytest.mark.timeout(180)
def test_every_kind_of_call_gets_its_device_time(tmp_path):
    """Every collective and point-to-point call of collectives.py (async ones, a receive
    from any source, functional collectives) through the call log and the compactor."""
    spools, _ = run_recorded(tmp_path, [SCRIPTS / "collectives.py", tmp_path, ""], 2, timeout=120,
                             env_extra={ENV_VAR: "host"})
    for rank in (0, 1):
        calls = spools.calls(rank)
        device = spools.of_kind(rank, DeviceTime)
        merged = _merged(d for d in device if d.name == "call")
        assert len(calls) > 20
        assert set(merged) == {_call_key(c) for c in calls}, rank
        for key, d in merged.items():
            assert d["dev_start_ns"] is not None, key
            if d["dev_wait_ns"] is not None and d["dev_end_ns"] is not None:
                assert d["dev_start_ns"] <= d["dev_wait_ns"] <= d["dev_end_ns"], key


@pytest.mark.timeout(120)
def test_a_rank_killed_mid_run_keeps_the_device_times_it_wrote(tmp_path, monkeypatch):
    """Rank 1 is SIGKILLed in its loop: every step's device time resolved before the kill
    (each step's, one boundary later) is in the bundle, read from its call log."""
    monkeypatch.setenv(ENV_VAR, "host")
    out, procs = start_ranks(tmp_path, "crashy.py", "loop", 2, "devtime")
    ready = [tmp_path / f"ready-{r}" for r in range(2)]
    deadline = time.monotonic() + 60
    while not all(p.exists() for p in ready):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            finish(procs, 1)
            pytest.fail("ranks never reached their loop: " + (tmp_path / "rank1.log").read_text()[-2000:])
        time.sleep(0.02)
    time.sleep(0.3)
    procs[1].send_signal(signal.SIGKILL)
    time.sleep(0.5)
    procs[0].send_signal(signal.SIGTERM)
    codes = finish(procs, 8)
    assert codes[1] == -signal.SIGKILL, codes
    pack(spool_dir_for(out), out)
    with open_bundle(out) as b:
        verify(b)
        assert "device-time" in b.manifest["features_required"]
        records = list(b.events(1))
        steps = sorted(s.step for s in records if type(s) is Step)
        device = {d.step: d for d in records if type(d) is DeviceTime and d.name == "step"}
        assert len(steps) > 4, steps  # the loop ran
        # a step's device time (and its calls') is written at the boundary after it: all
        # but the last step's, or the last two if the kill came inside that boundary
        assert set(steps[:-2]) <= set(device) <= set(steps), (steps, sorted(device))
        for n in steps[:-2]:
            assert device[n].dev_start_ns < device[n].dev_end_ns
        calls = {(c.group, c.seq) for c in records if type(c) is Collective and c.step < steps[-2]}
        timed = {(d.group, d.seq) for d in records if type(d) is DeviceTime and d.name == "call"}
        assert calls and calls <= timed


# --- CudaClock's bookkeeping, on a stand-in for torch.cuda ------------------------------


class _FakeCuda:
    """torch.cuda as CudaClock uses it: a device whose stream passes an event `gap_ns`
    after the one before, and has passed those up to `passed_ns`; elapsed times in float32
    milliseconds, as CUDA gives them."""

    def __init__(self, start_ns: int, gap_ns: int):
        self.t, self.gap, self.passed_ns = start_ns, gap_ns, -1
        self.initialized, self.capturing, self.made = True, False, 0

    def is_initialized(self):
        return self.initialized

    def current_device(self):
        return 0

    def current_stream(self, index=None):
        return ("stream", index)

    def is_current_stream_capturing(self):
        return self.capturing

    def Event(self, enable_timing=False):
        assert enable_timing
        self.made += 1
        return _FakeEvent(self)


class _FakeEvent:
    def __init__(self, cuda):
        self.cuda, self.t = cuda, None

    def record(self, stream=None):
        assert stream == ("stream", 0)
        self.cuda.t += self.cuda.gap
        self.t = self.cuda.t

    def query(self):
        return self.t is not None and self.t <= self.cuda.passed_ns

    def elapsed_time(self, end):
        import numpy as np

        assert self.query() and end.query(), "both events must be completed"
        return float(np.float32((end.t - self.t) / 1e6))


def _cuda_clock(fake):
    from prism_rr.recorder._device import CudaClock

    clock = CudaClock()
    clock._cuda = fake
    return clock


def test_cuda_clock_reads_in_order_without_waiting_and_reuses_its_events():
    # ten hours into the device's life, marks 1 us apart: a float32 of milliseconds from
    # the epoch would be off by far more than that; read from the mark before, exact
    fake = _FakeCuda(start_ns=36_000 * 10**9, gap_ns=1_000)
    clock = _cuda_clock(fake)
    fake.initialized = False
    clock.mark("too early")  # before CUDA is initialised: no time, in its place
    fake.initialized = True
    for i in range(5):
        clock.mark(i)
    assert clock.epoch["clock"] == "cuda-events" and clock.epoch["device"] == "cuda:0"
    assert clock.resolve() == [("too early", None)]  # the device has passed nothing
    fake.passed_ns = fake.t - 2 * fake.gap
    assert clock.resolve() == [(0, 1_000), (1, 2_000), (2, 3_000)]
    fake.capturing = True
    clock.mark("captured")
    fake.capturing = False
    fake.passed_ns = fake.t + 10**12
    assert clock.resolve() == [(3, 4_000), (4, 5_000), ("captured", None)]
    made = fake.made
    for batch in range(20):
        for i in range(10):
            clock.mark((batch, i))
        fake.passed_ns = fake.t
        got = clock.resolve()
        assert [t for _, t in got] == [6_000 + 1_000 * (10 * batch + i) for i in range(10)]
    assert fake.made - made <= 11  # events come back to the pool once read


def test_cuda_clock_final_resolve_waits_a_bounded_while(monkeypatch):
    from prism_rr.intercept import device_reads

    monkeypatch.setattr(device_reads, "FINAL_WAIT_S", 0.2)
    fake = _FakeCuda(start_ns=0, gap_ns=1_000)
    clock = _cuda_clock(fake)
    clock.mark("a")
    fake.passed_ns = fake.t
    clock.mark("stuck")  # a device stuck in a collective never passes it
    t0 = time.monotonic()
    assert clock.resolve(final=True) == [("a", 1_000)]
    assert 0.2 <= time.monotonic() - t0 < 2
