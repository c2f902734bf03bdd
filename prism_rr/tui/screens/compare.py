"""Recorded vs replayed: iteration time per step and per rank, and the first divergence."""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Label, Static

from prism_rr.text import shown
from prism_rr.tui.analysis import compare_bundles
from prism_rr.tui.model import format_ns
from prism_rr.tui.widgets.footer import KeyFooter

__all__ = ["CompareScreen"]


def _delta(a, b) -> Text:
    if a is None or b is None or not a:
        return Text("-")
    d = (b - a) / a
    return Text(f"{d:+.1%}", style="bold red" if abs(d) > 0.2 else ("yellow" if abs(d) > 0.05 else "green"))


class CompareScreen(Screen):
    BINDINGS = [Binding("j", "jump", "Show divergence", id="compare.jump")]

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.result: dict | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="compare"):
            yield Static(id="divergence")
            yield Label("Iteration time per step (median over ranks), the steps replay scores",
                        classes="section")
            yield DataTable(id="compare-steps", cursor_type="row", zebra_stripes=True)
            yield Label("Iteration time per rank (mean over those steps)", classes="section")
            yield DataTable(id="compare-ranks", cursor_type="row", zebra_stripes=True)
        yield KeyFooter()

    def on_mount(self) -> None:
        for tid in ("#compare-steps", "#compare-ranks"):
            t = self.query_one(tid, DataTable)
            t.add_columns("step" if "steps" in tid else "rank", "recorded", "replayed", "change")
        if self.app.replay is None:
            self.query_one("#divergence", Static).update(Text(
                "No replay to compare: start with  prism-rr tui BUNDLE --compare REPLAY.prism", style="italic"))
            return
        self.query_one("#divergence", Static).update(Text("comparing…", style="italic grey50"))
        self._compare()

    @work(thread=True, exclusive=True, group="compare")
    def _compare(self) -> None:
        try:
            result = compare_bundles(self.app.bundle, self.app.replay)
        except Exception as exc:
            self.app.call_from_thread(self.query_one("#divergence", Static).update,
                                      Text(f"compare failed: {shown(exc, None)}"))
            return
        self.app.call_from_thread(self._show, result)

    def _show(self, result: dict) -> None:
        self.result = result
        for tid, key in (("#compare-steps", "steps"), ("#compare-ranks", "ranks")):
            t = self.query_one(tid, DataTable)
            t.clear()
            for k, a, b in result[key]:
                t.add_row(str(k), "-" if a is None else format_ns(a), "-" if b is None else format_ns(b), _delta(a, b))
        d = result["first_divergence"]
        text = Text()
        if d is None:
            text.append("No divergence: ", style="bold green")
            text.append(f"the replayed calls of {len(result['ranks'])} rank(s) match the recording.")
        else:
            text.append("First divergence: ", style="bold red")
            text.append(f"rank {d['rank']}, step {d['step']}, group {d['group']} seq {d['seq']} ({shown(d['op'])}): "
                        f"{d['what']}.  j shows it in the timeline.")
        scored = result.get("scored_steps") or []
        if scored:
            text.append(f"\ncompared: steps {scored[0]}-{scored[-1]} on the {result.get('clock', 'host')}'s clock, "
                        "the recording's calls (the first step, which also holds start-up, is left out, as replay "
                        "scores)", style="grey50")
        text.append("\ndata compared where the replay ran on the recorded data, as replay checks it"
                    if result.get("data_compared") else
                    "\ndata not compared: only a replay's own recording (replay -o) says where it ran on the "
                    "recorded data", style="grey50")
        if result.get("warning"):
            text.append(f"\nwarning: {result['warning']}", style="bold yellow")
        self.query_one("#divergence", Static).update(text)

    def action_jump(self) -> None:
        d = self.result and self.result["first_divergence"]
        if not d:
            self.app.bell()
            return
        self.app.call_later(self.app.show_call, d["rank"], d["group"], d["seq"])
