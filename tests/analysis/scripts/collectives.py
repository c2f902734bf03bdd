"""Two ranks, three optimizer steps of all_reduce and broadcast. argv[1] "changed": the
second step's broadcast is an all_gather, as a code change might make it."""

import sys

import torch
import torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
p = torch.nn.Parameter(torch.zeros(4))
opt = torch.optim.SGD([p], lr=0.1)
for step in range(3):
    x = torch.ones(4) * (rank + step)
    dist.all_reduce(x)
    if step == 1 and sys.argv[1:] == ["changed"]:
        dist.all_gather([torch.empty(4), torch.empty(4)], x)
    else:
        dist.broadcast(x, src=0)
    p.grad = x.clone()
    opt.step()
dist.destroy_process_group()
