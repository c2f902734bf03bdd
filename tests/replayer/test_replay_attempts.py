"""`replay --attempt N`: any attempt of a restarted job, as that attempt ran.

The bundle is real: tests/recorder/scripts/elastic.py under `prism-rr record`, torchrun
restarting it once (as tests/recorder/test_attempts.py makes it). In attempt 0 rank 1
exits with code 17 in step 2, after its gradient all_reduces, and rank 0 loses its peer in
its next call; attempt 1 (TORCHELASTIC_RESTART_COUNT=1) runs its 4 steps to the end.

A replay of a failed attempt reproduces how each real rank ended in it: a rank whose
program failed fails again, with its code, and the report says it ended so in the
recording too; a rank whose peer had died stops at the call that peer never joined (exit
7), naming the peer and how its program ended.
"""

import json
import os
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli

ELASTIC = Path(__file__).parents[1] / "recorder" / "scripts" / "elastic.py"
ENV = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")


@pytest.fixture
def restarted(restarted_job) -> Path:
    """tests/conftest.py's restarted_job: elastic.py recorded, torchrun restarting it once."""
    assert restarted_job.returncode == 0 and restarted_job.bundle.exists(), restarted_job.stderr[-3000:]
    return restarted_job.bundle


def replay(bundle: Path, rank: int, tmp: Path, *attempt: str):
    """Replay `rank` of `bundle` (`--attempt N` where given) with elastic.py; its report."""
    store = tmp / f"store-{rank}-{'-'.join(attempt) or 'default'}"
    store.mkdir()
    report = store / "report.json"
    r = run_cli("replay", bundle, *attempt, "--ranks", rank, "--timeout", 90, "--report", report, "--",
                sys.executable, ELASTIC, store, timeout=150, env=ENV)
    assert report.exists(), r.stderr[-3000:]
    return r, json.loads(report.read_text())


@pytest.mark.timeout(400)
def test_the_failed_attempt_fails_again_as_it_did(restarted, tmp_path):
    """Attempt 0, the default one: rank 1 exits 17 again, after the calls it made, with no
    divergence; the report names the attempt and that the recording ended so too: the
    recorded failure reproduced, exit 7 (the rank's own 17 in the report)."""
    for asked in ((), ("--attempt", "0")):
        r, rep = replay(restarted, 1, tmp_path, *asked)
        assert r.returncode == 7, r.stderr[-3000:]
        assert rep["reproduced"] and rep["rank_exit_codes"] == {"1": 17}
        assert "reproduced: each rank that failed failed as it did in the recording" in r.stderr
        assert rep["attempt"] == {"attempt": 0, "attempts": [0, 1], "default": 0}
        assert not rep["diverged"] and rep["hang"] is None
        [ended] = rep["stopped_early"]
        assert (ended["rank"], ended["exit_code"], ended["complete"]) == (1, 17, True)
        assert ended["recorded_exit"] == {"code": 17, "how": "sys.exit(17)"}
        assert "attempt 0 of the job's attempts 0, 1 (the bundle's default)" in r.stderr
        assert "exited with code 17 after 8 of 8 recorded calls" in r.stderr and "as in the recording" in r.stderr


@pytest.mark.timeout(400)
def test_the_failed_attempt_from_the_surviving_rank_names_the_peer_that_died(restarted, tmp_path):
    r, rep = replay(restarted, 0, tmp_path, "--attempt", "0")
    assert r.returncode == 7, r.stderr[-3000:]
    assert not rep["diverged"]
    h = rep["hang"]
    assert (h["kind"], h["call"]["op"], h["call"]["seq"]) == ("never_joined", "all_reduce", 8)
    [peer] = h["peers"]
    assert (peer["rank"], peer["last"]["seq"], peer["exit"]) == (1, 7, "sys.exit(17)")
    assert "and then its program ended (sys.exit(17))" in r.stderr


@pytest.mark.timeout(400)
@pytest.mark.parametrize("rank", [0, 1])
def test_the_attempt_that_ran_to_the_end_replays_whole(restarted, tmp_path, rank):
    """Attempt 1: each rank runs as a restart (TORCHELASTIC_RESTART_COUNT=1), so rank 1
    does not exit 17, and makes every call of its 4 steps, with no divergence."""
    r, rep = replay(restarted, rank, tmp_path, "--attempt", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert rep["attempt"]["attempt"] == 1 and not rep["diverged"] and not rep["stopped_early"]
    assert rep["progress"][str(rank)]["complete"]
    assert "attempt 1 of the job's attempts 0, 1\n" in r.stderr


@pytest.mark.timeout(400)
def test_each_attempt_replays_without_the_program(restarted, tmp_path):
    """The bundle as the program (--from-bundle, issue 39): attempt 0's rank 1 exits 17 after
    its last recorded call, as it did (exit 7, reproduced); attempt 1 replays whole."""
    failed = run_cli("replay", restarted, "--attempt", "0", "--ranks", 1, "--from-bundle", "--timeout", 90,
                     "--report", tmp_path / "a0.json", timeout=150, env=ENV)
    assert failed.returncode == 7, failed.stderr[-3000:]
    rep = json.loads((tmp_path / "a0.json").read_text())
    assert rep["reproduced"] and rep["rank_exit_codes"] == {"1": 17} and not rep["diverged"]
    assert "exited with code 17 after 8 of 8 recorded calls" in failed.stderr
    whole = run_cli("replay", restarted, "--attempt", "1", "--ranks", "all", "--from-bundle", "--timeout", 90,
                    "--report", tmp_path / "a1.json", timeout=150, env=ENV)
    assert whole.returncode == 0, whole.stderr[-3000:]
    rep = json.loads((tmp_path / "a1.json").read_text())
    assert rep["attempt"]["attempt"] == 1 and not rep["diverged"] and not rep["stopped_early"]


def test_an_attempt_the_bundle_lacks_is_a_usage_error(restarted):
    r = run_cli("replay", restarted, "--attempt", "5", "--ranks", "0", "--", sys.executable, ELASTIC, "/tmp")
    assert r.returncode == 2 and "holds no attempt 5" in r.stderr and "Traceback" not in r.stderr
