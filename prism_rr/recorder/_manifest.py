"""The facts a rank writes about itself: versions, command, allow-listed env, clocks."""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
from datetime import timedelta

from prism_rr.specs import format_ranks

# Deferred imports: torch until a rank's facts are written (its world group is made): the
# recorder's start-up hook imports this module before the program imports torch.

__all__ = ["mesh_info", "rank_info", "safe_env", "store_clock_offset"]

_ENV_PREFIXES = ("TORCH_", "NCCL_", "MASTER_", "OMP_", "ROLE_", "TORCHELASTIC_", "GLOO_", "CUDA_", "PYTORCH_")
_ENV_NAMES = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "CUDA_VISIBLE_DEVICES", "MKL_NUM_THREADS", "KMP_AFFINITY",
}
# Whatever the prefix, a name with one of these words may hold a secret.
_SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE", "SESSION")


def safe_env(environ=None) -> dict[str, str]:
    """The allow-listed part of the environment; never tokens, keys or passwords."""
    environ = os.environ if environ is None else environ
    out = {}
    for name, value in environ.items():
        if name not in _ENV_NAMES and not name.startswith(_ENV_PREFIXES):
            continue
        if any(word in name.upper() for word in _SECRET_WORDS):
            continue
        out[name] = value[:1000]
    return dict(sorted(out.items()))


def rank_info(options, rank: int, world_size: int, backend: str, device: str) -> dict:
    import torch

    mono, wall = time.monotonic_ns(), time.time_ns()
    info = {
        "rank": rank,
        "world_size": world_size,
        "local_rank": int(os.environ.get("LOCAL_RANK", rank)),
        "backend": backend,
        "device": device,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "argv": list(sys.argv),
        "orig_argv": list(getattr(sys, "orig_argv", sys.argv)),
        "cwd": os.getcwd(),
        "executable": sys.executable,
        "env": safe_env(),
        "versions": {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cuda": torch.version.cuda or "",
        },
        "payload": options.payload,
        "steps": list(options.steps) if options.steps is not None else None,
        "ranks": list(options.ranks) if options.ranks is not None else None,
        "ops": options.ops,
        "memory": options.memory,
        "flight": None if options.flight is None else {
            "steps": options.flight, "hang_s": options.flight_hang, "slow": options.flight_slow,
            "budget": options.flight_budget, "at_exit": options.flight_at_exit},
        "clock": {"monotonic_ns": mono, "wall_ns": wall, "process_start_ns": process_start_ns()},
        "cpu": cpu_info(),
    }
    if device.startswith("cuda"):
        try:
            info["device_name"] = torch.cuda.get_device_name()
        except Exception:
            pass
    return info


def process_start_ns() -> int | None:
    """When this process started, on the monotonic clock (to the kernel's tick, 10 ms),
    from /proc; None where there is none. What a rank spent before init_process_group
    (imports, its launcher) is what a replacement process spends again."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start_boot_ns = int(fields[19]) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
        boot, mono = time.clock_gettime_ns(time.CLOCK_BOOTTIME), time.monotonic_ns()
        return mono - (boot - start_boot_ns)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def cpu_info() -> dict:
    """What this rank had to compute with: the host's CPUs, those it may run on, and the
    threads torch uses (intra-op, inter-op). A replay's fidelity card reads them: ranks
    that shared cores when recorded computed slower than a replay of fewer ranks will."""
    import torch

    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = list(range(os.cpu_count() or 1))
    return {
        "count": os.cpu_count() or 1,
        "allowed": len(allowed),
        "affinity": format_ranks(allowed)[:200],
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        # the host's run queue over the last minute: other work competing with the ranks
        "load_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def store_clock_offset(store, rank: int, world_size: int, *, prefix: str, rounds: int = 4,
                       first_timeout_s: float = 120.0, timeout_s: float = 10.0, attempt: int | None = None) -> dict | None:
    """This rank's monotonic clock minus rank 0's, bracketed by rounds through the store.

    Works whatever the backend (NCCL too): it needs the store, not a collective. In round
    r every rank reads its clock (a), adds 1 to the round's counter, and waits until the
    rank that brings it to `world_size` sets the round's "all" key; then reads its clock
    again (b). The key is set after every rank's a and before any rank's b, so with a, b
    read on rank i's clock and a0, b0 on rank 0's, offset_i lies in [a - b0, b - a0]
    whatever the delays; the intersection over rounds is returned as its midpoint and half
    width. The first round absorbs the ranks' skew at start-up; the later ones, entered
    nearly at once, are tight. Rank 0 publishes its (a0, b0) under one key afterwards.

    Store operations per rank: `rounds` adds and waits and one get (one set for the rank
    that closes a round, and for rank 0), so a world of 8192 makes ~10 per rank. None
    when a rank is missing past the timeouts (the first round waits for stragglers at
    start-up): the recording goes on without an offset.

    Rank 0's `attempt` (its incarnation's number, format/names.py) comes back to every rank
    as `attempt` in the result: one number for every rank of the incarnation, whatever each
    found in its own directory.
    """
    def wait(key: str, seconds: float) -> None:
        store.wait([key], timedelta(seconds=seconds))

    spans = []
    for r in range(rounds):
        a = time.monotonic_ns()
        if store.add(f"{prefix}/{r}", 1) >= world_size:
            store.set(f"{prefix}/{r}/all", b"1")
        else:
            wait(f"{prefix}/{r}/all", first_timeout_s if r == 0 else timeout_s)
        spans.append((a, time.monotonic_ns()))
    entry = {"reference_rank": 0, "method": "store", "rounds": rounds}
    if rank == 0:
        store.set(f"{prefix}/ref", json.dumps({"spans": spans, "attempt": attempt}).encode())
        return {"offset_ns": 0, "error_ns": 0, **entry, "attempt": attempt}
    wait(f"{prefix}/ref", timeout_s)
    published = json.loads(store.get(f"{prefix}/ref"))
    ref = published["spans"]
    if type(published.get("attempt")) is int:
        entry["attempt"] = published["attempt"]
    lo = max(a - b0 for (a, _), (_, b0) in zip(spans, ref))
    hi = min(b - a0 for (_, b), (a0, _) in zip(spans, ref))
    if lo > hi:
        return None
    return {"offset_ns": (lo + hi) // 2, "error_ns": (hi - lo) // 2, **entry}


def mesh_info(mesh) -> dict:
    return {
        "device_type": mesh.device_type,
        "shape": list(mesh.mesh.shape),
        "dim_names": list(mesh.mesh_dim_names or ()),
        "ranks": mesh.mesh.flatten().tolist(),
    }
