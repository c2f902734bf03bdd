"""The details pane speaks in words and units, and says when a call failed or never completed."""

from __future__ import annotations

import re

from tui_helpers import FAILED_GROUP, FAILED_SEQ, HANG_GROUP, HANG_SEQ, make_app, settle, sync

from prism_rr.tui.model import HANG
from prism_rr.tui.widgets.detail import SpanDetail, human_bytes, tensors_text

SIZE = (140, 44)


def _text(app) -> str:
    return app.screen.query_one(SpanDetail).text(200)


async def _details_of(pilot, app, rank, group, seq) -> str:
    await pilot.press("2")
    await settle(pilot, app.screen.timeline)
    app.screen.goto(rank, group, seq)
    await settle(pilot, app.screen.timeline)
    return _text(app)


def test_units_and_tensors_read_as_words():
    assert human_bytes(8388608) == "8.0 MiB" and human_bytes(512) == "512 B" and human_bytes(3 << 30) == "3.0 GiB"
    assert tensors_text(((4, 1024),), ("float32",)) == "4x1024 float32"
    assert tensors_text(((), (2, 3)), ("int64", "bfloat16")) == "scalar int64, 2x3 bfloat16"


@sync
async def test_a_call_reads_in_words_and_units(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        text = await _details_of(pilot, app, 0, 1, 3)
    assert "(collective)" in text and "Collective" not in text
    assert "issued_ns" not in text and "('" not in text and "((" not in text
    assert re.search(r"\bin\s+\d+(x\d+)* \w+ \(\d+\.\d (KiB|MiB|GiB)\)|\bin\s+.* \(\d+ B\)", text), text
    assert re.search(r"step\s+\d+, entered \S+ after its start", text), text
    assert re.search(r"transfer: \S+ \(last arrival to completion\)", text), text


@sync
async def test_a_call_that_never_completed_says_so_and_has_no_transfer(hung):
    app = make_app(hung)
    async with app.run_test(size=SIZE) as pilot:
        text = await _details_of(pilot, app, 2, HANG_GROUP, HANG_SEQ)
    assert "never completed" in text
    assert "none: the call never completed on this rank" in text and "last arrival to completion" not in text


@sync
async def test_a_failed_call_is_red_with_its_error(failed):
    app = make_app(failed)
    async with app.run_test(size=SIZE) as pilot:
        text = await _details_of(pilot, app, 3, FAILED_GROUP, FAILED_SEQ)
        tl = app.screen.timeline
        rank, i = tl.selected
        assert tl.model.load(rank).codes[i] == HANG  # drawn as a call that never completed: red
        other = tl.model.load(2)
        j = other.find_call(FAILED_GROUP, FAILED_SEQ)
        assert other.codes[j] != HANG  # its partner completed
    assert "failed" in text and "Timed out waiting 5000ms for recv" in text
    assert "(until it failed)" in text and "last arrival to completion" not in text


@sync
async def test_enter_on_a_member_shows_its_call_and_c_copies(hung):
    """Issue #15 item 4: the member table takes the arrows and Enter; c copies the details."""
    app = make_app(hung)
    async with app.run_test(size=SIZE) as pilot:
        await _details_of(pilot, app, 0, HANG_GROUP, HANG_SEQ)
        detail = app.screen.query_one(SpanDetail)
        await pilot.press("tab")
        assert detail.has_focus
        ranks = [row[0] for row in detail.member_rows]
        target = next(k for k, row in enumerate(detail.member_rows) if row[0] == 6)  # entered, another op
        for _ in range(target):
            await pilot.press("down")
        assert detail.member_cursor == target and "▶ 6" in _text(app)
        await pilot.press("c")
        assert "all_reduce" in app.clipboard or "all_gather" in app.clipboard
        assert "rank" in app.clipboard and "transfer" in app.clipboard
        await pilot.press("enter")
        await settle(pilot, app.screen.timeline)
        tl = app.screen.timeline
        rec = tl.model.load(tl.cursor_rank).records[tl.selected[1]]
        assert (tl.cursor_rank, rec.group, rec.seq) == (6, HANG_GROUP, HANG_SEQ), ranks
