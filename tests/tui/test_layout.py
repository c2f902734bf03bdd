"""Every screen at 80x24: what it is for stays on screen (the details pane leaves the
timeline room, status lines wrap instead of losing their end)."""

from __future__ import annotations

from textual.widgets import DataTable

from tui_helpers import HANG_GROUP, HANG_SEQ, make_app, screen_text, settle, sync

SMALL = (80, 24)


@sync
async def test_every_screen_at_80x24(hung, replay):
    app = make_app(hung, replay)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "8 ranks, 8 recorded" in text and "Diagnosis" in text
        await pilot.press("2")
        await settle(pilot, app.screen.timeline)
        await app.show_call(2, HANG_GROUP, HANG_SEQ)
        await settle(pilot, app.screen.timeline)
        screen = app.screen
        detail, tl = screen.query_one("#detail"), screen.timeline
        assert detail.display and detail.size.width <= 34 and tl.size.width >= 40
        text = screen_text(app)
        # the status line's facts, its last one too: the line wraps rather than cuts
        assert "rank 2" in text and "step " in text and "/cell" in text and "window" in text
        await pilot.press("3")
        await settle(pilot)
        text = screen_text(app)
        assert f"group {HANG_GROUP}" in text and "seq" in text and "entered" in text
        assert app.screen.query_one(DataTable).row_count
        await pilot.press("4")
        await settle(pilot)
        assert "First divergence" in screen_text(app)
        await pilot.press("5")
        await settle(pilot)
        text = screen_text(app)
        assert "step time" in text and "enter: timeline" in text and "rank 0 · step" in text  # one rank a row
        await pilot.press("f1")
        await settle(pilot)
        assert "Everywhere" in screen_text(app)
