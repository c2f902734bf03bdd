"""An FSDP2 trainer as real jobs write one: a DeviceMesh over the devices at hand,
`fully_shard` on each block and then the root (torchtitan's order), bf16 parameters with
fp32 gradient reduction on CUDA, AdamW, gradient clipping over the sharded norm.

    torchrun --nproc-per-node 2 bench/workloads/fsdp_train.py --steps 12

CUDA and nccl where torch sees a GPU (one rank per device), else CPU and gloo. Run by
bench/gpu_fidelity.py under `prism-rr record` and `prism-rr replay`. Data is synthetic and
seeded per rank; the batch is per rank, so a `scale`d replay runs it unchanged.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


@dataclass
class Config:
    vocab: int = 512
    dim: int = 256
    heads: int = 4
    layers: int = 4
    seq: int = 128
    batch: int = 8  # per rank


class Block(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.norm1 = nn.LayerNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.fc = nn.Linear(cfg.dim, 4 * cfg.dim, bias=False)
        self.out = nn.Linear(4 * cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.norm2(x))))


class Model(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    for name, default in vars(Config()).items():
        p.add_argument(f"--{name}", type=int, default=default)
    args = p.parse_args()
    cfg = Config(**{k: getattr(args, k) for k in vars(Config())})

    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl", device_id=device)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        device = torch.device("cpu")
        dist.init_process_group(backend="gloo")
        mp = MixedPrecisionPolicy()
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("dp",))

    torch.manual_seed(0)  # every rank builds the same model; fully_shard keeps its shard
    model = Model(cfg).to(device)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)  # foreach over the DTensor shards

    g = torch.Generator().manual_seed(1 + dist.get_rank())
    for _ in range(args.steps):
        tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=g).to(device, non_blocking=True)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, cfg.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
