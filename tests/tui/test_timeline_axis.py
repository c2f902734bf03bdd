"""One fixed time axis, stated on screen; the status line's step is the selected call's own
(issue #15 item 5)."""

from __future__ import annotations

from textual.widgets import Static
from tui_helpers import make_app, settle, sync

from prism_rr.tui.widgets.ruler import Ruler

SIZE = (140, 40)


def _ruler_labels(app) -> str:
    return app.screen.query_one(Ruler).render().plain.splitlines()[0]


@sync
async def test_moving_between_ranks_keeps_the_axis(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        tl = app.screen.timeline
        await settle(pilot, tl)
        await pilot.press("right_square_bracket")  # into a step: labels were relative to its start
        await settle(pilot, tl)
        before = _ruler_labels(app)
        for _ in range(5):
            await pilot.press("down")
            await settle(pilot, tl)
            assert _ruler_labels(app) == before
        assert before.startswith("time")
        status = str(app.screen.query_one("#timeline-status", Static).content)
        assert "time from the recording's start" in status


@sync
async def test_the_status_step_is_the_selected_calls(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        tl = app.screen.timeline
        await settle(pilot, tl)
        for _ in range(12):
            await pilot.press("n")  # next call, details open
            await settle(pilot, tl)
            rank, i = tl.selected
            step = tl.model.load(rank).records[i].step
            status = str(app.screen.query_one("#timeline-status", Static).content)
            assert f"step {step}" in status, (status, step)
            assert "before step 0" not in status or step is None
