"""A small DDP-style loop with one planted fault, chosen by argv[1].

clean: nothing wrong. skip: rank 1 skips the last all_reduce. shape: the last rank all_reduces a
tensor of another shape (same size) in step 2. slow: rank 1 sleeps 100 ms before each step's
first all_reduce. kill: rank 1 dies (SIGKILL) before the last all_reduce.
Waiting ranks give up after a short gloo timeout, as a watchdog would end a hung job.
"""

import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

torch.set_num_threads(1)
mode = sys.argv[1]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=4))
rank = dist.get_rank()
model = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
steps = 8 if mode == "slow" else 4
a = torch.rand(64, 64)


def work(seconds):
    """Compute for a fixed wall time, so that every rank's step is as long as the others'."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a @ a


for step in range(steps):
    loss = model(torch.ones(2, 8)).sum()
    loss.backward()
    work(0.1)
    if mode == "slow" and rank == 1:
        time.sleep(0.1)
    for p in model.parameters():
        dist.all_reduce(p.grad)
    if mode == "shape" and step == 2:
        # same size, another shape: gloo reduces it without complaint (a size that differs
        # makes gloo abort the process before the recorder can write the call)
        dist.all_reduce(torch.ones(1, 3) if rank == dist.get_world_size() - 1 else torch.ones(3))
    opt.step()
    opt.zero_grad()
if mode == "kill" and rank == 1:
    time.sleep(0.7)  # past the spool writer's flush interval: what it recorded is on disk
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "skip" and rank == 1:
    time.sleep(6)  # the others wait in the all_reduce this rank never joins, then time out
else:
    dist.all_reduce(torch.ones(3))
if mode in ("clean", "slow"):
    dist.barrier()
dist.destroy_process_group()
