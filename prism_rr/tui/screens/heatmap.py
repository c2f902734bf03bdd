"""The heat map screen: every rank by step, the legend, and what the cursor is on."""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Static
from textual.worker import get_current_worker

from prism_rr.errors import PrismError
from prism_rr.text import shown
from prism_rr.tui.analysis import lateness, run_apart, step_grid
from prism_rr.tui.model import format_ns
from prism_rr.tui.widgets.footer import KeyFooter
from prism_rr.tui.widgets.heatmap import METRICS, RAMP, HeatMap

__all__ = ["HeatmapScreen"]


class HeatmapScreen(Screen):
    BINDINGS = [Binding("escape", "cancel", "Stop reading", id="heatmap.cancel")]
    _described = False  # after the first description the lines keep their height: no re-layout

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.reading: str | None = None  # what the lateness worker says while it reads

    def compose(self) -> ComposeResult:
        yield Static(id="heatmap-legend")
        self.heatmap = HeatMap(step_grid(self.app.model), id="heatmap")
        yield self.heatmap
        yield Static(id="heatmap-status")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.heatmap.focus()
        self.call_after_refresh(self._describe)

    def on_heat_map_moved(self, _msg) -> None:
        hm = self.heatmap
        if hm.metric == "late" and hm.lateness is None and self.reading is None:
            self._reading(f"reading the calls of {len(hm.grid.ranks)} ranks for their lateness… (Esc stops)")
            self._lateness()
        self._describe()

    def _reading(self, text: str | None) -> None:
        self.reading = text
        self.refresh_bindings()
        self._describe()

    def check_action(self, action: str, parameters) -> bool | None:
        return self.reading is not None if action == "cancel" else True

    def action_cancel(self) -> None:
        self.workers.cancel_group(self, "lateness")
        self._reading(None)
        if self.heatmap.lateness is None:
            self.heatmap.action_metric()  # back to step time

    @work(thread=True, exclusive=True, group="lateness")
    def _lateness(self) -> None:
        worker = get_current_worker()
        grid = self.heatmap.grid
        n = len(grid.ranks)

        def tick(seconds: float) -> None:
            self.app.call_from_thread(self._reading, f"reading the calls of {n} ranks for their lateness… "
                                                     f"{seconds:.0f} s (Esc stops)")

        try:
            got = run_apart(lateness, self.app.bundle, grid.ranks, grid.steps, tick=tick,
                            stop=lambda: worker.is_cancelled)
        except PrismError:
            raise  # a malformed bundle ends the app with exit 4 (PrismApp._handle_exception)
        except Exception as exc:  # the analysis failing must not take the browser down
            self.app.call_from_thread(self._read_failed, shown(exc, None))
            return
        if got is not None and not worker.is_cancelled:
            self.app.call_from_thread(self._read, got)

    def _read(self, lateness) -> None:
        self.reading = None
        self.refresh_bindings()
        self.heatmap.set_lateness(lateness)

    def _read_failed(self, why: str) -> None:
        self._reading(None)
        self.notify(f"lateness could not be read: {why}", severity="error", markup=False)
        self.heatmap.action_metric()

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
        legend.append("  · none", style="grey50")
        self.query_one("#heatmap-legend", Static).update(legend, layout=not self._described)
        ranks, step, value, rank = hm.cursor_cell()
        if self.reading is not None:
            text = self.reading
        elif not len(ranks):
            text = "no recorded ranks"
        else:
            a, b = hm.grid.ranks[ranks.start], hm.grid.ranks[ranks.stop - 1]
            where = f"rank {a}" if a == b else f"ranks {a}-{b}"
            text = f"{where} · step {step} · " + (
                ("no finished step" if hm.metric == "time" else "no collective") if value is None else
                f"{METRICS[hm.metric].split(' (')[0]} {format_ns(value)}" + (f" (rank {rank})" if a != b else ""))
            if value is not None and hm.metric == "time" and rank in self.app.model.open_steps.get(step, {}):
                text += " (never ended: the run failed or hung in it; to its last record)"
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
