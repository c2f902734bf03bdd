"""Compare scores what replay scores (issue #15 item 2): a replay's own recording holds the
whole program, the bundle it replays may hold a window; calls are matched by group and
sequence number, steps are the ones both hold less the first."""

from __future__ import annotations

from tui_helpers import make_app, screen_text, settle, sync

from prism_rr.format import open_bundle
from prism_rr.tui.analysis import compare_bundles


def test_a_faithful_replay_of_a_window_does_not_diverge(window_and_replay):
    window, replay = window_and_replay
    with open_bundle(window) as a, open_bundle(replay) as b:
        result = compare_bundles(a, b)
    assert result["first_divergence"] is None
    assert result["scored_steps"] == [2]  # steps 1 and 2 in both; the first is left out
    assert result["warning"] is None
    for _, rec, rep in result["ranks"]:
        assert abs(rep - rec) / rec < 0.01  # the same run: no +93% from step 0's start-up


def test_a_bundle_that_is_not_a_replay_of_this_one_is_named(window_and_replay, small):
    window, replay = window_and_replay
    with open_bundle(small) as a, open_bundle(replay) as b:
        assert "is a replay of window.prism, not of small.prism" in compare_bundles(a, b)["warning"]
    with open_bundle(window) as a, open_bundle(small) as b:
        assert "does not say it is a replay" in compare_bundles(a, b)["warning"]


@sync
async def test_the_compare_screen_says_what_it_compared(window_and_replay):
    window, replay = window_and_replay
    app = make_app(window, replay, start="compare")
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "No divergence" in text and "compared: steps 2-2 on the host's clock" in text


@sync
async def test_replayed_lines_are_drawn_under_the_recorded_ones(small, replay):
    """Issue #15 item 2: each rank the replay ran has a `↻` line under its own, aligned on
    the recording's step start; the selected call is marked on it as replayed; Enter there
    explains instead of opening details the recording does not have."""
    from prism_rr.tui.widgets.detail import SpanDetail
    from prism_rr.tui.widgets.timeline import MEMBER

    app = make_app(small, replay)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        tl = app.screen.timeline
        await settle(pilot, tl)
        assert tl.rows[:5] == [(0, False), (0, True), (1, False), (1, True), (2, False)]
        assert (2, True) not in tl.row_index  # the replay ran ranks 0 and 1 only
        text = screen_text(app)
        assert " 0↻ " in text and " 1↻ " in text
        # the replayed line starts the step at the cursor where the recorded line does
        step = tl.model.step_at(0, tl.cursor_time)
        rec, rep = tl.model.step_span(step, 0), tl.replay.step_span(step, 0)
        assert rep[0] != rec[0] and rep[0] - tl.replay_shift(0) == rec[0]
        app.screen.goto(0, 1, 5)  # a tp call (group 1) that ranks 0 and 1 both replayed
        await settle(pilot, tl)
        line = tl.row_index[(0, True)] - int(tl.scroll_offset.y)
        assert any(seg.style and seg.style.bgcolor == MEMBER.bgcolor for seg in tl.render_line(line))
        await pilot.press("escape")
        tl.set_cursor_row(tl.row_index[(1, True)])
        await pilot.pause()
        assert "rank 1 replayed" in screen_text(app)
        await pilot.press("enter")
        await pilot.pause()
        assert not app.screen.query_one(SpanDetail).display
