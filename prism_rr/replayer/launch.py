"""Replay a bundle: run the selected ranks for real, the others as virtual peers.

    result = replay("run.prism", ranks=(0,), cmd=["python", "train.py"], report="fidelity.json")

Each selected rank runs `cmd` (or, only when asked with `run_recorded_command=True`, the
command and working directory the bundle names) with the environment torchrun would have
given it in the recorded world, and a start-up hook that makes `init_process_group`/
`new_group` build replay groups. The real ranks meet on their own store; the recorded
world's other ranks exist only as recordings. Of the environment a bundle names, only the
names in `_environment.REPLAY_ENV` reach a replayed rank (FORMAT.md, "Environment
allow-list"): a bundle may come from a stranger.

Across nodes, a launcher starts the real ranks instead (`cmd` is torchrun):

    result = replay("run.prism", ranks="0-15", cmd=["torchrun", "--nnodes", "2", "--node-rank", i,
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", "HOST:PORT", "--nproc-per-node", "8",
                    "train.py"])

on every node, the same but for the node rank; see `replay` and _torchrun.py.

`launcher` (default: whether `cmd` is `torchrun ...` or `python -m torch.distributed.run
...`): run `cmd` once, as a launcher that starts one worker per real rank, perhaps on
several nodes, instead of starting the ranks here. Run the same replay (same bundle,
ranks and command but for torchrun's --node-rank) on every node; torchrun's rendezvous
makes the real ranks' world, and its worker RANK i replays recorded rank ranks[i],
whichever node it runs on (see _torchrun.py for the environment it sees). The real
ranks meet on torchrun's store; through it every node gathers every real rank's results,
so each node's report covers them all (those that did not arrive within a bounded wait
are in the report's `unreported`). A node's workers have one exit code, torchrun's.

`attempt`: which attempt of a restarted job to replay (default: the bundle's default
one, the last that failed, else the last); each real rank runs as that attempt's did
(its TorchElastic restart count), and the report says which (`attempt`). A rank that
failed in the recording and fails again keeps its exit code; the report says how it
ended in the recording (`stopped_early[].recorded_exit`).

A recording of a hang (`import fr` of Flight Recorder dumps, flight mode's dump on a
hang, a windowed recording) ends in the report's `hang` (exit 7): a real rank made a
call that a virtual peer never joined in the recording, or its program ended while a
virtual peer waits in a call with it that it never made. A call that completes one
every virtual peer waits in resolves it (`resolved`), and the replay goes on.

A recording that ended in a failure (a rank's program failed, crashed or was killed)
ends its replay the same way (exit 7, the report's `hang`; _hang.py lists the kinds):
at the first mispaired call of a drift, at a mismatch's call (diagnose's findings,
`_recorded_endings`), at a call that ended in an error (raised again) or never
completed, past where the rank's program stopped; a real rank that fails as it did is
the failure reproduced (`reproduced`).

`from_bundle`: no program of the user's: each real rank runs the driver
(`python -m prism_rr.replayer.driver`, driver.py), which makes that rank's recorded
calls through torch.distributed, with its recorded compute between them. Every real
rank's recording is read as a program first (_program.py): one that no program could
be is refused (FormatError) before any rank starts. `ranks="all"`: every rank real.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from prism_rr._version import __version__
from prism_rr.errors import UsageError
from prism_rr.format import open_bundle, pack
from prism_rr.text import shown
from prism_rr.localrun import exit_code, free_port, kill_ranks, rank_env
from prism_rr.recorder.launch import spool_dir_for
from prism_rr.replayer._environment import check_environment, replay_env
from prism_rr.replayer._fidelity import card, fidelity_report, same_end
from prism_rr.replayer._hang import failed, recorded_exit
from prism_rr.replayer._options import ENV_VAR, TIMINGS, ReplayOptions, ReplayRequest, stats_path
from prism_rr.replayer._program import program_of
from prism_rr.replayer._replace import plan_replacements
from prism_rr.replayer._torchrun import LAUNCHER_VARS, is_launcher, launcher_shape
from prism_rr.specs import format_ranks, parse_ranks, parse_slow_rank
from prism_rr.topology.roles import Roles
from prism_rr.topology.scale import scale

# Deferred imports: prism_rr.analysis (numpy), only where a recording that failed is diagnosed.

__all__ = ["HOOK_DIR", "INCOMPLETE", "TIMINGS", "ReplayRequest", "ReplayResult", "parse_slow_rank",
           "rank_command", "recorded_commands", "replay"]

log = logging.getLogger("prism_rr.replayer")

HOOK_DIR = Path(__file__).resolve().parents[1] / "_hook"  # shared with the recorder
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
_POLL_S = 0.02
DIVERGED = 3
INCOMPLETE = 6  # the program ended (exit 0) before making the calls the recording holds
HUNG = 7  # the replay reached the end of a recorded hang (_hang.py)
TIMED_OUT = 124


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayResult:
    """How a replay ended and what the fidelity report says."""

    exit_code: int  # 0 ok, 3 diverged, 6 incomplete, 7 a recorded hang, 124 timed out, else the first failing rank's
    rank_codes: dict[int, int]
    report: dict
    card: str
    timed_out: bool = False
    log_dir: Path | None = None
    commands: dict[int, list[str]] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()  # environment differences the replay went on despite
    output: Path | None = None  # the replay's own recording (-o)

    @property
    def diverged(self) -> bool:
        return bool(self.report.get("diverged"))


def rank_command(info: dict) -> list[str]:
    """The command a recorded rank ran: its interpreter and arguments (`-m` included)."""
    raw = info.get("orig_argv") or info.get("argv") or []
    if not isinstance(raw, (list, tuple)) or not all(isinstance(a, str) and "\0" not in a for a in raw):
        raise UsageError(f"the bundle's command of rank {info.get('rank')} is not a list of strings; give a command")
    argv = list(raw)
    if not argv:
        raise UsageError(f"the bundle does not say what rank {info.get('rank')} ran; give a command")
    exe = info.get("executable")
    if not (isinstance(exe, str) and exe and "\0" not in exe and os.path.exists(exe)):
        exe = sys.executable
    if info.get("orig_argv"):
        return [exe, *argv[1:]]
    return [exe, *argv]


def _recorded_cwd(info: dict) -> str:
    """The recorded working directory where it exists here, else this one."""
    where = info.get("cwd")
    if isinstance(where, str) and where and "\0" not in where and os.path.isdir(where):
        return where
    return os.getcwd()


def recorded_commands(bundle_path, ranks=(0,), attempt: int | None = None) -> dict[int, tuple[list[str], str]]:
    """What `replay(..., run_recorded_command=True)` would run for each rank: (argv, cwd).

    A rank that was not recorded (a sliced or scaled bundle) runs its role's
    representative's command. For showing to a user before they agree to run it.
    """
    real = parse_ranks(ranks) or ()
    out = {}
    with open_bundle(Path(bundle_path), attempt=attempt) as bundle:
        recorded = bundle.recorded_ranks
        for r in real:
            source = r if r in recorded else _representative(bundle, r)
            info = bundle.raw_rank_info(source)  # to run it again: shown escaped where shown
            info = info if isinstance(info, dict) else {}
            out[r] = (rank_command(info), _recorded_cwd(info))
    return out


def _representative(bundle, rank: int) -> int:

    entry = bundle.manifest.get("roles")
    try:
        roles = Roles.from_manifest(entry)
        return int(roles.representatives[roles.role(rank)])
    except Exception:
        raise UsageError(f"rank {rank} was not recorded; recorded: {bundle.recorded_ranks}") from None


def _check_launcher(cmd, real: tuple, output) -> None:
    """A launcher replay runs the command given, with one worker per real rank."""
    if not cmd:
        raise UsageError("a replay under a launcher runs the launcher command given after --")
    nodes, per_node = launcher_shape(cmd)
    if nodes is not None and per_node is not None and nodes * per_node != len(real):
        raise UsageError(f"torchrun starts {nodes} node(s) x {per_node} process(es) per node = "
                         f"{nodes * per_node} workers; the replay has {len(real)} real rank(s) "
                         f"{format_ranks(real)}: one worker per real rank")
    if output is not None and nodes != 1:
        raise UsageError("recording a replay (-o) under a launcher needs one node (torchrun --nnodes 1)")


def _child_env(info: dict, options: ReplayOptions, env: dict | None, rank_vars: dict | None = None) -> dict:
    """A replayed process's environment: this one's, the bundle's allow-listed names where
    this machine sets none, the rank's, the attempt's restart count, the caller's, and the
    start-up hook."""
    child = dict(os.environ)
    child.pop("PRISM_RR_RECORD", None)
    for name, value in replay_env(info).items():  # the allow-list only; this machine's win
        child.setdefault(name, value)
    child.setdefault("OMP_NUM_THREADS", "1")
    child.update(rank_vars or {})
    child.update(_attempt_env(info))  # over torchrun's: the attempt's own
    child.update(env or {})
    path = [str(HOOK_DIR)]
    if child.get("PYTHONPATH"):
        path.append(child["PYTHONPATH"])
    path.append(str(_PACKAGE_ROOT))
    child["PYTHONPATH"] = os.pathsep.join(path)
    child[ENV_VAR] = options.to_json()
    return child


def _attempt_env(info: dict) -> dict[str, str]:
    """TorchElastic's restart count of the replayed attempt, where it ran under one: a
    program may do otherwise in a restart (resume from a checkpoint, skip a step), and a
    replay of attempt N runs it as attempt N ran. A number, never text from the bundle."""
    incarnation = info.get("incarnation") if isinstance(info, dict) else None
    count = incarnation.get("restart_count") if isinstance(incarnation, dict) else None
    if type(count) is int and 0 <= count < 1 << 20:
        return {"TORCHELASTIC_RESTART_COUNT": str(count)}
    return {}


def _read_stats(work: Path, rank: int) -> dict | None:
    """What a replayed rank wrote (its session's results), or None."""
    try:
        return json.loads(stats_path(work, rank).read_text())
    except (OSError, ValueError):
        return None


def _torn_down(stats: dict | None, code: int | None) -> bool:
    """Did a rank abort (SIGABRT) after its program had finished, in native teardown?"""
    return code == -signal.SIGABRT and bool(stats and stats.get("exiting") and not stats.get("stopped"))


def _as_ranks(bundle_path: Path, roles_entry: dict, real: tuple, work: Path) -> Path:
    """The bundle with `real` as their roles' representatives (records of each role's
    recorded representative mapped onto them), written by `scale` at the same sizes."""
    try:
        roles = Roles.from_manifest(roles_entry)
    except Exception as exc:
        raise UsageError(f"{bundle_path.name}: its roles entry cannot be read ({shown(exc)})") from None
    m = roles.mesh
    if m is None:
        raise UsageError(f"{bundle_path.name}: ranks {list(real)} were not recorded and its roles have no mesh")
    by_role: dict[int, list[int]] = {}
    for r in real:
        if not 0 <= r < roles.world_size:
            raise UsageError(f"rank {r} is not a rank of the recorded world of {roles.world_size}")
        by_role.setdefault(roles.role(r), []).append(r)
    twins = [rs for rs in by_role.values() if len(rs) > 1]
    if twins:
        raise UsageError(f"ranks {twins[0]} do the same work (one role, one recording): replay one of them")
    out = work / f"{bundle_path.stem}-as-{'-'.join(map(str, real))}.prism"
    for r in real:
        rep = roles.representatives[roles.role(r)]
        if rep != r:
            log.warning("prism-rr: rank %d was not recorded: it replays the records of rank %d, "
                        "which does the same work", r, rep)
    scale(bundle_path, out, dp=m.shape[m.dp_dim], mesh=m, prefer=real)
    return out


def replay(request, /, **asks) -> ReplayResult:
    """Replay a bundle as `request` asks (a ReplayRequest, or the bundle's path and the
    request's fields as keywords); return how it went (never raises on divergence).

    Each real rank runs `cmd`; the command and working directory the bundle names run only
    with `run_recorded_command=True` (a bundle may come from a stranger: show them first,
    see `recorded_commands`).

    `output`: record the replay itself (the real ranks' calls as they happened) into
    this bundle, with `output_payload` (default: what the recording kept). What-if knobs
    of the timing model: `comm_scale` (every transfer X times as long), `compute_scale`
    (every rank's compute X times as long), `slow_rank` ({virtual rank: factor} on its
    compute, or "R:F,R:F"), `replace_rank` ("R@STEP", a list of those, or (rank, step)
    pairs: virtual rank R is replaced by a new process at step STEP; its peers wait for it
    to rejoin, for `replace_downtime` seconds where given, else the downtime estimated from
    the bundle: start-up, rejoin and state, see _replace.py; the report's
    what_if.replace_rank gives each estimate and its parts). Raises UsageError where the
    replay cannot run here.

    The launcher, attempts, recorded hangs and failures, and the bundle as the program:
    see the module's docstring.
    """
    request = ReplayRequest.of(request, asks)
    bundle_path, real = _real_ranks(request)
    first = _first_look(request, bundle_path, real)
    if first.missing and isinstance(first.roles, dict):
        return _replay_as_roles(request, bundle_path, real, first)
    plan = _plan(request, bundle_path, real, first)
    warnings = check_environment(plan.infos, timing=request.timing, dump=plan.dump)
    for w in warnings:
        log.warning("prism-rr: %s", w)
    output, spool_dir, payload = _replay_output(request, plan)
    work = Path(tempfile.mkdtemp(prefix="prism-rr-replay-"))
    options = _rank_options(request, plan, work, spool_dir, payload)
    run = _Run(logs=Path(request.log_dir) if request.log_dir is not None else None)
    try:
        _start(run, request, plan, options)
        _wait_for(run, work)
        rep = _gather(run, plan, work, options)
    finally:
        run.close(work)
    _settle(rep, run, plan, warnings)
    rep["what_if"] = _what_if(options, plan.replacements)
    if spool_dir is not None:
        _pack_replay(spool_dir, output, bundle_path, options, run.commands, run.stats)
        rep["output"] = str(output)
    if request.report is not None:
        Path(request.report).write_text(json.dumps(rep, indent=2) + "\n")
    return ReplayResult(exit_code=rep["exit_code"], rank_codes=run.codes, report=rep, card=card(rep),
                        timed_out=run.timed_out, log_dir=run.logs, commands=run.commands, warnings=tuple(warnings),
                        output=output if spool_dir is not None else None)


def _real_ranks(request: ReplayRequest) -> tuple[Path, tuple[int, ...]]:
    """The bundle's resolved path and the real ranks ("all": every rank of the world); a
    command the bundle names runs only when asked."""
    bundle_path = Path(request.bundle).resolve()
    ranks = request.ranks
    if isinstance(ranks, str) and ranks.strip().lower() == "all":
        with open_bundle(bundle_path, attempt=request.attempt) as bundle:
            ranks = tuple(range(bundle.world_size))
    if request.names_no_program and not request.run_recorded_command:
        raise UsageError(f"{bundle_path.name}: the command a bundle names runs only when asked: "
                         f"give the command to run, or run_recorded_command=True")
    return bundle_path, parse_ranks(ranks) or ()


@dataclass(frozen=True, slots=True, kw_only=True)
class _FirstLook:
    """The bundle's world, the real ranks it did not record, its roles entry, the attempt
    replayed and the replaced ranks' plan (priced once, at the bundle's own world size)."""

    world: int
    missing: list[int]
    roles: object
    attempt: int
    default_attempt: int
    replacements: list[dict]


def _first_look(request: ReplayRequest, bundle_path: Path, real: tuple) -> _FirstLook:
    with open_bundle(bundle_path, attempt=request.attempt) as bundle:
        return _FirstLook(
            world=bundle.world_size, missing=[r for r in real if r not in bundle.recorded_ranks],
            roles=bundle.manifest.get("roles"), attempt=bundle.attempt, default_attempt=bundle.default_attempt,
            replacements=plan_replacements(bundle, request.replace_rank, real=real,
                                           downtime=request.replace_downtime))


def _replay_as_roles(request: ReplayRequest, bundle_path: Path, real: tuple, first: _FirstLook) -> ReplayResult:
    """A sliced or scaled bundle: a rank that was not recorded does its role's work. Its
    representative's records are written mapped onto it (its groups, peers, roots), and
    that bundle is replayed."""
    if first.attempt != first.default_attempt:
        raise UsageError(f"{bundle_path.name}: ranks {first.missing} were not recorded in attempt {first.attempt}; "
                         f"a rank is replayed as its role's only in the default attempt ({first.default_attempt})")
    with tempfile.TemporaryDirectory(prefix="prism-rr-as-") as d:
        derived = _as_ranks(bundle_path, first.roles, real, Path(d))
        return replay(replace(request, bundle=derived, ranks=real, attempt=None,
                              replace_rank=first.replacements, replace_downtime=None))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Plan:
    """What the bundle says of this replay, read before any rank starts."""

    bundle: Path
    real: tuple[int, ...]
    world: int
    attempt: int
    default_attempt: int
    attempts: list[int]
    infos: dict[int, dict]  # each real rank's recorded facts
    endings: tuple[dict, ...]  # how the recording failed (_recorded_endings)
    replacements: list[dict]
    dump: bool  # imported from Flight Recorder dumps
    cmd: list[str] | None  # what each real rank runs; None: its recorded command
    launcher: bool


def _plan(request: ReplayRequest, bundle_path: Path, real: tuple, first: _FirstLook) -> _Plan:
    """Read what the replay needs of the bundle, and refuse what it cannot replay, before
    any rank starts: ranks not recorded, slowed ranks outside the world, a recording no
    program could be (from_bundle), a launcher command that does not fit the real ranks."""
    cmd = [sys.executable, "-m", "prism_rr.replayer.driver"] if request.from_bundle else request.cmd
    cmd = list(cmd) if cmd else None
    with open_bundle(bundle_path, attempt=first.attempt) as bundle:
        if first.missing:
            raise UsageError(f"ranks {first.missing} were not recorded; recorded: {bundle.recorded_ranks}")
        outside = [r for r, _ in request.slow_rank if not 0 <= r < first.world]
        if outside:
            raise UsageError(f"slow_rank {outside[0]} is not a rank of the recorded world of {first.world}")
        if request.from_bundle:

            for r in real:  # each real rank's program read (and refused) before any starts
                program_of(bundle, r)
        plan = _Plan(bundle=bundle_path, real=real, world=first.world, attempt=first.attempt,
                     default_attempt=first.default_attempt, attempts=[e["attempt"] for e in bundle.attempts],
                     infos={r: bundle.raw_rank_info(r) for r in real}, endings=_recorded_endings(bundle),
                     replacements=first.replacements, dump=isinstance(bundle.manifest.get("imported"), dict),
                     cmd=cmd,
                     launcher=False if request.from_bundle else
                     (is_launcher(cmd) if request.launcher is None else request.launcher))
    if plan.launcher:
        _check_launcher(plan.cmd, real, request.output)
    return plan


def _replay_output(request: ReplayRequest, plan: _Plan) -> tuple[Path | None, Path | None, str]:
    """Where the replay records itself (-o): the bundle, its emptied spool directory, and
    the payload mode (default: what the recording kept); (None, None, "none") without -o."""
    if request.output is None:
        return None, None, "none"
    output = Path(request.output).resolve()
    if output == plan.bundle:
        raise UsageError("the replay's recording (-o) must not overwrite the bundle it replays")
    spool_dir = spool_dir_for(output)
    spool_dir.mkdir(parents=True, exist_ok=True)
    for old in spool_dir.glob("rank-*.spool*"):
        old.unlink()
    payload = request.output_payload or str(plan.infos[plan.real[0]].get("payload") or "digest")
    return output, spool_dir, payload


def _rank_options(request: ReplayRequest, plan: _Plan, work: Path, spool_dir: Path | None,
                  payload: str) -> ReplayOptions:
    """What every real rank is told (ENV_VAR)."""

    return ReplayOptions(
        bundle=str(plan.bundle), attempt=plan.attempt, ranks=plan.real, work_dir=str(work), timing=request.timing,
        continue_on_divergence=request.continue_on_divergence, launcher=plan.launcher, world_size=plan.world,
        real_port=free_port() if len(plan.real) > 1 and not plan.launcher else 0,
        comm_scale=float(request.comm_scale), compute_scale=float(request.compute_scale),
        slow_rank=request.slow_rank,
        replace_rank=tuple((e["rank"], e["step"], round(e["downtime_s"] * 1e9)) for e in plan.replacements),
        output=None if spool_dir is None else str(spool_dir), payload=payload, endings=plan.endings)


@dataclass(slots=True, kw_only=True)
class _Run:
    """The replay's processes while they run, and what they left."""

    logs: Path | None
    procs: dict[int, subprocess.Popen] = field(default_factory=dict)  # rank (-1: the launcher) -> process
    files: list = field(default_factory=list)  # their output files, when logged
    commands: dict[int, list[str]] = field(default_factory=dict)
    deadline: float | None = None
    timed_out: bool = False
    codes: dict[int, int] = field(default_factory=dict)
    stats: dict[int, dict] = field(default_factory=dict)
    unreported: list[int] = field(default_factory=list)
    launcher_code: int | None = None

    def output_files(self, name: str):
        """(stdout, stderr) of a process: files named `name`.* in the log directory, or None."""
        if self.logs is None:
            return None, None
        out, err = open(self.logs / f"{name}.stdout", "wb"), open(self.logs / f"{name}.stderr", "wb")
        self.files += [out, err]
        return out, err

    def close(self, work: Path) -> None:
        """Stop what still runs, close the output files, remove the work directory."""

        if any(p.poll() is None for p in self.procs.values()):
            kill_ranks(list(self.procs.values()))
        for f in self.files:
            f.close()
        shutil.rmtree(work, ignore_errors=True)


def _start(run: _Run, request: ReplayRequest, plan: _Plan, options: ReplayOptions) -> None:
    """Start the launcher, or each real rank, with its environment and the start-up hook."""

    if run.logs is not None:
        run.logs.mkdir(parents=True, exist_ok=True)
    run.deadline = None if request.timeout is None else time.monotonic() + request.timeout
    if plan.launcher:
        child = _child_env(plan.infos[plan.real[0]], options, request.env)
        for name in LAUNCHER_VARS:  # only the workers it starts have a rank
            child.pop(name, None)
        run.commands = {r: list(plan.cmd) for r in plan.real}
        out, err = run.output_files("launcher")
        run.procs[-1] = subprocess.Popen(list(plan.cmd), env=child, cwd=request.cwd or os.getcwd(), stdout=out,
                                         stderr=err, start_new_session=True)
        return
    master_port, run_id = free_port(), f"prism-replay-{uuid.uuid4().hex[:12]}"
    for r in plan.real:
        argv = list(plan.cmd) if plan.cmd else rank_command(plan.infos[r])
        run.commands[r] = argv
        where = request.cwd or (os.getcwd() if plan.cmd else _recorded_cwd(plan.infos[r]))
        if not os.path.isdir(where):
            where = os.getcwd()
        child = _child_env(plan.infos[r], options, request.env, rank_env(r, plan.world, master_port, run_id))
        out, err = run.output_files(f"rank{r}")
        run.procs[r] = subprocess.Popen(argv, env=child, cwd=where, stdout=out, stderr=err, start_new_session=True)


def _wait_for(run: _Run, work: Path) -> None:
    """Wait until every process has ended; a rank that failed on its own (its peers
    would wait for it forever), or the deadline, stops them all."""

    while True:
        codes = {r: p.poll() for r, p in run.procs.items()}
        if all(c is not None for c in codes.values()):
            break
        if any(c not in (None, 0) and not _torn_down(_read_stats(work, r), c) for r, c in codes.items()):
            kill_ranks(list(run.procs.values()))
            break
        if run.deadline is not None and time.monotonic() > run.deadline:
            run.timed_out = True
            kill_ranks(list(run.procs.values()))
            break
        time.sleep(_POLL_S)
    run.codes = {r: p.wait() for r, p in run.procs.items()}


def _gather(run: _Run, plan: _Plan, work: Path, options: ReplayOptions) -> dict:
    """What the real ranks wrote, and the fidelity report of it. A rank that refused the
    program's request (another world size) is the replay's UsageError."""
    run.stats = {r: st for r in plan.real if (st := _read_stats(work, r)) is not None}
    if plan.launcher:  # a refusal names torchrun's rank where the recorded one is not known
        every = (_read_stats(work, int(f.stem.split("-")[1])) for f in work.glob("rank-*.json"))
        seen = [st for st in every if st is not None]
    else:
        seen = list(run.stats.values())
    refused = [st["error"] for st in seen if isinstance(st.get("error"), str)]
    if refused:
        raise UsageError(refused[0])
    if plan.launcher:
        # One exit code for all of this node's workers: torchrun's; results from every
        # real rank, gathered through torchrun's store (_gather.py).
        run.launcher_code = run.codes.pop(-1)
        run.unreported = [r for r in plan.real if r not in run.stats]
        run.codes = {r: run.launcher_code for r in plan.real if r in run.stats}
    with open_bundle(plan.bundle, attempt=plan.attempt) as bundle:
        rep = fidelity_report(bundle, plan.real, run.stats, timing=options.timing,
                              what_if=_what_if(options, plan.replacements))
    traces = {str(r): st["trace"] for r, st in run.stats.items() if st.get("trace")}
    if traces:  # PRISM_RR_REPLAY_TRACE: each call's entries and completion, for debugging the model
        rep["trace"] = traces
    return rep


def _settle(rep: dict, run: _Run, plan: _Plan, warnings: list[str]) -> None:
    """The report's account of how each rank ended, and the replay's exit code."""
    if plan.launcher:
        rep["launcher_exit_code"] = run.launcher_code
        rep["unreported"] = run.unreported
        if run.unreported:
            warnings.append(f"no results from real rank(s) {run.unreported}: see the replay on their node")
    rep["rank_exit_codes"] = {str(r): c for r, c in run.codes.items()}
    torn = sorted(r for r, c in run.codes.items() if _torn_down(run.stats.get(r), c))
    if torn:
        # The program had finished (its results were written at exit) when the process
        # aborted in native teardown: the replay stands, and the report says so.
        log.warning("prism-rr: rank(s) %s aborted in teardown after the program had finished; "
                    "the replay's results stand", torn)
        rep["teardown_aborts"] = torn
        run.codes = {r: (0 if r in torn else c) for r, c in run.codes.items()}
    stopped = any(st.get("stopped") for st in run.stats.values())
    hung = next((st["hang"] for _, st in sorted(run.stats.items()) if isinstance(st.get("hang"), dict)), None)
    rep["stopped_early"] = _stopped_early(rep["progress"], run.codes, run.stats, timed_out=run.timed_out,
                                          diverged=stopped or hung is not None)
    for e in rep["stopped_early"]:
        e["recorded_exit"] = recorded_exit(plan.infos.get(e["rank"]))
    if run.logs is not None:  # the ranks' output went to files: the card shows how each ended
        for e in rep["stopped_early"]:
            e["output_tail"] = _tail(run.logs / f"rank{e['rank']}.stderr")
    rep["resolved"] = [h for _, st in sorted(run.stats.items()) for h in st.get("resolved") or ()]
    code, rep["hang"] = _verdict(rep, run, stopped=stopped, hung=hung)
    rep["attempt"] = {"attempt": plan.attempt, "attempts": plan.attempts, "default": plan.default_attempt}
    rep["exit_code"] = code
    rep["environment_warnings"] = warnings


def _verdict(rep: dict, run: _Run, *, stopped: bool, hung: dict | None) -> tuple[int, dict | None]:
    """The replay's exit code, and the hang it reached (or the call its peers wait in)."""

    if run.timed_out:
        return TIMED_OUT, hung
    if stopped:
        return DIVERGED, hung
    if hung is not None:
        return HUNG, hung
    code = exit_code(list(run.codes.values()))  # the rank that failed on its own, as localrun's
    if code and _as_recorded(rep["stopped_early"]):
        rep["reproduced"] = True  # each failing rank failed as it did in the recording
        return HUNG, None
    if code:
        return code, None
    if rep["stopped_early"]:
        return INCOMPLETE, None
    # every program ended well: did one end without a call its peers wait in?
    waited = next((st["waited_for"] for _, st in sorted(run.stats.items())
                   if isinstance(st.get("waited_for"), dict)), None)
    return (HUNG if waited is not None else 0), waited


def _recorded_endings(bundle) -> tuple[dict, ...]:
    """Where a recording that ended in a failure (a rank's program failed or was killed)
    went wrong, as diagnose says: its drifts and mismatches, for the real ranks to stop at
    (_policy: _drifted, _recorded_end). Nothing, and no diagnosis, for a run that ended well."""
    infos = [bundle.rank_info(r) for r in bundle.recorded_ranks]
    if not any(failed(info.get("exit")) or info.get("crash") for info in infos):
        return ()
    from prism_rr.analysis import diagnose

    out = []
    for f in diagnose(bundle):
        if f.kind in ("drift", "mismatch") and f.group is not None and f.seq is not None and f.ranks:
            out.append({"kind": f.kind, "group": f.group, "seq": f.seq, "ranks": list(f.ranks),
                        "reference": f.details.get("reference"), "step": f.details.get("step"),
                        "message": f.message[:1500]})
    return tuple(out[:16])  # they travel in one environment variable (at most 128 KiB)


def _as_recorded(early: list[dict]) -> bool:
    """Whether every real rank that failed failed as it did in the recording: the same
    exit code, or death by the same signal."""
    failing = [e for e in early if e.get("exit_code")]
    return bool(failing) and all(same_end(e["exit_code"], e.get("recorded_exit")) for e in failing)


def _what_if(options, replacements=()) -> dict:
    return {"comm_scale": options.comm_scale, "compute_scale": options.compute_scale,
            "slow_rank": {str(r): f for r, f in options.slow_rank}, "replace_rank": list(replacements)}


def _tail(path: Path, lines: int = 8) -> list[str]:
    """The last lines of a rank's output file (at most 64 KiB read), printable."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    rows = [line.rstrip() for line in text.splitlines() if line.strip()]
    return ["".join(c if c.isprintable() else "?" for c in line)[:300] for line in rows[-lines:]]


def _stopped_early(progress: dict, codes: dict, stats: dict, *, timed_out: bool, diverged: bool) -> list[dict]:
    """The real ranks that did not make every call the recording holds, or failed: how far
    each got. A rank stopped by a divergence or at a recorded hang (and those ended because
    of it) is left to that report."""
    out = []
    for r in sorted(codes):
        st, c, p = stats.get(r), codes[r], progress.get(str(r), {})
        if st is not None and (st.get("stopped") or st.get("hang")):
            continue
        if diverged and c < 0:
            continue
        if c == 0 and p.get("complete", True):
            continue
        out.append({"rank": r, "exit_code": c, "timed_out": timed_out and c != 0, **p})
    return out


def _made_up(stats: dict) -> dict[str, int | None]:
    """Each real rank's monotonic time from which it made its data up, None where it ran on
    the recorded data throughout; a rank that did not say is left out (never compared)."""
    out: dict[str, int | None] = {}
    for r, st in sorted(stats.items()):
        if not st.get("synthetic_numerics"):
            out[str(r)] = None
        elif type(st.get("made_up_from_ns")) is int:
            out[str(r)] = st["made_up_from_ns"]
    return out


def _pack_replay(spool_dir: Path, output: Path, bundle_path: Path, options, commands, stats: dict) -> None:
    """Pack what the real ranks recorded of themselves into `output`, with where each
    made its data up (`data_made_up_from_ns`: analysis.replay_data), so that `tui
    --compare` and `diff` compare data where this replay did and nowhere else."""
    if not any(spool_dir.glob("rank-*.spool")):
        log.warning("prism-rr: the replay recorded nothing; %s not written", output)
        return
    facts = {
        "command": [str(a) for a in next(iter(commands.values()), [])],
        "cwd": os.getcwd(),
        "prism_rr_version": __version__,
        "replay_of": {"bundle": str(bundle_path), "ranks": list(options.ranks), "timing": options.timing,
                      "data_made_up_from_ns": _made_up(stats)},
    }
    (spool_dir / "run.json").write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")
    try:
        pack(spool_dir, output)
    except Exception as exc:
        log.warning("prism-rr: packing the replay's recording %s failed: %s", output, exc)
        return
    shutil.rmtree(spool_dir, ignore_errors=True)
