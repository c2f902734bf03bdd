"""The heat map's lateness (`t`), read from the calls' columns and matched by numbering
them, is what it was when read from build_graph's call table: the same array, NaN where
NaN, read here or with a forked process reading part of the ranks."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from prism_rr.analysis import build_graph, clock_offsets
from prism_rr.format import open_bundle
from prism_rr.tui import analysis as A

pytestmark = pytest.mark.timeout(180)


def _reference(b, ranks: list[int], steps: list[int]) -> np.ndarray:
    """lateness as it was: from build_graph's call table."""
    t = build_graph(b, ranks=ranks).table
    out = np.full((len(ranks), len(steps)), np.nan)
    if not len(t.start) or not steps:
        return out
    first = np.minimum.reduceat(t.start, t.starts)[t.call_of]
    late = np.where(t.count[t.call_of] > 1, t.start - first, 0)
    row_of = {r: i for i, r in enumerate(ranks)}
    rows = np.array([row_of.get(r, -1) for r in t.rank.tolist()], np.int64)
    cols = np.searchsorted(steps, t.step)
    ok = (rows >= 0) & (cols < len(steps))
    ok[ok] &= np.asarray(steps)[cols[ok]] == t.step[ok]
    cells = rows[ok] * len(steps) + cols[ok]
    total = np.bincount(cells, weights=late[ok], minlength=out.size)
    seen = np.bincount(cells, minlength=out.size) > 0
    out.ravel()[seen] = total[seen]
    return out


def _same(path, ranks=None, steps=None) -> np.ndarray:
    """lateness of `path` (all its ranks and steps by default) equals _reference's; returned."""
    with open_bundle(path) as b:
        ranks = b.recorded_ranks if ranks is None else ranks
        steps = b.steps if steps is None else steps
        got = A.lateness(b, ranks, steps)
        want = _reference(b, ranks, steps)
    assert got.dtype == want.dtype == np.float64 and got.shape == (len(ranks), len(steps))
    np.testing.assert_array_equal(got, want)  # NaN where NaN
    return got


@pytest.fixture(scope="module")
def clocks(tmp_path_factory) -> Path:
    """8 ranks in step (tests/analysis/graph_sim.py), ranks 4-7 each on a host of its own
    with its own clock; tp pairs and dp groups besides the world; sends between ranks;
    ranks 3 and 6 slow; then rank 7 killed: rank 6 alone in their tp call, the others hung
    in the world's."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "analysis"))
    from graph_sim import SimRun

    run = SimRun(8, groups=[(0, 1), (2, 3), (4, 5), (6, 7), (0, 2, 4, 6), (1, 3, 5, 7)],
                 offsets={r: 0 if r < 4 else 2_500_000 + 1_000 * r for r in range(8)})
    run.train(2, slow={3: 1_000_000})
    for _ in range(2):
        run.compute(1_000_000)
        run.compute({6: 2_000_000}, ranks=[6])
        for group in (1, 2, 3, 4, 5, 6):
            run.collective(group, shape=(64,))
        run.send(2, 3)
        run.send(5, 4)
        run.end_step()
    run.kill(7)
    run.compute(500_000)
    run.collective(4)
    run.collective(0)
    return run.bundle(tmp_path_factory.mktemp("lateness"), name="clocks")


@pytest.mark.parametrize("name", ["small", "hung", "failed", "ahead", "straggler"])
def test_as_the_call_table_gave_it_on_the_tui_bundles(request, name):
    """A hung call, one a rank never entered, a failed one, a call a step late, a straggler."""
    got = _same(request.getfixturevalue(name))
    assert not np.isnan(got).all()
    if name == "straggler":
        assert np.nanargmax(np.nansum(got, axis=1)) == 5


def test_as_the_call_table_gave_it_across_clocks_groups_and_sends(clocks):
    """Clock offsets (rank 0's clock), subgroups, point-to-point calls (not counted), a
    call of one member (0) and ranks that made no call in a step (NaN)."""
    got = _same(clocks)
    assert np.isnan(got).any() and (got == 0).any()
    with open_bundle(clocks) as b:
        offsets = clock_offsets(b)
    assert len(set(offsets.values())) > 2  # the hosts' clocks are applied


def test_as_the_call_table_gave_it_for_some_ranks_and_steps(clocks):
    """Rows for the ranks asked for in their order (one never recorded: NaN), the clocks of
    those ranks, columns for the steps asked for (one never recorded: NaN)."""
    with open_bundle(clocks) as b:
        steps = b.steps[1:] + [1_000]
    got = _same(clocks, [5, 99, 1, 2, 7, 4], steps)
    assert np.isnan(got[1]).all() and np.isnan(got[:, -1]).all()
    assert _same(clocks, [3], []).shape == (1, 0)
    assert np.isnan(_same(clocks, [99], steps)).all()


@pytest.mark.parametrize("name", ["abort", "segv", "kill"])
def test_as_the_call_table_gave_it_on_real_failures(request, name, crashy_runs):
    """The session's real gloo recordings of a failed call, a segfault and a killed peer."""
    _same(request.getfixturevalue("killed_peer").bundle if name == "kill" else crashy_runs(name).bundle)


def _apart(monkeypatch) -> list:
    """Every bundle of a few ranks read with a forked process; what each _fork_rows gave."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: lateness reads every rank itself")
    forked = []
    fork = A._fork_rows

    def spy(*args):
        forked.append(fork(*args))
        return forked[-1]

    monkeypatch.setattr(A, "LATENESS_APART_FROM", 2)
    monkeypatch.setattr(A, "_fork_rows", spy)
    return forked


@pytest.mark.parametrize("name", ["clocks", "hung", "straggler"])
def test_as_the_call_table_gave_it_read_by_two_processes(request, name, monkeypatch):
    forked = _apart(monkeypatch)
    _same(request.getfixturevalue(name))
    assert len(forked) == 1 and forked[0] is not None


def test_the_helpers_ranks_are_read_here_when_it_fails(clocks, monkeypatch):
    """A helper that fails sends nothing: its ranks are read here, and the answer is whole."""
    forked = _apart(monkeypatch)
    here, read = os.getpid(), A._read_rows
    got = []

    def failing(*args):
        if os.getpid() != here:
            raise RuntimeError("the helper fails")
        return read(*args)

    def received(conn):
        got.append(rows(conn))
        return got[-1]

    rows = A._helper_rows
    monkeypatch.setattr(A, "_read_rows", failing)
    monkeypatch.setattr(A, "_helper_rows", received)
    _same(clocks)
    assert forked[0] is not None and got == [None]


def test_run_apart_forks_its_helper(clocks, monkeypatch):
    """run_apart's child is daemonic (multiprocessing starts no process from it): its
    helper is forked, and the screen gets the same array."""
    _apart(monkeypatch)
    fork = A._fork_rows

    def must(*args):
        helper = fork(*args)
        assert helper is not None, "no helper forked"
        return helper

    monkeypatch.setattr(A, "_fork_rows", must)
    with open_bundle(clocks) as b:
        got = A.run_apart(A.lateness, b, b.recorded_ranks, b.steps)
        np.testing.assert_array_equal(got, _reference(b, b.recorded_ranks, b.steps))


def _late_by_dict(group, seq, start) -> np.ndarray:
    first: dict = {}
    count: dict = {}
    for g, s, t in zip(group.tolist(), seq.tolist(), start.tolist()):
        first[g, s] = min(first.get((g, s), t), t)
        count[g, s] = count.get((g, s), 0) + 1
    return np.array([t - first[g, s] if count[g, s] > 1 else 0
                     for g, s, t in zip(group.tolist(), seq.tolist(), start.tolist())], np.int64)


@pytest.mark.parametrize("spread", [False, True])
def test_calls_numbered_by_their_spans_or_by_sorting(spread):
    """Groups' sequence numbers laid end to end, or, spread too far for that (or beyond
    what int64 arithmetic on them allows), sorted: each row's call is its (group, seq)."""
    rng = np.random.default_rng(7)
    n = 5_000
    group = rng.choice(np.array([0, 3, 4, 900], np.int64), n)
    seq = rng.integers(0, 300, n) + 1_000 * (group == 4)
    if spread:
        seq[rng.integers(0, n, 50)] = rng.choice(np.array([-(1 << 63), 1 << 41, (1 << 63) - 1], np.int64), 50)
    start = rng.integers(-(1 << 40), 1 << 40, n)
    assert (A._dense_index(group, seq) is None) == spread
    np.testing.assert_array_equal(A._late_by_call(group, seq, start), _late_by_dict(group, seq, start))
    empty = np.zeros(0, np.int64)
    assert A._late_by_call(empty, empty, empty).shape == (0,)
