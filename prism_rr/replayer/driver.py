"""The bundle as the program: make one rank's recorded calls through torch.distributed.

`prism-rr replay BUNDLE --ranks R --from-bundle` starts this as the command of each real
rank (`python -m prism_rr.replayer.driver`), under the replay's start-up hook like any
program, so virtual peers, the divergence check and the card apply unchanged. It reads
the replay's bundle and rank from its environment and, in the recorded order:

- creates the recorded groups (ids, members in order, descriptions), so that group ids and
  sequence numbers are the bundle's; a recording's window (or a ring) begins after calls
  it does not hold, and its calls are numbered as recorded (`InterceptGroup.skip_to`);
- makes each call with its recorded op, shapes, dtypes, reduce op, root or peer and tag,
  blocking or not, and waits for an asynchronous one where it had completed;
- gives it the recorded bytes where the bundle holds them (full payloads; a `digest`
  recording's calls of at most 1 KiB), else seeded made-up data of the recorded shape and
  dtype, whose data is then not compared (`ReplaySession.inputs_made_up`);
- holds the recorded compute between two actions (a host sleep: the replay scales it
  with --compute-scale as any program's), less the replayer's own time in the calls
  before it, and ends steps where they ended (`prism_rr.step()`);
- holds the recorded memory (a ballast of the recorded allocated bytes at each call, and
  a moment at the step's recorded peak);
- on a group whose members are all real, times each call against its recording (the
  card's transfer table, _transfers.py) and compares its outputs with the recorded ones
  where every input was the recorded bytes: a backend that computes otherwise diverges;
- ends as the recorded program ended where it failed: sys.exit's code, or its signal.

It imports, runs and unpickles nothing a bundle names: an object collective's bytes are
tensors here. Not made: calls on CUDA tensors (a GPU recording replays on CPU tensors,
gloo), all_to_all_single with uneven splits (a recording keeps no split sizes), PREMUL_SUM.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import warnings
from math import prod
from time import monotonic_ns

from prism_rr.errors import PrismError
from prism_rr.format import open_bundle, ops
from prism_rr.format.blobs import blob_id
from prism_rr.format.facts import FATAL_SIGNALS
from prism_rr.format.records import PointToPoint
from prism_rr.text import shown
from prism_rr.recorder import step
from prism_rr.replayer import _divergence
from prism_rr.replayer._hang import failed, recorded_exit
from prism_rr.replayer._install import current_session
from prism_rr.replayer._options import ENV_VAR, ReplayOptions
from prism_rr.replayer._program import DTYPE_BYTES, Program, program_of
from prism_rr.replayer._timing import sleep_until
from prism_rr.replayer._transfers import Transfers

# Deferred imports: torch, and the modules that import it (replayer._data, intercept.payload),
# until the rank's driver is made: main() first reads the bundle and the replay's options,
# and a bundle this replay refuses costs no torch.

# Forms whose call writes its result into its input (torch's in-place collectives), and
# the one-tensor forms a coalesced op makes several of at once.
_IN_PLACE = ("reduce_all", "copy_root", "reduce_root")
_ONE_EACH = ("reduce_all", "gather_tensor", "reduce_scatter_tensor")

__all__ = ["main"]

log = logging.getLogger("prism_rr.replayer")
# the last stretch of a hold is spun (a sleeping thread wakes late): shorter than a waiting
# rank's, as a compute hold comes between every two calls and the late part is made up later
_SPIN_NS = 200_000
_KEPT_BYTES = 64 << 20  # tensors made once and used again: made-up inputs, small payloads
_KEPT_PAYLOAD = 64 << 10  # a recorded payload up to this size is kept by its id


# the signals a recorded program may end by here: those a recorder saw stop it (its `how`'s
# "SIGTERM", ...), and the fatal ones faulthandler names in words (format.facts.FATAL_SIGNALS)
_STOPS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGABRT", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGUSR1",
          "SIGUSR2")


def _signal(name) -> int | None:
    name = FATAL_SIGNALS.get(name, name) if isinstance(name, str) else None
    return getattr(signal, name) if name in _STOPS else None


def _kind(rec, size: int, p2p: bool) -> tuple[str, int, int]:
    """A call's kind in the transfer table: op, group size, and the bytes of its larger side."""
    shapes = (rec.shapes,) if p2p else (rec.in_shapes, rec.out_shapes)
    dtypes = (rec.dtypes,) if p2p else (rec.in_dtypes, rec.out_dtypes)
    return rec.op, size, max(sum(prod(x) * DTYPE_BYTES[d] for x, d in zip(sh, dt)) for sh, dt in zip(shapes, dtypes))


def _hexes(values) -> str:
    return ", ".join(v.hex() if isinstance(v, bytes) else f"{v & ((1 << 64) - 1):016x}" for v in values)


def _seed(rank: int, made: int) -> int:
    return (rank * 1_000_003 + made) * 1_000_033 & ((1 << 63) - 1)


class _Driver:
    """One rank's program, made against torch.distributed."""

    def __init__(self, program: Program, bundle, real: tuple[int, ...]):
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.p = program
        self.bundle = bundle
        self.real = real
        self.groups: dict[int, object] = {}
        self.works: dict[int, tuple] = {}  # call index -> (its Work, when it was made, its tensors)
        self.all_real = frozenset(gid for gid, (ranks, _) in program.groups.items() if set(ranks) <= set(real))
        self.transfers = Transfers()
        self._futureless: set[tuple] = set()  # (group, op) whose Works have no future
        self._kinds: dict[int, tuple] = {}  # call index -> its kind in the transfer table
        self._kept: dict[tuple, object] = {}  # made-up inputs and small payloads, made once (_kept_or)
        self._kept_bytes = 0
        self._seeds = 0  # made-up tensors made so far: the next one's seed
        self.session = None
        self.memory = None  # the replay's CPU memory tracker, where the recording has memory
        self.ballast = None  # bytes held so that the tracked memory is the recorded
        self.peak_made = 0  # the step's running peak made so far
        self.memory_cap = 0
        self._reduce = {name: getattr(dist.ReduceOp, name) for name in
                        ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")}
        # torch 2.13 names them all_gather_single and reduce_scatter_single (the old names warn)
        self._gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    # --- set-up -------------------------------------------------------------------

    def start(self) -> None:
        dist = self.dist
        dist.init_process_group("gloo")
        self.session = current_session()
        if self.session is not None:
            self.session.program = self.transfers  # written with the rank's results
        self.groups[0] = dist.group.WORLD
        memory = getattr(self.session, "_memory", None)
        if type(memory).__name__ == "CpuMemoryTracker":
            self.memory = memory
            try:  # never more than half this machine's memory over the real ranks
                total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            except (ValueError, OSError):
                total = 1 << 32
            self.memory_cap = total // (2 * max(1, len(self.real)))
        self.warm_up()
        world = self.p.world_size
        stand_in = next((r for r in range(world) if r not in self.real), 0)
        for gid in range(1, self.p.last_gid + 1):
            ranks, desc = self.p.groups.get(gid, ((stand_in,), ""))
            # every rank creates every group, member or not, as torch numbers them
            pg = dist.new_group(ranks=list(ranks), group_desc=desc or None, sort_ranks=False)
            if self.p.rank in ranks:
                self.groups[gid] = pg

    def warm_up(self) -> None:
        """The first operator under the replay's memory tracker imports torch._dynamo
        (seconds): made here, in the set-up, not in the first recorded step."""
        self._make_up((1,), "float32")

    # --- tensors ------------------------------------------------------------------

    def _kept_or(self, key, make, fresh: bool):
        """A tensor made once by make() and kept (while they fit in _KEPT_BYTES), a copy where
        the call writes into its input (`fresh`): a made-up input, or a small payload's."""
        t = self._kept.get(key)
        if t is None:
            t = make()
            size = t.numel() * t.element_size()
            if self._kept_bytes + size > _KEPT_BYTES:
                return t
            self._kept[key] = t
            self._kept_bytes += size
        return t.clone() if fresh else t

    def _made_up(self, i: int, shape, dtype: str, fresh: bool):
        """Seeded values of the recorded shape and dtype (the call's `i`th tensor), made once
        for each such tensor: made up, they are never compared with anything."""
        return self._kept_or((shape, dtype, i), lambda: self._make_up(shape, dtype), fresh)

    def _make_up(self, shape, dtype: str):
        """A multiplicative hash of each element's index, seeded by the rank and how many
        were made before (torch's generators would import torch._dynamo, seconds, here)."""
        self._seeds += 1
        torch = self.torch
        dt = getattr(torch, dtype)
        n = prod(shape)
        h = torch.arange(n, dtype=torch.int64).add_(_seed(self.p.rank, self._seeds) % (1 << 31))
        h.mul_(2654435761).remainder_(1 << 31)
        if dt.is_floating_point or dt.is_complex:
            x = h.to(torch.float32).mul_(2.0 / (1 << 31)).sub_(1.0)
        elif dt == torch.bool:
            x = h.remainder_(2).bool()
        else:
            x = h.remainder_(16)
        return x.to(dt).reshape(shape)

    def _inputs(self, shapes, dtypes, blobs, fresh: bool) -> tuple[list, bool]:
        """The call's inputs, and whether they are the recorded bytes; copies of kept tensors
        where the call writes into them (`fresh`)."""
        if blobs is not None and len(blobs) == len(shapes):
            try:
                return [self._recorded(b, dt, s, fresh) for b, dt, s in zip(blobs, dtypes, shapes)], True
            except PrismError as exc:
                log.warning("prism-rr: %s: the call's inputs are made up", exc)
        return [self._made_up(i, s, dt, fresh) for i, (s, dt) in enumerate(zip(shapes, dtypes))], False

    def _recorded(self, blob: bytes, dtype: str, shape, fresh: bool):
        """A recorded payload as a tensor; a small one kept by its id (the same control data
        comes back call after call), a large one read each time."""
        from prism_rr.replayer._data import from_blob

        if prod(shape) * DTYPE_BYTES[dtype] > _KEPT_PAYLOAD:
            return from_blob(self.bundle, blob, dtype, shape)
        return self._kept_or((blob, dtype, shape), lambda: from_blob(self.bundle, blob, dtype, shape), fresh)

    def _empty(self, shapes, dtypes) -> list:
        torch = self.torch
        return [torch.empty(s, dtype=getattr(torch, dt)) for s, dt in zip(shapes, dtypes)]

    def hold_memory(self, rec) -> None:
        """Make the tracked memory what the recording had at this call: a ballast for what
        was allocated, and a moment at the step's running peak where it rose. Freed before
        it is made anew, so no two are ever counted at once."""
        m = self.memory
        if m is None or rec.mem_alloc is None:
            return
        torch = self.torch
        self.ballast = None
        if rec.mem_peak is not None and rec.mem_peak > self.peak_made:
            rise = min(rec.mem_peak - m.allocated, self.memory_cap)
            if rise > 0:
                spike = torch.empty(rise, dtype=torch.uint8)
                del spike
            self.peak_made = rec.mem_peak
        need = min(rec.mem_alloc - m.allocated, self.memory_cap)
        if need > 0:
            self.ballast = torch.empty(need, dtype=torch.uint8)

    # --- calls --------------------------------------------------------------------

    def prepare(self, rec):
        """What a call needs, made before the compute before it is held."""
        group = self.groups[rec.group]
        if type(rec) is PointToPoint:
            receives = ops.receives(rec.op)
            if receives:
                ins, known = self._empty(rec.shapes, rec.dtypes), True
            else:
                ins, known = self._inputs(rec.shapes, rec.dtypes, rec.blob, False)
            if hasattr(group, "skip_to"):
                group.skip_to(rec.seq, receives, rec.peer)
            return group, ins, [], known
        in_place = ops.lookup(rec.op).form in _IN_PLACE
        ins, known = self._inputs(rec.in_shapes, rec.in_dtypes, rec.blob_in, in_place)
        outs = ins if in_place else self._empty(rec.out_shapes, rec.out_dtypes)
        if hasattr(group, "skip_to"):
            group.skip_to(rec.seq)
        return group, ins, outs, known

    def call(self, rec, group, ins, outs):
        """Make the call, by its form (format/ops.py); its Work where it is asynchronous."""
        known = ops.lookup(rec.op)  # _program refused every op the table does not know
        if known.p2p:
            return self._p2p(rec, group, ins[0])
        if rec.op.endswith("_coalesced") and known.form in _ONE_EACH:
            return self._coalesced(known.form, rec, group, ins, outs)
        return self._collective(known.form, rec, group, ins, outs)

    def _p2p(self, rec, group, tensor):
        make = getattr(self.dist, rec.op)  # send, recv, isend, irecv: torch's names (ops.is_p2p)
        if ops.receives(rec.op):
            return make(tensor, src=rec.peer, group=group, tag=rec.tag)
        return make(tensor, dst=rec.peer, group=group, tag=rec.tag)

    def _collective(self, form: str, rec, group, ins, outs):
        dist, a = self.dist, rec.async_op
        red = self._reduce[str(getattr(rec, "reduce_op", None) or "SUM").upper()]
        here = rec.root == self.p.rank
        if form == "reduce_all":
            return dist.all_reduce(ins[0], op=red, group=group, async_op=a)
        if form == "copy_root":
            return dist.broadcast(ins[0], src=rec.root, group=group, async_op=a)
        if form == "reduce_root":
            return dist.reduce(ins[0], dst=rec.root, op=red, group=group, async_op=a)
        if form == "gather_list":
            return dist.all_gather(outs, ins[0], group=group, async_op=a)
        if form == "gather_tensor":
            return self._gather_single(outs[0], ins[0], group=group, async_op=a)
        if form == "reduce_scatter_list":
            return dist.reduce_scatter(outs[0], ins, op=red, group=group, async_op=a)
        if form == "reduce_scatter_tensor":
            return self._scatter_single(outs[0], ins[0], op=red, group=group, async_op=a)
        if form == "all_to_all":
            return dist.all_to_all(outs, ins, group=group, async_op=a)
        if form == "all_to_all_single":
            return dist.all_to_all_single(outs[0], ins[0], group=group, async_op=a)
        if form == "gather_root":
            return dist.gather(ins[0], gather_list=outs if here else None, dst=rec.root, group=group, async_op=a)
        if form == "scatter_root":
            return dist.scatter(outs[0], scatter_list=ins if here else None, src=rec.root, group=group, async_op=a)
        if form == "gather_list_by_rank":
            n = len(outs) // len(ins)
            lists = [outs[r * len(ins):(r + 1) * len(ins)] for r in range(n)]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return dist.all_gather_coalesced(lists, ins, group=group, async_op=a)
        if form == "none":  # barrier or monitored_barrier: torch's names; the monitored one blocks
            barrier = getattr(dist, rec.op)
            return barrier(group=group, async_op=a) if a else barrier(group=group)
        raise AssertionError(form)  # every form of the table is above

    def _coalesced(self, form: str, rec, group, ins, outs):
        """A coalesced call of a one-tensor form: its calls made in one _coalescing_manager."""
        dist, a = self.dist, rec.async_op
        red = self._reduce[str(getattr(rec, "reduce_op", None) or "SUM").upper()]
        with dist._coalescing_manager(group=group, async_ops=a) as cm:
            for i, o in zip(ins, outs):
                if form == "reduce_all":
                    dist.all_reduce(i, op=red, group=group)
                elif form == "gather_tensor":
                    self._gather_single(o, i, group=group)
                else:
                    self._scatter_single(o, i, op=red, group=group)
        return cm if a else None

    # --- the program --------------------------------------------------------------

    def run(self) -> None:
        p, s = self.p, self.session
        while s is not None and s.step < p.first_step:  # steps before the recording's window
            step()
        cursor, back = p.start_ns, monotonic_ns()  # recorded time reached, and here when it was
        # compute held longer than recorded so far (a sleep that woke late, the driver's own
        # work on a call's tensors): taken off the next holds, so that compute adds up
        late = 0
        for a in p.actions:
            ready = None
            if a.kind == "call":
                # made outside the tracked memory (a made-up input's arithmetic is not the
                # program's): the ballast makes the tracked memory the recorded
                ready = s.aside(self.prepare, p.calls[a.index]) if s is not None else self.prepare(p.calls[a.index])
                self.hold_memory(p.calls[a.index])
            wanted = max(0, a.at_ns - cursor)
            sleep_until(back + wanted - late, _SPIN_NS)
            late = max(0, late + monotonic_ns() - back - wanted)
            if a.kind == "call":
                rec = p.calls[a.index]
                group, ins, outs, known = ready
                if s is not None:
                    s.inputs_made_up = not known
                    s.inputs_made_up_calls += not known
                _divergence.recorded_stack = rec.stack or ()
                t, blocked = monotonic_ns(), s.blocked_ns if s is not None else 0
                work = self.call(rec, group, ins, outs)
                if rec.async_op and work is not None:
                    self.works[a.index] = (work, t, ready, self._done_at(rec, work))
                late += self._own_excess(a, t, blocked)
                if not rec.async_op:
                    late += self.completed(a.index, ready, t)
            elif a.kind == "wait":
                made = self.works.pop(a.index, None)
                if made is not None:
                    made[0].wait()
                    late += self.completed(a.index, made[2], made[1], made[3])
            else:
                t = monotonic_ns()
                step()
                self.peak_made = 0
                late += monotonic_ns() - t  # the replayer's own (a step's marker took its time as recorded)
            back = monotonic_ns()
            cursor = max(cursor, a.back_ns)
        for made in self.works.values():  # recorded as never waited for: done before the end
            made[0].wait()
        self.works.clear()

    # --- what a call did ------------------------------------------------------------

    def _done_at(self, rec, work) -> list | None:
        """Where an asynchronous call on a group of real ranks completes: its future's
        callback puts the time in the list (gloo's send and recv have none: their wait()
        returning is their end, as the recorder takes it)."""
        kind = (rec.group, rec.op)
        if rec.group not in self.all_real or kind in self._futureless:
            return None
        try:
            future = work.get_future()
        except RuntimeError:
            self._futureless.add(kind)  # an exception from C++ costs ~20 us: asked once
            return None
        done: list = []
        future.add_done_callback(lambda _: done.append(monotonic_ns()))
        return done

    def completed(self, i: int, ready, t: int, done_at: list | None = None) -> int:
        """Call `i`, made at `t` (`ready`: what prepare() made for it), has completed (at the
        first of `done_at`'s time and now, as the recorder takes it): on a group of real
        ranks only, its time goes into the transfer table and its outputs, where every input
        was the recorded bytes, are compared with the recorded ones. Returns the time this
        took (the replayer's own, taken off the next hold)."""
        now = monotonic_ns()
        rec = self.p.calls[i]
        if rec.group not in self.all_real or rec.end_ns is None:
            return 0
        p2p = type(rec) is PointToPoint
        end = min(done_at[0], now) if done_at else now
        if rec.step > self.p.first_step or self.p.one_step:  # a first step's calls wait out the ranks' start-up
            kind = self._kinds.get(i)
            if kind is None:
                kind = self._kinds[i] = _kind(rec, len(self.p.groups[rec.group][0]), p2p)
            self.transfers.add(*kind, rec.end_ns - rec.start_ns, end - t)
        _, ins, outs, known = ready
        if known and self._others_known(rec, p2p):
            self._compare_outputs(rec, ins if p2p or ops.lookup(rec.op).form in _IN_PLACE else outs, p2p)
        return monotonic_ns() - now

    def _others_known(self, rec, p2p: bool) -> bool:
        """Whether every other member gave this call the recorded bytes (so that its outputs
        are the recording's where the backend computes as it did): a receive's sender kept
        its message's; every member of a collective its inputs."""
        sched = self.session.schedule if self.session is not None else None
        if sched is None:
            return False
        if p2p:
            if not ops.receives(rec.op):
                return False  # a send has no output
            sent = sched.p2p(rec.peer, rec.group, "send", self.p.rank, rec.seq)
            return sent is not None and sent.blob is not None
        for m in self.p.groups[rec.group][0]:
            theirs = sched.collective(m, rec.group, rec.seq)
            if theirs is None or (theirs.blob_in is None and theirs.in_shapes):
                return False
        return True

    def _compare_outputs(self, rec, outputs, p2p: bool) -> None:
        """The call's outputs against the recorded payload ids or digests: a difference is
        a divergence (the backend computed otherwise), at the recorded call's stack."""
        from prism_rr.intercept.payload import digests, host_bytes

        blobs, digested = (rec.blob, rec.digest) if p2p else (rec.blob_out, rec.digest_out)
        if blobs is not None and len(blobs) == len(outputs):
            field, want, got = "payload_out", tuple(blobs), tuple(blob_id(host_bytes(t)) for t in outputs)
        elif digested is not None and len(digested) == len(outputs):
            field, want, got = "digest_out", tuple(digested), digests(outputs)
        else:
            return
        self.transfers.outputs_checked += 1
        if want != got and self.session is not None:
            self.session.diverge(rec.group, rec.seq, rec.op, field, _hexes(want), _hexes(got),
                                 tuple(rec.stack or ()) or None)

    def _own_excess(self, a, t: int, blocked: int) -> int:
        """How much longer than recorded the call begun at `t` took because of the replayer's
        own work in it (checking it, modelling its virtual peers, building their data): what
        of its overrun fell before the replayer gave control back, less any wait there for
        real peers (`blocked`: the session's count when it began). Taken off the compute held
        after it, as a late wake is, so that the replayer's work does not add to the step;
        a wait for a peer, or a backend slower than recorded, still does."""
        s = self.session
        now = monotonic_ns()
        if s is None or s.returned_ns < t:
            return 0
        own = s.returned_ns - t - (s.blocked_ns - blocked)
        over = (now - t) - (a.back_ns - a.at_ns)
        return max(0, min(own, over))

    def end_as_recorded(self) -> int:
        """Where the rank's program failed in the recording after its last call (sys.exit's
        code, an unhandled exception, a signal: its rank info's `exit`, or its crash file's),
        it ends so here: the exit code returned, or the signal raised on this process (its
        results written first). 0 where it did not, or the recording does not say."""
        how = recorded_exit(self.bundle.rank_info(self.p.rank))
        if not failed(how):
            return 0
        code, sig = how.get("code"), _signal(how.get("signal"))
        if not (type(code) is int and code != 0) and sig is None:
            return 0
        print(f"prism-rr: rank {self.p.rank}'s program ended here in the recording ({shown(how.get('how'))}); "
              f"so does the replay's", file=sys.stderr, flush=True)
        if sig is None:
            return code & 0xFF or 1
        if self.session is not None:
            self.session.write()
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig  # not reached

    def finish(self) -> None:
        dist = self.dist
        if self.p.windowed:
            # the run went on past the window with calls of its own: a barrier parts the
            # ranks cleanly (gloo's teardown aborts a rank whose peer left first)
            dist.barrier()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    text = os.environ.get(ENV_VAR)
    if not text or "RANK" not in os.environ:
        print("prism-rr: the driver runs under `prism-rr replay BUNDLE --ranks R --from-bundle`", file=sys.stderr)
        return 2
    options = ReplayOptions.from_json(text)
    rank = int(os.environ["RANK"])
    with open_bundle(options.bundle, attempt=options.attempt) as bundle:
        try:
            program = program_of(bundle, rank)
        except PrismError as exc:
            print(f"prism-rr: {exc}", file=sys.stderr)
            return exc.exit_code
        driver = _Driver(program, bundle, tuple(options.ranks))
        driver.start()
        driver.run()
        code = driver.end_as_recorded()
        if not code:
            driver.finish()
    return code


if __name__ == "__main__":
    sys.exit(main())
