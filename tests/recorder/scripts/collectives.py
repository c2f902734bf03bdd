"""Every collective and point-to-point call once or twice; each rank writes what it did.

Run as one rank of a torchrun-style world (2 to 4 ranks). Writes <out>/expected-<rank>.json:
the calls this rank made, in order, as the recorder should see them.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

torch.set_num_threads(1)
out_dir = sys.argv[1]
only = set(sys.argv[2].split(",")) if len(sys.argv) > 2 and sys.argv[2] else None

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
sub_ranks = [0, 1]
sub = dist.new_group(sub_ranks)  # every rank calls new_group; ranks 0 and 1 are members
expected = []


def note(op, group, ins, outs, **extra):
    expected.append({
        "op": op, "group": group,
        "in_shapes": [list(t.shape) for t in ins], "out_shapes": [list(t.shape) for t in outs],
        "in_bytes": sum(t.numel() * t.element_size() for t in ins),
        "out_bytes": sum(t.numel() * t.element_size() for t in outs),
        **extra,
    })


def x(*shape, dtype=torch.float32):
    return (torch.arange(int(torch.tensor(shape).prod())) + rank).reshape(shape).to(dtype)


def want(name):
    return only is None or name in only


if want("all_reduce"):
    t = x(4, 3)
    dist.all_reduce(t)
    note("all_reduce", 0, [t], [t], reduce_op="SUM")
    t = x(5)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True).wait()
    note("all_reduce", 0, [t], [t], reduce_op="MAX", async_op=True)
if want("all_reduce_coalesced"):
    ts = [x(2), x(3, 2)]
    dist.all_reduce_coalesced(ts)
    note("all_reduce_coalesced", 0, ts, ts, reduce_op="SUM")
if want("all_gather"):
    t = x(3)
    outs = [torch.empty(3) for _ in range(world)]
    dist.all_gather(outs, t)
    note("all_gather", 0, [t], outs)
if want("all_gather_coalesced"):
    ts = [x(2), x(3, 2)]
    lists = [[torch.empty(2), torch.empty(3, 2)] for _ in range(world)]
    dist.all_gather_coalesced(lists, ts)
    note("all_gather_coalesced", 0, ts, [t for per_rank in lists for t in per_rank])
if want("all_gather_into_tensor"):
    t = x(2, 2)
    o = torch.empty(2 * world, 2)
    dist.all_gather_into_tensor(o, t)
    note("all_gather_into_tensor", 0, [t], [o])
if want("reduce_scatter"):
    ins = [x(3) for _ in range(world)]
    o = torch.empty(3)
    dist.reduce_scatter(o, ins)
    note("reduce_scatter", 0, ins, [o], reduce_op="SUM")
if want("reduce_scatter_tensor"):
    i = x(2 * world, 3)
    o = torch.empty(2, 3)
    dist.reduce_scatter_tensor(o, i)
    note("reduce_scatter_tensor", 0, [i], [o], reduce_op="SUM")
if want("coalesced_into_tensor"):
    ins = [x(2), x(4)]
    outs = [torch.empty(2 * world), torch.empty(4 * world)]
    with dist._coalescing_manager():
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    note("all_gather_into_tensor_coalesced", 0, ins, outs)
    ins = [x(2 * world), x(3 * world)]
    outs = [torch.empty(2), torch.empty(3)]
    with dist._coalescing_manager():
        for o, i in zip(outs, ins):
            dist.reduce_scatter_tensor(o, i)
    note("reduce_scatter_tensor_coalesced", 0, ins, outs, reduce_op="SUM")
if want("all_to_all"):
    ins = [x(2) for _ in range(world)]
    outs = [torch.empty(2) for _ in range(world)]
    dist.all_to_all(outs, ins)
    note("all_to_all", 0, ins, outs)
if want("all_to_all_single"):
    i = x(world * 2)
    o = torch.empty(world * 2)
    dist.all_to_all_single(o, i)
    note("all_to_all_single", 0, [i], [o])
if want("broadcast"):
    t = x(6)
    dist.broadcast(t, src=world - 1)
    note("broadcast", 0, [t], [t], root=world - 1)
if want("reduce"):
    t = x(3)
    dist.reduce(t, dst=1, op=dist.ReduceOp.SUM)
    note("reduce", 0, [t], [t], root=1, reduce_op="SUM")
if want("gather"):
    t = x(2)
    outs = [torch.empty(2) for _ in range(world)] if rank == 0 else []
    dist.gather(t, outs if rank == 0 else None, dst=0)
    note("gather", 0, [t], outs, root=0)
if want("scatter"):
    o = torch.empty(3)
    ins = [x(3) for _ in range(world)] if rank == 0 else []
    dist.scatter(o, ins if rank == 0 else None, src=0)
    note("scatter", 0, ins, [o], root=0)
if want("barrier"):
    dist.barrier()
    note("barrier", 0, [], [])
if want("monitored_barrier"):
    dist.monitored_barrier()
    note("monitored_barrier", 0, [], [])
if want("p2p"):
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    t = x(4)
    r = torch.empty(4)
    # even ranks send first; a ring in both directions
    if rank % 2 == 0:
        dist.send(t, nxt)
        note("send", 0, [t], [t], peer=nxt, p2p=True)
        dist.recv(r, prv)
        note("recv", 0, [r], [r], peer=prv, p2p=True)
    else:
        dist.recv(r, prv)
        note("recv", 0, [r], [r], peer=prv, p2p=True)
        dist.send(t, nxt)
        note("send", 0, [t], [t], peer=nxt, p2p=True)
    reqs = [dist.isend(t, nxt), dist.irecv(r, prv)]
    for q in reqs:
        q.wait()
    note("isend", 0, [t], [t], peer=nxt, p2p=True)
    note("irecv", 0, [r], [r], peer=prv, p2p=True)
    ops = [dist.P2POp(dist.isend, t, nxt), dist.P2POp(dist.irecv, r, prv)]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    note("isend", 0, [t], [t], peer=nxt, p2p=True)
    note("irecv", 0, [r], [r], peer=prv, p2p=True)
if want("functional"):
    t = x(4)
    y = funcol.all_reduce(t, "sum", dist.group.WORLD)
    y = funcol.wait_tensor(y)
    note("all_reduce", 0, [t], [t], reduce_op="SUM", functional=True, async_op=True)
    g = funcol.all_gather_tensor(x(2, 2), 0, dist.group.WORLD)
    g = funcol.wait_tensor(g)
    note("all_gather_into_tensor", 0, [x(2, 2)], [g], functional=True, async_op=True)
    s = funcol.reduce_scatter_tensor(x(2 * world), "sum", 0, dist.group.WORLD)
    s = funcol.wait_tensor(s)
    note("reduce_scatter_tensor", 0, [x(2 * world)], [s], reduce_op="SUM", functional=True, async_op=True)
    a = funcol.all_to_all_single(x(world), None, None, dist.group.WORLD)
    a = funcol.wait_tensor(a)
    note("all_to_all_single", 0, [x(world)], [a], functional=True, async_op=True)
if want("subgroup") and rank in sub_ranks:
    t = x(7)
    dist.all_reduce(t, group=sub)
    note("all_reduce", 1, [t], [t], reduce_op="SUM")
    t = x(2)
    dist.broadcast(t, src=1, group=sub)
    note("broadcast", 1, [t], [t], root=1)

with open(os.path.join(out_dir, f"expected-{rank}.json"), "w") as f:
    json.dump(expected, f)
dist.barrier()
dist.destroy_process_group()
