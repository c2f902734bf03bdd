"""A small trainer that loads its data between steps (a sleep stands for it).

`python pausing.py MARKERS [--late-rank R] [--late-step S] [--finish-step-on-sigterm]`:
rank R (none by default) starts late (step -1: before init_process_group) or loads step
S's data slowly, so the others wait for it in init or in that step's all_reduce. Each
rank touches MARKERS/step-<rank>-<step> as it starts a step (step -1: as it calls init).
With --finish-step-on-sigterm, SIGTERM stops the loop at the end of the step (where a
trainer would save a checkpoint), as many trainers do.
"""

import argparse
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("markers", type=Path)
p.add_argument("--late-rank", type=int, default=-1)
p.add_argument("--late-step", type=int, default=-1)
p.add_argument("--finish-step-on-sigterm", action="store_true")
args = p.parse_args()
stopping = False


def finish_step(signum, frame):
    global stopping
    stopping = True


if args.finish_step_on_sigterm:
    signal.signal(signal.SIGTERM, finish_step)
torch.set_num_threads(1)
rank = int(os.environ["RANK"])


def load_data(step):
    time.sleep(600 if (rank, step) == (args.late_rank, args.late_step) else 0.3)
    (args.markers / f"step-{rank}-{step}").touch()
    return torch.randn(4, 8)


load_data(-1)
dist.init_process_group("gloo")
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(200):
    loss = model(load_data(step)).square().mean()
    loss.backward()
    for param in model.parameters():
        dist.all_reduce(param.grad)
    opt.step()
    opt.zero_grad()
    if stopping:
        break
dist.barrier()
dist.destroy_process_group()
