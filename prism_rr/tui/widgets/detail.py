"""The pane beside the timeline: one call's fields, its group's arrivals, who came last."""

from __future__ import annotations

import io
from dataclasses import fields

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text
from textual import work
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from prism_rr.format import Collective, Compute, Marker, PointToPoint, ops
from prism_rr.text import human_bytes, shown
from prism_rr.tui.model import FAR, TimelineModel, format_ns

# Deferred imports: rich's Group and Console, where the details pane renders a table.

__all__ = ["MAX_MEMBERS", "SpanDetail", "call_arrivals", "call_failure", "human_bytes", "tensors_text"]

MAX_MEMBERS = 256  # members read for one call; a larger group is sampled, and says so


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.1f} MiB"


def tensors_text(shapes, dtypes) -> str:
    """((4, 1024),), ('float32',) -> 4x1024 float32; several tensors comma-separated."""
    shapes, dtypes = tuple(shapes or ()), tuple(dtypes or ())
    n = max(len(shapes), len(dtypes))
    out = []
    for i in range(n):
        shape = shapes[i] if i < len(shapes) else None
        dims = "scalar" if shape == () else ("?" if shape is None else "x".join(map(str, shape)))
        out.append(f"{dims} {shown(dtypes[i], 40)}" if i < len(dtypes) else dims)
    return ", ".join(out) if out else "-"


def _hexes(values) -> str:
    return ", ".join(f"{v:016x}" if isinstance(v, int) else bytes(v).hex()[:16] for v in values)


def _as_text(renderable, width: int) -> Text:
    """`renderable` drawn at `width` columns, as styled text that is not wrapped again."""
    console = Console(width=width, color_system="truecolor", force_terminal=True, file=io.StringIO())
    text = Text(no_wrap=True, overflow="crop", end="")
    for k, line in enumerate(console.render_lines(renderable, console.options.update_width(width), pad=False)):
        if k:
            text.append("\n")
        for seg in line:
            if not seg.control:
                text.append(seg.text, seg.style)
    return text


def call_failure(spans, index: int) -> str | None:
    """The error of a call that failed (the `call_failed` marker the recorder writes right
    after it, naming its seq), or None."""
    rec = spans.records[index]
    seq = getattr(rec, "seq", None)
    if seq is None or not isinstance(rec, (Collective, PointToPoint)):
        return None
    for j in range(index + 1, min(index + 64, len(spans.records))):
        other = spans.records[j]
        if isinstance(other, Marker) and other.name == "call_failed" and other.value == seq:
            return shown(other.text or "failed")
    return None


_KIND = {"Collective": "collective", "PointToPoint": "point-to-point", "Compute": "compute",
         "Marker": "marker", "Step": "step", "Memory": "memory sample", "GroupInfo": "group created"}
_SHOWN_ELSEWHERE = {"start_ns", "end_ns", "issued_ns", "op", "name", "in_shapes", "in_dtypes", "out_shapes",
                    "out_dtypes", "shapes", "dtypes", "in_bytes", "out_bytes", "nbytes", "mem_alloc", "mem_peak",
                    "digest_in", "digest_out", "digest", "blob_in", "blob_out", "blob", "stack", "group", "peer",
                    "step"}


def call_arrivals(tm: TimelineModel, rank: int, index: int, limit: int = MAX_MEMBERS) -> dict:
    """For one call: each member's (or the peer's) arrival and end, the last to arrive,
    and the transfer time (from the last arrival to this rank's completion)."""
    rec = tm.load(rank).records[index]
    if isinstance(rec, PointToPoint):
        members, kind = (rec.peer, rank), PointToPoint
    elif isinstance(rec, Collective):
        members, kind = tm.group_members(rec.group) or (rank,), Collective
    else:
        return {}
    read = members if len(members) <= limit else tuple(sorted({rank, *members[:limit - 1]}))
    rows = []
    for r in read:
        if r not in tm.row_of:
            rows.append((r, None, None, "not recorded"))
            continue
        spans = tm.load(r)
        i = spans.find_call(rec.group, rec.seq, kind)
        if i is None:
            rows.append((r, None, None, "did not enter"))
        else:
            op = spans.op_at(i)  # (its record is not decoded: 256 members' chunks would take seconds)
            note = "" if op == rec.op or kind is PointToPoint else f"op {shown(op, 40)}!"
            rows.append((r, spans.starts[i], spans.ends[i], note))
    arrived = [row for row in rows if row[1] is not None]
    last = max(arrived, key=lambda row: row[1]) if arrived else None
    mine = tm.load(rank).ends[index]
    transfer = None if last is None or mine == FAR else mine - last[1]
    return {"members": len(members), "rows": rows, "last": last, "transfer": transfer,
            "first": min((row[1] for row in arrived), default=None)}


def _fields_table(tm: TimelineModel, rank: int, spans, index: int, failure: str | None) -> Table:
    """One record's fields as a table: what and where it was, then its data, memory and
    stack."""
    table = Table.grid(padding=(0, 1))
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()

    def row(name: str | Text, value: str | Text) -> None:
        """A row of Text: a str cell is read as markup, and a value quotes the bundle."""
        table.add_row(Text(name) if isinstance(name, str) else name,
                      Text(value) if isinstance(value, str) else value)

    rec = spans.records[index]
    _where_rows(row, tm, rank, spans, index, failure)
    _data_rows(row, rec)
    stack = getattr(rec, "stack", None)
    if stack:
        row("stack", "\n".join(shown(frame) for frame in stack))
    elif isinstance(rec, Compute):
        table.add_row("", Text("the program's own work between two calls (no stack is recorded for it)",
                               style="italic grey50"))
    return table


def _where_rows(row, tm: TimelineModel, rank: int, spans, index: int, failure: str | None) -> None:
    """The rows that say what the record is and where: its call, rank, peer, group, step,
    how it failed, and how long it took."""
    rec = spans.records[index]
    kind = _KIND.get(type(rec).__name__, type(rec).__name__)
    what = getattr(rec, "op", None) or getattr(rec, "name", None)
    row("call", f"{shown(what)} ({kind})" if what else kind)
    row("rank", str(rank))
    if isinstance(rec, PointToPoint):
        toward = "from" if ops.receives(rec.op) else "to"
        row("peer", f"{toward} rank {rec.peer}" + (f", tag {rec.tag}" if rec.tag else ""))
    group = getattr(rec, "group", None)
    if group is not None:
        g = tm.groups.get(group)
        row("group", f"{group} ({shown(g.get('desc') or g.get('name') or 'group')}, {len(g['ranks'])} ranks)"
            if g else str(group))
    step_start = tm.step_span(rec.step, rank)
    start = spans.starts[index]
    if step_start is not None:
        row("step", f"{rec.step}, entered {format_ns(start - step_start[0])} after its start")
    else:
        row("step", str(rec.step))
    if failure is not None:
        row(Text("failed", style="bold red"), Text(failure, style="bold red"))
    if rec.end_ns is None and not isinstance(rec, Marker):
        row("duration", Text("never completed", style="bold red"))
    elif not isinstance(rec, Marker):
        row("duration", format_ns(rec.end_ns - rec.start_ns) + (" (until it failed)" if failure else ""))
    issued = getattr(rec, "issued_ns", None)
    if issued is not None:
        row("returned", f"{format_ns(issued - rec.start_ns)} after entry (asynchronous)")


def _data_rows(row, rec) -> None:
    """The rows of a record's data: its tensors, its other fields, digests, payloads and
    memory."""
    if isinstance(rec, Collective):
        row("in", f"{tensors_text(rec.in_shapes, rec.in_dtypes)} ({human_bytes(rec.in_bytes)})")
        row("out", f"{tensors_text(rec.out_shapes, rec.out_dtypes)} ({human_bytes(rec.out_bytes)})")
    elif isinstance(rec, PointToPoint):
        row("data", f"{tensors_text(rec.shapes, rec.dtypes)} ({human_bytes(rec.nbytes)})")
    elif getattr(rec, "shapes", None):
        row("shapes", tensors_text(rec.shapes, ()))
    for f in fields(rec):
        v = getattr(rec, f.name)
        if f.name in _SHOWN_ELSEWHERE or v in (None, (), "", False) or (f.name == "tag"):
            continue
        row(f.name.replace("_", " "), shown(v))
    for name, label in (("digest_in", "digest in"), ("digest_out", "digest out"), ("digest", "digest")):
        v = getattr(rec, name, None)
        if v:
            row(label, _hexes(v))
    for name, label in (("blob_in", "payload in"), ("blob_out", "payload out"), ("blob", "payload")):
        v = getattr(rec, name, None)
        if v:
            row(label, _hexes(v))
    if isinstance(rec, (Collective, PointToPoint)):
        row("memory", f"{_mib(rec.mem_alloc)} allocated, {_mib(rec.mem_peak)} peak")


class SpanDetail(VerticalScroll, can_focus=True):
    """Fields of the selected call, then its group's arrivals (read in a worker). Focused
    (tab), up and down move among the members and Enter shows that member's call; c copies
    the pane's text."""

    BINDINGS = [
        Binding("up", "member(-1)", "Prev member", show=False, id="detail.member_up"),
        Binding("down", "member(1)", "Next member", show=False, id="detail.member_down"),
        Binding("enter", "open_member", "Show member", id="detail.open_member"),
        Binding("c", "copy", "Copy details", id="detail.copy"),
    ]

    def __init__(self, tm: TimelineModel, **kw) -> None:
        super().__init__(**kw)
        self.model = tm
        self.rank: int | None = None
        self.index: int | None = None
        self.arrivals: dict | None = None
        self.failure: str | None = None  # the selected call's error, if it failed
        self.member_rows: list = []  # the member table's rows, in the order shown
        self.member_cursor = 0
        self._shown: dict[str, object] = {}  # what each part shows, to draw again at a new width

    def compose(self):
        yield Static(id="detail-fields")
        yield Static(id="detail-members")

    def show(self, rank: int, index: int) -> None:
        """Show call `index` of `rank`: its fields now, its group's arrivals once read."""
        self.rank, self.index, self.arrivals = rank, index, None
        self.member_rows, self.member_cursor = [], 0
        spans = self.model.load(rank)
        rec = spans.records[index]
        self.failure = call_failure(spans, index)
        self._update("#detail-fields", _fields_table(self.model, rank, spans, index, self.failure))
        if isinstance(rec, (Collective, PointToPoint)):
            self._update("#detail-members", Text("reading the group's members…", style="italic grey50"))
            self._read_members(rank, index)
        else:
            self._update("#detail-members", Text(""))

    @work(thread=True, exclusive=True, group="detail")
    def _read_members(self, rank: int, index: int) -> None:
        info = call_arrivals(self.model, rank, index)
        self.app.call_from_thread(self._show_members, rank, index, info)

    def _show_members(self, rank: int, index: int, info: dict) -> None:
        if (rank, index) != (self.rank, self.index):
            return
        self.arrivals = info
        self._draw_members()

    def _draw_members(self) -> None:
        info = self.arrivals
        out = Table(title=None, box=None, padding=(0, 1), show_edge=False)
        head = Text()
        last, first = info["last"], info["first"]
        if last is not None:
            head.append("last to arrive: ", style="bold")
            head.append(f"rank {last[0]}", style="bold red")
            head.append(f" (+{format_ns(last[1] - first)} after the first)\n")
        if self.failure is not None:
            head.append("failed: ", style="bold red")
            head.append(self.failure + "\n", style="red")
        elif info["transfer"] is None:
            head.append("transfer: ", style="bold")
            head.append("none: the call never completed on this rank\n", style="red")
        else:
            head.append("transfer: ", style="bold")
            head.append(format_ns(info["transfer"]))
            head.append(" (last arrival to completion)\n")
        if len(info["rows"]) < info["members"]:
            head.append(f"{len(info['rows'])} of {info['members']} members read\n", style="italic grey50")
        out.add_column("rank", justify="right")
        out.add_column("arrival", justify="right")
        out.add_column("duration", justify="right")
        out.add_column("")
        self.member_rows = sorted(info["rows"], key=lambda row: (row[1] is None, row[1] or 0))
        focused = self.has_focus
        for k, (r, start, end, note) in enumerate(self.member_rows):
            arr = "-" if start is None else "+" + format_ns(start - first)
            dur = "-" if start is None else ("never ended" if end == FAR else format_ns(end - start))
            style = "bold red" if note or end == FAR else ("yellow" if last and r == last[0] else "")
            if focused and k == self.member_cursor:
                style = (style + " reverse").strip()
            out.add_row(("▶ " if focused and k == self.member_cursor else "") + str(r), arr, dur, Text(note), style=style)
        if focused:
            head.append("↑↓ member · enter show it · c copy\n", style="italic grey50")
        self._update("#detail-members", Group(head, out))

    def _update(self, part: str, renderable) -> None:
        """Show `renderable` in `part` as text drawn once at the pane's width: a rich table
        is measured and drawn again at every layout of the screen (a jump from a finding
        spent most of a second in the members' table)."""
        self._shown[part] = renderable
        self._draw(part)

    def _draw(self, part: str) -> None:
        static = self.query_one(part, Static)
        width = static.content_region.width
        if width <= 0:  # not laid out yet (the pane was hidden): its width less border and padding
            width = int(self.styles.width.value) - 5 if self.styles.width is not None else 40
        static.update(_as_text(self._shown[part], max(width, 10)))

    def on_resize(self) -> None:
        for part in self._shown:
            self._draw(part)

    def text(self, width: int) -> str:
        """What the pane shows, as plain text drawn at `width` columns (what c copies)."""
        console = Console(width=width, record=True, file=io.StringIO())
        for part in ("#detail-fields", "#detail-members"):
            if part in self._shown:
                console.print(self._shown[part])
        return console.export_text()

    def on_focus(self) -> None:
        if self.arrivals:
            self._draw_members()

    def on_blur(self) -> None:
        if self.arrivals:
            self._draw_members()

    def action_member(self, delta: int) -> None:
        if not self.member_rows:
            self.scroll_relative(y=delta, animate=False)
            return
        self.member_cursor = max(0, min(len(self.member_rows) - 1, self.member_cursor + delta))
        self._draw_members()

    def action_open_member(self) -> None:
        """Show the member under the cursor: its own span of this call (or its row, if it
        never entered it)."""
        if not self.member_rows or self.rank is None:
            self.app.bell()
            return
        member = self.member_rows[self.member_cursor][0]
        rec = self.model.load(self.rank).records[self.index]
        if isinstance(rec, Collective) and self.member_rows[self.member_cursor][1] is not None:
            self.app.call_later(self.app.show_call, member, rec.group, rec.seq)
        else:
            self.app.call_later(self.app.show_call, member)

    def action_copy(self) -> None:
        """The pane's text to the clipboard (the terminal's, through textual)."""
        from rich.console import Console

        text = self.text(120)
        self.app.copy_to_clipboard(text)
        self.notify(f"details copied ({len(text.splitlines())} lines)")
