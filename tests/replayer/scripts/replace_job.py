"""Data-parallel steps for `replay --replace-rank`: fixed compute, then each parameter's
gradient all_reduced (messages of four sizes, so the cost model can tell a bandwidth).

Run as one rank of a torchrun-style world of any size; argv: STEPS.
"""

import sys
import time

import torch
import torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo")
world = dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(int(sys.argv[1])):
    time.sleep(0.02)
    loss = model(torch.randn(8, 512, generator=torch.Generator().manual_seed(step))).square().mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    opt.zero_grad()
dist.barrier()
dist.destroy_process_group()
