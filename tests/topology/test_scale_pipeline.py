"""Pipelining recorded with digests (the default), replayed, then scaled and replayed.

The pipeline stages' first exchange is a one-element handshake whose value steers the
program; a `digest` recording keeps such small messages whole, and `scale` carries them
to the larger world, so neither replay makes them up and takes another branch.
"""

import json
import subprocess
import sys

import pytest

TRAIN = [sys.executable, "-m", "prism_rr.demo.train", "--steps", "3", "--pp", "2", "--quiet"]


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "prism_rr.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(240)
def test_pipeline_from_digests_replays_at_recorded_and_larger_scale(tmp_path):
    rec = tmp_path / "pp.prism"
    out = _cli("record", "-o", rec, "--nproc", "4", "--", *TRAIN)  # dp2 x pp2
    assert out.returncode == 0, out.stderr[-3000:]
    report = tmp_path / "r0.json"
    out = _cli("replay", rec, "--ranks", "0", "--report", report, "--timeout", "90", "--", *TRAIN)
    assert out.returncode == 0, out.stderr[-3000:]
    facts = json.loads(report.read_text())
    assert facts["diverged"] is False and len(facts["steps"]) == 3

    big = tmp_path / "big.prism"
    out = _cli("scale", rec, "--dp", "4", "-o", big)  # world 8
    assert out.returncode == 0, out.stderr
    report = tmp_path / "big1.json"
    out = _cli("replay", big, "--ranks", "1", "--report", report, "--timeout", "90", "--",
               *TRAIN, "--batch-size", "16")
    assert out.returncode == 0, out.stderr[-3000:]
    facts = json.loads(report.read_text())
    assert facts["world_size"] == 8 and facts["diverged"] is False and len(facts["steps"]) == 3
