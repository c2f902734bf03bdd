"""The facts a rank writes about itself: versions, command, allow-listed env, clocks."""

from __future__ import annotations

import os
import platform
import socket
import sys
import time

__all__ = ["clock_offset", "mesh_info", "rank_info", "safe_env"]

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
        "clock": {"monotonic_ns": mono, "wall_ns": wall},
    }
    if device.startswith("cuda"):
        try:
            info["device_name"] = torch.cuda.get_device_name()
        except Exception:
            pass
    return info


def clock_offset(backend, rank: int, world_size: int, rounds: int = 4) -> dict | None:
    """This rank's monotonic clock minus rank 0's, bracketed by all_gather round trips.

    Each round gathers every rank's entry time a and its exit time b of the round
    before. No rank leaves a gather before every rank entered it, so with a, b read on
    rank i's clock and a0, b0 on rank 0's, offset_i lies in [a - b0, b - a0]; the
    intersection over rounds is returned as its midpoint and half width.
    """
    import torch
    from torch._C._distributed_c10d import AllgatherOptions

    lo, hi = -(1 << 62), 1 << 62
    prev_a = prev_b = prev_a0 = 0
    for r in range(rounds + 1):
        a = time.monotonic_ns()
        mine = torch.tensor([a, prev_b], dtype=torch.int64)
        outs = [torch.empty(2, dtype=torch.int64) for _ in range(world_size)]
        backend.allgather([outs], [mine], AllgatherOptions()).wait()
        b = time.monotonic_ns()
        if r > 0:  # outs[*][1] are the exits of round r-1, whose entries were prev
            b0 = int(outs[0][1])
            lo = max(lo, prev_a - b0)
            hi = min(hi, prev_b - prev_a0)
        prev_a, prev_b, prev_a0 = a, b, int(outs[0][0])
    if lo > hi:
        return None
    return {"offset_ns": (lo + hi) // 2, "error_ns": (hi - lo) // 2, "reference_rank": 0,
            "method": "allgather", "rounds": rounds}


def mesh_info(mesh) -> dict:
    return {
        "device_type": mesh.device_type,
        "shape": list(mesh.mesh.shape),
        "dim_names": list(mesh.mesh_dim_names or ()),
        "ranks": mesh.mesh.flatten().tolist(),
    }
