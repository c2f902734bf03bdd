"""The overview: manifest facts, iteration times per step and per rank, diagnosis findings."""

from __future__ import annotations

import time

from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Label, Sparkline, Static

from prism_rr.errors import PrismError
from prism_rr.tui.model import format_ns

__all__ = ["OverviewScreen", "spark"]

BARS = "▁▂▃▄▅▆▇█"
SLOWEST_RANKS = 200  # rows of the per-rank table: the slowest ranks first
AUTO_DIAGNOSE_EVENTS = 2_000_000  # above this, diagnosis waits for `d`


def spark(values) -> str:
    """A one-line sparkline; a gap is a blank."""
    known = [v for v in values if v is not None]
    if not known:
        return ""
    lo, hi = min(known), max(known)
    scale = (len(BARS) - 1) / (hi - lo) if hi > lo else 0
    return "".join(" " if v is None else BARS[int((v - lo) * scale)] for v in values)


class OverviewScreen(Screen):
    BINDINGS = [
        Binding("j", "jump", "Jump to finding", id="overview.jump"),
        Binding("d", "diagnose", "Diagnose", id="overview.diagnose"),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="overview"):
            yield Static(self._facts(), id="facts")
            yield Label("Diagnosis", classes="section")
            yield Static("", id="findings-note")
            yield DataTable(id="findings", cursor_type="row", zebra_stripes=True)
            yield Static("", id="finding-text")
            yield Label("Iteration time per step (across ranks)", classes="section")
            yield DataTable(id="steps", cursor_type="row", zebra_stripes=True)
            yield Label("Mean iteration time by rank", classes="section")
            yield Sparkline([], id="rank-spark")
            yield Label(f"Slowest ranks (up to {SLOWEST_RANKS}): step times", classes="section")
            yield DataTable(id="ranks", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def _facts(self) -> Table:
        app = self.app
        b = app.bundle
        m = b.manifest
        info = b.rank_info(b.recorded_ranks[0]) if b.recorded_ranks else {}
        t = Table.grid(padding=(0, 2))
        t.add_column(style="bold cyan")
        t.add_column()
        t.add_row("bundle", f"{b.path.name}  ({b.size / 2**20:.1f} MiB, format {b.format_version})")
        t.add_row("world", f"{b.world_size} ranks, {len(b.recorded_ranks)} recorded, "
                           f"{b.event_count:,} events")
        groups = b.groups
        kinds: dict[str, int] = {}
        for g in groups:
            key = f"{g.get('desc') or g.get('name') or 'group'} ({len(g['ranks'])})"
            kinds[key] = kinds.get(key, 0) + 1
        t.add_row("groups", f"{len(groups)}: " + ", ".join(f"{n} x {k}" for k, n in kinds.items()))
        steps = b.steps
        t.add_row("steps", f"{len(steps)}" + (f" ({steps[0]}..{steps[-1]})" if steps else ""))
        versions = info.get("versions")
        if isinstance(versions, dict):
            t.add_row("versions", ", ".join(f"{k} {v}" for k, v in versions.items()))
        tool = m.get("tool")
        if tool:
            t.add_row("tool", str(tool))
        created = m.get("created_unix_ns")
        if type(created) is int:
            t.add_row("created", time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(created / 1e9)))
        argv = info.get("argv")
        if argv:
            t.add_row("command", " ".join(map(str, argv)))
        dropped = sum(rs.get("dropped", 0) or 0 for rs in b.summaries["ranks"].values())
        truncated = [r for r, rs in b.summaries["ranks"].items() if rs.get("truncated")]
        if dropped or truncated:
            t.add_row("losses", Text(f"{dropped} records dropped, {len(truncated)} ranks truncated", style="bold red"))
        return t

    def on_mount(self) -> None:
        tm = self.app.model
        steps = self.query_one("#steps", DataTable)
        steps.add_columns("step", "ranks", "min", "median", "max", "slowest rank", "spread")
        for s in tm.step_stats():
            if s["min"] is None:
                steps.add_row(str(s["step"]), "0", "-", "-", "-", "-", "-", key=str(s["step"]))
                continue
            spread = (s["max"] - s["min"]) / s["median"] if s["median"] else 0
            steps.add_row(str(s["step"]), str(s["ranks"]), format_ns(s["min"]), format_ns(s["median"]),
                          format_ns(s["max"]), str(s["slowest"]),
                          Text(f"{spread:.0%}", style="bold red" if spread > 0.2 else ""), key=str(s["step"]))
        means = {}
        for r in tm.ranks:
            d = [v for v in tm.rank_step_times(r) if v is not None]
            if d:
                means[r] = sum(d) / len(d)
        self.query_one("#rank-spark", Sparkline).data = [means.get(r, 0) for r in tm.ranks]
        ranks = self.query_one("#ranks", DataTable)
        ranks.add_columns("rank", "mean", "max", "step times")
        for r in sorted(means, key=means.get, reverse=True)[:SLOWEST_RANKS]:
            times = tm.rank_step_times(r)
            ranks.add_row(str(r), format_ns(means[r]), format_ns(max(t for t in times if t is not None)),
                          spark(times), key=str(r))
        findings = self.query_one("#findings", DataTable)
        findings.add_columns("kind", "ranks", "group", "seq", "finding")
        if self.app.bundle.event_count <= AUTO_DIAGNOSE_EVENTS:
            self.action_diagnose()
        else:
            self._note("large bundle: press d to run the diagnosis")

    def _note(self, text: str) -> None:
        self.query_one("#findings-note", Static).update(Text(text, style="italic grey50"))

    def action_diagnose(self) -> None:
        self._note("diagnosing…")
        self._diagnose()

    @work(thread=True, exclusive=True, group="diagnose")
    def _diagnose(self) -> None:
        from prism_rr.tui.analysis import diagnose

        try:
            found = diagnose(self.app.bundle)
        except PrismError:
            raise  # a malformed bundle ends the app with exit 4 (PrismApp._handle_exception)
        except Exception as exc:  # the analysis failing must not take the browser down
            self.app.call_from_thread(self._note, f"diagnosis failed: {exc}")
            return
        self.app.call_from_thread(self._show_findings, found)

    def _show_findings(self, found) -> None:
        self.app.findings = found
        table = self.query_one("#findings", DataTable)
        table.clear()
        self._note(f"{len(found)} finding(s)" + ("; j or enter jumps to one" if found else ": nothing stands out"))
        for i, f in enumerate(found):
            ranks = ",".join(map(str, f.ranks[:6])) + ("…" if len(f.ranks) > 6 else "")
            table.add_row(Text(f.kind, style="bold red"), ranks, "" if f.group is None else str(f.group),
                          "" if f.seq is None else str(f.seq), f.message, key=str(i))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        found = self.app.findings
        if event.data_table.id == "findings" and 0 <= event.cursor_row < len(found):
            self.query_one("#finding-text", Static).update(found[event.cursor_row].message)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "findings":
            self._jump(int(event.row_key.value))
        elif event.data_table.id == "ranks":
            self.app.call_later(self.app.show_call, int(event.row_key.value))
        elif event.data_table.id == "steps":
            self.app.call_later(self.app.show_step, int(event.row_key.value))

    def action_jump(self) -> None:
        table = self.query_one("#findings", DataTable)
        if not table.row_count:
            self.app.bell()
            return
        table.focus()
        self._jump(table.cursor_row)

    def _jump(self, i: int) -> None:
        found = self.app.findings
        if not 0 <= i < len(found):
            return
        f = found[i]
        rank = f.ranks[0] if f.ranks else self.app.model.ranks[0]
        self.app.call_later(self.app.show_call, rank, f.group, f.seq, tuple(f.ranks))
