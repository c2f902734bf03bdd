"""The end of a recorded hang or failure, as a replayed rank meets it.

A recording of a hang (a Flight Recorder dump, flight mode's dump on a hang, a windowed
recording) ends with ranks waiting in calls that another rank never joined. A real rank
replayed against it reaches that end in one of three ways:

- it makes a call it made in the recording, which a virtual peer never entered there:
  the replay stops at that call (exit 7) and names the peers that never joined, with the
  last call each made in the recording (and its stack) and how its program ended;
- its program ends while a virtual peer waits in a call with it that it never made: it
  is the rank they wait for (exit 7);
- it makes a call it never made in the recording, which completes one that every
  virtual member entered and never completed: a fix, tried against the recording. The
  hang is resolved; those peers go on past the end of their recording, where nothing is
  left to check them against, and the replay goes on.

A recording that ended in a failure ends its replay the same way, at the same call (exit 7):

- a drift (diagnose's: a rank made a call fewer, or more, in a step and from there on its
  calls pair with the wrong ones): a real rank stops at the first mispaired call; the rank
  that drifted, replayed with a fix (it makes the call it skipped), goes on, its calls
  checked against the rank it pairs with;
- a mismatch (diagnose's: members passed different shapes): a real member stops there;
- a call that ended in an error in the recording (gloo's timeout, a peer gone): the real
  rank's call raises that error again, and its program goes the way it went;
- a call this rank entered and never completed (its peer killed, crashed or stuck in it):
  the replay stops there, naming each peer's end;
- a call past the end of this rank's recording, where its program failed or was killed
  before making it: the replay stops there.

What a replay found is a plain dict (it travels from the rank to the launcher as JSON);
`sentence` says it to people, every string from the bundle shown safely.
"""

from __future__ import annotations

from prism_rr.format import ops
from prism_rr.format.facts import crash_reason
from prism_rr.format.records import Collective, PointToPoint
from prism_rr.text import quoted, shown

# Deferred imports: torch.distributed until `raised` makes a recorded failure's exception
# in a replayed rank; the launcher words its verdicts from this module without torch.

__all__ = ["RecordingEnd", "failed", "raised", "recorded_exit", "sentence"]

NEVER_JOINED = "never_joined"  # virtual peers never joined the call this rank waits in
WAITED_FOR = "waited_for"  # this rank's program ended without calls its peers wait in
RESOLVED = "resolved"  # this rank's call completed one every virtual member waited in
DRIFTED = "drifted"  # this rank's call is the first to pair with the wrong one (diagnose's drift)
MISMATCHED = "mismatched"  # this rank's call is one whose members disagreed (diagnose's mismatch)
FAILED = "failed"  # this rank's call ended in an error in the recording, and raises it again
NEVER_COMPLETED = "never_completed"  # this rank entered the call and never completed it
ENDED = "ended"  # this rank's program failed or was killed before making this call


class RecordingEnd:
    """Where each rank's recording ends, for the calls a real rank makes near it: who
    never joined a call, who waits in one, and the peers a resolved hang let go on."""

    def __init__(self, schedule):
        self._schedule = schedule
        self.released: set[int] = set()  # peers past the end of their recording

    def _open(self, peer: int) -> bool:
        """A peer recorded here, still held to its recording."""
        return self._schedule.has(peer) and peer not in self.released

    def never_joined(self, peers, gid: int, seq: int, own) -> list[int]:
        """The peers that never entered collective (gid, seq), which this rank recorded as
        `own`: none of their records on the group is that call or a later one (see `_held`)."""
        sched = self._schedule
        return [p for p in peers if self._open(p) and sched.collective(p, gid, seq) is None
                and sched.last_seq(p, gid) < seq and self._held(own, p)]

    def never_answered(self, peer: int, gid: int, way: str, me: int, seq: int, own) -> bool:
        """Whether `peer` never made its side of message `seq` (`way` is this rank's
        direction: the peer's is the other), which this rank recorded as `own`."""
        sched = self._schedule
        other = "send" if ops.receives(way) else "recv"
        return (self._open(peer) and sched.p2p(peer, gid, other, me, seq) is None
                and sched.last_seq(peer, gid, other, me) < seq and self._held(own, peer))

    def _held(self, own, peer: int) -> bool:
        """Whether a call a peer never joined held this rank: it never completed in the
        recording, or it ended as the peer's program had (in an error, at best). A
        completed call whose peer's recording just ends sooner (a window's edge) is none."""
        return own.end_ns is None or self.ended(peer)

    def ended(self, peer: int) -> bool:
        """Whether `peer`'s program failed in the recording, or waits in a call at its end."""
        last = self._schedule.last.get(peer)
        return failed(self._schedule.exits.get(peer)) or (last is not None and last.end_ns is None)

    def waiting_in(self, peers, gid: int, seq: int) -> list | None:
        """The records of collective (gid, seq) of `peers` when every one of them entered
        it and never completed it in the recording; else None."""
        recs = []
        for p in peers:
            rec = self._schedule.collective(p, gid, seq) if self._open(p) else None
            if rec is None or rec.end_ns is not None:
                return None
            recs.append(rec)
        return recs or None

    def past_end(self, peers) -> bool:
        """Whether every one of `peers` went on past the end of its recording."""
        return bool(peers) and all(p in self.released for p in peers)

    def release(self, peers) -> None:
        self.released.update(peers)

    # --- who waits for whom --------------------------------------------------------

    def waits_for(self, peer: int, me: int, made: dict) -> list:
        """The calls `peer` entered with rank `me` and never completed in the recording,
        which `me` has not made (`made`: this rank's next seq per group, and per group,
        direction and peer for messages)."""
        if not self._open(peer):
            return []
        sched = self._schedule
        out = []
        for rec in sched.pending.get(peer, ()):
            if type(rec) is Collective:
                if me in sched.groups.get(rec.group, ()) and made.get((rec.group,), 0) <= rec.seq:
                    out.append(rec)
            elif type(rec) is PointToPoint and rec.peer == me:
                mine = "send" if ops.receives(rec.op) else "recv"
                if made.get((rec.group, mine, peer), 0) <= rec.seq:
                    out.append(rec)
        return out

    def peer_end(self, peer: int, me: int, made: dict) -> dict:
        """Where `peer`'s recording ends: its last call, whether that call waits for `me`,
        and how its program ended where the recording says."""
        sched = self._schedule
        last = sched.last.get(peer)
        how = sched.exits.get(peer, {})
        out = {"rank": peer, "last": None if last is None else self.call(last), "exit": None}
        if last is not None:
            out["waits_for_this_rank"] = any(r is last for r in self.waits_for(peer, me, made))
        if isinstance(how.get("how"), str) and how.get("code") != 0:
            out["exit"] = how["how"]
        return out

    def call(self, rec) -> dict:
        """A recorded call as the report names it."""
        out = {"op": rec.op, "group": rec.group, "desc": self._schedule.descs.get(rec.group, ""), "seq": rec.seq,
               "completed": rec.end_ns is not None, "stack": list(rec.stack or ())}
        if type(rec) is PointToPoint:
            out["peer"] = rec.peer
        return out

    def live(self, gid: int, seq: int, op: str, stack, peer: int | None = None) -> dict:
        """A call the real rank makes, as the report names it."""
        out = {"op": op, "group": gid, "desc": self._schedule.descs.get(gid, ""), "seq": seq, "stack": list(stack)}
        if peer is not None:
            out["peer"] = peer
        return out


# --- for people -------------------------------------------------------------------------


def _names(ranks) -> str:
    ranks = list(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _call(c: dict) -> str:
    """all_reduce (group 1 'row', seq 3) at train.py:74 in <module>"""
    desc = f" {quoted(c['desc'], 60)}" if c.get("desc") else ""
    peer = f", peer {c['peer']}" if c.get("peer") is not None else ""
    words = f"{shown(c['op'], 60)} (group {c['group']}{desc}, seq {c['seq']}{peer})"
    stack = c.get("stack") or ()
    return words + (f" at {shown(stack[0])}" if stack else "")


def _peer_end(p: dict) -> str:
    last = p.get("last")
    if last is None:
        text = f"rank {p['rank']} made no call in the recording"
    else:
        state = "completed" if last["completed"] else "entered and never completed"
        text = f"rank {p['rank']}'s last call was {_call(last)}, {state}"
        if p.get("waits_for_this_rank"):
            text += ": it waits there for this rank, which has not made that call"
    if p.get("exit"):
        text += f", and then its program ended ({shown(p['exit'])})"
    return text


def recorded_exit(info) -> dict | None:
    """How a rank's program ended in the recording: its rank info's `exit`, else its
    crash file's signal ({"signal": faulthandler's words, "how": "crashed: ..."}), else
    None (no word: SIGKILL, os._exit, a Flight Recorder dump)."""
    how = info.get("exit") if isinstance(info, dict) else None
    if isinstance(how, dict):
        return how
    reason = crash_reason(info.get("crash")) if isinstance(info, dict) else None
    return {"signal": reason, "how": f"crashed: {reason}"} if reason is not None else None


def failed(how) -> bool:
    """Whether a rank info's `exit` (or the crash that stands for it) says its program
    failed or was stopped by a signal."""
    return isinstance(how, dict) and (how.get("code") not in (0, None) or "signal" in how)


def raised(text: str) -> BaseException:
    """The exception a recorded call_failed marker ("op: Type: message") names, to raise
    again in the program: torch.distributed's own type where it has that name (gloo's
    errors are DistBackendError, a RuntimeError), else RuntimeError."""
    import torch.distributed as dist

    _, _, rest = text.partition(": ")
    name, _, message = rest.partition(": ")
    cls = getattr(dist, name, None) if name.isidentifier() else None
    if not (isinstance(cls, type) and issubclass(cls, RuntimeError)):
        cls, message = RuntimeError, rest or text
    return cls(f"{message} [prism-rr replay: this call ended in this error in the recording]")


def _ended(h: dict) -> str | None:
    rank, kind, peers = h["rank"], h["kind"], h.get("peers") or []
    ends = "; ".join(_peer_end(p) for p in peers)
    ends = f"; {ends}" if ends else ""
    if kind == DRIFTED:
        return (f"drift reproduced: rank {rank}'s {_call(h['call'])} pairs with the wrong call, as in the "
                f"recording. {shown(h['finding'], 2000)}")
    if kind == MISMATCHED:
        return (f"mismatch reproduced: rank {rank}'s {_call(h['call'])} is the call whose members disagreed in "
                f"the recording. {shown(h['finding'], 2000)}")
    if kind == FAILED:
        return (f"call failed as in the recording: rank {rank}'s {_call(h['call'])} ended in an error there "
                f"({shown(h['error'], 300)}), and raises it again{ends}.")
    if kind == NEVER_COMPLETED:
        return f"hang: rank {rank}'s {_call(h['call'])} never completed in the recording{ends}."
    if kind == ENDED:
        return (f"the recording ends here: rank {rank}'s program ended ({shown(h['exit'], 300)}) before "
                f"{_call(h['call'])} in the recording.")
    return None


def sentence(h: dict) -> str:
    """What a replay found at the end of a recorded hang or failure, in one sentence for people."""
    rank, kind = h["rank"], h["kind"]
    peers = h.get("peers") or []
    text = _ended(h)
    if text is not None:
        return text
    if kind == NEVER_JOINED:
        ends = "; ".join(_peer_end(p) for p in peers)
        return (f"hang: rank {rank}'s {_call(h['call'])} waits for {_names(p['rank'] for p in peers)}, "
                f"which never joined it in the recording; {ends}.")
    if kind == WAITED_FOR:
        waits = [(p["rank"], c) for p in peers for c in p["calls"]]
        if len(waits) == 1:
            peer, c = waits[0]
            return (f"hang: rank {rank} is the rank they wait for: its program ended without {_call(c)}, which "
                    f"rank {peer} entered and never completed in the recording.")
        calls = "; ".join(f"rank {peer} in {_call(c)}" for peer, c in waits)
        return (f"hang: rank {rank} is the rank they wait for: its program ended without the calls its peers "
                f"entered and never completed in the recording: {calls}.")
    return (f"hang resolved: rank {rank}'s {_call(h['call'])} completes the call "
            f"{_names(p['rank'] for p in peers)} entered and never completed in the recording; past it "
            f"the recording ends, and the calls after it are answered without checking.")
