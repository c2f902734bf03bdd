"""A hung rank and a killed rank still leave spools that show what happened."""

import signal
import subprocess
import time

import pytest

from prism_rr.format.records import Marker
from prism_rr.recorder.launch import spool_dir_for

from recorder_helpers import Spools, start_ranks

WORLD = 2


def _start(tmp_path, mode):
    return start_ranks(tmp_path, "hang.py", mode, WORLD, "hang")


def _wait_for(paths, procs, timeout):
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            for p in procs:
                p.kill()
            pytest.fail("ranks never reached the planted failure")
        time.sleep(0.05)


def _stop(procs, timeout=15):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return [p.returncode for p in procs]


@pytest.mark.timeout(90)
def test_hang_shows_as_open_call(tmp_path):
    out, procs = _start(tmp_path, "hang")
    _wait_for([tmp_path / "stuck-0", tmp_path / "stuck-1"], procs, 60)
    time.sleep(0.5)  # rank 0 is now inside the all_reduce rank 1 never joins
    codes = _stop(procs)
    assert codes == [-signal.SIGTERM, -signal.SIGTERM]  # terminated as without the recorder
    spools = Spools(spool_dir_for(out))
    waiting = [c for c in spools.collectives(0) if c.end_ns is None]
    assert len(waiting) == 1 and waiting[0].op == "all_reduce" and waiting[0].seq == 6
    assert waiting[0].step == 3 and waiting[0].stack[0].startswith("hang.py:")
    assert max(c.seq for c in spools.collectives(1)) == 5  # rank 1 never entered seq 6
    assert all(c.end_ns is not None for c in spools.collectives(1))
    ends = [m for m in spools.of_kind(0, Marker) if m.name == "recording_end"]
    assert ends and ends[0].value == 1 and ends[0].text == "SIGTERM"


@pytest.mark.timeout(90)
def test_killed_rank_leaves_readable_spools(killed_peer):
    # The session's run of hang.py kill (conftest.killed_peer; rank 0 stopped 0.5 s after
    # rank 1's death), which tests/analysis/test_diagnose_crashes.py diagnoses too.
    assert killed_peer.codes[1] == -signal.SIGKILL, killed_peer.log(1)
    spools = Spools(killed_peer.dir / "run.prism.d")
    # The killed rank's spool holds everything up to its last flush before death.
    dead = spools.collectives(1)
    assert [c.seq for c in sorted(dead, key=lambda c: c.seq)] == list(range(6))
    assert not any(m.name == "recording_end" for m in spools.of_kind(1, Marker))
    # The survivor shows the call it was in when its peer died: failed or never completed.
    last = max(spools.collectives(0), key=lambda c: c.seq)
    failed = [m for m in spools.of_kind(0, Marker) if m.name == "call_failed"]
    assert last.seq == 6 and (last.end_ns is None or failed)
