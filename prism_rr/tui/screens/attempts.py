"""The `a` list: a restarted job's attempts, how each ended; Enter opens one."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from prism_rr.format.facts import ending_line
from prism_rr.specs import format_ranks

__all__ = ["AttemptsScreen"]


class AttemptsScreen(ModalScreen):
    """Pick an attempt (`attempts`: the facts of `format.facts.bundle_facts()["attempts"]`);
    dismissed with its number, or None."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel", id="attempts.cancel")]

    def __init__(self, attempts: list[dict], current: int, **kw) -> None:
        super().__init__(**kw)
        self.attempts = attempts
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(id="attempts-box"):
            yield Label("Attempts of this job (Enter: open it, Esc: stay)")
            options = []
            for a in self.attempts:
                mark = "▶ " if a["attempt"] == self.current else "  "
                # Text, never markup: the endings quote the bundle (made safe by `shown`)
                options.append(Option(Text(f"{mark}attempt {a['attempt']}: world {a['world_size']}, ranks "
                                           f"{format_ranks(a['recorded_ranks'])}: {ending_line(a['ended'])}"),
                                      id=str(a["attempt"])))
            yield OptionList(*options, id="attempts-list")

    def on_mount(self) -> None:
        listed = self.query_one(OptionList)
        listed.highlighted = next((i for i, a in enumerate(self.attempts) if a["attempt"] == self.current), 0)
        listed.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(int(event.option.id))
