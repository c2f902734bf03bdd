"""Ends while one of gloo's worker threads waits for the GIL, to drop a finished call's
tensor: the program's thread keeps the GIL from the call to its last line.

`python gil_waiter.py settle` registers prism_rr's teardown.settle first, as `prism-rr
record` and `replay` do. Without it, torch 2.13 aborts this program during finalization
("terminate called without an active exception", SIGABRT) in every run measured. Prints,
from the interpreter's finalization, how many native threads waited for the GIL at the
program's last line, and whether settle is registered.
"""

import os
import sys
import time

from prism_rr.intercept import teardown

if sys.argv[1:] == ["settle"]:
    teardown.register()

import torch
import torch.distributed as dist


class AtTheEnd:
    """Cleared with this module during finalization: reports, then lets go of the GIL, as a
    process group's own teardown may; a thread that still waits for the GIL gets it then."""

    waited = -1

    def __del__(self):
        os.write(1, f"waited={self.waited} registered={teardown._registered}\n".encode())
        time.sleep(0.05)


at_the_end = AtTheEnd()
torch.set_num_threads(1)
sys.setswitchinterval(30)  # the program's thread keeps the GIL unless it blocks
dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
for attempt in range(20):
    dist.all_reduce(torch.ones(1 << 22), async_op=True)  # gloo's worker holds the last reference
    # keep the GIL while the worker finishes and asks for it: on a loaded machine the
    # worker may wait a while for a core, so for up to 2 s rather than a fixed stretch
    deadline = time.monotonic() + 2.0
    while not teardown.native_thread_states() and time.monotonic() < deadline:
        sum(range(100_000))
    if teardown.native_thread_states():
        break
at_the_end.waited = teardown.native_thread_states()
