"""The embedded demo: a small GPT (`model.py`) trained on gloo (`train.py`), recorded and
replayed through `prism_rr.api`. This module is torch-free; the ranks import torch.

    plan = demo.plan(world=4)
    result = demo.record("demo.prism", plan)
    replayed = demo.replay("demo.prism", plan)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from prism_rr.errors import UsageError

__all__ = ["DemoPlan", "STEPS", "plan", "record", "replay"]

STEPS = "1:4"  # 3 recorded steps after 1 warm-up
_TRAIN_STEPS = 4
_RANK_TIMEOUT_S = 300
_RECORD_TIMEOUT_S = 600
_REPLAY_TIMEOUT_S = 300


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoPlan:
    """What the demo runs: the training command of one rank, and its layout in words."""

    world: int
    pp: int
    layout: str  # "dp2 x tp2 (FSDP2 x DTensor TP)" or "pp2 x dp2"
    train: list[str]  # one rank's command; also what replay runs


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


def record(output, demo: DemoPlan, *, warn=None, progress=None):
    """Record the demo's ranks (steps 1-3, digests, memory) into `output`: an api.RecordResult."""
    from prism_rr import api

    cmd = [sys.executable, "-m", "prism_rr.localrun", "--nproc", str(demo.world),
           "--timeout", str(_RANK_TIMEOUT_S), "--", *demo.train]
    return api.record(cmd, output, steps=STEPS, payload="digest", memory=True, timeout=_RECORD_TIMEOUT_S,
                      warn=warn, progress=progress)


def replay(output, demo: DemoPlan):
    """Replay rank 0 of the demo's recording against virtual peers: an api ReplayResult."""
    from prism_rr import api

    return api.replay(output, ranks="0", cmd=demo.train, timeout=_REPLAY_TIMEOUT_S)
