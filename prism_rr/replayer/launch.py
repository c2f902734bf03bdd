"""Replay a bundle: run the selected ranks for real, the others as virtual peers.

    result = replay("run.prism", ranks=(0,), report="fidelity.json")

Each selected rank runs its recorded command (or `cmd`) with the environment torchrun
would have given it in the recorded world, and a start-up hook that makes
`init_process_group`/`new_group` build replay groups. The real ranks meet on their own
store; the recorded world's other ranks exist only as recordings.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from prism_rr.errors import UsageError
from prism_rr.format import open_bundle
from prism_rr.replayer._fidelity import card, fidelity_report
from prism_rr.replayer._options import ENV_VAR, ReplayOptions
from prism_rr.replayer._session import stats_path

__all__ = ["HOOK_DIR", "ReplayResult", "rank_command", "replay"]

HOOK_DIR = Path(__file__).resolve().parent / "_hook"
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
_POLL_S = 0.02
DIVERGED = 3
TIMED_OUT = 124


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayResult:
    """How a replay ended and what the fidelity report says."""

    exit_code: int  # 0 ok, 3 diverged, 124 timed out, else the first failing rank's code
    rank_codes: dict[int, int]
    report: dict
    card: str
    timed_out: bool = False
    log_dir: Path | None = None
    commands: dict[int, list[str]] = field(default_factory=dict)

    @property
    def diverged(self) -> bool:
        return bool(self.report.get("diverged"))


def rank_command(info: dict) -> list[str]:
    """The command a recorded rank ran: its interpreter and arguments (`-m` included)."""
    argv = list(info.get("orig_argv") or info.get("argv") or [])
    if not argv:
        raise UsageError(f"the bundle does not say what rank {info.get('rank')} ran; give a command")
    exe = info.get("executable") or ""
    if not (exe and os.path.exists(exe)):
        exe = sys.executable
    if info.get("orig_argv"):
        return [exe, *argv[1:]]
    return [exe, *argv]


def _parse_ranks(ranks) -> tuple[int, ...]:
    if isinstance(ranks, int):
        return (ranks,)
    if isinstance(ranks, str):
        from prism_rr.recorder._options import parse_ranks

        return parse_ranks(ranks) or ()
    return tuple(sorted({int(r) for r in ranks}))


def replay(
    bundle_path,
    *,
    ranks=(0,),
    cmd: list[str] | None = None,
    report=None,
    output=None,
    timing: str = "live",
    continue_on_divergence: bool = False,
    timeout: float | None = None,
    cwd=None,
    log_dir=None,
    env: dict | None = None,
) -> ReplayResult:
    """Replay `bundle_path` with `ranks` real; return how it went (never raises on divergence)."""
    from prism_rr.localrun import kill_ranks, free_port, rank_env

    if output is not None:
        raise UsageError("recording a replay (-o) is not supported yet")
    bundle_path = Path(bundle_path).resolve()
    real = _parse_ranks(ranks)
    with open_bundle(bundle_path) as bundle:
        world = bundle.world_size
        missing = [r for r in real if r not in bundle.recorded_ranks]
        if missing:
            raise UsageError(f"ranks {missing} were not recorded; recorded: {bundle.recorded_ranks}")
        infos = {r: bundle.rank_info(r) for r in real}
    work = Path(tempfile.mkdtemp(prefix="prism-rr-replay-"))
    options = ReplayOptions(bundle=str(bundle_path), ranks=real, work_dir=str(work), timing=timing,
                            continue_on_divergence=continue_on_divergence,
                            real_port=free_port() if len(real) > 1 else 0)
    logs = Path(log_dir) if log_dir is not None else None
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
    master_port, run_id = free_port(), f"prism-replay-{uuid.uuid4().hex[:12]}"
    procs, files, commands = {}, [], {}
    timed_out = False
    try:
        for r in real:
            argv = list(cmd) if cmd else rank_command(infos[r])
            commands[r] = argv
            where = cwd or (os.getcwd() if cmd else infos[r].get("cwd"))
            if not where or not os.path.isdir(where):
                where = os.getcwd()
            child = dict(os.environ)
            child.pop("PRISM_RR_RECORD", None)
            child.setdefault("OMP_NUM_THREADS", "1")
            child.update(rank_env(r, world, master_port, run_id))
            child.update(env or {})
            path = [str(HOOK_DIR)]
            if child.get("PYTHONPATH"):
                path.append(child["PYTHONPATH"])
            path.append(str(_PACKAGE_ROOT))
            child["PYTHONPATH"] = os.pathsep.join(path)
            child[ENV_VAR] = options.to_json()
            out = err = None
            if logs is not None:
                out = open(logs / f"rank{r}.stdout", "wb")
                err = open(logs / f"rank{r}.stderr", "wb")
                files += [out, err]
            procs[r] = subprocess.Popen(argv, env=child, cwd=where, stdout=out, stderr=err,
                                        start_new_session=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            codes = {r: p.poll() for r, p in procs.items()}
            if all(c is not None for c in codes.values()):
                break
            if any(c not in (None, 0) for c in codes.values()):
                kill_ranks(list(procs.values()))  # the others would wait for it forever
                break
            if deadline is not None and time.monotonic() > deadline:
                timed_out = True
                kill_ranks(list(procs.values()))
                break
            time.sleep(_POLL_S)
        codes = {r: p.wait() for r, p in procs.items()}
        stats = {}
        for r in real:
            p = stats_path(work, r)
            if p.exists():
                stats[r] = json.loads(p.read_text())
        with open_bundle(bundle_path) as bundle:
            rep = fidelity_report(bundle, real, stats, timing=timing)
    finally:
        for p in procs.values():
            if p.poll() is None:
                kill_ranks(list(procs.values()))
                break
        for f in files:
            f.close()
        shutil.rmtree(work, ignore_errors=True)
    rep["rank_exit_codes"] = {str(r): c for r, c in codes.items()}
    stopped = any(st.get("stopped") for st in stats.values())
    if timed_out:
        code = TIMED_OUT
    elif stopped:
        code = DIVERGED
    else:
        code = next((c if c > 0 else 128 - c for c in codes.values() if c != 0), 0)
    rep["exit_code"] = code
    if report is not None:
        Path(report).write_text(json.dumps(rep, indent=2) + "\n")
    return ReplayResult(exit_code=code, rank_codes=codes, report=rep, card=card(rep), timed_out=timed_out,
                        log_dir=logs, commands=commands)
