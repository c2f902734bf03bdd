"""Run a training command with the recording hook: `record_command(cmd, out)`.

CMD is whatever starts the Python ranks (`torchrun ... train.py`, `python train.py`
under an existing torchrun environment, a cluster launcher). Each Python process it
starts imports our sitecustomize first; the ranks record into `<out>.d/`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from prism_rr.recorder._options import ENV_VAR, RecordOptions, spool_dir_for

__all__ = ["HOOK_DIR", "hook_env", "record_command", "spool_dir_for"]

HOOK_DIR = Path(__file__).resolve().parents[1] / "_hook"  # shared with the replayer
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
_GRACE_S = 5.0


def hook_env(options: RecordOptions, base: dict | None = None) -> dict[str, str]:
    """The environment variables that make Python processes record with `options`."""
    base = os.environ if base is None else base
    path = [str(HOOK_DIR)]
    if base.get("PYTHONPATH"):
        path.append(base["PYTHONPATH"])
    path.append(str(_PACKAGE_ROOT))  # the ranks find prism_rr even from another sys.path
    return {ENV_VAR: options.to_json(), "PYTHONPATH": os.pathsep.join(path)}


def _clear_old_spools(spool_dir: Path) -> None:
    for p in spool_dir.glob("rank-*.spool*"):
        p.unlink()
    run = spool_dir / "run.json"
    if run.exists():
        run.unlink()


def _write_run(spool_dir: Path, facts: dict) -> None:
    tmp = spool_dir / f"run.json.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, spool_dir / "run.json")
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def record_command(
    cmd: list[str],
    out: Path,
    *,
    steps=None,
    ranks=None,
    payload: str = "digest",
    ops: bool = False,
    memory: bool = False,
    slice: str | None = None,
    mesh: str | None = None,
    timeout: float | None = None,
) -> int:
    """Run `cmd` recording into `<out>.d/`; return its exit code (128+N if killed by signal N).

    SIGINT and SIGTERM sent to this process are passed on to the command. Past
    `timeout` seconds the command gets SIGTERM (ranks flush their spools, calls still
    open included), then SIGKILL.
    """
    from prism_rr import __version__

    out = Path(out)
    spool_dir = spool_dir_for(out)
    spool_dir.mkdir(parents=True, exist_ok=True)
    _clear_old_spools(spool_dir)
    options = RecordOptions.make(spool_dir.resolve(), payload=payload, steps=steps, ranks=ranks,
                                 ops=ops, memory=memory, slice=slice, mesh=mesh)
    env = dict(os.environ)
    env.update(hook_env(options, env))
    facts = {
        "command": list(cmd),
        "cwd": os.getcwd(),
        "hostname": socket.gethostname(),
        "options": json.loads(options.to_json()),
        "prism_rr_version": __version__,
        "started_wall_ns": time.time_ns(),
    }
    _write_run(spool_dir, facts)

    proc = subprocess.Popen(list(cmd), env=env, start_new_session=True)
    previous = {}

    def forward(signum, frame):
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, forward)
    timed_out = False
    try:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop(proc)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:
            _stop(proc)
    code = proc.returncode
    code = 128 - code if code < 0 else code
    facts.update(ended_wall_ns=time.time_ns(), exit_code=code, timed_out=timed_out)
    try:
        _write_run(spool_dir, facts)
    except OSError:
        # A full disk: the run.json of the start stands, and the program's exit code is
        # what the caller must see (packing, which needs room too, says what went wrong).
        pass
    return code


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the command's process group, then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue
