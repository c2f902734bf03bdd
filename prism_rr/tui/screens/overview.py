"""The overview: manifest facts, iteration times per step and per rank, diagnosis findings."""

from __future__ import annotations

import math
import time

import numpy as np
from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Input, Label, Sparkline, Static
from textual.worker import get_current_worker

from prism_rr.errors import PrismError
from prism_rr.format.facts import attempt_endings, device_time_facts, device_time_line, ending_line
from prism_rr.text import shown
from prism_rr.specs import named_ranks
from prism_rr.tui.analysis import diagnose_apart, lateness, run_apart, step_grid
from prism_rr.tui.model import format_ns
from prism_rr.tui.widgets.footer import KeyFooter

__all__ = ["FilterScreen", "OverviewScreen", "RankChart", "spark"]

BARS = "▁▂▃▄▅▆▇█"
SHOWN_RANKS = 200  # rows of the per-rank table: the first in the chosen order
GROUP_KINDS = 12  # kinds of group (description, size) the facts name
AUTO_DIAGNOSE_EVENTS = 2_000_000  # above this, diagnosis waits for `d`
# The rank table's orders, `s` cycles through them: (name, key over the table's columns, descending)
SORTS = (("mean step time", "mean", True), ("max step time", "max", True), ("late start", "late", True),
         ("lateness", "lateness", True),
         ("straggler cost", "cost", True), ("rank", "rank", False))


def spark(values, top: float | None = None) -> str:
    """A one-line sparkline from zero to `top` (else the largest value); a gap is a blank."""
    if top is None:
        top = max((v for v in values if v is not None), default=0)
    if top <= 0:
        return "".join(" " if v is None else BARS[0] for v in values)
    return "".join(" " if v is None else BARS[min(len(BARS) - 1, int(v / top * len(BARS)))] for v in values)


class RankChart(Sparkline):
    """Every rank's mean iteration time, bars from zero, labelled with the scale and the
    min, median and max (a min-max scale drew 250 vs 264 ms as empty vs full). Where
    ranks outnumber columns a bar is the slowest of its ranks: a straggler stays seen."""

    DEFAULT_CSS = "RankChart { height: 4; }"
    GUTTER = 8  # the scale's labels, left of the bars

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__([], id=id)
        self.ranks: list[int] = []

    def set_ranks(self, ranks: list[int], means: list[float]) -> None:
        self.ranks = ranks
        self.data = means

    def render(self) -> Text:
        data = np.asarray(self.data or [], dtype=float)
        out = Text(no_wrap=True, overflow="crop")
        if not len(data):
            return out.append("no rank finished a step", style="italic grey50")
        rows = max(1, self.size.height - 1)
        width = max(1, self.size.width - self.GUTTER)
        edges = np.linspace(0, len(data), min(width, len(data)) + 1).astype(int)
        bars = np.maximum.reduceat(data, edges[:-1])
        top = float(data.max()) or 1.0
        levels = np.minimum(np.round(bars / top * rows * 8), rows * 8).astype(int)
        levels = np.repeat(levels, max(1, min(4, width // len(bars))))  # few ranks: wider bars
        for line in range(rows):
            label = format_ns(top) if line == 0 else ("0" if line == rows - 1 else "")
            out.append(f"{label:>{self.GUTTER - 1}}┤", style="grey50")
            floor = (rows - 1 - line) * 8
            cells = "".join(" " if lv <= floor else ("█" if lv >= floor + 8 else BARS[lv - floor - 1])
                            for lv in levels.tolist())
            out.append(cells, style="cyan")
            out.append("\n")
        lo, hi = int(data.argmin()), int(data.argmax())
        per = len(data) / len(bars)
        out.append(" " * self.GUTTER)
        out.append(f"min {format_ns(data[lo])} (rank {self.ranks[lo]}) · median {format_ns(float(np.median(data)))}"
                   f" · max {format_ns(data[hi])} (rank {self.ranks[hi]})", style="bold")
        each = f"each the slowest of {per:.3g} ranks" if per > 1 else "a bar per rank"
        out.append(f" · bars from 0, {each}, in rank order", style="grey50")
        return out


class FilterScreen(ModalScreen):
    """The `f` prompt: which ranks the rank table lists (in the `g` prompt's box)."""

    DEFAULT_CSS = "FilterScreen { align: center middle; }"
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel", id="filter.cancel")]

    def compose(self) -> ComposeResult:
        with Vertical(id="goto-box"):
            yield Label("Show ranks: a group id (g 3), a range (0-63), or empty for all")
            yield Input(placeholder="g 3  or  0-63", id="filter-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip())


def parse_filter(text: str, groups: dict) -> tuple[str, set[int] | None] | None:
    """`g 3` / `group 3` -> group 3's ranks; `0-63` or `5` -> those ranks; empty -> all (None)."""
    t = text.strip().lower()
    if not t:
        return "all ranks", None
    if t[0] == "g":
        gid = t.lstrip("groupg ").strip()
        if gid.isdigit() and int(gid) in groups:
            return f"group {gid}", set(groups[int(gid)]["ranks"])
        return None
    lo, _, hi = t.partition("-")
    if lo.strip().isdigit() and (not hi or hi.strip().isdigit()):
        a, b = int(lo), int(hi or lo)
        return f"ranks {a}-{b}" if b != a else f"rank {a}", set(range(a, b + 1))
    return None


class OverviewScreen(Screen):
    BINDINGS = [
        Binding("j", "jump", "Jump to finding", id="overview.jump"),
        Binding("d", "diagnose", "Diagnose", id="overview.diagnose"),
        Binding("escape", "cancel", "Stop", id="overview.cancel"),
        # the ranks' title names s and f; 5 (everywhere) is the heat map's key in the footer
        Binding("s", "sort", "Sort ranks", show=False, id="overview.sort"),
        Binding("f", "filter", "Filter ranks", show=False, id="overview.filter"),
        Binding("m", "app.switch_mode('heatmap')", "Heat map", show=False, id="overview.heatmap"),
    ]

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.sort = 0  # index into SORTS
        self.shown: tuple[str, set[int] | None] = ("all ranks", None)
        self.costs: dict[int, int] | None = None  # rank -> straggler cost (ns), once diagnosed
        self._diagnosing_since: float | None = None
        # per rank, the mean over steps of how long the others waited for it in the step's
        # collectives (analysis.lateness): read from the calls, apart, when first sorted by
        self.lateness: np.ndarray | None = None
        self.reading: str | None = None  # the lateness read's progress while it runs

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="overview"):
            yield Static(self._facts(), id="facts")
            yield Label("Diagnosis", classes="section")
            yield Static("", id="findings-note")
            yield DataTable(id="findings", cursor_type="row", zebra_stripes=True)
            yield Static("", id="finding-text")
            # with device time (format 1.3) the steps' times are the device's, the ranks' the host's
            device = "device_steps" in self.app.bundle.summaries
            yield Label("Iteration time per step (across ranks" + (", device clock)" if device else ")"),
                        classes="section")
            yield DataTable(id="steps", cursor_type="row", zebra_stripes=True)
            yield Label("Mean iteration time by rank" + (" (host clock)" if device else ""), classes="section")
            yield RankChart(id="rank-spark")
            yield Label("", id="ranks-title", classes="section")
            yield DataTable(id="ranks", cursor_type="row", zebra_stripes=True)
        yield KeyFooter()

    def _facts(self) -> Table:
        """The bundle's facts. Every cell is a Text (a str cell would be read as markup),
        and every string from the bundle is shown as `shown` makes it."""
        app = self.app
        b = app.bundle
        m = b.manifest
        info = b.rank_info(b.recorded_ranks[0]) if b.recorded_ranks else {}
        t = Table.grid(padding=(0, 2))
        t.add_column(style="bold cyan", no_wrap=True)
        t.add_column()

        def row(name: str, value: str) -> None:
            t.add_row(Text(name), Text(value))

        row("bundle", f"{shown(b.path.name)}  ({b.size / 2**20:.1f} MiB, format {b.format_version})")
        row("world", f"{b.world_size} ranks, {len(b.recorded_ranks)} recorded, {b.event_count:,} events")
        groups = b.groups
        kinds: dict[str, int] = {}
        for g in groups:
            key = f"{shown(g.get('desc') or g.get('name') or 'group', 60)} ({len(g['ranks'])})"
            kinds[key] = kinds.get(key, 0) + 1
        listed = list(kinds.items())[:GROUP_KINDS]
        row("groups", f"{len(groups)}: " + ", ".join(f"{n} x {k}" for k, n in listed)
            + (f", ... ({len(kinds) - GROUP_KINDS} more kinds)" if len(kinds) > GROUP_KINDS else ""))
        steps = b.steps
        row("steps", f"{len(steps)}" + (f" ({steps[0]}..{steps[-1]})" if steps else ""))
        if "device_steps" in b.summaries:
            device = device_time_facts(b)
            if device is not None:
                row("device time", device_time_line(device))
        if len(b.attempts) > 1:
            row("attempt", f"{b.attempt} of {', '.join(str(a['attempt']) for a in b.attempts)} "
                           f"(a: pick another): {ending_line(attempt_endings(b))}")
        versions = info.get("versions")
        if isinstance(versions, dict):
            row("versions", ", ".join(f"{shown(k, 40)} {shown(v, 60)}" for k, v in list(versions.items())[:16]))
        tool = m.get("tool")
        if tool:
            row("tool", shown(tool))
        created = m.get("created_unix_ns")
        if type(created) is int:
            row("created", time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(created / 1e9)))
        argv = info.get("argv")
        if argv:
            row("command", shown(" ".join(map(str, argv)), 400))
        dropped = sum(rs.get("dropped", 0) or 0 for rs in b.summaries["ranks"].values())
        truncated = [r for r, rs in b.summaries["ranks"].items() if rs.get("truncated")]
        if dropped or truncated:
            t.add_row("losses", Text(f"{dropped} records dropped, {len(truncated)} ranks truncated", style="bold red"))
        return t

    def on_mount(self) -> None:
        tm = self.app.model
        steps = self.query_one("#steps", DataTable)
        steps.add_columns("step", "ranks", "min", "median", "max", "slowest", "spread")
        for s in tm.step_stats():
            # the step a run failed or hung in: the ranks that began it and never ended it
            unended = tm.open_steps.get(s["step"])
            ranks = Text(f"{s['ranks']}; not ended by {named_ranks(unended)}", style="bold red") if unended \
                else str(s["ranks"])
            if s["min"] is None:
                steps.add_row(str(s["step"]), ranks, "-", "-", "-", "-", "-", key=str(s["step"]))
                continue
            spread = (s["max"] - s["min"]) / s["median"] if s["median"] else 0
            steps.add_row(str(s["step"]), ranks, format_ns(s["min"]), format_ns(s["median"]),
                          format_ns(s["max"]), str(s["slowest"]),
                          Text(f"{spread:.0%}", style="bold red" if spread > 0.2 else ""), key=str(s["step"]))
        self.grid = grid = step_grid(tm)
        self.mean, self.max, self.late = grid.rank_means()
        known = ~np.isnan(self.mean)
        self.query_one(RankChart).set_ranks([r for r, k in zip(grid.ranks, known.tolist()) if k],
                                            self.mean[known].tolist())
        # one scale for every row's step times, from zero
        self.top = float(np.nanmax(grid.time)) if known.any() else 0.0
        self.query_one("#ranks", DataTable).add_columns("rank", "mean", "max", "late start", "lateness", "cost",
                                                        f"step times (0-{format_ns(self.top)})")
        self._fill_ranks()
        findings = self.query_one("#findings", DataTable)
        findings.add_columns("kind", "ranks", "group", "seq", "cost", "finding")
        if self.app.bundle.event_count <= AUTO_DIAGNOSE_EVENTS:
            self.action_diagnose()
        else:
            self._note("large bundle: press d to run the diagnosis")

    # --- the rank table ---------------------------------------------------------------

    def _fill_ranks(self) -> None:
        grid = self.grid
        name, key, desc = SORTS[self.sort]
        label, only = self.shown
        rows = np.flatnonzero(~np.isnan(self.mean))
        if only is not None:
            rows = rows[np.isin(np.asarray(grid.ranks)[rows], np.fromiter(only, np.int64, len(only)))]
        cost = np.array([(self.costs or {}).get(r, 0) for r in grid.ranks], dtype=float)
        late = self.lateness if self.lateness is not None else np.zeros(len(grid.ranks))
        column = {"mean": self.mean, "max": self.max, "late": self.late, "lateness": late, "cost": cost,
                  "rank": np.asarray(grid.ranks, dtype=float)}[key][rows]
        n = len(rows)
        rows = rows[np.argsort(-column if desc else column, kind="stable")][:SHOWN_RANKS]
        table = self.query_one("#ranks", DataTable)
        table.clear()
        for i in rows.tolist():
            r = grid.ranks[i]
            times = [None if math.isnan(v) else v for v in grid.time[i].tolist()]
            c = "" if self.costs is None else (format_ns(self.costs[r]) if self.costs.get(r) else "-")
            waited = "" if self.lateness is None or math.isnan(self.lateness[i]) else format_ns(self.lateness[i])
            table.add_row(str(r), format_ns(self.mean[i]), format_ns(self.max[i]), format_ns(self.late[i]), waited,
                          Text(c, style="bold red" if self.costs and self.costs.get(r) else ""),
                          spark(times, self.top), key=str(r))
        self.query_one("#ranks-title", Label).update(
            f"Ranks: {label} ({n}), by {name}" + (f", the first {SHOWN_RANKS}" if n > SHOWN_RANKS else "")
            + (f"  ·  {self.reading}" if self.reading else "  ·  s sort  ·  f filter"))

    def action_sort(self) -> None:
        self.sort = (self.sort + 1) % len(SORTS)
        if SORTS[self.sort][1] == "lateness" and self.lateness is None and self.reading is None:
            self._reading("reading every rank's calls for its lateness… (Esc stops)")
            self._read_lateness()
        self._fill_ranks()
        self.notify(f"ranks by {SORTS[self.sort][0]}", timeout=2)

    def _reading(self, text: str | None) -> None:
        self.reading = text
        self.refresh_bindings()
        self._fill_ranks()

    @work(thread=True, exclusive=True, group="lateness")
    def _read_lateness(self) -> None:
        worker = get_current_worker()
        grid = self.grid

        def tick(seconds: float) -> None:
            self.app.call_from_thread(self._reading, f"reading every rank's calls for its lateness… "
                                                     f"{seconds:.0f} s (Esc stops)")

        try:
            got = run_apart(lateness, self.app.bundle, grid.ranks, grid.steps, tick=tick,
                            stop=lambda: worker.is_cancelled)
        except PrismError:
            raise  # a malformed bundle ends the app with exit 4 (PrismApp._handle_exception)
        except Exception as exc:  # the analysis failing must not take the browser down
            self.app.call_from_thread(self._lateness_read, None, shown(exc, None))
            return
        if got is not None and not worker.is_cancelled:
            self.app.call_from_thread(self._lateness_read, got)

    def _lateness_read(self, got, failure: str = "") -> None:
        if got is None:
            self.notify(f"lateness could not be read: {failure}", severity="error", markup=False)
        else:
            have = ~np.isnan(got)
            n = have.sum(axis=1)
            self.lateness = np.where(n > 0, np.where(have, got, 0).sum(axis=1) / np.maximum(n, 1), np.nan)
        self._reading(None)

    def action_filter(self) -> None:
        def done(text: str | None) -> None:
            if text is None:
                return
            parsed = parse_filter(text, self.app.model.groups)
            if parsed is None:
                self.notify(f"not a group or a rank range: {text!r} (try g 3, or 0-63)", severity="error",
                            markup=False)
                return
            self.shown = parsed
            self._fill_ranks()

        self.app.push_screen(FilterScreen(), done)

    # --- diagnosis --------------------------------------------------------------------

    def _note(self, text: str) -> None:
        self.query_one("#findings-note", Static).update(Text(text, style="italic grey50"))

    def action_diagnose(self) -> None:
        self._diagnosing_since = time.monotonic()
        self._note(f"diagnosing {self.app.bundle.event_count:,} events… (Esc cancels)")
        self._diagnose()
        self.refresh_bindings()

    def action_cancel(self) -> None:
        """Stop what runs apart: the diagnosis, the lateness read."""
        if self._diagnosing_since is not None:
            self.workers.cancel_group(self, "diagnose")
            self._diagnosing_since = None
            self._note("diagnosis cancelled: press d to run it again")
        if self.reading is not None:
            self.workers.cancel_group(self, "lateness")
            self._reading(None)
        self.refresh_bindings()

    def check_action(self, action: str, parameters) -> bool | None:
        if action == "cancel":
            return self._diagnosing_since is not None or self.reading is not None
        return True

    @work(thread=True, exclusive=True, group="diagnose")
    def _diagnose(self) -> None:
        worker = get_current_worker()
        events = self.app.bundle.event_count

        def tick(seconds: float) -> None:
            self.app.call_from_thread(self._note, f"diagnosing {events:,} events… {seconds:.0f} s (Esc cancels)")

        try:
            got = diagnose_apart(self.app.bundle, tick=tick, stop=lambda: worker.is_cancelled)
        except PrismError:
            raise  # a malformed bundle ends the app with exit 4 (PrismApp._handle_exception)
        except Exception as exc:  # the analysis failing must not take the browser down
            self.app.call_from_thread(self._diagnosed, None, f"diagnosis failed: {shown(exc, None)}")
            return
        if got is not None and not worker.is_cancelled:
            self.app.call_from_thread(self._diagnosed, got)

    def _diagnosed(self, got, failure: str = "") -> None:
        self._diagnosing_since = None
        self.refresh_bindings()
        if got is None:
            self._note(failure)
            return
        found, costs = got
        self.costs = {e["rank"]: e["cost_ns"] for e in costs}
        self._show_findings(found)
        self._fill_ranks()
        focused = self.app.focused
        if found and (focused is None or focused.id not in ("ranks", "steps")):
            # the note says: enter jumps to one (no scroll: the view stays where the user has it)
            self.query_one("#findings", DataTable).focus(scroll_visible=False)

    def _show_findings(self, found) -> None:
        self.app.findings = found
        table = self.query_one("#findings", DataTable)
        table.clear()
        self._note(f"{len(found)} finding(s)" + ("; j or enter jumps to one" if found else ": nothing stands out"))
        for i, f in enumerate(found):
            ranks = ",".join(map(str, f.ranks[:6])) + ("…" if len(f.ranks) > 6 else "")
            cost = sum((self.costs or {}).get(r, 0) for r in f.ranks) if f.kind == "straggler" else 0
            # (a finding's sentence quotes the bundle: Text, never markup; Finding made it safe)
            table.add_row(Text(f.kind, style="bold red"), ranks, "" if f.group is None else str(f.group),
                          "" if f.seq is None else str(f.seq), format_ns(cost) if cost else "",
                          Text(f.message), key=str(i))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        found = self.app.findings
        if event.data_table.id == "findings" and 0 <= event.cursor_row < len(found):
            f = found[event.cursor_row]
            cost = sum((self.costs or {}).get(r, 0) for r in f.ranks) if f.kind == "straggler" else 0
            text = f.message + (f" Cost: the steps would have ended {format_ns(cost)} sooner had "
                                f"{'it' if len(f.ranks) == 1 else 'they'} been on time." if cost else "")
            self.query_one("#finding-text", Static).update(Text(text))

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
        if f.ranks and f.group is None:  # no call (a crash outside one): where its records end
            self.app.call_later(self.app.show_end, f.ranks[0])
            return
        rank = f.ranks[0] if f.ranks else self.app.model.ranks[0]
        self.app.call_later(self.app.show_call, rank, f.group, f.seq, tuple(f.ranks))
