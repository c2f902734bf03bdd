"""A rank's timeline spans read from its chunks' columns, here or in a process apart, are
the spans its records make (issue 40, item 1: the timeline at 8192 ranks reads a rank in
2.5 ms instead of 17, on the other core, and draws a line without making its records)."""

from __future__ import annotations

import os
import select
import signal

import pytest

from prism_rr.format import open_bundle
from prism_rr.tui import model as m
from tui_helpers import make_app, settle, sync

pytestmark = pytest.mark.timeout(180)


def _same(a: m.RankSpans, b: m.RankSpans) -> None:
    for name in ("starts", "ends", "codes", "reach", "kinds", "ops", "keys"):
        assert getattr(a, name) == getattr(b, name), name
    assert list(a.records) == list(b.records)


def _spans_of_records(tm: m.TimelineModel, rank: int) -> m.RankSpans:
    return m.RankSpans.build(rank, tm.bundle.events(rank), tm.offsets.get(rank, 0))


@pytest.mark.parametrize("name", ["small", "hung", "failed", "ahead", "straggler", "window_and_replay"])
def test_columns_make_the_spans_records_make(request, name):
    """Synthetic runs with a hung call, a failed one (its `call_failed` marker), a call a
    step late, a straggler and a window: every rank alike, the failed call drawn as hung."""
    path = request.getfixturevalue(name)
    path = path[0] if isinstance(path, tuple) else path
    with open_bundle(path) as b:
        tm = m.TimelineModel(b)
        hangs = 0
        for rank in tm.ranks:
            spans = tm.load(rank)
            _same(spans, _spans_of_records(tm, rank))
            hangs += spans.codes.count(m.HANG)
        assert hangs or name not in ("hung", "failed")
        tm.close()


@pytest.mark.parametrize("name", ["abort", "segv", "kill"])
def test_columns_make_the_spans_records_make_on_real_failures(request, name, crashy_runs):
    """The session's real gloo recordings of a failed call, a segfault and a killed peer."""
    bundle = request.getfixturevalue("killed_peer").bundle if name == "kill" else crashy_runs(name).bundle
    with open_bundle(bundle) as b:
        tm = m.TimelineModel(b)
        for rank in tm.ranks:
            _same(tm.load(rank), _spans_of_records(tm, rank))
        tm.close()


def test_the_process_apart_reads_what_this_one_reads(big):
    with open_bundle(big) as b:
        tm = m.TimelineModel(b)
        assert tm.apart is not None  # 8192 ranks: read apart
        ranks = [0, 1, 4095, 8191]
        tm.apart.ask([(r, tm.offsets.get(r, 0)) for r in ranks])
        got = {}
        while len(got) < len(ranks):
            assert select.select([tm.apart], [], [], 30)[0], "the process apart never answered"
            got.update(tm.apart.received())
        assert not tm.apart.asked
        for rank in ranks:
            _same(tm.keep(rank, got[rank]), _spans_of_records(tm, rank))
        tm.close()
        assert tm.apart is None and tm.load(5).rank == 5  # closed: read here


@sync
async def test_the_timeline_reads_on_when_the_process_apart_dies(big):
    app = make_app(big, start="timeline")
    async with app.run_test(size=(140, 44)) as pilot:
        tl = app.screen.timeline
        await settle(pilot, tl)
        assert tl.model.apart is not None
        os.kill(tl.model.apart._proc.pid, signal.SIGKILL)
        tl.model.apart._proc.join(10)
        for _ in range(4):
            await pilot.press("pagedown")
        await settle(pilot, tl)
        assert tl.missing_visible() == 0 and tl.model.apart is None
        assert tl.cursor_rank >= 4 * len(tl.visible_rows()) - 1
