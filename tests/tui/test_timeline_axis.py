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


def test_a_coarse_cell_shows_what_takes_most_of_its_time():
    """At coarse zoom a cell holds compute and calls: it shows the one that takes most of
    its time (painting the last call made every rank of an 8192 fit view look comm-bound);
    a call that never completed always shows (issue #15 item 6)."""
    from prism_rr.format import Collective, Compute
    from prism_rr.tui import model as m

    recs = []
    for k in range(50):  # 900 ns of compute, then a 100 ns all_reduce, 50 times
        t = k * 1000
        recs.append(Compute(start_ns=t, end_ns=t + 900, step=0))
        recs.append(Collective(start_ns=t + 900, end_ns=t + 1000, step=0, op="all_reduce", group=0, seq=k))
    recs.append(Collective(start_ns=60_000, end_ns=None, step=0, op="all_reduce", group=0, seq=50))
    spans = m.RankSpans.build(0, recs, 0)
    coarse = spans.cells(0, 10_000.0, 7)
    assert coarse[:5] == [m.COMPUTE] * 5 and coarse[6] == m.HANG
    fine = spans.cells(0, 50.0, 40)  # 50 ns a cell: the calls are two cells each
    assert fine[18:20] == [m.ALL_REDUCE] * 2 and fine[0] == m.COMPUTE


@sync
async def test_a_legend_is_on_screen(small):
    from tui_helpers import screen_text

    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await settle(pilot, app.screen.timeline)
        text = screen_text(app)
        for name in ("compute", "all_reduce", "send/recv", "failed or never completed"):
            assert name in text, name


@sync
async def test_wide_calls_are_labelled_and_neighbours_separated(small):
    """Issue #15 item 6: a call wide enough shows its op; back-to-back calls are separated."""
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        tl = app.screen.timeline
        await settle(pilot, tl)
        app.screen.goto(0, 1, 3)
        await settle(pilot, tl)
        rank, i = tl.selected
        spans = tl.model.load(rank)
        op = spans.records[i].op
        tl.select(rank, None)  # unselected: drawn in its own colours, with its label
        tl.ns_per_cell = max(10.0, (spans.ends[i] - spans.starts[i]) / (len(op) + 6))
        tl.t0 = int(spans.starts[i] - 4 * tl.ns_per_cell)  # the whole call in view
        tl.refresh()
        await settle(pilot, tl)
        row = tl.model.row_of[rank] - int(tl.scroll_offset.y)
        text = "".join(seg.text for seg in tl.render_line(row))
        assert "▏" + op in text, text
