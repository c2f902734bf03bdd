"""Flight mode in real gloo ranks: nothing written until a trigger, then every rank's
last K steps in one bundle (recorder/_flight.py, format/ring.py)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prism_rr.format.reader import open_bundle
from prism_rr.format.records import Collective, Step
from prism_rr.recorder import RecordOptions
from prism_rr.recorder.launch import hook_env

from tests.cli_helpers import run_cli

SCRIPT = Path(__file__).parent / "scripts" / "flight.py"
HANG_S = 2.0


def _start_env_mode(tmp_path: Path, mode: str, steps: int, **flight) -> tuple[subprocess.Popen, Path]:
    """The ranks under PRISM_RR_RECORD alone (a launcher that cannot be wrapped)."""
    out = tmp_path / "run.prism"
    options = RecordOptions.make(tmp_path / "run.prism.d", payload="digest", output=str(out), **flight)
    env = dict(os.environ)
    env.update(hook_env(options, env))
    cmd = [sys.executable, "-m", "prism_rr.localrun", "--nproc", "2", "--",
           sys.executable, str(SCRIPT), mode, str(tmp_path), str(steps)]
    return subprocess.Popen(cmd, env=env, start_new_session=True), out


def _wait_for(path: Path, proc: subprocess.Popen, limit: float) -> float:
    t0 = time.monotonic()
    while not path.exists():
        if time.monotonic() - t0 > limit:
            _stop(proc)
            raise AssertionError(f"no {path.name} after {limit} s")
        time.sleep(0.1)
    return time.monotonic() - t0


def _stop(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(10)
            return
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue


def _stuck_since(tmp_path: Path, step: int) -> float:
    """Wait until both ranks reached `step` (rank 1 then hangs or dies); when."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120:
        try:
            if all(int((tmp_path / f"step-{r}").read_text() or -1) >= step for r in (0, 1)):
                return time.monotonic()
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError("the ranks never reached the planted step")


def test_a_hang_dumps_every_rank_last_steps_within_the_hang_time(tmp_path):
    steps, keep = 12, 3
    proc, out = _start_env_mode(tmp_path, "hang", steps, flight=keep, flight_hang=HANG_S)
    try:
        stuck = _stuck_since(tmp_path, steps - 1)
        spool_dir = tmp_path / "run.prism.d"
        assert sorted(p.suffix for p in spool_dir.iterdir()) == [".crash", ".crash", ".ring", ".ring"], \
            "flight mode writes nothing but its rings before a trigger"
        _wait_for(out, proc, 60)
        after = time.monotonic() - stuck
        assert proc.poll() is None  # the job still hangs: the bundle came from the trigger
    finally:
        _stop(proc)
    print(f"bundle {after:.1f} s after the hang began (hang time {HANG_S} s)")
    with open_bundle(out) as b:
        flight = b.manifest["flight"]
        assert flight["trigger"] == "hang" and list(flight["ranks_dumped"]) == [0, 1] and not flight["ranks_missing"]
        assert flight["details"]["op"] == "all_reduce"
        for r in (0, 1):
            recs = list(b.events(r))
            kept = sorted({x.step for x in recs if isinstance(x, Step)})
            assert kept and kept[-1] == steps - 2 and kept[0] >= steps - 1 - keep - 1, kept
            assert 0 not in kept  # older steps went out of the ring
        hung = [x for x in b.events(0) if isinstance(x, Collective) and x.end_ns is None]
        assert hung and hung[0].op == "all_reduce"
    r = run_cli("diagnose", out, "--json")
    findings = json.loads(r.stdout)["findings"]
    hang = [f for f in findings if f["kind"] == "hang"]
    assert hang and list(hang[0]["ranks"]) == [1], findings
    assert run_cli("verify", out).returncode == 0
