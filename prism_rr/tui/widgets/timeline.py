"""The timeline: one line per rank, time across, drawn with the Line API.

With a replay of the bundle (`tui B --compare R`), each rank the replay ran gets a second
line under its own, `↻`: the replayed calls, aligned on the recording's start of the step
at the cursor, so the two runs of one step line up call by call.

Only visible lines are rendered (`render_line`); each is a few run-length-encoded
segments. A rank's spans are loaded in a thread worker the first time its line is
shown, and rendered lines are kept in an LRU until the view changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from time import monotonic

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual import work
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.worker import get_current_worker

from prism_rr.text import shown
from prism_rr.tui import model as m

__all__ = ["Timeline"]

# One background colour per span code (see prism_rr.tui.model).
# Truecolor throughout: textual converts palette colours on every repaint.
COLOURS = {
    m.IDLE: None, m.COMPUTE: "#4e4e4e", m.MARK: "#ffffff", m.ALL_REDUCE: "#1c6fd6",
    m.ALL_GATHER: "#1fa33c", m.REDUCE_SCATTER: "#b23ab8", m.ALL_TO_ALL: "#c9a227",
    m.OTHER_COLL: "#119c9c", m.P2P: "#e0791b", m.HANG: "#ff2020",
}
STYLES = {code: Style(bgcolor=c, color="#ffffff") if c else Style() for code, c in COLOURS.items()}
SELECTED = Style(bgcolor="#ffdd00", color="#000000", bold=True)  # the selected call
MEMBER = Style(bgcolor="#8a7600", color="#ffffff")  # the same call on the group's other members
CURSOR = Style(color="#ffff00", bold=True)
LABEL = Style(color="#a0a0a0")
LABEL_CURSOR = Style(color="#000000", bgcolor="#ffff00", bold=True)
LOADING = Style(color="#5a5a5a", italic=True)
CHARS = {m.HANG: "!", -2: "!"}  # -1, -2: the selected call (-2: one that never completed)

ZOOM = 2.0
MIN_NS_PER_CELL = 10.0
SPAN_CELLS = 8  # a call jumped to is zoomed to at least this many cells


class Timeline(ScrollView, can_focus=True):
    """Ranks as rows; keys zoom and pan time, move between ranks, steps and calls."""

    BINDINGS = [
        Binding("up", "cursor(-1)", "Rank up", show=False, id="timeline.up"),
        Binding("down", "cursor(1)", "Rank down", show=False, id="timeline.down"),
        Binding("pageup", "page(-1)", "Page up", show=False, id="timeline.page_up"),
        Binding("pagedown", "page(1)", "Page down", show=False, id="timeline.page_down"),
        Binding("home", "first_rank", "First rank", show=False, id="timeline.first_rank"),
        Binding("end", "last_rank", "Last rank", show=False, id="timeline.last_rank"),
        Binding("left", "move(-1)", "Earlier", show=False, id="timeline.left"),
        Binding("right", "move(1)", "Later", show=False, id="timeline.right"),
        Binding("shift+left,h", "pan(-0.5)", "Pan left", id="timeline.pan_left"),
        Binding("shift+right,l", "pan(0.5)", "Pan right", id="timeline.pan_right"),
        Binding("plus,equals_sign", "zoom(0.5)", "Zoom in", id="timeline.zoom_in"),
        Binding("minus", "zoom(2)", "Zoom out", id="timeline.zoom_out"),
        Binding("0", "fit", "Fit all", id="timeline.fit"),
        Binding("right_square_bracket", "step(1)", "Next step", id="timeline.next_step"),
        Binding("left_square_bracket", "step(-1)", "Prev step", id="timeline.prev_step"),
        Binding("n", "call(1)", "Next call", id="timeline.next_call"),
        Binding("p", "call(-1)", "Prev call", id="timeline.prev_call"),
        Binding("a", "align", "Align steps", id="timeline.align"),
        Binding("enter", "select", "Details", id="timeline.select"),
    ]

    class ViewChanged(Message):
        """Time window, cursor or alignment changed (the ruler redraws)."""

    class SpansLoaded(Message):
        """The loader read spans of visible lines (posted from its thread)."""

    class SpanSelected(Message):
        def __init__(self, rank: int, index: int) -> None:
            super().__init__()
            self.rank = rank
            self.index = index

    def __init__(self, tm: m.TimelineModel, replay: m.TimelineModel | None = None, **kw) -> None:
        super().__init__(**kw)
        self.model = tm
        self.replay = replay
        # a line is (rank, replayed?): a replayed rank's line comes under its recorded one
        replayed = set(replay.ranks) if replay is not None else set()
        self.rows: list[tuple[int, bool]] = [
            row for r in tm.ranks for row in (((r, False), (r, True)) if r in replayed else ((r, False),))]
        self.row_index = {row: i for i, row in enumerate(self.rows)}
        self.t0, t1 = tm.initial_window()
        self.ns_per_cell = float(max(t1 - self.t0, 1000)) / 100
        self._fit_pending = True  # the first resize sets ns_per_cell to fit the window
        self._want_span = t1 - self.t0
        self.cursor_row = 0
        self.cursor_col = 0
        self.align_step: int | None = None
        self.selected: tuple[int, int] | None = None  # (rank, span index)
        self._selected_call: tuple | None = None  # the selected call's (group, seq, kind)
        self.label_width = max(len(str(max(tm.ranks, default=0))) + 2, 5)
        self._lines: LRUCache[tuple, Strip] = LRUCache(2048)
        self._cells: LRUCache[tuple, tuple] = LRUCache(512)  # a line's cells and owners at a view
        self._pending: set[tuple[int, bool]] = set()
        self._load_lock = threading.Lock()  # guards _pending, _view and _loader_started
        self._view = range(0)  # the visible lines, as the loop last drew them
        self._thread_busy = False  # the loader thread is reading lines
        self._loader_started = False
        self._pump_due = False
        self._watched: int | None = None  # the process apart's pipe, as the loop watches it
        self.loads = 0  # ranks loaded so far (benchmark and tests read it)

    # --- geometry --------------------------------------------------------------------

    @property
    def cells(self) -> int:
        return max(1, self.scrollable_content_region.width - self.label_width)

    @property
    def cursor_rank(self) -> int:
        return self.rows[self.cursor_row][0] if self.rows else 0

    @property
    def on_replay(self) -> bool:
        """The cursor is on a replayed line."""
        return bool(self.rows) and self.rows[self.cursor_row][1]

    def row_of(self, rank: int) -> int:
        """The line of `rank`'s recorded calls."""
        return self.row_index[(rank, False)]

    def _source(self, replayed: bool) -> m.TimelineModel:
        return self.replay if replayed else self.model

    def replay_shift(self, rank: int) -> int:
        """How far the replayed line of `rank` is moved: the replay's start of the step at
        the cursor (on the recorded line) onto the recording's."""
        tm, rep = self.model, self.replay
        step = tm.step_at(rank, self.cursor_time - self.shift(rank))
        steps = [step] if step is not None else []
        steps += [s for s in tm.steps if s != step]
        for s in steps[:3]:
            a, b = tm.step_span(s, rank), rep.step_span(s, rank)
            if a and b:
                return b[0] - a[0]
        return 0

    @property
    def cursor_time(self) -> int:
        return int(self.t0 + (self.cursor_col + 0.5) * self.ns_per_cell)

    @property
    def t1(self) -> int:
        return int(self.t0 + self.ns_per_cell * self.cells)

    def shift(self, rank: int) -> int:
        """How far `rank`'s row is moved in time to align its step start with the cursor rank's."""
        if self.align_step is None:
            return 0
        mine = self.model.step_span(self.align_step, rank)
        ref = self.model.step_span(self.align_step, self.cursor_rank)
        return 0 if mine is None or ref is None else mine[0] - ref[0]

    def on_mount(self) -> None:
        self.virtual_size = Size(self.size.width, len(self.rows))
        if self.model.apart is not None:
            self._watched = self.model.apart.fileno()
            asyncio.get_running_loop().add_reader(self._watched, self._received)

    def on_unmount(self) -> None:
        self._unwatch()

    def _unwatch(self) -> None:
        """The loop stops watching the process apart's pipe (before it is closed)."""
        fd, self._watched = self._watched, None
        if fd is not None:
            with contextlib.suppress(ValueError, OSError, RuntimeError):
                asyncio.get_running_loop().remove_reader(fd)

    def on_resize(self) -> None:
        self.virtual_size = Size(self.size.width, len(self.rows))
        if self._fit_pending and self.cells > 1:
            self._fit_pending = False
            self.ns_per_cell = max(MIN_NS_PER_CELL, self._want_span / self.cells)
            self.cursor_col = self.cells // 2
        elif self.selected is not None:
            # the details pane opened (or the terminal changed): the selected call stays in view
            self._centre_selected()
            return
        self._view_changed()

    # --- rendering -------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        row = int(self.scroll_offset.y) + y
        if not 0 <= row < len(self.rows):
            return Strip.blank(self.size.width)
        self._note_view()
        rank, replayed = self.rows[row]
        source = self._source(replayed)
        width = self.cells
        is_cursor = row == self.cursor_row
        sel, member = self._selected_on(rank, replayed, source)
        t0 = self._line_t0(rank, replayed)
        key = (rank, replayed, t0, self.ns_per_cell, width, sel, member, self.cursor_col if is_cursor else None)
        strip = self._lines.get(key)
        if strip is not None:
            return strip
        name = f"{rank}↻" if replayed else str(rank)
        label = Segment(f"{name:>{self.label_width - 1}} ", LABEL_CURSOR if is_cursor else LABEL)
        spans = source.get(rank)
        if spans is None:
            self._request((rank, replayed))
            return Strip([label, Segment("·" * width, LOADING)], width + self.label_width)
        cells, owner = self._cells_of(rank, replayed, spans, t0, width)
        if sel is not None:
            cells = self._marked(cells, spans, sel, member, t0, width)
        strip = Strip([label, *self._segments(spans, cells, owner)], width + self.label_width)
        if is_cursor and 0 <= self.cursor_col < width:
            col = self.label_width + self.cursor_col
            left, mid, right = strip.divide([col, col + 1, width + self.label_width])
            segs = list(mid)
            under = segs[0].style if segs else Style()
            strip = Strip.join([left, Strip([Segment("┃", (under or Style()) + CURSOR)], 1), right])
        self._lines[key] = strip
        return strip

    def _note_view(self) -> None:
        """The visible lines, for the loaders (which read it from their thread or later)."""
        view = self.visible_rows()
        if view != self._view:
            with self._load_lock:
                self._view = view
            if self.model.apart is not None:
                self._pump_soon()  # the pages around the new view
            if self.model.apart is None or self.replay is not None:
                self._kick_loader()

    def _selected_on(self, rank: int, replayed: bool, source) -> tuple[int | None, bool]:
        """(the span on this line marked as selected, whether as the selected call's
        member: its other members, or its replay)."""
        if self.selected and self.selected[0] == rank and not replayed:
            return self.selected[1], False
        if self._selected_call is not None:
            loaded = source.get(rank)
            if loaded is not None:  # the selected call on another member, or as replayed
                sel = loaded.find_call(*self._selected_call)
                return sel, sel is not None
        return None, False

    def _line_t0(self, rank: int, replayed: bool) -> int:
        return self.t0 + self.shift(rank) + (self.replay_shift(rank) if replayed else 0)

    def _cells_of(self, rank: int, replayed: bool, spans, t0: int, width: int) -> tuple[list, list]:
        """This line's cells (cells_many), drawn with every visible loaded line not drawn
        yet at this view: one pass over arrays a screen."""
        key = (rank, replayed, t0, self.ns_per_cell, width)
        got = self._cells.get(key)
        if got is not None:
            return got
        todo = {key: (spans, t0)}
        for i in self._view:
            r, rep = self.rows[i]
            other = self._source(rep).get(r)
            if other is not None:
                t = self._line_t0(r, rep)
                k = (r, rep, t, self.ns_per_cell, width)
                if k not in todo and self._cells.get(k) is None:
                    todo[k] = (other, t)
        for k, cells in zip(todo, m.cells_many(list(todo.values()), self.ns_per_cell, width)):
            self._cells[k] = cells
        return self._cells[key]

    def _marked(self, cells: list, spans, sel: int, member: bool, t0: int, width: int) -> list:
        """`cells` with the selected call's marked (-1; -2 one that never completed; -3 a
        member's or the replay's), at least a cell of it."""
        s0 = max(0, int((spans.starts[sel] - t0) / self.ns_per_cell))
        s1 = min(width, int((min(spans.ends[sel], t0 + self.ns_per_cell * width) - t0) / self.ns_per_cell) + 1)
        cells = list(cells)
        mark = -3 if member else (-2 if spans.codes[sel] == m.HANG else -1)
        for c in range(s0, max(s1, s0 + 1) if s0 < width else s1):
            cells[c] = mark
        return cells

    def _segments(self, spans, codes: list, owner: list) -> list[Segment]:
        """A line's cells as runs: a new run where the code changes, or a new call of the
        same code begins (back-to-back calls of one op)."""
        c = np.array(codes, np.int64)
        o = np.array(owner, np.int64)
        new = (c[1:] != c[:-1]) | ((o[1:] != o[:-1]) & (c[1:] >= 0) & (c[1:] != m.IDLE) & (c[1:] != m.COMPUTE))
        bounds = [0, *(np.flatnonzero(new) + 1).tolist(), len(codes)]
        out = []
        for a, b in zip(bounds, bounds[1:]):
            code = codes[a]
            style = (MEMBER if code == -3 else SELECTED) if code < 0 else STYLES[code]
            out.append(Segment(self._run_text(spans, owner[a], code, b - a), style))
        return out

    @staticmethod
    def _run_text(spans, index: int, code: int, n: int) -> str:
        """A run of cells: a call's op name where it fits (after a separator), else its
        fill character."""
        fill = CHARS.get(code, " ")
        if code in (m.IDLE, m.COMPUTE, m.MARK) or code < 0 or index < 0:
            return fill * n
        op = shown(spans.op_at(index) or "", 40)  # the bundle's: no escape reaches a cell
        if n >= len(op) + 2:
            return "▏" + op + fill * (n - len(op) - 1)
        return ("▏" + fill * (n - 1)) if n > 1 else fill

    def visible_rows(self) -> range:
        top = int(self.scroll_offset.y)
        return range(top, min(len(self.rows), top + self.scrollable_content_region.height))

    def missing_visible(self) -> int:
        """Visible lines whose spans are not loaded yet."""
        return sum(1 for i in self.visible_rows() if self._loaded(self.rows[i]) is None)

    def _loaded(self, row: tuple[int, bool]):
        return self._source(row[1]).get(row[0])

    # --- loading ---------------------------------------------------------------------
    # The visible lines asked for first, then the pages above and below the view, so paging
    # finds them ready. Where the model reads apart (a process of its own, on the other
    # core: big bundles), the loop asks it for a few lines at a time and takes what it
    # sends as it comes (`_received`, called by the loop when the pipe has data); else a
    # loader thread reads them, and ends when none is left. Either reads the view from
    # `_view`, which the loop sets as it draws (layout is the loop's, never a thread's).

    APART_IN_FLIGHT = 16  # lines asked of the process apart at once: what a new view waits behind

    @property
    def _loading(self) -> bool:
        """Lines are being read, or wait to be (the benchmark waits for this to turn false)."""
        apart = self.model.apart
        return self._thread_busy or bool(self._pending) or self._pump_due or (apart is not None and bool(apart.asked))

    def _request(self, row: tuple[int, bool]) -> None:
        with self._load_lock:
            self._pending.add(row)
        if self._apart_for(row[1]) is not None:
            self._pump_soon()
        else:
            self._kick_loader()

    def _kick_loader(self) -> None:
        """Starts the loader thread unless it runs (it ends when it finds nothing to read)."""
        with self._load_lock:
            if self._loader_started:
                return
            self._loader_started = True
        self._loader()

    def _apart_for(self, replayed: bool):
        return None if replayed else self.model.apart

    def _pump_soon(self) -> None:
        if not self._pump_due:
            self._pump_due = True
            self.call_later(self._pump)

    def _pump(self) -> None:
        """Ask the process apart for the lines wanted next, up to APART_IN_FLIGHT at once."""
        self._pump_due = False
        apart = self.model.apart
        if apart is None:
            return
        room = self.APART_IN_FLIGHT - len(apart.asked)
        if room <= 0:
            return
        with self._load_lock:
            rows = self._next_to_load(room, skip=apart.asked, replayed=False)
        if rows:
            try:
                apart.ask([(rank, self.model.offsets.get(rank, 0)) for rank, _ in rows])
            except OSError:  # it died: the loader thread reads from now on
                self._stop_apart()

    def _received(self) -> None:
        """What the process apart sent: kept, the view redrawn where it shows any. (Called
        by the loop, outside textual's handlers: what it raises is handed to the app.)"""
        try:
            self._take_received()
        except Exception as exc:  # noqa: BLE001 - a malformed bundle ends the app with exit 4, a bug with its trace
            self.app._handle_exception(exc)

    def _take_received(self) -> None:
        apart = self.model.apart
        if apart is None:
            return
        try:
            got = apart.received()
        except (EOFError, OSError):  # it died: the loader thread reads from now on
            self._stop_apart()
            return
        view = self._view
        shown_now = False
        for rank, arrays in got:
            if arrays is None:  # read here, where a malformed chunk is named (and ends the app)
                self.model.load(rank)
            else:
                self.model.keep(rank, arrays, apart.values)
            self.loads += 1
            shown_now = shown_now or view.start <= self.row_index[(rank, False)] < view.stop
        if shown_now:
            self.refresh()
        self._pump()

    def _stop_apart(self) -> None:
        self._unwatch()
        self.model.close()
        self._request_again()

    def _request_again(self) -> None:
        with self._load_lock:
            rows = list(self._pending) or [self.rows[i] for i in self._view]
        for row in rows:
            self._request(row)

    @work(thread=True, group="spans")
    def _loader(self) -> None:
        worker = get_current_worker()
        posted = monotonic()
        while not worker.is_cancelled:
            with self._load_lock:
                # the recorded lines are the process apart's while it reads
                rows = self._next_to_load(self.BATCH, replayed=True if self.model.apart else None)
                self._thread_busy = bool(rows)
                if not rows:
                    self._loader_started = False
                    return
            source = self._source(rows[0][1])
            shown_now = False
            for i, row in enumerate(rows):
                source.load(row[0])
                self.loads += 1
                view = self._view  # as drawn now: a neighbour read may have come into view meanwhile
                shown_now = shown_now or view.start <= self.row_index[row] < view.stop
                if shown_now and (i == len(rows) - 1 or monotonic() - posted > 0.1):
                    posted = monotonic()
                    shown_now = False
                    self.post_message(self.SpansLoaded())

    BATCH = 8  # lines the loader thread reads before it looks at the view again

    def _next_to_load(self, limit: int, skip=(), replayed: bool | None = None) -> list:
        """Up to `limit` lines to load next, of one source: the visible lines asked for
        first, then the pages below and above; none when every
        visible and neighbouring line is loaded. Lines of ranks in `skip` (asked for
        already) are left out; `replayed`: only lines of that source. Called with _load_lock held
        or on the loop."""
        view, lines, index = self._view, self.rows, self.row_index
        lo, hi = view.start - len(view), view.stop + len(view)

        def wanted(r) -> bool:
            return (replayed is None or r[1] == replayed) and r[0] not in skip and self._loaded(r) is None

        todo = sorted((r for r in self._pending if lo <= index[r] < hi and wanted(r)), key=index.__getitem__)
        keep = {r for r in self._pending if lo <= index[r] < hi and not wanted(r) and self._loaded(r) is None}
        self._pending.clear()  # a line scrolled far away is dropped; asked for again if shown
        self._pending.update(keep)
        if todo:
            batch = [r for r in todo[:limit] if r[1] == todo[0][1]]
            self._pending.update(r for r in todo if r not in batch)
            return batch
        near = (*range(view.stop, min(len(lines), hi)), *range(max(0, lo), view.start))
        batch = [lines[i] for i in near if wanted(lines[i])][:limit]
        return [r for r in batch if r[1] == batch[0][1]] if batch else []

    def on_timeline_spans_loaded(self, _msg) -> None:
        self.refresh()

    def prefetch(self, ranks) -> None:
        for r in ranks:
            if self.model.get(r) is None:
                self._request((r, False))

    # --- view changes ----------------------------------------------------------------

    def _view_changed(self) -> None:
        self.refresh()
        self.post_message(self.ViewChanged())

    def _keep_cursor_visible(self) -> None:
        top = int(self.scroll_offset.y)
        height = max(1, self.scrollable_content_region.height)
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False, immediate=True)
        elif self.cursor_row >= top + height:
            self.scroll_to(y=self.cursor_row - height + 1, animate=False, immediate=True)

    def set_cursor_row(self, row: int) -> None:
        old, top = self.cursor_row, int(self.scroll_offset.y)
        self.cursor_row = max(0, min(len(self.rows) - 1, row))
        self._keep_cursor_visible()
        if int(self.scroll_offset.y) == top and self.align_step is None:
            self.refresh_line(old)  # only the two rows the cursor left and entered
            self.refresh_line(self.cursor_row)
            self.post_message(self.ViewChanged())
        else:
            self._view_changed()

    def center_on(self, t: int) -> None:
        """Pan so time t is in view, and put the cursor on it."""
        if not self.t0 <= t < self.t1:
            self.t0 = int(t - self.ns_per_cell * self.cells / 2)
        self.cursor_col = int((t - self.t0) / self.ns_per_cell)
        self._view_changed()

    def show_span(self, rank: int, index: int) -> None:
        """Move the cursor to a rank's call, zooming so the call is at least a few cells wide."""
        spans = self.model.load(rank)
        self.cursor_row = self.row_of(rank)
        self._keep_cursor_visible()
        start, end = spans.starts[index], spans.ends[index]
        if end != m.FAR and (end - start) / self.ns_per_cell > self.cells / 2:
            self.ns_per_cell = max(MIN_NS_PER_CELL, (end - start) * 2 / self.cells)
        elif end != m.FAR and (end - start) / self.ns_per_cell < SPAN_CELLS:
            # a call of 62 us at fit zoom is one cell: zoom in until it spans several
            self.ns_per_cell = max(MIN_NS_PER_CELL, (end - start) / SPAN_CELLS)
        self.selected = (rank, index)
        self._centre_selected()
        self.select(rank, index)

    def _centre_selected(self) -> None:
        """Centre the view on the selected call (its start, if it never ended), cursor on it."""
        rank, index = self.selected
        spans = self.model.get(rank)
        if spans is None or index >= len(spans.starts):
            return
        start, end = spans.starts[index] + self.shift(rank), spans.ends[index]
        mid = start if end == m.FAR else start + (end - spans.starts[index]) // 2
        self.t0 = int(mid - self.ns_per_cell * self.cells / 2)
        self.cursor_col = max(0, min(self.cells - 1, int((start - self.t0) / self.ns_per_cell)))
        self._view_changed()

    def select(self, rank: int, index: int | None) -> None:
        self.selected = None if index is None else (rank, index)
        self._selected_call = None  # (group, seq, kind): drawn on every member's row
        if index is not None:
            spans = self.model.get(rank)
            self._selected_call = spans.collective_key(index) if spans is not None else None
        self.refresh()
        if index is not None:
            self.post_message(self.SpanSelected(rank, index))

    # --- actions ---------------------------------------------------------------------

    def action_cursor(self, delta: int) -> None:
        self.set_cursor_row(self.cursor_row + delta)

    def action_page(self, direction: int) -> None:
        height = max(1, self.scrollable_content_region.height)
        self.scroll_to(y=self.scroll_offset.y + direction * height, animate=False, immediate=True)
        self.set_cursor_row(self.cursor_row + direction * height)

    def action_first_rank(self) -> None:
        self.set_cursor_row(0)

    def action_last_rank(self) -> None:
        self.set_cursor_row(len(self.rows) - 1)

    def action_move(self, delta: int) -> None:
        col = self.cursor_col + delta
        if col < 0 or col >= self.cells:
            self.t0 += int(delta * self.ns_per_cell)
            col = max(0, min(self.cells - 1, col))
        self.cursor_col = col
        self._view_changed()

    def action_pan(self, fraction: float) -> None:
        self.t0 += int(fraction * self.cells * self.ns_per_cell)
        self._view_changed()

    def action_zoom(self, factor: float) -> None:
        t = self.cursor_time
        # out no further than the whole bundle across the view
        widest = max(MIN_NS_PER_CELL, (self.model.t_max - self.model.t_min) / self.cells)
        self.ns_per_cell = max(MIN_NS_PER_CELL, min(widest, self.ns_per_cell * factor))
        self.t0 = int(t - (self.cursor_col + 0.5) * self.ns_per_cell)
        self._view_changed()

    def action_fit(self) -> None:
        """The recorded steps across the view (the time before the first step, imports and
        set-up, took most of the width), else the whole bundle."""
        lo, hi = self.model.steps_window()
        self.ns_per_cell = max(MIN_NS_PER_CELL, (hi - lo) / self.cells)
        self.t0 = lo
        self.cursor_col = min(self.cursor_col, self.cells - 1)
        self._view_changed()

    def action_step(self, direction: int) -> None:
        rank = self.cursor_rank
        t = self.cursor_time - self.shift(rank)
        current = self.model.step_at(rank, t)
        steps = self.model.steps
        if not steps:
            return
        if current is None:
            target = steps[0] if direction > 0 else None
        else:
            i = steps.index(current)
            span = self.model.step_span(current, rank)
            # [ from inside a step goes to its start first
            if direction < 0 and span and span[0] < t - self.ns_per_cell:
                target = current
            else:
                j = i + direction
                target = steps[j] if 0 <= j < len(steps) else None
        if target is None or not self.show_step(target):
            self.app.bell()

    def show_step(self, step: int) -> bool:
        """Fit step `step` of the cursor rank in the view, the cursor at its start."""
        rank = self.cursor_rank
        span = self.model.step_extent(step, rank)  # a step it never ended: to its last record
        if not span:
            return False
        if span[1] is not None:  # show the whole step
            self.ns_per_cell = max(MIN_NS_PER_CELL, (span[1] - span[0]) * 1.05 / self.cells)
        self.t0 = int(span[0] + self.shift(rank) - self.ns_per_cell * self.cells * 0.02)
        self.cursor_col = int((span[0] + self.shift(rank) - self.t0) / self.ns_per_cell)
        self._view_changed()
        return True

    def action_call(self, direction: int, op: str | None = None) -> None:
        rank = self.cursor_rank
        spans = self.model.load(rank)
        t = self.cursor_time - self.shift(rank)
        if self.selected and self.selected[0] == rank:
            t = spans.starts[self.selected[1]]
        i = spans.next_comm(t, direction, op)
        if i is None:
            self.app.bell()
            return
        self.show_span(rank, i)

    def action_align(self) -> None:
        if self.align_step is None:
            self.align_step = self.model.step_at(self.cursor_rank, self.cursor_time)
            if self.align_step is None and self.model.steps:
                self.align_step = self.model.steps[0]
        else:
            self.align_step = None
        self._lines.clear()
        self._view_changed()

    # --- mouse ------------------------------------------------------------------------

    def on_click(self, event) -> None:
        """A click puts the cursor there and selects the call under it (details open)."""
        row = int(self.scroll_offset.y) + event.y
        col = event.x - self.label_width
        if not 0 <= row < len(self.rows) or not 0 <= col < self.cells:
            return
        self.focus()
        self.set_cursor_row(row)
        self.cursor_col = col
        self._view_changed()
        if self.on_replay:
            return  # a replayed call's details are the replay bundle's (tui REPLAY)
        rank = self.cursor_rank
        spans = self.model.get(rank) or self.model.load(rank)
        i = spans.nearest(self.cursor_time - self.shift(rank), self.ns_per_cell)
        if i is not None:
            self.select(rank, i)

    def _wheel_zoom(self, event, factor: float) -> bool:
        """Ctrl+wheel zooms about the pointer (as in Perfetto); the plain wheel scrolls ranks."""
        if not event.ctrl:
            return False
        col = event.x - self.label_width
        if 0 <= col < self.cells:
            self.cursor_col = col
        self.action_zoom(factor)
        event.stop()
        event.prevent_default()
        return True

    def on_mouse_scroll_up(self, event) -> None:
        self._wheel_zoom(event, 1 / ZOOM)

    def on_mouse_scroll_down(self, event) -> None:
        self._wheel_zoom(event, ZOOM)

    def action_select(self) -> None:
        if self.on_replay:
            self.notify("a replayed line: its calls' details are in the replay bundle (prism-rr tui REPLAY); "
                        "select the call on the recorded line above to see both", severity="warning")
            return
        rank = self.cursor_rank
        spans = self.model.get(rank) or self.model.load(rank)
        i = spans.nearest(self.cursor_time - self.shift(rank), self.ns_per_cell * 2)
        if i is None:
            self.app.bell()
            return
        self.select(rank, i)
