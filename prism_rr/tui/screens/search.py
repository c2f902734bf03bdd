"""The `/` prompt: text to find in a call's op or stack."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

__all__ = ["SearchScreen", "matches"]


def matches(rec, text: str) -> bool:
    """Whether a call's op or one of its stack frames contains `text` (any case)."""
    text = text.lower()
    if text in (getattr(rec, "op", None) or "").lower():
        return True
    return any(text in frame.lower() for frame in (getattr(rec, "stack", None) or ()))


class SearchScreen(ModalScreen):
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel", id="search.cancel")]

    def __init__(self, last: str = "", **kw) -> None:
        super().__init__(**kw)
        self.last = last

    def compose(self) -> ComposeResult:
        with Vertical(id="goto-box"):
            yield Label("Find the next call whose op or stack contains")
            yield Input(value=self.last, placeholder="e.g. all_gather, or train.py:88", id="search-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        self.dismiss(text or None)
