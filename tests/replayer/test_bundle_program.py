"""The bundle is the program (issue 39): `replay --from-bundle` runs no command of the user's;
each real rank makes its recorded calls through torch.distributed (driver.py), against the
same virtual peers, divergence check and card as any replay. A bundle whose calls no
program could make is refused in one line before any rank starts.

The recordings are the session's: the demo (`make_demo`, digest payloads, steps 1-3 of a
windowed run) and the DDP trainer recorded with full payloads (`demo_training`, rep 1, as
test_replay_parallel reads it)."""

import json
import subprocess
import sys

import pytest

from prism_rr import api
from prism_rr.errors import FormatError, UsageError
from prism_rr.format.records import Collective, GroupInfo, Step
from prism_rr.format.rewrite import Rewrite
from prism_rr.replayer import replay

from replay_helpers import stderr_of

BIN = __import__("pathlib").Path(sys.executable).parent
PRISM = [str(BIN / "prism-rr")] if (BIN / "prism-rr").exists() else [sys.executable, "-m", "prism_rr.cli"]
DDP = (2, ["--steps", "3", "--seed", "7", "--dp-mode", "ddp"])  # test_replay_parallel's "ddp" recording


@pytest.mark.timeout(200)
def test_a_redacted_demo_replays_with_one_real_rank_and_no_code(make_demo, tmp_path):
    assert make_demo.result().returncode == 0, make_demo.result().stderr[-2000:]
    redacted = tmp_path / "public.prism"
    api.redact(make_demo.bundle, redacted)  # no command left in it: nothing else could run
    result = replay(redacted, ranks=(0,), from_bundle=True, timeout=150, log_dir=tmp_path / "logs")
    assert result.exit_code == 0, stderr_of(result, 0) + result.card
    rep = result.report
    assert rep["diverged"] is False and rep["stopped_early"] == []
    assert [s["step"] for s in rep["steps"]] == [1, 2, 3] and rep["scored_steps"] == [2, 3]
    assert rep["iteration_time_error_pct"] is not None
    assert all(s["replayed_s"] > 0 for s in rep["steps"])
    assert rep["steps"][-1]["peak_replayed_bytes"]  # the recorded memory is held
    assert rep["inputs_made_up_calls"] == 60  # a digest recording holds no bytes of rank 0's calls
    assert "iteration time error" in result.card and "made up" in result.card
    assert result.commands[0][1:] == ["-m", "prism_rr.replayer.driver"]


@pytest.mark.timeout(200)
def test_every_demo_rank_real_from_the_command_line(make_demo, tmp_path):
    assert make_demo.result().returncode == 0
    report = tmp_path / "fidelity.json"
    out = subprocess.run([*PRISM, "replay", str(make_demo.bundle), "--ranks", "all", "--from-bundle",
                          "--report", str(report), "--timeout", "150"],
                         capture_output=True, text=True, timeout=200, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "4 real rank(s) [0, 1, 2, 3], 0 virtual" in out.stderr and "diverged: no" in out.stderr
    rep = json.loads(report.read_text())
    assert rep["ranks"] == [0, 1, 2, 3] and rep["iteration_time_error_pct"] is not None
    assert [s["step"] for s in rep["steps"]] == [1, 2, 3]


@pytest.mark.timeout(300)
def test_full_payloads_are_the_inputs_and_are_checked(demo_training, tmp_path):
    world, args = DDP
    run = demo_training(world, args, 1)
    assert run.codes == [0] * world, run.codes
    result = replay(run.bundle, ranks=(1,), from_bundle=True, timeout=150, log_dir=tmp_path / "logs")
    assert result.exit_code == 0, stderr_of(result, 1) + result.card
    rep = result.report
    # every input is the recorded bytes, compared with the recording at every call
    assert rep["diverged"] is False and rep["inputs_made_up_calls"] == 0
    assert rep["synthetic_numerics"] is False and "numerics as recorded" in result.card
    assert [s["step"] for s in rep["steps"]] == [0, 1, 2]


def _bundle(path, calls, *, world=2):
    """A bundle of `world` ranks, each with the world group and `calls` (Collectives of group 0)."""
    with Rewrite(path) as rw:
        for rank in range(world):
            info = {"world_size": world, "rank": rank, "backend": "gloo", "device": "cpu"}
            head = [GroupInfo(start_ns=0, end_ns=0, step=0, group=0, ranks=tuple(range(world)), name="0",
                              text="default_pg", backend="gloo")]
            end = max(c.end_ns or c.start_ns for c in calls)
            rw.write_rank(rank, info, [head + list(calls) + [Step(start_ns=0, end_ns=end, step=0)]])
        rw.pack({}, manifest_extra={})
    return path


def _all_reduce(seq, start, end, shape=(4,)):
    return Collective(start_ns=start, end_ns=end, step=0, op="all_reduce", group=0, seq=seq, in_shapes=(shape,),
                      in_dtypes=("float32",), out_shapes=(shape,), out_dtypes=("float32",), reduce_op="SUM")


def test_a_bundle_no_program_could_be_is_refused_in_one_line(tmp_path):
    huge = _bundle(tmp_path / "huge.prism", [_all_reduce(0, 10, 20, shape=(1 << 40,))])
    backwards = _bundle(tmp_path / "backwards.prism", [_all_reduce(0, 10, 20), _all_reduce(1, 50, 30)])
    asleep = _bundle(tmp_path / "asleep.prism", [_all_reduce(0, 10, 20), _all_reduce(1, 2 * 3600 * 10**9, 2 * 3600 * 10**9 + 5)])
    for path, said in ((huge, "over 8 GiB"), (backwards, "negative duration"), (asleep, "7200 s of compute")):
        with pytest.raises(FormatError, match=said):
            replay(path, ranks="all", from_bundle=True, timeout=30)
    with pytest.raises(UsageError, match="runs no command"):
        replay(backwards, ranks=(0,), from_bundle=True, cmd=[sys.executable, "-c", "pass"])
    out = subprocess.run([*PRISM, "replay", str(huge), "--ranks", "0", "--from-bundle"], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 4 and out.stderr.count("\n") == 1, out.stderr
    assert "rank 0's recording cannot be run as a program" in out.stderr
    helped = subprocess.run([*PRISM, "replay", "--help"], capture_output=True, text=True, timeout=60)
    assert "--from-bundle" in helped.stdout
