"""The claim in the name: rank 0 of an 8192-rank job replayed by one process on this machine.

The demo's recording (FSDP2 dp2 x tp2 at world 4, steps 1-3: the session's `make demo`
run, tests/conftest.py) is scaled to dp=2 (world 4, the same path) and to dp=4096
(world 8192), and rank 0 of each is replayed with one real process. At 8192 it
completes without divergence, every call checked: FSDP2's padded shard shapes on the
resized dp group follow from the per-parameter layout the recorder noted. The
replayer's peak memory stays within 1.5x of world 4. Times are not asserted.
"""

import json
import subprocess
import sys

import pytest

from prism_rr.format import Collective, open_bundle

_MAXRSS = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, p.returncode)")


def _replay(bundle, report, dp: int, *, from_bundle: bool = False) -> int:
    """Peak RSS (KiB) of the replay's processes (the launcher and the replayed rank), which
    runs the demo, or with `from_bundle` the bundle as its program (issue 39).

    `--timing none`: virtual peers do not wait out the recorded times, which are those of
    a demo recorded beside other tests; every call is checked all the same."""
    cmd = [sys.executable, "-m", "prism_rr.cli", "replay", str(bundle), "--ranks", "0",
           "--report", str(report), "--timeout", "60", "--timing", "none"]
    if from_bundle:
        cmd.append("--from-bundle")
    else:
        cmd += ["--", sys.executable, "-m", "prism_rr.demo.train", "--steps", "4", "--tp", "2", "--quiet",
                "--batch-size", str(4 * dp)]
    out = subprocess.run([sys.executable, "-c", _MAXRSS, *cmd], capture_output=True, text=True, timeout=70)
    rss, code = out.stdout.split()[-2:]
    assert int(code) == 0, out.stderr[-3000:]
    return int(rss)


@pytest.mark.timeout(480)  # the demo's 300 s (DEMO_TIMEOUT), when this test is the first to ask for it
def test_replay_rank0_of_world_8192(tmp_path, make_demo):
    out = make_demo.result()
    assert out.returncode == 0, out.stderr[-3000:]
    rec = make_demo.bundle
    rss, facts = {}, {}
    for dp in (2, 4096):
        big = tmp_path / f"dp{dp}.prism"
        out = subprocess.run([sys.executable, "-m", "prism_rr.cli", "scale", str(rec), "--dp", str(dp), "-o", str(big)],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        report = tmp_path / f"dp{dp}.json"
        rss[dp] = _replay(big, report, dp)
        facts[dp] = f = json.loads(report.read_text())
        assert f["world_size"] == 2 * dp and f["exit_code"] == 0
        assert f["diverged"] is False and f["first_divergence"] is None and f["divergences"] == 0
        assert [s["step"] for s in f["steps"]] == [1, 2, 3]
        # set-up before the first step is reported, with the replayer's own share of it
        assert 0 < f["replayer_setup_s"] < f["setup_s"]
    assert facts[2]["predicted_shape_calls"] == 0  # nothing resized: every shape checked
    # At world 8192 the replay predicts another run than the recorded one, and says so.
    assert facts[2]["mode"] == "fidelity"
    p = facts[4096]["prediction"]
    assert facts[4096]["mode"] == "prediction" and p["world_size"] == 8192 and p["recorded_world_size"] == 4
    assert p["peak_memory_bytes"] == facts[4096]["peak_memory_replayed_bytes"]
    # Resized: FSDP2's gathers and scatters have exact shapes from the recorded layout,
    # so they too are checked (a wrong shape would have stopped the replay).
    assert facts[4096]["predicted_shape_calls"] == 0
    with open_bundle(tmp_path / "dp4096.prism") as b:
        assert b.manifest["scale"]["predicted_shapes"] == 0
        ag = next(r for r in b.events(0) if isinstance(r, Collective) and r.op == "all_gather_into_tensor")
        assert ag.out_shapes[0][0] == 4096 * ag.in_shapes[0][0]
    assert rss[4096] <= 1.5 * rss[2], rss  # memory grows with roles, not with the world
    # The bundle as the program: rank 0 of dp 4096 makes its predicted calls, every one checked
    rss["bundle"] = _replay(tmp_path / "dp4096.prism", tmp_path / "bundle.json", 4096, from_bundle=True)
    f = json.loads((tmp_path / "bundle.json").read_text())
    assert f["exit_code"] == 0 and f["diverged"] is False and f["predicted_shape_calls"] == 0
    assert [s["step"] for s in f["steps"]] == [1, 2, 3] and f["mode"] == "prediction"
    assert rss["bundle"] <= 1.5 * rss[2], rss
