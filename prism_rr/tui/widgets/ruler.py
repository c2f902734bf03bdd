"""The time scale above the timeline: ticks at round intervals, step starts marked."""

from __future__ import annotations

from itertools import groupby

from rich.text import Text
from textual.widget import Widget

from prism_rr.tui.model import format_ns

__all__ = ["Ruler", "tick_interval"]


def tick_interval(ns_per_cell: float, min_cells: int = 12) -> int:
    """The smallest 1, 2 or 5 x 10^k ns spacing that leaves `min_cells` between ticks."""
    want = ns_per_cell * min_cells
    k = 1
    while True:
        for f in (1, 2, 5):
            if f * k >= want:
                return f * k
        k *= 10


class Ruler(Widget):
    """Two lines: tick labels and ticks. One fixed axis: time since the recording's first
    event (on rank 0's clock), whatever the cursor's rank; ▼ marks the cursor rank's step
    starts. (Labels relative to the cursor rank's step moved as the cursor moved.)"""

    DEFAULT_CSS = "Ruler { height: 2; }"

    def __init__(self, timeline, **kw) -> None:
        super().__init__(**kw)
        self.timeline = timeline

    def render(self) -> Text:
        tl = self.timeline
        width = tl.cells
        g = tl.label_width
        tm = tl.model
        rank = tl.cursor_rank
        origin = tm.t_min
        every = tick_interval(tl.ns_per_cell)
        labels = [" "] * width
        marks = ["─"] * width
        first = (tl.t0 - origin) // every * every + origin
        t = first
        while t < tl.t1:
            c = int((t - tl.t0) / tl.ns_per_cell)
            if 0 <= c < width:
                marks[c] = "┴"
                lab = format_ns(t - origin)
                if c + len(lab) <= width and all(x == " " for x in labels[c : c + len(lab) + 1]):
                    labels[c : c + len(lab)] = lab
            t += every
        for s in tm.steps:  # step starts of the cursor rank
            span = tm.step_span(s, rank)
            if span is None:
                continue
            c = int((span[0] + tl.shift(rank) - tl.t0) / tl.ns_per_cell)
            if 0 <= c < width:
                marks[c] = "▼"
        if 0 <= tl.cursor_col < width:
            marks[tl.cursor_col] = "┃"
        text = Text(f"{'time'[: g - 1]:<{g}}", style="bold")
        text.append("".join(labels), style="grey70")
        text.append("\n")
        text.append(" " * g)
        for style, run in groupby(marks, key=lambda ch: "yellow1" if ch == "┃" else ("cyan" if ch == "▼" else "grey50")):
            text.append("".join(run), style=style)  # a span a run of one style (one a cell: ms a frame)
        return text
