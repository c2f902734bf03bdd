"""The in-process API on a one-rank world: record() around init and training, then pack."""

import os
import sys

import torch
import torch.distributed as dist

import prism_rr.recorder as recorder

torch.set_num_threads(1)
out = sys.argv[1]
with recorder.record(out, steps="1:"):
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{sys.argv[2]}")
    for step in range(3):
        t = torch.full((4,), float(step))
        dist.all_reduce(t)
        recorder.step()
    dist.destroy_process_group()
print("done", os.path.exists(out))
