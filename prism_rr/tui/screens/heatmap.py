"""The heat map screen: every rank by step, the legend, and what the cursor is on."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, Static

from prism_rr.tui.model import format_ns
from prism_rr.tui.widgets.heatmap import METRICS, RAMP, HeatMap

__all__ = ["HeatmapScreen"]


class HeatmapScreen(Screen):
    _described = False  # after the first description the lines keep their height: no re-layout

    def compose(self) -> ComposeResult:
        from prism_rr.tui.analysis import step_grid

        yield Static(id="heatmap-legend")
        self.heatmap = HeatMap(step_grid(self.app.model), id="heatmap")
        yield self.heatmap
        yield Static(id="heatmap-status")
        yield Footer()

    def on_mount(self) -> None:
        self.heatmap.focus()
        self.call_after_refresh(self._describe)

    def on_heat_map_moved(self, _msg) -> None:
        self._describe()

    def _describe(self) -> None:
        hm = self.heatmap
        lo, hi = hm.scale()
        legend = Text()
        legend.append(f"{METRICS[hm.metric]}", style="bold")
        legend.append(f"  {hm.per} rank{'s' if hm.per != 1 else ''} a row (its worst)  ")
        legend.append(format_ns(lo) + " ")
        for colour in RAMP:
            legend.append("  ", style=f"on {colour}")
        legend.append(" " + format_ns(hi))
        legend.append("  · no step", style="grey50")
        self.query_one("#heatmap-legend", Static).update(legend, layout=not self._described)
        ranks, step, value, rank = hm.cursor_cell()
        if not len(ranks):
            text = "no recorded ranks"
        else:
            a, b = hm.grid.ranks[ranks.start], hm.grid.ranks[ranks.stop - 1]
            where = f"rank {a}" if a == b else f"ranks {a}-{b}"
            text = f"{where} · step {step} · " + (
                "no finished step" if value is None else
                f"{METRICS[hm.metric].split(' (')[0]} {format_ns(value)}" + (f" (rank {rank})" if a != b else ""))
            text += " · enter: timeline · t: time/late · +/-: ranks a row"
        self.query_one("#heatmap-status", Static).update(text, layout=not self._described)
        self._described = True

    async def on_heat_map_cell_chosen(self, msg: HeatMap.CellChosen) -> None:
        app = self.app
        await app.switch_mode("timeline")
        screen = app.screen

        def go() -> None:
            screen.goto(msg.rank)
            screen.timeline.show_step(msg.step)

        app.call_after_refresh(go)
