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
    for name in ("starts", "ends", "codes", "reach", "ops", "keys"):
        assert getattr(a, name) == getattr(b, name), name
    assert a.kinds.tolist() == b.kinds.tolist()
    assert [a.op_at(i) for i in range(len(a.starts))] == a.ops
    for i in range(len(a.starts)):
        assert a.collective_key(i) == b.collective_key(i)
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
            _same(tm.keep(rank, got[rank], tm.apart.values), _spans_of_records(tm, rank))
        tm.close()
        assert tm.apart is None and tm.load(5).rank == 5  # closed: read here


@sync
async def test_the_timeline_reads_on_when_the_process_apart_dies(big):
    app = make_app(big, start="timeline")
    async with app.run_test(size=(140, 44)) as pilot:
        tl = app.screen.timeline
        await settle(pilot, tl)
        assert tl.model.apart is not None
        await pilot.press("pagedown")  # lines asked for, and on their way, as it dies
        os.kill(tl.model.apart._proc.pid, signal.SIGKILL)
        for _ in range(3):
            await pilot.press("pagedown")
        await settle(pilot, tl)
        assert tl.missing_visible() == 0 and tl.model.apart is None
        assert tl.cursor_rank >= 4 * len(tl.visible_rows()) - 1


def _cells_owned_reference(spans: m.RankSpans, t0: int, ns_per_cell: float, width: int):
    """The cell-by-cell loop cells_owned replaced, kept as its twin."""
    out, owner, busy = [m.IDLE] * width, [-1] * width, [0.0] * width
    t1 = t0 + ns_per_cell * width
    for i in spans.visible(t0, int(t1)):
        code = spans.codes[i]
        s, e = spans.starts[i], min(spans.ends[i], int(t1) + 1)
        c0 = max(0, int((s - t0) / ns_per_cell))
        c1 = min(width, int((e - t0) / ns_per_cell) + 1)
        if code == m.HANG:
            out[c0:c1] = [m.HANG] * (c1 - c0)
            owner[c0:c1] = [i] * (c1 - c0)
            busy[c0:c1] = [float("inf")] * (c1 - c0)
            continue
        for c in range(c0, c1):
            lo = t0 + c * ns_per_cell
            part = min(e, lo + ns_per_cell) - max(s, lo)
            if part > busy[c] or (part == busy[c] and code != m.COMPUTE):
                busy[c], out[c], owner[c] = part, code, i
    return out, owner


def _random_spans(rng, n: int) -> m.RankSpans:
    from prism_rr.format import Collective, Compute, Marker

    recs, t = [], 1_000_000
    for i in range(n):
        t += int(rng.integers(0, 3000))
        d = int(rng.choice([0, 1, 7, 50, 400, 2500, 20000]))
        kind = rng.integers(0, 10)
        if kind < 4:
            recs.append(Compute(start_ns=t, end_ns=t + d, step=0, name=None))
        elif kind < 5:
            recs.append(Marker(start_ns=t, end_ns=None if rng.random() < 0.3 else t, step=0, name="m"))
        else:
            end = None if rng.random() < 0.05 else t + d
            recs.append(Collective(start_ns=t, end_ns=end, step=0, op=str(rng.choice(["all_reduce", "all_gather",
                                   "reduce_scatter", "broadcast"])), group=0, seq=i))
        if rng.random() < 0.3:
            t -= int(rng.integers(0, 2000))  # overlapping spans
    return m.RankSpans.build(0, recs, 0)


def test_cells_owned_is_its_cell_by_cell_twin():
    """Ties, zero-length markers, open markers, hung calls, overlaps, cells before and after
    every span, at zooms from a few ns to the whole run a cell."""
    import numpy as np

    rng = np.random.default_rng(7)
    for _ in range(300):
        spans = _random_spans(rng, int(rng.integers(1, 120)))
        lo, hi = spans.starts[0], max(e for e in spans.ends if e != m.FAR)
        for _ in range(6):
            width = int(rng.integers(1, 200))
            npc = float(rng.choice([1.0, 3.7, 10.0, 123.4, 1000.0, (hi - lo) / width + 1]))
            t0 = int(rng.integers(lo - 5000, hi + 100))
            assert spans.cells_owned(t0, npc, width) == _cells_owned_reference(spans, t0, npc, width)


def test_cells_owned_on_every_rank_of_a_real_failure(crashy_runs):
    with open_bundle(crashy_runs("abort").bundle) as b:
        tm = m.TimelineModel(b)
        for rank in tm.ranks:
            spans = tm.load(rank)
            lo, hi = spans.starts[0], spans.reach[-1] if spans.reach[-1] != m.FAR else spans.starts[-1]
            for width in (1, 37, 160):
                for npc in (10.0, (hi - lo) / width / 7 + 1, (hi - lo) / width + 1):
                    for t0 in (lo - 1000, lo + (hi - lo) // 3, hi - 100):
                        assert spans.cells_owned(t0, npc, width) == _cells_owned_reference(spans, t0, npc, width)
        tm.close()


def test_lines_drawn_together_are_each_as_drawn_alone():
    """The timeline draws a screen of lines in one pass (cells_many), each at its own t0."""
    import numpy as np

    rng = np.random.default_rng(11)
    for _ in range(40):
        lines = [_random_spans(rng, int(rng.integers(1, 80))) for _ in range(int(rng.integers(1, 30)))]
        width = int(rng.integers(1, 160))
        npc = float(rng.choice([2.0, 57.5, 800.0]))
        t0s = [int(rng.integers(sp.starts[0] - 3000, sp.starts[-1] + 10)) for sp in lines]
        got = m.cells_many(list(zip(lines, t0s)), npc, width)
        assert got == [_cells_owned_reference(sp, t0, npc, width) for sp, t0 in zip(lines, t0s)]


def test_the_process_apart_ends_with_the_app_killed(small, tmp_path):
    """SIGKILL (the OOM killer at 8192 ranks) takes the app: its process apart ends too,
    holding no memory of the bundle's."""
    import subprocess
    import sys
    import time

    code = ("import sys, time; from prism_rr.format import open_bundle; from prism_rr.tui import model as m; "
            "m.TimelineModel.APART_FROM = 1; tm = m.TimelineModel(open_bundle(sys.argv[1])); "
            "print(tm.apart._proc.pid, flush=True); time.sleep(60)")
    app = subprocess.Popen([sys.executable, "-c", code, str(small)], stdout=subprocess.PIPE, text=True)
    try:
        child = int(app.stdout.readline())
        os.kill(child, 0)  # it runs
        app.kill()
        app.wait(10)
        end = time.monotonic() + 15
        while time.monotonic() < end:
            try:
                with open(f"/proc/{child}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":  # ended, not yet reaped
                        return
            except FileNotFoundError:
                return
            time.sleep(0.1)
        pytest.fail("the process apart outlived the app that forked it")
    finally:
        app.kill()
