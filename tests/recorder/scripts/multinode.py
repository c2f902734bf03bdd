"""A tiny training loop for two-"node" tests: a gradient all_reduce and a broadcast per step, 3 steps."""

import torch
import torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
flat = torch.zeros(sum(p.numel() for p in model.parameters()))
for step in range(3):
    loss = model(torch.randn(2, 4)).square().mean()
    loss.backward()
    torch.cat([p.grad.reshape(-1) for p in model.parameters()], out=flat)
    dist.all_reduce(flat)
    lr = torch.tensor([0.1])
    dist.broadcast(lr, src=0)
    opt.step()
    opt.zero_grad()
dist.barrier()
dist.destroy_process_group()
