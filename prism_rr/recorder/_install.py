"""The recorder's side of group creation: make `init_process_group`/`new_group` build
recording groups (InterceptGroups with the recording policy), without editing the script.

When the requested backend is gloo or NCCL (or left to torch's default), the group is
built with our registered backend, whose creator builds the real backend exactly as
torch would and wraps it (intercept/creation.py). The world group starts the recording
of this rank; DeviceMesh and FSDP2 are watched for the layout facts `scale` needs.
"""

from __future__ import annotations

import logging
import os
from math import ceil, prod
from time import monotonic_ns

from prism_rr.intercept import teardown
from prism_rr.intercept.creation import GroupCreation, Plan, fix_books, make_real, real_device_map
from prism_rr.intercept.hook import on_import
from prism_rr.recorder import _manifest
from prism_rr.recorder._options import ENV_VAR, RecordOptions

# Deferred imports: torch, and the modules that import it (the recording, its policy,
# intercept.group and intercept.memory), until the program's world group is made: the
# start-up hook arms the recorder from this module before the program imports torch.

__all__ = ["BACKEND", "arm", "current_observer", "install", "installed_options", "record_replay", "uninstall"]

BACKEND = "prism_rr"
# "0": a CUDA recording reads its payloads at once (a host synchronization at each call)
# rather than once the device has passed them (recorder/_later.py); "cpu": a CPU recording
# (without --memory) reads its own that way too, for the tests of that path
LATER_VAR = "PRISM_RR_DEVICE_PAYLOADS"
log = logging.getLogger("prism_rr.recorder")


class _Recorder:
    """The recorder's answers to GroupCreation."""

    backend = BACKEND

    def __init__(self):
        self.options: RecordOptions | None = None
        self.recording = True  # False on ranks outside the rank selection
        self.world_store = None  # the world group's store, from its creator, for the clock
        self.worlds = 0  # world groups made in this process: each measures its clocks anew

    @property
    def rec(self):
        """The Recording of this process (held by _session, the one place that holds it)."""
        from prism_rr.recorder import _session

        return _session.current()

    def plan(self, gid: int, a: dict, is_world: bool) -> Plan | None:
        options = self.options
        if options is None:
            return None
        try:
            size = int(a["group_size"])
            if is_world:
                self.recording = options.records_rank(int(a["group_rank"]), size)
            dmap = real_device_map(a["backend"]) if self.recording else None
            if is_world and self.recording and dmap is not None:
                _start_recording(options, int(a["group_rank"]), size, dmap)
                # torch.distributed has finished importing by now (it may import device_mesh
                # half-way through its own import, too early to patch).
                on_import("torch.distributed.device_mesh", _patch_device_mesh)
                on_import("torch.distributed.fsdp._fully_shard._fsdp_param_group", _patch_fsdp)
            rec = self.rec
            if dmap is None or rec is None or not rec.on:
                return None
            ranks = list(a["global_ranks_in_group"] or []) or list(range(size))
            if rec.slice_pending:  # every group, this rank a member or not: the layout to find
                rec.group_seen(ranks, a.get("group_desc") or "")
            return Plan(gid, ranks, str(a["backend"]), dmap)
        except Exception as exc:  # our bug: build the group as torch would
            log.warning("prism-rr: not recording this process group: %s: %s", type(exc).__name__, exc)
            return None

    def unreadable(self, exc: Exception) -> None:
        """torch's group-creation arguments could not be read: build the group as torch would."""
        log.warning("prism-rr: not recording this process group: %s: %s", type(exc).__name__, exc)

    def untaken(self, result, is_world: bool) -> None:
        if is_world:  # every rank takes part, recorded or not, or the others would wait
            _sync_clock(result[0], result[1], None)

    def create(self, plan: Plan, dist_opts, backend_options):
        """The creator torch calls for our backend: build the real backend(s) and wrap them."""
        from prism_rr.intercept.group import InterceptGroup
        from prism_rr.recorder._policy import RecordingObserver, RecordingPolicy

        rec = self.rec
        if plan.gid == 0:
            self.world_store = dist_opts.store.underlying_store  # without the device prefix
        real = make_real(plan.devices, dist_opts, backend_options)
        return InterceptGroup(real, dist_opts.group_rank, dist_opts.group_size, gid=plan.gid, ranks=plan.ranks,
                              policy=RecordingPolicy(rec), observer=RecordingObserver(rec))

    def created(self, pg, plan: Plan, is_world: bool) -> None:
        rec = pg.observer.rec
        try:
            fix_books(pg, plan.real_name)
            pg.observer.group_created(plan.gid, plan.ranks, pg.getGroupName(), pg.getGroupDesc(),
                                      ",".join(sorted(set(plan.devices.values()))))
            if is_world:
                store, self.world_store = self.world_store, None
                _sync_clock(pg, store, rec)
        except Exception as exc:
            rec.fail(exc)


_recorder = _Recorder()
_creation = GroupCreation(_recorder)


def installed_options() -> RecordOptions | None:
    return _recorder.options


def install(options: RecordOptions) -> None:
    """Register the backend and patch group creation (idempotent)."""
    teardown.register()  # torch's gloo threads must not abort the process after its last line
    _recorder.options = options
    _creation.install()


def uninstall() -> None:
    """Stop wrapping new groups; groups already made keep forwarding."""
    _creation.uninstall()
    _recorder.options = None


def arm() -> None:
    """From the start-up hook: read PRISM_RR_RECORD and wait for torch.distributed."""
    teardown.register()  # first of all atexit functions, so it runs last (install's is a no-op then)
    options = RecordOptions.from_json(os.environ[ENV_VAR])

    def install_now(_module):
        try:
            install(options)
        except Exception as exc:  # recording never ends a training run
            log.warning("prism-rr: recording is off: %s: %s", type(exc).__name__, exc)

    on_import("torch.distributed.distributed_c10d", install_now)


def record_replay(output, *, payload: str, rank: int, world_size: int, backend: str, replay_of: dict,
                  device: str = "cpu") -> None:
    """Start recording this replayed rank into spools under `output` (`prism-rr replay -o`):
    its groups observe it through `current_observer()`. `device`: where the replayed
    program's tensors are; its steps are timed on that device's clock too (a recording's,
    _device.clock_for), so that compare can set the replay's device times beside the
    recording's."""
    from prism_rr.recorder._session import Recording

    options = RecordOptions.make(output, payload=payload)
    info = _manifest.rank_info(options, rank, world_size, backend, device)
    info["replay_of"] = replay_of
    rec = Recording(options, rank, info)
    rec.time_device(device)
    rec.start()


def current_observer():
    """An observer (intercept/group.py) that records calls into this process's Recording, or
    None when nothing records."""
    rec = _recorder.rec
    if rec is None:
        return None
    from prism_rr.recorder._policy import RecordingObserver

    return RecordingObserver(rec)


def _start_recording(options: RecordOptions, rank: int, world_size: int, dmap: dict) -> None:
    from prism_rr.recorder._session import Recording

    if _recorder.rec is not None and _recorder.rec.on:
        return
    names = sorted(set(dmap.values()))
    backend = names[0] if len(names) == 1 else ",".join(f"{d}:{b}" for d, b in dmap.items())
    device = "cuda" if "nccl" in names else "cpu"
    info = _manifest.rank_info(options, rank, world_size, backend, device)
    rec = Recording(options, rank, info)
    rec.time_device(device, durations="nccl" in names)
    later = os.environ.get(LATER_VAR, "1")
    if device == "cuda":
        import torch

        rec.track_memory(cuda=torch.cuda.is_available())
        if torch.cuda.is_available() and later not in ("0", "off"):
            rec.read_payloads_later()
    elif options.memory:
        from prism_rr.intercept.memory import CpuMemoryTracker

        rec.track_memory(cpu_tracker=CpuMemoryTracker())
    elif later == "cpu":  # the same path for CPU tensors: how the tests run it without a GPU
        rec.read_payloads_later(device="cpu")
    rec.start()


def _sync_clock(pg, store, rec) -> None:
    """Measure this rank's clock offset to rank 0 through the world's store, as the world
    group is made (`_manifest.store_clock_offset`: any backend, a few store operations).
    Every rank takes part, recorded or not. A failure (a rank that never came) costs the
    offset, never the recording: `pack` lists such ranks in the manifest's `clock`."""
    if store is None:
        return
    _recorder.worlds += 1
    try:
        t0 = monotonic_ns()
        args = (store, pg.rank(), pg.size())
        # a TorchElastic restart may share the store of the attempt before it: keys of its own
        restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")
        prefix = f"prism_rr/clock/{restarts}/{_recorder.worlds}"
        measure = _manifest.store_clock_offset
        attempt = rec.attempt if rec is not None else None
        clock = (rec.outside(lambda: measure(*args, prefix=prefix, attempt=attempt)) if rec is not None
                 else measure(*args, prefix=prefix, attempt=attempt))
        if rec is not None and clock is not None:
            clock["cost_ns"] = monotonic_ns() - t0
            agreed = clock.pop("attempt", None)
            rec.add_info({"clock_offset": clock} if agreed is None else {"clock_offset": clock, "attempt": agreed})
    except Exception as exc:
        log.warning("prism-rr: no clock offset for this rank: %s: %s", type(exc).__name__, exc)


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
    rec = _recorder.rec
    if rec is None or not rec.on or group is None:
        return
    try:
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
            rec.add_info({"fsdp_layouts": {k: dict(v) for k, v in rec.fsdp_layouts.items()}})
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
        rec = _recorder.rec
        if rec is not None and rec.on:
            try:
                info = _manifest.mesh_info(self)
                if len(info["ranks"]) == rec.world_size and info != rec.mesh:
                    rec.mesh = info  # the root mesh; its slices are not news
                    rec.add_info({"device_mesh": info})
                    if rec.slice_pending:
                        rec.settle_slice(info)
            except Exception:
                pass

    __init__._prism_rr = True  # type: ignore[attr-defined]
    cls.__init__ = __init__
