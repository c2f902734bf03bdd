"""One group's collectives, one row per sequence number: who entered, who did not, skew."""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Static
from textual.worker import get_current_worker

from prism_rr.text import shown
from prism_rr.tui.analysis import compact_ranks, group_calls
from prism_rr.tui.model import format_ns
from prism_rr.tui.widgets.footer import KeyFooter

__all__ = ["CollectivesScreen"]


def _ranks(rs, n: int = 6) -> str:
    return ",".join(map(str, rs[:n])) + (f"… (+{len(rs) - n})" if len(rs) > n else "")


class CollectivesScreen(Screen):
    BINDINGS = [
        Binding("right_square_bracket", "group(1)", "Next group", id="collectives.next_group"),
        Binding("left_square_bracket", "group(-1)", "Prev group", id="collectives.prev_group"),
        Binding("x", "problems", "Problems only", id="collectives.problems"),
        Binding("j", "jump", "Show in timeline", id="collectives.jump"),
        Binding("escape", "stop", "Stop reading", show=False, id="collectives.stop"),
    ]

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.group: int | None = None
        self.rows: list = []
        self.members: tuple[int, ...] = ()
        self.problems_only = False

    def compose(self) -> ComposeResult:
        yield Static(id="collectives-head")
        yield DataTable(id="calls", cursor_type="row", zebra_stripes=True)
        yield KeyFooter()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("seq", "step", "op", "entered", "did not enter", "last in", "skew", "status")
        if self.group is None:
            self.show_group(self.app.default_group())
        table.focus()

    def show_group(self, group: int) -> None:
        self.group = group
        g = self.app.model.groups.get(group, {})
        self.rows = []
        self.query_one(DataTable).clear()
        self._head(f"reading {len(g.get('ranks', ()))} members…")
        self._load(group)

    def _head(self, extra: str = "") -> None:
        g = self.app.model.groups.get(self.group, {})
        text = Text()
        text.append(f"group {self.group}", style="bold")

        ranks = g.get("ranks", ())
        text.append(f"  {shown(g.get('desc') or g.get('name') or '')}  {len(ranks)} ranks: {compact_ranks(ranks)}"
                    f"  {shown(g.get('backend', ''))}\n[ ] change group  ·  x problems only  ·  j/enter timeline"
                    "  ·  esc stop reading")
        if extra:
            text.append(f"\n{extra}", style="italic grey50")
        self.query_one("#collectives-head", Static).update(text)

    @work(thread=True, exclusive=True, group="collectives")
    def _load(self, group: int) -> None:
        worker = get_current_worker()

        def progress(done: int, total: int) -> None:
            if done % 64 == 0 and done < total:
                self.app.call_from_thread(self._head, f"read {done} of {total} members…")

        rows, members = group_calls(self.app.model, group, progress=progress, stop=lambda: worker.is_cancelled)
        if not worker.is_cancelled:
            self.app.call_from_thread(self._fill, group, rows, members)

    def action_stop(self) -> None:
        """Esc: stop reading a big group's members (between batches)."""
        if any(w.group == "collectives" and not w.is_finished for w in self.workers):
            self.workers.cancel_group(self, "collectives")
            self._head("stopped: press [ then ] to read this group again")

    def _fill(self, group: int, rows, members) -> None:
        if group != self.group:
            return
        self.rows, self.members = rows, members
        table = self.query_one(DataTable)
        table.clear()
        bad = 0
        for row in rows:
            problems = row.problems(members)
            bad += bool(problems)
            if self.problems_only and not problems:
                continue
            style = "bold red" if problems else ""
            missing = row.missing(members)
            table.add_row(
                str(row.seq), Text(row.step_text, style="bold red" if "-" in row.step_text else ""), Text(shown(row.op)),
                f"{len(row.arrivals)}/{len(members)}", Text(_ranks(missing), style="red"),
                "" if row.last is None else str(row.last), format_ns(row.skew),
                Text("; ".join(problems) or "ok", style=style or "green"), key=str(row.seq),
            )
        if self.problems_only and not bad:
            self._head(f"x: problems only, and none of the {len(rows)} calls of this group has one "
                       "(x shows them all)")
        else:
            self._head(f"{len(rows)} calls, {bad} with problems" + ("  (problems only: x shows all)"
                                                                    if self.problems_only else ""))

    def action_group(self, direction: int) -> None:
        ids = sorted(self.app.model.groups)
        if not ids:
            return
        i = ids.index(self.group) if self.group in ids else 0
        self.show_group(ids[(i + direction) % len(ids)])

    def action_problems(self) -> None:
        self.problems_only = not self.problems_only
        self._fill(self.group, self.rows, self.members)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self._jump(int(event.row_key.value))

    def action_jump(self) -> None:
        table = self.query_one(DataTable)
        if not table.row_count:
            self.app.bell()
            return
        key = table.coordinate_to_cell_key((table.cursor_row, 0)).row_key
        self._jump(int(key.value))

    def _jump(self, seq: int) -> None:
        row = next((r for r in self.rows if r.seq == seq), None)
        if row is None or not row.arrivals:
            self.app.bell()
            return
        # the rank the status names first: where the call never completed, else where it failed
        rank = row.hung[0] if row.hung else (min(row.failed) if row.failed else row.last)
        self.app.call_later(self.app.show_call, rank, self.group, seq)
