"""prism_rr.localrun: the one exit code a job of local ranks ends with."""

import signal
import subprocess
import sys

from prism_rr.localrun import describe_exit, exit_code


def test_the_rank_that_failed_on_its_own_names_the_job_exit_code():
    term, kill, abrt = -signal.SIGTERM, -signal.SIGKILL, -signal.SIGABRT
    assert exit_code([0, 0]) == 0
    assert exit_code([term, 3]) == 3  # an exit code before any signal
    # the launcher stopped rank 0 (SIGTERM) once rank 1 had aborted: rank 1's abort is the story
    assert exit_code([term, abrt]) == 128 + signal.SIGABRT
    assert exit_code([term, kill]) == 128 + signal.SIGKILL  # the OOM killer, say
    assert exit_code([term, term]) == 128 + signal.SIGTERM
    assert describe_exit(134) == "134 (SIGABRT)" and describe_exit(3) == "3" and describe_exit(250) == "250"


def test_a_rank_that_aborts_gives_the_job_its_code_not_the_peer_the_launcher_stopped():
    # rank 1 aborts; rank 0 would sleep on, and is stopped with SIGTERM by the launcher
    prog = "import os, time\nif os.environ['RANK'] == '1':\n    time.sleep(0.5); os.abort()\ntime.sleep(60)"
    p = subprocess.run([sys.executable, "-m", "prism_rr.localrun", "--nproc", "2", "--timeout", "50", "--",
                        sys.executable, "-c", prog], capture_output=True, text=True, timeout=100)
    assert p.returncode == 128 + signal.SIGABRT, (p.returncode, p.stderr[-2000:])
