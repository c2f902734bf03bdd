"""One real rank's replay: the bundle, the schedule, the clocks, steps and divergences.

Everything here runs inside the replayed program. It writes what it measured to
`<work_dir>/rank-NNNNN.json` at exit (and at once when a divergence stops the replay),
where the launcher reads it. Under a launcher it also puts it on the launcher's store, and
a node's first worker gathers the other nodes' (_gather.py).
"""

from __future__ import annotations

import atexit
import heapq
import json
import logging
import os
import sys
import threading
from collections import deque
from time import monotonic_ns

from prism_rr.errors import DivergenceError, HangError, ReplayError
from prism_rr.format import open_bundle
from prism_rr.format.records import Compute
from prism_rr.intercept import dispatch
from prism_rr.intercept.steps import OptimizerSteps
from prism_rr.recorder import clock_for
from prism_rr.replayer._device_wait import ENV_VAR as WAITS_VAR
from prism_rr.replayer._divergence import Divergence, user_stack
from prism_rr.replayer._environment import _cuda_here
from prism_rr.replayer._hang import WAITED_FOR, RecordingEnd, raised, sentence
from prism_rr.replayer._options import ReplayOptions, stats_path
from prism_rr.replayer._schedule import Schedule
from prism_rr.replayer._timing import PeerClock, sleep_until
from prism_rr.topology.roles import Roles

# Deferred imports: the memory trackers, device reads and waits and the replay's work
# objects (torch, CUDA), each where the replay asks for it.

__all__ = ["ReplaySession"]

log = logging.getLogger("prism_rr.replayer")
# A step's start is stamped in a slot of its own (the step modulo this): a wait queued on
# the waiter's side stream that runs late must still read its own step's start, not the
# next one's that the program's stream may have stamped meanwhile
STEP_SLOTS = 4
# A replayed call's inputs compared with the recorded digests once the device has passed
# them (the default on CUDA; "0": read at once; "cpu": the same path on CPU tensors, tests';
# "cpu-late": each read passed a call late, as by a device behind the host)
CHECKS_VAR = "PRISM_RR_DEVICE_CHECKS"
# ... and the ends of the last waits in a ring of slots after those: read once at the end,
# each set beside what it was asked (the report's device_waits "last")
TRACE_SLOTS = 64


def _spread(args: list[tuple[int, int]]) -> dict:
    """The waits' offsets from their step's start and transfers, ms: min, median, max."""
    if not args:
        return {}
    out = {}
    for i, name in enumerate(("offset_ms", "transfer_ms")):
        v = sorted(a[i] for a in args)
        out[name] = [round(v[0] / 1e6, 4), round(v[len(v) // 2] / 1e6, 4), round(v[-1] / 1e6, 4)]
    return out


class _Alarm:
    """Calls functions at given monotonic times, from one daemon thread."""

    def __init__(self):
        self._heap: list = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._n = 0

    def at(self, t_ns: int, fn) -> None:
        if t_ns <= monotonic_ns():
            fn()
            return
        with self._cond:
            self._n += 1
            heapq.heappush(self._heap, (t_ns, self._n, fn))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="prism-rr-replay-clock", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                t, _, fn = self._heap[0]
                delay = t - monotonic_ns()
                if delay > 0:
                    self._cond.wait(delay / 1e9)
                    continue
                heapq.heappop(self._heap)
            fn()
            # Let go of it now: a Work's _fire holds its tensors, which a real backend's
            # thread drops once the call completes. Kept until the next alarm, they would
            # be live, for the memory tracker, into a later step.
            del fn


def _own_bytes(rec) -> int:
    """A call record's bytes in and out."""
    return (getattr(rec, "in_bytes", None) or 0) + (getattr(rec, "out_bytes", None) or 0) \
        + (getattr(rec, "nbytes", None) or 0)


def _kind(rec) -> tuple:
    """A call's kind, for its footprint: its group, op and bytes in and out."""
    return rec.group, rec.op, getattr(rec, "in_bytes", None), getattr(rec, "out_bytes", None), \
        getattr(rec, "nbytes", None)


class ReplaySession:
    """The replay state of this process (one real rank)."""

    def __init__(self, options: ReplayOptions, rank: int, world_size: int):
        self.armed_ns: int | None = None  # set by the installer: when the start-up hook ran
        self.setup_ns: int | None = None  # ... and how long making this session took
        self.options = options
        self.rank = rank
        self._open(options, rank, world_size)
        self._init_endings(options)
        self._init_clock(options, rank)
        self._init_checks()
        self._init_steps()
        self.program = None  # a program that is the bundle: its _transfers.Transfers
        self._steps = OptimizerSteps(self.mark_step)
        self.policies: list = []  # weakrefs to the ReplayPolicy of each of this process's groups
        self.exiting = False
        self._memory_mode = None
        self._written = False
        self.exchange = None  # under a launcher: the real ranks' results through its store
        self.gathers = False  # ... and this worker writes the other nodes' into its work dir
        info = self.bundle.rank_info(rank)
        self._init_memory(info)
        self._init_device_clock(info)
        self._init_device_waits()
        self._init_device_reads()
        self._steps.start()
        # A divergence ends the process with exit code 3 once the program has unwound
        # (and torch's excepthook has printed the traceback): see _at_exit.
        atexit.register(self._at_exit)

    def _open(self, options: ReplayOptions, rank: int, world_size: int) -> None:
        """The bundle, checked against the world the program made; its roles and the
        schedule of the recorded calls this rank's replay needs."""
        self.bundle = open_bundle(options.bundle, attempt=options.attempt)
        if world_size != self.bundle.world_size:
            raise ReplayError(f"the program made a world of {world_size}; the recording has {self.bundle.world_size}")
        if rank not in self.bundle.recorded_ranks:
            raise ReplayError(f"rank {rank} was not recorded; recorded ranks: {self.bundle.recorded_ranks}")
        self.real = tuple(options.ranks)
        # A sliced or scaled bundle: a rank that was not recorded replays its role's
        # representative's records (roles.py), and a role's virtual ranks move as one.
        roles = self.bundle.manifest.get("roles")
        self.roles = None
        if isinstance(roles, dict):

            self.roles = Roles.from_manifest(roles)
        self.scaled = isinstance(self.bundle.manifest.get("scale"), dict)
        self.schedule = Schedule.for_real_ranks(self.bundle, self.real, self.roles)
        self.ends = RecordingEnd(self.schedule)

    def _init_endings(self, options: ReplayOptions) -> None:
        """The calls made on each group, and how the recording ended: its hangs, drifts
        and mismatches, as this rank's calls reach or resolve them."""
        self.made: dict[tuple, int] = {}  # next seq per group (and per group, direction, peer for messages)
        self.hang: dict | None = None  # the end of a recorded hang this rank stopped at
        self.resolved: list[dict] = []  # recorded hangs this rank's calls resolved
        # How the recording failed, where diagnose found it (launch: ReplayOptions.endings):
        # by group, the drifts and mismatches on it; and the drifts this rank's program fixed
        self.endings: dict[int, list[dict]] = {}
        for e in options.endings:
            self.endings.setdefault(int(e["group"]), []).append(e)
        self.drift_fixed: dict[int, dict] = {}

    def _init_clock(self, options: ReplayOptions, rank: int) -> None:
        """The virtual peers' clock, the timing asked for, and the alarm that completes
        their calls."""
        self.clock = PeerClock(rank, self.schedule.clock_offset, compute_scale=options.compute_scale,
                               slow_rank=options.slow_rank_map(), comm_scale=options.comm_scale,
                               pure_transfer=self.scaled, replaced=options.replaced_map())
        self.live = options.timing == "live"
        self.virtual = options.timing == "virtual"
        self.timed = self.live or self.virtual
        # Real compute -> model compute: compute_scale, times (virtual timing) the
        # calibration learned on the first step; a live rank is slowed by waiting instead.
        self._factor = options.compute_scale if self.virtual else 1.0
        self._pad = options.compute_scale if self.live else 1.0
        self.calibration: float | None = None
        self.trace: list | None = [] if os.environ.get("PRISM_RR_REPLAY_TRACE") else None
        self.alarm = _Alarm()

    def _init_checks(self) -> None:
        """What the checks against the recording found: divergences, and the calls whose
        data was made up or whose shapes `scale` predicted."""
        self.divergences: list[Divergence] = []
        self.waited_for: dict | None = None  # at the program's end: peers waiting for this rank
        self.stopped: Divergence | None = None
        self.synthetic = False  # data made up for virtual peers has flowed into this rank's numerics
        self.made_up_from_ns: int | None = None  # since when (monotonic): its calls' data is no longer checked
        # The inputs of the program's next call are made up by it (a replay whose program is
        # the bundle, driver.py, where the bundle lacks their bytes): that call's data is not
        # compared with the recording, its shapes are
        self.inputs_made_up = False
        self.inputs_made_up_calls = 0  # ... and how many calls had such inputs
        self.predicted_shape_calls = 0  # calls whose recorded shapes were predicted by `scale`
        self.predicted_shape_mismatches = 0  # ... and whose live shapes differ from the prediction
        self.predicted_shape_examples: list[dict] = []  # the first few of those

    def _init_steps(self) -> None:
        """The calls and steps made so far, and the clocks' marks the current step is
        timed from."""
        self.calls = 0
        self.step = 0
        t0 = monotonic_ns()
        self._real_mark = self._model_mark = t0
        self.step_start = t0  # on the model clock
        self.last_return: int | None = t0
        self.compute_ns = 0
        # the replayer's own work on the program's data in calls with virtual members
        # (payloads read and decompressed, outputs built), within the current step
        self.own_ns = 0
        self.steps: list[list] = []  # [step, start_ns, end_ns, compute_ns, peak_bytes, own_ns]
        # When the last call gave control back, and how long calls waited inside the replayer
        # for real peers (exchanges among real members), in all: a program that is the bundle
        # (driver.py) tells the replayer's own time in a call from a wait with them
        self.returned_ns = 0
        self.blocked_ns = 0

    def _init_memory(self, info: dict) -> None:
        """The memory tracker the recording's device asks for (CPU: a dispatch-mode
        tracker; CUDA: the allocator's peaks), the program's device here, and the calls'
        footprints."""
        if info.get("memory") and info.get("device", "cpu") == "cpu":
            from prism_rr.intercept.memory import CpuMemoryTracker

            self._memory = CpuMemoryTracker()
            self._memory_mode = dispatch.start(self._memory, on_error=self._memory_failed)
        elif str(info.get("device", "")).startswith("cuda") and _cuda_here():
            from prism_rr.intercept.memory import CudaPeaks

            self._memory = CudaPeaks()  # the recorder always reads CUDA's statistics
        else:
            self._memory = None
        # where the program's tensors are here: a replay of a CUDA recording on CPU runs on CPU
        self._device = "cuda" if str(info.get("device", "")).startswith("cuda") and _cuda_here() else "cpu"
        self._footprints: dict | None = None  # a call's kind (_kind) -> bytes: footprint()
        self.footprint_due = 0  # the footprint of the call in progress, made once it returns

    def _init_device_clock(self, info: dict) -> None:
        """The steps on the device's clock, where the recording has them there (issue 27): a
        mark on the program's stream at each step boundary (key: the step it ends, -1 the
        start), resolved when the results are written; the card then scores device times."""
        self._dclock = None
        self._dmarks: dict[int, int] = {}
        if info.get("device_time"):
            try:

                self._dclock = clock_for(str(info.get("device", "cpu")))
                if self._dclock is not None:
                    self._dclock.mark(-1)
            except Exception as exc:
                log.warning("prism-rr: the replay's steps are timed on the host only: %s", exc)
                self._dclock = None

    def _init_device_waits(self) -> None:
        """Virtual peers' waits through a waiter (_device_wait) where asked, with live
        timing: on CUDA they occupy the program's stream instead of blocking the host.
        Made at the first step boundary, once the program has chosen its device; the
        calls of step 0 wait on the host."""
        self.waiter = None
        self._wait_args: list[tuple[int, int]] = []  # (offset, transfer) ns of the first waits
        # (wait's index, step, offset, transfer) of the last waits, as many as their ends' slots
        self._wait_trace: deque = deque(maxlen=TRACE_SLOTS)
        mech = os.environ.get(WAITS_VAR, "").strip().lower()
        self._waits = mech if self.live and mech not in ("", "0", "off", "none") else None

    def _init_device_reads(self) -> None:
        """A call's inputs checked against the recorded digests without a host
        synchronization: on CUDA read once the device has passed them (DeviceReads),
        compared then (at the next call, step boundary or the end); "cpu" runs the same
        path on CPU tensors (tests), "0" reads them at once.
        With --continue-on-divergence at once: a call's outputs are built from its live
        inputs when they differ, which must be known before they are built."""
        checks = os.environ.get(CHECKS_VAR, "").strip().lower()
        off = checks in ("0", "off", "no", "none", "false") or self.options.continue_on_divergence
        self._reads_device = None if off else (checks if checks in ("cpu", "cpu-late") else "cuda")
        self.reads = None  # the DeviceReads, made at the first call whose inputs it takes
        self.inputs_checked_later = 0  # calls whose inputs were compared so

    def source(self, rank: int) -> int:
        """The rank whose records `rank` replays: itself when recorded, else its role's
        representative."""
        if rank in self.schedule.recorded or self.roles is None:
            return rank
        return self.roles.rep(rank)

    def shapes_predicted(self, group: int, op: str, seq: int, diffs: list) -> None:
        """A call whose shapes `scale` predicted: count it, and keep the first differences."""
        self.predicted_shape_calls += 1
        if diffs:
            self.predicted_shape_mismatches += 1
            if len(self.predicted_shape_examples) < 5:
                self.predicted_shape_examples.append({"group": group, "seq": seq, "op": op, "diffs": diffs})

    # --- the real rank's clock ---------------------------------------------------------

    @property
    def device(self) -> str:
        """Where the program's tensors are in this replay: "cuda" or "cpu"."""
        return self._device

    def model_now(self, t: int | None = None) -> int:
        """The model clock now: real time with live timing, the virtual clock with virtual."""
        t = monotonic_ns() if t is None else t
        if not self.virtual:
            return t
        return self._model_mark + int((t - self._real_mark) * self._factor)

    def _mark(self, t: int, model: int) -> None:
        self._real_mark, self._model_mark = t, model

    def passed(self, model_ns: int) -> bool:
        return not self.live or model_ns <= monotonic_ns()

    def fire_at(self, model_ns: int, fn) -> None:
        self.alarm.at(model_ns if self.live else 0, fn)

    # --- calls ------------------------------------------------------------------

    def enter(self) -> int:
        """A call of the program starts; returns its entry on the model clock."""
        t = monotonic_ns()
        if self.stopped is not None:
            raise DivergenceError(self.stopped.paragraph())
        if self.hang is not None:
            raise HangError(sentence(self.hang))
        gap = t - self.last_return if self.last_return is not None and t > self.last_return else 0
        self.compute_ns += gap
        if self.live and self._pad != 1.0 and gap:
            # compute_scale on a live rank: make its compute as long as asked, by waiting.
            sleep_until(t + int(gap * (self._pad - 1.0)))
            t = monotonic_ns()
        self.last_return = None
        self.calls += 1
        model = self.model_now(t)
        self._mark(t, model)
        return model

    def returned(self) -> None:
        """The call gives control back: on the model clock issuing takes no time."""
        t = monotonic_ns()
        self.last_return = self.returned_ns = t
        if self.virtual:
            self._real_mark = t  # the model mark stays at the entry
        else:
            self._mark(t, t)

    def wait_until(self, model_ns: int, *, blocking: bool, ticket=None) -> None:
        """The program waits for a call that completes at `model_ns` (or, queued with the
        waiter, when its `ticket` says: on CUDA the stream waits, not the host)."""
        if ticket is not None:
            ticket.wait()
        elif self.live:
            sleep_until(model_ns)
        t = monotonic_ns()
        model = max(self.model_now(t), model_ns)
        self._mark(t, model)
        if blocking:
            self.last_return = t  # waiting in a blocking call is not compute (as recorded)

    def waited(self, work) -> None:
        """work.wait() of a real backend inside a call: time with the real peers, not the
        replayer's own (`blocked_ns`)."""
        t = monotonic_ns()
        work.wait()
        self.blocked_ns += monotonic_ns() - t

    def touched(self, *objs) -> None:
        """The program used these tensors until now (for the memory tracker: a wait()
        completed their call, as the recorder notes it)."""
        if self._memory is not None:
            try:
                self._memory.touch(*objs)
            except Exception:
                pass

    def work(self, model_ns: int, value, *, blocking: bool, inputs=None, arrival: int | None = None,
             transfer: int = 0):
        """A Work that completes with `value` at `model_ns` (at once with timing none). With
        a waiter, the wait is queued where the program's work is: until the later of the
        stream's arrival and the last virtual arrival (`arrival`, model ns), then `transfer`."""
        from prism_rr.replayer._work import ReplayWork

        ticket = None
        if self.waiter is not None and arrival is not None:
            offset, transfer = arrival - self.step_start, max(0, transfer)
            i = self.waiter.waits  # this wait's index: its end goes into ring slot i
            ticket = self.waiter.occupy_aside(self.step % STEP_SLOTS, offset, transfer, STEP_SLOTS + i % TRACE_SLOTS)
            if len(self._wait_args) < 4096:  # what the waits were asked, for the report
                self._wait_args.append((offset, transfer))
            self._wait_trace.append((i, self.step, offset, transfer))
        return ReplayWork(self, model_ns if self.timed else 0, value, blocking=blocking, inputs=inputs, ticket=ticket)

    def footprint(self, rec) -> int:
        """Bytes the program held above its level at `rec`'s entry while the recorded call
        ran: what the backend made on the program's thread (gloo's flat copy of a
        reduce_scatter's input) and a virtual call does not. Seen in the records as a rise
        of the running peak from a call's entry to the next record, which only shows where
        the step's running peak was not already higher (the recording's timing decides
        that), so each kind of call (group, op, bytes in and out) takes the smallest rise
        seen for any call of its kind, at most its own bytes in and out (what a backend's
        copies of them take: a larger rise is the program's compute after the call, which
        the replay runs itself). 0 where none showed or memory was not recorded."""
        if self._memory is None or rec is None:
            return 0
        if self._footprints is None:
            self._footprints = {}
            last = None
            for r in self.bundle.events(self.rank):
                peak = getattr(r, "mem_peak", None)
                if peak is None or type(r).__name__ == "Step":
                    last = None
                    continue
                if last is not None and peak > last.mem_peak:
                    rise = min(peak - last.mem_alloc, _own_bytes(last))
                    key = _kind(last)
                    if rise > 0 and rise < self._footprints.get(key, rise + 1):
                        self._footprints[key] = rise
                last = r if getattr(r, "seq", None) is not None and getattr(r, "mem_alloc", None) is not None else None
        return self._footprints.get(_kind(rec), 0)

    def transient(self, nbytes: int) -> None:
        """Hold `nbytes` more of the program's memory for a moment (a recorded call's
        footprint, `footprint`): its peak meets the recording's."""
        if nbytes <= 0 or self._memory is None:
            return
        import torch

        scratch = torch.empty(nbytes, dtype=torch.uint8, device=self._device)
        del scratch

    def aside(self, fn, *args):
        """fn(*args): replay work inside a call, not the program's memory."""
        return dispatch.aside(self._memory_mode, fn, *args)

    @staticmethod
    def _memory_failed(exc) -> None:
        log.warning("prism-rr: replay memory tracking is off: %s", exc)

    # --- divergence -------------------------------------------------------------

    def made_up(self) -> None:
        """A call's result was made up (a virtual peer's data was not recorded): from now
        on this rank computes on other numbers than the recording's, and its calls' data
        is no longer compared (analysis.call_divergence); the time says from when, for
        the replay's own recording."""
        if not self.synthetic:
            self.synthetic = True
            self.made_up_from_ns = monotonic_ns()

    def reads_for(self, tensors):
        """The DeviceReads that reads these inputs once the device has passed them, or None
        where they are read at once (on CPU; off; a CUDA graph being captured)."""
        if self._reads_device is None or not tensors or tensors[0].device.type != self._reads_device.partition("-")[0]:
            return None
        if self.reads is None:
            from prism_rr.intercept.device_reads import DeviceReads

            self.reads = DeviceReads(self._reads_device)
        return self.reads if self.reads.wanted(tensors) else None

    def check_read(self, final: bool = False) -> None:
        """Compare the inputs the device has passed with the recording (each read's key
        begins with the function that does: the policy's); with `final`, all of them."""
        reads = self.reads
        if reads is not None and reads._pending:
            reads.drain(self._check_one, final)
            if final and reads._pending:
                from prism_rr.intercept.device_reads import FINAL_WAIT_S

                log.warning("prism-rr: the inputs of the last %d calls were not compared with the recording: "
                            "the device did not pass them in %.0f s", reads.pending, FINAL_WAIT_S)

    def _check_one(self, read) -> None:
        self.inputs_checked_later += 1
        try:
            read.key[0](read)
        except (DivergenceError, HangError):
            raise
        except Exception as exc:  # a comparison that failed: said, not the program's failure
            log.warning("prism-rr: the inputs of a call could not be compared with the recording: %s: %s",
                        type(exc).__name__, exc)

    def diverge(self, group: int, seq: int, op: str, what: str, expected, got, stack=None) -> None:
        """The replay left the recording at this call (`stack`: where the program made it,
        when it is found later than that: inputs read once the device passed them)."""
        if stack is None:
            # found at once: the calls before it are compared first (their inputs read
            # later), so that the first divergence is the first one made
            self.check_read(final=True)
        d = Divergence(rank=self.rank, group=group, seq=seq, op=op, what=what, expected=str(expected),
                       got=str(got), stack=user_stack() if stack is None else stack)
        self.divergences.append(d)
        if self.options.continue_on_divergence:
            log.warning("%s (continuing)", d.paragraph())
            return
        self.stopped = d  # the launcher's card says it, once
        self.write()
        raise DivergenceError(d.paragraph())

    def _exit_stopped(self, code: int) -> None:
        self.write()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)

    # --- the end of a recorded hang (_hang.py) -------------------------------------

    def made_call(self, key: tuple, seq: int) -> None:
        """The program made call `seq` of `key` (a group; a group, direction and peer)."""
        if self.made.get(key, 0) <= seq:
            self.made[key] = seq + 1

    def stop_at_hang(self, found: dict) -> None:
        """Stop the program at the end of a recorded hang (exit 7 once it has unwound)."""
        self.check_read(final=True)  # a divergence at a call before it comes first
        self.hang = found  # the launcher's card says it, once
        self.write()
        raise HangError(sentence(found))

    def fail_as_recorded(self, found: dict) -> None:
        """A call that ended in an error in the recording: raise that error in the program
        (exit 7 once it has unwound; a later call stops it as a hang would)."""
        self.check_read(final=True)
        self.hang = found  # the launcher's card says it, once
        self.write()
        raise raised(found["error"])

    def resolve(self, found: dict) -> None:
        """A call of this rank resolved a recorded hang: its peers go on past their recording."""
        self.ends.release(p["rank"] for p in found["peers"])
        self.resolved.append(found)
        log.warning("prism-rr: %s", sentence(found))

    def _waited_for(self) -> dict | None:
        """At the program's end: the virtual peers that wait, in the recording, in calls
        with this rank that it never made (it is the rank they wait for)."""
        peers = []
        for peer in sorted(self.schedule.pending):
            if peer in self.real:
                continue
            calls = self.ends.waits_for(peer, self.rank, self.made)
            if calls:
                peers.append({"rank": peer, "calls": [self.ends.call(c) for c in calls]})
        return {"kind": WAITED_FOR, "rank": self.rank, "peers": peers} if peers else None

    # --- steps --------------------------------------------------------------------

    def mark_step(self) -> None:
        """A step boundary: an optimizer step, or `prism_rr.step()` (after which optimizer
        steps no longer are, as when recording; OptimizerSteps says when)."""
        self.check_read()
        t = monotonic_ns()
        if self.last_return is not None and t > self.last_return:
            self.compute_ns += t - self.last_return
        model = self.model_now(t)
        self._mark(t, model)
        peak = self._memory.take_peak() if self._memory is not None else None
        self.steps.append([self.step, self.step_start, model, self.compute_ns, peak, self.own_ns])
        if self._dclock is not None:
            self._dclock.mark(self.step)
            try:  # what the device has passed, without waiting for it: the events stay few
                self._dmarks.update((k, ns) for k, ns in self._dclock.resolve() if ns is not None)
            except Exception as exc:
                log.warning("prism-rr: the replay's steps are timed on the host only: %s", exc)
                self._dclock = None
        if self.virtual and self.calibration is None:
            self._calibrate()
        self.step += 1
        self.step_start = model
        self.last_return = t
        self.compute_ns = 0
        self.own_ns = 0
        if self._waits is not None:
            self._stamp_step()
        # the virtual peers start this step relative to us, as they did in the recording
        self.clock.step_started(model, self.schedule.step_ends.get(self.source(self.rank), {}).get(self.step - 1))

    def _stamp_step(self) -> None:
        """The step's start, in the waiter's slot for this step (made on first use)."""
        try:
            if self.waiter is None:
                import torch

                from prism_rr.replayer._device_wait import waiter_for

                on = torch.device("cuda", torch.cuda.current_device()) if self._device == "cuda" else "cpu"
                self.waiter = waiter_for(on, None if self._waits in ("1", "on", "auto") else self._waits,
                                         slots=STEP_SLOTS + TRACE_SLOTS)
            self.waiter.stamp(self.step % STEP_SLOTS)
        except Exception as exc:
            log.warning("prism-rr: virtual peers wait on the host (%s: %s)", type(exc).__name__, exc)
            self._waits = self.waiter = None

    def _last_waits(self) -> list[list[float]]:
        """[step, asked offset, asked transfer, end after the step's stamp] (ms) of the last
        waits whose step's stamp and end slot are still held: where a wait ended on the
        device, beside what it was asked (a later end: the stream, or the wait's own start,
        came after the peer). One read of the device's slots, at the end."""
        if self.waiter is None or not self._wait_trace:
            return []
        try:
            v = self.waiter.read_all()
        except Exception as exc:
            log.warning("prism-rr: the device waits' ends could not be read: %s", exc)
            return []
        out = []
        for i, step, offset, transfer in self._wait_trace:
            if self.step - STEP_SLOTS < step <= self.step:  # its stamp not yet written over
                end = v[STEP_SLOTS + i % TRACE_SLOTS] - v[step % STEP_SLOTS]
                out.append([step, round(offset / 1e6, 4), round(transfer / 1e6, 4), round(end / 1e6, 4)])
        return out

    def _calibrate(self) -> None:
        """Virtual timing: real compute runs this much slower (or faster) than recorded."""
        recorded = sum(r.end_ns - r.start_ns for r in self.bundle.events(self.rank)
                       if isinstance(r, Compute) and r.name is None and r.step == self.step
                       and r.end_ns is not None)
        replayed = self.compute_ns
        self.calibration = recorded / replayed if recorded > 0 and replayed > 0 else 1.0
        self._factor = self.calibration * self.options.compute_scale

    # --- results ------------------------------------------------------------------

    def _device_steps(self) -> list[list[int]] | None:
        """[[step, dev_start_ns, dev_end_ns]] of the steps whose boundaries the device
        passed (ns from the clock's epoch); None without a device clock."""
        if self._dclock is None:
            return None
        try:
            self._dmarks.update((k, ns) for k, ns in self._dclock.resolve(final=True) if ns is not None)
        except Exception as exc:
            log.warning("prism-rr: the replay's device times could not be read: %s", exc)
        return [[s, self._dmarks[s - 1], self._dmarks[s]] for s, *_ in self.steps
                if s - 1 in self._dmarks and s in self._dmarks]

    def write(self) -> None:
        facts = {
            "rank": self.rank,
            "steps": self.steps,
            "device_steps": self._device_steps(),
            "device_clock": None if self._dclock is None else self._dclock.name,
            "device_waits": None if self.waiter is None else {"mechanism": self.waiter.name,
                                                              "waits": self.waiter.waits,
                                                              **_spread(self._wait_args),
                                                              "last": self._last_waits()},
            "calls": self.calls,
            # set-up: from the start-up hook to the first step's start (the program's imports
            # and model building with the replayer's own share), and that share: reading the
            # bundle and planning the virtual peers
            "setup_ns": None if self.armed_ns is None or not self.steps else self.steps[0][1] - self.armed_ns,
            "replayer_setup_ns": self.setup_ns,
            "synthetic_numerics": self.synthetic,
            "inputs_made_up_calls": self.inputs_made_up_calls,
            "inputs_checked_later": self.inputs_checked_later,
            "made_up_from_ns": self.made_up_from_ns,
            "predicted_shape_calls": self.predicted_shape_calls,
            "predicted_shape_mismatches": self.predicted_shape_mismatches,
            "predicted_shape_examples": self.predicted_shape_examples,
            "divergences": [d.to_dict() for d in self.divergences[:100]],
            "stopped": self.stopped is not None,
            "hang": self.hang,
            "resolved": self.resolved,
            "waited_for": self.waited_for,
            "timing": self.options.timing,
            "calibration": self.calibration,
            "trace": self.trace,
            "program": None if self.program is None else self.program.facts(),
            "exiting": self.exiting,
        }
        text = json.dumps(facts)
        path = stats_path(self.options.work_dir, self.rank)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        self._written = True
        if self.exchange is not None:
            try:
                self.exchange.put(self.rank, text)
            except Exception as exc:  # the launcher's store is gone: this node's report has it
                log.warning("prism-rr: could not share the replay results of rank %d: %s", self.rank, exc)

    def _at_exit(self) -> None:
        self.exiting = True  # the program is done: its results stand (see launch)
        if self.stopped is None:
            try:
                self.check_read(final=True)
            except DivergenceError:
                pass  # said and kept (self.stopped): the exit code below says so
            except Exception as exc:
                log.warning("prism-rr: the last calls' inputs could not be checked: %s", exc)
        if self.stopped is None and self.hang is None:
            try:
                self.waited_for = self._waited_for()
            except Exception as exc:
                log.warning("prism-rr: could not tell who waits for this rank: %s", exc)
        for ref in self.policies:
            policy = ref()
            if policy is not None:
                try:
                    policy.release()
                except Exception:
                    pass
        try:
            self.write()
        except Exception as exc:
            log.warning("prism-rr: could not write the replay results: %s", exc)
        if self.gathers and self.stopped is None:
            try:
                self.exchange.gather()
            except Exception as exc:
                log.warning("prism-rr: could not gather the other real ranks' results: %s", exc)
        if self.stopped is not None:
            self._exit_stopped(3)
        if self.hang is not None:
            self._exit_stopped(7)
