"""The replay policy: a real rank's view of a group whose other members may be virtual.

Every torch entry point reaches it through the InterceptGroup with the same op names and
sequence numbers as in the recording. For each call the policy finds the recorded call
of this rank at (group, seq), checks it, builds the result and completes it when the live
timing model says so:

- a group whose members are all real forwards to a real gloo group, as in production;
- otherwise the real members exchange their inputs over a gloo group of just them, the
  virtual members contribute their recorded inputs (or are taken as replicas of this
  rank), and the outputs are this rank's recorded outputs whenever they were recorded
  and the inputs matched (so a `full` recording is followed bit for bit).
"""

from __future__ import annotations

import logging
from copy import copy
from dataclasses import replace
from time import monotonic_ns

import torch
from torch._C._distributed_c10d import AllgatherOptions

from prism_rr.analysis import call_divergence
from prism_rr.errors import DivergenceError
from prism_rr.format import ops
from prism_rr.format.blobs import blob_id
from prism_rr.format.fr import entry_views
from prism_rr.format.records import Collective, PointToPoint
from prism_rr.intercept.group import Policy, completed_work
from prism_rr.intercept.payload import describe, digests, host_bytes
from prism_rr.replayer._data import build_grouped, build_outputs, from_blob, from_bytes, plausible, write
from prism_rr.replayer._divergence import user_stack
from prism_rr.replayer._hang import (DRIFTED, ENDED, FAILED, MISMATCHED, NEVER_COMPLETED, NEVER_JOINED, RESOLVED,
                                     failed)
from prism_rr.replayer._options import BACKEND
from prism_rr.replayer._schedule import direction

log = logging.getLogger("prism_rr.replayer")

__all__ = ["Absent", "ReplayPolicy"]


class Absent:
    """Stands for the real backend of a group with virtual members: nothing is forwarded."""

    def name(self) -> str:
        return BACKEND  # no backend type: nothing is registered with torch for it

    def __getattr__(self, attr):
        def absent(*args, **kwargs):
            raise RuntimeError(f"prism-rr replay: {attr} has no real backend in a group with virtual members")

        return absent


def _shapes(x) -> tuple:
    return tuple(tuple(s) for s in x)


def _data_fields(own):
    """The fields of a call's input data the recording has to compare with: (its digests'
    field or None, its payload ids' field or None); None where it has neither (a receive's
    data is the sender's to check)."""
    if isinstance(own, PointToPoint):
        if ops.receives(own.op):
            return None
        names = ("digest", "blob")
    else:
        names = ("digest_in", "blob_in")
    dig, blob = (name if getattr(own, name) is not None else None for name in names)
    return (dig, blob) if dig or blob else None


def _filled(live, fields, digests_of, blobs_of):
    """`live` with the data fields `fields` (_data_fields) set: digests_of() and blobs_of()
    (the values, per tensor) called only for the fields there are."""
    dig, blob = fields
    changes = {}
    if dig:
        changes[dig] = tuple(digests_of())
    if blob:
        changes[blob] = tuple(blobs_of())
    return replace(live, **changes)


def _report(s, gid: int, seq: int, op: str, d, stack=None, *, own=None, ins=None) -> None:
    """Session.diverge with a divergence's values as the report shows them; a data
    divergence, where the bundle holds the recorded bytes of the inputs (`own`, the live
    ones `ins`), with the first elements that differ."""
    expected, got = d.expected, d.got
    if d.topic == "data":
        expected, got = _hex(expected), _hex(got)
        detail = _differences(s.bundle, own, ins) if own is not None and ins is not None else None
        if detail:
            got = f"{got}: {detail}"
    elif d.field.endswith("shapes"):
        expected, got = _shapes(expected), _shapes(got)
    s.diverge(gid, seq, op, _REPORTED.get(d.field, d.field), expected, got, stack)


_SHAPE_FIELDS = {Collective: ("in_shapes", "out_shapes"), PointToPoint: ("shapes",)}
_FROM_ROOT = ("copy_root", "scatter_root")  # forms whose outputs are the root's data alone
_REPORTED = {"blob_in": "payload_in", "blob": "payload"}  # a divergence's field, as the report names it


class ReplayPolicy(Policy):
    """One group of the recorded world as one real rank replays it."""

    forwards = False  # every call is checked against the bundle

    def __init__(self, session, gid: int, ranks, *, real_pg, all_real: bool):
        self._session = session
        self._real_pg = real_pg  # gloo among the real members, or None when this rank is alone
        self._all_real = all_real
        real_ranks = set(session.real)
        self._real_members = [g for g in ranks if g in real_ranks]  # global ranks, group order
        # The virtual members recorded in this replay's schedule, whose recordings may end in
        # a hang (_hang.py): listed once, for a group of thousands of virtual ranks has few.
        virtual = [g for g in ranks if g not in real_ranks]
        self._watched = [g for g in virtual if session.schedule.has(g)]
        self._all_watched = len(self._watched) == len(virtual)
        self._sub = {g: i for i, g in enumerate(self._real_members)}  # global rank -> rank in real_pg
        self._peers = _peer_classes(session, gid, ranks, real_ranks)
        self._single = all(len(c.positions) == 1 for c in self._peers)
        self._srcs = {c.key: c.src for c in self._peers if c.key != c.src}  # timing key -> clock of
        self._dump_shift = 0  # a Flight Recorder dump's seq of this group's next call, less the program's
        self._shapes_only = False  # the next call is checked against another rank's record (_drifted)
        # The last small non-floating message this rank sent each virtual peer, by
        # (peer, dtypes, shapes): a handshake's answer when the bundle lacks it (_echo).
        self._sent: dict[tuple, list] = {}

    def shutdown(self, group) -> None:
        if self._real_pg is not None and hasattr(self._real_pg, "shutdown"):
            self._real_pg.shutdown()
        self.release()

    def release(self) -> None:
        """Let go of the gloo group among the real members now, on this thread, while the
        interpreter is whole: left to the interpreter's teardown, its destruction order is
        chance (an abort, "terminate called without an active exception", was seen there).
        An all-real group's backend is torch's too, and torch lets go of it."""
        if self._real_pg is not None and not self._all_real:
            pg, self._real_pg = self._real_pg, None
            try:
                if hasattr(pg, "shutdown"):
                    pg.shutdown()
            except Exception:
                pass

    def abort(self, group) -> None:
        if self._real_pg is not None and hasattr(self._real_pg, "abort"):
            self._real_pg.abort()

    # --- every call ---------------------------------------------------------------

    def run(self, group, call):
        s = self._session
        entry = s.enter()
        if s.schedule.imported and not call.p2p:
            call = self._numbered_as_dumped(call)
        s.made_call((group.gid, direction(call.op), call.peer) if call.p2p else (group.gid,), call.seq)
        try:
            s.footprint_due = 0
            out = s.aside(self._p2p if call.p2p else self._collective, group, call, entry)
            if s.footprint_due:  # what the backend held on the program's thread, in the program's memory
                s.transient(s.footprint_due)
            return out
        finally:
            s.returned()

    def _numbered_as_dumped(self, call):
        """The call under the seq a Flight Recorder dump gives it: after a call that takes
        more of its recorder's numbers than one (ops.FR_SEQS: gloo's monitored_barrier,
        two, and no entry), this group's calls are further on in the dump than the
        program counts them."""
        numbered = call
        if self._dump_shift:
            numbered = copy(call)  # the observer's call keeps the program's count
            numbered.seq = call.seq + self._dump_shift
        self._dump_shift += ops.FR_SEQS.get(call.op, 1) - 1
        return numbered

    def _check(self, group, call, own, live) -> bool:
        """Compare the live call (`live`: a record of what the program passed, without
        data) with the recorded one by the one rule (analysis.call_divergence); True when
        the inputs are known to match."""
        s = self._session
        gid, seq, op = group.gid, call.seq, call.op
        s.check_read()  # the calls before whose inputs the device has passed since
        if own is None:
            self._unrecorded(group, call, live)
            return False
        if s.schedule.imported:  # a Flight Recorder dump: as its backend wrote the call
            d = _dump_divergence(own, live, group.size())
            if d is not None:
                s.diverge(gid, seq, op, d.field, _shown_value(d.field, d.expected), _shown_value(d.field, d.got))
            return False
        # `scale` predicted this call's shapes (FSDP2 pads each parameter's dim 0 to a
        # multiple of the group size, which the recording cannot tell): the live shapes
        # stand, the call is counted and its differences reported.
        predicted = s.schedule.shape_predicted(gid, own.op)
        # Data made up for virtual peers has flowed into this rank's numerics once it is
        # synthetic: its tensors can no longer match the recorded digests, only shapes can.
        data = not s.synthetic and not self._shapes_only and not s.inputs_made_up
        self._shapes_only = False
        later = None
        fields = _data_fields(own) if data else None
        if fields is not None:
            ins = call.ins
            later = s.reads_for(ins)
            if later is None:  # read at once (a digest reads every byte: only where compared)
                live = _filled(live, fields, lambda: digests(ins), lambda: (blob_id(host_bytes(t)) for t in ins))
        d = call_divergence(own, live, data=data and later is None, shapes=not predicted)
        if d is not None:
            _report(s, gid, seq, op, d, own=own, ins=call.ins)
            return False
        if later is not None:
            # the inputs as the device will have them once the backend's turn comes: read
            # behind an event, compared when it has passed (Session.check_read); the
            # recorded outputs stand meanwhile, as for inputs that match
            later.take((self._checked, gid, seq, op, own, live, fields, predicted, user_stack()), call.ins,
                       whole=fields[1] is not None)
        if predicted:
            pairs = ((name, _shapes(getattr(own, name)), _shapes(getattr(live, name)))
                     for name in _SHAPE_FIELDS[type(own)])
            diffs = [{"field": name, "predicted": str(want), "live": str(got)}
                     for name, want, got in pairs if want != got]
            s.shapes_predicted(gid, op, seq, diffs)
            if diffs:
                return False
        return True

    def _unrecorded(self, group, call, live) -> None:
        """A call this rank did not make in the recording. One that completes a call every
        virtual member entered and never completed resolves a recorded hang; before a
        recording's window, past the end of a resolved hang, and where a Flight Recorder
        dump holds no entry for it, it is answered without checking; else it diverges."""
        s = self._session
        sched = s.schedule
        gid, seq = group.gid, call.seq
        waiting = None if call.p2p or not self._all_watched else s.ends.waiting_in(self._watched, gid, seq)
        if waiting:
            self._resolve(group, call, live, waiting)
        elif sched.windowed.get(s.rank, False) or (self._all_watched and s.ends.past_end(self._watched)):
            return
        elif sched.imported and _outside_dump(sched, s.rank, gid, seq, call.p2p):
            return
        elif gid in s.drift_fixed:  # past the end of the calls of the rank it now pairs with
            return
        elif failed(sched.exits.get(s.rank)) and not self._all_real:
            s.stop_at_hang({"kind": ENDED, "rank": s.rank, "exit": str(sched.exits[s.rank].get("how") or "failed"),
                            "call": s.ends.live(gid, seq, call.op, user_stack(),
                                                peer=call.peer if call.p2p else None)})
        else:
            s.diverge(gid, seq, call.op, "call", "no such call (the recording ends before it)", call.op)

    def _resolve(self, group, call, live, waiting: list) -> None:
        """This rank's call completes one that every virtual member waits in: the recorded
        hang is resolved, if the call is the one they wait in."""
        s = self._session
        rec = waiting[0]
        if s.schedule.imported:
            d = _dump_divergence(rec, live, group.size())
        else:
            d = call_divergence(rec, live, shapes=not s.schedule.shape_predicted(group.gid, rec.op))
        if d is not None:
            s.diverge(group.gid, call.seq, call.op, d.field, _shown_value(d.field, d.expected),
                      _shown_value(d.field, d.got))
            return
        peers = [{"rank": p, "call": s.ends.call(r)} for p, r in zip(self._watched, waiting)]
        s.resolve({"kind": RESOLVED, "rank": s.rank, "peers": peers,
                   "call": s.ends.live(group.gid, call.seq, call.op, user_stack())})

    def _drifted(self, group, call, own):
        """A call on a group where the recording drifted (diagnose's drift: a rank made a
        call fewer, or more, in a step, and from there on its calls paired with the wrong
        ones). A real member other than the rank that drifted stops at the first mispaired
        call, as the recording went. The rank that drifted, from the step it drifted in, is
        held to the rank it pairs with (the drift's reference): where that rank made the
        same call in the same step, the pairing is right (its data is another rank's, so
        only op and shapes are checked), and a program that pairs right past the drift is
        fixed: past the reference's calls it is answered without checking; where the
        reference's call is in another step, the pairing is wrong, as it was: it stops.
        Returns the record the call is checked against."""
        s = self._session
        gid, seq = group.gid, call.seq
        fixed = s.drift_fixed.get(gid)
        if fixed is not None:
            self._shapes_only = True
            return s.schedule.collective(fixed["reference"], gid, seq)
        for e in s.endings[gid]:
            ref = e.get("reference")
            if e["kind"] != "drift" or ref is None or not isinstance(e.get("step"), int):
                continue
            drifted = e["ranks"][0]
            if s.rank != drifted:
                if seq >= e["seq"]:
                    self._stop_drifted(e, gid, seq, call.op)
                continue
            if s.step < e["step"]:
                continue
            theirs = s.schedule.collective(ref, gid, seq)
            if theirs is None or theirs.step != s.step:
                self._stop_drifted(e, gid, seq, call.op)
            self._shapes_only = True
            if seq >= e["seq"]:
                s.drift_fixed[gid] = e
                s.made_up()
                log.warning("prism-rr: rank %d pairs right where the recording drifted (group %d, seq %d): the "
                            "drift is fixed; its calls on the group are checked against rank %d's from here on",
                            s.rank, gid, seq, ref)
            return theirs
        return own

    def _stop_drifted(self, e: dict, gid: int, seq: int, op: str) -> None:
        s = self._session
        s.stop_at_hang({"kind": DRIFTED, "rank": s.rank, "finding": e["message"], "drift": e,
                        "call": s.ends.live(gid, seq, op, user_stack())})

    def _recorded_end(self, group, call, own, key: tuple) -> None:
        """Where this rank's recording fails at this call: a mismatch among its members,
        an error the call ended in (raised again), or a call it never completed."""
        s = self._session
        gid, seq = group.gid, call.seq
        peer = call.peer if call.p2p else None
        if not call.p2p:
            for e in s.endings.get(gid, ()):
                if e["kind"] == "mismatch" and e["seq"] == seq:
                    s.stop_at_hang({"kind": MISMATCHED, "rank": s.rank, "finding": e["message"],
                                    "call": s.ends.live(gid, seq, call.op, user_stack())})
        error = s.schedule.failure(key)
        if error is None and own.end_ns is not None:
            return  # every call but the last few: no stack walked for them
        live = s.ends.live(gid, seq, call.op, user_stack(), peer=peer)
        # the peers whose recording ends here: failed or killed, or no call on the group after this one
        members = [peer] if call.p2p else [g for g in group.ranks if g != s.rank and g not in s.real]
        ends = [s.ends.peer_end(p, s.rank, s.made) for p in members
                if s.schedule.has(p) and (s.ends.ended(p) or s.schedule.last_seq(p, gid) <= seq)]
        for e in ends:
            if e["exit"] is None and e["rank"] not in s.schedule.exits and not s.schedule.imported:
                e["exit"] = "no word: killed by SIGKILL, or os._exit"  # its records just end
        if error is not None:
            s.fail_as_recorded({"kind": FAILED, "rank": s.rank, "error": error, "call": live, "peers": ends})
        s.stop_at_hang({"kind": NEVER_COMPLETED, "rank": s.rank, "call": live, "peers": ends})

    def _joined(self, group, call, peers) -> None:
        """Stop at the end of a recorded hang: a call this rank made in the recording that
        a virtual peer never joined there (with `peers` the ones that never did)."""
        s = self._session
        if not peers:
            return
        ends = [s.ends.peer_end(p, s.rank, s.made) for p in peers]
        s.stop_at_hang({"kind": NEVER_JOINED, "rank": s.rank, "peers": ends,
                        "call": s.ends.live(group.gid, call.seq, call.op, user_stack(),
                                            peer=call.peer if call.p2p else None)})

    def _checked(self, read) -> None:
        """A call's inputs read once the device passed them (Session.check_read): compared
        with the recording as _check compares inputs read at once."""
        _, gid, seq, op, own, live, fields, predicted, stack = read.key
        live = _filled(live, fields, read.digests, lambda: map(blob_id, read.datas()))
        d = call_divergence(own, live, data=True, shapes=not predicted)
        if d is not None:
            _report(self._session, gid, seq, op, d, stack)

    # --- collectives --------------------------------------------------------------

    def _collective(self, group, call, entry):
        s = self._session
        own = s.schedule.collective(s.rank, group.gid, call.seq)
        if s.endings.get(group.gid) and not self._all_real:
            own = self._drifted(group, call, own)
        s.clock.anchor(entry, own)
        in_shapes, in_dtypes, _ = describe(call.ins)
        out_shapes, out_dtypes, _ = describe(call.outs)
        live = Collective(start_ns=0, end_ns=0, step=s.step, op=call.op, group=group.gid, seq=call.seq,
                          in_shapes=_shapes(in_shapes), in_dtypes=tuple(in_dtypes), out_shapes=_shapes(out_shapes),
                          out_dtypes=tuple(out_dtypes), reduce_op=call.reduce_op, root=call.root)
        matched = self._check(group, call, own, live)
        if own is not None and group.gid not in s.drift_fixed:
            self._joined(group, call, s.ends.never_joined(self._watched, group.gid, call.seq, own))
            if not self._all_real:
                self._recorded_end(group, call, own, (s.rank, group.gid, call.seq))
        if self._all_real:
            return self._real_call(group, call, entry)
        return self._virtual(group, call, entry, own, matched)

    def _real_call(self, group, call, entry):
        """A group of real ranks only: the real backend, in real time; with virtual timing
        the call completes on the virtual clock at the latest member's entry plus the
        recorded transfer."""
        s = self._session
        if not s.virtual:
            return call.fn(*call.args)
        mine = torch.tensor([entry], dtype=torch.int64)
        entries = [torch.empty_like(mine) for _ in self._real_members]
        s.waited(self._real_pg.allgather([entries], [mine], AllgatherOptions()))
        s.waited(call.fn(*call.args))
        records = {g: s.schedule.collective(g, group.gid, call.seq) for g in self._real_members}
        done = s.clock.completion(records, {g: int(e) for g, e in zip(self._real_members, entries)})[s.rank]
        return s.work(done, list(call.outs), blocking=not call.async_op)

    def _virtual(self, group, call, entry, own, matched):
        """A group with virtual members. They come in classes (`_Peers`): each virtual rank
        of a recorded bundle on its own; in a sliced or scaled bundle, all virtual ranks of
        one role, which replay the representative's records, enter together and send the
        same data: the work per call grows with the roles in the group, not its size."""
        s = self._session
        s.footprint_due = s.footprint(own)
        vrecs, ventry, vmax = self._virtual_entries(call.seq)
        ins, me, n = call.ins, group.rank(), group.size()
        in_splits = out_splits = None
        if ops.OPS[call.op].form == "all_to_all_single":
            out_splits, mine = list(call.args[2]), list(call.args[3])
            in_splits = [None] * n
            in_splits[me] = mine
        # (group ranks, their inputs or None: replicas of ours, the ranks as an index tensor)
        parts: list = [([me], list(ins), None)]
        entries = [entry]
        if self._real_pg is not None:
            entries, vmax = self._real_parts(group, me, n, entry, vmax, ins, parts, in_splits)
        work_from = monotonic_ns()  # the replayer's own work on the data, counted per step
        self._outputs(group, me, n, call, own, matched, vrecs, parts, in_splits, out_splits)
        s.own_ns += monotonic_ns() - work_from
        return self._complete(group, call, entry, entries, vrecs, ventry, vmax)

    def _virtual_entries(self, seq: int) -> tuple[dict, dict, int]:
        """Each class of virtual peers' recorded call at `seq` and its entry on the model
        clock (None: it never enters), by the class's key; and the latest entry (0: none)."""
        sched, clock = self._session.schedule, self._session.clock
        vrecs, ventry = {}, {}
        for c in self._peers:
            rec = sched.collective(c.src, c.gid, seq)
            vrecs[c.key] = rec
            ventry[c.key] = clock.entry(c.key, rec, c.src)
        return vrecs, ventry, max((e for e in ventry.values() if e is not None), default=0)

    def _real_parts(self, group, me: int, n: int, entry: int, vmax: int, ins, parts: list,
                    in_splits) -> tuple[list, int]:
        """The other real members' inputs, exchanged with ours, added to `parts` (and their
        splits to `in_splits`); every real member's entry, and the latest virtual entry any
        of them modelled (`me`, `n`: this rank's place in the group and its size)."""
        got = self._exchange(entry, vmax, ins, in_splits[me] if in_splits else [],
                             n if in_splits is not None else 0)
        for g, (meta, data) in zip(self._real_members, got):
            j = group.position[g]
            if j != me:
                parts.append(([j], _decode(data, ins), None))
            if in_splits is not None:
                in_splits[j] = meta[4 : 4 + meta[3]]
        return [m[0] for m, _ in got], max(m[1] for m, _ in got)

    def _outputs(self, group, me: int, n: int, call, own, matched, vrecs: dict, parts: list, in_splits,
                 out_splits) -> None:
        """Write the call's outputs: the recorded ones where the inputs matched and the
        bundle holds them, else built from every member's inputs (the virtual peers'
        recorded ones, or replicas of ours: then the data is made up)."""
        s = self._session
        op, outs = call.op, call.outs
        known = True
        for c in self._peers:
            tensors = _recorded_inputs(s.bundle, vrecs[c.key], call.ins)
            if tensors is None:
                known = False
            parts.append((c.positions, tensors, c.index))
        exact = matched and own is not None and own.blob_out is not None and len(own.blob_out) == len(outs)
        if exact:
            for t, b, dt, shape in zip(outs, own.blob_out, own.out_dtypes, own.out_shapes):
                write(t, from_blob(s.bundle, b, dt, shape))
            return
        root_j = group.position[call.root] if call.root is not None else None
        if self._single:
            contrib: list = [None] * n
            for pos, tensors, _ in parts:
                contrib[pos[0]] = tensors
            build_outputs(op, me, n, call.ins, outs, contrib, reduce_op=call.reduce_op, root=root_j,
                          in_splits=in_splits, out_splits=out_splits)
        else:
            build_grouped(op, me, n, call.ins, outs, parts, reduce_op=call.reduce_op, root=root_j,
                          in_splits=in_splits, out_splits=out_splits)
        if not known and outs:
            s.made_up()
            if s.schedule.imported and call.root not in (None, *self._sub) and ops.OPS[op].form in _FROM_ROOT:
                # A dump's virtual root sent data no dump holds: as a replica of this rank,
                # the buffer would keep whatever it held (torch.empty's memory): made up, seeded.
                for i, t in enumerate(outs):
                    plausible(t, hash((group.gid, call.root, call.seq, i)))

    def _complete(self, group, call, entry: int, entries: list, vrecs: dict, ventry: dict, vmax: int):
        """The call's completion on the timing model, from every member's entry; the virtual
        peers' clocks moved past it; the Work that completes it then."""
        s = self._session
        gid, seq, clock = group.gid, call.seq, s.clock
        records = {g: s.schedule.collective(g, gid, seq) for g in self._real_members}
        records.update(vrecs)
        arrivals = dict(zip(self._real_members, entries)) if len(entries) > 1 else {s.rank: entry}
        arrivals.update({k: e for k, e in ventry.items() if e is not None})
        if self._real_pg is not None and vmax > max(arrivals.values()):
            arrivals[-1] = vmax  # a virtual member another real rank modelled later than we did
        finish = clock.completion(records, arrivals, self._srcs)
        done = finish[s.rank]
        for c in self._peers:
            clock.completed(c.key, vrecs[c.key], ventry[c.key], finish.get(c.key, done))
        if s.trace is not None:
            s.trace.append([gid, seq, entries, ventry, done])
        others = [e for k, e in arrivals.items() if k != s.rank]
        return s.work(done, list(call.outs), blocking=not call.async_op, inputs=list(call.ins),
                      arrival=max(others) if others else None, transfer=done - max(arrivals.values()))

    def _exchange(self, entry: int, vmax: int, ins, splits, width: int) -> list:
        """Every real member's (meta, input bytes): meta = [entry, vmax, nbytes, nsplits, *splits],
        the splits padded to `width` (the group size for all_to_all_single, else 0)."""
        pg = self._real_pg
        k = len(self._real_members)
        data = b"".join(host_bytes(t) for t in ins)
        meta = torch.tensor([entry, vmax, len(data), len(splits), *splits, *[0] * (width - len(splits))],
                            dtype=torch.int64)
        metas = [torch.empty_like(meta) for _ in range(k)]
        self._session.waited(pg.allgather([metas], [meta], AllgatherOptions()))
        metas = [m.tolist() for m in metas]
        size = max(m[2] for m in metas)
        if size == 0:
            return [(m, b"") for m in metas]
        mine = torch.zeros(size, dtype=torch.uint8)
        if data:
            mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        bufs = [torch.empty(size, dtype=torch.uint8) for _ in range(k)]
        self._session.waited(pg.allgather([bufs], [mine], AllgatherOptions()))
        return [(m, bytes(b[: m[2]].numpy())) for m, b in zip(metas, bufs)]

    # --- point to point -----------------------------------------------------------

    # The schedule keys a point-to-point call by its direction, "send" or "recv".

    def _p2p(self, group, call, entry):
        s = self._session
        peer, tensors = call.peer, call.ins
        own = s.schedule.p2p(s.rank, group.gid, "recv" if call.receives else "send", peer, call.seq)
        s.clock.anchor(entry, own)
        shapes, dtypes, _ = describe(tensors)
        live = PointToPoint(start_ns=0, end_ns=0, step=s.step, op=call.op, group=group.gid, seq=call.seq,
                            peer=peer if own is None else own.peer, tag=call.tag, shapes=_shapes(shapes),
                            dtypes=tuple(dtypes))
        matched = self._check(group, call, own, live)
        if not self._all_real and peer not in self._sub and own is not None:
            way = "recv" if call.receives else "send"
            if s.ends.never_answered(peer, group.gid, way, s.rank, call.seq, own):
                self._joined(group, call, [peer])
            self._recorded_end(group, call, own, (s.rank, group.gid, way, peer, call.seq))
        if self._all_real:
            return call.fn(*call.args)
        if peer in self._sub:
            real = self._real_pg.recv if call.receives else self._real_pg.send
            return real(tensors, self._sub[peer], call.tag)
        return self._virtual_p2p(group, call, entry, own, matched)

    def _virtual_p2p(self, group, call, entry, own, matched):
        s = self._session
        s.footprint_due = s.footprint(own)
        gid, seq, peer, tensors = group.gid, call.seq, call.peer, call.ins
        other = s.schedule.p2p(peer, gid, "send" if call.receives else "recv", s.rank, seq)
        work_from = monotonic_ns()
        if not call.receives:
            self._note_sent(peer, tensors)
        else:
            blobs = own.blob if own is not None and matched else None
            if blobs is None and other is not None:
                blobs = other.blob
            if blobs is not None and len(blobs) == len(tensors):
                for t, b in zip(tensors, blobs):
                    write(t, from_blob(s.bundle, b, t.dtype, t.shape))
            else:
                s.made_up()
                echo = self._echo(peer, tensors)
                for i, t in enumerate(tensors):
                    if echo is not None:
                        write(t, echo[i])
                    else:
                        plausible(t, hash((gid, peer, seq, i)))
        s.own_ns += monotonic_ns() - work_from
        start = s.clock.entry(peer, other)
        arrivals = {s.rank: entry} if start is None else {s.rank: entry, peer: start}
        finish = s.clock.completion({s.rank: own, peer: other}, arrivals)
        done = finish[s.rank]
        s.clock.completed(peer, other, start, finish.get(peer, done))
        return s.work(done, list(tensors), blocking=not call.async_op, arrival=start,
                      transfer=done - max(arrivals.values()))

    # Control messages the bundle lacks (sent before a --steps window, or recorded with
    # --payload none) steer the program: pipelining's warm-up vote, which stage 0 sends
    # stage 1 and gets back (1: the stages' shapes are given, skip metadata inference).
    # Made-up zeros there sent a replayed stage down a path the recording never took. A
    # virtual peer answers a non-floating message the way a handshake does: with the
    # last message of those dtypes and shapes this rank sent it; floating data (activations,
    # gradients) stays `plausible`.
    _ECHO_BYTES = 4096

    def _note_sent(self, peer: int, tensors) -> None:
        if not tensors or any(t.is_floating_point() or t.is_complex() for t in tensors):
            return
        if sum(t.numel() * t.element_size() for t in tensors) > self._ECHO_BYTES:
            return
        key = (peer, tuple(str(t.dtype) for t in tensors), tuple(tuple(t.shape) for t in tensors))
        if key not in self._sent and len(self._sent) >= 64:
            return  # bounded: a few handshakes per peer, not every message
        self._sent[key] = [t.detach().clone() for t in tensors]

    def _echo(self, peer: int, tensors) -> list | None:
        if not tensors or any(t.is_floating_point() or t.is_complex() for t in tensors):
            return None
        key = (peer, tuple(str(t.dtype) for t in tensors), tuple(tuple(t.shape) for t in tensors))
        return self._sent.get(key)

    def anysource(self, group) -> int:
        """A receive from any source takes the message the recording says came next: from
        the peer whose next recorded receive on this group started first. The recorded
        arrival order is kept (real and virtual peers alike), and the work names the
        sender as production's did."""
        s = self._session
        best = None
        for g, peer in enumerate(group.ranks):
            if peer == s.rank:
                continue
            rec = s.schedule.p2p(s.rank, group.gid, "recv", peer, group.next_p2p_seq(True, peer))
            if rec is not None and (best is None or rec.start_ns < best[0]):
                best = (rec.start_ns, g)
        if best is None:
            s.diverge(group.gid, -1, "recv", "call", "a receive the recording has (it has none left "
                      "on this group)", "a receive from any source")
            raise DivergenceError(s.stopped.paragraph() if s.stopped is not None else
                                  "prism-rr replay: no recorded receive is left for a receive from any source")
        return best[1]

    # --- coalescing ---------------------------------------------------------------

    def start_coalescing(self, group, device) -> None:
        if self._all_real:
            super().start_coalescing(group, device)

    def end_coalescing(self, group, device, works: list):
        if self._all_real:
            return super().end_coalescing(group, device, works)
        for w in works:
            w.wait()
        return completed_work()


class _Peers:
    """Virtual members of a group that move as one: a key for the timing model, the rank
    whose records they replay (`src`, in its group `gid` of the same family), and their
    group ranks."""

    __slots__ = ("key", "src", "gid", "positions", "_index")

    def __init__(self, key, src: int, gid: int):
        self.key, self.src, self.gid = key, src, gid
        self.positions: list[int] = []
        self._index = None

    @property
    def index(self):
        """The group ranks as a tensor, for writing one row per member at once."""
        if self._index is None and len(self.positions) > 1:
            self._index = torch.tensor(self.positions, dtype=torch.long)
        return self._index


def _peer_classes(session, gid: int, ranks, real) -> list[_Peers]:
    """The virtual members of group `gid` by class, once per group: a recorded rank (or a
    --slow-rank or --replace-rank one, whose times are its own) is its own class; the other
    ranks of one role share their representative's ("r<rep>")."""
    alone = set(session.clock.slow_rank) | set(session.clock.replaced)
    members = set(ranks)
    out: dict = {}
    for j, g in enumerate(ranks):
        if g in real:
            continue
        src = session.source(g)
        key = g if src == g or g in alone else f"r{src}"
        c = out.get(key)
        if c is None:
            c = out[key] = _Peers(key, src, gid if src in members else _family_group(session, gid, src))
        c.positions.append(j)
    return list(out.values())


def _family_group(session, gid: int, rank: int) -> int:
    """The group of the same family (description and size) as `gid` that holds `rank`."""
    sched = session.schedule
    desc, size = sched.descs.get(gid), len(sched.groups.get(gid, ()))
    for other, ranks in sched.groups.items():
        if len(ranks) == size and sched.descs.get(other) == desc and rank in ranks:
            return other
    return gid


def _dump_divergence(own, live, size: int):
    """How a live call differs from the Flight Recorder entry of it (`own`, as `import fr`
    read it), or None: the entry may name and shape the call as its backend ran it
    (format.fr.entry_views); a barrier's tensors are the backend's own; a message's tag
    and blocking are not in a dump."""
    if type(own) is PointToPoint and type(live) is PointToPoint:
        return call_divergence(own, replace(live, op=direction(live.op), tag=own.tag))
    if type(own) is Collective and type(live) is Collective:
        if _no_tensors(own.op) and _no_tensors(live.op):
            return None
        found = [call_divergence(own, view) for view in entry_views(live, size)]
        if any(d is None for d in found):
            return None
        named = [d for d, view in zip(found, entry_views(live, size)) if view.op == own.op]
        return (named or found)[0]
    return call_divergence(own, live)


def _outside_dump(sched, rank: int, gid: int, seq: int, p2p: bool) -> bool:
    """Whether a Flight Recorder dump holds no entry for this call because it lies outside
    what the dump recorded: before the group's first entry (a ring begins in the middle of
    the run), between two of this rank's entries (an op its backend's recorder does not
    write, as gloo's monitored_barrier, or a later op of a coalesced call), or a message
    where the dump holds none (gloo's recorder writes no sends and receives)."""
    if p2p:
        return rank not in sched.p2p_recorded
    first = sched.first_seq.get(gid)
    return first is None or seq < first or sched.last_seq(rank, gid) > seq


def _shown_value(field: str, v):
    if field.endswith("shapes") and v is not None:
        return _shapes(v)
    return v


def _differences(bundle, own, ins, shown_at_most: int = 3) -> str | None:
    """Where the live inputs first part from the recorded ones, where the bundle holds
    those (a full payload, or a small call's bytes): 'input 0 ([4] float32) at (2,):
    recorded 1, got 1.5 (and 1 more element)'. None where it holds only digests."""
    blobs = getattr(own, "blob_in", None)
    if not blobs or len(blobs) != len(ins):
        return None
    for i, (t, blob, dtype, shape) in enumerate(zip(ins, blobs, own.in_dtypes, own.in_shapes)):
        try:
            rec = from_blob(bundle, blob, dtype, shape)
        except Exception:
            continue
        live = t.detach().to("cpu")
        if live.numel() != rec.numel() or live.dtype != rec.dtype:
            continue
        live = live.reshape(rec.shape)
        differ = live != rec
        if live.is_floating_point():
            differ &= ~(live.isnan() & rec.isnan())
        where = differ.nonzero()
        if not len(where):
            continue
        parts = [f"{tuple(j.tolist())}: recorded {rec[tuple(j.tolist())].item():.6g}, got "
                 f"{live[tuple(j.tolist())].item():.6g}" for j in where[:shown_at_most]]
        more = len(where) - len(parts)
        rest = f" (and {more} more element{'s' if more > 1 else ''})" if more else ""
        return f"input {i} ({list(shape)} {dtype}) at " + "; ".join(parts) + rest
    return None


def _hex(values) -> str:
    return "[" + ", ".join(v.hex() if isinstance(v, bytes) else f"{v:016x}" for v in values) + "]"


def _decode(data: bytes, like) -> list:
    """A real member's inputs from its bytes, shaped as this rank's (the first dimension of a
    single tensor follows the byte count: all_to_all_single with uneven splits)."""
    if len(like) == 1:
        t = like[0]
        if t.dim() >= 1:
            row = t[0].numel() * t.element_size() if t.shape[0] else max(1, t.element_size())
            rows = len(data) // row if row else 0
            return [from_bytes(data, t.dtype, (rows, *t.shape[1:]))]
        return [from_bytes(data, t.dtype, t.shape)]
    out, at = [], 0
    for t in like:
        nb = t.numel() * t.element_size()
        out.append(from_bytes(data[at : at + nb], t.dtype, t.shape))
        at += nb
    return out


def _recorded_inputs(bundle, rec, like) -> list | None:
    """A virtual member's recorded inputs, when they were recorded in full and fit."""
    if rec is None or rec.blob_in is None or len(rec.blob_in) != len(like):
        return None
    out = []
    for b, dt, shape, t in zip(rec.blob_in, rec.in_dtypes, rec.in_shapes, like):
        x = from_blob(bundle, b, dt, shape)
        if x.dtype != t.dtype or x.shape != t.shape:
            return None  # the program diverged here: a replica fits better than the recording
        out.append(x)
    return out


def _no_tensors(name: str) -> bool:
    """A call that moves no tensors of the program's (a barrier: its tensors are the backend's)."""
    op = ops.lookup(name)
    return op is not None and op.form == "none"
