"""Rank 1 is late to every step's calls by LATE_S; rank 0 waits for it. Each step: a
blocking all_reduce, an asynchronous one waited for after some compute, and a message
from rank 0 to rank 1. Steps are optimizer steps."""

import time

import torch
import torch.distributed as dist

LATE_S = 0.15

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    model(torch.randn(4, 8)).square().mean().backward()
    if rank == 1:
        time.sleep(LATE_S)
    grad = model.weight.grad
    dist.all_reduce(grad)
    work = dist.all_reduce(model.bias.grad, async_op=True)
    torch.randn(64, 64) @ torch.randn(64, 64)
    work.wait()
    msg = torch.full((4,), float(step))
    if rank == 0:
        dist.send(msg, 1)
    else:
        dist.recv(msg, 0)
    opt.step()
    opt.zero_grad()
dist.barrier()
dist.destroy_process_group()
