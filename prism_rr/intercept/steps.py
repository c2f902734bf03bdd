"""Step boundaries as a program makes them: its optimizer's steps, or `prism_rr.step()`."""

from __future__ import annotations

import weakref

# Deferred imports: torch.optim until a side starts following steps; `prism_rr.step()` and
# the recorder's start-up import this module before the program has imported torch.

__all__ = ["OptimizerSteps", "by_hand"]

_started: list[OptimizerSteps] = []  # this process's: a recording's, a replay's, or both


def by_hand() -> None:
    """`prism_rr.step()`: a step boundary for every started OptimizerSteps (a replay and
    its own `-o` recording both follow it); optimizer steps no longer are boundaries."""
    for steps in list(_started):
        steps.manual = True
        steps._on_step()


class OptimizerSteps:
    """Calls `on_step()` after each step of the program's first stepped optimizer (the
    other optimizers of a multi-optimizer step are not news), until the program marks a
    step by hand: from then on only its own marks are boundaries."""

    def __init__(self, on_step):
        self._on_step = on_step
        self._pacer = None  # weakref to the optimizer whose steps mark boundaries
        self._handle = None
        self.manual = False

    def start(self) -> None:
        import torch.optim.optimizer as optim

        self._handle = optim.register_optimizer_step_post_hook(self._stepped)
        _started.append(self)

    def stop(self) -> None:
        if self in _started:
            _started.remove(self)
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _stepped(self, optimizer, args, kwargs) -> None:
        if self.manual:
            return
        pacer = self._pacer() if self._pacer is not None else None
        if pacer is None:
            self._pacer = weakref.ref(optimizer)
        elif pacer is not optimizer:
            return
        self._on_step()
