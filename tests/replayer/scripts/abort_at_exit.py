"""Two all_reduces; argv[1]: "none", "exit" (abort in teardown, after everything else
at exit, the replayer's results included) or "early" (abort before finishing)."""

import atexit
import os
import sys

mode = sys.argv[1]
if mode == "exit":
    atexit.register(os.abort)  # registered before the replayer's handler: runs after it

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

torch.set_num_threads(1)
dist.init_process_group("gloo")
x = torch.ones(4)
for _ in range(2):
    dist.all_reduce(x)
if mode == "early":
    os.abort()
dist.destroy_process_group()
