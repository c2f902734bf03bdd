"""The live timing model: when a call with virtual members completes.

A virtual peer enters a call at its completion of its previous call in the replay plus
its recorded gap (the time between those two calls in its recording); a call completes
at the latest entry of any member plus the recorded transfer time. Real members' entries
are measured. Recorded times are mapped onto this process's clock once, at the real
rank's first call, using the per-rank clock offsets of the recording.
"""

from __future__ import annotations

__all__ = ["LiveClock"]


class LiveClock:
    """Virtual peers' clocks as seen by one real rank."""

    def __init__(self, me: int, clock_offset: dict[int, int]):
        self.me = me
        self._offset = clock_offset  # rank -> its recorded monotonic clock minus rank 0's
        self._shift: int | None = None  # replay ns = recorded reference ns + shift
        self._last: dict[int, tuple[int, int]] = {}  # virtual rank -> (replay completion, recorded end)

    def anchor(self, live_ns: int, own) -> None:
        """Tie the recording's time line to this process's clock at the first recorded call."""
        if self._shift is None and own is not None:
            self._shift = live_ns - (own.start_ns - self._offset.get(self.me, 0))

    def entry(self, rank: int, rec) -> int | None:
        """When virtual `rank` enters the call it recorded as `rec`, on this clock."""
        if rec is None:
            return None
        last = self._last.get(rank)
        if last is not None:
            done, rec_end = last
            return done + max(0, rec.start_ns - rec_end)
        if self._shift is None:
            return None
        return rec.start_ns - self._offset.get(rank, 0) + self._shift

    def completed(self, rank: int, rec, done_ns: int) -> None:
        if rec is not None and rec.end_ns is not None:
            self._last[rank] = (done_ns, rec.end_ns)
