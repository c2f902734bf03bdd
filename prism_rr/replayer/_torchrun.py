"""Replaying under a launcher: torchrun's command line, and its workers' world.

    prism-rr replay run.prism --ranks 0-15 -- torchrun --nnodes 2 --node-rank $i \
        --rdzv-backend c10d --rdzv-endpoint HOST:PORT --nproc-per-node 8 train.py

runs torchrun once on each node, with the replay's start-up hook in its environment.
torchrun's rendezvous makes the world of the real ranks: its worker RANK i of
len(ranks) replays recorded rank ranks[i]. Before the program runs, the hook rewrites the
worker's environment into the recorded world's (`enter_worker`), and the real ranks meet
on torchrun's store under a prefix of their own (`launcher_store`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from prism_rr.errors import ReplayError, UsageError

# Deferred imports: torch.distributed (torchrun's argument parser, its stores) until a
# command line is read or a worker's store is made: the start-up hook imports this module
# in every replayed rank before the program imports torch, and the launcher may need none.

__all__ = ["LAUNCHER_VARS", "Worker", "enter_worker", "is_launcher", "launcher_shape", "launcher_store"]

# What torchrun gives each worker: a launcher started by `replay` must not inherit these
# from the shell, so that only its workers have a RANK (the agent arms nothing).
LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                 "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                 "TORCHELASTIC_USE_AGENT_STORE")
_WORKER_VAR = "PRISM_RR_REPLAY_WORKER"  # set once the environment is the recorded world's
_PYTHON = re.compile(r"python[0-9.]*(\.exe)?")


def _run_args(cmd: list[str]) -> list[str] | None:
    """torchrun's own arguments in `cmd` (script included), or None if `cmd` is not torchrun."""
    if not cmd:
        return None
    name = Path(cmd[0]).name
    if name in ("torchrun", "torchrun.exe"):
        return list(cmd[1:])
    if _PYTHON.fullmatch(name):
        args = list(cmd[1:])
        for i, a in enumerate(args):
            if a == "-m" and args[i + 1:i + 2] == ["torch.distributed.run"]:
                return args[i + 2:]
            if a == "-mtorch.distributed.run":
                return args[i + 1:]
            if not a.startswith("-") or a in ("-m", "-c"):
                return None
    return None


def is_launcher(cmd) -> bool:
    """Is `cmd` torchrun (`torchrun ...` or `python -m torch.distributed.run ...`)?"""
    return _run_args(list(cmd or ())) is not None


def launcher_shape(cmd) -> tuple[int | None, int | None]:
    """(nodes, processes per node) that torchrun's arguments start, each None where they
    do not say (an elastic --nnodes 1:4, --nproc-per-node auto) or `cmd` is no torchrun."""
    args = _run_args(list(cmd or ()))
    if args is None:
        return None, None
    from torch.distributed.run import get_args_parser, parse_min_max_nnodes

    parser = get_args_parser()

    def error(message):
        raise UsageError(f"torchrun's arguments cannot be read: {message}")

    parser.error = error  # argparse would print and exit
    try:
        parsed = parser.parse_args(args)
        low, high = (1, 1) if parsed.standalone else parse_min_max_nnodes(parsed.nnodes)
    except SystemExit:  # --help
        raise UsageError("torchrun's arguments cannot be read") from None
    except (ValueError, RuntimeError) as exc:
        raise UsageError(f"torchrun's --nnodes cannot be read: {exc}") from None
    per_node = str(parsed.nproc_per_node)
    return (int(low) if low == high else None), (int(per_node) if per_node.isdigit() else None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Worker:
    """What torchrun made of this process, before the hook rewrote its environment."""

    index: int  # torchrun's RANK: this worker replays ranks[index]
    size: int  # torchrun's WORLD_SIZE: the number of real ranks
    local_rank: int
    master_addr: str
    master_port: int
    run_id: str
    restart: int
    agent_store: bool  # torchrun's agent hosts the store (else worker 0 does)


def enter_worker(options, environ=os.environ) -> Worker | None:
    """In a worker torchrun started: make its environment the recorded world's and return
    what torchrun had said; None in a process that is no worker (torchrun itself).

    RANK, WORLD_SIZE, ROLE_RANK and ROLE_WORLD_SIZE become the recorded rank's and world's;
    LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK and GROUP_WORLD_SIZE stay torchrun's, as they
    name this machine's devices and nodes. A process the worker starts inherits the
    rewritten environment and keeps it. Raises ReplayError where torchrun's world is not
    the replay's real ranks.
    """
    if _WORKER_VAR in environ:
        return Worker(**json.loads(environ[_WORKER_VAR]))
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return None
    try:
        index, size = int(environ["RANK"]), int(environ["WORLD_SIZE"])
        worker = Worker(index=index, size=size, local_rank=int(environ.get("LOCAL_RANK", index)),
                        master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
                        master_port=int(environ.get("MASTER_PORT", "0")),
                        run_id=environ.get("TORCHELASTIC_RUN_ID", "none"),
                        restart=int(environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                        agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE", "False") == "True")
    except ValueError as exc:
        raise ReplayError(f"the launcher gave this worker an environment that cannot be read: {exc}") from None
    real = tuple(options.ranks)
    if size != len(real) or not 0 <= index < size:
        raise ReplayError(f"the launcher started {size} workers in all; the replay has {len(real)} real ranks "
                          f"{list(real)}: give it nodes x processes per node = {len(real)}")
    rank, world = real[index], options.world_size
    environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "ROLE_RANK": str(rank),
                    "ROLE_WORLD_SIZE": str(world), _WORKER_VAR: json.dumps(asdict(worker))})
    return worker


def launcher_store(worker: Worker, timeout):
    """The real ranks' store: torchrun's (its agent's, or worker 0's where torchrun says
    so), under this replay's prefix."""
    from torch.distributed import PrefixStore, TCPStore

    store = TCPStore(worker.master_addr, worker.master_port, worker.size,
                     is_master=not worker.agent_store and worker.index == 0, timeout=timeout)
    return PrefixStore(f"prism_rr_replay/{worker.run_id}/{worker.restart}/", store)
