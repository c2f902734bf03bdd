"""Run a test job of 2 ranks with Flight Recorder on until every rank has dumped its ring.

    python tests/replayer/scripts/fr_job.py OUT SCRIPT [ARGS...]

SCRIPT's ranks run on gloo with TORCH_FR_BUFFER_SIZE=2000, FR_DUMPS=OUT and JOB_HOLD=1
(fr_watchdog.py): each dumps its ring once it stops moving, hung or done, into
OUT/pickle/nccl_trace_rank_<r> and OUT/json/nccl_trace_rank_<r>.json; then the job, which
never ends on its own, is ended. tests/data/fr/hang is `fr_job.py tests/data/fr/hang
tests/replayer/scripts/fr_hang.py`.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

WORLD = 2


def run_job(out: Path, argv: list[str], limit: float = 120.0) -> None:
    out = Path(out).resolve()
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE="2000", FR_DUMPS=str(out), JOB_HOLD="1", OMP_NUM_THREADS="1")
    # localrun ends its ranks when it is ended (SIGTERM), or on its own past its timeout
    cmd = [sys.executable, "-m", "prism_rr.localrun", "--nproc", str(WORLD), "--timeout", str(limit + 60), "--",
           sys.executable, *argv]
    job = subprocess.Popen(cmd, env=env, start_new_session=True)
    want = [out / "pickle" / f"nccl_trace_rank_{r}" for r in range(WORLD)]
    want += [out / "json" / f"nccl_trace_rank_{r}.json" for r in range(WORLD)]
    deadline = time.monotonic() + limit
    try:
        while not all(p.exists() for p in want):
            if job.poll() is not None:
                raise SystemExit(f"the job ended (exit {job.returncode}) before every rank dumped")
            if time.monotonic() > deadline:
                raise SystemExit(f"no dumps of every rank after {limit} s")
            time.sleep(0.1)
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(job.pid, sig)
                job.wait(10)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue


if __name__ == "__main__":
    run_job(Path(sys.argv[1]), sys.argv[2:])
