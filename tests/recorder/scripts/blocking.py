"""Blocking calls of every kind, each made several times from one line of code, as a
training loop makes them: the recorder's blocking path in C takes a call once its names,
shapes and stack were seen (the Python path learns them the first time).

Run as one rank of a 2-rank world: blocking.py <out> [rounds] [pause ms] (each round, a
pause: a step's compute, in which a small ring's compactor catches up). Writes
<out>/path-<rank>.json: how
many calls the recorder's Python path took (its `_blocking_py`, which the C path hands
what it does not handle), how many payloads the C path asked Python's log_payload for (all
of them with BLOCKING_NO_ONE_SMALL set), and whether the C path is there at all.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

torch.set_num_threads(1)
out = sys.argv[1]
n_rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
pause = float(sys.argv[3]) / 1e3 if len(sys.argv) > 3 else 0.0
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
pair = dist.new_group([0, 1])

from prism_rr.recorder import _session  # noqa: E402  (the hook started it with the group)

calls = _session.current().calls
fast = hasattr(type(calls), "_blocking_py")
python = payload_calls = 0
if fast:
    def counted(call, _py=type(calls)._blocking_py):
        global python
        python += 1
        return _py(calls, call)

    calls._blocking_py = counted  # the C path looks it up on the instance

    payload_calls = 0

    def payload_counted(*args, _lp=calls._log_payload):
        global payload_calls
        payload_calls += 1
        return _lp(*args)

    calls._log_payload = payload_counted  # what the C path asks Python for a payload
    if os.environ.get("BLOCKING_NO_ONE_SMALL"):
        calls._tensor_type = None  # every payload the Python way


def rounds(i: int) -> None:
    v = float(i + 1)
    t = torch.full((4,), v + rank)
    dist.all_reduce(t)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    dist.broadcast(t, src=1)
    # one tensor each: a Parameter (a subclass: the small bytes' long way), one above the
    # small size (digested), one of bytes
    w = torch.nn.Parameter(torch.full((2,), v), requires_grad=False)
    dist.broadcast(w, src=0)
    dist.all_reduce(torch.full((300,), v))
    dist.broadcast(torch.full((3,), i % 256, dtype=torch.uint8), src=1)
    outs = [torch.zeros(3) for _ in range(world)]
    dist.all_gather(outs, torch.full((3,), v * (rank + 2)))  # several outputs: their bytes from memory
    big = [torch.zeros(600) for _ in range(world)]
    dist.all_gather(big, torch.full((600,), v))  # above the small size: digests
    flat = torch.zeros(2 * world)
    dist.all_gather_into_tensor(flat, torch.full((2,), v - rank))
    o = torch.zeros(2)
    dist.reduce_scatter_tensor(o, torch.arange(2.0 * world) * v)
    dist.barrier()
    a2a = torch.zeros(world, dtype=torch.int64)
    dist.all_to_all_single(a2a, torch.arange(world, dtype=torch.int64) + 10 * rank + i)
    g = [torch.zeros(2) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.full((2,), v + rank), g, dst=0)
    s = torch.zeros(3)
    dist.scatter(s, [torch.full((3,), v + k) for k in range(world)] if rank == 0 else None, src=0)
    r = torch.zeros(5, dtype=torch.float64)
    if rank == 0:
        dist.send(torch.full((5,), v, dtype=torch.float64), 1)
        dist.recv(r, 1)
    else:
        dist.recv(r, 0)
        dist.send(r * 2, 0)
    dist.all_reduce(torch.full((1,), v), group=pair)


for i in range(n_rounds):
    rounds(i)
    time.sleep(pause)
dist.barrier()
with open(f"{out}/path-{rank}.json", "w") as f:
    json.dump({"c_path": fast, "python": python, "payload_calls": payload_calls}, f)
dist.destroy_process_group()
