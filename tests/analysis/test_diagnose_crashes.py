"""diagnose() says only what the records show, on real 2-rank gloo runs that die hard or drift.

A rank that aborts, segfaults or is killed: findings about later calls say its records
end and what it did afterwards is unknown, never that it "never entered" them; a crash
file names the signal, the call and the line. A rank that makes a call fewer in a step:
the first step where the ranks part is named, with both ranks' lines.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prism_rr.format import open_bundle, pack
from prism_rr.analysis import diagnose, diagnosis_json
from prism_rr.localrun import free_port, rank_env
from prism_rr.recorder import RecordOptions
from prism_rr.recorder.launch import hook_env, spool_dir_for
from windows import diagnosed

SCRIPTS = Path(__file__).parents[1] / "recorder" / "scripts"
WORLD = 2


def _line_of(text: str) -> str:
    """Where in crashy.py the line holding `text` is, as a stack frame names it."""
    lines = (SCRIPTS / "crashy.py").read_text().splitlines()
    return f"crashy.py:{next(i for i, line in enumerate(lines, 1) if text in line)}"


ABORT_AT = _line_of("torch.ones(5) if rank == world - 1")  # the all_reduce of another shape
SEGV_AT = _line_of("ctypes.string_at(0)")


def _record(tmp_path, script, *args):
    """Run `script` as 2 recorded gloo ranks. Returns exit codes and findings."""
    out = tmp_path / "run.prism"
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    env.update(hook_env(RecordOptions.make(spool_dir_for(out))))
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(SCRIPTS / script), *args, str(tmp_path)],
                              env=dict(env, **rank_env(r, WORLD, port, "diag")), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True) for r in range(WORLD)]
    try:
        deadline = time.monotonic() + 60
        for p in procs:
            p.wait(max(0.1, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    pack(spool_dir_for(out), out)
    with open_bundle(out) as b:
        findings = diagnosed(b)
    return [p.returncode for p in procs], findings


def _crashed(crashy_runs, mode):
    """The session's recording of crashy.py MODE (conftest.crashy_runs, which the recorder's
    crash-safety test reads too): exit codes and findings."""
    run = crashy_runs(mode)
    with open_bundle(run.bundle) as b:
        return run.codes, diagnosed(b)


def _text(findings):
    return [f"[{f.kind}] {f.message}" for f in findings]


def _no_never_for(findings, rank):
    for f in findings:
        assert f"never by rank {rank}" not in f.message and f"rank {rank} never" not in f.message, _text(findings)


@pytest.mark.timeout(90)
def test_gloo_abort_is_a_crash_in_the_mismatched_call(crashy_runs):
    """The last rank all_reduces 5 floats where the other passes 3, and gloo aborts a rank
    inside that call. Both ranks' records hold the call (written as entered), so the
    diagnosis is the mismatch, with both sides' shapes and dtypes and who died where; no
    hang is reported for a call every rank entered."""
    codes, findings = _crashed(crashy_runs, "abort")
    assert -signal.SIGABRT in codes, codes
    dead = codes.index(-signal.SIGABRT)
    first = findings[0]
    assert first.kind == "crashed" and first.ranks == (dead,), _text(findings)
    assert first.details["signal"] == "SIGABRT" and first.details["where"] == ABORT_AT
    assert f"Rank {dead} crashed (SIGABRT) in all_reduce (group 0, seq 8)" in first.message
    assert f"at {ABORT_AT}" in first.message
    assert first.stack and any(fr.startswith(ABORT_AT) for fr in first.stack)
    _no_never_for(findings, dead)
    (mismatch,) = [f for f in findings if f.kind == "mismatch"]
    assert (mismatch.group, mismatch.seq) == (0, 8), _text(findings)
    assert mismatch.details["members"] == {"0": {"shapes": [[3]], "dtypes": ["float32"]},
                                           "1": {"shapes": [[5]], "dtypes": ["float32"]}}
    assert "rank 0: [3] float32; rank 1: [5] float32" in mismatch.message, mismatch.message
    assert f"rank {dead} died in it (SIGABRT at {ABORT_AT})" in mismatch.message, mismatch.message
    assert mismatch.details["crashed"] == {str(dead): {"signal": "SIGABRT", "where": ABORT_AT}}
    assert not [f for f in findings if f.kind in ("hang", "incomplete")], _text(findings)
    assert diagnosis_json(findings)["summary"]["by_kind"]["crashed"] == 1


@pytest.mark.timeout(90)
def test_segfault_is_a_crash_with_its_line(crashy_runs):
    codes, findings = _crashed(crashy_runs, "segv")
    assert codes[1] == -signal.SIGSEGV, codes
    first = findings[0]
    assert (first.kind, first.ranks) == ("crashed", (1,)), _text(findings)
    assert first.details["signal"] == "SIGSEGV" and first.details["where"] == SEGV_AT
    assert f"Rank 1 crashed (SIGSEGV) at {SEGV_AT}" in first.message
    assert "string_at" in first.stack[0]
    _no_never_for(findings, 1)
    hang = next(f for f in findings if f.kind == "hang")
    assert "Rank 1's records end at +" in hang.message and "(process died: SIGSEGV)" in hang.message


@pytest.mark.timeout(90)
def test_sigkilled_rank_is_unknown_after_its_records(killed_peer):
    # The session's run of hang.py kill (conftest.killed_peer), whose spools
    # tests/recorder/test_failures.py reads.
    codes = killed_peer.codes
    with open_bundle(killed_peer.bundle) as b:
        findings = diagnosed(b)
    assert codes[1] == -signal.SIGKILL, codes
    assert not any(f.kind == "crashed" for f in findings)  # SIGKILL leaves no crash file
    _no_never_for(findings, 1)
    killed = findings[0]  # named as killed, not as a hang (issue 40)
    assert (killed.kind, killed.ranks, killed.group, killed.seq) == ("killed", (1,), 0, 6), _text(findings)
    assert "its records end at +" in killed.message and "ended without a word" in killed.message


@pytest.mark.timeout(90)
def test_drift_names_the_step_where_calls_part(tmp_path):
    codes, findings = _record(tmp_path, "crashy.py", "drift")
    drift = [f for f in findings if f.kind == "drift"]
    assert len(drift) == 1, _text(findings)
    d = drift[0]
    assert d.ranks == (1,) and d.group == 0 and d.seq == 8 and d.details["step"] == 2
    assert d.message.startswith("In step 2, rank 1 made 2 of the 3 all_reduce calls (group 0) that rank 0 made; "
                                "from there on its calls pair with the wrong ones"), d.message
    assert "rank 0's all_reduce at crashy.py:" in d.message and "rank 1's all_reduce at crashy.py:" in d.message
    assert d.details["where"]["0"] != d.details["where"]["1"] or d.details["step"] == 2
    # the end: rank 0 waits alone in a last call rank 1 never made (it exited properly)
    hang = next(f for f in findings if f.kind == "hang")
    assert hang.ranks == (1,) and hang.seq == 14 and "never by rank 1" in hang.message
    assert findings.index(d) < findings.index(hang)
