"""A small trainer as GPU jobs are written: nccl bound to the rank's device, a DeviceMesh,
DDP over its group, and the usual logging collectives, all on CUDA tensors.

Run by tests/gpu/test_gpu.py under `prism-rr record` and `prism-rr replay` (one rank on a
one-GPU machine, so every call of its own is in a step: DDP's buckets, the logged loss,
a gathered metric, a broadcast flag). Every step has collectives even at world 1.
Without CUDA (bench/gpu_fidelity.py --device cpu) it runs the same on gloo with CPU tensors.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group(backend="gloo")
    world = dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).to(device),
                device_ids=None if device.type == "cpu" else [device.index], process_group=mesh.get_group("dp"),
                bucket_cap_mb=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator(device="cpu").manual_seed(1 + dist.get_rank())
    for step in range(args.steps):
        x = torch.randn(64, 256, generator=g).to(device)
        loss = (model(x) - x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        logged = loss.detach().clone()
        dist.all_reduce(logged, group=mesh.get_group("dp"))  # the mean loss for the log
        norms = torch.empty(world, device=device)
        dist.all_gather_into_tensor(norms, logged.reshape(1))
        stop = torch.zeros(1, device=device)
        dist.broadcast(stop, src=0)  # rank 0 decides whether to stop
        if dist.get_rank() == 0:
            print(f"step {step} loss {logged.item() / world:.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
