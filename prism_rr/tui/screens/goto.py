"""The `g` prompt: rank, or rank:group:seq."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

__all__ = ["GotoScreen", "parse_target"]


def parse_target(text: str) -> tuple[int, int | None, int | None] | None:
    """`12` -> (12, None, None); `12:3:40` -> (12, 3, 40); anything else -> None."""
    parts = text.strip().replace(" ", "").split(":")
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        return None
    if len(nums) == 1:
        return nums[0], None, None
    if len(nums) == 3:
        return nums[0], nums[1], nums[2]
    return None


class GotoScreen(ModalScreen):
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel", id="goto.cancel")]

    def compose(self) -> ComposeResult:
        with Vertical(id="goto-box"):
            yield Label("Go to  rank  or  rank:group:seq")
            yield Input(placeholder="e.g. 12:3:40", id="goto-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        target = parse_target(event.value)
        if target is None:
            self.notify("type a rank, or rank:group:seq", severity="error")
            return
        self.dismiss(target)
