"""Payload-heavy and short: 2 ranks all_reduce 256 KiB tensors (5 MiB in all), then exit
with the code given (argv[1]); `--break-recorder R` makes rank R's recorder fail at step 2."""

import sys

import torch
import torch.distributed as dist

torch.set_num_threads(1)
code = int(sys.argv[1]) if len(sys.argv) > 1 else 0
broken = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--break-recorder" else None
dist.init_process_group("gloo")
rank = dist.get_rank()
gen = torch.Generator().manual_seed(rank)
total = torch.zeros(64 * 1024)
for step in range(20):
    if step == 2 and rank == broken:
        from prism_rr.intercept import payload as _payload

        def _broken(*args):
            raise RuntimeError("planted failure")

        _payload.blobs = _broken
    x = torch.rand(64 * 1024, generator=gen)
    dist.all_reduce(x)
    total += x
    try:
        import prism_rr

        prism_rr.step()
    except ImportError:
        pass
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} total {total.sum().item():.6f}")
sys.exit(code)
