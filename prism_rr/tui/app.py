"""The prism-rr terminal UI: overview, timeline, collectives, compare and help."""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path

from textual.app import App
from textual.binding import Binding
from textual.dom import DOMNode
from textual.screen import Screen
from textual.widgets import HelpPanel
from textual.worker import WorkerFailed

from prism_rr.errors import PrismError
from prism_rr.format import Bundle, Collective, open_bundle
from prism_rr.format.facts import bundle_facts
from prism_rr.text import shown
from prism_rr.tui.commands import BundleCommands
from prism_rr.tui.model import TimelineModel
from prism_rr.tui.screens.attempts import AttemptsScreen
from prism_rr.tui.screens.collectives import CollectivesScreen
from prism_rr.tui.screens.compare import CompareScreen
from prism_rr.tui.screens.goto import GotoScreen
from prism_rr.tui.screens.heatmap import HeatmapScreen
from prism_rr.tui.screens.help import HelpScreen
from prism_rr.tui.screens.overview import OverviewScreen
from prism_rr.tui.screens.search import SearchScreen
from prism_rr.tui.screens.timeline import TimelineScreen

__all__ = ["PrismApp", "binding_ids", "load_keymap"]


def load_keymap(path: str | os.PathLike) -> dict[str, str]:
    """`binding-id = keys` lines (as `timeline.zoom_in = ctrl+up,plus`); # starts a comment."""
    out = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip().strip("\"'")
    return out


def binding_ids() -> set[str]:
    """Every binding id a keymap can name: those of this package's screens and widgets
    and textual's own. The screens opened on demand (goto, search: the timeline opens them)
    are imported by name above, never by a computed name (nothing here imports what a string
    says), so their bindings count."""
    ids, todo = set(), [DOMNode, GotoScreen, SearchScreen]  # (subclasses of DOMNode too, once imported)
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        ids.update(b.id for b in cls.__dict__.get("BINDINGS", ()) if isinstance(b, Binding) and b.id)
    return ids


class PrismApp(App):
    """Browse a bundle; with a replay, compare them."""

    TITLE = "prism-rr"
    CSS_PATH = "app.tcss"
    COMMANDS = App.COMMANDS | {BundleCommands}
    MODES = {
        "overview": OverviewScreen,
        "timeline": TimelineScreen,
        "collectives": CollectivesScreen,
        "compare": CompareScreen,
        "heatmap": HeatmapScreen,
    }
    # below 100 columns the screens take their compact layout (app.tcss: .-narrow)
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    BINDINGS = [
        Binding("q", "quit", "Quit", id="app.quit"),
        Binding("f1", "help", "Help", id="app.help"),
        Binding("question_mark", "keys", "Keys", id="app.keys"),
        Binding("1", "switch_mode('overview')", "Overview", id="app.overview"),
        Binding("2", "switch_mode('timeline')", "Timeline", id="app.timeline"),
        Binding("3", "switch_mode('collectives')", "Collectives", id="app.collectives"),
        Binding("4", "switch_mode('compare')", "Compare", id="app.compare"),
        Binding("5", "switch_mode('heatmap')", "Heat map", id="app.heatmap"),
        Binding("a", "attempts", "Attempts", id="app.attempts"),
        Binding("ctrl+s", "screenshot", "Screenshot", id="app.screenshot"),
    ]

    def __init__(self, bundle: Bundle | str | os.PathLike, compare: Bundle | str | os.PathLike | None = None,
                 *, start: str = "overview", keymap: dict[str, str] | None = None, attempt: int | None = None) -> None:
        super().__init__()
        self.bundle = bundle if isinstance(bundle, Bundle) else open_bundle(bundle, attempt)
        self.replay = compare if compare is None or isinstance(compare, Bundle) else open_bundle(compare)
        self.model = TimelineModel(self.bundle)
        self.findings: list = []
        self.start_mode = start
        self.sub_title = self._title()
        path = os.environ.get("PRISM_RR_KEYMAP")
        self._user_keymap = {**(load_keymap(path) if path else {}), **(keymap or {})}

    # A malformed bundle found while browsing (often lazily, in a worker thread): the app
    # ends, and `prism-rr tui` prints this error in one line and exits 4.
    bundle_error: PrismError | None = None

    def _handle_exception(self, error: Exception) -> None:
        cause = error.error if isinstance(error, WorkerFailed) else error
        if isinstance(cause, PrismError):
            if self.bundle_error is None:
                self.bundle_error = cause
            self._return_code = cause.exit_code
            self.exit(return_code=cause.exit_code)
            return
        super()._handle_exception(error)

    def on_mount(self) -> None:
        if self._user_keymap:
            self.set_keymap(self._user_keymap)
            unknown = sorted(set(self._user_keymap) - binding_ids())
            if unknown:
                self.notify(f"keymap: no binding has the id{'s' if len(unknown) > 1 else ''} "
                            f"{', '.join(unknown)} (F1 lists the ids)", severity="warning", timeout=15,
                            markup=False)
        self.switch_mode(self.start_mode)
        # what the app is made of lives as long as it: a full collection no longer scans it
        # (one took 70 ms of a frame at 8192 ranks; frames after: 10-20 ms)
        self.call_after_refresh(gc.freeze)

    def on_unmount(self) -> None:
        gc.unfreeze()
        self.model.close()

    def _title(self) -> str:
        b = self.bundle
        attempt = f" · attempt {b.attempt} of {len(b.attempts)} (a: others)" if len(b.attempts) > 1 else ""
        return shown(b.path.name) + attempt

    # --- attempts ----------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The attempts key shows (and works) only for a bundle of several attempts."""
        if action == "attempts":
            return len(self.bundle.attempts) > 1
        return True

    def action_attempts(self) -> None:
        """The attempts of a restarted job (the `a` key): the chosen one is opened in
        every screen, one attempt at a time."""
        if len(self.bundle.attempts) < 2:
            self.notify("this bundle holds one attempt", title="Attempts", markup=False)
            return

        def chosen(k: int | None) -> None:
            if k is not None and k != self.bundle.attempt:
                self.run_worker(self.open_attempt(k), exclusive=True, group="attempt")

        self.push_screen(AttemptsScreen(bundle_facts(self.bundle)["attempts"], self.bundle.attempt), chosen)

    async def open_attempt(self, attempt: int) -> None:
        """Show `attempt` of the bundle: every screen is made anew on it."""
        old, old_model = self.bundle, self.model
        gc.unfreeze()  # the screens and the model of the attempt left can go (frozen again below)
        self.bundle = open_bundle(old.path, attempt)
        self.model = TimelineModel(self.bundle)
        self.findings = []
        self.sub_title = self._title()
        current = self.current_mode
        self.add_mode("attempt-switch", Screen)
        await self.switch_mode("attempt-switch")
        for mode, screen in self.MODES.items():
            await self.remove_mode(mode)
            self.add_mode(mode, screen)
        await self.switch_mode(current if current in self.MODES else "overview")
        await self.remove_mode("attempt-switch")
        old_model.close()
        old.close()
        self.call_after_refresh(gc.freeze)
        self.notify(f"attempt {attempt}", title="Attempts", markup=False)

    # --- what other screens ask for ------------------------------------------------

    def cursor_rank(self) -> int:
        tl = self._timeline_screen()
        return tl.timeline.cursor_rank if tl else (self.model.ranks[0] if self.model.ranks else 0)

    def _timeline_screen(self) -> TimelineScreen | None:
        screen = self.screen
        if isinstance(screen, TimelineScreen):
            return screen
        for s in getattr(self, "_screen_stacks", {}).get("timeline", []):
            if isinstance(s, TimelineScreen):
                return s
        return None

    def default_group(self) -> int:
        """The group of the selected call, else the first group with collectives on rank 0."""
        tl = self._timeline_screen()
        if tl and tl.timeline.selected:
            rank, i = tl.timeline.selected
            rec = self.model.load(rank).records[i]
            if hasattr(rec, "group"):
                return rec.group
        if self.model.ranks:
            for rec in self.model.load(self.model.ranks[0]).records:
                if isinstance(rec, Collective):
                    return rec.group
        return min(self.model.groups, default=0)

    async def show_call(self, rank: int, group: int | None = None, seq: int | None = None,
                        candidates: tuple[int, ...] = ()) -> None:
        """The timeline, on `rank` (and its call `seq` in `group`); with `candidates`, on the
        first of them that made that call."""
        await self.switch_mode("timeline")
        screen = self.screen

        def go():
            if group is not None and any(screen.goto(r, group, seq, fallback=False) for r in candidates):
                return
            screen.goto(rank, group, seq)

        self.call_after_refresh(go)

    async def show_end(self, rank: int) -> None:
        """The timeline, on `rank` where its records end."""
        await self.switch_mode("timeline")
        self.call_after_refresh(self.screen.goto_end, rank)

    async def show_step(self, step: int) -> None:
        await self.switch_mode("timeline")
        self.call_after_refresh(self.screen.timeline.show_step, step)

    async def show_group(self, group: int) -> None:
        await self.switch_mode("collectives")
        self.screen.show_group(group)

    async def next_op(self, op: str) -> None:
        await self.switch_mode("timeline")
        self.call_after_refresh(self.screen.timeline.action_call, 1, op)

    # --- actions -------------------------------------------------------------------

    def action_screenshot(self, filename: str | None = None, path: str | None = None) -> None:
        """An SVG of the screen, in the working directory unless `path` says otherwise
        (textual's default, ~/Downloads, is missing on servers), named after the bundle
        and the time; a notification says where."""
        name = filename or f"{self.bundle.path.stem}-{time.strftime('%Y%m%d-%H%M%S')}.svg"
        try:
            saved = self.save_screenshot(name, path or os.getcwd())
        except OSError as exc:
            self.notify(f"could not save the screenshot: {exc}", title="Screenshot", severity="error",
                        markup=False)
            return
        self.notify(f"saved to {saved}", title="Screenshot", markup=False)

    def deliver_screenshot(self, filename: str | None = None, path: str | None = None,
                           time_format: str | None = None) -> str | None:
        """The command palette's "Save screenshot" too."""
        self.action_screenshot(filename, path)
        return None

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss()
        else:
            self.push_screen(HelpScreen())

    def action_keys(self) -> None:
        if self.screen.query(HelpPanel):
            self.action_hide_help_panel()
        else:
            self.action_show_help_panel()
