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
        assert "No divergence" in text and "compared: steps 2-2" in text
