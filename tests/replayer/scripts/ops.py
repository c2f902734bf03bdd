"""A few steps of every replayable call at world 2 to 4; each rank saves what it received.

Run as one rank of a torchrun-style world. argv: OUT_DIR [EDIT]. Saves
OUT_DIR/<tag>-<rank>.pt (tag from PRISM_TEST_TAG, default "rec"): a dict name -> tensor.
With EDIT "edit", step 1's all_gather input has one more element (an edited script); with
"data", step 1's all_reduce input has another value in one element (same shape); "both",
the two.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

torch.set_num_threads(1)
out_dir = sys.argv[1]
edit = len(sys.argv) > 2 and sys.argv[2] in ("edit", "both")
data_edit = len(sys.argv) > 2 and sys.argv[2] in ("data", "both")
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
pair = dist.new_group([0, 1])
got = {}
param = torch.nn.Parameter(torch.ones(3))
opt = torch.optim.SGD([param], lr=0.1)


def x(step, *shape):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(*shape, generator=g)


for step in range(3):
    time.sleep(0.02 * (rank + 1))  # compute: a different length on each rank
    t = x(step, 4, 3)
    if data_edit and step == 1:
        t[0, 0] += 1.0
    dist.all_reduce(t)
    got[f"all_reduce{step}"] = t
    n = 4 if edit and step == 1 else 3
    outs = [torch.empty(n) for _ in range(world)]
    dist.all_gather(outs, x(step, n))
    got[f"all_gather{step}"] = torch.stack(outs)
    o = torch.empty(2 * world, 2)
    dist.all_gather_into_tensor(o, x(step, 2, 2))
    got[f"all_gather_into_tensor{step}"] = o
    o = torch.empty(3)
    dist.reduce_scatter(o, [x(step, 3) * (i + 1) for i in range(world)])
    got[f"reduce_scatter{step}"] = o
    o = torch.empty(2, 3)
    dist.reduce_scatter_tensor(o, x(step, 2 * world, 3))
    got[f"reduce_scatter_tensor{step}"] = o
    t = x(step, 5)
    dist.broadcast(t, src=world - 1)
    got[f"broadcast{step}"] = t
    outs = [torch.empty(2) for _ in range(world)]
    dist.all_to_all(outs, [x(step, 2) + 10 * i for i in range(world)])
    got[f"all_to_all{step}"] = torch.stack(outs)
    o = torch.empty(world * 2)
    dist.all_to_all_single(o, x(step, world * 2))
    got[f"all_to_all_single{step}"] = o
    # Receives from any source: rank 0 takes one message from every other rank, in the
    # order they come (the replay keeps the recorded order and names the sender).
    if rank == 0:
        msgs, srcs = [], []
        for _ in range(world - 1):
            t = torch.empty(4)
            srcs.append(dist.recv(t, tag=7))
            msgs.append(t)
        got[f"anysource{step}"] = torch.stack(msgs)
        got[f"anysource_from{step}"] = torch.tensor(srcs)
    else:
        time.sleep(0.005 * rank)
        dist.send(x(step, 4), 0, tag=7)
    if rank in (0, 1):
        t = x(step, 6)
        if rank == 0:
            dist.send(t, 1, group=pair)
            dist.recv(t, 1, group=pair)
        else:
            r = torch.empty(6)
            dist.recv(r, 0, group=pair)
            dist.send(t, 0, group=pair)
            t = r
        got[f"p2p{step}"] = t
        m = x(step, 2)
        dist.all_reduce(m, group=pair, op=dist.ReduceOp.MAX)
        got[f"pair_max{step}"] = m
    param.grad = got[f"all_reduce{step}"][0].clone()
    opt.step()

dist.barrier()
torch.save(got, os.path.join(out_dir, f"{os.environ.get('PRISM_TEST_TAG', 'rec')}-{rank}.pt"))
dist.destroy_process_group()
