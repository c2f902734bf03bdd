"""Arm the replayer in a fresh process: patch torch.distributed when it is imported."""

from __future__ import annotations

import os

from prism_rr.replayer._options import ENV_VAR, ReplayOptions

__all__ = ["arm"]


def arm() -> None:
    from prism_rr.recorder._boot import on_import

    options = ReplayOptions.from_json(os.environ[ENV_VAR])

    def install(_module):
        from prism_rr.replayer import _install

        _install.install(options)

    on_import("torch.distributed.distributed_c10d", install)
