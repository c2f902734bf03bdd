"""Make `init_process_group`/`new_group` build replay groups, without editing the program.

As the recorder does, we wrap torch's `_new_process_group_helper` and let it build our
registered backend; its creator makes a ReplayGroup. Group ids count every call of the
helper (members or not) from the world group on, as the recorder counts them, so they
name the same groups as the bundle.

The env:// rendezvous is replaced: the program asks for a world of the recorded size,
but only the real ranks exist. They meet on their own store (a TCPStore on the replay's
port, sized for the real ranks; a HashStore when there is one), and the Python groups
make no store calls of their own.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from datetime import timedelta

from prism_rr.replayer._options import ReplayOptions

__all__ = ["BACKEND", "install"]

BACKEND = "prism_rr_replay"
log = logging.getLogger("prism_rr.replayer")


class _State:
    def __init__(self):
        self.options: ReplayOptions | None = None
        self.original = None
        self.signature = None
        self.registered = False
        self.next_gid = 0
        self.session = None
        self.pending = threading.local()


_state = _State()


def install(options: ReplayOptions) -> None:
    import torch.distributed.rendezvous as rdzv

    from prism_rr.recorder._install import patch_group_creation

    _state.options = options
    patch_group_creation(_state, BACKEND, _create, _helper)
    rdzv._rendezvous_handlers["env"] = _env_rendezvous


def step() -> None:
    """`prism_rr.step()` in the replayed program: a step boundary by hand."""
    session = _state.session
    if session is not None:
        session.mark_step(manual=True)


def _env_rendezvous(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs):
    """Like torch's env:// handler, but the store joins only the real ranks."""
    from torch.distributed import HashStore, TCPStore

    from urllib.parse import parse_qs, urlparse

    opts = _state.options
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    asked = parse_qs(urlparse(url).query).get("world_size")  # init_process_group(world_size=N)
    if asked and asked[0] != str(world):
        _refuse(opts, rank, f"the program made a world of {asked[0]}; the recording has {world}")
    real = list(opts.ranks)
    if len(real) == 1:
        store = HashStore()
    else:
        store = TCPStore("127.0.0.1", opts.real_port, len(real), rank == real[0], timeout=timeout,
                         wait_for_workers=True)
    yield (store, rank, world)
    raise RuntimeError("prism-rr replay: cannot re-rendezvous")


def _helper(*args, **kwargs):
    st = _state
    bound = st.signature.bind(*args, **kwargs)
    a = bound.arguments
    members = list(a["global_ranks_in_group"] or [])
    is_world = not members
    if is_world:
        st.next_gid = 0
        if st.session is None:
            from prism_rr.errors import ReplayError
            from prism_rr.replayer._session import ReplaySession

            try:
                st.session = ReplaySession(st.options, int(a["group_rank"]), int(a["group_size"]))
            except ReplayError as exc:  # another world size, a rank not recorded: the launcher says it once
                _refuse(st.options, int(a["group_rank"]), str(exc))
            if st.options.output:
                _record_replay(st.session, "gloo")
    gid = st.next_gid
    st.next_gid += 1
    backend = str(a["backend"]).lower()
    real_name = "gloo" if backend in ("undefined", "none", "") else backend
    st.pending.value = (gid, members or list(range(int(a["group_size"]))), real_name)
    a["backend"] = BACKEND
    try:
        result = st.original(*bound.args, **bound.kwargs)
    finally:
        st.pending.value = None
    from prism_rr.recorder._install import _fix_books
    from prism_rr.replayer._group import ReplayGroup

    pg = result[0]
    if isinstance(pg, ReplayGroup):
        _fix_books(pg, real_name)
        _check_group(st.session, gid, pg._ranks)
        rec = st.session.rec
        if rec is not None:
            rec.group_created(gid, pg._ranks, pg.getGroupName(), pg.getGroupDesc(), real_name)
    return result


def _refuse(options: ReplayOptions, rank: int, why: str) -> None:
    """End this rank before its program goes on: the replay cannot be what it asks for.
    The launcher reads `why` and prints it once for all real ranks."""
    import json
    import sys

    from prism_rr.replayer._session import stats_path

    try:
        path = stats_path(options.work_dir, rank)
        path.write_text(json.dumps({"rank": rank, "error": why}))
    except Exception:
        print(f"prism-rr: replay: {why}", file=sys.stderr, flush=True)
    os._exit(2)


def _record_replay(session, backend: str) -> None:
    """-o: record this rank's calls as they happen in the replay, in the recorder's format."""
    from prism_rr.recorder import _manifest
    from prism_rr.recorder._options import RecordOptions
    from prism_rr.recorder._session import Recording

    opts = session.options
    options = RecordOptions.make(opts.output, payload=opts.payload)
    info = _manifest.rank_info(options, session.rank, session.bundle.world_size, backend, "cpu")
    info["replay_of"] = {"bundle": opts.bundle, "ranks": list(opts.ranks), "timing": opts.timing}
    rec = Recording(options, session.rank, info)
    rec.start()
    session.rec = rec


def _check_group(session, gid: int, ranks) -> None:
    recorded = session.schedule.groups.get(gid)
    if recorded is not None and tuple(recorded) != tuple(ranks):
        session.diverge(gid, -1, "new_group", "ranks", list(recorded), list(ranks))


def _create(dist_opts, backend_options):
    from torch.distributed import PrefixStore, ProcessGroupGloo

    from prism_rr.replayer._group import ReplayGroup

    gid, ranks, real_name = _state.pending.value
    session = _state.session
    real = [g for g in ranks if g in set(session.real)]
    real_pg = None
    if len(real) > 1:
        store = PrefixStore("prism_rr_real/", dist_opts.store)
        real_pg = ProcessGroupGloo(store, real.index(session.rank), len(real), timeout=dist_opts.timeout)
    group = ReplayGroup(session, dist_opts.group_rank, dist_opts.group_size, gid=gid, ranks=ranks,
                        real_pg=real_pg, all_real=len(real) == len(ranks) and real_pg is not None,
                        backend_name=real_name)
    session.groups.append(weakref.ref(group))
    return group
