"""Before a replay starts: the recorded versions and devices against this machine's."""

from __future__ import annotations

import platform
import re
from importlib.metadata import PackageNotFoundError, version

from prism_rr.errors import UsageError
from prism_rr.text import shown

# Deferred imports: torch until `_cuda_here` asks whether this host has CUDA: the launcher
# checks a replay's environment (torch's version from its metadata) without importing torch.

__all__ = ["REPLAY_ENV", "check_environment", "current_versions", "replay_env"]

_COUNT = re.compile(r"[0-9]{1,6}")
_FLAG = re.compile(r"[01]")
_CHOICE = re.compile(r"[A-Za-z0-9_,:;^]{1,64}")  # NCCL_ALGO=Ring,Tree or ^NVLS, allreduce:tree
# The only names a bundle's recorded environment may set in a replayed rank (where this
# machine's environment does not): thread counts and collective tuning, each value of a
# fixed shape. Never a path, a library, a plugin, or anything an interpreter or a loader
# reads (PATH, PYTHONPATH, PYTHON*, LD_*, NCCL_NET_PLUGIN, ...): bundles come from strangers.
# FORMAT.md, "Environment allow-list", lists the same names.
REPLAY_ENV = {
    "OMP_NUM_THREADS": _COUNT,
    "MKL_NUM_THREADS": _COUNT,
    "CUDA_DEVICE_MAX_CONNECTIONS": _COUNT,
    "NCCL_ALGO": _CHOICE,
    "NCCL_PROTO": _CHOICE,
    "NCCL_MIN_NCHANNELS": _COUNT,
    "NCCL_MAX_NCHANNELS": _COUNT,
    "NCCL_BUFFSIZE": _COUNT,
    "NCCL_NTHREADS": _COUNT,
    "NCCL_P2P_DISABLE": _FLAG,
    "NCCL_IB_DISABLE": _FLAG,
    "NCCL_SHM_DISABLE": _FLAG,
}


def replay_env(info) -> dict[str, str]:
    """The part of a rank's recorded environment a replay may pass on: allowed names with
    values of the allowed shape; everything else a bundle names is dropped."""
    env = info.get("env") if isinstance(info, dict) else None
    if not isinstance(env, dict):
        return {}
    return {name: value for name, value in env.items()
            if type(name) is str and type(value) is str and name in REPLAY_ENV and REPLAY_ENV[name].fullmatch(value)}


def _torch_version() -> str | None:
    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def current_versions() -> dict[str, str | None]:
    return {"torch": _torch_version(), "python": platform.python_version(), "platform": platform.platform()}


def _cuda_here() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def _same_torch(a: str, b: str) -> bool:
    return a.split("+")[0] == b.split("+")[0]  # 2.5.1+cu121 replays on 2.5.1+cpu


def check_environment(infos: dict[int, dict], *, timing: str, dump: bool = False) -> list[str]:
    """One line per difference that a replay survives; UsageError where it cannot run.

    A recording made on CUDA (nccl) replays here only with CUDA, or with `timing="virtual"`
    on CPU, where the program must fall back to gloo on CPU by itself (as the demo does)
    and the real rank's compute is scaled to the recorded one. A Flight Recorder `dump`
    has no compute to score: it replays on CPU with any timing (a hang found on a GPU
    cluster, reproduced on a laptop), the program falling back to gloo as above.
    """
    here = current_versions()
    warnings: list[str] = []
    seen: set[str] = set()
    for rank in sorted(infos):
        info = infos[rank]
        recorded = info.get("versions") or {}
        for name in ("torch", "python", "platform"):
            was, now = recorded.get(name), here.get(name)
            if not was or not now or name in seen:
                continue
            differs = not _same_torch(was, now) if name == "torch" else was != now
            if differs:
                seen.add(name)
                warnings.append(f"recorded with {name} {shown(was)}, replaying with {now}")
        backend = str(info.get("backend") or "")
        device = str(info.get("device") or "cpu")
        if ("nccl" in backend or device.startswith("cuda")) and "cuda" not in seen:
            seen.add("cuda")
            if _cuda_here():
                continue
            if dump:
                warnings.append(f"rank {rank}'s dump is of CUDA ({shown(backend)}); replaying on CPU (the program "
                                f"must fall back to gloo), the peers at the dump's times")
                continue
            if timing != "virtual":
                raise UsageError(
                    f"rank {rank} was recorded on CUDA ({shown(backend or device)}) and this machine has no CUDA "
                    f"device; replay it on a GPU, or on CPU with timing 'virtual' (--timing virtual) "
                    f"if the program falls back to gloo on CPU")
            warnings.append(f"rank {rank} was recorded on CUDA ({shown(backend)}); replaying on CPU with a virtual clock")
    return warnings
