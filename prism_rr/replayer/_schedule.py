"""The recorded calls a replay needs, keyed the way an InterceptGroup counts its calls.

A collective is found by (rank, group, seq); a point-to-point call by (rank, group,
direction, peer, seq), where direction is "send" or "recv" and seq counts messages in
that direction between the rank and its peer (FORMAT.md, key 6).
"""

from __future__ import annotations

from prism_rr.format import ops
from prism_rr.format.records import Collective, Marker, PointToPoint, Step
from prism_rr.replayer._hang import recorded_exit

__all__ = ["Schedule", "direction"]


def direction(op: str) -> str:
    """isend, send -> send; irecv, recv -> recv (a schedule's p2p key)."""
    return "recv" if ops.receives(op) else "send"


def _predicted(bundle) -> tuple[frozenset, frozenset]:
    """A bundle made by `prism-rr scale` predicts the shapes of some calls on the groups it
    resized (FSDP pads each shard its own way); there the live shapes are taken: those
    calls' ops, and the groups' ids."""
    scale = bundle.manifest.get("scale") if isinstance(bundle.manifest.get("scale"), dict) else {}
    groups = frozenset(
        gid for g in scale.get("resized_groups", ()) if isinstance(g, dict)
        for gid in range(int(g.get("first_id", 0)), int(g.get("first_id", 0)) + int(g.get("count", 0)))
    )
    return frozenset(scale.get("predicted_shape_ops", ())), groups


class Schedule:
    """Recorded communication calls of some ranks of a bundle, indexed for lookup."""

    def __init__(self, bundle, ranks):
        self.world_size = bundle.world_size
        self.recorded = set(bundle.recorded_ranks)
        self.groups = {g["id"]: tuple(g["ranks"]) for g in bundle.groups}
        self.descs = {g["id"]: str(g.get("desc") or "") for g in bundle.groups}
        self._calls: dict[tuple, object] = {}
        self.windowed: dict[int, bool] = {}
        # A bundle `import fr` made of Flight Recorder dumps: each rank's calls from the
        # middle of the run (its ring) to its dump, no command, data or steps.
        imported = bundle.manifest.get("imported")
        self.imported = isinstance(imported, dict) and imported.get("from") == "flight_recorder"
        # How the recording ends (the end of a hang, see _hang.py): each rank's last call,
        # the calls it entered and never completed, its last seq per group and how it ended.
        self.last: dict[int, Collective | PointToPoint] = {}
        self.pending: dict[int, list[Collective | PointToPoint]] = {}
        self.exits: dict[int, dict] = {}
        self._last_seq: dict[tuple, int] = {}  # (rank, group) or p2p's (rank, group, way, peer) -> last seq
        self.first_seq: dict[int, int] = {}  # group -> the lowest collective seq recorded on it
        # A call that ended in an error (the recorder's call_failed marker, written right
        # after the call's record): its key -> the error as recorded ("op: Type: message").
        self.failed: dict[tuple, str] = {}
        self.p2p_recorded: set[int] = set()  # ranks with a point-to-point call in the recording
        self.clock_offset: dict[int, int] = {}
        self.step_ends: dict[int, dict[int, int]] = {}  # rank -> step -> its Step record's end
        self.predicted_ops, self.predicted_groups = _predicted(bundle)  # shapes `scale` predicted
        reference_host = bundle.rank_info(0).get("hostname")
        for rank in sorted(set(ranks) & self.recorded):
            self._load_info(rank, bundle.rank_info(rank), reference_host)
            self._load_calls(rank, bundle.events(rank))

    def _load_info(self, rank: int, info: dict, reference_host) -> None:
        """What the schedule keeps of a rank's rank info: whether it recorded some steps
        only, its clock's offset, and how its program ended."""
        self.windowed[rank] = info.get("steps") is not None
        clock = info.get("clock_offset")
        offset = int(clock.get("offset_ns", 0)) if isinstance(clock, dict) else 0
        if reference_host is not None and info.get("hostname") == reference_host:
            # One host has one monotonic clock: the measured offset is only its error
            # (milliseconds on a loaded machine).
            offset = 0
        self.clock_offset[rank] = offset
        how = recorded_exit(info)
        if how is not None:
            self.exits[rank] = how

    def _load_calls(self, rank: int, events) -> None:
        """Index a rank's calls by their keys, with the failures recorded right after them,
        and keep its steps' ends."""
        ends = self.step_ends[rank] = {}
        key = None  # the last call's
        for rec in events:
            if isinstance(rec, Collective):
                key = (rank, rec.group, rec.seq)
                self._calls[key] = rec
                self._note(rank, rec, (rank, rec.group))
                self.first_seq[rec.group] = min(rec.seq, self.first_seq.get(rec.group, rec.seq))
            elif isinstance(rec, PointToPoint):
                key = (rank, rec.group, direction(rec.op), rec.peer, rec.seq)
                self._calls[key] = rec
                self._note(rank, rec, (rank, rec.group, direction(rec.op), rec.peer))
                self.p2p_recorded.add(rank)
            elif (isinstance(rec, Marker) and rec.name == "call_failed" and key is not None
                  and rec.value == key[-1]):
                self.failed[key] = rec.text or ""
            elif isinstance(rec, Step) and rec.end_ns is not None:
                ends[rec.step] = rec.end_ns

    def _note(self, rank: int, rec, key: tuple) -> None:
        """Keep what the end of the recording needs of a call: whether it is the rank's
        last, and whether it was entered and never completed."""
        self._last_seq[key] = max(rec.seq, self._last_seq.get(key, rec.seq))
        last = self.last.get(rank)
        if last is None or rec.start_ns >= last.start_ns:
            self.last[rank] = rec
        if rec.end_ns is None:
            self.pending.setdefault(rank, []).append(rec)

    @classmethod
    def for_real_ranks(cls, bundle, real, roles=None) -> Schedule:
        """Load the real ranks and every rank that shares a group with one of them; with
        `roles` (a sliced or scaled bundle), the representatives of those ranks' roles
        only: a virtual rank replays its representative's records."""
        real = set(real)
        if roles is None:
            need = set(real)
            for g in bundle.groups:
                if need & set(g["ranks"]):
                    need |= set(g["ranks"])
            return cls(bundle, need)
        recorded = set(bundle.recorded_ranks)
        need = set(real)
        for g in bundle.groups:
            ranks = g["ranks"]
            if any(r in ranks for r in real):
                if len(need & recorded) >= len(recorded):
                    break
                need |= {roles.rep(x) for x in ranks}  # once, at set-up
        return cls(bundle, need & (recorded | real))

    def collective(self, rank: int, group: int, seq: int) -> Collective | None:
        return self._calls.get((rank, group, seq))

    def p2p(self, rank: int, group: int, way: str, peer: int, seq: int) -> PointToPoint | None:
        return self._calls.get((rank, group, way, peer, seq))

    def last_seq(self, rank: int, group: int, way: str | None = None, peer: int | None = None) -> int:
        """The last seq `rank` recorded on `group` (collectives, or with `way` and `peer` its
        messages that way to or from `peer`); -1 where it recorded none."""
        key = (rank, group) if way is None else (rank, group, way, peer)
        return self._last_seq.get(key, -1)

    def failure(self, key: tuple) -> str | None:
        """The error the recorded call `key` ended in ("op: Type: message"): (rank, group,
        seq) for a collective, (rank, group, direction, peer, seq) for a message."""
        return self.failed.get(key)

    def shape_predicted(self, group: int, op: str) -> bool:
        """Were this call's shapes predicted by `scale` rather than recorded?"""
        return group in self.predicted_groups and op in self.predicted_ops

    def has(self, rank: int) -> bool:
        return rank in self.windowed

