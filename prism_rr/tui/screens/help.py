"""F1: the help written in help.md."""

from __future__ import annotations

from importlib.resources import files

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import MarkdownViewer

__all__ = ["HelpScreen"]


class HelpScreen(ModalScreen):
    BINDINGS = [
        Binding("escape,f1,q", "dismiss", "Close help", id="help.close"),
    ]

    def compose(self) -> ComposeResult:
        text = files("prism_rr.tui").joinpath("help.md").read_text(encoding="utf-8")
        yield MarkdownViewer(text, show_table_of_contents=False, id="help")
