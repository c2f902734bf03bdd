"""A plain FSDP2 trainer: four Linear-GELU-Linear blocks each fully_shard'ed over a
DeviceMesh of the world, the root too, Adam, four steps."""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

torch.set_num_threads(1)
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(48, 96), nn.GELU(), nn.Linear(96, 48)) for _ in range(4)])
for layer in model:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(dist.get_rank())
for step in range(4):
    model(torch.randn(8, 48, generator=g)).square().mean().backward()
    opt.step()
    opt.zero_grad()
dist.barrier()
dist.destroy_process_group()
