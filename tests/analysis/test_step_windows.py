"""A bundle too big to hold is diagnosed in windows of steps, one window's graph at a time.

Every finding test diagnoses its bundle both ways (windows.diagnosed); these tests check the
window plan and the cases a boundary between windows makes hard: calls whose members
recorded them in neighbouring steps, stragglers counted across windows, a hang at the end."""

import dataclasses
import json

import pytest

from graph_sim import SimRun
from prism_rr.analysis import diagnose, diagnosis_json, step_windows
from prism_rr.format import open_bundle
from prism_rr.format.records import Collective
from windows import diagnosed


def test_windows_cover_every_step_once_in_order(tmp_path):
    run = SimRun(4)
    run.train(10)
    with open_bundle(run.bundle(tmp_path)) as b:
        events = sum(r.count for rank in b.recorded_ranks for r in b.chunks(rank))
        assert step_windows(b, events) == [(0, 10)]  # the end marker is in step 10
        for budget in (1, 20, 60, events // 3):
            windows = step_windows(b, budget)
            assert windows[0][0] == 0 and windows[-1][1] == 10
            assert all(a <= b_ for a, b_ in windows)
            assert all(windows[i][1] + 1 == windows[i + 1][0] for i in range(len(windows) - 1))
        assert len(step_windows(b, 1)) == 11  # a step larger than the window goes alone
        assert 1 < len(step_windows(b, events // 3)) < 11


def test_calls_recorded_in_neighbouring_steps_match_across_windows(tmp_path):
    """Rank 1's steps end before the second all_reduce of each step (a logging call after
    its optimizer), so it records that call in the next step: read one step per window, the
    call's members are in two windows, and must still match."""
    run = SimRun(4)
    run.train(8, slow={2: 4_000_000})
    run.compute(1000)
    run.collective(0, skip=(3,), line=120)  # a hang at the very end
    for i, rec in enumerate(run.recs[1]):
        if type(rec) is Collective and rec.in_shapes == ((256, 4),):
            run.recs[1][i] = dataclasses.replace(rec, step=rec.step + 1)
    with open_bundle(run.bundle(tmp_path)) as b:
        found = diagnosed(b)
        one_step = diagnose(b, window_events=1)
    assert [f.kind for f in found] == ["hang", "straggler"]  # not a drift: the calls pair as they should
    assert found[0].ranks == (3,) and found[1].ranks == (2,)
    assert diagnosis_json(one_step) == diagnosis_json(found)


def test_straggler_counts_add_up_across_windows(tmp_path):
    run = SimRun(8)
    run.train(12, slow={5: 4_000_000})
    with open_bundle(run.bundle(tmp_path)) as b:
        whole = diagnose(b)
        for budget in (1, 100, 400):
            assert len(step_windows(b, budget)) > 1
            assert diagnosis_json(diagnose(b, window_events=budget)) == diagnosis_json(whole)
    (f,) = whole
    assert f.kind == "straggler" and f.ranks == (5,) and f.details["last"] >= 11


def test_cli_window_says_where_it_is_and_finds_the_same(tmp_path):
    from cli_helpers import run_cli

    run = SimRun(4)
    run.train(5)
    run.compute(1000)
    run.collective(0, skip=(2,), line=120)
    path = run.bundle(tmp_path)
    whole = run_cli("diagnose", path, "--json")
    windowed = run_cli("diagnose", path, "--json", "--window", "1")
    assert whole.returncode == windowed.returncode == 5
    assert json.loads(windowed.stdout) == json.loads(whole.stdout)
    lines = windowed.stderr.splitlines()
    assert lines[0] == "diagnose: read steps 0-0 (window 1 of 6)" and lines[-1] == "diagnose: read steps 5-5 (window 6 of 6)"
    assert whole.stderr == ""


def test_cli_window_reads_again_after_a_drift(tmp_path):
    """A drift found at the end of the reading: the windows are read again, so that the
    calls after it (pairs of the wrong calls) are left out of who arrived last."""
    from cli_helpers import run_cli

    run = SimRun(4)
    run.train(2)
    run.collective(0, line=120)  # rank 3 makes no such call
    run.recs[3].pop()
    run.seq[(3, 0)] -= 1
    run.train(3, slow={3: 4_000_000}, line=130)
    path = run.bundle(tmp_path)
    whole = run_cli("diagnose", path, "--json")
    windowed = run_cli("diagnose", path, "--json", "--window", "1")
    assert json.loads(windowed.stdout) == json.loads(whole.stdout)
    assert json.loads(whole.stdout)["findings"][0]["kind"] == "drift"
    again = [line for line in windowed.stderr.splitlines() if "read again" in line]
    assert len(again) == 6 and again[-1].endswith("steps 5-5 (window 6 of 6)"), windowed.stderr


@pytest.mark.parametrize("shift", [2, -2, 1])
def test_a_rank_whose_steps_are_numbered_apart(tmp_path, shift):
    """Rank 1 numbers its steps `shift` apart from the others (its calls, sends and
    receives): a call's members are then read by windows up to two steps apart. A window
    that saw a call whole hands it on; the next, which reads only its later members, must
    not report them as a hang or an unmatched message."""
    run = SimRun(4)
    run.train(10, slow={2: 4_000_000})
    run.recs[1] = [dataclasses.replace(r, step=r.step + shift) for r in run.recs[1]]
    with open_bundle(run.bundle(tmp_path)) as b:
        whole = diagnosis_json(diagnose(b))
        assert [f["kind"] for f in whole["findings"]] == ["straggler"]
        for budget in (1, 30, 60, 100, 150, 250):
            assert diagnosis_json(diagnose(b, window_events=budget)) == whole, budget


def test_equal_waits_name_the_call_entered_first_either_way(tmp_path):
    """Rank 3 is exactly 4 ms late into a call of group 1 in step 1, then of group 0 in
    every later step: the longest wait, a tie, is the call entered first, whole or in windows."""
    run = SimRun(4, groups=[(2, 3)])

    def align():
        t = max(run.t.values()) + 1_000_000
        run.compute({r: t - run.t[r] for r in range(4)})

    align()
    run.collective(0)
    run.end_step()
    align()
    run.compute({3: 4_000_000}, ranks=[3])
    run.collective(1)
    align()
    run.collective(0)
    run.end_step()
    for _ in range(9):
        align()
        run.compute({3: 4_000_000}, ranks=[3])
        run.collective(0)
        align()
        run.collective(1)
        align()
        run.collective(0, shape=(8,))
        run.end_step()
    with open_bundle(run.bundle(tmp_path)) as b:
        (f,) = diagnosed(b)
        for budget in (40, 100):
            assert diagnosis_json(diagnose(b, window_events=budget)) == diagnosis_json([f])
    assert (f.kind, f.ranks, f.group, f.seq) == ("straggler", (3,), 1, 0)


def test_analyze_in_batches_says_where_it_is_and_finds_the_same(tmp_path, monkeypatch):
    """A bundle of more records than a batch holds (8192 x 10,000) is analysed batch by
    batch, each announced before it is read; the steps come out as from one batch."""
    from prism_rr import api
    from prism_rr.analysis import _attribution, attribution_json

    run = SimRun(4)
    run.train(6, slow={2: 3_000_000})
    path = run.bundle(tmp_path)
    said = []
    whole = attribution_json(api.analyze(path, progress=lambda *a: said.append(a)))
    assert said == []  # one batch: nothing to say
    monkeypatch.setattr(_attribution, "BATCH_RECORDS", 1)
    batched = attribution_json(api.analyze(path, progress=lambda *a: said.append(a)))
    assert batched == whole and len(whole["steps"]) == 6
    assert said == [(i + 1, 6, (i, i)) for i in range(6)]
