"""8192 ranks: the timeline draws only what is shown and never reads the whole bundle."""

from __future__ import annotations

from textual.widgets import DataTable, Sparkline

from tui_helpers import make_app, palette_pick, screen_text, settle, sync

SIZE = (140, 44)


@sync
async def test_timeline_scrolls_all_8192_ranks(big):
    app = make_app(big, start="timeline")
    async with app.run_test(size=SIZE) as pilot:
        tl = app.screen.timeline
        await settle(pilot, tl)
        assert len(tl.model.ranks) == 8192
        visible = len(tl.visible_rows())
        assert tl.missing_visible() == 0
        await pilot.press("end")
        await settle(pilot, tl)
        assert tl.cursor_rank == 8191 and tl.missing_visible() == 0
        assert screen_text(app).count("8191") >= 1
        for _ in range(3):
            await pilot.press("pageup")
        await settle(pilot, tl)
        assert tl.cursor_rank == 8191 - 3 * visible
        await pilot.press("plus", "minus", "l", "h", "right_square_bracket", "n")
        await settle(pilot, tl)
        assert tl.selected is not None
        # only what was shown, the pages beside it, and the selected call's group were read
        assert len(tl.model.cached_ranks()) <= tl.model.capacity
        assert tl.loads < 8192 // 8


@sync
async def test_goto_and_palette_on_8192_ranks(big):
    app = make_app(big, start="timeline")
    async with app.run_test(size=SIZE) as pilot:
        tl = app.screen.timeline
        await settle(pilot, tl)
        await pilot.press("g", *"8000:4001:3", "enter")  # rank 8000's tp group is 1 + 8000 // 2
        await settle(pilot, tl)
        rec = tl.model.load(8000).records[tl.selected[1]]
        assert (tl.cursor_rank, rec.group, rec.seq) == (8000, 4001, 3)
        assert app.screen.query_one("#detail").arrivals["members"] == 2
        await pilot.press("ctrl+p")
        await palette_pick(pilot, "rank 4321", "rank 4321")
        await settle(pilot, app.screen.timeline)
        assert app.screen.timeline.cursor_rank == 4321


@sync
async def test_overview_of_8192_ranks(big):
    app = make_app(big)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.screen.query_one("#steps", DataTable).row_count == len(app.bundle.steps)
        assert len(app.screen.query_one(Sparkline).data) == 8192
        assert app.screen.query_one("#ranks", DataTable).row_count == 200
        assert "8192 ranks, 8192 recorded" in screen_text(app)
        assert app.model.cached_ranks() == [] or len(app.model.cached_ranks()) <= 2  # no events read


@sync
async def test_collectives_of_a_4096_member_group(big):
    from prism_rr.tui.screens.collectives import CollectivesScreen

    app = make_app(big, start="timeline")
    async with app.run_test(size=SIZE) as pilot:
        tl = app.screen.timeline
        await settle(pilot, tl)
        shown = set(app.model.cached_ranks())
        dp = next(g for g, info in app.model.groups.items() if len(info["ranks"]) == 4096)
        await app.show_group(dp)
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, CollectivesScreen) and len(screen.members) == 4096
        table = screen.query_one(DataTable)
        assert table.row_count == len(screen.rows) > 0
        assert all(len(row.arrivals) == 4096 for row in screen.rows)
        assert "4096/4096" in screen_text(app)
        # the members are read as columns, not through the timeline's span cache: the rows
        # it had are still there, and no member was added to it
        assert set(app.model.cached_ranks()) == shown


def test_one_call_of_a_big_group_read_as_columns(big):
    """call_row: one call's members as the details pane needs them, without the span cache."""
    from prism_rr.format import open_bundle
    from prism_rr.tui.analysis import call_row
    from prism_rr.tui.model import FAR, TimelineModel

    with open_bundle(big) as b:
        tm = TimelineModel(b)
        dp = next(g for g, info in tm.groups.items() if len(info["ranks"]) == 4096)
        members = tm.group_members(dp)[:64]
        row = call_row(tm, dp, 3, members)
        assert tm.cached_ranks() == []
        assert sorted(row.arrivals) == sorted(members) and row.step is not None
        for r in members:
            spans = tm.load(r)
            i = spans.find_call(dp, 3)
            assert (row.arrivals[r], row.ends[r]) == (spans.starts[i], spans.ends[i]) and row.ends[r] != FAR
            assert row.op == spans.records[i].op
