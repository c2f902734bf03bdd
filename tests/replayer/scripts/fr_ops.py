"""Every call a replay of a gloo Flight Recorder dump must recognise, at world 2.

Each entry of gloo's recorder names and shapes a call as the backend runs it, not always
as the program made it (an all_gather_into_tensor is an all_gather there, a
reduce_scatter_tensor the all_reduce it runs, an all_to_all_single an all_to_all); some
calls leave no entry (sends, receives, monitored_barrier). Then the program ends, and
fr_watchdog.py (FR_DUMPS, JOB_HOLD) dumps every rank once it stops.
"""

import torch
import torch.distributed as dist

import fr_watchdog

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
fr_watchdog.start(rank)
pair = dist.new_group([0, 1], group_desc="pair")
t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
for _ in range(2):
    dist.all_reduce(t)
    dist.all_gather_into_tensor(torch.empty(world * 2, 3), t)
    dist.all_gather([torch.empty(2, 3) for _ in range(world)], t)
    dist.reduce_scatter_tensor(torch.empty(1, 3), t[:world].contiguous())
    dist.broadcast(t, src=1)
    dist.reduce(t, dst=1)
    dist.gather(t, [torch.empty(2, 3) for _ in range(world)] if rank == 0 else None, dst=0)
    dist.scatter(torch.empty(2, 3), [torch.ones(2, 3) for _ in range(world)] if rank == 0 else None, src=0)
    dist.all_to_all_single(torch.empty(4), torch.ones(4))
    dist.all_to_all([torch.empty(2) for _ in range(world)], [torch.ones(2) for _ in range(world)])
    dist.all_reduce_coalesced([torch.ones(3), torch.ones(2, 2)])
    dist.all_gather_object([None] * world, {"rank": rank})
    dist.broadcast_object_list([rank], src=0)
    if rank == 0:
        dist.send(torch.ones(3), 1)
    else:
        dist.recv(torch.empty(3), 0)
    dist.monitored_barrier()
    dist.all_reduce(torch.ones(5, dtype=torch.int64), group=pair)
    dist.barrier()
fr_watchdog.settled()
fr_watchdog.end()
dist.destroy_process_group()
