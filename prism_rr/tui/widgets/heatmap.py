"""Every rank at a glance: one cell per (rank bucket, step), coloured by step time or lateness."""

from __future__ import annotations

import math

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from prism_rr.tui.analysis import StepGrid

__all__ = ["METRICS", "RAMP", "HeatMap"]

# cold to hot; a cell's colour is its value's place between the grid's smallest and largest
RAMP = ("#1d3557", "#27577a", "#2a7f8f", "#4a9d6f", "#a3b43c", "#e0b029", "#f07a1f", "#d62828")
# lateness: the others' wait for the rank in the step's collectives (analysis.lateness)
METRICS = {"time": "step time", "late": "lateness (the others' wait for it)"}
GUTTER = 12  # the rank range of each row
CORNER = "ranks\\step"  # the header's corner: rows are ranks, the columns it heads are steps
CELL = 6  # columns per step at most, fewer when the steps need it


class HeatMap(Widget, can_focus=True):
    """Row = a bucket of consecutive ranks (as many as fit the height at first: every rank
    is in view), column = a step; a cell shows its bucket's worst (largest) value, so one
    slow rank among thousands still colours its row."""

    BINDINGS = [
        Binding("up", "move(-1, 0)", "Up", show=False, id="heatmap.up"),
        Binding("down", "move(1, 0)", "Down", show=False, id="heatmap.down"),
        Binding("left", "move(0, -1)", "Earlier step", show=False, id="heatmap.left"),
        Binding("right", "move(0, 1)", "Later step", show=False, id="heatmap.right"),
        Binding("pageup", "page(-1)", "Page up", show=False, id="heatmap.page_up"),
        Binding("pagedown", "page(1)", "Page down", show=False, id="heatmap.page_down"),
        Binding("plus,equals_sign", "zoom(0.5)", "Fewer ranks a row", id="heatmap.zoom_in"),
        Binding("minus", "zoom(2)", "More ranks a row", id="heatmap.zoom_out"),
        Binding("0", "fit", "All ranks", id="heatmap.fit"),
        Binding("t", "metric", "Time/late", id="heatmap.metric"),
        Binding("enter", "open", "Open in timeline", id="heatmap.open"),
    ]

    class Moved(Message):
        """The cursor moved, the zoom or the metric changed."""

    class CellChosen(Message):
        def __init__(self, rank: int, step: int) -> None:
            super().__init__()
            self.rank, self.step = rank, step

    def __init__(self, grid: StepGrid, **kw) -> None:
        super().__init__(**kw)
        self.grid = grid
        self.metric = "time"
        self.lateness: np.ndarray | None = None  # [rank row, step]: read from the calls when first asked for
        self.per = 0  # ranks a row; 0: fit every rank in the height once it is known
        self.row = self.col = 0  # the cursor, in bucket rows and step columns
        self.top = 0  # the first bucket row shown
        self.left = 0  # the first step column shown
        self._cells: np.ndarray | None = None  # [bucket row, step]: each bucket's largest value
        self._scale = (0.0, 1.0)

    # --- geometry -----------------------------------------------------------------------

    @property
    def rows(self) -> int:
        return math.ceil(len(self.grid.ranks) / self.per) if self.per else 0

    @property
    def view_rows(self) -> int:
        return max(1, self.size.height - 1)  # the first line heads the steps

    @property
    def cell(self) -> int:
        steps = max(1, len(self.grid.steps))
        return max(1, min(CELL, (self.size.width - GUTTER) // steps))

    @property
    def view_cols(self) -> int:
        return max(1, (self.size.width - GUTTER) // self.cell)

    def bucket(self, row: int) -> range:
        return range(row * self.per, min(len(self.grid.ranks), (row + 1) * self.per))

    def values(self) -> np.ndarray:
        if self.metric == "time":
            return self.grid.time
        return self.lateness if self.lateness is not None else np.full_like(self.grid.time, np.nan)

    def scale(self) -> tuple[float, float]:
        """The values the coldest and the hottest colour stand for."""
        self._ensure()
        return self._scale

    def _ensure(self) -> None:
        if self.per == 0 and self.size.height:
            self.per = max(1, math.ceil(len(self.grid.ranks) / self.view_rows))
        if self._cells is None and self.per:
            v = np.where(np.isnan(self.values()), -np.inf, self.values())
            if len(v):
                cells = np.maximum.reduceat(v, np.arange(0, len(v), self.per), axis=0)
            else:
                cells = np.zeros((0, len(self.grid.steps)))
            self._cells = np.where(np.isinf(cells), np.nan, cells)
            known = self._cells[~np.isnan(self._cells)]
            self._scale = (float(known.min()), float(known.max())) if len(known) else (0.0, 1.0)

    def _invalidate(self) -> None:
        self._cells = None
        self.row = min(self.row, max(0, self.rows - 1))
        self._follow()
        self.refresh()
        self.post_message(self.Moved())

    def _follow(self) -> None:
        if self.row < self.top:
            self.top = self.row
        elif self.row >= self.top + self.view_rows:
            self.top = self.row - self.view_rows + 1
        self.top = max(0, min(self.top, max(0, self.rows - self.view_rows)))
        if self.col < self.left:
            self.left = self.col
        elif self.col >= self.left + self.view_cols:
            self.left = self.col - self.view_cols + 1

    def on_resize(self) -> None:
        self._follow()

    # --- what the cursor is on ------------------------------------------------------------

    def cursor_cell(self) -> tuple[range, int, float | None, int | None]:
        """(the cursor row's ranks, its step, the cell's value, the rank that has it)."""
        self._ensure()
        ranks = self.bucket(self.row)
        if not len(self.grid.steps) or not len(ranks):
            return ranks, 0, None, None
        column = self.values()[ranks.start : ranks.stop, self.col]
        if np.isnan(column).all():
            return ranks, self.grid.steps[self.col], None, None
        i = int(np.nanargmax(column))
        return ranks, self.grid.steps[self.col], float(column[i]), self.grid.ranks[ranks.start + i]

    # --- drawing --------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        self._ensure()
        width = self.size.width
        cell = self.cell
        shown = slice(self.left, self.left + self.view_cols)
        if y == 0:
            every = max(1, 4 // cell)  # a label needs about 4 columns
            head = "".join(f"{s:<{cell * every}}"[:cell * every]
                           for s in self.grid.steps[shown][::every])
            return Strip([Segment(f"{CORNER:>{GUTTER - 1}} ", Style(color="grey50")),
                          Segment(head, Style(color="grey50"))]).crop(0, width)
        row = self.top + y - 1
        if self._cells is None or row >= self.rows:
            return Strip.blank(width)
        ranks = self.bucket(row)
        a, b = self.grid.ranks[ranks.start], self.grid.ranks[ranks.stop - 1]
        label = f"{a}" if a == b else f"{a}-{b}"
        cursor_row = row == self.row
        segs = [Segment(f"{label:>{GUTTER - 1}} ", Style(color="white" if cursor_row else "grey50",
                                                         bold=cursor_row))]
        lo, hi = self._scale
        span = hi - lo or 1.0
        for j, v in enumerate(self._cells[row, shown].tolist(), start=self.left):
            here = cursor_row and j == self.col and self.has_focus
            if math.isnan(v):
                segs.append(Segment(("▐" + "·" * (cell - 1)) if here else "·" * cell, Style(color="grey35")))
                continue
            colour = RAMP[min(len(RAMP) - 1, int((v - lo) / span * len(RAMP)))]
            text = ("◆" + " " * (cell - 1)) if here else " " * cell
            segs.append(Segment(text, Style(bgcolor=colour, color="white", bold=True)))
        return Strip(segs).crop(0, width)

    # --- keys -----------------------------------------------------------------------------

    def action_move(self, drow: int, dcol: int) -> None:
        self._ensure()
        self.row = max(0, min(self.rows - 1, self.row + drow))
        self.col = max(0, min(len(self.grid.steps) - 1, self.col + dcol))
        self._follow()
        self.refresh()
        self.post_message(self.Moved())

    def action_page(self, direction: int) -> None:
        self.action_move(direction * self.view_rows, 0)

    def action_zoom(self, factor: float) -> None:
        """Change the ranks a row, keeping the cursor's first rank in its row."""
        self._ensure()
        first = self.bucket(self.row).start
        self.per = max(1, min(len(self.grid.ranks), int(self.per * factor)))
        self.row = first // self.per
        self._invalidate()

    def action_fit(self) -> None:
        first = self.bucket(self.row).start if self.per else 0
        self.per = 0
        self._ensure()
        self.row = first // self.per if self.per else 0
        self._invalidate()

    def action_metric(self) -> None:
        self.metric = "late" if self.metric == "time" else "time"
        self._invalidate()

    def set_lateness(self, lateness: np.ndarray | None) -> None:
        self.lateness = lateness
        self._invalidate()

    def action_open(self) -> None:
        _, step, _, rank = self.cursor_cell()
        if rank is None:
            self.app.bell()
            return
        self.post_message(self.CellChosen(rank, step))
