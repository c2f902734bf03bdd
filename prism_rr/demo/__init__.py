"""The embedded demo: a small GPT (`model.py`) trained on gloo (`train.py`). This module
says what the demo runs (`plan`), torch-free; `prism_rr.api` records and replays it
(`api.record_demo`, `api.replay_demo`); the ranks import torch.

    plan = demo.plan(world=4)
    plan.launch  # the command that starts its ranks under the recorder
    plan.train   # one rank's command, what a replay runs
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from prism_rr.errors import UsageError

__all__ = ["DemoPlan", "PAYLOAD", "RECORD_TIMEOUT_S", "REPLAY_TIMEOUT_S", "STEPS", "plan"]

STEPS = "1:4"  # 3 recorded steps after 1 warm-up
PAYLOAD = "digest"  # small calls whole, a hash of every larger tensor (the recorder's default)
RECORD_TIMEOUT_S = 600
REPLAY_TIMEOUT_S = 300
_TRAIN_STEPS = 4
_RANK_TIMEOUT_S = 300


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoPlan:
    """What the demo runs: the training command of one rank, and its layout in words."""

    world: int
    pp: int
    layout: str  # "dp2 x tp2 (FSDP2 x DTensor TP)" or "pp2 x dp2"
    train: list[str]  # one rank's command; also what replay runs

    @property
    def launch(self) -> list[str]:
        """The command that starts the demo's ranks (local ranks with torchrun's
        environment), each ending within its own time limit."""
        return [sys.executable, "-m", "prism_rr.localrun", "--nproc", str(self.world),
                "--timeout", str(_RANK_TIMEOUT_S), "--", *self.train]


def plan(world: int = 4, pp: int = 1) -> DemoPlan:
    """FSDP2 x DTensor tensor parallel (tp 2 where world is even), or pipelining with `pp` > 1."""
    if world < 1 or pp < 1 or world % pp:
        raise UsageError("--world must be a positive multiple of --pp")
    train = [sys.executable, "-m", "prism_rr.demo.train", "--steps", str(_TRAIN_STEPS), "--quiet"]
    if pp > 1:
        train += ["--pp", str(pp)]
        layout = f"pp{pp} x dp{world // pp}"
    else:
        tp = 2 if world % 2 == 0 else 1
        train += ["--tp", str(tp)]
        layout = f"dp{world // tp} x tp{tp} (FSDP2 x DTensor TP)"
    return DemoPlan(world=world, pp=pp, layout=layout, train=train)
