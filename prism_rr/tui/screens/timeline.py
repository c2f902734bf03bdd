"""The timeline screen: ruler, rank rows, status line, and the detail pane."""

from __future__ import annotations

import bisect

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Static

from prism_rr.format import PointToPoint
from prism_rr.tui import model as m
from prism_rr.tui.model import TimelineModel, format_ns
from prism_rr.tui.screens.goto import GotoScreen
from prism_rr.tui.screens.search import SearchScreen, matches
from prism_rr.tui.widgets.detail import SpanDetail
from prism_rr.tui.widgets.footer import KeyFooter
from prism_rr.tui.widgets.ruler import Ruler
from prism_rr.tui.widgets.timeline import CHARS, COLOURS, Timeline

__all__ = ["TimelineScreen", "legend"]


def legend():
    """One line: each colour of the timeline and what it stands for."""
    text = Text()
    for code, name in m.KIND_NAMES.items():
        colour = COLOURS.get(code)
        if colour is None or code == m.MARK:
            continue
        text.append(f" {CHARS.get(code, ' ')} ", style=f"on {colour} #ffffff")
        text.append(f" {name}  ")
    text.append("(a cell shows what takes most of its time)", style="italic")
    return text


class TimelineScreen(Screen):
    _status = ""  # the status line as last drawn

    BINDINGS = [
        Binding("g", "goto", "Go to", id="timeline.goto"),
        Binding("exclamation_mark", "next_problem", "Next problem", id="timeline.next_problem"),
        Binding("slash", "search", "Find", id="timeline.search"),
        Binding("escape", "close_detail", "Close details", show=False, id="timeline.close_detail"),
        Binding("tab", "toggle_focus", "Details/timeline", show=False, id="timeline.focus_detail"),
    ]

    def compose(self) -> ComposeResult:
        tm = self.app.model
        replay = None
        if self.app.replay is not None:
            replay = TimelineModel(self.app.replay, apart=False)  # its lines are few: the replay's real ranks
        self.timeline = Timeline(tm, replay, id="timeline")
        with Horizontal(id="timeline-body"):
            with Vertical(id="timeline-main"):
                yield Ruler(self.timeline, id="ruler")
                yield self.timeline
                yield Static(id="timeline-status")
                yield Static(legend(), id="timeline-legend")
            yield SpanDetail(tm, id="detail", classes="hidden")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.timeline.focus()

    def on_timeline_view_changed(self, _msg) -> None:
        self.query_one(Ruler).refresh()
        tl = self.timeline
        rank = tl.cursor_rank
        tm = tl.model
        if tl.selected is not None and tl.selected[0] == rank:
            # the selected call's own step, as its details say
            step = tm.load(rank).records[tl.selected[1]].step
            where = f"step {step}"
        else:
            t = tl.cursor_time - tl.shift(rank)
            step = tm.step_at(rank, t)
            where = f"step {step}" if step is not None else (
                f"before step {tm.steps[0]}" if tm.steps else "no steps recorded")
        at = format_ns(tl.cursor_time - tm.t_min)
        bits = [f"rank {rank}" + (" replayed (↻, aligned on the recording's step start)" if tl.on_replay else ""),
                where]
        if tl.align_step is not None:
            bits.append(f"aligned on step {tl.align_step}")
        bits += [f"t {at} (time from the recording's start)", f"{format_ns(tl.ns_per_cell)}/cell",
                 f"window {format_ns(tl.t1 - tl.t0)}"]
        status = "  ·  ".join(bits)
        if status != self._status:  # (an update draws the line again, with its markup parsed)
            self._status = status
            self.query_one("#timeline-status", Static).update(Text(status), layout=False)

    def on_timeline_span_selected(self, msg: Timeline.SpanSelected) -> None:
        detail = self.query_one(SpanDetail)
        detail.remove_class("hidden")
        detail.show(msg.rank, msg.index)

    def action_close_detail(self) -> None:
        self.query_one(SpanDetail).add_class("hidden")
        self.timeline.select(self.timeline.cursor_rank, None)
        self.timeline.focus()

    def action_toggle_focus(self) -> None:
        detail = self.query_one(SpanDetail)
        if self.timeline.has_focus and not detail.has_class("hidden"):
            detail.focus()
        else:
            self.timeline.focus()

    def action_next_problem(self) -> None:
        """`!`: the next finding of the overview's diagnosis (d), in turn; without one, the
        cursor rank's next call that failed or never completed after the cursor."""
        if getattr(self, "_problems_of", None) is not self.app.findings:  # a new diagnosis: from its first
            self._problems_of, self._problem = self.app.findings, -1
        findings = [f for f in self.app.findings if f.ranks and f.group is not None and f.seq is not None]
        if findings:
            self._problem = (self._problem + 1) % len(findings)
            f = findings[self._problem]
            self.goto(f.ranks[0], f.group, f.seq)
            self.notify(f"finding {self._problem + 1} of {len(findings)}: {f.kind}", timeout=3)
            return
        tl = self.timeline
        rank = tl.cursor_rank
        spans = tl.model.load(rank)
        t = tl.cursor_time - tl.shift(rank)
        start = bisect.bisect_right(spans.starts, t)
        for i in range(start, len(spans.starts)):
            if spans.codes[i] == m.HANG:
                tl.show_span(rank, i)
                return
        self.notify(f"no call failed or never completed on rank {rank} after the cursor; "
                    "d on the overview (1) diagnoses the whole bundle, then ! goes from finding to finding",
                    severity="warning", markup=False)

    def action_search(self) -> None:
        def done(text):
            if text:
                self.last_search = text
                self.find_next(text)

        self.app.push_screen(SearchScreen(getattr(self, "last_search", "")), done)

    def find_next(self, text: str) -> bool:
        """The next call after the cursor whose op or stack contains `text`: on the cursor
        rank, else on the next ranks whose calls are loaded (those shown or near them)."""
        tl = self.timeline
        tm = tl.model
        row = tm.row_of[tl.cursor_rank]
        for k, rank in enumerate(tm.ranks[row:] + tm.ranks[:row]):
            spans = tm.load(rank) if k == 0 else tm.get(rank)
            if spans is None:
                continue
            first = 0
            if k == 0:  # after the selected call, else after the cursor
                first = bisect.bisect_right(spans.starts, tl.cursor_time - tl.shift(rank))
                if tl.selected is not None and tl.selected[0] == rank:
                    first = tl.selected[1] + 1
            for i in range(first, len(spans.starts)):
                rec = spans.records[i]
                if hasattr(rec, "group") and matches(rec, text):
                    tl.show_span(rank, i)
                    return True
        self.notify(f"no call after the cursor has {text!r} in its op or stack (loaded ranks searched)",
                    severity="warning", markup=False)
        return False

    def action_goto(self) -> None:
        def done(target):
            if target is not None:
                self.goto(*target)

        self.app.push_screen(GotoScreen(), done)

    def goto(self, rank: int, group: int | None = None, seq: int | None = None, *,
             fallback: bool = True) -> bool:
        """Show `rank`, and its call `seq` in `group` when given; False if there is none."""
        tm = self.timeline.model
        if rank not in tm.row_of:
            self.notify(f"rank {rank} is not in this bundle", severity="error")
            return False
        if group is None:
            self.timeline.set_cursor_row(self.timeline.row_of(rank))
            return True
        spans = tm.load(rank)
        i = spans.find_call(group, seq if seq is not None else 0)
        if i is None:
            i = spans.find_call(group, seq if seq is not None else 0, PointToPoint)
        if i is None and not fallback:
            return False
        if i is None:
            # the rank never entered the call (a finding often names such a rank): show the
            # call on a member that did, keeping the cursor's rank the one asked for
            members = tm.group_members(group)
            for other in members if rank in members else ():
                if other != rank and other in tm.row_of:
                    j = tm.load(other).find_call(group, seq if seq is not None else 0)
                    if j is not None:
                        self.notify(f"rank {rank} never entered call {seq} of group {group}; "
                                    f"rank {other}'s is selected", severity="warning")
                        self.timeline.show_span(other, j)
                        self.timeline.set_cursor_row(self.timeline.row_of(rank))
                        return False
            self.notify(f"rank {rank} has no call {seq} in group {group}", severity="warning")
            self.timeline.select(rank, None)
            self.timeline.set_cursor_row(self.timeline.row_of(rank))
            return False
        self.timeline.show_span(rank, i)
        return True

    def goto_end(self, rank: int) -> bool:
        """Show `rank` where its records end (a crash, a kill: what a finding that names no
        call is about), the cursor there; False if the rank is not in the bundle."""
        tl = self.timeline
        tm = tl.model
        if rank not in tm.row_of:
            self.notify(f"rank {rank} is not in this bundle", severity="error")
            return False
        last = tm.summaries["ranks"].get(rank, {}).get("t_last")
        if type(last) is int:
            end = last - tm.offsets.get(rank, 0)
        else:
            spans = tm.load(rank)
            end = max((s if e == m.FAR else e for s, e in zip(spans.starts, spans.ends)), default=None)
        self.query_one(SpanDetail).add_class("hidden")  # no call is chosen: none is described
        tl.select(rank, None)
        tl.set_cursor_row(tl.row_of(rank))
        if end is not None:
            # just inside its last record: the cursor's step is the one its records end in
            tl.center_on(end - 1 + tl.shift(rank))
        return True
