"""Make `init_process_group`/`new_group` build InterceptGroups, without editing the program.

torch creates every process group in `distributed_c10d._new_process_group_helper`. A
`GroupCreation` wraps that function for one side (recorder or replayer): when the side
takes a group, the call goes on with the side's registered backend, whose creator the
side supplies (the recorder's builds the real backend exactly as torch would: same store
prefix, options, sequence numbers). Afterwards the world's books name the real backend
again, so `get_backend()` and code that branches on it see what they saw before. Group
ids count every call of the helper (members or not) from the world group on, so every
rank, recording or replaying, names the same groups alike.

Importing this module imports nothing heavy: torch is imported when it is installed.
"""

from __future__ import annotations

import inspect
import threading

# Deferred imports: torch.distributed and intercept.group (torch) until a side installs or
# torch creates a group: the start-up hook imports this module before the program imports
# torch, and importing torch.distributed here could run mid-import of torch itself.

__all__ = ["GroupCreation", "Plan", "fix_books", "make_real", "real_device_map"]

_REAL = ("gloo", "nccl")  # the backends an InterceptGroup can wrap


class Plan:
    """What a side decided for one group it takes: the creator reads it."""

    __slots__ = ("gid", "ranks", "real_name", "devices")

    def __init__(self, gid: int, ranks: list, real_name: str, devices: dict | None = None):
        self.gid = gid
        self.ranks = ranks  # global ranks of the group, in group order
        self.real_name = real_name  # the backend the program asked for, as torch's books keep it
        self.devices = devices  # device type -> real backend name, where the side builds them


class GroupCreation:
    """One side's patch of torch's group creation. The side answers:

    - `side.backend`: the backend name registered with torch;
    - `side.plan(gid, args, is_world) -> Plan | None`: take this group (None: torch builds
      it as it would, and `side.untaken(result, is_world)` hears of it);
    - `side.create(plan, dist_opts, backend_options) -> InterceptGroup`: torch's creator;
    - `side.created(pg, plan, is_world)`: the group is made and torch's books are fixed;
    - `side.unreadable(exc)`: torch's arguments could not be read (another torch): the
      recorder lets torch build the group, the replayer refuses.
    """

    def __init__(self, side):
        self.side = side
        self.original = None  # torch's _new_process_group_helper
        self.signature = None
        self.registered = False
        self.next_gid = 0
        self.pending = threading.local()

    def install(self) -> None:
        """Register the backend and route torch's group creation through us (idempotent)."""
        import torch.distributed.distributed_c10d as c10d  # may run mid-import of torch.distributed

        if not self.registered:
            c10d.Backend.register_backend(self.side.backend, self._create, extended_api=True,
                                          devices=["cpu", "cuda"])
            self.registered = True
        if self.original is None:
            self.original = c10d._new_process_group_helper
            self.signature = inspect.signature(self.original)
            c10d._new_process_group_helper = self._helper

    def uninstall(self) -> None:
        """Stop taking new groups; groups already made keep their policy."""
        import torch.distributed.distributed_c10d as c10d

        if self.original is not None and c10d._new_process_group_helper == self._helper:
            c10d._new_process_group_helper = self.original
        self.original = None

    def _helper(self, *args, **kwargs):
        original = self.original
        if original is None:  # uninstalled while torch held on to us
            import torch.distributed.distributed_c10d as c10d

            original = c10d._new_process_group_helper
        try:
            bound = self.signature.bind(*args, **kwargs)
            a = bound.arguments
            is_world = not (a["global_ranks_in_group"] or [])
        except Exception as exc:  # a torch whose helper takes other arguments
            self.side.unreadable(exc)
            return original(*args, **kwargs)
        if is_world:
            self.next_gid = 0
        gid = self.next_gid
        self.next_gid += 1
        plan = self.side.plan(gid, a, is_world)
        if plan is None:
            result = original(*args, **kwargs)
            self.side.untaken(result, is_world)
            return result
        self.pending.value = plan
        a["backend"] = self.side.backend
        try:
            result = original(*bound.args, **bound.kwargs)
        finally:
            self.pending.value = None
        from prism_rr.intercept.group import InterceptGroup

        pg = result[0]
        if isinstance(pg, InterceptGroup):
            self.side.created(pg, plan, is_world)
        return result

    def _create(self, dist_opts, backend_options):
        return self.side.create(self.pending.value, dist_opts, backend_options)


def fix_books(pg, real_name: str) -> None:
    """Name the real backend in torch's world state, as if we were not there."""
    import torch.distributed.distributed_c10d as c10d

    world = c10d._world
    if pg in world.pg_map:
        _, store = world.pg_map[pg]
        world.pg_map[pg] = (c10d.Backend(real_name), store)
    if pg in world.pg_backend_config:
        world.pg_backend_config[pg] = str(c10d.BackendConfig(c10d.Backend(real_name)))


def real_device_map(backend) -> dict[str, str] | None:
    """device -> real backend name for the backend the program asked for, or None when
    an InterceptGroup cannot wrap it."""
    import torch.distributed.distributed_c10d as c10d

    name = str(backend).lower()
    try:
        dmap = c10d.BackendConfig(c10d.Backend(name)).get_device_backend_map()
    except Exception:
        return None
    dmap = {d: str(b) for d, b in dmap.items()}
    if not dmap or any(b not in _REAL for b in dmap.values()):
        return None
    return dmap


def make_real(dmap: dict, dist_opts, backend_options) -> dict:
    """device -> real backend, built as torch's _new_process_group_helper builds them."""
    from torch.distributed import PrefixStore

    base = dist_opts.store.underlying_store  # strip the device prefix torch added for our backend
    if len(set(dmap.values())) == 1:
        first = next(iter(dmap))
        backend = _make_one(dmap[first], PrefixStore(f"{first}/", base), dist_opts, backend_options)
        return dict.fromkeys(dmap, backend)
    return {device: _make_one(name, PrefixStore(f"{device}/", base), dist_opts, backend_options)
            for device, name in dmap.items()}


def _make_one(name, store, o, backend_options):
    rank, size, timeout = o.group_rank, o.group_size, o.timeout
    ranks = list(o.global_ranks_in_group)
    if name == "gloo":
        from torch.distributed import ProcessGroupGloo

        b = ProcessGroupGloo(store, rank, size, timeout=timeout)
        b.options.global_ranks_in_group = ranks
        b.options.group_name = o.group_id
    else:
        from torch.distributed import ProcessGroupNCCL

        if isinstance(backend_options, ProcessGroupNCCL.Options):
            opts = backend_options
        else:
            opts = ProcessGroupNCCL.Options()
            opts.is_high_priority_stream = False
        opts._timeout = timeout
        opts.global_ranks_in_group = ranks
        opts.group_name = o.group_id
        b = ProcessGroupNCCL(store, rank, size, opts)
    b._set_sequence_number_for_group()
    return b
