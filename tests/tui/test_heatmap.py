"""The heat map: every rank in view, cells coloured by their bucket's worst value, Enter
opens the timeline at that rank and step."""

from __future__ import annotations

import asyncio
import time

from prism_rr.tui.screens.heatmap import HeatmapScreen
from prism_rr.tui.screens.timeline import TimelineScreen
from prism_rr.tui.widgets.heatmap import RAMP
from tui_helpers import make_app, screen_text, settle, sync


def _colours(hm, y: int) -> list[str]:
    """The background of each step's cell on line y (0 is the step header)."""
    segs = [s for s in hm.render_line(y)][1:]  # the rank label first
    out = []
    for s in segs:
        out += [s.style.bgcolor.name if s.style and s.style.bgcolor else ""] * (len(s.text) // hm.cell)
    return out


@sync
async def test_every_rank_of_8192_in_view_and_enter_opens_the_timeline(big):
    app = make_app(big, start="heatmap")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, HeatmapScreen)
        hm = app.screen.heatmap
        assert hm.rows <= hm.view_rows and hm.rows * hm.per >= 8192
        assert "-8191 " in screen_text(app)  # the last row: the last rank is in view
        await pilot.press("down", "down", "down")
        ranks, step, value, worst = hm.cursor_cell()
        assert ranks.start == 3 * hm.per and worst in ranks and value is not None
        assert f"ranks {ranks.start}-{ranks.stop - 1} · step {step}" in screen_text(app)
        await pilot.press("plus")  # half as many ranks a row: the cursor keeps its first rank
        assert hm.per == (len(ranks) // 2 or 1) and hm.cursor_cell()[0].start == ranks.start
        await pilot.press("0")
        await pilot.press("enter")
        await settle(pilot, getattr(app.screen, "timeline", None))
        assert isinstance(app.screen, TimelineScreen)
        tl = app.screen.timeline
        assert tl.cursor_rank == worst
        assert tl.model.step_at(tl.cursor_rank, tl.cursor_time - tl.shift(tl.cursor_rank)) == step


@sync
async def test_cells_are_coloured_by_step_time(small):
    app = make_app(small)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("m")  # from the overview (5 from anywhere)
        await settle(pilot)
        hm = app.screen.heatmap
        assert hm.per == 1  # 8 ranks fit: one a row
        stats = {s["step"]: s for s in app.model.step_stats()}
        slowest = max(stats.values(), key=lambda s: s["max"] or 0)
        j = hm.grid.steps.index(slowest["step"])
        hot = [hm.grid.ranks[i] for i in range(hm.rows) if _colours(hm, 1 + i)[j] == RAMP[-1]]
        assert hot == [slowest["slowest"]]
        assert "step time" in screen_text(app)
        await pilot.press("right", "right", "down", "enter")
        await settle(pilot, getattr(app.screen, "timeline", None))
        tl = app.screen.timeline
        assert tl.cursor_rank == hm.grid.ranks[1]
        assert tl.model.step_at(tl.cursor_rank, tl.cursor_time - tl.shift(tl.cursor_rank)) == hm.grid.steps[2]


@sync
async def test_lateness_shows_the_rank_the_others_wait_for(straggler):
    app = make_app(straggler, start="heatmap")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        hm = app.screen.heatmap
        # a synchronous run: every rank's steps take as long, the straggler's too
        assert len({round(v, -5) for v in hm.grid.time.ravel().tolist()}) == 1
        await pilot.press("t")
        end = time.monotonic() + 30
        while hm.lateness is None:
            assert time.monotonic() < end, "lateness was never read"
            await asyncio.sleep(0.02)
            await pilot.pause()
        await pilot.pause()
        assert "lateness" in screen_text(app)
        for j in range(len(hm.grid.steps)):
            hot = [hm.grid.ranks[i] for i in range(hm.rows) if _colours(hm, 1 + i)[j] == RAMP[-1]]
            assert hot == [5], (j, hot)
        assert hm.lateness[hm.grid.ranks.index(5)].min() > 3_000_000  # 4 ms a step, less the others' jitter
