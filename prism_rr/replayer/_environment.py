"""Before a replay starts: the recorded versions and devices against this machine's."""

from __future__ import annotations

import platform

from prism_rr.errors import UsageError

__all__ = ["check_environment", "current_versions"]


def _torch_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

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


def check_environment(infos: dict[int, dict], *, timing: str) -> list[str]:
    """One line per difference that a replay survives; UsageError where it cannot run.

    A recording made on CUDA (nccl) replays here only with CUDA, or with `timing="virtual"`
    on CPU, where the program must fall back to gloo on CPU by itself (as the demo does)
    and the real rank's compute is scaled to the recorded one.
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
                warnings.append(f"recorded with {name} {was}, replaying with {now}")
        backend = str(info.get("backend") or "")
        device = str(info.get("device") or "cpu")
        if ("nccl" in backend or device.startswith("cuda")) and "cuda" not in seen:
            seen.add("cuda")
            if _cuda_here():
                continue
            if timing != "virtual":
                raise UsageError(
                    f"rank {rank} was recorded on CUDA ({backend or device}) and this machine has no CUDA "
                    f"device; replay it on a GPU, or on CPU with timing 'virtual' (--timing virtual) "
                    f"if the program falls back to gloo on CPU")
            warnings.append(f"rank {rank} was recorded on CUDA ({backend}); replaying on CPU with a virtual clock")
    return warnings
