"""A job that fails once and is restarted (torchrun --max-restarts 1).

In attempt 0 rank 1 exits with code 17 in step 2, after its gradient all_reduces; rank 0
then loses its peer in its next call ("Connection closed by peer") and dies of it; torchrun
starts both again, and attempt 1 runs its 4 steps to the end. Each attempt rendezvouses
through a file store of its own (argv[1]/store-<run id>-<restart count>): under
--standalone a second attempt can otherwise read the first one's address from torchrun's
TCP store and fail to connect, with or without prism-rr.
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist

torch.set_num_threads(1)
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
store = os.path.join(sys.argv[1], f"store-{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}-{restart}")
dist.init_process_group("gloo", init_method=f"file://{store}", rank=int(os.environ["RANK"]),
                        world_size=int(os.environ["WORLD_SIZE"]), timeout=datetime.timedelta(seconds=20))
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    loss = model(torch.ones(2, 4)).sum()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    if restart == 0 and step == 2 and rank == 1:
        sys.exit(17)
    dist.all_reduce(loss.detach())
    opt.step()
    opt.zero_grad()
dist.barrier()
dist.destroy_process_group()
