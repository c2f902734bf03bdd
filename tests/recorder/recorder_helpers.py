"""Helpers for recorder tests: run a script as N gloo ranks under the hook, read spools."""

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from prism_rr.localrun import free_port, rank_env, run_local
from prism_rr.format import layout
from prism_rr.format.records import Collective, GroupInfo, PointToPoint
from prism_rr.format.compactor import recover_logs
from prism_rr.format.spool import frame_info, frame_records, read_spool
from prism_rr.recorder import RecordOptions
from prism_rr.recorder.launch import hook_env, spool_dir_for

SCRIPTS = Path(__file__).parent / "scripts"


class Spools:
    """What the ranks' spools hold, decoded."""

    def __init__(self, spool_dir: Path):
        self.dir = spool_dir
        self.records: dict[int, list] = {}
        self.info: dict[int, dict] = {}
        self.torn: dict[int, str | None] = {}
        recover_logs(spool_dir)  # a rank that died left its call log
        for path in sorted(spool_dir.glob("rank-*.spool")):
            scan = read_spool(path)
            data = path.read_bytes()
            recs, info = [], {}
            for f in scan.frames:
                if f.kind == layout.FRAME_EVENTS:
                    recs += frame_records(data, f, path.name)
                elif f.kind == layout.FRAME_RANK_INFO:
                    info.update(frame_info(data, f, path.name))
                # open-call snapshots (spool.FRAME_OPEN) are pack's to read
            self.records[scan.rank] = recs
            self.info[scan.rank] = info
            self.torn[scan.rank] = scan.problem

    def calls(self, rank: int) -> list:
        return [r for r in self.records[rank] if isinstance(r, (Collective, PointToPoint))]

    def collectives(self, rank: int, group: int | None = None) -> list:
        return [r for r in self.records[rank] if isinstance(r, Collective) and (group is None or r.group == group)]

    def groups(self, rank: int) -> dict[int, GroupInfo]:
        return {r.group: r for r in self.records[rank] if isinstance(r, GroupInfo)}

    def of_kind(self, rank: int, cls) -> list:
        return [r for r in self.records[rank] if isinstance(r, cls)]


def assert_unbroken_seqs(spools: Spools) -> None:
    """Per rank and group, collective seq numbers run 0, 1, 2, ... with no gap."""
    for rank in spools.records:
        by_group = defaultdict(list)
        for c in spools.collectives(rank):
            by_group[c.group].append(c.seq)
        for gid, seqs in by_group.items():
            assert sorted(seqs) == list(range(len(seqs))), (rank, gid, seqs)
        p2p = defaultdict(list)
        for c in spools.of_kind(rank, PointToPoint):
            p2p[(c.group, c.op.lstrip("i"), c.peer)].append(c.seq)
        for key, seqs in p2p.items():
            assert sorted(seqs) == list(range(len(seqs))), (rank, key, seqs)


def run_recorded(tmp_path: Path, argv: list[str], world: int, *, timeout: float = 60, check=True,
                 log=True, kill_on_failure=True, env_extra: dict | None = None, **options) -> tuple[Spools, list[int]]:
    """Run `argv` (after the python executable) as `world` ranks recording into tmp_path."""
    out = tmp_path / "run.prism"
    opts = RecordOptions.make(spool_dir_for(out), **options)
    env = hook_env(opts)
    env["PYTHONWARNINGS"] = "ignore"
    env.update(env_extra or {})
    logs = tmp_path / "logs" if log else None
    codes = run_local([sys.executable, *map(str, argv)], world, env=env, timeout=timeout, cwd=tmp_path,
                      log_dir=logs, kill_on_failure=kill_on_failure)
    if check and any(codes):
        err = "".join((logs / f"rank{r}.stderr").read_text()[-3000:] for r in range(world)) if logs else ""
        pytest.fail(f"ranks exited {codes}:\n{err}")
    return Spools(spool_dir_for(out)), codes


def start_ranks(workdir: Path, script: str, mode: str, world: int, run_id: str, **options):
    """Start `world` recording ranks of scripts/`script` by hand (no launcher, which would
    kill the peers of a rank that dies): each gets `mode` and `workdir`, logs to
    workdir/rank{R}.log; `options` are RecordOptions'. Returns the bundle path to pack
    and the processes."""
    out = workdir / "run.prism"
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    env.update(hook_env(RecordOptions.make(spool_dir_for(out), **options)))
    port = free_port()
    procs = []
    for rank in range(world):
        e = dict(env, **rank_env(rank, world, port, run_id))
        with open(workdir / f"rank{rank}.log", "wb") as log:
            procs.append(subprocess.Popen([sys.executable, str(SCRIPTS / script), mode, str(workdir)],
                                          env=e, stdout=log, stderr=log, start_new_session=True))
    return out, procs


def finish(procs: list, timeout: float) -> list:
    """The exit codes, once every process ended; past `timeout` SIGTERM (the recorder
    flushes on it), then SIGKILL."""
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return [p.returncode for p in procs]
