"""DDP with gradients as views of its buckets, changed in place after backward (gradient
clipping) before the optimizer step. Saves each step's gradients as backward left them
(the all_reduce's results) to OUT.rank{R}.pt."""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

torch.set_num_threads(1)
out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)),
            gradient_as_bucket_view=True)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(rank)
grads = []
for step in range(3):
    model(torch.randn(16, 32, generator=gen)).square().mean().backward()
    grads.append([p.grad.detach().clone() for p in model.parameters()])
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e-3)  # in place, in the bucket
    opt.step()
    opt.zero_grad(set_to_none=False)
torch.save(grads, f"{out}.rank{rank}.pt")
dist.barrier()
dist.destroy_process_group()
