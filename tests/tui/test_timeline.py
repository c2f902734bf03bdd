"""The timeline screen, driven from the keyboard."""

from __future__ import annotations

from prism_rr.format import Collective, PointToPoint
from prism_rr.tui.widgets.detail import SpanDetail
from tui_helpers import make_app, screen_text, settle, sync

SIZE = (120, 36)


async def _timeline(pilot):
    app = pilot.app
    await pilot.press("2")
    await settle(pilot, app.screen.timeline)
    return app.screen.timeline


@sync
async def test_rows_and_ruler_are_drawn(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        tl = await _timeline(pilot)
        text = screen_text(app)
        assert tl.missing_visible() == 0
        assert [line.split()[0] for line in text.splitlines()[2:10]] == [str(r) for r in range(8)]
        assert "┴" in text and "▼" in text  # ruler ticks and step starts
        assert "rank 0" in text and "/cell" in text  # status line


@sync
async def test_zoom_pan_and_fit(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        tl = await _timeline(pilot)
        npc, t0, t = tl.ns_per_cell, tl.t0, tl.cursor_time
        await pilot.press("plus")
        assert tl.ns_per_cell == npc / 2
        assert abs(tl.cursor_time - t) <= tl.ns_per_cell  # zoom keeps the cursor's time
        await pilot.press("minus", "minus")
        widest = (tl.model.t_max - tl.model.t_min) / tl.cells  # zoom out stops at the whole bundle
        assert tl.ns_per_cell == min(npc * 2, widest)
        for _ in range(30):
            await pilot.press("minus")
        assert tl.ns_per_cell == widest
        t0 = tl.t0
        await pilot.press("l")
        assert tl.t0 > t0
        await pilot.press("h", "h")
        assert tl.t0 < t0
        await pilot.press("shift+right")
        assert tl.t0 == t0
        await pilot.press("0")  # fit: the recorded steps, not the set-up before them
        lo, hi = tl.model.steps_window()
        first = tl.model.step_span(tl.model.steps[0], tl.model.ranks[0])[0]
        assert tl.t0 == lo and tl.t1 >= hi - tl.ns_per_cell and lo <= first
        assert (first - lo) < 0.05 * (hi - lo)


@sync
async def test_cursor_moves_between_ranks_and_in_time(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        tl = await _timeline(pilot)
        await pilot.press("down", "down")
        assert tl.cursor_rank == 2
        await pilot.press("up")
        assert tl.cursor_rank == 1
        await pilot.press("end")
        assert tl.cursor_rank == 7
        await pilot.press("home")
        assert tl.cursor_rank == 0
        await pilot.press("pagedown")
        assert tl.cursor_rank == 7
        await pilot.press("pageup")
        assert tl.cursor_rank == 0
        col = tl.cursor_col
        await pilot.press("right", "right", "left")
        assert tl.cursor_col == col + 1
        await pilot.press(*["left"] * (col + 5))  # past the edge: the view pans
        assert tl.cursor_col == 0


@sync
async def test_next_and_previous_step(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        tl = await _timeline(pilot)
        tm = tl.model
        await pilot.press("right_square_bracket")
        step = tm.step_at(0, tl.cursor_time)
        assert step == 1
        assert abs(tl.cursor_time - tm.step_span(1, 0)[0]) <= tl.ns_per_cell
        await pilot.press("right_square_bracket")
        assert tm.step_at(0, tl.cursor_time) == 2
        await pilot.press("left_square_bracket")
        assert tm.step_at(0, tl.cursor_time) == 1


@sync
async def test_next_and_previous_call_open_details(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        tl = await _timeline(pilot)
        await pilot.press("left_square_bracket")  # the start of step 0
        await pilot.press("n")
        rank, i = tl.selected
        first = tl.model.load(rank).records[i]
        assert isinstance(first, (Collective, PointToPoint))
        await pilot.press("n")
        second = tl.model.load(rank).records[tl.selected[1]]
        assert second.start_ns > first.start_ns
        await pilot.press("p")
        assert tl.model.load(rank).records[tl.selected[1]] is first
        detail = app.screen.query_one(SpanDetail)
        await settle(pilot)
        assert detail.display and detail.arrivals is not None


@sync
async def test_select_shows_fields_arrivals_and_last(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        tl = await _timeline(pilot)
        screen = app.screen
        assert screen.goto(3, 6, 2)  # rank 3's dp group (ranks 1,3,5,7), call 2
        await settle(pilot)
        rec = tl.model.load(3).records[tl.selected[1]]
        assert (rec.group, rec.seq) == (6, 2)
        detail = screen.query_one(SpanDetail)
        info = detail.arrivals
        assert sorted(r for r, *_ in info["rows"]) == [1, 3, 5, 7]
        starts = {r: s for r, s, _, _ in info["rows"]}
        assert info["last"][0] == max(starts, key=starts.get)
        assert info["transfer"] is not None
        text = screen_text(app)
        assert "last to arrive" in text and "all_gather_into_tensor" in text or "reduce_scatter" in text
        assert "MiB" in text  # memory at that moment
        await pilot.press("tab")
        assert detail.has_focus
        await pilot.press("tab")
        assert tl.has_focus
        await pilot.press("escape")
        assert not detail.display and tl.selected is None
        await pilot.press("enter")  # select what is under the cursor
        await settle(pilot)
        assert tl.selected is not None and detail.display


@sync
async def test_goto_prompt(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        tl = await _timeline(pilot)
        await pilot.press("g")
        await pilot.press(*"5:4:7", "enter")  # group 4 is ranks 6, 7: the cursor goes to rank 5 only
        await settle(pilot)
        assert tl.cursor_rank == 5
        await pilot.press("g", *"5:3:7", "enter")
        await settle(pilot)
        rec = tl.model.load(5).records[tl.selected[1]]
        assert (rec.op, rec.group, rec.seq) == ("all_reduce", 3, 7)
        await pilot.press("g", *"6", "enter")
        assert tl.cursor_rank == 6
        await pilot.press("g", *"x:y", "enter")  # bad input keeps the prompt open
        assert app.screen.__class__.__name__ == "GotoScreen"
        await pilot.press("escape")
        assert app.screen.__class__.__name__ == "TimelineScreen"


@sync
async def test_align_ranks_by_step_start(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        tl = await _timeline(pilot)
        await pilot.press("right_square_bracket")
        assert tl.shift(3) == 0
        await pilot.press("a")
        assert tl.align_step == 1
        tm = tl.model
        for r in range(8):
            assert tm.step_span(1, r)[0] - tl.shift(r) == tm.step_span(1, 0)[0]
        assert "aligned on step 1" in screen_text(app)
        await pilot.press("a")
        assert tl.align_step is None and tl.shift(3) == 0


@sync
async def test_hang_is_drawn_and_explained(hung):
    app = make_app(hung)
    async with app.run_test(size=SIZE) as pilot:
        tl = await _timeline(pilot)
        assert app.screen.goto(2, 5, 3)
        await settle(pilot, tl)
        info = app.screen.query_one(SpanDetail).arrivals
        notes = {r: (end, note) for r, _, end, note in info["rows"]}
        assert notes[4][1] == "did not enter"
        assert notes[6][1] == "op all_reduce!"
        text = screen_text(app)
        assert "never completed" in text
        row = [line for line in text.splitlines() if line.strip().startswith("2 ")][0]
        assert "!" in row  # the hung call is drawn to the right edge
