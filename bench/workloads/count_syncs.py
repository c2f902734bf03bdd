"""Run a Python program counting the host synchronizations CUDA reports in each of its steps.

    python bench/workloads/count_syncs.py -m prism_rr.demo.train --steps 12
    python bench/workloads/count_syncs.py tests/gpu/cuda_train.py --steps 12

With PRISM_BENCH_SYNCS=DIR, each process writes DIR/syncs-<RANK>-<pid>.json as it exits:
{"rank", "cuda", "steps": {"N": syncs}}, step N being the time after the program's Nth
optimizer step (prism-rr's numbering: step 0 runs up to the first), from step 1 on. The
count comes from `torch.cuda.set_sync_debug_mode("warn")`: torch warns at each synchronizing call (an
`.item()`, a copy to the host, `synchronize()`), from the program, a recorder or a
replayer in this process alike. Without CUDA nothing is counted ("cuda": false); without
the variable the program runs as it would alone. bench/gpu_fidelity.py runs every
workload under this, recorded and replayed, so the two counts compare like with like.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import warnings

_SYNC = "called a synchronizing CUDA operation"


def _count(out_dir: str) -> None:
    import torch

    cuda = torch.cuda.is_available()
    counts: dict[int, int] = {}
    step = [0]
    pacer: list = []

    def stepped(optimizer, args, kwargs) -> None:
        # the first optimizer that steps paces the steps, as prism-rr's step boundaries do
        if not pacer:
            pacer.append(optimizer)
            if cuda:
                # counting starts here, once the program has chosen its device and made its
                # context (set_sync_debug_mode initialises CUDA); step 0 is never scored
                torch.cuda.set_sync_debug_mode("warn")
        if optimizer is pacer[0]:
            step[0] += 1

    def write() -> None:
        rank = os.environ.get("RANK", "0")
        path = os.path.join(out_dir, f"syncs-{rank}-{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump({"rank": int(rank), "cuda": cuda, "steps": {str(k): v for k, v in sorted(counts.items())}}, f)

    atexit.register(write)
    if not cuda:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(stepped)
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if _SYNC in str(message):
            counts[step[0]] = counts.get(step[0], 0) + 1
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    # "always": every sync reaches showwarning, not only a location's first
    warnings.filterwarnings("always", message=f".*{_SYNC}")


def main() -> None:
    argv = sys.argv[1:]
    if not argv:
        sys.exit(__doc__)
    out_dir = os.environ.get("PRISM_BENCH_SYNCS")
    if out_dir:
        _count(out_dir)
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = os.getcwd()  # as `python -m` has it
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
