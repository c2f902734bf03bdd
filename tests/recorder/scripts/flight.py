"""A small data-parallel trainer for flight mode: `flight.py MODE DIR [STEPS]`.

Every step all-reduces the gradients and a loss (a control payload: 4 bytes). MODE:
  hang   rank 1 never joins the all_reduce of step STEPS-1: rank 0 waits in it forever;
  kill   rank 1 SIGKILLs itself there instead;
  raise  rank 1 raises an exception there;
  orphan rank 1 raises there while rank 0 sleeps outside any call, its store listener
         slowed to never look: rank 0 never dumps, and the launcher ends it (SIGTERM) once
         rank 1 has failed;
  loop   train until DIR/stop exists (step 8 is slow: 1.2 s), writing DIR/pid-<rank>;
  ok     train STEPS steps and end.
Each rank touches DIR/step-<rank> with its step number as it goes.
"""

import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

torch.set_num_threads(1)
mode, where = sys.argv[1], Path(sys.argv[2])
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 8
if mode == "orphan" and os.environ.get("RANK") == "0":
    from prism_rr.recorder import _flight

    _flight.LISTEN_S = 3600.0
dist.init_process_group("gloo")
rank = dist.get_rank()
(where / f"pid-{rank}").write_text(str(os.getpid()))
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
while True:
    if mode == "loop":
        # every rank stops at the same step: one that saw the file alone would leave the
        # others in a collective it never joins
        stop = torch.tensor([float((where / "stop").exists())])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            break
    if mode != "loop" and step == steps:
        break
    (where / f"step-{rank}").write_text(str(step))
    loss = model(torch.ones(4, 8)).square().mean()
    loss.backward()
    if rank == 0 and step == steps - 1 and mode == "orphan":
        time.sleep(600)  # until the launcher ends it
    if rank == 1 and step == steps - 1 and mode in ("hang", "kill", "raise", "orphan"):
        if mode == "kill":
            time.sleep(0.3)  # the ring's last tick
            os.kill(os.getpid(), signal.SIGKILL)
        if mode in ("raise", "orphan"):
            raise RuntimeError("planted failure in step %d" % step)
        time.sleep(600)  # the planted hang: this rank never joins
    for p in model.parameters():
        dist.all_reduce(p.grad)
    dist.all_reduce(loss.detach().clone())
    opt.step()
    opt.zero_grad()
    time.sleep(1.2 if (mode == "loop" and step == 8) else 0.06)
    step += 1
dist.barrier()
dist.destroy_process_group()
