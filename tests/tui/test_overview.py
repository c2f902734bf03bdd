"""The overview: the rank chart's scale and labels, which table has focus, sorting and
filtering the ranks, the diagnosis in its own process (straggler costs, cancel), the
screenshot key and keymap warnings."""

from __future__ import annotations

import asyncio
import multiprocessing
import time

from textual.widgets import DataTable

from prism_rr.tui.screens.overview import FilterScreen, RankChart
from tui_helpers import make_app, screen_text, settle, sync

SIZE = (120, 40)


def _column(table: DataTable, col: int = 0) -> list[str]:
    return [str(table.get_row_at(i)[col]) for i in range(table.row_count)]


async def _until(pilot, check, what: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, what
        await asyncio.sleep(0.02)
        await pilot.pause()


@sync
async def test_rank_chart_is_scaled_from_zero_and_labelled(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        chart = app.screen.query_one(RankChart)
        # 250 ms against 264 ms: a min-max scale drew the first as an empty bar
        chart.set_ranks([0, 1], [250e6, 264e6])
        await pilot.pause()
        lines = screen_text(app).splitlines()
        bars = next(i for i, line in enumerate(lines) if "264ms┤" in line)
        top = lines[bars].split("┤", 1)[1]
        assert top.strip() and top.count("█") + top.count("▇") == len(top.rstrip()), top
        labels = "\n".join(lines[bars : bars + 5])
        assert "min 250ms (rank 0)" in labels and "max 264ms (rank 1)" in labels and "median 257ms" in labels
        assert "bars from 0" in labels and "0┤" in labels


@sync
async def test_the_focused_table_is_marked(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        steps, ranks = app.screen.query_one("#steps", DataTable), app.screen.query_one("#ranks", DataTable)
        steps.focus()
        await pilot.pause()
        assert steps.styles.border_left[0] == "thick" and ranks.styles.border_left[0] in ("blank", "")
        await pilot.press("tab")
        await pilot.pause()
        assert app.focused is ranks
        assert ranks.styles.border_left[0] == "thick" and steps.styles.border_left[0] in ("blank", "")


@sync
async def test_rank_rows_sort_and_filter(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        table = screen.query_one("#ranks", DataTable)
        grid = screen.grid
        means = dict(zip(grid.ranks, screen.mean.tolist()))
        assert [int(r) for r in _column(table)] == sorted(means, key=lambda r: -means[r])
        late = dict(zip(grid.ranks, screen.late.tolist()))
        await pilot.press("s", "s")  # mean -> max -> late start
        assert "by late start" in screen_text(app)
        got = [int(r) for r in _column(table)]
        assert [late[r] for r in got] == sorted(late.values(), reverse=True)
        await pilot.press("s", "s", "s")  # -> lateness -> straggler cost -> rank
        assert [int(r) for r in _column(table)] == sorted(grid.ranks)
        await pilot.press("f")
        await pilot.pause()
        assert isinstance(app.screen, FilterScreen)
        await pilot.press(*"g 1", "enter")
        await pilot.pause()
        members = set(app.model.groups[1]["ranks"])
        assert {int(r) for r in _column(table)} == members and "group 1" in screen_text(app)
        await pilot.press("f", *"4-6", "enter")
        await pilot.pause()
        assert [int(r) for r in _column(table)] == [4, 5, 6]
        await pilot.press("f", *"nonsense", "enter")
        await pilot.pause()
        assert [int(r) for r in _column(table)] == [4, 5, 6]  # unchanged, and a notification says why
        assert any("not a group or a rank range" in n.message for n in app._notifications)
        await pilot.press("f", "enter")
        await pilot.pause()
        assert table.row_count == 8


@sync
async def test_straggler_cost_in_the_findings_and_ranks(straggler):
    app = make_app(straggler)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        await _until(pilot, lambda: screen.costs is not None, "the diagnosis never finished")
        found = [f for f in app.findings if f.kind == "straggler"]
        assert [f.ranks for f in found] == [(5,)]
        assert screen.costs[5] > 3_000_000  # about 4 ms a step, the warm-up aside
        findings = screen.query_one("#findings", DataTable)
        row = [str(c) for c in findings.get_row_at(next(i for i, f in enumerate(app.findings) if f.kind == "straggler"))]
        assert row[4].endswith("ms")  # the cost column
        await pilot.press("s", "s", "s", "s")  # mean -> max -> late start -> lateness -> straggler cost
        ranks = screen.query_one("#ranks", DataTable)
        assert _column(ranks)[0] == "5" and str(ranks.get_row_at(0)[5]).endswith("ms")
        assert _column(ranks, 5)[1:] == ["-"] * 7
        findings.focus()
        findings.move_cursor(row=0)
        await pilot.pause()
        assert "sooner had it been on time" in screen_text(app)


@sync
async def test_enter_jumps_to_the_first_finding_once_the_diagnosis_is_in(straggler):
    """The findings' note says "j or enter jumps to one": the table has the focus for it."""
    from prism_rr.tui.screens.timeline import TimelineScreen

    app = make_app(straggler)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        await _until(pilot, lambda: screen.costs is not None, "the diagnosis never finished")
        assert app.focused is not None and app.focused.id == "findings"
        await pilot.press("enter")
        await settle(pilot)
        assert isinstance(app.screen, TimelineScreen) and app.screen.timeline.selected is not None


@sync
async def test_diagnosis_runs_apart_and_escape_stops_it(big):
    app = make_app(big)  # 8192 ranks: the diagnosis takes seconds
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert "diagnosing" in str(screen.query_one("#findings-note").render())
        def diagnosing():  # (the timeline's process reading spans apart is a child too)
            return [c for c in multiprocessing.active_children() if c.name == "prism-rr diagnosis"]

        await _until(pilot, diagnosing, "no diagnosis process started")
        (child,) = diagnosing()
        await pilot.press("escape")
        await _until(pilot, lambda: not child.is_alive(), "the diagnosis process outlived its cancel")
        await settle(pilot)
        assert "cancelled" in str(screen.query_one("#findings-note").render())
        assert app.findings == [] and screen.costs is None


@sync
async def test_ctrl_s_saves_a_screenshot_in_the_working_directory(small, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "nohome"))  # no ~/Downloads, as on a server
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+s")
        await pilot.pause()
        (svg,) = tmp_path.glob("small-*.svg")
        assert "<svg" in svg.read_text(encoding="utf-8")
        assert any(str(svg) in n.message for n in app._notifications)


@sync
async def test_unknown_keymap_ids_are_named(small):
    app = make_app(small, keymap={"timeline.zoom_in": "z", "timeline.zoom_inn": "x", "nothing.here": "y"})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        (warning,) = [n for n in app._notifications if n.severity == "warning"]
        assert "nothing.here" in warning.message and "timeline.zoom_inn" in warning.message
        assert "timeline.zoom_in," not in warning.message


@sync
async def test_ranks_by_lateness(straggler):
    """A synchronous run: every rank's steps take as long; lateness (read from the calls
    when first sorted by) puts the rank the others wait for first."""
    app = make_app(straggler)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        await pilot.press("s", "s", "s")  # mean -> max -> late start -> lateness
        assert "by lateness" in screen_text(app)
        await _until(pilot, lambda: screen.lateness is not None, "lateness was never read")
        table = screen.query_one("#ranks", DataTable)
        assert _column(table)[0] == "5" and str(table.get_row_at(0)[4]).endswith("ms")
        assert screen.lateness[screen.grid.ranks.index(5)] > 3_000_000
