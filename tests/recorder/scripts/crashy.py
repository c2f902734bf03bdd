"""Two gloo ranks that die hard, chosen by argv[1] (argv[2]: a directory for marker files).

loop: small all_reduces (a training-like step of 4 every few ms) until killed from outside;
"ready-<rank>" is touched once the loop runs. bigloop: the same with an all_reduce of
8 MiB of noise a step, whose payload takes a while to compress. abort: in step 2 of 5 the last rank
all_reduces a tensor of another size, and gloo aborts the process (SIGABRT). segv: in
step 2 of 5 rank 1 reads address 0 (SIGSEGV). drift: rank 1 makes one all_reduce
fewer in step 2 and goes on. The survivors give up after a short gloo
timeout, as a watchdog would end a broken job.
"""

import ctypes
import datetime
import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

torch.set_num_threads(1)
mode, marker_dir = sys.argv[1], Path(sys.argv[2])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5 if mode.endswith("loop") else 3))
rank = dist.get_rank()
world = dist.get_world_size()
model = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def step_once():
    loss = model(torch.ones(2, 8)).sum()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)


if mode in ("loop", "bigloop"):
    noise = torch.Generator().manual_seed(rank)
    deadline = time.monotonic() + 60
    step = 0
    while time.monotonic() < deadline:
        step_once()
        dist.all_reduce(torch.ones(3))
        if mode == "bigloop":
            dist.all_reduce(torch.randn(2 << 20, generator=noise).round(decimals=2))
        opt.step()
        opt.zero_grad()
        time.sleep(0.002)
        if step == 3:
            (marker_dir / f"ready-{rank}").touch()
        step += 1
    sys.exit(0)

if mode == "drift":
    # three equal all_reduces a step; rank 1 makes two in step 2, so from there on its
    # calls pair with the wrong ones (of one size: gloo does not notice) and, at the end,
    # rank 0 waits alone in its last call until gloo's timeout
    for step in range(5):
        for i in range(3):
            if not (rank == 1 and step == 2 and i == 2):
                dist.all_reduce(torch.ones(3))
        opt.step()
    if rank == 1:
        time.sleep(4)  # rank 0 times out first
    sys.exit(0)

for step in range(5):
    step_once()
    if step == 2:
        time.sleep(0.3)  # what came before is older than the 100 ms the spool may lose
        if mode == "abort":
            dist.all_reduce(torch.ones(5) if rank == world - 1 else torch.ones(3))
        elif mode == "segv" and rank == 1:
            ctypes.string_at(0)
        elif mode == "exit":
            if rank == 0:
                time.sleep(0.6)
            else:
                threading.Timer(0.3, os._exit, (7,)).start()
            dist.all_reduce(torch.full((7,), float(step)))
    dist.all_reduce(torch.ones(3))
    opt.step()
    opt.zero_grad()
dist.barrier()
dist.destroy_process_group()
