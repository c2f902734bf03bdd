"""Run a training command with the recording hook: `record_command(cmd, out)`.

CMD is whatever starts the Python ranks (`torchrun ... train.py`, `python train.py`
under an existing torchrun environment, a cluster launcher). Each Python process it
starts imports our sitecustomize first; the ranks record into `<out>.d/`.

Many nodes: the same `record -o run.prism -- torchrun --nnodes N --node-rank i ...` runs
on every node, and OUTPUT.d/ may be one directory of a shared file system. So a node's
ranks record into a directory of their own, `<out>.d/node-<name>/`, and a node clears
only that directory: no node deletes or overwrites another's spools, blobs or run.json.
The name is torchrun's node rank (`--node-rank i`, or PET_NODE_RANK as torchrun reads
it) when CMD is a torchrun launch of more than one node (`--nnodes N`, N > 1, or a
range A:B with B > 1), or what `node=` gives (`record --node NAME`, for launchers we do
not parse); an elastic launch without a node rank is named by its host. A single-node
run keeps the flat layout, `<out>.d/rank-*.spool`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prism_rr._version import __version__
from prism_rr.errors import UsageError
from prism_rr.format.blobs import host_packs
from prism_rr.format.compactor import recover_logs
from prism_rr.recorder._options import ENV_VAR, RecordOptions, spool_dir_for
from prism_rr.topology.roles import parse_mesh

__all__ = ["HOOK_DIR", "RecordRequest", "hook_env", "launch_node", "node_spool_dir", "record_command", "spool_dir_for"]

HOOK_DIR = Path(__file__).resolve().parents[1] / "_hook"  # shared with the replayer
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
_GRACE_S = 5.0
# After a SIGINT or SIGTERM to `record`: the command's time to end on its own (localrun's
# ranks flush and end within about a second of its SIGTERM), then half as long after our
# SIGTERM before SIGKILL: `record` ends a few seconds after Ctrl-C, whatever the ranks are in.
_INTERRUPT_GRACE_S = 2.0
_POLL_S = 0.05


def hook_env(options: RecordOptions, base: dict | None = None) -> dict[str, str]:
    """The environment variables that make Python processes record with `options`."""
    base = os.environ if base is None else base
    path = [str(HOOK_DIR)]
    if base.get("PYTHONPATH"):
        path.append(base["PYTHONPATH"])
    path.append(str(_PACKAGE_ROOT))  # the ranks find prism_rr even from another sys.path
    return {ENV_VAR: options.to_json(), "PYTHONPATH": os.pathsep.join(path)}


_LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")
# torchrun's options that take no value; every other option takes one.
_TORCHRUN_FLAGS = frozenset({"-h", "--help", "--standalone", "-m", "--module", "--no-python", "--no_python",
                             "--run-path", "--run_path", "--virtual-local-rank", "--virtual_local_rank"})
_NODE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def launch_node(cmd: list[str], node: str | None = None, environ=None) -> str | None:
    """The name of this node's spool directory (`node-<name>`), or None for a single-node run.

    `node` given: that name. Else, when `cmd` is a torchrun launch (`torchrun`, or
    `-m torch.distributed.run`/`launch`) of more than one node, its node rank; an elastic
    launch without one (the rendezvous assigns it) is named by this host.
    """
    if node is not None:
        name = _clean_name(node)
        if not name:
            raise UsageError(f"--node {node!r}: give a name of letters, digits, '.', '_' or '-'")
        return name
    environ = os.environ if environ is None else environ
    args = _torchrun_args(list(cmd))
    if args is None:
        return None
    nnodes = args.get("--nnodes", environ.get("PET_NNODES", "1"))
    try:
        most = max(int(n) for n in str(nnodes).split(":"))
    except ValueError:
        return None
    if most <= 1:
        return None
    rank = args.get("--node-rank", args.get("--node_rank", environ.get("PET_NODE_RANK")))
    if rank is not None and str(rank).strip().isdigit():
        return str(int(rank))
    return _clean_name(socket.gethostname()) or "host"


def _clean_name(name) -> str:
    """A name safe as one path component on any file system."""
    return _NODE_NAME.sub("_", str(name)).strip("._")[:100]


def _torchrun_args(cmd: list[str]) -> dict[str, str] | None:
    """torchrun's own options in `cmd` (those before the script), or None if it is no torchrun launch."""
    for i, token in enumerate(cmd):
        if os.path.basename(token) == "torchrun":
            rest = cmd[i + 1:]
            break
        if token == "-m" and i + 1 < len(cmd) and cmd[i + 1] in _LAUNCHERS:
            rest = cmd[i + 2:]
            break
    else:
        return None
    args, it = {}, iter(rest)
    for token in it:
        if token == "--" or not token.startswith("-"):
            break  # the training script and its own arguments
        if "=" in token:
            name, value = token.split("=", 1)
            args[name] = value
        elif token not in _TORCHRUN_FLAGS:
            args[token] = next(it, "")
    return args


def node_spool_dir(out, node: str | None) -> Path:
    """Where this node's ranks write: `<out>.d/node-<node>/`, or `<out>.d/` for a single node."""
    spool_dir = spool_dir_for(out)
    return spool_dir / f"node-{node}" if node is not None else spool_dir


def _clear_old_spools(spool_dir: Path) -> None:
    """Remove an earlier recording's files from this node's own directory (never another's)."""
    for pattern in ("rank-*.spool*", "rank-*.log", "rank-*.crash"):
        for p in spool_dir.glob(pattern):
            p.unlink()

    for p in host_packs(spool_dir):  # this node's payload packs
        p.unlink()
    run = spool_dir / "run.json"
    if run.exists():
        run.unlink()
    for d in spool_dir.glob("flight-*"):  # an earlier run's flight dumps: never packed with this run's rings
        if d.is_dir():
            shutil.rmtree(d, ignore_errors=True)


def _write_run(spool_dir: Path, facts: dict) -> None:
    tmp = spool_dir / f"run.json.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, spool_dir / "run.json")
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordRequest:
    """One recording as the launcher runs it: the command, the bundle it is for, this
    node's name among many, and the options every rank records with, placed in this
    node's spool directory. `make` builds it; the launcher serialises its options."""

    cmd: tuple[str, ...]  # as run: with --nproc, localrun's command around the user's
    output: Path
    options: RecordOptions  # placed: spool_dir is this node's directory, resolved
    spool_dir: Path  # this node's directory as the output was named (for messages)
    node: str | None = None  # this node's name in a multi-node job; None: a single node
    timeout: float | None = None  # seconds before the command is stopped

    @classmethod
    def make(cls, cmd, output, options: RecordOptions | None = None, *, nproc: int = 0, node: str | None = None,
             timeout: float | None = None, **fields) -> RecordRequest:
        """The recording of `cmd` into `output` with `options` (or RecordOptions of
        `fields`, specs as users write them). `nproc` > 0 starts that many local ranks
        with torchrun's environment around `cmd`. The node and its spool directory are
        found here, once (`launch_node`, `node_spool_dir`)."""
        if not cmd:
            raise UsageError("give the training command after --, e.g. prism-rr record -o run.prism -- torchrun ...")
        if nproc < 0:
            raise UsageError("--nproc must be 0 or more")
        if options is None:
            options = RecordOptions(**fields)
        elif fields:
            raise TypeError(f"give the options or their fields, not both: {sorted(fields)}")
        if options.slice is not None and nproc:

            parse_mesh(options.mesh or "", nproc)  # a wrong layout fails now, not in every rank
        cmd = list(cmd)
        if nproc:
            cmd = [sys.executable, "-m", "prism_rr.localrun", "--nproc", str(nproc), "--", *cmd]
        output = Path(output)
        name = launch_node(cmd, node)
        spool_dir = node_spool_dir(output, name)
        return cls(cmd=tuple(cmd), output=output, options=options.placed(spool_dir.resolve(), output),
                   spool_dir=spool_dir, node=name, timeout=timeout)

    @property
    def flight(self) -> bool:
        return self.options.flight is not None


def record_command(cmd, out, *, request: RecordRequest | None = None,
                   interrupted: Callable[[dict], None] | None = None, **fields) -> int:
    """Run `cmd` recording into `<out>.d/` (one node of many: `<out>.d/node-<name>/`, see
    `launch_node`); return its exit code (128+N if killed by signal N). `request` is the
    recording as `RecordRequest.make` built it (of this `cmd` and `out`); without it, one
    is made here of `fields` (RecordRequest.make's: nproc, node, timeout, and
    RecordOptions' fields).

    SIGINT and SIGTERM sent to this process are passed on to the command's process
    group, as a terminal passes Ctrl-C to a job; the command then has
    _INTERRUPT_GRACE_S to end, after which it is stopped as after `timeout`: SIGTERM
    (ranks flush their spools, calls still open included), then SIGKILL. run.json notes
    the first such signal (`interrupted`), and `interrupted(facts)` hears of it at once.
    """
    if request is None:
        request = RecordRequest.make(cmd, out, **fields)
    elif fields:
        raise TypeError(f"give the request or its fields, not both: {sorted(fields)}")
    spool_dir = Path(request.options.spool_dir)
    spool_dir.mkdir(parents=True, exist_ok=True)
    _clear_old_spools(spool_dir)
    env = dict(os.environ)
    env.update(hook_env(request.options, env))
    facts = _run_facts(request)
    _write_run(spool_dir, facts)
    code, timed_out = _run(list(request.cmd), env, request.timeout, facts, interrupted)
    if not request.flight:
        # A rank that died left its call log: what it holds joins its spool now.

        recover_logs(spool_dir)
    facts.update(ended_wall_ns=time.time_ns(), exit_code=code, timed_out=timed_out)
    try:
        _write_run(spool_dir, facts)
    except OSError:
        # A full disk: the run.json of the start stands, and the program's exit code is
        # what the caller must see (packing, which needs room too, says what went wrong).
        pass
    return code


def _run_facts(request: RecordRequest) -> dict:
    """What run.json says of a recording as it starts (the command, where, the options)."""

    facts = {
        "command": list(request.cmd),
        "cwd": os.getcwd(),
        "hostname": socket.gethostname(),
        "options": json.loads(request.options.to_json()),
        "prism_rr_version": __version__,
        "started_wall_ns": time.time_ns(),
    }
    if request.node is not None:
        facts["node"] = request.node
    return facts


def _run(cmd: list[str], env: dict, timeout: float | None, facts: dict, interrupted) -> tuple[int, bool]:
    """Run the command in a session of its own to its end: (its exit code, 128+N if
    killed by signal N; whether `timeout` passed first). The first SIGINT or SIGTERM to
    this process goes in `facts["interrupted"]`: which, when, and the signal the command
    had to be stopped with (`forced`) where it did not end in time."""
    started = time.monotonic()
    proc = subprocess.Popen(list(cmd), env=env, start_new_session=True)
    got: list[tuple[int, float]] = []  # (signal, monotonic time) of each SIGINT/SIGTERM to us
    previous = {}

    def forward(signum, frame):
        got.append((signum, time.monotonic()))
        _signal_group(proc, signum)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, forward)
    try:
        timed_out, forced = _wait(proc, timeout, got, started, facts, interrupted)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:
            _stop(proc)
    _note_interrupt(got, started, facts, interrupted)
    if forced is not None:
        facts["interrupted"]["forced"] = forced
    code = proc.returncode
    return (128 - code if code < 0 else code), timed_out


def _wait(proc: subprocess.Popen, timeout: float | None, got: list, started: float, facts: dict,
          interrupted) -> tuple[bool, str | None]:
    """Wait for the command to end: (whether `timeout` passed first, the last signal the
    command had to be stopped with after an interrupt, or None). From the first signal in
    `got` on, the command has _INTERRUPT_GRACE_S to end on its own."""
    deadline = None if timeout is None else started + timeout
    while proc.poll() is None:
        now = time.monotonic()
        _note_interrupt(got, started, facts, interrupted)
        if got and now >= got[0][1] + _INTERRUPT_GRACE_S:
            return False, _stop(proc, _INTERRUPT_GRACE_S / 2)
        if deadline is not None and now >= deadline:
            _stop(proc)
            return True, None
        time.sleep(_POLL_S)
    return False, None


def _note_interrupt(got: list, started: float, facts: dict, interrupted) -> None:
    """The first signal of `got`, noted in `facts` once (and told to `interrupted`)."""
    if not got or "interrupted" in facts:
        return
    signum, at = got[0]
    facts["interrupted"] = {"signal": signal.Signals(signum).name, "after_s": round(at - started, 3)}
    if interrupted is not None:
        interrupted(dict(facts["interrupted"]))


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """`sig` to every process of the command's group (its own session: its pid names it)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(proc: subprocess.Popen, grace: float = _GRACE_S) -> str | None:
    """SIGTERM the command's process group, then SIGKILL what is left; the last signal
    sent (None: the command had ended already)."""
    sent = None
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            break
        _signal_group(proc, sig)
        sent = signal.Signals(sig).name
        try:
            proc.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    return sent
