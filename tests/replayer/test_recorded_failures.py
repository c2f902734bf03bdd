"""A replay ends the way its recording ended (issue 38): each kind of failure, recorded on
real gloo ranks, replayed with each rank real in turn, stops where the recording failed
with exit 7 and the verdict diagnose gives; the same program fixed replays to exit 0.

The trainer (scripts/faulty_trainer.py) is written the way data-parallel trainers are, not
for the tool: gradients all-reduced by hand parameter by parameter (a rank whose batch
skips a layer skips that parameter's all_reduce), a loss all-reduced for the log, a data
loader that stalls. Each mode is recorded once for the module; crashy.py's segfault and
hang.py's killed peer are the session's shared recordings (tests/conftest.py).
"""

import subprocess
import sys

import pytest

from prism_rr.format import pack
from prism_rr.recorder.launch import record_command, spool_dir_for
from prism_rr.replayer import replay

from replay_helpers import SCRIPTS, _LOCAL

TRAINER = SCRIPTS / "faulty_trainer.py"
CRASHY = SCRIPTS.parents[1] / "recorder" / "scripts" / "crashy.py"
HANG = SCRIPTS.parents[1] / "recorder" / "scripts" / "hang.py"
HUNG = 7


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """mode -> its bundle: faulty_trainer.py MODE as 2 recorded ranks (each failing mode
    exits non-zero, as production's job did)."""
    out = {}
    for mode in ("skip", "mismatch", "slow"):
        d = tmp_path_factory.mktemp(mode)
        bundle = d / "run.prism"
        cmd = [sys.executable, "-c", _LOCAL, "2", sys.executable, str(TRAINER), mode]
        code = record_command(cmd, bundle, payload="digest", timeout=120)
        assert code != 0, f"{mode}: the recorded job should have failed"
        pack(spool_dir_for(bundle), bundle)
        out[mode] = bundle
    return out


def _replay(bundle, rank: int, argv: list, tmp_path):
    return replay(bundle, ranks=(rank,), cmd=[sys.executable, *map(str, argv)], timeout=120,
                  log_dir=tmp_path / f"logs-{rank}")


def _verdict(result) -> str:
    return result.card + "\n" + str(result.report.get("hang"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rank", [0, 1])
def test_a_drift_stops_at_the_first_mispaired_call(recorded, rank, tmp_path):
    """Rank 1 skipped one all_reduce in step 2: both ranks, replayed, stop at seq 8, the
    first call that pairs with the wrong one, naming who skipped what (diagnose's words)."""
    result = _replay(recorded["skip"], rank, [TRAINER, "skip"], tmp_path)
    assert result.exit_code == HUNG, _verdict(result)
    hang = result.report["hang"]
    assert hang["kind"] == "drifted" and hang["rank"] == rank and hang["call"]["seq"] == 8
    assert f"drift reproduced: rank {rank}'s all_reduce (group 0 'default_pg', seq 8)" in result.card
    assert "In step 2, rank 1 made 2 of the 3 all_reduce calls (group 0) that rank 0 made" in result.card


@pytest.mark.timeout(240)
def test_the_drifting_rank_fixed_replays_to_the_end(recorded, tmp_path):
    """The same trainer with the fix (a zero gradient where the batch made none), replayed
    as rank 1 against the recording of the bug: its calls pair with rank 0's as they
    should, and the replay ends well; rank 0, whose program the fix does not change, still
    meets the recorded rank 1's drift."""
    fixed = _replay(recorded["skip"], 1, [TRAINER, "skip-fixed"], tmp_path)
    assert fixed.exit_code == 0, _verdict(fixed)
    assert fixed.report["hang"] is None and "diverged: no" in fixed.card
    other = _replay(recorded["skip"], 0, [TRAINER, "skip-fixed"], tmp_path)
    assert other.exit_code == HUNG and other.report["hang"]["kind"] == "drifted"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rank", [0, 1])
def test_a_shape_mismatch_stops_at_its_call(recorded, rank, tmp_path):
    """Rank 1's loss tensor had 3 elements where rank 0's had 2: gloo ended the job there."""
    result = _replay(recorded["mismatch"], rank, [TRAINER, "mismatch"], tmp_path)
    assert result.exit_code == HUNG, _verdict(result)
    hang = result.report["hang"]
    assert hang["kind"] == "mismatched" and hang["call"]["seq"] == 12
    assert "rank 1 passed shapes [3] where rank 0 passed [2]" in result.card


@pytest.mark.timeout(240)
def test_a_timed_out_call_and_the_stalled_rank(recorded, tmp_path):
    """Rank 1 stalled in step 2 past the group's timeout; rank 0's all_reduce timed out,
    and the launcher stopped rank 1. Rank 0 stops at the call rank 1 never joined; rank 1
    where its recording ends, before the call it never made."""
    first = _replay(recorded["slow"], 0, [TRAINER, "slow"], tmp_path)
    assert first.exit_code == HUNG, _verdict(first)
    assert first.report["hang"]["kind"] == "never_joined" and first.report["hang"]["call"]["seq"] == 6
    stalled = _replay(recorded["slow"], 1, [TRAINER, "slow"], tmp_path)
    assert stalled.exit_code == HUNG, _verdict(stalled)
    assert stalled.report["hang"]["kind"] == "ended" and stalled.report["hang"]["call"]["seq"] == 6
    assert "rank 1's program ended (stopped by SIGTERM) before all_reduce (group 0 'default_pg', seq 6)" \
        in stalled.card


@pytest.mark.timeout(240)
def test_a_peer_that_crashed(crashy_runs, tmp_path):
    """crashy.py segv: rank 1 segfaulted in step 2, before the all_reduce rank 0 waited in
    (which then failed with gloo's error). Rank 0 stops at that call, told that rank 1
    never joined it and how its program ended; rank 1's program segfaults again where it
    did: both are the recording's failure (exit 7)."""
    run = crashy_runs("segv")
    argv = [CRASHY, "segv", tmp_path]
    survivor = _replay(run.bundle, 0, argv, tmp_path)
    assert survivor.exit_code == HUNG, _verdict(survivor)
    hang = survivor.report["hang"]
    assert hang["kind"] == "never_joined" and [p["rank"] for p in hang["peers"]] == [1]
    assert "and then its program ended (crashed: Segmentation fault)" in survivor.card
    crashed = _replay(run.bundle, 1, argv, tmp_path)
    assert crashed.exit_code == HUNG and crashed.rank_codes[1] == -11, _verdict(crashed)
    assert crashed.report["reproduced"] and "as in the recording (crashed: Segmentation fault)" in crashed.card


@pytest.mark.timeout(240)
def test_a_peer_killed_mid_step(killed_peer, tmp_path):
    """hang.py kill: rank 1 SIGKILLed itself while rank 0 waited for it in an all_reduce,
    and rank 0's call failed with gloo's error. Rank 0's call raises that error again (its
    program unwinds as it did), and the verdict says where rank 1's records end."""
    result = _replay(killed_peer.bundle, 0, [HANG, "kill", tmp_path], tmp_path)
    assert result.exit_code == HUNG, _verdict(result)
    hang = result.report["hang"]
    assert hang["kind"] == "failed" and [p["rank"] for p in hang["peers"]] == [1], hang
    assert "call failed as in the recording: rank 0's all_reduce" in result.card
    assert ("rank 1's last call was all_reduce (group 0 'default_pg', seq 5) at hang.py:22 in <module>, completed, "
            "and then its program ended (no word: killed by SIGKILL, or os._exit)") in result.card
    assert "this call ended in this error in the recording" in (result.log_dir / "rank0.stderr").read_text()


@pytest.mark.timeout(240)
def test_without_the_program_each_failure_ends_the_replay_as_it_ended_the_recording(crashy_runs, killed_peer,
                                                                                    tmp_path):
    """The bundle as the program (--from-bundle, issue 39): the segfaulted rank's driver
    ends by the same signal after its last recorded call, and its peer stops where it
    waited; the killed peer's survivor's call raises the recorded error again (exit 7)."""
    segv = crashy_runs("segv").bundle
    crashed = replay(segv, ranks=(1,), from_bundle=True, timeout=120, log_dir=tmp_path / "segv1")
    assert crashed.exit_code == HUNG and crashed.rank_codes[1] == -11, _verdict(crashed)
    assert crashed.report["reproduced"] and "as in the recording (crashed: Segmentation fault)" in crashed.card
    survivor = replay(segv, ranks=(0,), from_bundle=True, timeout=120, log_dir=tmp_path / "segv0")
    assert survivor.exit_code == HUNG and survivor.report["hang"]["kind"] == "never_joined", _verdict(survivor)
    killed = replay(killed_peer.bundle, ranks=(0,), from_bundle=True, timeout=120, log_dir=tmp_path / "killed")
    assert killed.exit_code == HUNG and killed.report["hang"]["kind"] == "failed", _verdict(killed)
    assert "call failed as in the recording: rank 0's all_reduce" in killed.card


@pytest.fixture(scope="module")
def ended_well(tmp_path_factory):
    """The trainer without a bug, recorded with full payloads."""
    bundle = tmp_path_factory.mktemp("ok") / "ok.prism"
    cmd = [sys.executable, "-c", _LOCAL, "2", sys.executable, str(TRAINER), "ok"]
    assert record_command(cmd, bundle, payload="full", timeout=120) == 0
    pack(spool_dir_for(bundle), bundle)
    return bundle


@pytest.mark.timeout(240)
def test_a_run_that_ended_well_replays_to_exit_0(ended_well, tmp_path):
    """Nothing to reproduce: each rank ends with exit 0."""
    for rank in (0, 1):
        result = _replay(ended_well, rank, [TRAINER, "ok"], tmp_path)
        assert result.exit_code == 0 and result.report["hang"] is None, _verdict(result)


@pytest.mark.timeout(240)
def test_a_data_divergence_shows_the_elements_that_differ(ended_well, tmp_path):
    """The learning rate edited: step 1's gradients differ from the recorded ones, and the
    verdict shows the first elements that do, from the recorded bytes, not two hashes."""
    result = _replay(ended_well, 0, [TRAINER, "ok", "3", "0.02"], tmp_path)
    assert result.exit_code == 3, _verdict(result)
    line = next(x for x in result.card.splitlines() if "diverged:" in x)
    assert "diverged: rank 0 group 0 seq 3 all_reduce at faulty_trainer.py:" in line
    assert "input 0 ([16, 16] float32) at (0, 0): recorded " in line and "more elements)" in line


@pytest.mark.timeout(240)
def test_the_verdict_is_said_once_without_prism_rr_s_traceback(recorded, tmp_path):
    """As a user runs it: the verdict once, on the card; of the stopped program one line
    saying where, and no traceback through prism_rr's modules."""
    out = subprocess.run([sys.executable, "-m", "prism_rr.cli", "replay", str(recorded["skip"]), "--ranks", "0", "--",
                          sys.executable, str(TRAINER), "skip"], capture_output=True, text=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == HUNG, out.stderr[-3000:]
    assert out.stderr.count("drift reproduced") == 1, out.stderr
    assert "Traceback" not in out.stderr and "prism_rr/" not in out.stderr, out.stderr
    assert "the replay stopped the program at faulty_trainer.py:" in out.stderr
    assert len(out.stderr.splitlines()) <= 14, out.stderr
