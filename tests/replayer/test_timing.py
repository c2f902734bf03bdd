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


def test_a_step_boundary_places_peers_relative_to_the_real_rank():
    """Step 0 ran 500 ns faster in the replay than recorded (lazy set-up, a noisy machine):
    a peer's recorded tail of step 0 is not waited for in step 1, but its recorded
    lateness after the boundary still is."""
    clock = PeerClock(0, {0: 0, 1: 0, 2: 0, 3: 0})
    clock.anchor(0, _c(0, 10))
    for r in (1, 2):
        clock.completed(r, _c(0, 100), 0, 100)  # the last call of step 0, completed at 100
    # recorded: the real rank's step 0 ended at 900; the replay's at 400
    clock.step_started(400, 900)
    on_time, late = _c(1_000, 1_100, seq=1), _c(1_300, 1_400, seq=1)
    assert clock.entry(1, on_time) == 400 + 100  # not 100 + 900: step 0's tail is gone
    assert clock.entry(2, late) == 400 + 400  # 400 ns after the boundary, as recorded
    clock.completed(3, _c(0, 100), 0, 100)
    ahead = _c(850, 900, seq=1)  # recorded 50 ns before the real rank's boundary
    assert clock.entry(3, ahead) == 400 - 50


def test_a_step_boundary_never_makes_a_peer_earlier_than_its_chain():
    clock = PeerClock(0, {})
    clock.anchor(0, _c(0, 10))
    clock.completed(1, _c(0, 100), 0, 100)
    clock.step_started(5_000, 900)  # the real rank's step 0 ran long in the replay
    assert clock.entry(1, _c(1_000, 1_100, seq=1)) == 100 + 900  # the peer does not wait for it
    clock.completed(2, _c(0, 100), 0, 6_000)  # completed after the boundary's model time
    assert clock.entry(2, _c(1_000, 1_100, seq=1)) >= 6_000


def test_a_slow_peer_keeps_its_stretch_across_a_boundary():
    clock = PeerClock(0, {}, slow_rank={1: 2.0})
    clock.anchor(0, _c(0, 10))
    clock.completed(1, _c(0, 100), 0, 100)
    clock.step_started(400, 900)  # recorded: 800 ns of tail before the boundary, 100 after
    assert clock.entry(1, _c(1_000, 1_100, seq=1)) == 400 + 200 + 800
