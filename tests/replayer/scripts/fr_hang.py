"""A job that hangs: rank 1 skips a call of a second group that rank 0 makes.

    fr_hang.py [fixed|shape|early]   (none: the job as it hung · fixed: rank 1 makes that
                                      call too · shape: rank 0 passes 5 values there, not 4 ·
                                      early: rank 0's first loss all_reduce has 6 values)

Two ranks train three steps: the gradients all-reduced on WORLD, the loss on a second
group (`row`: ranks 0 and 1). Then rank 0 all-reduces a last value on `row`, and rank 1,
whose program skips that call, ends: rank 0 waits for ever. fr_watchdog.py makes it a
production job with Flight Recorder on, where its environment asks (FR_DUMPS, JOB_HOLD).
"""

import sys

import torch
import torch.distributed as dist

import fr_watchdog

torch.set_num_threads(1)
mode = sys.argv[1] if len(sys.argv) > 1 else "hung"
dist.init_process_group("gloo")
rank = dist.get_rank()
fr_watchdog.start(rank)
row = dist.new_group([0, 1], group_desc="row")
torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.ones(2, 4)).sum()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    width = 6 if mode == "early" and rank == 0 and step == 0 else 4
    dist.all_reduce(loss.detach().reshape(1).repeat(width), group=row)
    opt.step()
    opt.zero_grad()
fr_watchdog.settled()
last = torch.ones(5 if mode == "shape" and rank == 0 else 4)
if rank == 0 or mode == "fixed":
    dist.all_reduce(last, group=row)  # rank 1 skips it: rank 0 waits here
fr_watchdog.end()
dist.destroy_process_group()
