"""Steps of fixed-length compute (timed waits, longest on rank 1) and a large all_reduce.

Run as one rank of a torchrun-style world; argv: STEPS.
"""

import sys
import time

import torch
import torch.distributed as dist

COMPUTE_S = (0.005, 0.03, 0.01)  # by rank
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
param = torch.nn.Parameter(torch.zeros(4))
opt = torch.optim.SGD([param], lr=0.1)
grad = torch.ones(1 << 20)
for step in range(int(sys.argv[1])):
    time.sleep(COMPUTE_S[rank % len(COMPUTE_S)])
    dist.all_reduce(grad)
    param.grad = grad[:4].clone()
    opt.step()
dist.barrier()
dist.destroy_process_group()
