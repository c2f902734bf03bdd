"""Write real Flight Recorder dumps with gloo: the fixtures `prism-rr import fr` is tested on.

    python tests/format/scripts/fr_dumps.py OUT [normal|skip|groups[:WORLD] ...]

Each scenario runs its ranks with torch.multiprocessing and TORCH_FR_BUFFER_SIZE set, and
writes, per rank, both of torch's dump forms: OUT/<scenario>/pickle/nccl_trace_rank_<r>
(torch's default file name and pickle, `_dump_fr_trace`) and
OUT/<scenario>/json/nccl_trace_rank_<r>.json (`_dump_fr_trace_json`).

- normal: 2 ranks, three steps of all_reduce, all_gather, broadcast, reduce_scatter and a
  barrier, with a send and recv between them.
- skip: 3 ranks (or WORLD), two steps; in the second rank 1 skips an all_reduce that the
  others enter (asynchronously, so that they can dump while it is pending).
- groups: 4 ranks as a 2 x 2 mesh: all_reduces on the row groups {0,1}, {2,3}, all_gathers
  on the column groups {0,2}, {1,3}, and a broadcast on WORLD.

A rank dumps once its calls are issued and leaves with os._exit once all have dumped: a
rank waiting on a collective that a peer skipped would otherwise wait for ever.
`python tests/format/scripts/fr_dumps.py tests/data/fr` makes the test fixtures again.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SCENARIOS = {"normal": 2, "skip": 3, "groups": 4}


def _normal(rank: int, world: int) -> None:
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    for _ in range(3):
        dist.all_reduce(t)
        dist.all_gather_into_tensor(torch.empty(world * 2, 3), t)
        dist.broadcast(t, src=0)
        dist.reduce_scatter_tensor(torch.empty(1, 3), t[:world].contiguous())
        if rank == 0:
            dist.send(torch.ones(4, dtype=torch.int64), 1)
        else:
            dist.recv(torch.ones(4, dtype=torch.int64), 0)
        dist.barrier()


_HELD: list = []  # work left pending on purpose, held until the process leaves


def _skip(rank: int, world: int) -> None:
    t = torch.ones(8, dtype=torch.bfloat16)
    dist.all_reduce(t)
    dist.barrier()
    if rank != 1:  # rank 1 skips this one: the others wait in it
        _HELD.append(dist.all_reduce(t, async_op=True))


def _groups(rank: int, world: int) -> None:
    rows = [dist.new_group([0, 1], group_desc="row0"), dist.new_group([2, 3], group_desc="row1")]
    cols = [dist.new_group([0, 2], group_desc="col0"), dist.new_group([1, 3], group_desc="col1")]
    row, col = rows[rank // 2], cols[rank % 2]
    t = torch.ones(4, 4, dtype=torch.float64)
    for _ in range(2):
        dist.all_reduce(t, group=row)
        dist.all_gather_into_tensor(torch.empty(8, 4, dtype=torch.float64), t, group=col)
    dist.broadcast(t, src=0)


def _rank(rank: int, world: int, port: int, scenario: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    {"normal": _normal, "skip": _skip, "groups": _groups}[scenario](rank, world)
    # Let gloo mark finished calls completed (it does so just after they return), and let
    # the peers reach their dump; a pending call stays pending.
    time.sleep(1.0)
    from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

    for form, data, suffix in (("pickle", _dump_fr_trace(), ""), ("json", _dump_fr_trace_json(), ".json")):
        d = os.path.join(out, scenario, form)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"nccl_trace_rank_{rank}{suffix}"), "wb") as f:
            f.write(data)
    # Leave once every rank has dumped (through the store, which Flight Recorder does not record):
    # a rank that left sooner would fail its peers' pending call before they dumped it.
    store = dist.distributed_c10d._get_default_store()
    store.add("fr-dumped", 1)
    while store.add("fr-dumped", 0) < world:
        time.sleep(0.05)
    store.add("fr-done", 1)
    while rank == 0 and store.add("fr-done", 0) < world:  # rank 0 holds the store: last out
        time.sleep(0.05)
    os._exit(0)


def main(argv: list[str]) -> None:
    out, scenarios = argv[0], argv[1:] or list(SCENARIOS)
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "200")
    for i, arg in enumerate(scenarios):
        scenario, _, world = arg.partition(":")
        world = int(world) if world else SCENARIOS[scenario]
        port = 29400 + (os.getpid() * 7 + i) % 20000
        mp.spawn(_rank, args=(world, port, scenario, out), nprocs=world)


if __name__ == "__main__":
    main(sys.argv[1:])
