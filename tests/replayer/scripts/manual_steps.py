"""Steps marked by hand with `prism_rr.step()`, and no optimizer: two all_reduces a step.

Run as one rank of a torchrun-style world; argv: STEPS.
"""

import sys
import time

import torch
import torch.distributed as dist

import prism_rr

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(1024)
for step in range(int(sys.argv[1])):
    time.sleep(0.002 * (rank + 1))
    dist.all_reduce(x)
    dist.all_reduce(x[:16])
    prism_rr.step()
dist.barrier()
dist.destroy_process_group()
