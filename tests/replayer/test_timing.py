"""The timing model on hand-made records (no processes)."""

from prism_rr.format.records import Collective
from prism_rr.replayer._timing import PeerClock


def _c(start, end, seq=0, *, issued=None, async_op=False):
    return Collective(start_ns=start, end_ns=end, step=0, op="all_reduce", group=0, seq=seq,
                      issued_ns=issued, async_op=async_op)


def test_transfer_is_the_smallest_span():
    clock = PeerClock(0, {})
    assert clock.transfer([_c(0, 50), _c(30, 40), None, _c(10, None)]) == 10
    assert clock.transfer([None]) == 0
    assert PeerClock(0, {}, comm_scale=3.0).transfer([_c(0, 50), _c(30, 40)]) == 30


def test_virtual_peer_enters_after_its_gap():
    clock = PeerClock(0, {0: 0, 1: 1_000})  # rank 1's clock runs 1000 ns ahead of rank 0's
    own0, peer0 = _c(100, 200), _c(1_150, 1_200)
    clock.anchor(10_000, own0)  # the real rank enters its first call at 10_000
    assert clock.entry(1, peer0) == 10_050  # 50 ns after the real rank, as recorded
    clock.completed(1, peer0, 10_050, 20_000)  # the replay completed that call late
    peer1 = _c(1_500, 1_600, seq=1)  # 300 ns of compute after its previous call
    assert clock.entry(1, peer1) == 20_300
    assert clock.entry(2, None) is None


def test_async_call_does_not_hold_up_the_next_unless_it_was_done_by_then():
    clock = PeerClock(0, {})
    clock.anchor(0, _c(0, 10))
    first = _c(0, 1_000, issued=10, async_op=True)  # returned at 10, completed at 1_000
    assert clock.entry(1, first) == 0
    clock.completed(1, first, 0, 5_000)  # completes late in the replay
    overlapped = _c(100, 200, seq=1)  # entered while the first was in flight
    assert clock.entry(1, overlapped) == 100
    clock.completed(1, overlapped, 100, 300)
    after = _c(1_500, 1_600, seq=2)  # entered after the first had completed: it may have waited
    assert clock.entry(1, after) == 5_500


def test_slow_rank_stretches_only_its_compute():
    clock = PeerClock(0, {}, slow_rank={1: 2.0})
    clock.anchor(0, _c(0, 10))
    for r in (1, 2):
        clock.completed(r, _c(0, 100), 0, 100)
    assert clock.entry(1, _c(400, 500, seq=1)) == 100 + 600
    assert clock.entry(2, _c(400, 500, seq=1)) == 100 + 300
