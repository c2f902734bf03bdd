"""A tiny linear model trained data-parallel by hand (gradients all-reduced) in pairs of ranks.

Run as one rank of a torchrun-style world; argv: STEPS [OUT_DIR]: with OUT_DIR each rank
writes the environment it saw to OUT_DIR/env-RANK.json.
"""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

torch.set_num_threads(1)
torch.manual_seed(0)
seen = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if len(sys.argv) > 2:
    Path(sys.argv[2], f"env-{rank}.json").write_text(json.dumps({**seen, "rank": rank, "world": world}))
pairs = [dist.new_group([r, r + 1]) for r in range(0, world, 2)]
model = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(int(sys.argv[1])):
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(rank * 100 + step))
    loss = model(x).square().mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    dist.all_reduce(loss.detach(), group=pairs[rank // 2])
    opt.step()
    opt.zero_grad()
dist.barrier()
dist.destroy_process_group()
