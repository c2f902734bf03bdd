"""A small data-parallel trainer written the way many are (gradients all-reduced by hand,
parameter by parameter; the loss all-reduced for the log at the end), with the bugs that
break real jobs, chosen by argv[1]:

  ok        no bug: 4 steps
  skip      a data-dependent branch leaves rank 1 without a gradient for one parameter in
            step 2, and `if p.grad is not None` skips its all_reduce: from there on every
            call of rank 1 pairs with the wrong one of rank 0 (gradients of one size, so gloo
            cannot tell) until rank 1's loss all_reduce meets rank 0's last gradient
  skip-fixed  the same program with the fix (a zero gradient where there is none)
  mismatch  rank 1's loss tensor for the log has another length: gloo aborts
  slow      in step 2 rank 1 stalls (a data loader stuck on a file system) past the group's
            timeout: rank 0's all_reduce times out and raises; rank 1 then fails too

argv[2]: the gloo timeout in seconds (default 3); argv[3]: the learning rate (default 0.01).
"""

import datetime
import sys
import time

import torch
import torch.distributed as dist

mode = sys.argv[1]
timeout = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(16, 16, bias=False)
        self.gate = torch.nn.Linear(16, 16, bias=False)  # only for batches that need it
        self.out = torch.nn.Linear(16, 16, bias=False)

    def forward(self, x, hard: bool):
        x = torch.relu(self.inp(x))
        if hard:
            x = x + torch.sigmoid(self.gate(x))
        return self.out(x)


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=float(sys.argv[3]) if len(sys.argv) > 3 else 0.01)
for step in range(4):
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(8, 16, generator=g)
    hard = not (mode.startswith("skip") and rank == 1 and step == 2)  # this batch needs no gate
    loss = model(x, hard).square().mean()
    loss.backward()
    if mode == "slow" and rank == 1 and step == 2:
        time.sleep(timeout + 3)
    for p in model.parameters():
        if p.grad is None and mode == "skip-fixed":
            p.grad = torch.zeros_like(p)
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= world
    opt.step()
    opt.zero_grad(set_to_none=True)
stats = [loss.detach(), torch.tensor(8.0)]
if mode == "mismatch" and rank == 1:
    stats.append(torch.tensor(0.0))  # a counter only this rank's data path adds
metric = torch.stack(stats)
dist.all_reduce(metric)
if rank == 0:
    print(f"loss {metric[0].item() / world:.4f}", flush=True)
dist.destroy_process_group()
