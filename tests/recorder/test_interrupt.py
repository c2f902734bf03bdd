"""Ctrl-C (SIGINT) or SIGTERM to `prism-rr record`, as a terminal sends it, at any moment:
record ends within seconds, packs what was recorded, and `diagnose` and `info` say the
run was interrupted, by what, and where each rank was (issue 38, item 4)."""

import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from prism_rr.cli import app

from recorder_helpers import SCRIPTS

PRISM = [sys.executable, "-m", "prism_rr.cli"]
TRAINER = SCRIPTS / "pausing.py"
ENDS_WITHIN_S = 60  # generous: 2 shared cores; what it takes is a few seconds


def _interrupt(tmp_path, sig, marker, *trainer_args):
    """Record the trainer as 2 ranks; once `marker` appears (and half a second more, for the
    ranks to be where it says), send `sig` to record's process group, as a terminal's Ctrl-C
    does. (what record printed, seconds from the signal to its end)"""
    out, markers = tmp_path / "run.prism", tmp_path / "markers"
    markers.mkdir()
    cmd = [*PRISM, "record", "--nproc", "2", "-o", str(out), "--", sys.executable, str(TRAINER), str(markers),
           *trainer_args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (markers / marker).exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=30)[0]
            time.sleep(0.05)
        time.sleep(0.5)
        sent = time.monotonic()
        os.killpg(proc.pid, sig)
        said, _ = proc.communicate(timeout=ENDS_WITHIN_S)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    print(f"{signal.Signals(sig).name} at {marker}: record ended {took:.2f} s later, exit {proc.returncode}")
    return out, said, proc.returncode


def _cli(*args):
    return CliRunner().invoke(app, [*map(str, args)])


@pytest.mark.timeout(180)
def test_an_interrupt_inside_a_collective_is_diagnosed(tmp_path):
    # rank 1 loads step 3's data slowly: rank 0 waits in that step's first all_reduce. The
    # ranks' SIGTERM only asks the loop to stop at the end of the step, which neither
    # reaches: record stops them itself a few seconds later.
    out, said, code = _interrupt(tmp_path, signal.SIGINT, "step-0-3", "--late-rank", "1", "--late-step", "3",
                                 "--finish-step-on-sigterm")
    assert code == 1 and "interrupted by SIGINT" in said and f"wrote {out}" in said, said
    found = _cli("diagnose", out)
    assert found.exit_code == 5, found.output
    first = found.output.split("\n2. ")[0]
    assert first.startswith("1. [interrupted] ranks 0-1") and "SIGINT to prism-rr record" in first, found.output
    assert "had not ended a few seconds later, stopped with SIG" in first, found.output
    assert "rank 0 was blocked in all_reduce (group 0, seq 6)" in first, found.output
    assert "pausing.py:" in first and "in load_data" in first, found.output  # where rank 1 was
    info = _cli("info", out).output
    assert "interrupted     by SIGINT to prism-rr record" in info and "in load_data" in info, info


@pytest.mark.timeout(180)
def test_an_interrupt_between_steps_leaves_a_bundle_that_says_so(tmp_path):
    out, said, code = _interrupt(tmp_path, signal.SIGTERM, "step-1-3")
    assert code == 1 and "interrupted by SIGTERM" in said and f"wrote {out}" in said, said
    found = _cli("diagnose", out)
    assert found.exit_code == 5 and "[interrupted]" in found.output and "no problems found" not in found.output
    assert "SIGTERM to prism-rr record" in found.output, found.output
    assert "interrupted     by SIGTERM to prism-rr record" in _cli("info", out).output


@pytest.mark.timeout(180)
def test_an_interrupt_before_init_finished_says_so(tmp_path):
    # rank 0 waits in init_process_group for rank 1, which starts late
    out, said, code = _interrupt(tmp_path, signal.SIGINT, "step-0--1", "--late-rank", "1", "--late-step", "-1")
    assert code == 1 and "nothing was recorded" not in said, said
    assert "interrupted by SIGINT" in said and "before any rank had finished torch.distributed.init_process_group" in said
    assert not out.exists()


def test_what_an_interrupt_says_is_read_as_hostile_input():
    from prism_rr.format.facts import interrupted_facts, interrupted_line

    assert interrupted_facts({"interrupted": "SIGINT"}) is None and interrupted_facts(None) is None
    odd = interrupted_facts({"interrupted": {"signal": "SIG\x1b[2JINT", "after_s": True, "forced": 9}})
    assert odd == {"signal": "SIG\x1b[2JINT", "after_s": None, "forced": None}
    assert "\x1b" not in interrupted_line(odd, None)
