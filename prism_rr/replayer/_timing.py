"""The timing model: when virtual peers enter calls, and when a call with virtual members completes.

Every time here is on the model clock: this process's monotonic clock with `--timing live`,
a virtual clock with `--timing virtual` (see `_session`). A call completes at the latest
entry of any member plus the recorded transfer time (times `comm_scale`).

A virtual peer's thread is followed from one point of its recording to the next: after
a blocking call it resumes where the call completed in the replay, after an asynchronous
one where that call returned. Its next entry is that point plus the recorded time in
between (its compute, times `compute_scale` and its `slow_rank` factor). An asynchronous
call that had completed in the recording before the peer's next call may have been waited
for: the entry is also no earlier than its replayed completion plus the recorded time
from its completion to that call. Recorded times are mapped onto the model clock once, at
the real rank's first recorded call, using the per-rank clock offsets of the recording.

At each of the real rank's step boundaries the peers are also placed relative to it: a
peer that resumed before the real rank's boundary, in the recording and in the replay,
enters its next call no later than the boundary's model time plus the recorded time from
the real rank's boundary to that entry (negative if the peer was ahead), plus what its
slow_rank factor adds to the gap. Without this, time a peer spent before the boundary in the recording
(step 0's lazy initialisation, a noisy machine) but the real rank did not spend in the
replay is waited for in the next step: the replay's step 0 would leak into its first
scored step. A peer that was late after the boundary in the recording is late here too.

A replaced rank (`replace_rank`, a what-if: _replace.py) enters its first call of the step
it is replaced at that much later, after the step-boundary placement (which would undo
it); its later calls follow from there, so its peers wait for it where they share a call.

A peer is named by a key: its rank, or (many ranks of one role that enter together, see
`_group`) a string "r<rep>" whose records are the representative's. `src` maps a key to
the rank whose recorded clock its records are on. In a bundle written by `scale`, a
synchronous record starts at its last arrival, so its own end - start is its transfer:
`pure_transfer` completes each member at the latest entry plus its own span.
"""

from __future__ import annotations

import time
from time import monotonic_ns

__all__ = ["PeerClock", "sleep_until"]

_SPIN_NS = 1_500_000


def sleep_until(t_ns: int, spin_ns: int = _SPIN_NS) -> None:
    """Sleep, then spin the last `spin_ns`: a thread woken from sleep on a loaded machine can
    be late by milliseconds, a waiting rank must not be."""
    while True:
        left = t_ns - monotonic_ns()
        if left <= 0:
            return
        if left > spin_ns:
            time.sleep((left - spin_ns) / 1e9)


class PeerClock:
    """Virtual peers' clocks as seen by one real rank."""

    def __init__(self, me: int, clock_offset: dict[int, int], *, compute_scale: float = 1.0,
                 slow_rank: dict[int, float] | None = None, comm_scale: float = 1.0,
                 pure_transfer: bool = False, replaced: dict[int, list[tuple[int, int]]] | None = None):
        self.me = me
        self._offset = clock_offset  # rank -> its recorded monotonic clock minus rank 0's
        self._shift: int | None = None  # model ns = recorded reference ns + shift
        self._resume: dict[int, tuple[int, int]] = {}  # virtual rank -> (model ns, its recorded ns)
        self._pending: dict[int, list[tuple[int, int]]] = {}  # rank -> async (model done, recorded end)
        self._boundary: tuple[int, int] | None = None  # the real rank's last step start: (model, recorded ref)
        self.compute_scale = compute_scale
        self.slow_rank = dict(slow_rank or {})
        self.comm_scale = comm_scale
        self.pure_transfer = pure_transfer
        # virtual rank -> [(step, downtime ns)] not yet taken, by step
        self.replaced = {r: sorted(v) for r, v in (replaced or {}).items()}

    def anchor(self, model_ns: int, own) -> None:
        """Tie the recording's time line to the model clock at the first recorded call."""
        if self._shift is None and own is not None:
            self._shift = model_ns - (own.start_ns - self._offset.get(self.me, 0))

    def step_started(self, model_ns: int, recorded_ns: int | None) -> None:
        """The real rank started a step at `model_ns`; in the recording it started it at
        `recorded_ns` (its Step record's end, on its own recorded clock), None if unknown."""
        if recorded_ns is not None:
            self._boundary = (model_ns, recorded_ns - self._offset.get(self.me, 0))

    def _scale(self, rank: int) -> float:
        return self.compute_scale * self.slow_rank.get(rank, 1.0)

    def entry(self, rank, rec, src: int | None = None) -> int | None:
        """When virtual `rank` (a rank or a role key) enters the call it recorded as `rec`
        (`src`'s record), on the model clock."""
        if rec is None:
            return None
        scale = self._scale(rank)
        at = self._resume.get(rank)
        if at is None:
            if self._shift is None:
                return None
            t = rec.start_ns - self._offset.get(rank if src is None else src, 0) + self._shift
            return t + self._down(rank, rec)
        t = at[0] + int(max(0, rec.start_ns - at[1]) * scale)
        pending = self._pending.get(rank)
        if pending:
            keep = []
            for done, end in pending:
                if end <= rec.start_ns:
                    t = max(t, done + int((rec.start_ns - end) * scale))
                else:
                    keep.append((done, end))
            self._pending[rank] = keep
        if self._boundary is not None:
            model_b, ref_b = self._boundary
            off = self._offset.get(rank if src is None else src, 0)
            since = at[1] - off  # the peer's resume point, on the reference clock
            if since < ref_b and at[0] <= model_b:  # it resumed before the boundary, in both
                placed = model_b + (rec.start_ns - off - ref_b) + int(max(0, rec.start_ns - at[1]) * (scale - 1.0))
                t = max(at[0], min(t, placed))
        return t + self._down(rank, rec)

    def _down(self, rank, rec) -> int:
        """The downtime of a replacement of `rank` this call is the first call after (once)."""
        todo = self.replaced.get(rank)
        down = 0
        while todo and rec.step >= todo[0][0]:
            down += todo.pop(0)[1]
        return down

    def completed(self, rank: int, rec, entry_ns: int | None, done_ns: int) -> None:
        """Virtual `rank`'s call `rec`, entered at `entry_ns`, completed at `done_ns`."""
        if rec is None or rec.end_ns is None:
            return
        if rec.async_op and rec.issued_ns is not None and entry_ns is not None:
            self._resume[rank] = (entry_ns + max(0, rec.issued_ns - rec.start_ns), rec.issued_ns)
            self._pending.setdefault(rank, []).append((done_ns, rec.end_ns))
        else:
            self._resume[rank] = (done_ns, rec.end_ns)

    def transfer(self, records) -> int:
        """A call's transfer time: the smallest end - start among the members that recorded
        it (the last member to arrive waits only for the transfer), 0 when none completed."""
        spans = [r.end_ns - r.start_ns for r in records if r is not None and r.end_ns is not None]
        return int(max(0, min(spans)) * self.comm_scale) if spans else 0

    def completion(self, records: dict, entries: dict, src: dict | None = None) -> dict:
        """When each member's call completes: the latest entry plus that member's recorded
        time from the latest recorded entry to its own completion (members of one call
        finish a little apart, as a ring does), times comm_scale; a member without a
        record completes after the shortest recorded span. `src`: key -> the rank whose
        clock offset applies (role keys)."""
        latest = max(entries.values())
        fallback = self.transfer(records.values())
        out = {}
        if self.pure_transfer:
            for m, r in records.items():
                span = r.end_ns - r.start_ns if r is not None and r.end_ns is not None else None
                out[m] = latest + (fallback if span is None else int(max(0, span) * self.comm_scale))
            return out
        src = src or {}
        off = self._offset
        whole = all(r is not None for r in records.values())
        last = max(r.start_ns - off.get(src.get(m, m), 0) for m, r in records.items()) if whole else None
        for m in records:
            r = records.get(m)
            if whole and r is not None and r.end_ns is not None:
                out[m] = latest + int(max(0, r.end_ns - off.get(src.get(m, m), 0) - last) * self.comm_scale)
            else:
                out[m] = latest + fallback
        return out
