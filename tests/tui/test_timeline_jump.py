"""A jump shows what it jumps to: the call stays in view once the details pane opens, wide
enough to see (issue #15 item 1)."""

from __future__ import annotations

from tui_helpers import HANG_GROUP, HANG_SEQ, make_app, settle, sync

from prism_rr.tui.model import FAR
from prism_rr.tui.widgets.detail import SpanDetail
from prism_rr.tui.widgets.timeline import SPAN_CELLS

SIZE = (120, 36)


def _cells_of(tl) -> tuple[float, float | None]:
    rank, i = tl.selected
    spans = tl.model.load(rank)
    start = spans.starts[i] + tl.shift(rank)
    end = None if spans.ends[i] == FAR else spans.ends[i] + tl.shift(rank)
    first = (start - tl.t0) / tl.ns_per_cell
    return first, None if end is None else (end - tl.t0) / tl.ns_per_cell


async def _goto(pilot, app, rank, group, seq):
    await pilot.press("2")
    await settle(pilot, app.screen.timeline)
    app.screen.goto(rank, group, seq)
    await settle(pilot, app.screen.timeline)
    await pilot.pause()
    tl = app.screen.timeline
    assert app.screen.query_one(SpanDetail).display and tl.selected is not None
    return tl


@sync
async def test_a_short_call_is_zoomed_to_and_stays_in_view_beside_the_details(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        tl = await _goto(pilot, app, 0, 1, 3)
        first, last = _cells_of(tl)
        assert 0 <= first and last <= tl.cells, (first, last, tl.cells)
        assert last - first >= SPAN_CELLS - 1
        assert tl.cursor_col == int(first)


@sync
async def test_the_hung_call_is_in_view_beside_the_details(hung):
    app = make_app(hung)
    async with app.run_test(size=SIZE) as pilot:
        tl = await _goto(pilot, app, 2, HANG_GROUP, HANG_SEQ)
        first, last = _cells_of(tl)
        assert last is None and 0 <= first < tl.cells, (first, tl.cells)


@sync
async def test_every_member_of_the_selected_collective_is_highlighted(hung):
    """Issue #15 item 4: the other members' spans of the selected call are marked too."""
    from prism_rr.tui.widgets.timeline import MEMBER, SELECTED

    app = make_app(hung)
    async with app.run_test(size=SIZE) as pilot:
        tl = await _goto(pilot, app, 0, HANG_GROUP, HANG_SEQ)
        styles = {}
        for y in range(len(tl.visible_rows())):
            rank = tl.model.ranks[int(tl.scroll_offset.y) + y]
            styles[rank] = {seg.style for seg in tl.render_line(y)}
        assert any(SELECTED == st or (st and st.bgcolor == SELECTED.bgcolor) for st in styles[0])
        for member in (2, 6):  # rank 4 never entered the call: nothing to mark on its row
            assert any(st and st.bgcolor == MEMBER.bgcolor for st in styles[member]), member
        for other in (1, 3, 4, 5, 7):
            assert not any(st and st.bgcolor == MEMBER.bgcolor for st in styles[other]), other


@sync
async def test_next_problem_goes_to_a_failed_call_then_through_the_findings(failed):
    from tui_helpers import FAILED_GROUP, FAILED_SEQ

    from prism_rr.tui.analysis import Finding

    app = make_app(failed)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        tl = app.screen.timeline
        await settle(pilot, tl)
        app.screen.goto(3)
        await pilot.press("home", *["down"] * 3)  # rank 3, cursor at the view's start
        await settle(pilot, tl)
        await pilot.press("exclamation_mark")
        await settle(pilot, tl)
        rec = tl.model.load(tl.cursor_rank).records[tl.selected[1]]
        assert (tl.cursor_rank, rec.group, rec.seq) == (3, FAILED_GROUP, FAILED_SEQ)
        app.findings = [Finding(kind="hang", message="m", ranks=(5,), group=1 + 5 // 2, seq=2),
                        Finding(kind="straggler", message="m", ranks=(1,), group=1, seq=4)]
        for want in ((5, 1 + 5 // 2, 2), (1, 1, 4), (5, 1 + 5 // 2, 2)):
            await pilot.press("exclamation_mark")
            await settle(pilot, tl)
            rec = tl.model.load(tl.cursor_rank).records[tl.selected[1]]
            assert (tl.cursor_rank, rec.group, rec.seq) == want


@sync
async def test_slash_finds_the_next_call_by_op_or_stack(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        tl = app.screen.timeline
        await settle(pilot, tl)
        await pilot.press("slash", *"reduce_scatter", "enter")
        await settle(pilot, tl)
        rec = tl.model.load(tl.cursor_rank).records[tl.selected[1]]
        assert "reduce_scatter" in rec.op
        first = tl.selected
        await pilot.press("slash", "enter")  # the last text again: the next one
        await settle(pilot, tl)
        assert tl.selected != first and "reduce_scatter" in tl.model.load(tl.cursor_rank).records[tl.selected[1]].op
        await pilot.press("slash", *"ctrl+a", *"train.py:88", "enter")
        await settle(pilot, tl)
        rec = tl.model.load(tl.cursor_rank).records[tl.selected[1]]
        assert any("train.py:88" in f for f in rec.stack)
        await pilot.press("slash", *"no such op anywhere", "enter")
        await settle(pilot, tl)
        assert tl.model.load(tl.cursor_rank).records[tl.selected[1]] is rec  # unchanged, with a warning


@sync
async def test_a_click_selects_the_call_under_it_and_ctrl_wheel_zooms(small):
    """Issue #15 item 13: the mouse."""
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        tl = app.screen.timeline
        await settle(pilot, tl)
        rank = tl.model.ranks[3]
        spans = tl.model.load(rank)
        i = next(k for k, rec in enumerate(spans.records) if hasattr(rec, "group")
                 and tl.t0 < spans.starts[k] < tl.t1 - 5 * tl.ns_per_cell)
        x = tl.label_width + int((spans.starts[i] - tl.t0) / tl.ns_per_cell)
        await pilot.click(tl, offset=(x, 3))
        await settle(pilot, tl)
        assert tl.cursor_rank == rank and tl.selected is not None and tl.selected[0] == rank
        assert app.screen.query_one(SpanDetail).display
        npc = tl.ns_per_cell
        from textual.events import MouseScrollUp
        tl.post_message(MouseScrollUp(tl, x=x, y=3, delta_x=0, delta_y=-1, button=0, shift=False, meta=False,
                                      ctrl=True))
        await settle(pilot, tl)
        assert tl.ns_per_cell < npc
