"""Replay: real ranks run the original program against virtual peers driven by a bundle.

Importing this package is cheap (the start-up hook imports it in every replayed rank):
`replay` and `ReplayResult` load the launcher on first use.
"""

from __future__ import annotations

from prism_rr.replayer._install import arm

# Deferred imports: replayer.launch (numpy, through analysis for the fidelity card) until
# `replay` or `ReplayResult` is asked for: the start-up hook imports this package in every
# replayed rank.

__all__ = ["ReplayResult", "arm", "replay"]


def __getattr__(name: str):
    if name in ("ReplayResult", "replay"):
        from prism_rr.replayer import launch

        return getattr(launch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
