"""Start N ranks on this machine the way torchrun would, without torchrun.

Used by the demo's tests and by the recorder and replayer to launch ranks:
the command is arbitrary, only the environment is torchrun's.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["describe_exit", "exit_code", "free_port", "kill_ranks", "main", "rank_env", "run_local"]

_POLL_S = 0.02
_TERM_GRACE_S = 3.0
_hurry = threading.Event()  # a second SIGINT or SIGTERM to `main`: SIGKILL the ranks now


def free_port() -> int:
    """A TCP port that was free a moment ago (rank 0's TCPStore binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world_size: int, master_port: int, run_id: str) -> dict[str, str]:
    """The variables torchrun's local agent gives one worker (single node, static rendezvous)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "ROLE_NAME": "default",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": run_id,
        # No agent here, so rank 0 must host the store itself.
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }


def kill_ranks(procs: Sequence[subprocess.Popen]) -> None:
    """SIGTERM each live rank's process group, then SIGKILL what is left."""
    live = [p for p in procs if p.poll() is None]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in live:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + _TERM_GRACE_S
        while time.monotonic() < deadline and not _hurry.is_set() and any(p.poll() is None for p in live):
            time.sleep(_POLL_S)
        live = [p for p in live if p.poll() is None]
        if not live:
            break
    for p in procs:
        p.wait()


def run_local(
    argv: Sequence[str],
    world_size: int,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float,
    cwd: str | os.PathLike[str] | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    kill_on_failure: bool = True,
) -> list[int]:
    """Run ``argv`` as ranks 0..world_size-1 and return their exit codes.

    Each rank gets this process's environment, then torchrun's variables
    (OMP_NUM_THREADS=1 unless already set, as torchrun does), then ``env``.
    With ``log_dir`` each rank's stdout and stderr go to
    ``log_dir/rank{R}.stdout`` and ``rank{R}.stderr``; otherwise they are
    inherited. Like torchrun, the first rank to exit non-zero gets the others
    killed (they would hang in their next collective) unless
    ``kill_on_failure`` is False. Past ``timeout`` seconds every rank is killed
    and TimeoutError is raised.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, not {world_size}")
    port, run_id = free_port(), f"prism-{uuid.uuid4().hex[:12]}"
    logs = Path(log_dir) if log_dir is not None else None
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)

    procs: list[subprocess.Popen] = []
    files: list = []
    try:
        for rank in range(world_size):
            procs.append(_start_rank(argv, rank, world_size, port, run_id, env, cwd, logs, files))
        return _wait_ranks(procs, argv, timeout, kill_on_failure)
    finally:
        # Also on KeyboardInterrupt or a failed Popen: leave no rank behind.
        if any(p.poll() is None for p in procs):
            kill_ranks(procs)
        for f in files:
            f.close()


def _start_rank(argv: Sequence[str], rank: int, world_size: int, port: int, run_id: str,
                env: Mapping[str, str] | None, cwd, logs: Path | None, files: list) -> subprocess.Popen:
    """Start one rank with torchrun's environment, in a session of its own; its log
    files, where there are logs, are added to `files` (the caller closes them)."""
    child_env = dict(os.environ)
    child_env.setdefault("OMP_NUM_THREADS", "1")
    child_env.update(rank_env(rank, world_size, port, run_id))
    child_env.update(env or {})
    out = err = None
    if logs is not None:
        out = open(logs / f"rank{rank}.stdout", "wb")
        err = open(logs / f"rank{rank}.stderr", "wb")
        files += [out, err]
    # Own session per rank so a kill reaches anything the rank started.
    return subprocess.Popen(list(argv), env=child_env, cwd=cwd, stdout=out, stderr=err, start_new_session=True)


def _wait_ranks(procs: list[subprocess.Popen], argv: Sequence[str], timeout: float, kill_on_failure: bool) -> list[int]:
    """Wait for every rank to exit and return their exit codes; the first to fail gets the
    others killed (with `kill_on_failure`), and past `timeout` seconds all are killed and
    TimeoutError raised."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return [int(c) for c in codes]
        if kill_on_failure and any(c not in (None, 0) for c in codes):
            kill_ranks(procs)
            return [int(p.returncode) for p in procs]
        if time.monotonic() > deadline:
            kill_ranks(procs)
            raise TimeoutError(f"{len(procs)} ranks of {list(argv)!r} still running after {timeout:g}s")
        time.sleep(_POLL_S)


def exit_code(codes: Sequence[int]) -> int:
    """The ranks' exit codes as one, a shell's way (128 + N for signal N): that of the
    first rank that failed on its own. A rank that exited non-zero comes first; then one
    ended by a signal the launcher does not send (SIGABRT, SIGSEGV, ...), then SIGKILL (the
    launcher sends it only to a rank that outlived SIGTERM's grace), then SIGTERM."""
    for c in codes:
        if c > 0:
            return c
    killed_by_us = {-signal.SIGTERM: 2, -signal.SIGKILL: 1}
    died = sorted((killed_by_us.get(c, 0), rank) for rank, c in enumerate(codes) if c < 0)
    return 128 - codes[died[0][1]] if died else 0


def describe_exit(code: int) -> str:
    """An exit code as a person reads it: '134 (SIGABRT)' for 128 + a signal's number."""
    if code > 128:
        try:
            return f"{code} ({signal.Signals(code - 128).name})"
        except ValueError:
            pass
    return str(code)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m prism_rr.localrun --nproc N [--timeout S] -- CMD...`: torchrun's
    environment for N local ranks, without torchrun's agent (faster to start).

    SIGINT or SIGTERM (even where this process was started with SIGINT ignored, as a
    shell starts a background job) stops every rank: SIGTERM, then SIGKILL after
    _TERM_GRACE_S, or at once on a second signal; the exit code is the first failing rank's.
    """
    p = argparse.ArgumentParser(prog="python -m prism_rr.localrun")
    p.add_argument("--nproc", type=int, required=True)
    p.add_argument("--timeout", type=float, default=24 * 3600.0)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        p.error("give the command after --")

    def stop(signum, frame):
        if stopping:  # never a second KeyboardInterrupt: it would cut kill_ranks short
            _hurry.set()
            return
        stopping.append(signum)
        raise KeyboardInterrupt

    stopping: list[int] = []
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        codes = run_local(cmd, args.nproc, timeout=args.timeout)
    except KeyboardInterrupt:
        return 128 + stopping[0] if stopping else 130
    except TimeoutError as exc:
        print(f"prism-rr launch: {exc}", file=sys.stderr)
        return 124
    # A rank that failed on its own says more than the ranks killed because of it.
    return exit_code(codes)


if __name__ == "__main__":
    raise SystemExit(main())
