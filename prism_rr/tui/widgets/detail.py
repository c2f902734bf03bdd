"""The pane beside the timeline: one call's fields, its group's arrivals, who came last."""

from __future__ import annotations

from dataclasses import fields

from rich.table import Table
from rich.text import Text
from textual import work
from textual.containers import VerticalScroll
from textual.widgets import Static

from prism_rr.format import Collective, PointToPoint
from prism_rr.tui.model import FAR, TimelineModel, format_ns

__all__ = ["MAX_MEMBERS", "SpanDetail", "call_arrivals"]

MAX_MEMBERS = 256  # members read for one call; a larger group is sampled, and says so


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.1f} MiB"


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
    shown = members if len(members) <= limit else tuple(sorted({rank, *members[:limit - 1]}))
    rows = []
    for r in shown:
        if r not in tm.row_of:
            rows.append((r, None, None, "not recorded"))
            continue
        spans = tm.load(r)
        i = spans.find_call(rec.group, rec.seq, kind)
        if i is None:
            rows.append((r, None, None, "did not enter"))
        else:
            other = spans.records[i]
            note = "" if other.op == rec.op or kind is PointToPoint else f"op {other.op}!"
            rows.append((r, spans.starts[i], spans.ends[i], note))
    arrived = [row for row in rows if row[1] is not None]
    last = max(arrived, key=lambda row: row[1]) if arrived else None
    mine = tm.load(rank).ends[index]
    transfer = None if last is None or mine == FAR else mine - last[1]
    return {"members": len(members), "rows": rows, "last": last, "transfer": transfer,
            "first": min((row[1] for row in arrived), default=None)}


class SpanDetail(VerticalScroll, can_focus=True):
    """Fields of the selected call, then its group's arrivals (read in a worker)."""

    BINDINGS = []

    def __init__(self, tm: TimelineModel, **kw) -> None:
        super().__init__(**kw)
        self.model = tm
        self.rank: int | None = None
        self.index: int | None = None
        self.arrivals: dict | None = None

    def compose(self):
        yield Static(id="detail-fields")
        yield Static(id="detail-members")

    def show(self, rank: int, index: int) -> None:
        self.rank, self.index, self.arrivals = rank, index, None
        spans = self.model.load(rank)
        rec = spans.records[index]
        table = Table.grid(padding=(0, 1))
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        table.add_row("rank", str(rank))
        table.add_row("call", type(rec).__name__)
        dur = None if rec.end_ns is None else rec.end_ns - rec.start_ns
        table.add_row("duration", "never completed" if dur is None else format_ns(dur))
        for f in fields(rec):
            v = getattr(rec, f.name)
            if f.name in ("start_ns", "end_ns") or v in (None, (), ""):
                continue
            if f.name.startswith("mem_"):
                v = _mib(v)
            elif f.name.startswith("blob"):
                v = ", ".join(b.hex()[:12] for b in v)
            elif f.name == "stack":
                v = "\n".join(v)
            elif f.name == "group":
                g = self.model.groups.get(v)
                v = f"{v} ({g.get('desc') or g.get('name')}, {len(g['ranks'])} ranks)" if g else str(v)
            table.add_row(f.name, str(v))
        if isinstance(rec, (Collective, PointToPoint)):
            table.add_row("memory", f"{_mib(rec.mem_alloc)} allocated, {_mib(rec.mem_peak)} peak")
        self.query_one("#detail-fields", Static).update(table)
        members = self.query_one("#detail-members", Static)
        if isinstance(rec, (Collective, PointToPoint)):
            members.update(Text("reading the group's members…", style="italic grey50"))
            self._read_members(rank, index)
        else:
            members.update("")

    @work(thread=True, exclusive=True, group="detail")
    def _read_members(self, rank: int, index: int) -> None:
        info = call_arrivals(self.model, rank, index)
        self.app.call_from_thread(self._show_members, rank, index, info)

    def _show_members(self, rank: int, index: int, info: dict) -> None:
        if (rank, index) != (self.rank, self.index):
            return
        self.arrivals = info
        out = Table(title=None, box=None, padding=(0, 1), show_edge=False)
        head = Text()
        last, first = info["last"], info["first"]
        if last is not None:
            head.append("last to arrive: ", style="bold")
            head.append(f"rank {last[0]}", style="bold red")
            head.append(f" (+{format_ns(last[1] - first)} after the first)\n")
        head.append("transfer: ", style="bold")
        head.append("-" if info["transfer"] is None else format_ns(info["transfer"]))
        head.append(" (last arrival to completion)\n")
        if len(info["rows"]) < info["members"]:
            head.append(f"{len(info['rows'])} of {info['members']} members read\n", style="italic grey50")
        out.add_column("rank", justify="right")
        out.add_column("arrival", justify="right")
        out.add_column("duration", justify="right")
        out.add_column("")
        for r, start, end, note in sorted(info["rows"], key=lambda row: (row[1] is None, row[1] or 0)):
            arr = "-" if start is None else "+" + format_ns(start - first)
            dur = "-" if start is None else ("never ended" if end == FAR else format_ns(end - start))
            style = "bold red" if note or end == FAR else ("yellow" if last and r == last[0] else "")
            out.add_row(str(r), arr, dur, note, style=style)
        from rich.console import Group

        self.query_one("#detail-members", Static).update(Group(head, out))
