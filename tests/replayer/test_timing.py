"""The live timing model on hand-made records (no processes)."""

from prism_rr.format.records import Collective
from prism_rr.replayer._schedule import transfer_ns
from prism_rr.replayer._timing import LiveClock


def _c(start, end, seq=0):
    return Collective(start_ns=start, end_ns=end, step=0, op="all_reduce", group=0, seq=seq)


def test_transfer_is_the_smallest_span():
    assert transfer_ns([_c(0, 50), _c(30, 40), None, _c(10, None)]) == 10
    assert transfer_ns([None]) == 0


def test_virtual_peer_enters_after_its_gap():
    clock = LiveClock(0, {0: 0, 1: 1_000})  # rank 1's clock runs 1000 ns ahead of rank 0's
    own0, peer0 = _c(100, 200), _c(1_150, 1_200)
    clock.anchor(10_000, own0)  # the real rank enters its first call at 10_000
    assert clock.entry(1, peer0) == 10_050  # 50 ns after the real rank, as recorded
    clock.completed(1, peer0, 20_000)  # the replay completed that call late
    peer1 = _c(1_500, 1_600, seq=1)  # 300 ns of compute after its previous call
    assert clock.entry(1, peer1) == 20_300
    assert clock.entry(2, None) is None
