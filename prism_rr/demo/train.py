"""Train the demo GPT with torch's own parallelism; run it under torchrun.

    torchrun --nproc-per-node 4 -m prism_rr.demo.train --tp 2           # FSDP2 x TP
    torchrun --nproc-per-node 2 -m prism_rr.demo.train --dp-mode ddp    # DDP
    torchrun --nproc-per-node 2 -m prism_rr.demo.train --pp 2           # pipelining

Layouts (world = the number of ranks):
- default: a 2-D DeviceMesh (dp, tp) with dp = world / tp. Tensor parallelism
  shards attention and MLP with DTensor ColwiseParallel/RowwiseParallel; data
  parallelism is FSDP2 ``fully_shard`` on the dp sub-mesh, or DDP on the dp
  sub-mesh's process group with ``--dp-mode ddp``.
- ``--pp P``: a 2-D DeviceMesh (dp, pp); each rank builds one PipelineStage
  (a contiguous slice of the layers) and runs a GPipe or 1F1B schedule over
  the pp process group, with FSDP2 or DDP across dp when dp > 1.

Everything is deterministic (seeded init, seeded synthetic data, single
threaded CPU kernels) so two runs of one layout give bitwise equal weights.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel as DDP

from prism_rr.demo.model import GPT, GPTConfig

# Deferred imports: torch's DDP-over-TP transform and its pipelining, only in the layouts that use them.

__all__ = ["main", "make_batch"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m prism_rr.demo.train", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel degree (>1 selects pipelining)")
    p.add_argument("--dp-mode", choices=("fsdp", "ddp"), default="fsdp")
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="1f1b", help="pipeline schedule")
    p.add_argument("--microbatches", type=int, default=4, help="pipeline microbatches per step")
    p.add_argument("--batch-size", type=int, default=8, help="global batch, split over dp")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--save-params", metavar="PATH", help="each rank saves its local params to PATH.rank{R}.pt")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def make_batch(step: int, cfg: GPTConfig, batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch for one step: arithmetic sequences mod vocab.

    Each row starts at a random token and counts up by a random stride, so
    the next token is predictable from context and the loss goes down. The
    whole global batch is drawn from a generator seeded by (seed, step), so it
    is the same whatever the layout; ranks take their dp slice of it.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(0, cfg.vocab_size, (batch_size, 1), generator=g)
    stride = torch.randint(1, 8, (batch_size, 1), generator=g)
    seq = (start + stride * torch.arange(cfg.block_size + 1)) % cfg.vocab_size
    return seq[:, :-1], seq[:, 1:]


def init_distributed() -> torch.device:
    """Join the job torchrun (or prism_rr.localrun) set up in the environment."""
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        # device_id binds the NCCL communicator to this rank's GPU up front.
        dist.init_process_group(backend="nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group(backend="gloo")
    return device


def apply_tp(model: GPT, tp_mesh: DeviceMesh) -> None:
    """Megatron-style TP: q/k/v and fc split by output features (whole heads
    per rank), proj split by input features, so each block needs one
    all-reduce per sub-layer in forward and one in backward."""
    plan = {
        "attn.q": ColwiseParallel(),
        "attn.k": ColwiseParallel(),
        "attn.v": ColwiseParallel(),
        "attn.proj": RowwiseParallel(),
        "mlp.fc": ColwiseParallel(),
        "mlp.proj": RowwiseParallel(),
    }
    for block in model.h.values():
        parallelize_module(block, tp_mesh, plan)


def apply_fsdp(model: GPT, dp_mesh: DeviceMesh) -> None:
    """FSDP2: one all-gather/reduce-scatter group per block, then the rest
    (embeddings, final norm, head) in the root group."""
    for block in model.h.values():
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)


def wrap_ddp(model: nn.Module, dp_mesh: DeviceMesh, has_tp: bool) -> nn.Module:
    """DDP over the dp sub-mesh's process group.

    DDP cannot bucket DTensor parameters, so with TP we use torch's own bridge
    (torch.distributed.tensor.parallel.ddp): parameters become local shards for
    DDP and are re-wrapped as DTensors around each forward.
    """
    if has_tp:
        from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

        _pre_dp_module_transform(model)
    return DDP(model, process_group=dp_mesh.get_group())


def local_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Name -> this rank's piece of every parameter (DTensor shards unwrapped)."""
    out = {}
    for name, p in model.named_parameters():
        t = p.to_local() if isinstance(p, DTensor) else p
        out[name] = t.detach().cpu().clone()
    return out


def log(args: argparse.Namespace, msg: str) -> None:
    if not args.quiet:
        print(msg, file=sys.stderr, flush=True)


def train_spmd(args: argparse.Namespace, cfg: GPTConfig, device: torch.device) -> nn.Module:
    """dp x tp: every rank runs the whole model on its dp slice of the batch."""
    world = dist.get_world_size()
    if world % args.tp or cfg.n_head % args.tp:
        raise SystemExit(f"--tp {args.tp} must divide the world size {world} and n_head {cfg.n_head}")
    dp = world // args.tp
    mesh = init_device_mesh(device.type, (dp, args.tp), mesh_dim_names=("dp", "tp"))
    dp_mesh, tp_mesh = mesh["dp"], mesh["tp"]

    # Every rank builds the same full model from the seed; parallelize_module
    # and fully_shard then keep only this rank's shards.
    torch.manual_seed(args.seed)
    model = GPT(cfg).to(device)
    if args.tp > 1:
        apply_tp(model, tp_mesh)
    if args.dp_mode == "fsdp":
        apply_fsdp(model, dp_mesh)
        net: nn.Module = model
    else:
        net = wrap_ddp(model, dp_mesh, has_tp=args.tp > 1)
    # foreach=False: one plain kernel per parameter, the simplest to replay.
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, foreach=False)

    if args.batch_size % dp:
        raise SystemExit(f"--batch-size {args.batch_size} is not a multiple of dp {dp}")
    dp_rank, rows = dp_mesh.get_local_rank(), args.batch_size // dp
    for step in range(args.steps):
        t0 = time.perf_counter()
        x, y = make_batch(step, cfg, args.batch_size, args.seed)
        x = x[dp_rank * rows : (dp_rank + 1) * rows].to(device)
        y = y[dp_rank * rows : (dp_rank + 1) * rows].to(device)
        logits = net(x)
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dist.get_rank() == 0:
            # Rank 0's own dp slice; averaging over dp would add a collective.
            log(args, f"step {step} loss {loss.item():.4f} time {time.perf_counter() - t0:.6f}s")
    return net


def train_pp(args: argparse.Namespace, cfg: GPTConfig, device: torch.device) -> nn.Module:
    """pp (x dp): each rank owns one pipeline stage, a slice of the layers."""
    world = dist.get_world_size()
    if world % args.pp or cfg.n_layer % args.pp:
        raise SystemExit(f"--pp {args.pp} must divide the world size {world} and --n-layer {cfg.n_layer}")
    dp = world // args.pp
    mesh = init_device_mesh(device.type, (dp, args.pp), mesh_dim_names=("dp", "pp"))
    dp_mesh, pp_mesh = mesh["dp"], mesh["pp"]
    stage_idx, n_stages = pp_mesh.get_local_rank(), args.pp
    model = split_stage(cfg, args.seed, stage_idx, n_stages, device)

    if args.batch_size % (dp * args.microbatches):
        raise SystemExit(f"--batch-size {args.batch_size} is not a multiple of dp {dp} x --microbatches")
    rows = args.batch_size // dp
    model, schedule = build_pipeline(args, cfg, model, stage_idx, rows // args.microbatches, dp_mesh, pp_mesh,
                                     device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, foreach=False)

    dp_rank = dp_mesh.get_local_rank()
    is_last = stage_idx == n_stages - 1
    for step in range(args.steps):
        t0 = time.perf_counter()
        x, y = make_batch(step, cfg, args.batch_size, args.seed)
        # contiguous(): the stage's example input (build_pipeline) declares the layout (shape and stride) of
        # what the stage gets; a slice of the (rows, block_size + 1) sequences has another
        # stride, which the stage's metadata check refuses whenever it runs (torch runs it
        # when the stages vote for inferring shapes, or under TORCH_DISTRIBUTED_DEBUG=DETAIL).
        x = x[dp_rank * rows : (dp_rank + 1) * rows].contiguous().to(device)
        y = y[dp_rank * rows : (dp_rank + 1) * rows].contiguous().to(device)
        losses: list[torch.Tensor] = []
        if stage_idx == 0:
            schedule.step(x)
        elif is_last:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        # Only the last stage sees a loss; its first dp rank prints it.
        if is_last and dp_rank == 0:
            loss = torch.stack(losses).mean().item()
            log(args, f"step {step} loss {loss:.4f} time {time.perf_counter() - t0:.6f}s")
    return model


def split_stage(cfg: GPTConfig, seed: int, stage_idx: int, n_stages: int, device: torch.device) -> GPT:
    """This stage's slice of the model. Build the full model from the seed, then drop what
    this stage does not own (torchtitan's manual split): the weights match the unsplit
    model's."""
    torch.manual_seed(seed)
    model = GPT(cfg)
    per_stage = cfg.n_layer // n_stages
    keep = range(stage_idx * per_stage, (stage_idx + 1) * per_stage)
    for i in list(model.h.keys()):
        if int(i) not in keep:
            del model.h[i]
    if stage_idx != 0:
        model.wte = model.wpe = None
    if stage_idx != n_stages - 1:
        model.ln_f = model.lm_head = None
    return model.to(device)


def build_pipeline(args: argparse.Namespace, cfg: GPTConfig, model: nn.Module, stage_idx: int, mb: int,
                   dp_mesh: DeviceMesh, pp_mesh: DeviceMesh, device: torch.device):
    """This stage's model over dp (FSDP2 or DDP, where dp > 1) and the pipeline schedule
    (GPipe or 1F1B) that runs it over the pp group: (model, schedule)."""
    # Imported here: torch.distributed.pipelining pulls in torch._dynamo, about
    # a second of start-up that the other layouts need not pay.
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    n_stages = args.pp
    # Example microbatch input and output of this stage: with them the stage
    # skips shape inference (pickled metadata over p2p) on the first step.
    # requires_grad matters: it tells the stage which gradients flow back.
    hidden = torch.empty(mb, cfg.block_size, cfg.n_embd, device=device, requires_grad=True)
    ids = torch.empty(mb, cfg.block_size, dtype=torch.long, device=device)
    logits = torch.empty(mb, cfg.block_size, cfg.vocab_size, device=device, requires_grad=True)
    stage_in = ids if stage_idx == 0 else hidden
    stage_out = logits if stage_idx == n_stages - 1 else hidden

    if dp_mesh.size() > 1:
        if args.dp_mode == "fsdp":
            apply_fsdp(model, dp_mesh)
        else:
            model = wrap_ddp(model, dp_mesh, has_tp=False)
    stage = PipelineStage(
        model,
        stage_idx,
        n_stages,
        device,
        input_args=(stage_in,),
        output_args=(stage_out,),
        group=pp_mesh.get_group(),
    )

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.reshape(-1, cfg.vocab_size), target.reshape(-1))

    sched_cls = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
    return model, sched_cls(stage, n_microbatches=args.microbatches, loss_fn=loss_fn)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # Ranks share the machine's cores; more threads only fight each other and
    # make float reductions depend on the thread count.
    torch.set_num_threads(1)
    device = init_distributed()
    cfg = GPTConfig(n_layer=args.n_layer)
    try:
        if args.pp > 1:
            if args.tp > 1:
                raise SystemExit("--pp with --tp is not supported by the demo")
            model = train_pp(args, cfg, device)
        else:
            model = train_spmd(args, cfg, device)
        if args.save_params:
            torch.save(local_params(model), f"{args.save_params}.rank{dist.get_rank()}.pt")
        # Without a final barrier a fast rank's gloo teardown can abort a peer
        # that is still in its last collective.
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
