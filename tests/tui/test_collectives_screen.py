"""The collectives screen: members named, problems in words, steps as the members recorded them."""

from __future__ import annotations

import re

from textual.widgets import DataTable
from tui_helpers import HANG_GROUP, HANG_SEQ, make_app, screen_text, settle, sync

from prism_rr.tui.analysis import compact_ranks


def test_ranks_read_compactly():
    assert compact_ranks(range(8)) == "0-7"
    assert compact_ranks(range(0, 16, 2)) == "0-14/2"
    assert compact_ranks([0, 1, 2, 5, 6, 9]) == "0-2, 5-6, 9"
    assert compact_ranks([]) == "none"


@sync
async def test_members_and_problems_in_words(hung):
    app = make_app(hung)
    async with app.run_test(size=(140, 44)) as pilot:
        await settle(pilot)
        await app.show_group(HANG_GROUP)
        await settle(pilot)
        screen = app.screen
        text = screen_text(app)
        assert "4 ranks: 0-6/2" in text  # the dp group of even ranks
        row = next(r for r in screen.rows if r.seq == HANG_SEQ)
        problems = "; ".join(row.problems(screen.members))
        assert "all_gather on 2 ranks, all_reduce on 1 rank" in problems or \
            re.search(r"\w+ on \d ranks?, \w+ on \d ranks?", problems), problems
        assert not re.search(r"[a-z]x\d", problems)  # never "all_reducex1"


@sync
async def test_the_step_column_shows_members_that_disagree(ahead):
    app = make_app(ahead)
    async with app.run_test(size=(140, 44)) as pilot:
        await settle(pilot)
        await app.show_group(1)
        await settle(pilot)
        screen = app.screen
        row = next(r for r in screen.rows if r.seq == 10)
        assert row.step_text == f"{row.step}-{row.step + 1}"
        assert f"members in steps {row.step_text}" in row.problems(screen.members)
        others = [r for r in screen.rows if r.seq != 10]
        assert others and all("-" not in r.step_text for r in others)


@sync
async def test_problems_only_without_problems_says_so(small):
    app = make_app(small)
    async with app.run_test(size=(140, 44)) as pilot:
        await settle(pilot)
        await app.show_group(1)
        await settle(pilot)
        await pilot.press("x")
        await settle(pilot)
        assert app.screen.query_one(DataTable).row_count == 0
        assert "none of the" in screen_text(app) and "has one" in screen_text(app)
