"""The device-wait interface (replayer/_device_wait.py) on CPU: the host mechanism's
arithmetic on a clock the test drives (occupy waits for what is left of the peer's
lateness when the stream is late, nothing more; `into` keeps the end for a later wait),
refusals, and bench/device_wait.py run for real on the host. The CUDA mechanisms are
tests/gpu/test_device_wait_cuda.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prism_rr.replayer._device_wait import HostWaiter, mechanisms, waiter_for

REPO = Path(__file__).resolve().parents[2]


class FakeTime:
    """A clock the test moves; sleep_until moves it, and counts what it was asked."""

    def __init__(self):
        self.now = 1_000
        self.slept: list[int] = []

    def clock(self) -> int:
        return self.now

    def sleep_until(self, t: int) -> None:
        self.slept.append(t)
        self.now = max(self.now, t)


def _waiter(slots: int = 4) -> tuple[HostWaiter, FakeTime]:
    t = FakeTime()
    return HostWaiter(slots, clock=t.clock, sleep_until=t.sleep_until), t


def test_a_peer_later_than_the_stream_is_waited_for_from_the_stamp():
    w, t = _waiter()
    w.stamp(0)
    t.now += 300  # the real rank's compute, shorter than the peer's lateness
    w.occupy(0, 1_000, into=1)
    assert t.slept == [2_000] and w.read(1) == 2_000


def test_a_stream_later_than_the_peer_waits_only_the_transfer():
    w, t = _waiter()
    w.stamp(0)
    t.now += 5_000  # the peer had long arrived
    w.occupy(0, 1_000, transfer_ns=250, into=2)
    assert t.slept == [6_250] and w.read(2) == 6_250


def test_a_wait_chained_from_an_earlier_end():
    """A peer's next call follows its previous one's end plus its recorded compute: the
    end slot is the next wait's base."""
    w, t = _waiter()
    w.stamp(0)
    w.occupy(0, 500, transfer_ns=100, into=1)  # ends at 1_600
    w.occupy(1, 400, into=2)  # the peer computes 400 ns more, then arrives
    assert t.slept == [1_600, 2_000] and w.read(2) == 2_000


def test_a_peer_ahead_of_the_stamp_does_not_wait():
    w, t = _waiter()
    w.stamp(0)
    w.occupy(0, -700)
    assert t.slept == [1_000]  # now: no wait at all


def test_slots_outside_the_waiter_are_refused():
    w, _ = _waiter(2)
    for call in (lambda: w.stamp(2), lambda: w.occupy(0, 1, into=5), lambda: w.read(-1)):
        with pytest.raises(IndexError, match="no slot"):
            call()


def test_the_cpu_has_the_host_mechanism_only():
    assert mechanisms("cpu") == ["host"]
    assert isinstance(waiter_for("cpu"), HostWaiter)
    with pytest.raises(ValueError, match="no triton mechanism on cpu"):
        waiter_for("cpu", "triton")


def test_a_real_host_wait_is_never_early():
    w = waiter_for("cpu", slots=2)
    w.stamp(0)
    w.occupy(0, 2_000_000, into=1)  # 2 ms after the stamp, on the real clock
    assert w.read(1) - w.read(0) >= 2_000_000


@pytest.mark.timeout(120)
def test_the_bench_measures_every_lateness_and_case_on_the_host():
    out = subprocess.run([sys.executable, str(REPO / "bench" / "device_wait.py"), "--device", "cpu",
                          "--lateness", "0.1,1", "--repeats", "2", "--json"],
                         capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout)["rows"]
    assert [(r["mechanism"], r["case"], r["lateness_ms"]) for r in rows] == [
        ("host", c, ms) for c in ("queued", "late") for ms in (0.1, 1.0)], rows
    for r in rows:
        assert r["expected_ms"] == (r["lateness_ms"] if r["case"] == "queued" else 0.0), r
        assert r["wait_ms"] >= r["expected_ms"], r  # a wait ends no earlier than asked
        assert r["host_syncs"] == 0, r
    assert "mechanism" in out.stderr and "target" in out.stderr


@pytest.mark.timeout(300)
def test_a_replay_whose_peers_wait_through_the_waiter(tmp_path, monkeypatch):
    """late_peer.py (rank 1 is 150 ms late to each step) recorded, rank 0 replayed with
    PRISM_RR_DEVICE_WAITS=host: from the first step boundary every call with the virtual
    peer (a blocking and an asynchronous all_reduce and a send each step, the barrier at
    the end) waits through the waiter's tickets, which the card names, and no wait ends
    before the late peer arrived: each scored step is at least its lateness long."""
    from prism_rr.replayer import replay

    from replay_helpers import record, stderr_of

    script = Path(__file__).parent / "scripts" / "late_peer.py"
    bundle = record(tmp_path, [script], 2, payload="full")
    monkeypatch.setenv("PRISM_RR_DEVICE_WAITS", "host")
    result = replay(bundle, ranks=[0], timeout=120, log_dir=tmp_path / "logs", cmd=[sys.executable, str(script)])
    assert result.exit_code == 0, stderr_of(result, 0)
    rep = result.report
    # steps 1..3 (three calls each) and step 4's barrier: the calls of step 0 wait on the host
    waits = rep["device_waits"]["0"]
    assert (waits["mechanism"], waits["waits"]) == ("host", 3 * 3 + 1), waits
    # what they were asked: the peer's 150 ms from the step's start at most (its arrival,
    # once the real rank's compute is behind it), the transfer a few ms at most
    assert 0.1 < waits["offset_ms"][2] < 200 and 0 <= waits["transfer_ms"][0] <= waits["transfer_ms"][2] < 50, waits
    # the last waits' ends, read back from the waiter's slots: each no earlier than asked,
    # and, the stream here being the host that waits for each, not much later
    last = waits["last"]
    assert last and {step for step, *_ in last} <= {1, 2, 3, 4}, last
    assert all(offset + transfer - 0.001 <= end < offset + transfer + 100 for _, offset, transfer, end in last), last
    assert "virtual peers waited with host (rank 0: 10 waits)" in result.card, result.card
    assert rep["scored_steps"] == [1, 2, 3] and not rep["diverged"]
    for st in rep["steps"][1:]:
        assert st["replayed_s"] >= 0.14, rep["steps"]  # the peer's 150 ms, less the clocks' skew
    monkeypatch.setenv("PRISM_RR_DEVICE_WAITS", "off")
    plain = replay(bundle, ranks=[0], timeout=120, log_dir=tmp_path / "logs2", cmd=[sys.executable, str(script)])
    assert plain.exit_code == 0 and plain.report["device_waits"] == {}
    assert "virtual peers waited" not in plain.card
