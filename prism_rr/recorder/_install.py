"""Make `init_process_group`/`new_group` build recording groups, without editing the script.

torch creates every process group in `distributed_c10d._new_process_group_helper`. We
wrap that function: when the requested backend is gloo or NCCL (or left to torch's
default), the call goes on with our registered backend, whose creator builds the real
backend exactly as torch would (same store prefix, options, sequence numbers) and wraps
it. Afterwards the world's books name the real backend again, so `get_backend()` and
code that branches on it see what they saw before.
"""

from __future__ import annotations

import inspect
import logging
import threading
from time import monotonic_ns

from prism_rr.recorder._options import RecordOptions

__all__ = ["BACKEND", "install", "installed_options", "uninstall"]

BACKEND = "prism_rr"
_REAL = ("gloo", "nccl")
log = logging.getLogger("prism_rr.recorder")


class _State:
    def __init__(self):
        self.options: RecordOptions | None = None
        self.original = None  # torch's _new_process_group_helper
        self.signature = None
        self.registered = False
        self.recording = True  # False on ranks outside the rank selection
        self.next_gid = 0
        self.rec = None  # the Recording of this process
        self.pending = threading.local()


_state = _State()


def installed_options() -> RecordOptions | None:
    return _state.options


def install(options: RecordOptions) -> None:
    """Register the backend and patch group creation (idempotent)."""
    _state.options = options
    patch_group_creation(_state, BACKEND, _create, _helper)


def patch_group_creation(state, backend: str, create, helper) -> None:
    """Register `backend` (made by `create`) and route torch's group creation through
    `helper`, keeping the original in `state` (idempotent). The replayer patches the same way."""
    import torch.distributed.distributed_c10d as c10d  # may run mid-import of torch.distributed

    if not state.registered:
        c10d.Backend.register_backend(backend, create, extended_api=True, devices=["cpu", "cuda"])
        state.registered = True
    if state.original is None:
        state.original = c10d._new_process_group_helper
        state.signature = inspect.signature(state.original)
        c10d._new_process_group_helper = helper


def uninstall() -> None:
    """Stop wrapping new groups; groups already made keep forwarding."""
    import torch.distributed.distributed_c10d as c10d

    if _state.original is not None and c10d._new_process_group_helper is _helper:
        c10d._new_process_group_helper = _state.original
    _state.original = None
    _state.options = None


def _real_device_map(backend) -> dict[str, str] | None:
    """device -> real backend name, or None when we do not wrap this backend."""
    import torch.distributed.distributed_c10d as c10d

    name = str(backend).lower()
    if name == BACKEND:
        return None
    try:
        dmap = c10d.BackendConfig(c10d.Backend(name)).get_device_backend_map()
    except Exception:
        return None
    dmap = {d: str(b) for d, b in dmap.items()}
    if not dmap or any(b not in _REAL for b in dmap.values()):
        return None
    return dmap


def _helper(*args, **kwargs):
    st = _state
    original = st.original or _fallback_original()
    options = st.options
    if options is None:
        return original(*args, **kwargs)
    try:
        bound = st.signature.bind(*args, **kwargs)
        a = bound.arguments
        is_world = len(a["global_ranks_in_group"] or []) == 0
        if is_world:
            st.next_gid = 0
            st.recording = options.records_rank(int(a["group_rank"]), int(a["group_size"]))
        gid = st.next_gid
        st.next_gid += 1
        dmap = _real_device_map(a["backend"]) if st.recording else None
        if is_world and st.recording and dmap is not None:
            _start_recording(options, int(a["group_rank"]), int(a["group_size"]), dmap)
            # torch.distributed has finished importing by now (it may import device_mesh
            # half-way through its own import, too early to patch).
            from prism_rr.recorder._boot import on_import

            on_import("torch.distributed.device_mesh", _patch_device_mesh)
            on_import("torch.distributed.fsdp._fully_shard._fsdp_param_group", _patch_fsdp)
        rec = st.rec
        wrap = dmap is not None and rec is not None and rec.on
    except Exception as exc:  # our bug: build the group as torch would
        log.warning("prism-rr: not recording this process group: %s: %s", type(exc).__name__, exc)
        return original(*args, **kwargs)
    if not wrap:
        result = original(*args, **kwargs)
        if is_world:
            _sync_clock(result[0], None)
        return result

    real_name = str(a["backend"])
    ranks = list(a["global_ranks_in_group"] or [])
    if rec.slice_pending:  # every group, this rank a member or not: the layout to find
        rec.group_seen(ranks or range(int(a["group_size"])), a.get("group_desc") or "")
    st.pending.value = (dmap, gid, ranks, real_name)
    a["backend"] = BACKEND
    try:
        result = original(*bound.args, **bound.kwargs)
    finally:
        st.pending.value = None
    pg = result[0]
    try:
        _fix_books(pg, real_name)
        from prism_rr.recorder._group import RecordingGroup

        if isinstance(pg, RecordingGroup):
            members = ranks or list(range(pg.size()))
            rec.group_created(gid, members, pg.getGroupName(), pg.getGroupDesc(),
                              ",".join(sorted(set(dmap.values()))))
            if is_world:
                _sync_clock(pg, rec)
    except Exception as exc:
        rec.fail(exc)
    return result


def _fallback_original():
    import torch.distributed.distributed_c10d as c10d

    return c10d._new_process_group_helper


def _fix_books(pg, real_name: str) -> None:
    """Name the real backend in torch's world state, as if we were not there."""
    import torch.distributed.distributed_c10d as c10d

    world = c10d._world
    if pg in world.pg_map:
        _, store = world.pg_map[pg]
        world.pg_map[pg] = (c10d.Backend(real_name), store)
    if pg in world.pg_backend_config:
        world.pg_backend_config[pg] = str(c10d.BackendConfig(c10d.Backend(real_name)))


def _create(dist_opts, backend_options):
    """The creator torch calls for our backend: build the real backend(s) and wrap them."""
    from prism_rr.recorder._group import RecordingGroup

    dmap, gid, ranks, _ = _state.pending.value
    base = dist_opts.store.underlying_store  # strip the device prefix torch added for us
    real = _make_real(dmap, base, dist_opts, backend_options)
    rank, size = dist_opts.group_rank, dist_opts.group_size
    return RecordingGroup(real, rank, size, gid=gid, ranks=ranks or range(size), rec=_state.rec)


def _make_real(dmap, base_store, dist_opts, backend_options) -> dict:
    from torch.distributed import PrefixStore

    real: dict = {}
    if len(set(dmap.values())) == 1:
        first = next(iter(dmap))
        backend = _make_one(dmap[first], PrefixStore(f"{first}/", base_store), dist_opts, backend_options)
        return dict.fromkeys(dmap, backend)
    for device, name in dmap.items():
        real[device] = _make_one(name, PrefixStore(f"{device}/", base_store), dist_opts, backend_options)
    return real


def _make_one(name, store, o, backend_options):
    """As torch's _new_process_group_helper builds gloo and NCCL backends."""
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


def _start_recording(options: RecordOptions, rank: int, world_size: int, dmap: dict) -> None:
    from prism_rr.recorder import _manifest
    from prism_rr.recorder._session import Recording

    if _state.rec is not None and _state.rec.on:
        return
    names = sorted(set(dmap.values()))
    backend = names[0] if len(names) == 1 else ",".join(f"{d}:{b}" for d, b in dmap.items())
    device = "cuda" if "nccl" in names else "cpu"
    info = _manifest.rank_info(options, rank, world_size, backend, device)
    rec = Recording(options, rank, info)
    if device == "cuda":
        import torch

        rec.cuda = torch.cuda.is_available()
    elif options.memory:
        from prism_rr.recorder._memory import CpuMemoryTracker

        rec.cpu_memory = CpuMemoryTracker()
    _state.rec = rec
    rec.start()


def _sync_clock(pg, rec) -> None:
    """Every rank takes part (recorded or not); only on CPU backends, where it is cheap."""
    try:
        from prism_rr.recorder import _manifest
        from prism_rr.recorder._group import RecordingGroup

        real = pg._real_by_device.get("cpu") if isinstance(pg, RecordingGroup) else pg
        if real is None or pg.name() != "gloo":
            return
        t0 = monotonic_ns()
        from prism_rr.recorder._group import _forward

        clock = _forward(rec, _manifest.clock_offset, (real, pg.rank(), pg.size()))
        if rec is not None and clock is not None:
            clock["cost_ns"] = monotonic_ns() - t0
            rec.writer.add_info({"clock_offset": clock})
    except Exception as exc:
        if rec is not None:
            rec.fail(exc)


def _patch_fsdp(mod) -> None:
    """Note FSDP2's per-parameter layout of its all-gathers and reduce-scatters. Each
    parameter's dim 0 is padded to a multiple of the group size on its own, so the shapes
    at another data-parallel size follow from the layout, not from the recorded totals;
    `prism-rr scale` reads it from the rank info (`fsdp_layouts`)."""
    ag, rs = getattr(mod, "foreach_all_gather", None), getattr(mod, "foreach_reduce", None)
    if ag is None or rs is None or getattr(ag, "_prism_rr", False):
        return

    def foreach_all_gather(fsdp_params, group, *args, **kwargs):
        _note_fsdp_layout("ag", fsdp_params, group)
        return ag(fsdp_params, group, *args, **kwargs)

    def foreach_reduce(fsdp_params, unsharded_grads, reduce_scatter_group, *args, **kwargs):
        _note_fsdp_layout("rs", fsdp_params, reduce_scatter_group)
        return rs(fsdp_params, unsharded_grads, reduce_scatter_group, *args, **kwargs)

    foreach_all_gather._prism_rr = True  # type: ignore[attr-defined]
    mod.foreach_all_gather = foreach_all_gather
    mod.foreach_reduce = foreach_reduce


def _note_fsdp_layout(kind: str, fsdp_params, group) -> None:
    """`kind` "ag": per parameter (dim-0 size d, elements per padded shard row w) of the
    all-gather input, whose size at group size N is sum(ceil(d / N) * w); "rs": the same
    for the reduce-scatter output (gradients, padded on dim 0). Keyed "N:size" by the
    recorded size, so `scale` finds a call's layout by its shape."""
    rec = _state.rec
    if rec is None or not rec.on or group is None:
        return
    try:
        from math import ceil, prod

        n = int(group.size())
        seen = (kind, id(fsdp_params), n)  # a param group passes the same list every step
        if seen in rec.fsdp_seen:
            return
        rec.fsdp_seen.add(seen)
        rows = []
        for p in fsdp_params:
            orig = tuple(p._orig_size)
            if not orig or orig[0] == 0:
                return
            d = int(orig[0])
            if kind == "ag":
                if getattr(p.fsdp_placement, "dim", 0) != 0:
                    return
                padded = tuple(p.padded_sharded_param_size)
                w = prod(padded) // max(1, padded[0])
            else:
                w = prod(orig) // d
            rows.append((d, int(w)))
        size = sum(ceil(d / n) * w for d, w in rows)
        layouts = rec.fsdp_layouts.setdefault(kind, {})
        key = f"{n}:{size}"
        if key not in layouts:
            layouts[key] = [list(r) for r in rows]
            rec.writer.add_info({"fsdp_layouts": {k: dict(v) for k, v in rec.fsdp_layouts.items()}})
    except Exception:  # a newer FSDP: the shapes at scale stay predicted
        pass


def _patch_device_mesh(dm) -> None:
    """Add the DeviceMesh (shape, dim names, rank grid) to the manifest when one is built."""
    cls = getattr(dm, "DeviceMesh", None)
    init = getattr(cls, "__init__", None)
    if init is None or getattr(init, "_prism_rr", False):
        return

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        rec = _state.rec
        if rec is not None and rec.on:
            try:
                from prism_rr.recorder._manifest import mesh_info

                info = mesh_info(self)
                if len(info["ranks"]) == rec.world_size and info != rec.mesh:
                    rec.mesh = info  # the root mesh; its slices are not news
                    rec.writer.add_info({"device_mesh": info})
                    if rec.slice_pending:
                        rec.settle_slice(info)
            except Exception:
                pass

    __init__._prism_rr = True  # type: ignore[attr-defined]
    cls.__init__ = __init__
