"""diagnose() on real recorded runs of 2 gloo ranks, each with one planted fault.

Two ranks, as the test machines may have two cores: more would make stragglers of their own.
"""

import sys
from pathlib import Path

import pytest

from prism_rr.format import open_bundle, pack
from prism_rr.analysis import diagnose
from prism_rr.recorder.launch import spool_dir_for
from prism_rr.recorder.launch import record_command
from windows import diagnosed

SCRIPT = Path(__file__).parent / "scripts" / "faults.py"
WORLD = 2


def _diagnose(tmp_path, mode):
    out = tmp_path / "run.prism"
    # prism_rr.localrun starts the ranks as torchrun would, without an agent that imports
    # torch (torchrun's own path is recorded in tests/recorder/test_frameworks.py)
    cmd = [sys.executable, "-m", "prism_rr.localrun", "--nproc", str(WORLD), "--", sys.executable, str(SCRIPT), mode]
    code = record_command(cmd, out, timeout=90)
    pack(spool_dir_for(out), out)
    with open_bundle(out) as b:
        return code, diagnosed(b)


def _not_timing(findings):
    """The findings that do not depend on timing: on a loaded machine (CI's) one rank of a
    run can be late by a fifth of a step for reasons of its own, a straggler finding."""
    return [f for f in findings if f.kind != "straggler"]


def _kinds(findings):
    return [(f.kind, f.ranks, f.group, f.seq) for f in findings]


@pytest.mark.timeout(150)
def test_clean_run(tmp_path):
    code, findings = _diagnose(tmp_path, "clean")
    assert code == 0
    assert _not_timing(findings) == [], [f.message for f in findings]


@pytest.mark.timeout(150)
def test_rank_that_skips_a_collective(tmp_path):
    _, findings = _diagnose(tmp_path, "skip")
    hang = findings[0]
    assert (hang.kind, hang.ranks, hang.group, hang.seq) == ("hang", (1,), 0, 8), _kinds(findings)
    assert hang.details["entered"] == [0]
    assert hang.stack and hang.stack[0].startswith("faults.py:")
    # The waiting ranks' time-outs are findings of their own, each said to follow from the hang.
    # (A straggler is a judgement of timing, which a loaded machine can make of 8 calls: not a failure.)
    failures = [f for f in findings[1:] if f.kind != "straggler"]
    assert {f.kind for f in failures} <= {"call_failed"}, _kinds(findings)
    for f in failures:
        assert f.details["consequence"] and (f.group, f.seq) == (0, 8), f.message
        assert f.details["text"]


@pytest.mark.timeout(150)
def test_rank_that_calls_with_another_shape(tmp_path):
    _, findings = _diagnose(tmp_path, "shape")
    first = findings[0]
    assert (first.kind, first.ranks, first.group, first.seq) == ("mismatch", (1,), 0, 6), _kinds(findings)
    assert first.details["differences"]["shapes"] == {"ranks": [1], "value": "[1, 3]", "expected": "[3]"}
    assert _not_timing(findings) == [first], _kinds(findings)


@pytest.mark.timeout(150)
def test_rank_slowed_by_a_sleep(tmp_path):
    code, findings = _diagnose(tmp_path, "slow")
    assert code == 0
    assert _kinds(findings)[:1] == [("straggler", (1,), 0, findings[0].seq)], [f.message for f in findings]
    assert findings[0].details["waiting_ranks"] == [0]
    assert findings[0].details["lost_per_rank_ns"] > 5 * 80_000_000


@pytest.mark.timeout(150)
def test_rank_killed_mid_run(tmp_path):
    _, findings = _diagnose(tmp_path, "kill")
    killed = findings[0]  # a rank whose process ended without a word, not a hang (issue 40)
    assert (killed.kind, killed.ranks, killed.group, killed.seq) == ("killed", (1,), 0, 8), _kinds(findings)
    assert killed.details["waiting"] == [0] and killed.details["killed"]["1"]["in_call"] is False, killed.details
    assert "Rank 1 was killed" in killed.message, killed.message
