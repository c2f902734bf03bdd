"""The replayer's side of group creation: make `init_process_group`/`new_group` build
replay groups (InterceptGroups with the replay policy), without editing the program.

As for the recorder, intercept/creation.py wraps torch's `_new_process_group_helper`
and counts group ids the same way, so they name the same groups as the bundle.

The env:// rendezvous is replaced: the program asks for a world of the recorded size,
but only the real ranks exist. They meet on their own store (a TCPStore on the replay's
port, sized for the real ranks; a HashStore when there is one; under a launcher,
torchrun's store, see _torchrun.py), and the Python groups make no store calls of their
own.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import weakref
from datetime import timedelta
from time import monotonic_ns
from urllib.parse import parse_qs, urlparse

from prism_rr import recorder
from prism_rr.errors import DivergenceError, HangError, ReplayError
from prism_rr.intercept import teardown
from prism_rr.intercept.creation import GroupCreation, Plan, fix_books
from prism_rr.intercept.hook import on_import
from prism_rr.intercept.stack import user_code
from prism_rr.replayer._gather import StatsExchange
from prism_rr.replayer._options import BACKEND, ENV_VAR, ReplayOptions, stats_path
from prism_rr.replayer._torchrun import enter_worker, launcher_store

# Deferred imports: torch, and the modules that import it (the replay's session and policy,
# intercept.group), until the program makes its world group: the start-up hook arms the
# replayer from this module in every replayed rank, before the program imports torch.

__all__ = ["arm", "install"]

log = logging.getLogger("prism_rr.replayer")


class _Replayer:
    """The replayer's answers to GroupCreation: every group is taken."""

    backend = BACKEND

    def __init__(self):
        self.options: ReplayOptions | None = None
        self.session = None
        self.worker = None  # under a launcher: what torchrun made of this process
        self.exchange = None  # ... and the real ranks' results on its store
        self.armed_ns: int | None = None  # when the start-up hook armed the replayer

    def plan(self, gid: int, a: dict, is_world: bool) -> Plan:
        if is_world and self.session is None:
            from prism_rr.replayer._session import ReplaySession

            made = monotonic_ns()
            try:
                self.session = ReplaySession(self.options, int(a["group_rank"]), int(a["group_size"]))
            except ReplayError as exc:  # another world size, a rank not recorded: the launcher says it once
                _refuse(self.options, int(a["group_rank"]), str(exc))
            self.session.armed_ns = self.armed_ns
            self.session.setup_ns = monotonic_ns() - made
            if self.exchange is not None:
                self.session.exchange = self.exchange
                self.session.gathers = self.worker.local_rank == 0
            if self.options.output:
                _record_replay(self.session, "gloo")
        backend = str(a["backend"]).lower()
        real_name = "gloo" if backend in ("undefined", "none", "") else backend
        members = list(a["global_ranks_in_group"] or [])
        return Plan(gid, members or list(range(int(a["group_size"]))), real_name)

    def unreadable(self, exc: Exception) -> None:
        """torch's group-creation arguments could not be read: no replay can follow."""
        _refuse(self.options, int(os.environ.get("RANK", "0")),
                f"this torch's process-group creation is not one prism-rr knows ({type(exc).__name__}: {exc})")

    def untaken(self, result, is_world: bool) -> None:
        pass  # every group is taken

    def create(self, plan: Plan, dist_opts, backend_options):
        from torch.distributed import PrefixStore, ProcessGroupGloo

        from prism_rr.intercept.group import InterceptGroup
        from prism_rr.replayer._policy import Absent, ReplayPolicy

        session = self.session
        ranks = plan.ranks
        real = [g for g in ranks if g in set(session.real)]
        real_pg = None
        if len(real) > 1:
            store = PrefixStore("prism_rr_real/", dist_opts.store)
            real_pg = ProcessGroupGloo(store, real.index(session.rank), len(real), timeout=dist_opts.timeout)
        all_real = len(real) == len(ranks) and real_pg is not None
        policy = ReplayPolicy(session, plan.gid, ranks, real_pg=real_pg, all_real=all_real)
        session.policies.append(weakref.ref(policy))
        return InterceptGroup({"cpu": real_pg if all_real else Absent()}, dist_opts.group_rank,
                              dist_opts.group_size, gid=plan.gid, ranks=ranks, policy=policy,
                              observer=recorder.current_observer(), backend_name=plan.real_name)

    def created(self, pg, plan: Plan, is_world: bool) -> None:
        fix_books(pg, plan.real_name)
        _check_group(self.session, plan.gid, pg.ranks)
        if pg.observer is not None:
            pg.observer.group_created(plan.gid, pg.ranks, pg.getGroupName(), pg.getGroupDesc(), plan.real_name)


_replayer = _Replayer()
_creation = GroupCreation(_replayer)


def current_session():
    """This process's ReplaySession, once `init_process_group` made it; else None."""
    return _replayer.session


def _quiet_stops() -> None:
    """A program the replay stopped (a divergence, the end of a recorded hang or failure)
    unwinds with the replay's exception; uncaught, Python would print its traceback through
    prism_rr's own modules, and its message, which the launcher's card already says once.
    Instead: one line naming where the program was stopped (PRISM_RR_DEBUG=1: the whole
    traceback too). Any other exception is the program's, and prints as it would."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        if not isinstance(value, (DivergenceError, HangError)) or os.environ.get("PRISM_RR_DEBUG"):
            previous(kind, value, tb)
            return
        where = None
        while tb is not None:  # the innermost of the program's frames, as a call's stack names them
            code = tb.tb_frame.f_code
            if user_code(code):
                where = f"{os.path.basename(code.co_filename)}:{tb.tb_lineno} in {code.co_name}"
            tb = tb.tb_next
        at = f" at {where}" if where else ""
        print(f"prism-rr: the replay stopped the program{at} (its verdict follows; PRISM_RR_DEBUG=1 shows the "
              f"traceback)", file=sys.stderr, flush=True)

    sys.excepthook = hook


def install(options: ReplayOptions) -> None:
    import torch.distributed.rendezvous

    # Not `import torch.distributed.rendezvous as rdzv`: once torch.distributed is whole, its
    # attribute `rendezvous` is the function it re-exports, and that is what the name binds.
    rdzv = sys.modules["torch.distributed.rendezvous"]

    _replayer.options = options
    _creation.install()
    _quiet_stops()
    rdzv._rendezvous_handlers["env"] = _env_rendezvous


def arm() -> None:
    """From the start-up hook: read PRISM_RR_REPLAY and wait for torch.distributed.

    Under a launcher, first make a worker's environment the recorded world's (before the
    program reads it); torchrun's own process arms nothing."""
    teardown.register()  # torch's gloo threads must not abort the process after its last line
    _replayer.armed_ns = monotonic_ns()
    options = ReplayOptions.from_json(os.environ[ENV_VAR])
    if options.launcher:
        try:
            _replayer.worker = enter_worker(options)
        except ReplayError as exc:
            _refuse(options, int(os.environ.get("RANK", "0")), str(exc))
        if _replayer.worker is None:
            return
    on_import("torch.distributed.distributed_c10d", lambda _module: install(options))


def _env_rendezvous(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs):
    """Like torch's env:// handler, but the store joins only the real ranks."""
    from torch.distributed import HashStore, TCPStore

    opts = _replayer.options
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    asked = parse_qs(urlparse(url).query).get("world_size")  # init_process_group(world_size=N)
    if asked and asked[0] != str(world):
        _refuse(opts, rank, f"the program made a world of {asked[0]}; the recording has {world}")
    real = list(opts.ranks)
    if _replayer.worker is not None:
        store = launcher_store(_replayer.worker, timeout)
        _replayer.exchange = StatsExchange(store, real, opts.work_dir)
    elif len(real) == 1:
        store = HashStore()
    else:
        store = TCPStore("127.0.0.1", opts.real_port, len(real), rank == real[0], timeout=timeout,
                         wait_for_workers=True)
    yield (store, rank, world)
    raise RuntimeError("prism-rr replay: cannot re-rendezvous")


def _refuse(options: ReplayOptions, rank: int, why: str) -> None:
    """End this rank before its program goes on: the replay cannot be what it asks for.
    The launcher reads `why` and prints it once for all real ranks."""
    try:
        path = stats_path(options.work_dir, rank)
        path.write_text(json.dumps({"rank": rank, "error": why}))
    except Exception:
        print(f"prism-rr: replay: {why}", file=sys.stderr, flush=True)
    os._exit(2)


def _record_replay(session, backend: str) -> None:
    """-o: record this rank's calls as they happen in the replay, in the recorder's format."""
    opts = session.options
    recorder.record_replay(opts.output, payload=opts.payload, rank=session.rank,
                           world_size=session.bundle.world_size, backend=backend,
                           replay_of={"bundle": opts.bundle, "ranks": list(opts.ranks), "timing": opts.timing},
                           device=session.device)


def _check_group(session, gid: int, ranks) -> None:
    recorded = session.schedule.groups.get(gid)
    if recorded is not None and tuple(recorded) != tuple(ranks):
        session.diverge(gid, -1, "new_group", "ranks", list(recorded), list(ranks))
