"""A small training loop: one gradient all_reduce per step, 4 steps."""

import torch
import torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
flat = torch.zeros(sum(p.numel() for p in model.parameters()))
for step in range(4):
    loss = model(torch.randn(4, 8)).square().mean()
    loss.backward()
    torch.cat([p.grad.reshape(-1) for p in model.parameters()], out=flat)
    dist.all_reduce(flat)
    opt.step()
    opt.zero_grad()
dist.barrier()
dist.destroy_process_group()
