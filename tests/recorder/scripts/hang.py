"""Rank 1 skips the 4th all_reduce (or dies with SIGKILL there): rank 0 waits in it forever."""

import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

torch.set_num_threads(1)
mode, marker_dir = sys.argv[1], Path(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.ones(2, 4)).sum()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    opt.zero_grad()
time.sleep(0.7)  # past the spool writer's flush interval
if rank == 1:
    (marker_dir / f"stuck-{rank}").write_text(str(os.getpid()))
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)  # the planted hang: this rank never joins the next all_reduce
(marker_dir / f"stuck-{rank}").write_text(str(os.getpid()))
dist.all_reduce(torch.ones(3))
